"""The sorted fit structures: nodes as ``(free whole CPUs, free memory, name)``
entries in chunked sorted lists, and the two queries the planner asks of them."""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable
from operator import itemgetter
from typing import NamedTuple

Entry = tuple[int, int, str]  # (free whole CPUs, free memory bytes, node name)

MIN = -(1 << 62)  # below any free memory or CPU count, for bisecting


def sort_named_in_order(entries: list[Entry]) -> None:
    """Sort entries that are in name order as ``entries.sort()`` would: by free
    memory, then stably by free CPUs (names break the ties already). Two
    sorts comparing integers cost less than one comparing tuples."""
    entries.sort(key=itemgetter(1))
    entries.sort(key=itemgetter(0))


Position = tuple[int, int]  # (chunk, offset in it); (number of chunks, 0) is the end


class SortedEntries:
    """A sorted list of entries in chunks, so that adding or removing one costs
    about sqrt(n) instead of moving the whole list (what sortedcontainers does;
    not a dependency for 60 lines). The searches address entries by position
    (chunk, offset), so adding or removing one touches its chunk only: global
    indices (``[i]``, ``bisect_left``) are worked out on demand."""

    __slots__ = ("_chunk_size", "_chunks", "_len", "_maxes")

    def __init__(self, chunk_size: int = 512) -> None:
        self._chunk_size = chunk_size  # chunks are split at twice this
        self._chunks: list[list[Entry]] = []  # never an empty one
        self._maxes: list[Entry] = []  # last entry of each chunk
        self._len = 0

    def load(self, entries: list[Entry]) -> None:
        """Start from entries already sorted (an index being built sorts its
        nodes once and deals them out in order, instead of sorting every list)."""
        size = self._chunk_size
        self._chunks = [entries[i : i + size] for i in range(0, len(entries), size)]
        self._maxes = [chunk[-1] for chunk in self._chunks]
        self._len = len(entries)

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, i: int) -> Entry:
        for chunk in self._chunks:
            if i < len(chunk):
                return chunk[i]
            i -= len(chunk)
        raise IndexError("entry index out of range")

    def bisect_left(self, key: Entry, lo: int = 0, hi: int | None = None) -> int:
        """The first index in [lo, hi] whose entry is >= key."""
        c, j = self.locate(key)
        i = sum(len(chunk) for chunk in self._chunks[:c]) + j
        return min(max(i, lo), self._len if hi is None else hi)

    def locate(self, key: Entry, c: int = 0) -> Position:
        """The position of the first entry >= key, looking from chunk ``c`` on
        (the caller knows every entry before that chunk is smaller)."""
        c = bisect_left(self._maxes, key, c)
        if c == len(self._chunks):
            return c, 0
        return c, bisect_left(self._chunks[c], key)

    def add(self, entry: Entry) -> None:
        self._len += 1
        if not self._chunks:
            self._chunks.append([entry])
            self._maxes.append(entry)
            return
        c = min(bisect_left(self._maxes, entry), len(self._chunks) - 1)
        chunk = self._chunks[c]
        insort(chunk, entry)
        size = self._chunk_size
        if len(chunk) > 2 * size:
            low, high = chunk[:size], chunk[size:]
            self._chunks[c : c + 1] = [low, high]
            self._maxes[c : c + 1] = [low[-1], high[-1]]
            return
        self._maxes[c] = chunk[-1]

    def remove(self, entry: Entry) -> None:
        self._len -= 1
        c = bisect_left(self._maxes, entry)
        chunk = self._chunks[c]
        del chunk[bisect_left(chunk, entry)]
        if chunk:
            self._maxes[c] = chunk[-1]
        else:
            del self._chunks[c]
            del self._maxes[c]


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
    chunks = entries._chunks
    c, j = entries.locate((cpu, memory, ""))
    while c < len(chunks):
        chunk = chunks[c]
        if j == len(chunk):
            c, j = c + 1, 0
            continue
        entry = chunk[j]
        if entry[1] < memory:  # a CPU bucket's small-memory nodes: skip to its fitting ones
            c, j = entries.locate((entry[0], memory, ""), c)
            continue
        if accept(entry[2]):
            return entry
        j += 1
    return None


def largest_fit(entries: SortedEntries, memory: int, accept: Callable[[str], bool]) -> Entry | None:
    """The entry with the most CPUs (at least one), then the least memory that fits."""
    chunks = entries._chunks
    end: Position = (len(chunks), 0)  # the CPU bucket being searched ends here
    while end > (0, 0):
        c, j = end
        cpus = (chunks[c][j - 1] if j else chunks[c - 1][-1])[0]
        if cpus < 1:
            return None
        start = entries.locate((cpus, MIN, ""))
        c, j = entries.locate((cpus, memory, ""), start[0])
        while (c, j) < end:
            chunk = chunks[c]
            if accept(chunk[j][2]):
                return chunk[j]
            j += 1
            if j == len(chunk):
                c, j = c + 1, 0
        end = start
    return None
