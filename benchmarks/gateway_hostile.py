"""The gateway's memory under hostile bodies: its peak RSS while the worst
bodies arrive at the queue's full depth, and a normal chat's answers meanwhile.

Run: python benchmarks/gateway_hostile.py [--seconds S] [--max-queue N] [--max-body-bytes N]
     [--example FILE] [--quick] [--json] [--gateway-arg=--body-reads=1 ...]

The gateway runs as `localmodel gateway` in its own process with the settings
the renderer gives a model pod's gateway (its LOCALMODEL_GATEWAY_* variables,
from `--example`, default examples/qwen3.yaml: one slot, `maxQueue` 16, and
every limit the renderer leaves at the gateway's default), in front of the
Ollama stand-in (tests/gateway/ollama_standin.py, not Ollama) in another
process; the memory limit compared with is the rendered container's. For
`--seconds`, as many hostile clients as the queue has places each send, one
after another, the worst bodies just within the body limit (`--max-body-bytes`
overrides the gateway's), alternating the Ollama and the OpenAI chat routes:

- messages: `{"messages":[{},{},...]}`, the shape that parses to the most
  memory (about 25 times its size in Python objects): refused 413, naming
  --max-messages;
- string: one message whose content is the whole body: 413, --max-string-bytes;
- nesting: `[[[[...]]]]` as deep as the body allows: 400, nested too deeply;
- oversize: headers announcing 8 MiB (and its first 64 KiB sent): 413 by its
  Content-Length, never read, naming --max-body-bytes;
- queued: a valid chat as large as every limit allows (two messages of almost
  --max-string-bytes each): answered 200, after waiting in the queue with its
  bytes and its rewritten copy held (what a queued place costs).

Meanwhile one normal caller chats back to back on /api/chat (the hostile
clients hold the queue's places, never the last one: slots + queue = the
hostile clients + this caller). Reported: each kind's answers (every one must
be its 4xx naming the limit), the normal chats (every one must be 200) and
their latency, and the gateway's RSS at rest and its peak (VmHWM, the kernel's
high-water mark of the process's resident memory), against the rendered
gateway container's memory limit. `--kinds queued` sends only the queued
kind (what a full queue of valid bodies holds). `--quick` runs 3 seconds
(tests/gateway/test_hostile_memory.py runs it and checks the report).
No timing is asserted: the numbers are for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "operator"), str(ROOT)]

from localmodel.commands import parse_models, parse_nodes  # noqa: E402
from localmodel.contract import CONTAINER_GATEWAY  # noqa: E402
from localmodel.desired import desired_state  # noqa: E402
from localmodel.facts.quantity import parse_bytes  # noqa: E402
from localmodel.gateway_contract import ENV_PREFIX, GatewayConfig, env_name  # noqa: E402
from localmodel.render.names import gateway_memory_bytes  # noqa: E402
from tests.harness.processes import (  # noqa: E402
    ManagedProcess,
    free_port,
    http_ok,
    localmodel_process,
    port_is_listening,
)

LIMITS = GatewayConfig()
ROUTES = ("/api/chat", "/v1/chat/completions")
CHAT = json.dumps(
    {"model": "standin:1b", "stream": False, "messages": [{"role": "user", "content": "hi"}]}
).encode()
EXAMPLE = ROOT / "examples" / "qwen3.yaml"
NODES = [ROOT / "examples" / f"{n}.yaml" for n in ("nodes-small", "nodes-avx2", "nodes-amx")]
# The stand-in's, not the pod's: where it listens, what it is and serves.
NOT_THE_PODS = ("upstream", "listen", "engine", "model", "threads", "context")


def rendered_gateway(example: Path) -> tuple[dict[str, str], int]:
    """The variables and the memory limit (bytes) the renderer gives the first
    pod's gateway container of the example's first model."""
    state = desired_state(parse_models([str(example)]), parse_nodes([str(n) for n in NODES]),
                          now="2026-01-01T00:00:00Z")
    pod = next(o for o in state.models[0].objects if o.get("kind") == "Pod")
    containers = pod["spec"].get("initContainers", []) + pod["spec"]["containers"]
    gateway = next(c for c in containers if c["name"] == CONTAINER_GATEWAY)
    env = {e["name"]: e["value"] for e in gateway["env"] if "value" in e}
    env = {k: v for k, v in env.items() if k.startswith(ENV_PREFIX)
           and k not in {env_name(f) for f in NOT_THE_PODS}}
    return env, parse_bytes(gateway["resources"]["limits"]["memory"])


def setting(env: dict[str, str], name: str) -> int:
    """A setting as the pod's gateway has it: rendered, else the gateway's default."""
    return int(env.get(env_name(name.replace("_", "-")), getattr(LIMITS, name)))


def hostile_bodies(limit: int, string_limit: int) -> dict[str, tuple[bytes, int, str]]:
    """Each kind: (body, the status it must get, what its error must name)."""
    fill = limit - 64
    half = min(string_limit, fill // 2) - 64
    valid = {"model": "standin:1b", "stream": False, "messages": [
        {"role": "user", "content": "x" * half}, {"role": "user", "content": "y" * half}]}
    return {
        "messages": (
            b'{"messages":[' + b"{}," * (fill // 3) + b"{}]}", 413, "--max-messages",
        ),
        "string": (
            b'{"messages":[{"role":"user","content":"' + b"x" * fill + b'"}]}',
            413,
            "--max-string-bytes",
        ),
        "nesting": (b"[" * (fill // 2) + b"]" * (fill // 2), 400, "nested"),
        "oversize": (b"x" * (8 * 1024 * 1024), 413, "--max-body-bytes"),
        "queued": (json.dumps(valid).encode(), 200, ""),
    }


async def exchange(host: str, port: int, path: str, body: bytes, send: int | None = None
                   ) -> tuple[int, str]:
    """POST `body` (announced whole, `send` bytes of it sent); the status and
    the error's message ("" for a success)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        writer.write(head.encode() + body[:send])
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        status = int((await reader.readline()).split()[1])
        length = 0
        while (line := await reader.readline()) not in (b"\r\n", b""):
            key, _, value = line.decode().partition(":")
            if key.strip().lower() == "content-length":
                length = int(value)
        # By its length: a refused body's connection may stay open while the
        # gateway discards what the client still sends.
        text = await reader.readexactly(length)
    finally:
        writer.close()
    if status < 300:
        return status, ""
    doc = json.loads(text) if text.startswith(b"{") else {}
    error = doc.get("error", "")
    return status, str(error.get("message") if isinstance(error, dict) else error)


