"""`benchmarks/idle.py --kwok --quick --json` as CI runs it, as its own
process: N=4 models on M=2 kwok nodes a side on a control plane of its own,
the real operator and router, stand-in gateways (benchmarks/idle_kwok.py),
one synthetic trace sent to static placement and to idle models in the same
run. What it asserts holds on any machine: both sides got the same
requests and answered each (served or refused); no busy model was ever
evicted; static placement never wakes or yields and refuses the requests of
the models it could not place; the idle side woke models for held requests
and served what static placement refused. The times (held p50/p99) are the
benchmark's to print (docs/benchmarks.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.benchmarks.test_quick_modes import last_json, run_benchmark

pytestmark = pytest.mark.e2e


def test_idle_kwok_quick_serves_what_static_placement_refuses_and_evicts_no_busy_model(
    tmp_path: Path,
) -> None:
    report = last_json(run_benchmark(tmp_path, "idle.py", "--kwok", "--quick", "--json",
                                     timeout=900))
    assert report["quick"] and report["kwok"] and (report["models"], report["nodes"]) == (4, 2)
    static, idle = report["static"], report["idle"]
    assert static["requests"] == idle["requests"] > 0, report  # the same trace
    for side in (static, idle):
        assert side["busy_evictions"] == 0, report
        assert side["served"] + side["refused"] == side["requests"], report
    # Static: the models it could not place never serve; nothing sleeps, wakes or yields.
    assert static["refused"] > 0, static
    assert static["wakes"] == static["yields"] == static["held"] == 0, static
    # Idle: held requests woke models, which served more than static placement did.
    assert idle["wakes"] > 0 and idle["held"] > 0, idle
    assert idle["wakes_home"] + idle["wakes_elsewhere"] <= idle["wakes"], idle
    assert idle["served"] > static["served"], report
