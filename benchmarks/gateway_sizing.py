"""The gateway's CPU at its pod's maximum throughput: every slot streaming at
the engine's top speed. What `render/names.py` (`gateway_cpu_milli`) sizes
the gateway container's CPU limit from (docs/benchmarks.md, "The gateway's
CPU at a pod's top speed").

Run: python benchmarks/gateway_sizing.py [--quick] [--json] [--slots S ...]
         [--rate TOK_PER_S] [--seconds T]

The upstream is the Ollama stand-in (tests/gateway/ollama_standin.py, not an
engine: a real engine cannot stream several slots at its top single-stream
speed on this 2-core machine) pacing each stream at `--rate` tokens per
second (default TOP_TOKENS_PER_SECOND from render/names.py: the fastest
decode on one thread measured for the smallest model in the catalog,
docs/benchmarks.md). The gateway runs as `localmodel gateway` with `--slots S`
and the ledger on (its default), and S clients stream back to back, every
request naming a caller and a session (the ledger's whole work), so every
slot streams all the time. Two response lengths per slot count, LONG tokens
and SHORT tokens, separate the gateway's CPU per relayed token from its CPU
per request (two equations, two unknowns: cpu = a x tokens + b x requests).

The gateway's CPU is its process's user + system time from /proc (psutil),
not wall clock, so a loaded machine still gives a usable number (it can only
add to it: cache misses, a descheduled process waking up); the load averages
before and after are printed. Reported per slot count: tokens/s relayed, the
gateway's share of a core, CPU per token and per request, and what
`gateway_cpu_milli` gives that pod.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "operator"), str(ROOT)]

from benchmarks.gateway import Samples, batch, serve  # noqa: E402
from localmodel.render.names import (  # noqa: E402
    TOP_TOKENS_PER_SECOND,
    gateway_cpu_milli,
    gateway_memory_bytes,
)
from tests.harness.processes import ManagedProcess, free_port, localmodel_process  # noqa: E402

LONG, SHORT = 64, 4  # tokens per response
QUEUE = 16  # the gateway's maxQueue (the API's default)
MiB = 1024**2


@dataclass(frozen=True)
class Run:
    slots: int
    tokens_per_response: int
    tokens: int
    requests: int
    wall: float
    cpu: float  # the gateway's user + system seconds
    peak_rss: int  # the gateway's high-water mark (VmHWM), bytes

    @property
    def share(self) -> float:
        return self.cpu / self.wall if self.wall > 0 else 0.0


def peak_rss(pid: int) -> int:
    """The process's resident high-water mark (VmHWM in /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


async def one_run(slots: int, tokens: int, rate: float, seconds: float, env: dict[str, str]
                  ) -> Run:
    with contextlib.ExitStack() as stack:
        up = free_port()
        standin = [sys.executable, "-m", "tests.gateway.ollama_standin", "--port", str(up),
                   "--tokens", str(tokens), "--token-delay", f"{1 / rate:.6f}", "--steady"]
        serve(stack, ManagedProcess("the Ollama stand-in", standin, Path(os.devnull), env=env,
                                    cwd=ROOT), up)
        port = free_port()
        args = ["gateway", "--upstream", f"http://127.0.0.1:{up}", "--listen",
                f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{free_port()}",
                "--model", "standin:1b", "--slots", str(slots), "--max-queue", str(QUEUE),
                "--threads", "1", "--context", "4096"]
        gateway = serve(stack, localmodel_process(f"gateway :{port}", args, Path(os.devnull),
                                                  env), port)
        proc = psutil.Process(gateway.pid)
        # Requests per client: about `seconds` of streaming at `rate`.
        per_client = max(2, round(seconds * rate / tokens))
        await batch(port, slots, 1, Samples(), [])  # warm-up, not measured
        out = Samples()
        await batch(port, slots, per_client, out, [proc], stagger=tokens / rate / slots)
        if out.errors:
            raise SystemExit(f"{out.errors} requests failed at {slots} slots")
        return Run(slots, tokens, out.tokens, out.requests, out.wall, out.cpu, peak_rss(proc.pid))


@dataclass(frozen=True)
class Costs:
    slots: int
    per_token: float  # CPU seconds
    per_request: float
    long: Run
    short: Run

    def at_top(self, rate: float) -> float:
        """The gateway's share of a core with every slot streaming at `rate`,
        answers of SHORT tokens (a request every SHORT tokens)."""
        return self.slots * rate * (self.per_token + self.per_request / SHORT)


