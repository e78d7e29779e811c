"""What the slot gate costs: direct to a fast streaming upstream vs through the
gateway vs through nginx (Debian's, as a plain reverse-proxy reference), at
concurrency 1, 8 and 64, side by side. The router (`localmodel router
--replicas`, docs/router.md) runs beside nginx, in front of the same upstream:
its added p99 time to first token and per token are compared with nginx's
(target: within nginx + 1 ms at 8). `--router-base DIR` adds the router of
another checkout (`rt-base`, e.g. `git archive` of the commit before a
change), measured in the same rounds, for a before/after.

Run: python benchmarks/gateway.py [--runs N] [--rounds R] [--scale X] [--no-pin]
         [--burst] [--no-overflow] [--no-plain] [--no-ledger-ab] [--concurrency C ...]
         [--gateway-arg=--event-loop=asyncio] [--router-base DIR] [--quick]
Needs: nginx on PATH (apt-get install nginx-light); skipped with a note if absent.

The upstream is the Ollama stand-in (tests/gateway/ollama_standin.py, not
Ollama) in its own process, streaming /api/generate NDJSON: TOKENS tokens, one
every TOKEN_DELAY seconds (a fast CPU engine). The gateway runs as
`localmodel gateway` in its own process with enough slots that nothing queues
(queueing is the feature, not overhead), logging to /dev/null, and with an
overflow endpoint configured (`--overflow-url`, an API key in its environment)
that is never used because nothing queues: the overflow must cost the local
path nothing (`--no-overflow` leaves it out; the run checks afterwards that
the gateway's metrics show no overflow activity). To show that cost free of
the machine's run-to-run noise, a second gateway without overflow
(`gw-plain`) is measured in the same rounds (`--no-plain` leaves it out). nginx runs one worker with
upstream keep-alive and buffering off.

The ledger (GET /ledger, on by default) is measured the same way: a gateway
with `--ledger-size 0` (`gw-noledger`) runs beside `gw-plain` (the ledger on,
no overflow) in the same rounds (`--no-ledger-ab` leaves it out), and every
request names a caller and a session (`X-LocalModel-Caller`,
`X-LocalModel-Session`), so the ledger does all its work: the record, the
whom-it-waited-behind book, the session's prompt print. The summary gives the
ledger's added CPU per request and its added p99 per token (the added p99 of
the whole response over its tokens), and the ring's memory per record.
`--quick` is one short run at concurrency 8.

Method (the same for direct, gateway and nginx):
- A steady upstream: the stand-in paces token i at start + (i + 1) * delay
  (`--steady`) rather than sleeping a delay after each token, so timer
  lateness does not add up over 32 tokens and total latency measures the
  proxy, not the upstream's drift.
- CPU pinning. With two or more CPUs, the proxy under test (the gateway, or
  nginx's master and worker) runs on CPU 0 alone; the upstream and this load
  generator share the other CPUs. On a 2-core box, three busy processes on two
  cores otherwise make the proxy's numbers mostly scheduler noise: whoever is
  descheduled adds milliseconds, and the proxy's CPU slows the upstream's own
  token pacing (32 paced tokens per request, so it adds up in total latency).
  A real pod gives the engine its own cores. Direct runs with CPU 0 idle.
  `--no-pin` measures the old way (everything shares every CPU).
- A light load generator: one asyncio Protocol per client on a keep-alive
  connection, writing a fixed request and scanning the chunked response for
  line ends, so that the client's own per-token cost (aiohttp's client costs
  about as much as the proxy) does not dominate the noise floor. Time to first
  token is from writing the request to the first complete NDJSON line; total
  is to the end of the chunked body; tokens are lines minus the final object.
- Arrivals staggered: client i of N starts i/N of a request's length after
  the first, so new requests arrive spread out, as from independent users.
  With the upstream's steady pacing, clients started together would stay in
  lock-step forever: every new request arriving with N - 1 others, so the
  last of them waits for the proxy's per-request work on all the others.
  That worst case is `--burst`, reported next to the default in the docs.
- Warm-up: one unmeasured round over every target before measuring each
  concurrency, and each batch first runs one request per connection.
- Targets are interleaved round by round (drift hits all three alike), and the
  whole measurement is repeated `--runs` times: each run prints its table, and
  a summary gives the spread (min, median, max across runs) of the numbers the
  targets are about.
- The proxy's cost stays visible: its CPU (user + system, from /proc) per
  request and per relayed token is reported for every run.

Reported per concurrency: time to first token and total latency (p50, p99),
the gateway's and nginx's *added* latency (their percentile minus direct's),
tokens/s (aggregate) and the proxy's CPU. Targets from the issue: p99 added
latency under 2 ms at concurrency 8; throughput at least 95% of direct.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "operator"), str(ROOT)]

from tests.harness.processes import (  # noqa: E402
    ManagedProcess,
    free_port,
    localmodel_process,
    port_is_listening,
)

PLAIN = "gw-plain"  # the gateway without overflow: the A/B target
NO_LEDGER = "gw-noledger"  # the same without the ledger (--ledger-size 0)
ROUTER = "router"  # `localmodel router --replicas` in front of the upstream, beside nginx
ROUTER_BASE = "rt-base"  # the same from another checkout (--router-base): a before/after
TOKENS = 32
TOKEN_DELAY = 0.004
CONCURRENCY = (1, 8, 64)
BODY = json.dumps({"model": "standin:1b", "prompt": "bench"}).encode()
END = b"\r\n0\r\n\r\n"  # the last chunk of a chunked body, after the previous chunk


def serve(stack: contextlib.ExitStack, proc: ManagedProcess, port: int) -> ManagedProcess:
    """Start `proc`, wait until `port` listens; stopped when `stack` closes."""
    listening = f"{proc.name} on port {port}"
    stack.enter_context(proc.serving(listening, lambda: port_is_listening(port), 20))
    return proc


def pinned_process(
    name: str,
    argv: list[str],
    cpus: set[int] | None,
    env: dict[str, str] | None = None,
    err: Path | None = None,
) -> ManagedProcess:
    """`argv` pinned to `cpus`, its output discarded (stderr to `err` if given)."""
    return ManagedProcess(
        name, argv, Path(os.devnull), env=env, preexec=_pinned(cpus), err_path=err, cwd=ROOT
    )


@dataclass
class Samples:
    ttft: list[float] = field(default_factory=list)
    total: list[float] = field(default_factory=list)
    tokens: int = 0
    wall: float = 0.0
    cpu: float = 0.0
    errors: int = 0

    @property
    def requests(self) -> int:
        return len(self.total)


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


class _Client(asyncio.Protocol):
    """One keep-alive connection, one streaming request at a time. Reads only
    what it must: the status line, the end of the headers, NDJSON line ends
    (`}` then a newline; JSON escapes newlines inside strings, and chunk
    framing lines end in CRLF after hex digits) and the chunked terminator."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.done: asyncio.Future[None] | None = None
        self.lost = False
        self._reset(0.0)

    def _reset(self, start: float) -> None:
        self.start = start
        self.first: float | None = None
        self.end = 0.0
        self.lines = 0
        self.status = 0
        self._head = b""
        self._in_body = False
        self._tail = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.done is not None and not self.done.done():
            self.done.set_exception(ConnectionError("connection closed mid-response"))

    def send(self, request: bytes) -> asyncio.Future[None]:
        assert self.transport is not None
        self.done = asyncio.get_running_loop().create_future()
        self._reset(time.perf_counter())
        self.transport.write(request)
        return self.done

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        if not self._in_body:
            self._head += data
            cut = self._head.find(b"\r\n\r\n")
            if cut < 0:
                return
            head, data = self._head[:cut], self._head[cut + 4 :]
            self._in_body = True
            self.status = int(head[9:12])
            if self.status != 200 or b"chunked" not in head.lower():
                self.end = now
                assert self.transport is not None
                self.transport.close()  # not what the benchmark measures: count an error
                return
        scan = self._tail[-1:] + data
        self.lines += scan.count(b"}\n")
        if self.first is None and self.lines:
            self.first = now
        self._tail = (self._tail + data)[-len(END) :]
        if self._tail == END:
            self.end = now
            assert self.done is not None
            if not self.done.done():
                self.done.set_result(None)


