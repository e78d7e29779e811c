"""The probe's bandwidth measurement run for real, on small arrays: readers are forked, each
reads its part, and the numbers come back finite and positive (what they are worth is
docs/benchmarks.md's, never a test's)."""

from __future__ import annotations

import math

import pytest

from localmodel.probe.stream import measure

MIB = 1024 * 1024


@pytest.mark.parametrize("threads", [1, 2])
def test_the_measurement_reads_every_part_and_reports_a_rate(threads: int) -> None:
    got = measure(4 * MIB + 3, threads, passes=2)
    assert got.threads == threads
    assert got.array_bytes == (4 * MIB + 3) // threads * threads  # each reader's part, whole
    for rate in (got.bytes_per_second, got.wall_bytes_per_second):
        assert math.isfinite(rate) and rate > 0
    assert got.seconds > 0
    if threads > 1:  # readers that did not read at once never add up past the wall clock
        assert got.bytes_per_second <= got.wall_bytes_per_second


def test_a_measurement_without_a_reader_a_pass_or_a_page_is_refused() -> None:
    for size, threads, passes in ((4 * MIB, 0, 1), (4 * MIB, 1, 0), (4096, 2, 1)):
        with pytest.raises(ValueError, match="a thread, a pass and a page"):
            measure(size, threads, passes)