KINDS = ("messages", "string", "nesting", "oversize", "queued")
RIGHT = "as it must be"  # a kind's answer: its status, naming its limit (a 4xx)


async def hostile_client(host: str, port: int, kinds: dict[str, tuple[bytes, int, str]],
                         offset: int, until: float, answers: Counter[str]) -> None:
    names = sorted(kinds)
    i = offset
    while time.monotonic() < until:
        name = names[i % len(names)]
        body, want_status, names_limit = kinds[name]
        send = 64 * 1024 if name == "oversize" else None
        try:
            status, error = await exchange(host, port, ROUTES[i % 2], body, send)
        except (OSError, EOFError, IndexError, ValueError):
            status, error = 0, "connection broke"
        right = status == want_status and names_limit in error
        answers[f"{name}:{RIGHT if right else f'{status} {error[:60]}'}"] += 1
        i += 1


async def normal_caller(host: str, port: int, until: float, latencies: list[float],
                        statuses: Counter[int]) -> None:
    while time.monotonic() < until:
        start = time.monotonic()
        status, _ = await exchange(host, port, "/api/chat", CHAT)
        statuses[status] += 1
        if status == 200:
            latencies.append(time.monotonic() - start)


def memory_kib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak) of a process, in KiB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0])
    return out


def tally(answers: Counter[str]) -> dict[str, Any]:
    """The hostile clients' answers, counted: every refused kind's must be its
    4xx naming its limit, every queued one's a 200."""
    refused = {k: n for k, n in answers.items() if not k.startswith("queued:")}
    return {
        "hostile": dict(sorted(answers.items())),
        "hostile_sent": sum(answers.values()),
        "hostile_refused": sum(refused.values()),
        "hostile_refused_naming_the_limit": sum(
            n for k, n in refused.items() if k.endswith(RIGHT)),
        "queued_sent": answers.total() - sum(refused.values()),
        "queued_answered": answers.get(f"queued:{RIGHT}", 0),
    }


async def load(host: str, port: int, seconds: float, clients: int,
               kinds: dict[str, tuple[bytes, int, str]]) -> dict[str, Any]:
    answers: Counter[str] = Counter()
    statuses: Counter[int] = Counter()
    latencies: list[float] = []
    until = time.monotonic() + seconds
    await asyncio.gather(
        normal_caller(host, port, until, latencies, statuses),
        *(hostile_client(host, port, kinds, i, until, answers) for i in range(clients)),
    )
    return {
        **tally(answers),
        "normal_statuses": {str(k): v for k, v in sorted(statuses.items())},
        "normal_p50_s": round(statistics.median(latencies), 3) if latencies else None,
        "normal_max_s": round(max(latencies), 3) if latencies else None,
    }


