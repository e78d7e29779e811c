"""`benchmarks/converge.py --quick` as CI runs it: 20 exclusive models on 20
kwok nodes on a control plane of its own, the operator as the chart's
identity. What it asserts holds on any machine: every model became Ready, and
in the idle window after (no traffic) the operator read no gateway's speed;
one round of reads against a real gateway answered every one. The times are
the benchmark's to print (docs/benchmarks.md)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def converge() -> ModuleType:
    spec = importlib.util.spec_from_file_location("converge", ROOT / "benchmarks" / "converge.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["converge"] = module
    spec.loader.exec_module(module)
    return module


def test_converge_quick_all_ready_and_no_speed_reads_while_idle() -> None:
    bench = converge()
    row = bench.run_size(20, 300.0, idle=10.0)
    print(row)
    assert row["ready"] == 20, row
    assert row["client_rates"] == "large", row  # sized like a real large cluster
    assert row["speed_reads_idle"] == 0, row
    # At most the one readiness read per replica while converging.
    assert row["speed_reads_to_ready"] <= 20, row
    cost = bench.read_cost(20)
    assert cost["reads"] == 20 and cost["bytes"] > 20 * 200, cost
