"""The probe's memory-bandwidth fact over time: measures when `bandwidth.due` says so, keeps the
last measurement, and says in its log why it did not measure.

One thread first, over ``ARRAY_LLC_MULTIPLE`` times cpu0's last-level cache; then every CPU
the probe may run on (its affinity: the node's CPUs, or the shared pool under the static CPU
manager), over that multiple of all last-level caches together, when the container's memory
limit leaves room for it (else the one-thread number alone, with the reason logged). The
arrays live in this process only while measuring (`stream.measure` frees them).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from localmodel.facts.model import MemoryBandwidth
from localmodel.probe.bandwidth import (
    QUIET_WINDOW_SECONDS,
    REMEASURE_SECONDS,
    array_size,
    busy_cpus,
    due,
    last_level_cache,
    memory_budget,
    read_cache_entries,
    read_cpu_times,
    read_own_memory,
)
from localmodel.probe.stream import Measured, measure

__all__ = ["BandwidthProbe"]


class BandwidthProbe:
    """Keeps the last memory bandwidth measured on this node and when; measures when due."""

    def __init__(self, host: Path, own: Path = Path("/"), *, log: TextIO = sys.stderr,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep,
                 measure: Callable[[int, int], Measured] = measure) -> None:
        self.host = host  # where the node's sysfs is mounted (the DaemonSet: /host)
        self.own = own  # this container's /proc and cgroup (its /proc/stat is the node's)
        self.log = log
        self.clock = clock
        self.sleep = sleep
        self.measure = measure
        self.last: MemoryBandwidth | None = None
        self.tried_at: float | None = None  # a measurement made, or refused for good

    def __call__(self) -> MemoryBandwidth | None:
        """The last measurement, measuring first when one is due and the node is quiet."""
        now = self.clock()
        if self.tried_at is not None and now - self.tried_at < REMEASURE_SECONDS:
            return self.last
        busy = self._busy()
        if not due(self.tried_at, now, busy):
            shown = "unknown" if busy is None else f"{busy:.2f}"
            self._say(f"memory bandwidth not measured: the node is busy ({shown} CPUs)")
            return self.last
        self.tried_at = now
        try:
            self.last = self._measure() or self.last
        except (OSError, MemoryError) as e:  # no fork, no memory: tried again in a day
            self._say(f"memory bandwidth not measured: {type(e).__name__}: {e}")
        return self.last

    def _busy(self) -> float | None:
        before, started = read_cpu_times(self.own), self.clock()
        self.sleep(QUIET_WINDOW_SECONDS)
        after = read_cpu_times(self.own)
        if before is None or after is None:
            return None
        return busy_cpus(before, after, self.clock() - started, os.sysconf("SC_CLK_TCK"))

    def _measure(self) -> MemoryBandwidth | None:
        cache = last_level_cache(read_cache_entries(self.host))
        if cache is None:
            self._say("memory bandwidth not measured: no last-level cache size in sysfs")
            return None
        budget = memory_budget(*read_own_memory(self.own))
        one = array_size(cache.one, budget)
        if one.bytes is None:
            self._say(f"memory bandwidth not measured: {one.why_not}")
            return None
        single = self.measure(one.bytes, 1)
        threads = len(os.sched_getaffinity(0))
        every = array_size(cache.total, budget) if threads > 1 else None
        if every is not None and every.bytes is None:
            self._say(f"memory bandwidth at {threads} threads not measured: {every.why_not}")
        together = (self.measure(every.bytes, threads)
                    if every is not None and every.bytes is not None else None)
        result = MemoryBandwidth(
            int(single.bytes_per_second),
            int(together.bytes_per_second) if together is not None else None,
            threads if together is not None else None)
        spent = single.seconds + (together.seconds if together is not None else 0.0)
        self._say(f"memory bandwidth: {single.bytes_per_second / 1e9:.2f} GB/s at 1 thread"
                  + (f", {together.bytes_per_second / 1e9:.2f} GB/s at {threads}"
                     if together is not None else "") + f" ({spent:.2f} s)")
        return result

    def _say(self, message: str) -> None:
        print(f"localmodel probe: {message}", file=self.log, flush=True)