async def batch(
    port: int,
    concurrency: int,
    per_client: int,
    out: Samples,
    procs: list[psutil.Process],
    stagger: float = 0.0,
) -> None:
    loop = asyncio.get_running_loop()
    request = (
        f"POST /api/generate HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"X-LocalModel-Caller: bench\r\nX-LocalModel-Session: s{concurrency}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(BODY)}\r\n\r\n"
    ).encode() + BODY
    clients: list[_Client] = []
    for _ in range(concurrency):
        _, proto = await loop.create_connection(_Client, "127.0.0.1", port)
        clients.append(proto)

    async def one(client: _Client, record: Samples | None) -> _Client:
        if client.lost:
            _, client = await loop.create_connection(_Client, "127.0.0.1", port)
        try:
            await client.send(request)
        except ConnectionError:
            if record is not None:
                record.errors += 1
            return client
        if client.status != 200:
            if record is not None:
                record.errors += 1
            return client
        if record is not None:
            record.ttft.append((client.first or client.end) - client.start)
            record.total.append(client.end - client.start)
            record.tokens += max(0, client.lines - 1)  # the last line is the final object
        return client

    try:
        # Warm each connection (not measured).
        clients = list(await asyncio.gather(*[one(c, None) for c in clients]))
        cpu_before = sum(_cpu(p) for p in procs)
        start = time.perf_counter()

        async def run_client(i: int, client: _Client) -> None:
            await asyncio.sleep(i * stagger)
            for _ in range(per_client):
                client = await one(client, out)

        await asyncio.gather(*[run_client(i, c) for i, c in enumerate(clients)])
        out.wall += time.perf_counter() - start
        out.cpu += sum(_cpu(p) for p in procs) - cpu_before
    finally:
        for client in clients:
            if client.transport is not None:
                client.transport.close()


