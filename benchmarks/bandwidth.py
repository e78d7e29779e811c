"""The node probe's memory-bandwidth measurement against a C reference, its array size against
the last-level cache, and its cost.

    python benchmarks/bandwidth.py [--multiples 0.5,1,2,3,4,8] [--threads 1,2] [--repeats 3]

For each array size (a multiple of cpu0's last-level cache, or of all instances together
for more than one thread) and thread count, interleaved, ``--repeats`` times: the probe's
`localmodel.probe.stream.measure` (CPU-timed and wall-timed), and a C reference built here
with gcc (a sum of 64-bit words, -O3 -march=native, and glibc's memchr, one pthread per
thread, best of its passes by the wall clock): the reference is only this benchmark's, it
never ships. Then the probe's whole measurement as it runs (`array_size` at the probe's
multiple, 1 thread and all threads, first): its wall seconds, its CPU seconds (the readers'
included), the peak resident memory of the process that holds the array. One JSON line
per point on stdout and a table on stderr. Run it alone on the machine (it measures the
machine's memory). ``--quick`` (CI): 3 x the cache, one thread, once.

    python benchmarks/bandwidth.py --quota 0.01 [--threads 1,2]

The probe's measurement in a child process under a CFS quota (0.01 CPU: the probe's 10m,
were it a limit; a cgroup of the test harness's, so as root), beside one without: the
CPU-timed rate against the wall-timed one, and the wall seconds it took.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from localmodel.probe.bandwidth import ARRAY_LLC_MULTIPLE, last_level_cache, read_cache_entries
from localmodel.probe.stream import measure

C_REFERENCE = r"""
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static size_t part; static char *buf; static int passes; static int use_memchr;
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9; }
static pthread_barrier_t barrier; static volatile uint64_t sink; static double took[256];
static void *reader(void *arg) {
  size_t i0 = (size_t)(uintptr_t)arg; char *p = buf + i0 * part;
  pthread_barrier_wait(&barrier); double t0 = now();
  for (int k = 0; k < passes; k++) {
    if (use_memchr) { if (memchr(p, 1, part)) abort(); }
    else { const uint64_t *w = (const uint64_t *)p; uint64_t s = 0;
      for (size_t i = 0; i < part / 8; i++) s += w[i]; sink += s; }
  }
  took[i0] = now() - t0; return 0;
}
int main(int argc, char **argv) {
  size_t n = strtoull(argv[1], 0, 10); int threads = atoi(argv[2]); passes = atoi(argv[3]);
  use_memchr = atoi(argv[4]); part = n / threads; buf = malloc(n);
  memset(buf, 2, n);  /* not 0: gcc turns malloc+memset(0) into calloc: zero pages */
  pthread_t t[256]; double best = 0;
  for (int r = 0; r < 4; r++) {  /* each reader times itself; the sum of their rates */
    pthread_barrier_init(&barrier, 0, threads);
    for (int i = 0; i < threads; i++) pthread_create(&t[i], 0, reader, (void *)(uintptr_t)i);
    for (int i = 0; i < threads; i++) pthread_join(t[i], 0);
    double rate = 0; for (int i = 0; i < threads; i++) rate += (double)part * passes / took[i];
    if (r > 0 && rate > best) best = rate;
    pthread_barrier_destroy(&barrier);
  }
  printf("%.0f\n", best); return 0;
}
"""


def build_reference(directory: Path) -> Path | None:
    gcc = shutil.which("gcc")
    if gcc is None:
        return None
    source = directory / "stream.c"
    source.write_text(C_REFERENCE)
    binary = directory / "stream"
    subprocess.run([gcc, "-O3", "-march=native", "-pthread", "-o", str(binary), str(source)],
                   check=True)
    return binary


def reference(binary: Path, size: int, threads: int, memchr: bool) -> float:
    out = subprocess.run([str(binary), str(size), str(threads), "3", str(int(memchr))],
                         check=True, capture_output=True, text=True).stdout
    return float(out)


def probe_cost(size: int, threads: int) -> dict[str, float]:
    """The probe's measurement as it runs: wall and CPU seconds, this process's peak RSS
    (the array is allocated here; the readers share it). Run before anything else."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    own = time.process_time()
    result = measure(size, threads)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
           + time.process_time() - own)
    return {"seconds": result.seconds, "cpu_seconds": cpu,
            "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "max_rss_before_mib": rss_before / 1024,
            "gbps": result.bytes_per_second / 1e9}