def run(seconds: float, example: Path, max_queue: int | None, body_limit: int | None,
        gateway_args: list[str], only: list[str] | None = None) -> dict[str, Any]:
    pods, memory_limit = rendered_gateway(example)
    if max_queue is not None:
        pods[env_name("max-queue")] = str(max_queue)
        # What the renderer gives a model with that maxQueue.
        memory_limit = gateway_memory_bytes(setting(pods, "slots"), max_queue)
    if body_limit is not None:
        pods[env_name("max-body-bytes")] = str(body_limit)
    queue, slots = setting(pods, "max_queue"), setting(pods, "slots")
    limits = {name: setting(pods, name) for name in
              ("max_body_bytes", "max_messages", "max_string_bytes", "body_reads")}
    clients = slots + queue - 1  # every place but the normal caller's
    env = {**os.environ, **pods, "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "operator"), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    with tempfile.TemporaryDirectory(prefix="gateway-hostile-") as tmpdir, \
            contextlib.ExitStack() as stack:
        tmp = Path(tmpdir)
        up = free_port()
        standin = ManagedProcess(
            "the Ollama stand-in",
            [sys.executable, "-m", "tests.gateway.ollama_standin", "--port", str(up),
             "--tokens", "16", "--token-delay", "0.005"],
            tmp / "standin.log", env=env, cwd=ROOT,
        )
        stack.enter_context(standin.serving("the stand-in", lambda: port_is_listening(up), 20))
        port = free_port()
        gateway = localmodel_process(
            "the gateway",
            ["gateway", "--upstream", f"http://127.0.0.1:{up}", "--listen",
             f"127.0.0.1:{port}", "--model", "standin:1b", "--calibrate-tokens", "0",
             *gateway_args],
            Path(os.devnull), env, err_path=tmp / "gateway.err",
        )
        ready = f"http://127.0.0.1:{port}/readyz"
        stack.enter_context(gateway.serving("the gateway", lambda: http_ok(ready), 20))
        assert gateway.pid is not None
        asyncio.run(exchange("127.0.0.1", port, "/api/chat", CHAT))  # warm: first imports
        rest = memory_kib(gateway.pid)
        kinds = hostile_bodies(limits["max_body_bytes"], limits["max_string_bytes"])
        kinds = {k: v for k, v in kinds.items() if not only or k in only}
        report = asyncio.run(load("127.0.0.1", port, seconds, clients, kinds))
        peak = memory_kib(gateway.pid)
        report["gateway_alive"] = gateway.running()
    return {
        "seconds": seconds,
        "example": example.name,
        "slots": slots,
        "max_queue": queue,
        "hostile_clients": clients,
        "limits": limits,
        "rss_at_rest_mib": round(rest["VmRSS"] / 1024, 1),
        "rss_peak_mib": round(peak["VmHWM"] / 1024, 1),
        "pod_limit_mib": memory_limit / 1024**2,
        **report,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description="gateway memory under hostile bodies")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--example", type=Path, default=EXAMPLE,
                        help="the LocalModel whose rendered gateway settings are used")
    parser.add_argument("--max-queue", type=int, help="instead of the rendered maxQueue")
    parser.add_argument("--max-body-bytes", type=int, help="instead of the gateway's default")
    parser.add_argument("--kinds", nargs="+", choices=KINDS, help="only these kinds")
    parser.add_argument("--gateway-arg", action="append", default=[],
                        help="an extra flag for the gateway (repeatable)")
    parser.add_argument("--quick", action="store_true", help="3 seconds (a smoke test)")
    parser.add_argument("--json", action="store_true", help="end with the report as JSON")
    args = parser.parse_args()
    seconds = 3.0 if args.quick else args.seconds
    report = run(seconds, args.example, args.max_queue, args.max_body_bytes, args.gateway_arg,
                 args.kinds)
    report["quick"] = args.quick
    print(f"gateway under hostile bodies for {seconds:g}s ({report['example']} as rendered: "
          f"{report['slots']} slot(s), maxQueue {report['max_queue']}): "
          f"{report['hostile_clients']} hostile clients (every place but one) and one normal "
          "caller")
    for kind, count in report["hostile"].items():
        print(f"  hostile {kind}: {count}")
    print(f"  normal chats: {report['normal_statuses']} (p50 {report['normal_p50_s']} s, "
          f"max {report['normal_max_s']} s)")
    print(f"  gateway RSS: {report['rss_at_rest_mib']} MiB at rest, peak "
          f"{report['rss_peak_mib']} MiB (pod limit {report['pod_limit_mib']:g} MiB)")
    if args.json:
        print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