def _cpu(process: psutil.Process) -> float:
    try:
        times = process.cpu_times()
        return float(times.user + times.system)
    except psutil.Error:
        return 0.0


NGINX_CONF = """
worker_processes 1;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
{user}
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    upstream engine {{ server 127.0.0.1:{upstream}; keepalive 128; }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://engine;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 600s;
        }}
    }}
}}
"""


def _pinned(cpus: set[int] | None) -> Callable[[], None] | None:
    if not cpus:
        return None

    def pin() -> None:
        os.sched_setaffinity(0, cpus)

    return pin


def start_nginx(
    stack: contextlib.ExitStack, tmp: Path, upstream_port: int, cpus: set[int] | None
) -> tuple[ManagedProcess, int] | None:
    binary = shutil.which("nginx") or (
        "/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None
    )
    if binary is None:
        return None
    port = free_port()
    conf = tmp / "nginx.conf"
    user = "user root;" if os.geteuid() == 0 else ""
    conf.write_text(NGINX_CONF.format(dir=tmp, upstream=upstream_port, port=port, user=user))
    # The worker inherits the pinning.
    argv = [binary, "-c", str(conf), "-p", str(tmp)]
    proc = serve(stack, pinned_process("nginx", argv, cpus), port)
    return proc, port


def fmt(value: float, unit: float = 1000.0, digits: int = 2) -> str:
    return f"{value * unit:.{digits}f}"


def report(concurrency: int, results: dict[str, Samples]) -> list[str]:
    direct = results["direct"]
    names = list(results)
    lines = [
        f"\nconcurrency {concurrency}: {direct.requests} requests per target, "
        f"{TOKENS} tokens each, one every {TOKEN_DELAY * 1000:g} ms"
    ]
    header = f"{'':22}" + "".join(f"{n[:9]:>10}" for n in names)
    header += "".join(f"{'+' + n[:8]:>10}" for n in names[1:])
    short = [n.removeprefix("gw-")[:2] + "/direct" for n in names[1:]]
    header += "".join(f"{n:>10}" for n in short)
    lines.append(header)

    def row(label: str, values: list[float]) -> None:
        # Values, then added over direct, then the ratio to direct.
        text = f"{label:22}" + "".join(f"{fmt(v):>10}" for v in values)
        text += "".join(f"{fmt(v - values[0]):>10}" for v in values[1:])
        text += "".join(f"{v / values[0]:>9.3f}x" for v in values[1:])
        lines.append(text)

    for metric, p in (("ttft", 50), ("ttft", 99), ("total", 50), ("total", 99)):
        row(f"{metric} p{p} ms", [pct(getattr(results[n], metric), p) for n in names])
    rates = [r.tokens / r.wall if r.wall else float("nan") for r in results.values()]
    text = f"{'tokens/s':22}" + "".join(f"{v:>10.0f}" for v in rates)
    text += "".join(f"{v - rates[0]:>10.0f}" for v in rates[1:])
    text += "".join(f"{v / rates[0]:>9.3f}x" for v in rates[1:])
    lines.append(text)
    cpu = [r.cpu / r.requests * 1000 if r.requests else float("nan") for r in results.values()]
    lines.append(
        f"{'proxy CPU ms/request':22}" + f"{'-':>10}" + "".join(f"{v:>10.3f}" for v in cpu[1:])
    )
    per_token = [r.cpu / r.tokens * 1e6 if r.tokens else float("nan") for r in results.values()]
    lines.append(
        f"{'proxy CPU us/token':22}" + f"{'-':>10}" + "".join(f"{v:>10.1f}" for v in per_token[1:])
    )
    util = [r.cpu / r.wall * 100 if r.wall else float("nan") for r in results.values()]
    lines.append(
        f"{'proxy CPU % of a core':22}" + f"{'-':>10}" + "".join(f"{v:>10.1f}" for v in util[1:])
    )
    errors = sum(r.errors for r in results.values())
    if errors:
        lines.append(f"errors: {errors}")
    return lines


