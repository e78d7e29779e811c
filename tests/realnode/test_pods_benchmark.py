"""`benchmarks/pods.py --quick` as CI runs it, on the journey's real node: the
operator's rendered pod against the engine's default, 8 threads and a sweep,
each a real pod under the same kubelet-set CPU limit, side by side in one run.
What it asserts is what no noise on a shared machine can turn around: every
point was measured, and 8 threads on one CPU collapse decode (the field
report). The operator / best-of-sweep ratio is the benchmark's to print
(docs/benchmarks.md), not a timed assertion."""

from __future__ import annotations

import pytest

from benchmarks.pods import QUICK, run_points
from tests.realnode.journey import Journey

pytestmark = [pytest.mark.e2e, pytest.mark.realnode]


def test_pods_benchmark_quick_mode_measures_every_point_and_the_collapse(
    journey: Journey,
) -> None:
    out = run_points(journey.cluster, journey.models, QUICK)
    journey.timings.add("pods.py --quick", out["seconds"])
    labels = [p["label"] for p in out["points"]]
    assert labels == ["operator (rules)", "engine default", "8 threads", "sweep 1", "sweep 2"]
    assert all(p["decode"] > 0 and p["prefill"] > 0 for p in out["points"]), out
    assert out["operator_threads"] == 1  # the rules' choice for cpu: 1
    assert out["operator_vs_8_decode"] > 3, out
