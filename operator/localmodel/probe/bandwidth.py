"""When and how big the node probe's memory-bandwidth measurement is. Pure, but for the readers
of sysfs, ``/proc/stat`` and the probe's own cgroup at the bottom.

The measurement itself is `probe/stream.py`'s. What this module decides:

* **How big** (`array_size`): the arrays must exceed the last-level caches, or the
  number is a cache's, not memory's. One thread is measured over ``ARRAY_LLC_MULTIPLE``
  times cpu0's last-level cache; all threads over that multiple of every distinct
  last-level cache together (an AMD EPYC has one L3 per core complex, each its own).
  Where that does not fit, the measurement is refused with the reason (a smaller
  array's number would be partly a cache's and pass for bandwidth). The bytes come out
  of the probe container's memory limit: what is left of it (``memory.max`` minus
  ``memory.current``, less ``MARGIN_BYTES``) bounds the array, so the measurement never
  gets the probe OOM-killed. docs/benchmarks.md, "Decode against the memory-bandwidth ceiling",
  has the sizes measured against the multiple.
* **When** (`due`): at the probe's start and then every ``REMEASURE_SECONDS``, and
  only while the node is quiet: the node's CPUs did less than ``QUIET_CPUS`` of
  work (``/proc/stat``, which a container reads for the whole node) over the
  ``QUIET_WINDOW_SECONDS`` just before. A node whose model serves (a decode keeps
  its threads busy) is not measured; the probe tries again at its next interval.
  The measurement is short (docs/benchmarks.md gives its cost), but a model that
  decodes is limited by this very bandwidth, and a probe must never be what
  makes it slow.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from localmodel.facts.files import read_text

__all__ = [
    "ARRAY_LLC_MULTIPLE",
    "CacheEntry",
    "LastLevelCache",
    "Sizing",
    "array_size",
    "busy_cpus",
    "due",
    "last_level_cache",
    "memory_budget",
    "parse_cache_size",
    "read_cache_entries",
    "read_cpu_times",
    "read_own_memory",
]

# The arrays are this many times the last-level cache, and never less (docs/benchmarks.md:
# on this machine's 32 MiB L3, one thread reads at its bandwidth from 1x, two threads
# read 17-50% more at 2x than at 3x-8x, where they level off).
ARRAY_LLC_MULTIPLE = 3
MARGIN_BYTES = 8 * 1024 * 1024  # what the probe keeps below its limit while measuring
# An unbounded array when the container has no limit is still bounded: at most this.
MAX_ARRAY_BYTES = 4 * 1024**3
REMEASURE_SECONDS = 24 * 3600.0
QUIET_CPUS = 0.5  # a decoding model keeps at least one CPU busy; daemons idle below this
QUIET_WINDOW_SECONDS = 1.0
_SIZE = re.compile(r"(\d{1,12})([KMG]?)")
_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}


def parse_cache_size(text: str) -> int | None:
    """Bytes from a sysfs cache ``size`` ("32768K"); None for anything else."""
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        return None
    return int(match.group(1)) * _UNITS[match.group(2)]


@dataclass(frozen=True)
class CacheEntry:
    """One ``cpuN/cache/indexM`` directory as read: level, type, size text and sharing CPUs."""

    cpu: int
    level: int
    type: str
    size: str
    shared: str  # shared_cpu_list, as written ("0-7"): one cache instance per distinct value


@dataclass(frozen=True)
class LastLevelCache:
    """The last-level cache: cpu0's (what one thread streams past) and all instances together."""

    one: int  # bytes, cpu0's last-level cache
    total: int  # bytes, every distinct last-level cache instance of the node


def last_level_cache(entries: Iterable[CacheEntry]) -> LastLevelCache | None:
    """The last-level cache from sysfs entries (instruction caches left out); None when no
    entry of the highest level has a readable size."""
    data = [e for e in entries if e.type in ("Unified", "Data")]
    if not data:
        return None
    level = max(e.level for e in data)
    instances: dict[str, int] = {}
    one = None
    for e in sorted(data, key=lambda e: e.cpu):
        size = parse_cache_size(e.size)
        if e.level != level or size is None:
            continue
        instances.setdefault(e.shared.strip() or f"cpu{e.cpu}", size)
        if one is None:
            one = size
    if one is None:
        return None
    return LastLevelCache(one=one, total=sum(instances.values()))