@dataclass
class Key:
    """The numbers the targets are about, for one run at one concurrency."""

    added_ttft_p99: dict[str, float]
    added_total_p99: dict[str, float]
    throughput: dict[str, float]
    cpu_ms: dict[str, float]


def key_numbers(results: dict[str, Samples]) -> Key:
    direct = results["direct"]
    rate = direct.tokens / direct.wall
    proxies = [n for n in results if n != "direct"]
    return Key(
        {n: pct(results[n].ttft, 99) - pct(direct.ttft, 99) for n in proxies},
        {n: pct(results[n].total, 99) - pct(direct.total, 99) for n in proxies},
        {n: results[n].tokens / results[n].wall / rate for n in proxies},
        {n: results[n].cpu / max(1, results[n].requests) for n in proxies},
    )


def spread(keys: dict[int, list[Key]]) -> list[str]:
    def mmm(values: list[float], unit: float, digits: int) -> str:
        lo, mid, hi = min(values), statistics.median(values), max(values)
        return f"{lo * unit:.{digits}f} / {mid * unit:.{digits}f} / {hi * unit:.{digits}f}"

    runs = len(next(iter(keys.values())))
    lines = [f"\nspread over {runs} runs (min / median / max)"]
    for concurrency, ks in keys.items():
        for name in ks[0].throughput:
            lines.append(
                f"  c={concurrency:<3} {name:8} p99 added ttft ms "
                f"{mmm([k.added_ttft_p99[name] for k in ks], 1000, 2):24}"
                f" total ms {mmm([k.added_total_p99[name] for k in ks], 1000, 2):24}"
                f" throughput {mmm([k.throughput[name] for k in ks], 1, 3):22}"
                f" CPU ms/req {mmm([k.cpu_ms[name] for k in ks], 1000, 2)}"
            )
    if 8 in keys:
        ks = keys[8]
        worst = [max(k.added_ttft_p99["gateway"], k.added_total_p99["gateway"]) for k in ks]
        ratios = [k.throughput["gateway"] for k in ks]
        met_latency = sum(w < 0.002 for w in worst)
        met_ratio = sum(r >= 0.95 for r in ratios)
        lines.append(
            f"targets at 8 (gateway): p99 added latency < 2 ms in {met_latency}/{runs} runs "
            f"(worst of first-token and total, median {statistics.median(worst) * 1000:.2f} ms);"
            f" throughput >= 0.95 of direct in {met_ratio}/{runs} runs "
            f"(median {statistics.median(ratios):.3f})"
        )
        if NO_LEDGER in ks[0].throughput:
            lines.append(ledger_cost(ks, runs))
        if ROUTER in ks[0].throughput and "nginx" in ks[0].throughput:
            lines.append(router_cost(ks, runs))
            if ROUTER_BASE in ks[0].throughput:
                lines.append(router_cost(ks, runs, ROUTER_BASE))
        if PLAIN in ks[0].throughput:
            # Overflow's cost on the local path, from the A/B in the same runs.
            ttft = [k.added_ttft_p99["gateway"] - k.added_ttft_p99[PLAIN] for k in ks]
            total = [k.added_total_p99["gateway"] - k.added_total_p99[PLAIN] for k in ks]
            cpu = [k.cpu_ms["gateway"] / k.cpu_ms[PLAIN] for k in ks]
            lines.append(
                f"overflow configured vs not ({PLAIN}), at 8: p99 ttft "
                f"{statistics.median(ttft) * 1000:+.2f} ms, p99 total "
                f"{statistics.median(total) * 1000:+.2f} ms, CPU per request "
                f"{statistics.median(cpu):.3f}x (medians over {runs} runs)"
            )
    return lines


