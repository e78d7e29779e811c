"""`benchmarks/sizes.py --quick --json` as CI runs it, as its own process: the
synthetic Gemma 3 1B (hack/build-engines.sh's `synth` part), llama-server
filled to its 4k context in a memory cgroup limited to what the operator
decided, Ollama loaded under its decision, both started cold and warm and
decoding. What it asserts holds on any machine: nothing was OOM-killed under
the decision and the OOM-relevant peak stayed under it (the decision's one
promise); the measure saw what it claims to (the file really cold, the KV and
compute llama.cpp accounts for inside the anonymous memory after load, the
slot's context filled); every start and decode column has a number. How far
above the peak the decision is, how long the loads took and how fast it
decoded are the benchmark's to print (docs/benchmarks.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.benchmarks.test_quick_modes import last_json, run_benchmark

pytestmark = pytest.mark.engine


def test_sizes_quick_holds_the_filled_peak_under_the_decision_and_times_both_engines(
    tmp_path: Path,
) -> None:
    report = last_json(run_benchmark(tmp_path, "sizes.py", "--quick", "--json",
                                     "--work", str(tmp_path / "work"), timeout=1800))
    assert report["quick"]
    memory = {r["engine"]: r for r in report["memory"]}
    assert set(memory) == {"llama-server", "ollama"}, report
    for engine, row in memory.items():
        assert "error" not in row, row
        assert row["oom_kills"] == 0, row
        assert row["cached_before"] < 0.05, row  # the weights were read from disk
        peak = row["peak"]["peak_oom_mib"]
        assert 0 < peak <= row["decided_mib"], (engine, row)
        acct = row["accounting"]
        assert acct.get("kv", 0) > 0 and acct.get("compute", 0) > 0, (engine, acct)
        # After load the anonymous memory holds the KV cache llama.cpp cleared.
        assert row["load"]["anon_mib"] >= acct["kv"], (engine, row)
    filled = memory["llama-server"]
    assert filled["filled_tokens"] >= filled["context"] - 16, filled
    assert filled["peak"]["peak_oom_mib"] >= filled["load"]["anon_mib"], filled
    starts = {r["engine"]: r for r in report["start"]}
    assert set(starts) == {"llama-server", "ollama"}, report
    for row in starts.values():
        assert row["cold_s"] > 0 and row["warm_s"] > 0 and row["disk_mb_s"] > 0, row
        assert row["cached_before_cold"] < 0.05, row
    for row in report["decode"]:
        assert row["measured"]["n"] >= 3 and row["measured"]["median"] > 0, row
        assert row["predicted"] > 0 and row["bandwidth_gb_s"] > 0, row
