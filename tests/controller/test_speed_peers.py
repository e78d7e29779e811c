"""Peers a tenant cannot fake, and outliers dropped (localmodel/speed.py
`inliers`, `expected_speed`): a table of what is dropped, and properties that
hold for any values: the median stays, scale and order do not matter, and a
minority of lying peers cannot move the expectation out of the honest range."""

from __future__ import annotations

import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localmodel.speed import (
    MIN_SPREAD,
    OUTLIER_SPREADS,
    SOURCE_PEERS,
    Rates,
    expected_speed,
    inliers,
)
from tests.builders import PEER_KEY

pytestmark = pytest.mark.unit

KEY = PEER_KEY

INLIERS = [
    # (case, values, kept)
    ("none", [], []),
    ("two: neither is the odd one", [10.0, 1000.0], [10.0, 1000.0]),
    ("a tight cluster is kept whole", [24.0, 25.0, 26.0, 25.5], [24.0, 25.0, 26.0, 25.5]),
    ("one far above is dropped", [24.0, 25.0, 26.0, 900.0], [24.0, 25.0, 26.0]),
    ("one far below is dropped", [0.5, 24.0, 25.0, 26.0], [24.0, 25.0, 26.0]),
    ("most equal: within the minimum spread is kept, past it dropped",
     [25.0, 25.0, 25.0, 28.0, 29.0], [25.0, 25.0, 25.0, 28.0]),
    ("a wide honest spread keeps its own members", [10.0, 20.0, 30.0, 40.0, 50.0],
     [10.0, 20.0, 30.0, 40.0, 50.0]),
    ("a 1e6 lie among three", [20.0, 22.0, 1e6], [20.0, 22.0]),
]


@pytest.mark.parametrize(("case", "values", "kept"), INLIERS, ids=[i[0] for i in INLIERS])
def test_inliers(case: str, values: list[float], kept: list[float]) -> None:
    assert inliers(values) == kept


def test_the_expectation_ignores_an_outlier_peer_and_counts_the_kept() -> None:
    cals = {"me": (KEY, Rates(25.0)), "a": (KEY, Rates(24.0, 100.0)),
            "b": (KEY, Rates(26.0, 110.0)), "c": (KEY, Rates(25.0, 105.0)),
            "liar": (KEY, Rates(1e6, 1e6))}
    got = expected_speed("me", KEY, cals)
    assert (got.decode, got.prefill, got.source, got.peers) == (25.0, 105.0, SOURCE_PEERS, 3)


RATES = st.floats(min_value=0.01, max_value=1e6, allow_nan=False, allow_infinity=False)
PROPERTIES = settings(max_examples=300, deadline=None)


@PROPERTIES
@given(st.lists(RATES, max_size=30))
def test_kept_values_are_a_subsequence_holding_the_median(values: list[float]) -> None:
    kept = inliers(values)
    it = iter(values)
    assert all(v in it for v in kept)  # in order, each at most once
    if values:
        assert len(kept) * 2 >= len(values)  # at least half stays
        assert min(kept) <= statistics.median(values) <= max(kept)


@PROPERTIES
@given(st.lists(RATES, max_size=30), st.randoms(use_true_random=False),
       st.floats(min_value=0.01, max_value=100))
def test_order_and_scale_do_not_matter(values: list[float], rnd: object,
                                       factor: float) -> None:
    shuffled = list(values)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    assert sorted(inliers(shuffled)) == sorted(inliers(values))
    scaled = inliers([v * factor for v in values])
    # Scaling keeps the same members (up to a rounding at the band's edge).
    assert abs(len(scaled) - len(inliers(values))) <= sum(
        1 for v in values if _at_edge(values, v))


def _at_edge(values: list[float], v: float) -> bool:
    if len(values) < 3:
        return False
    middle = statistics.median(values)
    mad = statistics.median(abs(x - middle) for x in values)
    band = OUTLIER_SPREADS * max(1.4826 * mad, MIN_SPREAD * middle)
    return abs(abs(v - middle) - band) <= 1e-9 * max(1.0, band)


@PROPERTIES
@given(st.floats(min_value=1.0, max_value=1e5), st.integers(min_value=1, max_value=12),
       st.data())
def test_a_minority_of_liars_cannot_move_the_expectation_out_of_the_honest_range(
        centre: float, honest_n: int, data: st.DataObject) -> None:
    # Honest peers calibrate within MIN_SPREAD of each other; liars say anything.
    honest = data.draw(st.lists(st.floats(min_value=centre, max_value=centre * (1 + MIN_SPREAD)),
                                min_size=honest_n, max_size=honest_n))
    liars = data.draw(st.lists(RATES, max_size=honest_n - 1))
    cals = {f"h{i}": (KEY, Rates(v)) for i, v in enumerate(honest)}
    cals |= {f"l{i}": (KEY, Rates(v)) for i, v in enumerate(liars)}
    got = expected_speed("me", KEY, cals)
    assert got.decode is not None
    assert min(honest) <= got.decode <= max(honest), (honest, liars, got)
    assert got.peers >= honest_n  # no honest peer was dropped
