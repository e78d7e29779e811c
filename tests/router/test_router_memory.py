"""The router's memory limit, sized from benchmarks/router_hostile.py: the
rule (router/config.py, router_memory_bytes) against what the benchmark
measured, and the chart's router resources carrying it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from localmodel.facts.quantity import parse_bytes
from localmodel.router.config import PLACES, ROUTER_MEMORY_BYTES, RouterConfig, router_memory_bytes

pytestmark = pytest.mark.unit

MiB = 1024**2
VALUES = Path(__file__).resolve().parents[2] / "charts" / "localmodel-operator" / "values.yaml"


@pytest.mark.parametrize(
    ("places", "answer_s", "measured_mib"),
    [
        # benchmarks/router_hostile.py at the defaults (docs/benchmarks.md,
        # Hostile bodies at the router): every kind mixed, 20 s; and every
        # place held 10 s by a valid 1 MiB body of empty objects, 30 s.
        (64, 0.32, 139.0),
        (64, 10.0, 136.9),
    ],
)
def test_the_limit_holds_what_the_benchmark_measured_with_room(
    places: int, answer_s: float, measured_mib: float
) -> None:
    assert router_memory_bytes(places) >= 1.4 * measured_mib * MiB


def test_the_charts_router_asks_for_what_its_defaults_need() -> None:
    resources = yaml.safe_load(VALUES.read_text())["router"]["resources"]
    defaults = RouterConfig()
    need = router_memory_bytes(defaults.places, defaults.body_reads, defaults.max_body_bytes)
    assert parse_bytes(resources["limits"]["memory"]) == need == 256 * MiB
    assert resources["requests"]["memory"] == resources["limits"]["memory"]


@given(st.integers(1, 4096), st.integers(1, 64), st.integers(0, 100))
def test_more_places_or_reads_never_get_less_memory(places: int, reads: int, more: int) -> None:
    limit = router_memory_bytes(places, reads)
    assert limit >= ROUTER_MEMORY_BYTES and limit % MiB == 0
    assert router_memory_bytes(places + more, reads) >= limit
    assert router_memory_bytes(places, reads + more) >= limit
    assert router_memory_bytes(PLACES) == 256 * MiB
