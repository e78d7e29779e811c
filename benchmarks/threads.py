"""Decode speed against thread count and CPU budget, on this machine, with the
real llama-server and Gemma 3 270M (hack/build-llama-server.sh). Needs root
(it creates a CPU-quota cgroup, v2 or v1).

Run: python benchmarks/threads.py [--tokens 64] [--runs 3]

Cases, each a fresh llama-server (one slot, context 512), one warm-up request,
then ``--runs`` non-streaming completions of ``--tokens`` tokens (ignore_eos):
decode tok/s from the engine's own `timings.predicted_per_second`, best run.

- a 1-CPU quota with 1 thread and with 8 threads (the oversubscription the
  threads rule prevents);
- no quota with 1 thread and with one thread per physical core;
- on an SMT machine also one thread per logical CPU (what the SMT question
  needs: threads = logical CPUs vs threads = physical cores).

Printed side by side with the ratio to the first case of its group. The
machine is shared: run it when it is quiet and read the ratios, not the
absolute numbers.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import urllib.request
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "operator"), str(ROOT)]

from localmodel.facts.machine import read_machine  # noqa: E402
from tests.harness.cgroup import cpu_quota_cgroup  # noqa: E402
from tests.harness.llama import llama_server  # noqa: E402


def decode_rate(url: str, tokens: int) -> float:
    body = {"prompt": "Count from 1 to 5000:", "n_predict": tokens, "ignore_eos": True,
            "cache_prompt": False}
    request = urllib.request.Request(url + "/completion", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return float(json.load(response)["timings"]["predicted_per_second"])


def measure(threads: int, quota: float | None, tokens: int, runs: int, work: Path) -> float:
    with ExitStack() as stack:
        join = None
        if quota is not None:
            join = stack.enter_context(cpu_quota_cgroup(cpus=quota)).join
        server = stack.enter_context(
            llama_server(work / f"llama-{threads}-{quota}.log", threads=threads, context=512,
                         preexec=join)
        )
        decode_rate(server.url, 8)  # warm-up
        return max(decode_rate(server.url, tokens) for _ in range(runs))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    topo = read_machine().topology
    cores = topo.physical_cores or 1
    logical = topo.logical_cpus or cores
    groups: list[tuple[str, list[tuple[str, int, float | None]]]] = [
        ("1-CPU quota", [("1 thread", 1, 1.0), ("8 threads", 8, 1.0)]),
        ("no quota", [("1 thread", 1, None), (f"{cores} threads (cores)", cores, None)]),
    ]
    if logical > cores:
        groups.append(("SMT", [(f"{cores} threads (cores)", cores, None),
                               (f"{logical} threads (logical CPUs)", logical, None)]))
    print(f"machine: {logical} logical CPUs, {cores} physical cores, "
          f"{topo.threads_per_core} threads per core; {args.tokens} tokens, best of {args.runs}")
    print(f"{'case':<14} {'threads':<28} {'decode tok/s':>12} {'ratio':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        for group, cases in groups:
            first: float | None = None
            for label, threads, quota in cases:
                rate = measure(threads, quota, args.tokens, args.runs, Path(tmp))
                first = first or rate
                print(f"{group:<14} {label:<28} {rate:>12.1f} {rate / first:>7.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
