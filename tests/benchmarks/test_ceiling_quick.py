"""The ceiling's benchmarks' quick modes, as CI runs them: `benchmarks/bandwidth.py --quick`
(the probe's measurement beside the C reference, at 3 x the cache, one thread) and
`benchmarks/ceiling.py --quick` (llama-server decoding the smallest synthetic shape, one
point, against the prediction). What is asserted holds on any machine: every number the
benchmark promises is there and positive; what they are worth is docs/benchmarks.md's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.benchmarks.test_quick_modes import run_benchmark


def test_bandwidth_quick_mode_reports_the_probe_beside_the_c_reference(tmp_path: Path) -> None:
    out = run_benchmark(tmp_path, "bandwidth.py", "--quick", timeout=300)
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    cost = [r for r in rows if r.get("cost")]
    [point] = [r for r in rows if not r.get("cost")]
    assert [c["threads"] for c in cost] == [1] and cost[0]["cpu_seconds"] > 0
    assert point["threads"] == 1 and point["llc_multiple"] == 3
    columns = ["probe_cpu", "probe_wall"] + (["c_sum", "c_memchr"] if shutil.which("gcc") else [])
    for column in columns:
        assert point[column]["median"] > 0, point


@pytest.mark.llama
def test_ceiling_quick_mode_reports_decode_against_the_prediction(tmp_path: Path) -> None:
    out_file = tmp_path / "ceiling.jsonl"
    out = run_benchmark(tmp_path, "ceiling.py", "--quick", "--out", str(out_file), timeout=600)
    [row] = [json.loads(line) for line in out_file.read_text().splitlines()]
    assert (row["shape"], row["threads"], row["decoded"]) == ("gemma3-1b", 1, 8)
    for key in ("bandwidth", "decode", "predicted", "ratio"):
        assert row[key] > 0, row
    assert row["describe"].startswith("predicted: ") and "median ratio" in out
