"""The gateway's CPU limit, sized from benchmarks/gateway_sizing.py: the rule
(render/names.py, gateway_cpu_milli) against what the benchmark measured, and
the rendered container and the planner's demand carrying it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from localmodel.desired import demand
from localmodel.render.names import GATEWAY_CPU_MILLI, TOP_TOKENS_PER_SECOND, gateway_cpu_milli
from tests.builders import MakeLocalModel, MakeNode
from tests.render.test_render import containers, objects

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("slots", "share_long", "share_short"),
    [
        # benchmarks/gateway_sizing.py --rate 36 (docs/benchmarks.md, "The
        # gateway's CPU at a pod's top speed"): the gateway's share of a core
        # with every slot streaming 64-token and 4-token answers at 36 tok/s,
        # three runs.
        (1, 0.013, 0.028),
        (4, 0.034, 0.078),
        (8, 0.049, 0.129),
        (16, 0.102, 0.192),
        (1, 0.015, 0.034),
        (4, 0.044, 0.086),
        (8, 0.058, 0.163),
        (16, 0.096, 0.216),
        (1, 0.017, 0.033),
        (4, 0.039, 0.086),
        (8, 0.063, 0.141),
        (16, 0.113, 0.171),
    ],
)
def test_the_limit_is_at_least_twice_what_the_benchmark_measured(
    slots: int, share_long: float, share_short: float
) -> None:
    assert gateway_cpu_milli(slots) >= 2 * 1000 * max(share_long, share_short)


@pytest.mark.parametrize(
    ("slots", "rate", "milli"),
    [(1, TOP_TOKENS_PER_SECOND, 250), (4, TOP_TOKENS_PER_SECOND, 250),
     (5, TOP_TOKENS_PER_SECOND, 261), (8, TOP_TOKENS_PER_SECOND, 418),
     (16, TOP_TOKENS_PER_SECOND, 836), (64, TOP_TOKENS_PER_SECOND, 3341),
     # The run: 8 streams of 250 tok/s.
     (8, 250.0, 2900)],
)
def test_few_slots_keep_250m_and_many_get_more(slots: int, rate: float, milli: int) -> None:
    assert gateway_cpu_milli(slots, rate) == milli


@pytest.mark.parametrize(("slots", "rate"), [(0, 36.0), (1, 0.0), (1, -1.0)])
def test_no_slots_or_no_speed_is_refused(slots: int, rate: float) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        gateway_cpu_milli(slots, rate)


@given(st.integers(1, 64), st.integers(0, 64), st.floats(0.1, 1000), st.floats(0, 1000))
def test_more_slots_or_speed_never_get_less_cpu(slots: int, more: int, rate: float,
                                                faster: float) -> None:
    limit = gateway_cpu_milli(slots, rate)
    assert limit >= GATEWAY_CPU_MILLI
    assert gateway_cpu_milli(slots + more, rate) >= limit
    assert gateway_cpu_milli(slots, rate + faster) >= limit


def test_the_rendered_gateway_and_the_planners_demand_carry_the_limit() -> None:
    many = MakeLocalModel("qwen3").spec(slots=16).obj()
    usual = MakeLocalModel("qwen3").obj()
    node = [MakeNode("n1").cpus(16).memory_gib(128).facts()]
    for lm, milli in ((many, 836), (usual, 250)):
        pod = next(o for o in objects(lm, node).values() if o["kind"] == "Pod")
        gateway = containers(pod)["gateway"]["resources"]
        assert gateway["limits"]["cpu"] == f"{milli}m"
        assert gateway["requests"]["cpu"] == gateway["limits"]["cpu"]
        assert demand(lm).overhead_cpu_milli == milli
    off = MakeLocalModel("qwen3").spec(slots=16, gateway={"enabled": False}).obj()
    assert demand(off).overhead_cpu_milli == 0
