"""The sorted fit structures: nodes as ``(free whole CPUs, free memory, name)``
entries in chunked sorted lists, and the two queries the planner asks of them."""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable
from typing import NamedTuple

Entry = tuple[int, int, str]  # (free whole CPUs, free memory bytes, node name)

MIN = -(1 << 62)  # below any free memory or CPU count, for bisecting


class SortedEntries:
    """A sorted list of entries in chunks, so that adding or removing one costs
    about sqrt(n) instead of moving the whole list (what sortedcontainers does;
    not a dependency for 60 lines). Positions are global indices."""

    __slots__ = ("_chunk_size", "_chunks", "_len", "_maxes", "_starts")

    def __init__(self, chunk_size: int = 512) -> None:
        self._chunk_size = chunk_size  # chunks are split at twice this
        self._chunks: list[list[Entry]] = []
        self._maxes: list[Entry] = []  # last entry of each chunk
        self._starts: list[int] = []  # global index of each chunk's first entry
        self._len = 0

    def load(self, entries: list[Entry]) -> None:
        """Start from entries already sorted (an index being built sorts its
        nodes once and deals them out in order, instead of sorting every list)."""
        size = self._chunk_size
        self._chunks = [entries[i : i + size] for i in range(0, len(entries), size)]
        self._reindex()

    def _reindex(self) -> None:
        self._maxes = [chunk[-1] for chunk in self._chunks]
        self._starts = []
        total = 0
        for chunk in self._chunks:
            self._starts.append(total)
            total += len(chunk)
        self._len = total

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, i: int) -> Entry:
        c = bisect_right(self._starts, i) - 1
        return self._chunks[c][i - self._starts[c]]

    def bisect_left(self, key: Entry, lo: int = 0, hi: int | None = None) -> int:
        """The first index in [lo, hi] whose entry is >= key."""
        c = bisect_left(self._maxes, key)
        i = (
            self._len
            if c == len(self._chunks)
            else self._starts[c] + bisect_left(self._chunks[c], key)
        )
        return min(max(i, lo), self._len if hi is None else hi)

    def add(self, entry: Entry) -> None:
        if not self._chunks:
            self._chunks.append([entry])
            self._reindex()
            return
        c = min(bisect_left(self._maxes, entry), len(self._chunks) - 1)
        chunk = self._chunks[c]
        insort(chunk, entry)
        size = self._chunk_size
        if len(chunk) > 2 * size:
            self._chunks[c : c + 1] = [chunk[:size], chunk[size:]]
            self._reindex()
            return
        self._maxes[c] = chunk[-1]
        self._shift(c, 1)

    def remove(self, entry: Entry) -> None:
        c = bisect_left(self._maxes, entry)
        chunk = self._chunks[c]
        del chunk[bisect_left(chunk, entry)]
        if not chunk:
            del self._chunks[c]
            self._reindex()
            return
        self._maxes[c] = chunk[-1]
        self._shift(c, -1)

    def _shift(self, c: int, by: int) -> None:
        starts = self._starts
        for k in range(c + 1, len(starts)):
            starts[k] += by
        self._len += by


class ByOccupancy(NamedTuple):
    """A group's usable nodes, split by who is on them: nodes without our models,
    and nodes shared by non-exclusive models (a node held by an exclusive model
    is in neither)."""

    empty: SortedEntries
    shared: SortedEntries


def first_fit(
    entries: SortedEntries, cpu: int, memory: int, accept: Callable[[str], bool]
) -> Entry | None:
    """The first entry with at least ``cpu`` CPUs and ``memory`` that ``accept``s."""
    i = entries.bisect_left((cpu, memory, ""))
    n = len(entries)
    while i < n:
        cpus, free, name = entries[i]
        if free < memory:  # a CPU bucket's small-memory nodes: skip to its fitting ones
            i = entries.bisect_left((cpus, memory, ""), i)
            continue
        if accept(name):
            return entries[i]
        i += 1
    return None


def largest_fit(entries: SortedEntries, memory: int, accept: Callable[[str], bool]) -> Entry | None:
    """The entry with the most CPUs (at least one), then the least memory that fits."""
    hi = len(entries)
    while hi > 0:
        cpus = entries[hi - 1][0]
        if cpus < 1:
            return None
        lo = entries.bisect_left((cpus, MIN, ""), 0, hi)
        for i in range(entries.bisect_left((cpus, memory, ""), lo, hi), hi):
            if accept(entries[i][2]):
                return entries[i]
        hi = lo
    return None