def router_cost(ks: list[Key], runs: int, name: str = ROUTER) -> str:
    """The router's cost at 8 against nginx's, in the same runs: added p99 time
    to first token, and added p99 total over the tokens (per token)."""
    ttft = [k.added_ttft_p99[name] - k.added_ttft_p99["nginx"] for k in ks]
    per_token = [(k.added_total_p99[name] - k.added_total_p99["nginx"]) / TOKENS for k in ks]
    met = sum(t <= 0.001 and p <= 0.001 for t, p in zip(ttft, per_token, strict=True))
    each = ", ".join(f"{t * 1000:+.2f}/{p * 1000:+.3f}" for t, p in zip(ttft, per_token,
                                                                       strict=True))
    return (
        f"{name} vs nginx, at 8: added p99 ttft {statistics.median(ttft) * 1000:+.2f} ms, "
        f"added p99 per token {statistics.median(per_token) * 1000:+.3f} ms (medians over "
        f"{runs} runs); target within nginx + 1 ms met in {met}/{runs} runs "
        f"(each run, ttft/per token ms: {each})"
    )


def ledger_cost(ks: list[Key], runs: int) -> str:
    """The ledger's cost at 8, from the A/B in the same runs: the gateway with
    it (gw-plain, or the gateway when nothing else is measured) against
    gw-noledger."""
    on = PLAIN if PLAIN in ks[0].throughput else "gateway"
    cpu = [k.cpu_ms[on] - k.cpu_ms[NO_LEDGER] for k in ks]
    ratio = [k.cpu_ms[on] / k.cpu_ms[NO_LEDGER] for k in ks]
    total = [k.added_total_p99[on] - k.added_total_p99[NO_LEDGER] for k in ks]
    ttft = [k.added_ttft_p99[on] - k.added_ttft_p99[NO_LEDGER] for k in ks]
    return (
        f"ledger on ({on}) vs off ({NO_LEDGER}), at 8: CPU per request "
        f"{statistics.median(cpu) * 1e6:+.0f} us ({statistics.median(ratio):.3f}x), p99 total "
        f"{statistics.median(total) * 1000:+.2f} ms = "
        f"{statistics.median(total) / TOKENS * 1e6:+.1f} us per token, p99 first token "
        f"{statistics.median(ttft) * 1000:+.2f} ms (medians over {runs} runs)"
    )


def ledger_memory(records: int = 10_000) -> str:
    """Bytes per ledger record, as the ring holds them (tracemalloc), for
    records shaped like a busy gateway's: long names, two holders waited behind."""
    import tracemalloc

    from localmodel.gateway.ledger import Ledger
    from localmodel.gateway_contract import DEFAULT_LEDGER_SIZE, Behind, LedgerEntry

    ledger = Ledger(records)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(records):
        ledger.add(
            LedgerEntry(
                request_id=f"{i:016x}", caller=f"caller-{i % 50:02d}-" + "x" * 40,
                session=f"session-{i:08d}-" + "y" * 40, priority="foreground",
                route="/v1/chat/completions", model="gemma3:270m-tuned", outcome="ok",
                status=200, served_by="local", arrival=1.7e9 + i, duration=i * 0.001,
                queue_wait=i * 0.0001, slot_start=i * 0.0001, slot_seconds=i * 0.001,
                ttft=i * 0.0002, caller_gone=None, abandoned_seconds=None,
                behind=(Behind("indexer", "background", i * 0.01),
                        Behind("agent", "foreground", i * 0.02)),
                prompt_tokens=1000 + i, cached_tokens=500 + i, evaluated_tokens=500 + i,
                prefill_seconds=i * 0.003, generated_tokens=100 + i, decode_seconds=i * 0.004,
                rewrite=False, reread_tokens=0, reread_seconds=0.0,
            )
        )
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    per = used / records
    return (
        f"ledger memory: {per:.0f} bytes per record (tracemalloc, {records} records); "
        f"the default --ledger-size {DEFAULT_LEDGER_SIZE} holds "
        f"{per * DEFAULT_LEDGER_SIZE / 2**20:.1f} MiB"
    )


