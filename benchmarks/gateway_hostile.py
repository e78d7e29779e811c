"""The gateway's memory under hostile bodies: its peak RSS while the worst
bodies arrive at the queue's full depth, and a normal chat's answers meanwhile.

Run: python benchmarks/gateway_hostile.py [--seconds S] [--max-queue N] [--max-body-bytes N]
     [--quick] [--json] [--gateway-arg=--body-reads=1 ...]

The gateway runs as `localmodel gateway` in its own process, with its default
limits (body, messages, string size, bodies read at once), one slot and
`--max-queue` places (16, the pod's default), in front of the Ollama stand-in
(tests/gateway/ollama_standin.py, not Ollama) in another process. For
`--seconds`, `--max-queue` hostile clients each send, one after another, the
worst bodies just within the body limit (`--max-body-bytes`, given to the
gateway too; default the gateway's), alternating the Ollama and the OpenAI
chat routes:

- messages: `{"messages":[{},{},...]}`, the shape that parses to the most
  memory (about 25 times its size in Python objects): refused 413, naming
  --max-messages;
- string: one message whose content is the whole body: 413, --max-string-bytes;
- nesting: `[[[[...]]]]` as deep as the body allows: 400, nested too deeply;
- oversize: headers announcing 8 MiB (and its first 64 KiB sent): 413 by its
  Content-Length, never read, naming --max-body-bytes.

Meanwhile one normal caller chats back to back on /api/chat (the hostile
clients hold the queue's places, never the last one: slots + queue = the
hostile clients + this caller). Reported: each kind's answers (every one must
be its 4xx naming the limit), the normal chats (every one must be 200) and
their latency, and the gateway's RSS at rest and its peak (VmHWM, the kernel's
high-water mark of the process's resident memory), against the pod's gateway
memory limit (localmodel.render.names.GATEWAY_MEMORY_BYTES). `--quick` runs 3
seconds (tests/gateway/test_hostile_memory.py runs it and checks the report).
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

from localmodel.gateway_contract import GatewayConfig  # noqa: E402
from localmodel.render.names import GATEWAY_MEMORY_BYTES  # noqa: E402
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


def hostile_bodies(limit: int) -> dict[str, tuple[bytes, int, str]]:
    """Each kind: (body, the status it must get, what its error must name)."""
    fill = limit - 64
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
    }


async def exchange(port: int, path: str, body: bytes, send: int | None = None) -> tuple[int, str]:
    """POST `body` (announced whole, `send` bytes of it sent); the status and
    the error's message ("" for a success)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
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


async def hostile_client(port: int, kinds: dict[str, tuple[bytes, int, str]], offset: int,
                         until: float, answers: Counter[str]) -> None:
    names = sorted(kinds)
    i = offset
    while time.monotonic() < until:
        name = names[i % len(names)]
        body, want_status, names_limit = kinds[name]
        send = 64 * 1024 if name == "oversize" else None
        try:
            status, error = await exchange(port, ROUTES[i % 2], body, send)
        except (ConnectionError, IndexError, ValueError):
            status, error = 0, "connection broke"
        right = status == want_status and names_limit in error
        answers[f"{name}:{'refused naming the limit' if right else f'{status} {error[:60]}'}"] += 1
        i += 1


async def normal_caller(port: int, until: float, latencies: list[float], statuses: Counter[int]
                        ) -> None:
    while time.monotonic() < until:
        start = time.monotonic()
        status, _ = await exchange(port, "/api/chat", CHAT)
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


async def load(port: int, seconds: float, clients: int, body_limit: int) -> dict[str, Any]:
    kinds = hostile_bodies(body_limit)
    answers: Counter[str] = Counter()
    statuses: Counter[int] = Counter()
    latencies: list[float] = []
    until = time.monotonic() + seconds
    await asyncio.gather(
        normal_caller(port, until, latencies, statuses),
        *(hostile_client(port, kinds, i, until, answers) for i in range(clients)),
    )
    return {
        "hostile": dict(sorted(answers.items())),
        "hostile_sent": sum(answers.values()),
        "hostile_refused_naming_the_limit": sum(
            n for k, n in answers.items() if k.endswith("refused naming the limit")
        ),
        "normal_statuses": {str(k): v for k, v in sorted(statuses.items())},
        "normal_p50_s": round(statistics.median(latencies), 3) if latencies else None,
        "normal_max_s": round(max(latencies), 3) if latencies else None,
    }


def run(seconds: float, max_queue: int, body_limit: int, gateway_args: list[str]
        ) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
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
             f"127.0.0.1:{port}", "--model", "standin:1b", "--slots", "1", "--max-queue",
             str(max_queue), "--calibrate-tokens", "0", "--max-body-bytes", str(body_limit),
             *gateway_args],
            Path(os.devnull), env, err_path=tmp / "gateway.err",
        )
        ready = f"http://127.0.0.1:{port}/readyz"
        stack.enter_context(gateway.serving("the gateway", lambda: http_ok(ready), 20))
        assert gateway.pid is not None
        asyncio.run(exchange(port, "/api/chat", CHAT))  # warm: the first request's imports
        rest = memory_kib(gateway.pid)
        report = asyncio.run(load(port, seconds, max_queue, body_limit))
        peak = memory_kib(gateway.pid)
        report["gateway_alive"] = gateway.running()
    limit_mib = GATEWAY_MEMORY_BYTES / 1024**2
    return {
        "seconds": seconds,
        "max_queue": max_queue,
        "hostile_clients": max_queue,
        "limits": {
            "max_body_bytes": body_limit,
            "max_messages": LIMITS.max_messages,
            "max_string_bytes": LIMITS.max_string_bytes,
            "body_reads": LIMITS.body_reads,
        },
        "rss_at_rest_mib": round(rest["VmRSS"] / 1024, 1),
        "rss_peak_mib": round(peak["VmHWM"] / 1024, 1),
        "pod_limit_mib": limit_mib,
        **report,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description="gateway memory under hostile bodies")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--max-queue", type=int, default=LIMITS.max_queue)
    parser.add_argument("--max-body-bytes", type=int, default=LIMITS.max_body_bytes)
    parser.add_argument("--gateway-arg", action="append", default=[],
                        help="an extra flag for the gateway (repeatable)")
    parser.add_argument("--quick", action="store_true", help="3 seconds (a smoke test)")
    parser.add_argument("--json", action="store_true", help="end with the report as JSON")
    args = parser.parse_args()
    seconds = 3.0 if args.quick else args.seconds
    report = run(seconds, args.max_queue, args.max_body_bytes, args.gateway_arg)
    report["quick"] = args.quick
    print(f"gateway under hostile bodies for {seconds:g}s, {args.max_queue} hostile clients "
          f"(the queue's full depth) and one normal caller")
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