@dataclass(frozen=True)
class Sizing:
    """Decides the array of one measurement: its bytes, or why there is none."""

    bytes: int | None
    why_not: str = ""


def memory_budget(limit: int | None, current: int | None) -> int:
    """The bytes the probe may take for its array: what is left under its container's memory
    limit, less a margin; MAX_ARRAY_BYTES when it has no limit."""
    if limit is None:
        return MAX_ARRAY_BYTES
    return max(0, min(MAX_ARRAY_BYTES, limit - (current or 0) - MARGIN_BYTES))


def array_size(cache: int, budget: int) -> Sizing:
    """ARRAY_LLC_MULTIPLE times ``cache`` when ``budget`` holds it; else none, and why."""
    want = ARRAY_LLC_MULTIPLE * cache
    if want <= budget:
        return Sizing(want)
    mib = 1024 * 1024
    return Sizing(None, f"{ARRAY_LLC_MULTIPLE} x the last-level cache ({cache // mib} MiB) "
                        f"needs {want // mib} MiB and the probe's memory limit leaves "
                        f"{budget // mib} MiB: raise probe.resources.limits.memory")


def busy_cpus(before: tuple[int, int], after: tuple[int, int], seconds: float,
              ticks_per_second: int = 100) -> float | None:
    """CPUs' worth of work done between two ``/proc/stat`` reads of (busy, total) ticks over
    ``seconds``; None when the reads make no sense (the counters went back, no time)."""
    busy = after[0] - before[0]
    if seconds <= 0 or busy < 0 or after[1] < before[1]:
        return None
    return busy / ticks_per_second / seconds


def due(last: float | None, now: float, busy: float | None) -> bool:
    """Whether to measure now: never measured or REMEASURE_SECONDS since, and the node quiet
    (``busy`` known and under QUIET_CPUS)."""
    stale = last is None or now - last >= REMEASURE_SECONDS
    return stale and busy is not None and busy < QUIET_CPUS


# ---- the readers (the shell's, kept beside what they feed) -----------------------------


def read_cache_entries(root: Path) -> list[CacheEntry]:
    """Every ``cpuN/cache/indexM`` under ``root``'s sysfs CPU directory."""
    out = []
    for index in sorted((root / "sys/devices/system/cpu").glob("cpu[0-9]*/cache/index[0-9]*")):
        texts = [read_text(index / name) for name in ("level", "type", "size", "shared_cpu_list")]
        level, kind, size, shared = (t.strip() if t else "" for t in texts)
        if level.isdigit():
            out.append(CacheEntry(int(index.parent.parent.name[3:]), int(level), kind, size,
                                  shared))
    return out


def read_cpu_times(root: Path) -> tuple[int, int] | None:
    """(busy, total) ticks of all CPUs from ``proc/stat`` (idle and iowait are not busy)."""
    text = read_text(root / "proc/stat") or ""
    for line in text.splitlines():
        fields = line.split()
        if fields[:1] == ["cpu"] and all(f.isdigit() for f in fields[1:]) and len(fields) > 5:
            ticks = [int(f) for f in fields[1:9]]
            idle = ticks[3] + ticks[4]
            return sum(ticks) - idle, sum(ticks)
    return None


def read_own_memory(root: Path) -> tuple[int | None, int | None]:
    """This container's cgroup v2 ``memory.max`` (None: unlimited) and ``memory.current``."""
    base = root / "sys/fs/cgroup"
    limit_text = (read_text(base / "memory.max") or "").strip()
    current_text = (read_text(base / "memory.current") or "").strip()
    limit = int(limit_text) if limit_text.isdigit() else None
    return limit, int(current_text) if current_text.isdigit() else None
