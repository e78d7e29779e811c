"""The router's memory under hostile bodies: its peak RSS while every place
it has (--places) is held by a client sending the worst bodies, and a normal
chat's answers meanwhile.

Run: python benchmarks/router_hostile.py [--seconds S] [--places N] [--body-reads N]
     [--max-body-bytes N] [--kinds KIND ...] [--over N] [--quick] [--json]

The router runs as `localmodel router` in its own process with its defaults
(or the flags given), in static mode in front of one replica: the Ollama
stand-in (tests/gateway/ollama_standin.py, not Ollama) in another process,
answering each turn in 16 tokens 20 ms apart (about a third of a second;
`--answer-seconds`), so a relayed request holds its place, with its bytes,
that long. For `--seconds`, places - 1
hostile clients each send, one after another, the worst bodies just within
the body limit, alternating the Ollama and the OpenAI chat routes:

- structure: `{"model":"standin:1b","x":[{},{},...]}`, the shape that parses
  to the most memory (about 25 times its size in Python objects) and that no
  bound refuses (`x` is no field the bounds know): routed and relayed to the
  replica, whose answer the caller gets (what a place holding the worst valid
  body costs, and the parse of the worst body);
- messages: the same structure as `messages`: 413, naming --max-messages;
- string: one message whose content is the whole body: 413, --max-string-bytes;
- nesting: `[[[[...]]]]` as deep as the body allows: 400, not a JSON object;
- oversize: headers announcing 8 MiB (and its first 64 KiB sent): 413 by its
  Content-Length, never read, naming --max-body-bytes;
- over (with `--over N`): the structure body from N clients past the
  places, so that every place is held at times: any kind, the normal chat's
  included, may then get 503 naming --places (counted as `over:503` for
  theirs, as it must be for the others').

Meanwhile one normal caller chats back to back on /api/chat (the hostile
clients hold every place but one). Reported: each kind's answers, the normal
chats' statuses and latency, and the router's RSS at rest and its peak
(VmHWM, the kernel's high-water mark of the process's resident memory),
against the chart's router memory limit (router/config.py,
router_memory_bytes). `--quick` runs 3 seconds
(tests/router/test_router_hostile_memory.py runs it and checks the report).
No timing is asserted: the numbers are for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "operator"), str(ROOT)]

from benchmarks.gateway_hostile import CHAT, ROUTES, exchange, memory_kib  # noqa: E402
from localmodel.router.config import PLACES, RouterConfig, router_memory_bytes  # noqa: E402
from tests.harness.processes import (  # noqa: E402
    ManagedProcess,
    free_port,
    http_ok,
    localmodel_process,
    port_is_listening,
)

DEFAULTS = RouterConfig()
KINDS = ("structure", "messages", "string", "nesting", "oversize")
RIGHT = "as it must be"


def hostile_bodies(limit: int, string_limit: int) -> dict[str, tuple[bytes, int, str]]:
    """Each kind: (body, the status it must get, what its error must name);
    status 0: whatever the replica answered (the body was relayed)."""
    fill = limit - 64
    head = b'{"model":"standin:1b","stream":false,'
    structure = head + b'"x":[' + b"{}," * ((fill - len(head)) // 3) + b"{}]}"
    return {
        "structure": (structure, 0, ""),
        "messages": (head + b'"messages":[' + b"{}," * ((fill - len(head)) // 3) + b"{}]}",
                     413, "--max-messages"),
        "string": (head + b'"messages":[{"role":"user","content":"'
                   + b"x" * (fill - len(head) - 40) + b'"}]}',
                   413, "--max-string-bytes"),
        "nesting": (b"[" * (fill // 2) + b"]" * (fill // 2), 400, "JSON"),
        "oversize": (b"x" * (8 * 1024 * 1024), 413, "--max-body-bytes"),
    }


def judged(kind: str, want: int, names: str, status: int, error: str) -> str:
    if status == 503 and "--places" in error:
        right = True  # every place held (by the clients past them, --over)
    elif want == 0:  # relayed: the replica's own answer, never the router's refusal
        right = status not in (0, 408, 413, 500, 502, 503)
    else:
        right = status == want and names in error
    return RIGHT if right else f"{status} {error[:60]}"


async def hostile_client(host: str, port: int, kinds: dict[str, tuple[bytes, int, str]],
                         names: list[str], offset: int, until: float,
                         answers: Counter[str]) -> None:
    i = offset
    while time.monotonic() < until:
        name = names[i % len(names)]
        body, want, limit_named = kinds[name]
        send = 64 * 1024 if name == "oversize" else None
        try:
            status, error = await exchange(host, port, ROUTES[i % 2], body, send)
        except (OSError, EOFError, IndexError, ValueError):
            status, error = 0, "connection broke"
        answers[f"{name}:{judged(name, want, limit_named, status, error)}"] += 1
        if name == "over" and status == 503:
            answers["over:503"] += 1
        i += 1


async def normal_caller(host: str, port: int, until: float, latencies: list[float],
                        statuses: Counter[int]) -> None:
    while time.monotonic() < until:
        start = time.monotonic()
        status, _ = await exchange(host, port, "/api/chat", CHAT)
        statuses[status] += 1
        if status == 200:
            latencies.append(time.monotonic() - start)


async def load(host: str, port: int, seconds: float, clients: int,
               kinds: dict[str, tuple[bytes, int, str]], over: int) -> dict[str, Any]:
    answers: Counter[str] = Counter()
    statuses: Counter[int] = Counter()
    latencies: list[float] = []
    until = time.monotonic() + seconds
    names = sorted(kinds)
    over_kinds = {"over": (kinds["structure"][0], 0, "")} if "structure" in kinds else {}
    extra = [hostile_client(host, port, over_kinds, ["over"], 0, until, answers)
             for _ in range(over if over_kinds else 0)]
    await asyncio.gather(
        normal_caller(host, port, until, latencies, statuses),
        *(hostile_client(host, port, kinds, names, i, until, answers) for i in range(clients)),
        *extra,
    )
    latencies.sort()
    return {
        "hostile": dict(sorted(answers.items())),
        "hostile_sent": sum(n for k, n in answers.items() if k != "over:503"),
        "hostile_as_they_must_be": sum(n for k, n in answers.items() if k.endswith(RIGHT)),
        "normal_statuses": {str(k): v for k, v in sorted(statuses.items())},
        "normal_p50_s": round(latencies[len(latencies) // 2], 3) if latencies else None,
        "normal_max_s": round(latencies[-1], 3) if latencies else None,
    }


def run(seconds: float, places: int, body_reads: int, body_limit: int,
        only: list[str] | None, over: int, answer_s: float = 0.32) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "operator"), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    with tempfile.TemporaryDirectory(prefix="router-hostile-") as tmpdir, \
            contextlib.ExitStack() as stack:
        tmp = Path(tmpdir)
        up = free_port()
        standin = ManagedProcess(
            "the Ollama stand-in",
            [sys.executable, "-m", "tests.gateway.ollama_standin", "--port", str(up),
             "--tokens", "16", "--token-delay", f"{answer_s / 16:g}"],
            tmp / "standin.log", env=env, cwd=ROOT,
        )
        stack.enter_context(standin.serving("the stand-in", lambda: port_is_listening(up), 20))
        port, admin = free_port(), free_port()
        router = localmodel_process(
            "the router",
            ["router", "--replicas", f"standin:1b=http://127.0.0.1:{up}", "--listen",
             f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{admin}",
             "--places", str(places), "--body-reads", str(body_reads),
             "--max-body-bytes", str(body_limit)],
            Path(os.devnull), env, err_path=tmp / "router.err",
        )
        ready = f"http://127.0.0.1:{port}/readyz"
        stack.enter_context(router.serving("the router", lambda: http_ok(ready), 20))
        assert router.pid is not None
        asyncio.run(exchange("127.0.0.1", port, "/api/chat", CHAT))  # warm: first imports
        rest = memory_kib(router.pid)
        kinds = hostile_bodies(body_limit, DEFAULTS.bounds.max_string_bytes)
        kinds = {k: v for k, v in kinds.items() if not only or k in only}
        report = asyncio.run(load("127.0.0.1", port, seconds, places - 1, kinds, over))
        peak = memory_kib(router.pid)
        report["router_alive"] = router.running()
    return {
        "seconds": seconds,
        "places": places,
        "body_reads": body_reads,
        "max_body_bytes": body_limit,
        "hostile_clients": places - 1,
        "over_clients": over,
        "answer_s": answer_s,
        "rss_at_rest_mib": round(rest["VmRSS"] / 1024, 1),
        "rss_peak_mib": round(peak["VmHWM"] / 1024, 1),
        "chart_limit_mib": router_memory_bytes(places, body_reads, body_limit) / 1024**2,
        **report,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description="router memory under hostile bodies")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--places", type=int, default=PLACES)
    parser.add_argument("--body-reads", type=int, default=DEFAULTS.body_reads)
    parser.add_argument("--max-body-bytes", type=int, default=DEFAULTS.max_body_bytes)
    parser.add_argument("--kinds", nargs="+", choices=KINDS, help="only these kinds")
    parser.add_argument("--over", type=int, default=0,
                        help="clients past the places, sending the structure body")
    parser.add_argument("--answer-seconds", type=float, default=0.32,
                        help="how long the stand-in takes to answer a turn (16 tokens)")
    parser.add_argument("--quick", action="store_true", help="3 seconds (a smoke test)")
    parser.add_argument("--json", action="store_true", help="end with the report as JSON")
    args = parser.parse_args()
    seconds = 3.0 if args.quick else args.seconds
    report = run(seconds, args.places, args.body_reads, args.max_body_bytes, args.kinds,
                 args.over, args.answer_seconds)
    report["quick"] = args.quick
    print(f"router under hostile bodies for {seconds:g}s: {report['hostile_clients']} hostile "
          f"clients (every place of {report['places']} but one), {report['over_clients']} more "
          "past the places, "
          f"and one normal caller; --body-reads {report['body_reads']}")
    for kind, count in report["hostile"].items():
        print(f"  hostile {kind}: {count}")
    print(f"  normal chats: {report['normal_statuses']} (p50 {report['normal_p50_s']} s, "
          f"max {report['normal_max_s']} s)")
    print(f"  router RSS: {report['rss_at_rest_mib']} MiB at rest, peak "
          f"{report['rss_peak_mib']} MiB (chart limit {report['chart_limit_mib']:g} MiB)")
    if args.json:
        print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