def ledger_work(requests: int = 20_000) -> str:
    """The ledger's own work per request, in-process (CPU time of its pure
    parts as the pipeline calls them: who asked, the session's prompt print
    and rewrite check, the wait book, the record and the ring), for a chat of
    ten messages in a session."""
    from localmodel.gateway.ledger import Ledger, Sessions, WaitBook, identify, prompt_of
    from localmodel.gateway.record import Outcome, RequestRecord, ledger_entry
    from localmodel.gateway_contract.timing import EngineTiming

    messages = [{"role": "user", "content": f"message {i} " * 20} for i in range(10)]
    body = {"model": "m", "messages": messages}
    ledger, sessions, book = Ledger(10_000), Sessions(), WaitBook()
    timing = EngineTiming(500, 0.5, 50, 1.0, prompt_total=1000, prompt_cached=500,
                          prompt_evaluated=500)
    start = time.process_time()
    for i in range(requests):
        rec = RequestRecord(request_id=f"{i:016x}", route="/api/chat", priority="foreground",
                            start=float(i), slot_at=float(i), slot_released_at=i + 0.5,
                            end=i + 0.6, timing=timing)
        rec.caller, rec.session = identify("bench", f"s{i % 100}")
        prompt = prompt_of("chat", body)
        assert prompt is not None
        turn, rec.turn = sessions.arrive((rec.caller, rec.session or ""), prompt)
        rec.rewrite, rec.previous_tokens = turn.rewrite, turn.previous_tokens
        book.hold(i, (rec.caller, rec.priority), float(i))
        book.free(i, i + 0.5)
        rec.finish(Outcome.OK, 200)
        ledger.add(ledger_entry(rec))
        sessions.read((rec.caller, rec.session or ""), rec.turn, 1000)
    per = (time.process_time() - start) / requests
    return f"ledger work: {per * 1e6:.0f} us CPU per request (in-process, {requests} requests)"


async def measure(
    targets: dict[str, tuple[int, list[psutil.Process]]],
    per_client: dict[int, int],
    rounds: int,
    runs: int,
    burst: bool,
) -> list[str]:
    lines: list[str] = []
    keys: dict[int, list[Key]] = {c: [] for c in per_client}
    for run in range(1, runs + 1):
        lines.append(f"\n=== run {run} of {runs}")
        for concurrency in per_client:
            for port, _ in targets.values():  # warm-up round, not measured
                await batch(port, concurrency, 1, Samples(), [])
            results = {name: Samples() for name in targets}
            # Staggered arrivals: client i starts i/concurrency of a request's
            # length after the first, so requests arrive spread out as from
            # independent users; --burst starts all together (steady pacing
            # then keeps them in lock-step: every new request arrives with
            # concurrency - 1 others, the proxy's worst case).
            stagger = 0.0 if burst else TOKENS * TOKEN_DELAY / concurrency
            for _ in range(rounds):
                for name, (port, watched) in targets.items():
                    await batch(
                        port,
                        concurrency,
                        per_client[concurrency],
                        results[name],
                        watched,
                        stagger,
                    )
            lines += report(concurrency, results)
            keys[concurrency].append(key_numbers(results))
            if concurrency == 8:
                k = keys[8][-1]
                added_ttft, added_total = k.added_ttft_p99["gateway"], k.added_total_p99["gateway"]
                ratio = k.throughput["gateway"]
                worst = max(added_ttft, added_total)
                lines.append(
                    f"targets at 8: p99 added latency {added_ttft * 1000:.2f} ms to first "
                    f"token, {added_total * 1000:.2f} ms in total (< 2 ms: "
                    f"{'met' if worst < 0.002 else 'NOT met'}); throughput {ratio:.3f} "
                    f"of direct (>= 0.95: {'met' if ratio >= 0.95 else 'NOT met'})"
                )
        print("\n".join(lines), flush=True)
        lines = []
    return spread(keys)


