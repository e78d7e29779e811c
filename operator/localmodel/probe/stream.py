"""The node probe's memory-bandwidth measurement: a read-only stream over an array larger than the
last-level caches, one process per thread, timed by each process's own CPU time.

The kernel is ``bytes.find`` of a byte the array does not hold: CPython hands a one-byte
search to the C library's ``memchr`` (Objects/stringlib/fastsearch.h, ``find_char``),
a vectorised read of every byte that holds no lock a second reader would wait on, so
no compiler and no C helper ship in the image. docs/benchmarks.md ("Decode against the
memory-bandwidth ceiling") compares it with a C sum compiled here: the same bytes per
second within a few percent.

Threads are processes: the search holds the interpreter's lock, so each reader is a
forked child reading its own slice of one array (shared, never copied: the children
only read), all started together (a pipe they wait on) so their reads overlap. Each
pass is timed by the reader's CPU time (``CLOCK_THREAD_CPUTIME_ID``), not the wall
clock: a time slice the kernel gives to another task, or a CFS quota's throttling
(the probe runs at a 10m request; an admin may give it a limit), stops that clock
with the reader. A reader stalled on memory is running, so its CPU time is the time
the bytes took. The first pass (the page tables' and TLB's) is not counted; the
rate is the median pass's.

Readers' rates add up only while they read at once. Where they did not (the CPUs
busy with something else, so one reader ran while another waited), the sum of
CPU-timed rates is each alone's rate times the readers: too high. So more than one
reader's number is the lower of the CPU-timed and the wall-timed sums (a reader
waiting for its CPU reads nothing by the wall clock); one reader's is CPU-timed.
"""

from __future__ import annotations

import os
import statistics
import struct
import time
from dataclasses import dataclass

__all__ = ["Measured", "measure"]

_RECORD = struct.Struct("<qq")  # one pass: CPU and wall nanoseconds
NEEDLE = b"\x01"  # the array is zeros: memchr reads every byte and finds nothing


@dataclass(frozen=True)
class Measured:
    """One measurement: bytes per second read by ``threads`` readers together (CPU-timed, and
    by the wall clock for comparison; for more than one reader, no more than the
    wall-timed sum), over an array of ``array_bytes``."""

    threads: int
    array_bytes: int
    bytes_per_second: float
    wall_bytes_per_second: float
    seconds: float  # the whole measurement, allocation included, by the wall clock


def measure(array_bytes: int, threads: int = 1, passes: int = 5) -> Measured:
    """Read an array of ``array_bytes`` zeros ``passes`` + 1 times with ``threads`` readers.

    The array is written once (``b"\\0" * n`` is a memset, so every page is real and none
    is the kernel's shared zero page, which would read from cache) and freed on return.
    """
    if threads < 1 or passes < 1 or array_bytes < threads * 4096:
        raise ValueError("measure needs a thread, a pass and a page per thread")
    started = time.perf_counter()
    array = b"\0" * array_bytes
    part = array_bytes // threads
    go_read, go_write = os.pipe()
    readers = []
    for index in range(threads):
        out_read, out_write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the reader: wait for the start, read, report, leave
            os.close(out_read)
            os.close(go_write)
            code = 1
            try:
                os.read(go_read, 1)
                records = _passes(array, index * part, (index + 1) * part, passes)
                os.write(out_write, b"".join(_RECORD.pack(*r) for r in records))
                code = 0
            finally:
                os._exit(code)
        os.close(out_write)
        readers.append((pid, out_read))
    os.close(go_read)
    os.write(go_write, b"g" * threads)
    os.close(go_write)
    rates: list[tuple[float, float]] = []
    try:
        for _, out_read in readers:
            rates.append(_rates(_read_all(out_read, _RECORD.size * (passes + 1)), part))
    finally:  # every reader is waited for, whatever one of them did
        for pid, out_read in readers:
            os.close(out_read)
            os.waitpid(pid, 0)
    del array
    cpu, wall = sum(r[0] for r in rates), sum(r[1] for r in rates)
    return Measured(threads, part * threads, cpu if threads == 1 else min(cpu, wall), wall,
                    time.perf_counter() - started)


def _passes(array: bytes, start: int, end: int, passes: int) -> list[tuple[int, int]]:
    records = []
    for _ in range(passes + 1):
        cpu, wall = time.thread_time_ns(), time.perf_counter_ns()
        if array.find(NEEDLE, start, end) != -1:
            raise AssertionError("the array holds the needle")
        records.append((time.thread_time_ns() - cpu, time.perf_counter_ns() - wall))
    return records


def _read_all(fd: int, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            raise OSError("a bandwidth reader ended without its numbers")
        data += chunk
    return data


def _rates(data: bytes, part: int) -> tuple[float, float]:
    """(CPU-timed, wall-timed) bytes per second of one reader's median pass, the first left
    out."""
    records = [_RECORD.unpack_from(data, offset)
               for offset in range(_RECORD.size, len(data), _RECORD.size)]
    cpu = statistics.median(max(r[0], 1) for r in records)
    wall = statistics.median(max(r[1], 1) for r in records)
    return part / cpu * 1e9, part / wall * 1e9
