"""The probe's memory-bandwidth measurement, its pure parts: the last-level cache read from
sysfs, the array sized past it within the probe's memory limit, when it runs, and the labels
it publishes (read back by the operator, hostile until checked)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from localmodel.facts.model import MemoryBandwidth
from localmodel.facts.node import (
    PROBE_BANDWIDTH_ALL,
    PROBE_BANDWIDTH_ONE,
    PROBE_BANDWIDTH_THREADS,
    bandwidth_from_labels,
    from_node,
)
from localmodel.probe.bandwidth import (
    MARGIN_BYTES,
    MAX_ARRAY_BYTES,
    REMEASURE_SECONDS,
    CacheEntry,
    LastLevelCache,
    array_size,
    busy_cpus,
    due,
    last_level_cache,
    memory_budget,
    parse_cache_size,
    read_cache_entries,
    read_cpu_times,
    read_own_memory,
)
from localmodel.probe.labels import bandwidth_labels
from localmodel.probe.memory import BandwidthProbe
from localmodel.probe.node import is_probe_label, kept_bandwidth, node_patch
from localmodel.probe.stream import Measured
from tests.builders import MakeNode
from tests.harness.clock import Clock

pytestmark = pytest.mark.unit

MIB = 1024 * 1024
GB = 1000**3


@pytest.mark.parametrize(("text", "size"), [
    ("32768K", 32 * MIB), ("1024K", MIB), ("32M", 32 * MIB), ("1G", 1024 * MIB),
    ("512", 512), (" 48K\n", 48 * 1024), ("", None), ("32 K", None), ("-1K", None),
    ("32T", None), ("9" * 13 + "K", None),
])
def test_a_sysfs_cache_size_reads_as_bytes_or_not_at_all(text: str, size: int | None) -> None:
    assert parse_cache_size(text) == size


def entry(cpu: int, level: int, kind: str, size: str, shared: str) -> CacheEntry:
    return CacheEntry(cpu, level, kind, size, shared)


def test_the_last_level_is_cpu0s_and_every_distinct_instance_counts_once() -> None:
    # Two core complexes of 4 CPUs, each with its own 32 MiB L3 (an AMD EPYC's shape).
    entries = [entry(c, 1, "Instruction", "32K", str(c)) for c in range(8)]
    entries += [entry(c, 2, "Unified", "1024K", str(c)) for c in range(8)]
    entries += [entry(c, 3, "Unified", "32768K", "0-3" if c < 4 else "4-7") for c in range(8)]
    assert last_level_cache(entries) == LastLevelCache(one=32 * MIB, total=64 * MIB)


def test_instruction_caches_are_never_the_last_level_and_no_size_is_no_cache() -> None:
    assert last_level_cache([entry(0, 1, "Data", "48K", "0"), entry(0, 2, "Instruction",
                                                                     "2048K", "0")]) \
        == LastLevelCache(48 * 1024, 48 * 1024)
    assert last_level_cache([entry(0, 3, "Unified", "lots", "0")]) is None
    assert last_level_cache([]) is None


def test_the_array_is_three_caches_or_none_with_the_limit_to_raise() -> None:
    llc = 32 * MIB
    assert array_size(llc, 200 * MIB).bytes == 96 * MIB
    assert array_size(llc, 96 * MIB).bytes == 96 * MIB
    refused = array_size(llc, 95 * MIB)
    assert refused.bytes is None
    assert "needs 96 MiB" in refused.why_not and "leaves 95 MiB" in refused.why_not
    assert "probe.resources.limits.memory" in refused.why_not


def test_the_budget_is_the_limit_less_what_is_used_and_a_margin() -> None:
    assert memory_budget(192 * MIB, 50 * MIB) == 142 * MIB - MARGIN_BYTES
    assert memory_budget(40 * MIB, 50 * MIB) == 0
    assert memory_budget(None, 50 * MIB) == MAX_ARRAY_BYTES


@pytest.mark.parametrize(("before", "after", "seconds", "busy"), [
    ((1000, 5000), (1050, 5200), 1.0, 0.5),  # 50 ticks of 100 per second: half a CPU
    ((1000, 5000), (1000, 5200), 1.0, 0.0),
    ((1000, 5000), (900, 5200), 1.0, None),  # a counter went back
    ((1000, 5000), (1050, 5200), 0.0, None),
])
def test_busy_cpus_from_two_reads_of_proc_stat(before: tuple[int, int], after: tuple[int, int],
                                               seconds: float, busy: float | None) -> None:
    assert busy_cpus(before, after, seconds) == busy


@pytest.mark.parametrize(("last", "now", "busy", "measure"), [
    (None, 0.0, 0.0, True),  # at start, quiet
    (None, 0.0, 1.5, False),  # at start, a model decoding
    (None, 0.0, None, False),  # quiet not known: not measured
    (0.0, REMEASURE_SECONDS - 1, 0.0, False),
    (0.0, REMEASURE_SECONDS, 0.1, True),
])
def test_measured_at_start_then_daily_and_only_on_a_quiet_node(
        last: float | None, now: float, busy: float | None, measure: bool) -> None:
    assert due(last, now, busy) is measure


def test_the_readers_read_sysfs_proc_stat_and_the_own_cgroup(tmp_path: Path) -> None:
    index = tmp_path / "sys/devices/system/cpu/cpu0/cache/index3"
    index.mkdir(parents=True)
    for name, text in (("level", "3\n"), ("type", "Unified\n"), ("size", "32768K\n"),
                       ("shared_cpu_list", "0-1\n")):
        (index / name).write_text(text)
    (tmp_path / "sys/devices/system/cpu/cpu0/cache/index9").mkdir()  # unreadable: left out
    assert read_cache_entries(tmp_path) == [CacheEntry(0, 3, "Unified", "32768K", "0-1")]
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/stat").write_text("cpu  10 0 5 100 7 0 3 0 0 0\ncpu0 1 0 0 1 0 0 0 0\n")
    assert read_cpu_times(tmp_path) == (18, 125)
    cgroup = tmp_path / "sys/fs/cgroup"
    cgroup.mkdir(parents=True)
    (cgroup / "memory.max").write_text("100663296\n")
    (cgroup / "memory.current").write_text("52428800\n")
    assert read_own_memory(tmp_path) == (96 * MIB, 50 * MIB)
    (cgroup / "memory.max").write_text("max\n")
    assert read_own_memory(tmp_path) == (None, 50 * MIB)


# ---- the labels, written and read back --------------------------------------------------


def node_with(labels: dict[str, str]) -> MakeNode:
    return MakeNode("n1").labels(labels)


def test_the_labels_read_back_as_the_bandwidth_measured() -> None:
    measured = MemoryBandwidth(9_800_400_000, 17_300_000_000, 2)
    labels = bandwidth_labels(measured)
    assert labels == {PROBE_BANDWIDTH_ONE: "9800", PROBE_BANDWIDTH_ALL: "17300",
                      PROBE_BANDWIDTH_THREADS: "2"}
    assert all(is_probe_label(key) for key in labels)
    facts = from_node(node_with(labels).manifest())
    assert facts.memory_bandwidth == MemoryBandwidth(9_800 * 10**6, 17_300 * 10**6, 2)
    assert bandwidth_labels(MemoryBandwidth(5 * GB)) == {PROBE_BANDWIDTH_ONE: "5000"}


@pytest.mark.parametrize(("labels", "bandwidth", "why"), [
    ({}, None, ""),
    ({PROBE_BANDWIDTH_ONE: "abc"}, None, "'abc' is not a whole number"),
    ({PROBE_BANDWIDTH_ONE: "0"}, None, "'0'"),
    ({PROBE_BANDWIDTH_ONE: "-5"}, None, "'-5'"),
    ({PROBE_BANDWIDTH_ONE: "١٢"}, None, "not a whole number"),  # digits, but not ASCII
    ({PROBE_BANDWIDTH_ONE: "99999999999"}, None, "not a whole number"),
    ({PROBE_BANDWIDTH_ALL: "9000", PROBE_BANDWIDTH_THREADS: "2"}, None, "missing"),
    ({PROBE_BANDWIDTH_ONE: "9000", PROBE_BANDWIDTH_ALL: "16000"},
     MemoryBandwidth(9 * GB), PROBE_BANDWIDTH_THREADS),
    ({PROBE_BANDWIDTH_ONE: "9000", PROBE_BANDWIDTH_ALL: "x", PROBE_BANDWIDTH_THREADS: "2"},
     MemoryBandwidth(9 * GB), PROBE_BANDWIDTH_ALL),
    ({PROBE_BANDWIDTH_ONE: "9000", PROBE_BANDWIDTH_ALL: "16000",
      PROBE_BANDWIDTH_THREADS: "5000"}, MemoryBandwidth(9 * GB), "4096"),
    ({PROBE_BANDWIDTH_ONE: "9000", PROBE_BANDWIDTH_ALL: "16000", PROBE_BANDWIDTH_THREADS: "2"},
     MemoryBandwidth(9 * GB, 16 * GB, 2), ""),
])
def test_a_malformed_bandwidth_label_is_ignored_with_its_reason(
        labels: dict[str, str], bandwidth: MemoryBandwidth | None, why: str) -> None:
    got, reason = bandwidth_from_labels(labels)
    assert got == bandwidth
    assert (why in reason) if why else reason == ""
    # ...and the node still reads, with everything else it says.
    assert from_node(node_with(labels).manifest()).memory_bandwidth == bandwidth


@given(st.dictionaries(st.sampled_from([PROBE_BANDWIDTH_ONE, PROBE_BANDWIDTH_ALL,
                                        PROBE_BANDWIDTH_THREADS]), st.text(max_size=80)))
def test_any_label_text_reads_as_a_bounded_bandwidth_or_none(labels: dict[str, str]) -> None:
    got, reason = bandwidth_from_labels(labels)
    assert len(reason) < 200
    if got is not None:
        assert 0 < got.one_thread <= 10**13
        assert got.all_threads is None or 0 < got.all_threads <= 10**13
        assert got.threads is None or 0 < got.threads <= 4096


LABELLED = {PROBE_BANDWIDTH_ONE: "9800", PROBE_BANDWIDTH_ALL: "17300",
            PROBE_BANDWIDTH_THREADS: "2"}


def test_a_measurement_within_ten_percent_keeps_the_labels_and_writes_nothing() -> None:
    near = MemoryBandwidth(10_200 * 10**6, 16_000 * 10**6, 2)
    kept = kept_bandwidth(LABELLED, near)
    assert kept is not None and bandwidth_labels(kept) == LABELLED
    assert node_patch({"labels": LABELLED}, bandwidth_labels(kept), {}) is None


def test_a_measurement_that_moved_or_has_other_threads_is_written() -> None:
    moved = MemoryBandwidth(12_000 * 10**6, 17_300 * 10**6, 2)
    assert kept_bandwidth(LABELLED, moved) == moved
    more_threads = MemoryBandwidth(9_800 * 10**6, 17_300 * 10**6, 4)
    assert kept_bandwidth(LABELLED, more_threads) == more_threads


def test_between_measurements_the_node_keeps_its_labels_and_junk_is_removed() -> None:
    assert kept_bandwidth(LABELLED, None) == MemoryBandwidth(9_800 * 10**6, 17_300 * 10**6, 2)
    junk = {PROBE_BANDWIDTH_ONE: "fast"}
    assert kept_bandwidth(junk, None) is None
    patch = node_patch({"labels": junk}, {}, {})
    assert patch == {"metadata": {"labels": {PROBE_BANDWIDTH_ONE: None}}}


# ---- when the probe measures (its loop's state, with fakes) ------------------------------


def probe_tree(tmp_path: Path, busy_ticks: int, limit: int) -> None:
    index = tmp_path / "sys/devices/system/cpu/cpu0/cache/index3"
    index.mkdir(parents=True, exist_ok=True)
    for name, text in (("level", "3"), ("type", "Unified"), ("size", "32768K"),
                       ("shared_cpu_list", "0-1")):
        (index / name).write_text(text)
    (tmp_path / "proc").mkdir(exist_ok=True)
    (tmp_path / "proc/stat").write_text(f"cpu  {busy_ticks} 0 0 1000 0 0 0 0 0 0\n")
    cgroup = tmp_path / "sys/fs/cgroup"
    cgroup.mkdir(parents=True, exist_ok=True)
    (cgroup / "memory.max").write_text(str(limit))
    (cgroup / "memory.current").write_text(str(50 * MIB))


def test_the_probe_measures_a_quiet_node_once_a_day_and_keeps_the_number(tmp_path: Path) -> None:
    probe_tree(tmp_path, 100, 256 * MIB)
    clock, log, sizes = Clock(0.0), io.StringIO(), []

    def fake(size: int, threads: int) -> Measured:
        sizes.append((size, threads))
        return Measured(threads, size, threads * 9e9, threads * 8e9, 0.1)

    probe = BandwidthProbe(tmp_path, tmp_path, log=log, clock=clock, sleep=clock.sleep,
                           measure=fake)
    first = probe()
    assert first is not None and first.one_thread == 9 * GB
    assert sizes[0] == (96 * MIB, 1)  # three times the 32 MiB cache
    assert "9.00 GB/s at 1 thread" in log.getvalue()
    measured = len(sizes)
    clock.now += 3600
    assert probe() is first and len(sizes) == measured  # not again within a day
    clock.now += REMEASURE_SECONDS
    assert probe() is not None and len(sizes) > measured


def test_a_busy_node_is_not_measured_and_says_why(tmp_path: Path) -> None:
    probe_tree(tmp_path, 100, 256 * MIB)
    clock, log = Clock(0.0), io.StringIO()

    def hog(_: float) -> None:  # a model decoding on both CPUs meanwhile
        clock.now += 1.0
        probe_tree(tmp_path, 300, 256 * MIB)

    def never(size: int, threads: int) -> Measured:
        raise AssertionError("measured a busy node")

    probe = BandwidthProbe(tmp_path, tmp_path, log=log, clock=clock, sleep=hog, measure=never)
    assert probe() is None
    assert "the node is busy (2.00 CPUs)" in log.getvalue()


def test_a_limit_too_small_for_the_cache_is_named_not_measured(tmp_path: Path) -> None:
    probe_tree(tmp_path, 100, 96 * MIB)  # 96 MiB less 50 used and a margin: under 96 MiB

    def never(size: int, threads: int) -> Measured:
        raise AssertionError("measured in cache")

    clock, log = Clock(0.0), io.StringIO()
    probe = BandwidthProbe(tmp_path, tmp_path, log=log, clock=clock, sleep=clock.sleep,
                           measure=never)
    assert probe() is None
    assert "raise probe.resources.limits.memory" in log.getvalue()


def test_a_measurement_that_fails_is_logged_and_the_probe_goes_on(tmp_path: Path) -> None:
    probe_tree(tmp_path, 100, 256 * MIB)

    def broken(size: int, threads: int) -> Measured:
        raise OSError("fork: resource temporarily unavailable")

    clock, log = Clock(0.0), io.StringIO()
    probe = BandwidthProbe(tmp_path, tmp_path, log=log, clock=clock, sleep=clock.sleep,
                           measure=broken)
    assert probe() is None
    assert "OSError: fork: resource temporarily unavailable" in log.getvalue()
