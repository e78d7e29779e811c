"""The benchmarks' quick modes, as CI runs them, so none can rot unseen.

`benchmarks/gateway.py --quick` (the stand-in upstream, the gateway, nginx as
the plain-proxy reference), `benchmarks/gateway_sizing.py --quick` (the
gateway's CPU with every slot streaming at the engine's top speed, the
stand-in upstream), `benchmarks/threads.py --quick` (the real
llama-server under a 1-CPU cgroup quota), `benchmarks/prompt_cache.py
--quick` (both real engines as rendered, bounded and at their default) and
`benchmarks/start.py --quick` (both real engines' load of the test model, cold
and warm). What
is asserted holds on any machine: every column and summary the benchmark promises is printed, with
numbers in it. The numbers themselves are the benchmarks' to print
(docs/benchmarks.md), never a test's to judge; `benchmarks/converge.py`,
`benchmarks/planner.py` and `benchmarks/pods.py` have tests of their own.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load(name: str) -> ModuleType:
    path = ROOT / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def run_main(name: str, argv: list[str], monkeypatch: pytest.MonkeyPatch,
             capsys: pytest.CaptureFixture[str]) -> str:
    module = load(name)
    monkeypatch.setattr(sys, "argv", [f"{name}.py", *argv])
    # gateway.py pins its own process (here: pytest's) to a CPU to keep the
    # proxy under test alone on another; every later test must see all CPUs.
    cpus = os.sched_getaffinity(0)
    try:
        rc = module.main()
    finally:
        os.sched_setaffinity(0, cpus)
    out = capsys.readouterr().out
    assert rc in (0, None), out
    return out


def test_gateway_benchmark_quick_prints_every_target_and_the_ab_summaries(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert shutil.which("nginx"), "nginx is missing: .ci/run installs nginx-light"
    cpus = os.sched_getaffinity(0)
    out = run_main("gateway", ["--quick"], monkeypatch, capsys)
    print(out)
    assert os.sched_getaffinity(0) == cpus, "the benchmark left pytest pinned"
    header = next(line for line in out.splitlines() if "direct" in line and "gateway" in line)
    for target in ("direct", "gateway", "nginx", "gw-plain", "gw-noledg", "router"):
        assert target in header, header
    assert re.search(r"^tokens/s\s+\d+", out, re.M), out
    ab = r"ledger on \(gw-plain\) vs off \(gw-noledger\), at 8: CPU per request [+-]\d+ us"
    assert re.search(ab, out), out
    assert "overflow: configured, 0 overflowed requests" in out, out
    router = r"router vs nginx, at 8: added p99 ttft [+-]\d+\.\d+ ms, added p99 per token "
    assert re.search(router, out), out
    assert re.search(r"ledger memory: \d+ bytes per record", out), out


def test_gateway_sizing_quick_reports_the_cpu_per_token_and_request_and_the_rule(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from localmodel.render.names import TOP_TOKENS_PER_SECOND, gateway_cpu_milli

    out = run_main("gateway_sizing", ["--quick", "--json"], monkeypatch, capsys)
    print(out)
    report = json.loads(out.strip().splitlines()[-1])
    assert report["rate"] == TOP_TOKENS_PER_SECOND  # the rule's own top speed by default
    [row] = report["slots"]
    assert row["slots"] == 4
    assert row["tokens_per_second"] > 0 and row["cpu_share_long"] > 0, row
    assert row["cpu_share_short"] > 0, row
    assert row["limit_milli"] == gateway_cpu_milli(4), row
    assert re.search(r"^\s+4\s+\d+\s+[\d.]+%\s+[\d.]+%", out, re.M), out
    assert "load average before" in out and "load average after" in out, out


@pytest.mark.engine  # llama-bench, Ollama and the model
def test_threads_benchmark_quick_prints_the_operator_against_the_sweep(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    out = run_main("threads", ["--quick", "--json"], monkeypatch, capsys)
    print(out)
    summary = json.loads(out.strip().splitlines()[-1])
    for key in ("operator_vs_best_decode", "operator_vs_default_decode"):
        assert isinstance(summary[key], float) and summary[key] > 0, summary
    assert summary["budgets"] and summary["budgets"][0]["points"], summary
    # Interleaved rounds (benchmarks/verdict.py): one decode median per round,
    # and a verdict against the other thread counts only.
    points = summary["budgets"][0]["points"]
    assert len(points["operator"]["decode_tps"]) == 2, points
    assert "sweep1" not in points  # the operator's own count: the same command
    assert summary["verdict"] in ("operator/best >= 0.95", "inside the spread", "below")
    assert summary["best_decode_threads"] != summary["operator_threads"], summary
    assert re.search(r"operator / best of the other thread counts \(.+\) decode "
                     r"\d+\.\d+: .+ \[\d+\.\d+-\d+\.\d+, 2 rounds", out), out


@pytest.mark.engine  # llama-server, Ollama and the model
def test_prompt_cache_benchmark_quick_reports_rss_per_prompt_for_both_engines(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        tmp_path: Path) -> None:
    # Its work directory (each engine's copy of the model) goes where Python's
    # temporary files go, and is gone after: every CI run left ~0.5 GB in /tmp.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    out = run_main("prompt_cache", ["--quick", "--json"], monkeypatch, capsys)
    print(out)
    assert not list(tmp_path.iterdir()), sorted(tmp_path.iterdir())
    report = json.loads(out.strip().splitlines()[-1])
    runs = {(r["engine"], r["run"]): r for r in report["runs"]}
    assert set(runs) == {(e, r) for e in ("llama-server", "ollama")
                         for r in ("bounded", "default")}
    for r in runs.values():
        assert [p["prompt"] for p in r["points"]] == list(range(1, report["prompts"] + 1))
        assert all(p["rss_mib"] > 0 for p in r["points"]), r
    # The quick bound (8Mi) holds about two of its prompts' states: crossed.
    assert runs[("llama-server", "bounded")]["evictions"] > 0
    assert runs[("llama-server", "default")]["evictions"] == 0
    assert re.search(r"^\| prompt \| llama-server/bounded \|", out, re.M), out


@pytest.mark.engine  # llama-server, Ollama and the model
def test_start_benchmark_quick_reports_cold_and_warm_loads_of_both_engines_and_the_read(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`benchmarks/start.py --quick`: the test model (a copy: its drop touches no
    file another test reads) loaded cold and warm by each engine, its read speed."""
    out = run_main("start", ["--quick"], monkeypatch, capsys)
    print(out)
    report = json.loads(out.strip().splitlines()[-1])
    loads = {(r["kind"], r.get("cache")): r for r in report["records"]}
    assert {("llama-server", "cold"), ("llama-server", "warm"), ("ollama", "cold"),
            ("ollama", "warm"), ("read", None)} <= set(loads)
    assert all(r["seconds"] > 0 for r in report["records"]), report
    # Warm was read through just before, cold dropped: the page cache says which.
    assert loads[("llama-server", "warm")]["cached_before"] > 0.9
    assert loads[("llama-server", "cold")]["cached_before"] < 0.1
    assert re.search(r"^\| gemma3-270m \| 0\.\d+ \| .+ \| ollama \|", out, re.M), out


@pytest.mark.engine
@pytest.mark.llama  # two llama-servers and the model; the gateways and the router in-process
def test_router_benchmark_quick_prints_the_three_routings_side_by_side(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`benchmarks/router.py --quick`: random, router and pinned side by side."""
    out = run_main("router", ["--quick", "--json"], monkeypatch, capsys)
    print(out)
    assert any(line.split() == ["random", "router", "pinned"] for line in out.splitlines()), out
    for row in ("ttft p50 s", "ttft p99 s", "re-read prefill s", "turns per minute"):
        assert re.search(rf"^{row}\s+[\d.]+\s+[\d.]+\s+[\d.]+$", out, re.M), row
    assert re.search(r"router p50 time to first token / pinned: [\d.]+x", out), out
    assert re.search(r"re-read seconds, random / router: [\d.]+x", out), out
    summary = json.loads(out.strip().splitlines()[-1])
    for mode in ("random", "router", "pinned"):
        assert summary[f"{mode}_turns"] == 6, summary  # 2 sessions x 3 turns, all completed
