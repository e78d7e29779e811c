"""Every benchmark's quick mode runs in CI, so a benchmark cannot rot unseen
(planner.py's second table once crashed for weeks: nothing ran it). Each runs
as its own process, as a person would run it; the assertions are about what it
reports, never about how fast anything was (the full modes measure that, with
their numbers in docs/benchmarks.md). planner.py's and idle.py's run here; the
others' where their parts are: gateway.py and threads.py in
tests/benchmarks/test_benchmarks_quick.py, converge.py in
tests/e2e/test_converge_quick.py, pods.py in tests/realnode. A new benchmark
without a quick mode that some test runs fails here."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from tests.harness.processes import ManagedProcess

ROOT = Path(__file__).resolve().parents[2]


def run_benchmark(tmp_path: Path, *argv: str, timeout: float) -> str:
    """Run benchmarks/<argv>, wait for it, fail with its output unless it exits 0."""
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join([str(ROOT / "operator"), str(ROOT),
                                          os.environ.get("PYTHONPATH", "")])}
    proc = ManagedProcess(argv[0], [sys.executable, str(ROOT / "benchmarks" / argv[0]),
                                    *argv[1:]], tmp_path / f"{argv[0]}.log", env=env, cwd=ROOT)
    proc.start()
    try:
        code = proc.wait(timeout)
    finally:
        proc.stop()
    out = proc.log_text()
    assert code == 0, f"benchmarks/{' '.join(argv)} exited {code}:\n{out[-4000:]}"
    return out


def last_json(out: str) -> dict[str, Any]:
    value = json.loads(out.strip().splitlines()[-1])
    assert isinstance(value, dict)
    return value


def test_planner_quick_mode_reports_the_full_and_the_incremental_passes(tmp_path: Path) -> None:
    report = last_json(run_benchmark(tmp_path, "planner.py", "--quick", "--json", timeout=600))
    assert report["quick"] and report["sizes"] == [200, 400, 800]
    for key in ("full_pass_s", "per_model_vs_first", "model_edit_pass_s", "node_label_pass_s"):
        assert report[key] > 0, key
    # A node's label change re-keeps that node only; the incremental passes were
    # checked equal to a fresh full pass inside the run (it exits non-zero if not).
    assert [row["nodes_rekept"] for row in report["passes"]] == [1, 1, 1]
    op = report["operator"]
    assert op["watched_nodes"] == 800 and op["watched_localmodels"] == 400
    assert op["steady_writes"] == 0  # the stored objects are what it wants: nothing to write


def test_idle_quick_mode_serves_what_static_placement_refuses_and_evicts_no_busy_model(
    tmp_path: Path,
) -> None:
    """The simulation drives the real idle core and planner over one trace in
    both modes (it exits non-zero on a busy eviction, too)."""
    report = last_json(run_benchmark(tmp_path, "idle.py", "--quick", "--json", timeout=300))
    assert report["quick"] and (report["models"], report["nodes"], report["seconds"]) == (6, 3, 600)
    static, idle = report["static"], report["idle"]
    assert static["requests"] == idle["requests"] > 0  # the same trace
    for mode in (static, idle):
        assert mode["busy_evictions"] == 0
        assert mode["served"] + mode["refused"] == mode["requests"]
    assert idle["refused"] == idle["expired"] + idle["full"]  # refused only past a hold
    # Static: N - M models Unplaced, their requests refused; nothing sleeps or wakes.
    assert static["refused"] > 0 and static["wakes"] == static["yields"] == 0 == static["held"]
    # Idle: models sleep, wake for held requests, and give their nodes to each other.
    assert idle["wakes"] > 0 and idle["yields"] > 0 and idle["held"] > 0
    assert idle["wakes"] == idle["wakes_home"] + idle["wakes_elsewhere"]
    assert idle["served"] > static["served"]


def test_every_benchmark_has_a_quick_mode_that_a_test_runs() -> None:
    tests = [p.read_text() for p in (ROOT / "tests").rglob("test_*.py")]
    # A benchmark is a script (benchmarks/verdict.py, the helpers they share, is not).
    scripts = [p for p in sorted((ROOT / "benchmarks").glob("*.py"))
               if 'if __name__ == "__main__":' in p.read_text()]
    assert len(scripts) >= 8, scripts
    for bench in scripts:
        assert "--quick" in bench.read_text(), f"benchmarks/{bench.name} has no --quick mode"
        assert any(bench.name in t and "--quick" in t for t in tests), (
            f"no test runs benchmarks/{bench.name} --quick"
        )
