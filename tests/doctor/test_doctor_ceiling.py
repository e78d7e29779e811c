"""doctor on a slow replica: the node's memory, last (doctor/speed.py `_memory`): the bandwidth
its probe measured and whether the replica was judged against its ceiling, or why the operator
has no ceiling for it."""

from __future__ import annotations

from typing import Any

import pytest

from localmodel.doctor.report import Verdict
from localmodel.doctor.speed import slow_findings
from localmodel.facts.node import (
    PROBE_BANDWIDTH_ALL,
    PROBE_BANDWIDTH_ONE,
    PROBE_BANDWIDTH_THREADS,
    from_node,
)
from tests.builders import MakeNode
from tests.doctor.test_doctor_speed import ONE_THREAD, QUIET, pod

pytestmark = pytest.mark.unit

MEASURED = {PROBE_BANDWIDTH_ONE: "9000", PROBE_BANDWIDTH_ALL: "16000",
            PROBE_BANDWIDTH_THREADS: "2"}
BY_CEILING = ("0.5 of the ceiling; ceiling 2.1 tok/s (predicted: 9 GB/s / 4.3 GB per token "
              "at 4096 tokens of context)")


def slow(source: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "ai", "name": "chat"}, "status": {"placements": [{
        "replica": 0, "node": "n0", "pod": "chat-0", "threads": 1, "cpu": 1,
        "speed": {"slow": True, "recentDecode": 0.4, "expectedDecode": 1.05,
                  "expectedSource": source, "calibrationDecode": 0.7}}]}}


def memory_finding(labels: dict[str, str], source: str) -> Any:
    node = from_node(MakeNode("n0").cpus(2).memory_gib(8).labels(labels).manifest())
    findings = slow_findings([slow(source)], [pod("chat-0")], {"n0": node}, ONE_THREAD, QUIET)
    return findings[-1]


def test_a_replica_judged_against_its_ceiling_is_told_the_nodes_bandwidth() -> None:
    last = memory_finding(MEASURED, BY_CEILING)
    assert last.verdict is Verdict.FAIL
    for words in ("node n0's memory reads 9 GB/s at 1 thread, 16 GB/s at 2 threads",
                  "expected 0.5 of the ceiling", "something other than reading its weights"):
        assert words in last.message, last.message


def test_a_replica_judged_by_its_peers_hears_the_bandwidth_as_a_warning() -> None:
    last = memory_finding(MEASURED, "median calibration of 3 peer replicas; ceiling 2.1 tok/s")
    assert last.verdict is Verdict.WARN and "9 GB/s at 1 thread" in last.message


def test_an_ignored_label_is_named_with_its_reason() -> None:
    last = memory_finding({PROBE_BANDWIDTH_ONE: "lots"}, "own calibration")
    assert last.verdict is Verdict.WARN
    assert "label was ignored" in last.message and "'lots' is not a whole number" in last.message


def test_an_unmeasured_node_says_when_the_probe_measures() -> None:
    last = memory_finding({}, "own calibration")
    assert "was not measured" in last.message and "quiet node" in last.message