async def run(
    per_client: dict[int, int],
    rounds: int,
    runs: int,
    pin: bool,
    burst: bool,
    gateway_args: list[str],
    overflow: bool,
    plain: bool,
    ledger_ab: bool,
    router_base: Path | None = None,
) -> list[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "operator"), str(ROOT), env.get("PYTHONPATH", "")]
    )
    cpus = sorted(os.sched_getaffinity(0))
    proxy_cpus: set[int] | None = None
    rest_cpus: set[int] | None = None
    if pin and len(cpus) >= 2:
        proxy_cpus, rest_cpus = {cpus[0]}, set(cpus[1:])
        os.sched_setaffinity(0, rest_cpus)  # the load generator
    with (
        tempfile.TemporaryDirectory(prefix="gateway-bench-") as tmpdir,
        contextlib.ExitStack() as stack,
    ):
        tmp = Path(tmpdir)
        up_port = free_port()
        standin = [
            sys.executable,
            "-m",
            "tests.gateway.ollama_standin",
            "--port",
            str(up_port),
            "--tokens",
            str(TOKENS),
            "--token-delay",
            str(TOKEN_DELAY),
            "--steady",
        ]
        serve(
            stack,
            pinned_process("the Ollama stand-in", standin, rest_cpus, env, tmp / "standin.err"),
            up_port,
        )
        gw_port = free_port()
        overflow_args: list[str] = []
        gw_env = dict(env)
        if overflow:
            # A closed port: any use would show as an overflow error.
            overflow_args = [
                "--overflow-url",
                f"http://127.0.0.1:{free_port()}/v1",
                "--overflow-model",
                "far-model",
                "--overflow-after",
                "0",
            ]
            gw_env["LOCALMODEL_GATEWAY_OVERFLOW_API_KEY"] = "sk-benchmark"

        admin_ports: dict[int, int] = {}

        def start_gateway(port: int, extra: list[str], env: dict[str, str]) -> ManagedProcess:
            admin_ports[port] = free_port()
            args = [
                "gateway",
                "--upstream",
                f"http://127.0.0.1:{up_port}",
                "--listen",
                f"127.0.0.1:{port}",
                "--admin-listen",
                f"127.0.0.1:{admin_ports[port]}",
                "--model",
                "standin:1b",
                "--slots",
                "256",
                "--max-queue",
                "256",
                "--threads",
                "2",
                "--context",
                "4096",
                *extra,
                *gateway_args,
            ]
            gateway = localmodel_process(
                f"gateway :{port}", args, Path(os.devnull), env, preexec=_pinned(proxy_cpus)
            )
            return serve(stack, gateway, port)

        gateway = start_gateway(gw_port, overflow_args, gw_env)
        targets: dict[str, tuple[int, list[psutil.Process]]] = {
            "direct": (up_port, []),
            "gateway": (gw_port, [psutil.Process(gateway.pid)]),
        }
        if overflow and plain:
            # The same gateway without overflow, measured in the same run:
            # what configuring overflow costs the local path, free of the
            # machine's run-to-run noise.
            plain_port = free_port()
            bare = start_gateway(plain_port, [], env)
            targets[PLAIN] = (plain_port, [psutil.Process(bare.pid)])
        if ledger_ab:
            # Without the ledger: its cost, measured in the same rounds.
            off_port = free_port()
            off = start_gateway(off_port, ["--ledger-size", "0"], env)
            targets[NO_LEDGER] = (off_port, [psutil.Process(off.pid)])
        nginx = start_nginx(stack, tmp, up_port, proxy_cpus)
        notes = []
        if nginx is None:
            notes.append("nginx not found: install it (apt-get install nginx-light)")
        else:
            master = psutil.Process(nginx[0].pid)
            targets["nginx"] = (nginx[1], [master, *master.children()])
        # The router (`localmodel router`) in front of the same upstream, as
        # nginx is: what it adds is its own cost (target: within nginx + 1 ms).
        router_port = free_port()
        router = localmodel_process(
            f"router :{router_port}",
            ["router", "--listen", f"127.0.0.1:{router_port}", "--admin-listen",
             f"127.0.0.1:{free_port()}", "--replicas",
             f"standin:1b=http://127.0.0.1:{up_port}"],
            Path(os.devnull), env, preexec=_pinned(proxy_cpus))
        serve(stack, router, router_port)
        targets[ROUTER] = (router_port, [psutil.Process(router.pid)])
        if router_base is not None:
            # The router of another checkout (say, a worktree of the branch
            # before a change), in the same rounds: a before/after free of the
            # machine's drift between runs.
            base_port = free_port()
            base_env = {**env, "PYTHONPATH": os.pathsep.join(
                [str(router_base / "operator"), env["PYTHONPATH"]])}
            base = pinned_process(
                f"router from {router_base}",
                [sys.executable, "-m", "localmodel.cli", "router", "--listen",
                 f"127.0.0.1:{base_port}", "--admin-listen", f"127.0.0.1:{free_port()}",
                 "--replicas", f"standin:1b=http://127.0.0.1:{up_port}"],
                proxy_cpus, base_env, tmp / "router-base.err")
            serve(stack, base, base_port)
            targets[ROUTER_BASE] = (base_port, [psutil.Process(base.pid)])
        placement = (
            f"proxy pinned to CPU {sorted(proxy_cpus)}, upstream and load generator to "
            f"CPU {sorted(rest_cpus)}"
            if proxy_cpus and rest_cpus
            else "no pinning: load generator, upstream and proxy share every CPU"
        )
        print(
            "\n".join(
                [
                    f"gateway benchmark: {runs} run(s) of {rounds} interleaved rounds per "
                    f"concurrency; {len(cpus)} CPUs; {placement}; "
                    f"{'burst' if burst else 'staggered'} arrivals; load from one Python "
                    f"process (asyncio protocol client); gateway flags: "
                    f"{' '.join(gateway_args) or '(defaults)'}; overflow "
                    f"{'configured (never used: nothing queues)' if overflow else 'off'}",
                    *notes,
                ]
            ),
            flush=True,
        )
        lines = await measure(targets, per_client, rounds, runs, burst)
        if overflow:
            lines.append(overflow_check(admin_ports[gw_port]))
        lines.append(ledger_memory())
        lines.append(ledger_work())
        return lines