def costs(long: Run, short: Run) -> Costs:
    """Solve cpu = a x tokens + b x requests over the two runs."""
    det = long.tokens * short.requests - short.tokens * long.requests
    a = (long.cpu * short.requests - short.cpu * long.requests) / det
    b = (long.tokens * short.cpu - short.tokens * long.cpu) / det
    return Costs(long.slots, a, b, long, short)


def line(c: Costs, rate: float) -> str:
    tps = c.long.tokens / c.long.wall
    return (f"   {c.slots:>5} {tps:>10.0f} {c.long.share * 100:>9.1f}% "
            f"{c.short.share * 100:>9.1f}% {c.long.cpu / c.long.tokens * 1e6:>11.0f} "
            f"{c.per_token * 1e6:>9.0f} {c.per_request * 1e6:>9.0f} {c.at_top(rate) * 1e3:>9.0f}m "
            f"{gateway_cpu_milli(c.slots, rate):>9}m "
            f"{max(c.long.peak_rss, c.short.peak_rss) / MiB:>8.0f} "
            f"{gateway_memory_bytes(c.slots, QUEUE) / MiB:>8.0f}")


async def main_async(slots: list[int], rate: float, seconds: float) -> list[Costs]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "operator"), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    print(f"gateway_sizing.py: every slot streaming at {rate:g} tok/s, responses of {LONG} "
          f"and {SHORT} tokens, about {seconds:g} s each; load average before {loadavg()}")
    print(f"   {'slots':>5} {'tok/s':>10} {'CPU long':>10} {'CPU short':>10} {'us/token':>11} "
          f"{'a us/tok':>9} {'b us/req':>9} {'need':>10} {'limit':>10} {'RSS MiB':>8} "
          f"{'mem lim':>8}")
    out = []
    for s in slots:
        long = await one_run(s, LONG, rate, seconds, env)
        short = await one_run(s, SHORT, rate, seconds, env)
        c = costs(long, short)
        print(line(c, rate), flush=True)
        out.append(c)
    print(f"   (CPU long/short: the gateway's share of a core; us/token: long runs' CPU over "
          f"their tokens; a, b: CPU per token and per request; need: slots x rate x (a + b / "
          f"{SHORT}); "
          f"limit: render/names.py gateway_cpu_milli; RSS: the gateway's peak; mem lim: "
          f"gateway_memory_bytes at maxQueue {QUEUE}); load average after {loadavg()}")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description="the gateway's CPU at its pod's top speed")
    parser.add_argument("--slots", type=int, nargs="+", help="slot counts (default 1 4 8 16)")
    parser.add_argument("--rate", type=float, default=TOP_TOKENS_PER_SECOND,
                        help="tokens/s per slot (default: render/names.py's top speed)")
    parser.add_argument("--seconds", type=float, default=20.0, help="per run (default 20)")
    parser.add_argument("--quick", action="store_true", help="4 slots, 3 s per run")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    args = parser.parse_args()
    if args.quick:
        args.slots, args.seconds = args.slots or [4], 3.0
    slots = args.slots or [1, 4, 8, 16]
    if any(s < 1 for s in slots) or args.rate <= 0 or args.seconds <= 0:
        parser.error("--slots, --rate and --seconds must be positive")
    began = time.monotonic()
    found = asyncio.run(main_async(slots, args.rate, args.seconds))
    if args.json:
        print(json.dumps({"rate": args.rate, "seconds": round(time.monotonic() - began, 1),
                          "load_after": loadavg(), "slots": [
                              {"slots": c.slots, "tokens_per_second": c.long.tokens / c.long.wall,
                               "cpu_share_long": c.long.share, "cpu_share_short": c.short.share,
                               "per_token_us": c.per_token * 1e6,
                               "per_request_us": c.per_request * 1e6,
                               "need_milli": c.at_top(args.rate) * 1e3,
                               "limit_milli": gateway_cpu_milli(c.slots, args.rate),
                               "peak_rss_mib": max(c.long.peak_rss, c.short.peak_rss) / MiB,
                               "memory_limit_mib": gateway_memory_bytes(c.slots, QUEUE) / MiB}
                              for c in found]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
