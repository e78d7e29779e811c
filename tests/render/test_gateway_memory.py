"""The gateway's memory limit, sized from benchmarks/gateway_hostile.py: the
rule (render/names.py, gateway_memory_bytes) against what the benchmark
measured, and the rendered container and the planner's demand carrying it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from localmodel.desired import demand
from localmodel.facts.quantity import parse_bytes
from localmodel.render.names import GATEWAY_MEMORY_BYTES, gateway_memory_bytes
from tests.builders import MakeLocalModel, MakeNode
from tests.render.test_render import containers, objects

pytestmark = pytest.mark.unit

MiB = 1024**2


@pytest.mark.parametrize(
    ("slots", "max_queue", "measured_mib"),
    [
        # benchmarks/gateway_hostile.py at the 1 MiB default body limit
        # (docs/benchmarks.md, Hostile bodies), 20 s: every kind mixed, and
        # valid bodies only filling the queue (--kinds queued).
        (1, 16, 103.8),
        (1, 64, 212.8),
        (1, 16, 78.2),
        (1, 64, 179.7),
    ],
)
def test_the_limit_holds_what_the_benchmark_measured_with_room(
    slots: int, max_queue: int, measured_mib: float
) -> None:
    assert gateway_memory_bytes(slots, max_queue) >= 1.4 * measured_mib * MiB


@pytest.mark.parametrize(
    ("slots", "max_queue", "mib"), [(1, 16, 256), (2, 16, 256), (1, 0, 256), (1, 64, 361)]
)
def test_the_default_settings_keep_256_mib_and_a_deep_queue_gets_more(
    slots: int, max_queue: int, mib: int
) -> None:
    assert gateway_memory_bytes(slots, max_queue) == mib * MiB


@given(st.integers(1, 64), st.integers(0, 10000), st.integers(0, 100))
def test_more_places_never_get_less_memory(slots: int, max_queue: int, more: int) -> None:
    limit = gateway_memory_bytes(slots, max_queue)
    assert limit >= GATEWAY_MEMORY_BYTES and limit % MiB == 0
    assert gateway_memory_bytes(slots, max_queue + more) >= limit


def test_the_rendered_gateway_and_the_planners_demand_carry_the_limit() -> None:
    deep = MakeLocalModel("qwen3").spec(gateway={"maxQueue": 64}).obj()
    usual = MakeLocalModel("qwen3").obj()
    node = [MakeNode("n1").cpus(8).memory_gib(64).facts()]
    for lm, mib in ((deep, 361), (usual, 256)):
        pod = next(o for o in objects(lm, node).values() if o["kind"] == "Pod")
        gateway = containers(pod)["gateway"]["resources"]
        assert parse_bytes(gateway["limits"]["memory"]) == mib * MiB
        assert gateway["requests"]["memory"] == gateway["limits"]["memory"]
    # The planner fits the deeper gateway's memory too.
    assert demand(deep).memory_bytes - demand(usual).memory_bytes == (361 - 256) * MiB
