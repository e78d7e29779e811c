"""`benchmarks/converge.py --quick --json` as CI runs it, as its own process:
20 exclusive models on 20 kwok nodes on a control plane of its own, the
operator as the chart's identity, then the cost of a round of speed reads and
the operator's memory and its pass at 800 nodes. What it asserts holds on any machine:
every model became Ready, the operator made every pod, in the idle window
after (no traffic) it read no gateway's speed, its reads are reported by
result, one round of reads against a real gateway answered every one and one
against silent gateways timed out every one. The times are the benchmark's
to print (docs/benchmarks.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from localmodel.controller.speed import READ_TIMEOUT, RESULTS
from tests.benchmarks.test_quick_modes import last_json, run_benchmark

pytestmark = pytest.mark.e2e


def test_converge_quick_all_ready_and_no_speed_reads_while_idle(tmp_path: Path) -> None:
    report = last_json(run_benchmark(tmp_path, "converge.py", "--quick", "--json",
                                     timeout=900))
    assert report["quick"]
    [row] = report["rows"]
    assert row["ready"] == 20 and row["n"] == 20, row
    assert row["client_rates"] == "large", row  # sized like a real large cluster
    assert row["all_pods_created_s"] > 0 and row["operator_cpu_to_ready_s"] > 0, row
    assert row["writes_per_model"] > 0, row
    # At most the one readiness read per replica while converging, none idle.
    assert 0 < row["speed_reads_to_ready"] <= 20, row
    assert set(row["speed_reads_to_ready_by_result"]) <= set(RESULTS), row
    assert sum(row["speed_reads_to_ready_by_result"].values()) == row["speed_reads_to_ready"]
    assert row["speed_reads_idle"] == 0 and row["speed_reads_idle_by_result"] == {}, row
    assert row["pod_ip_answer"], row
    cost = report["read_cost"]
    assert cost["reads"] == 20 and cost["bytes"] > 20 * 200, cost
    silent = report["silent_read_cost"]
    assert silent["by_result"] == {READ_TIMEOUT: 20}, silent
    memory = report["memory"]
    assert memory["counts"]["nodes"] == 800 and memory["counts"]["localmodels"] == 400, memory
    assert memory["watches_mib"] > 0, memory
    assert memory["peak_rss_mib"] >= memory["after_cold_pass_rss_mib"], memory
    assert memory["steady_writes"] == 0, memory  # what is stored is what it wants
    # The reconciler's own pass on the same objects: once its status writes
    # show in the watches' indexes, quiet passes write nothing (their CPU is
    # the benchmark's to report).
    passes = report["operator_pass"]
    assert passes["models"] == 400 and passes["cold_writes"] > 0, passes
    assert passes["settle_passes"][-1][1] == 0, passes
    assert passes["quiet_writes"] == 0 and len(passes["quiet_pass_cpu_ms"]) == 5, passes
