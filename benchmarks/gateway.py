"""What the slot gate costs: direct to a fast streaming upstream vs through the
gateway vs through nginx (Debian's, as a plain reverse-proxy reference), at
concurrency 1, 8 and 64, side by side in one run.

Run: python benchmarks/gateway.py [--requests-per-client N] [--rounds R]
Needs: nginx on PATH (apt-get install nginx-light); skipped with a note if absent.

The upstream is the Ollama stand-in (tests/gateway/ollama_standin.py, not
Ollama) in its own process, streaming /api/generate NDJSON: TOKENS tokens, one
every TOKEN_DELAY seconds (a fast CPU engine). The gateway runs as
`localmodel gateway` in its own process with enough slots that nothing queues
(queueing is the feature, not overhead), logging to /dev/null. nginx runs one
worker with upstream keep-alive and buffering off. The load generator is this
process (aiohttp). Targets are interleaved round by round so that drift in a
shared machine's CPU hits all three alike.

Reported per concurrency: time to first token and total latency (p50, p99),
the gateway's and nginx's *added* latency (their percentile minus direct's),
tokens/s (aggregate) and the proxy's CPU per request. Targets from the issue:
p99 added latency under 2 ms at concurrency 8; throughput at least 95% of
direct.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import psutil

ROOT = Path(__file__).resolve().parent.parent
TOKENS = 32
TOKEN_DELAY = 0.004
CONCURRENCY = (1, 8, 64)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listening on {port} after {timeout}s")


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


async def one(session: aiohttp.ClientSession, url: str, out: Samples) -> None:
    start = time.perf_counter()
    first = None
    lines = 0
    async with session.post(url, json={"model": "standin:1b", "prompt": "bench"}) as resp:
        if resp.status != 200:
            out.errors += 1
            await resp.read()
            return
        async for chunk in resp.content.iter_any():
            if first is None:
                first = time.perf_counter()
            lines += chunk.count(b"\n")
    end = time.perf_counter()
    out.ttft.append((first or end) - start)
    out.total.append(end - start)
    out.tokens += max(0, lines - 1)  # the last line is the final (done) object


async def batch(
    url: str, concurrency: int, per_client: int, out: Samples, procs: list[psutil.Process]
) -> None:
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        # Warm the connections (not measured).
        await asyncio.gather(*[one(session, url, Samples()) for _ in range(concurrency)])
        cpu_before = sum(_cpu(p) for p in procs)
        start = time.perf_counter()

        async def client() -> None:
            for _ in range(per_client):
                await one(session, url, out)

        await asyncio.gather(*[client() for _ in range(concurrency)])
        out.wall += time.perf_counter() - start
        out.cpu += sum(_cpu(p) for p in procs) - cpu_before


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


def start_nginx(tmp: Path, upstream_port: int) -> tuple[subprocess.Popen[bytes], int] | None:
    binary = shutil.which("nginx") or (
        "/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None
    )
    if binary is None:
        return None
    port = free_port()
    conf = tmp / "nginx.conf"
    user = "user root;" if os.geteuid() == 0 else ""
    conf.write_text(NGINX_CONF.format(dir=tmp, upstream=upstream_port, port=port, user=user))
    proc = subprocess.Popen(
        [binary, "-c", str(conf), "-p", str(tmp)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_port(port)
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
    header = f"{'':22}" + "".join(f"{n:>10}" for n in names)
    header += "".join(f"{'+' + n:>10}" for n in names[1:])
    header += "".join(f"{n[:2] + '/direct':>10}" for n in names[1:])
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
    util = [r.cpu / r.wall * 100 if r.wall else float("nan") for r in results.values()]
    lines.append(
        f"{'proxy CPU % of a core':22}" + f"{'-':>10}" + "".join(f"{v:>10.1f}" for v in util[1:])
    )
    errors = sum(r.errors for r in results.values())
    if errors:
        lines.append(f"errors: {errors}")
    return lines


async def run(per_client: dict[int, int], rounds: int) -> list[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "operator"), str(ROOT), env.get("PYTHONPATH", "")]
    )
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="gateway-bench-") as tmpdir:
        tmp = Path(tmpdir)
        try:
            up_port = free_port()
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "tests.gateway.ollama_standin",
                        "--port",
                        str(up_port),
                        "--tokens",
                        str(TOKENS),
                        "--token-delay",
                        str(TOKEN_DELAY),
                    ],
                    cwd=ROOT,
                    env=env,
                    stdout=subprocess.DEVNULL,
                )
            )
            wait_port(up_port)
            gw_port = free_port()
            gateway = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "localmodel.cli",
                    "gateway",
                    "--upstream",
                    f"http://127.0.0.1:{up_port}",
                    "--listen",
                    f"127.0.0.1:{gw_port}",
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
                ],
                cwd=ROOT,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            procs.append(gateway)
            wait_port(gw_port)
            targets: dict[str, tuple[str, list[psutil.Process]]] = {
                "direct": (f"http://127.0.0.1:{up_port}/api/generate", []),
                "gateway": (
                    f"http://127.0.0.1:{gw_port}/api/generate",
                    [psutil.Process(gateway.pid)],
                ),
            }
            nginx = start_nginx(tmp, up_port)
            notes = []
            if nginx is None:
                notes.append("nginx not found: install it (apt-get install nginx-light)")
            else:
                procs.append(nginx[0])
                master = psutil.Process(nginx[0].pid)
                targets["nginx"] = (
                    f"http://127.0.0.1:{nginx[1]}/api/generate",
                    [master, *master.children()],
                )
            lines = [
                f"gateway benchmark: {rounds} interleaved rounds per concurrency; "
                f"{os.cpu_count()} CPUs; load from one Python process",
                *notes,
            ]
            for concurrency in CONCURRENCY:
                results = {name: Samples() for name in targets}
                for _ in range(rounds):
                    for name, (url, watched) in targets.items():
                        await batch(
                            url, concurrency, per_client[concurrency], results[name], watched
                        )
                lines += report(concurrency, results)
                if concurrency == 8:
                    gw, direct = results["gateway"], results["direct"]
                    added_ttft = pct(gw.ttft, 99) - pct(direct.ttft, 99)
                    added_total = pct(gw.total, 99) - pct(direct.total, 99)
                    ratio = (gw.tokens / gw.wall) / (direct.tokens / direct.wall)
                    worst = max(added_ttft, added_total)
                    lines.append(
                        f"targets at 8: p99 added latency {added_ttft * 1000:.2f} ms to first "
                        f"token, {added_total * 1000:.2f} ms in total (< 2 ms: "
                        f"{'met' if worst < 0.002 else 'NOT met'}); throughput {ratio:.3f} "
                        f"of direct (>= 0.95: {'met' if ratio >= 0.95 else 'NOT met'})"
                    )
                    lines.append(
                        "  (total latency spans 32 paced tokens, so its p99 carries the "
                        "upstream's timer jitter; time to first token isolates the proxy)"
                    )
            return lines
        finally:
            for proc in reversed(procs):
                proc.send_signal(signal.SIGTERM)
            for proc in reversed(procs):
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description="gateway overhead benchmark")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--scale", type=float, default=1.0, help="multiply requests per client (default 1.0)"
    )
    args = parser.parse_args()
    # Requests per client per round: enough samples for a p99 at every level.
    per_client = {c: max(1, round(n * args.scale)) for c, n in {1: 20, 8: 25, 64: 4}.items()}
    for line in asyncio.run(run(per_client, args.rounds)):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