def overflow_check(port: int) -> str:
    """The gateway's own account (its admin port): configured overflow, no
    overflow activity."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    used = [
        line
        for line in text.splitlines()
        if line.startswith("localmodel_gateway_overflow_") and not line.endswith(" 0")
    ]
    if used:
        raise SystemExit("overflow was used during the benchmark:\n" + "\n".join(used))
    return "overflow: configured, 0 overflowed requests, 0 attempts (gateway /metrics)"


def main() -> int:
    parser = argparse.ArgumentParser(description="gateway overhead benchmark")
    parser.add_argument("--runs", type=int, default=3, help="repeat everything (default 3)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--scale", type=float, default=1.0, help="multiply requests per client (default 1.0)"
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        action="append",
        choices=CONCURRENCY,
        help="only this level (repeatable; default all)",
    )
    parser.add_argument(
        "--no-pin", action="store_true", help="do not pin the proxy and the load to separate CPUs"
    )
    parser.add_argument(
        "--burst",
        action="store_true",
        help="start every client at once (lock-step arrivals) instead of staggered",
    )
    parser.add_argument(
        "--no-overflow",
        action="store_true",
        help="run the gateway without an overflow endpoint configured",
    )
    parser.add_argument(
        "--gateway-arg",
        action="append",
        default=[],
        help="extra flag for the gateway, e.g. --gateway-arg=--event-loop=asyncio",
    )
    parser.add_argument(
        "--no-plain",
        action="store_true",
        help="leave out the gw-plain target (the same gateway without overflow, the A/B)",
    )
    parser.add_argument(
        "--no-ledger-ab",
        action="store_true",
        help="leave out the gw-noledger target (the gateway without its ledger, the A/B)",
    )
    parser.add_argument(
        "--router-base",
        type=Path,
        default=None,
        metavar="DIR",
        help=f"also measure the router of the checkout DIR ({ROUTER_BASE}), in the same rounds",
    )
    parser.add_argument(
        "--quick", action="store_true", help="one short run at concurrency 8 (a smoke test)"
    )
    args = parser.parse_args()
    if args.quick:
        args.runs, args.rounds, args.scale, args.concurrency = 1, 2, 0.4, [8]
    # Requests per client per round: enough samples for a p99 at every level.
    levels = args.concurrency or CONCURRENCY
    per_client = {
        c: max(1, round(n * args.scale)) for c, n in {1: 20, 8: 25, 64: 4}.items() if c in levels
    }
    for line in asyncio.run(
        run(
            per_client,
            args.rounds,
            args.runs,
            not args.no_pin,
            args.burst,
            args.gateway_arg,
            not args.no_overflow,
            not args.no_plain,
            not args.no_ledger_ab,
            args.router_base.resolve() if args.router_base else None,
        )
    ):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