CHILD = ("import json, sys; from localmodel.probe.stream import measure; "
         "m = measure(int(sys.argv[1]), int(sys.argv[2])); "
         "print(json.dumps({'cpu_gbps': m.bytes_per_second / 1e9, "
         "'wall_gbps': m.wall_bytes_per_second / 1e9, 'seconds': m.seconds}))")


def under_quota(size: int, threads: int, cpus: float | None) -> dict[str, float]:
    """One measurement in a child process, in a CFS-quota cgroup of `cpus` (None: none)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.harness.cgroup import cpu_quota_cgroup
    from tests.harness.processes import ManagedProcess

    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        group = stack.enter_context(cpu_quota_cgroup(cpus)) if cpus is not None else None
        child = ManagedProcess("bandwidth", [sys.executable, "-c", CHILD, str(size),
                                             str(threads)], Path(tmp) / "child.log",
                               preexec=group.join if group is not None else None)
        child.start()
        assert child.wait(timeout=900) == 0, child.log_text()
        result: dict[str, float] = json.loads(child.log_text().strip().splitlines()[-1])
        return result


def quota_main(cpus: float, thread_counts: list[int], llc: int, total: int) -> int:
    for threads in thread_counts:
        size = ARRAY_LLC_MULTIPLE * (llc if threads == 1 else total)
        for quota in (None, cpus):
            got = under_quota(size, threads, quota)
            line = {"quota_cpus": quota, "threads": threads, "load": os.getloadavg(), **got}
            print(json.dumps(line), flush=True)
            print(f"quota {quota}, {threads} thr: {got}", file=sys.stderr)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--multiples", default="0.5,1,2,3,4,8")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quota", type=float, default=None, metavar="CPUS")
    parser.add_argument("--quick", action="store_true",
                        help="CI: 3 x the cache, one thread, one repeat")
    args = parser.parse_args()
    if args.quick:
        args.multiples, args.threads, args.repeats = "3", "1", 1
    cache = last_level_cache(read_cache_entries(Path("/")))
    if cache is None:
        print("no last-level cache in sysfs", file=sys.stderr)
        return 2
    if args.quota is not None:
        return quota_main(args.quota, [int(t) for t in args.threads.split(",")], cache.one,
                          cache.total)
    multiples = [float(m) for m in args.multiples.split(",")]
    thread_counts = [int(t) for t in args.threads.split(",")]
    uptime = os.getloadavg()
    rows: dict[tuple[int, float], dict[str, list[float]]] = {}
    for threads in thread_counts:
        llc = cache.one if threads == 1 else cache.total
        cost = probe_cost(ARRAY_LLC_MULTIPLE * llc, threads)
        print(json.dumps({"cost": True, "threads": threads, **cost}), flush=True)
        print(f"probe cost, {threads} thr: {cost}", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        binary = build_reference(Path(tmp))
        for _ in range(args.repeats):
            for threads in thread_counts:
                llc = cache.one if threads == 1 else cache.total
                for m in multiples:
                    size = int(m * llc)
                    got = measure(size, threads)
                    row = rows.setdefault((threads, m), {})
                    row.setdefault("probe_cpu", []).append(got.bytes_per_second / 1e9)
                    row.setdefault("probe_wall", []).append(got.wall_bytes_per_second / 1e9)
                    if binary is not None:
                        row.setdefault("c_sum", []).append(reference(binary, size, threads,
                                                                     False) / 1e9)
                        row.setdefault("c_memchr", []).append(reference(binary, size, threads,
                                                                        True) / 1e9)
    for (threads, m), row in sorted(rows.items()):
        line = {"threads": threads, "llc_multiple": m, "load": uptime,
                **{k: {"median": round(statistics.median(v), 3),
                       "min": round(min(v), 3), "max": round(max(v), 3)}
                   for k, v in row.items()}}
        print(json.dumps(line), flush=True)
        print(f"{threads} thr {m:>4}x LLC: " + "  ".join(
            f"{k} {statistics.median(v):6.2f}" for k, v in row.items()) + " GB/s",
            file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
