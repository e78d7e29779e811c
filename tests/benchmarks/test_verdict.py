"""benchmarks/verdict.py: the schedule, the spread and the verdict that
threads.py and pods.py print, as tables and properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmarks.verdict import (
    BELOW,
    INSIDE,
    MET,
    NO_OTHER,
    Measured,
    Spread,
    interleaved,
    verdict,
)


def test_interleaved_puts_the_warm_up_first_and_every_point_once_a_round() -> None:
    assert interleaved(["op", "default", "8"], 2, warmup="warm") == [
        (0, "warm"), (1, "op"), (1, "default"), (1, "8"), (2, "op"), (2, "default"), (2, "8")]
    assert interleaved(["a", "b"], 1) == [(1, "a"), (1, "b")]


def test_interleaved_refuses_no_rounds() -> None:
    with pytest.raises(ValueError, match="rounds: at least 1, got 0"):
        interleaved(["a"], 0)


@given(st.lists(st.integers(), min_size=1, max_size=6, unique=True), st.integers(1, 6))
def test_interleaved_measures_each_point_once_per_round_in_a_fixed_order(
        points: list[int], rounds: int) -> None:
    order = interleaved(points, rounds)
    assert len(order) == len(points) * rounds
    for r in range(1, rounds + 1):
        assert [p for n, p in order if n == r] == points
    assert [n for n, _ in order] == sorted(n for n, _ in order)


def test_spread_is_the_median_lowest_and_highest_of_the_rounds() -> None:
    s = Spread.of([20.0, 24.0, 22.0])
    assert (s.median, s.low, s.high, s.n) == (22.0, 20.0, 24.0, 3)
    assert s.relative == pytest.approx(4 / 22)
    assert s.text() == "22.00 [20.00-24.00, 3 rounds, +-9%]"
    assert Spread.of([5.0]).text() == "5.00 (1 round)"
    with pytest.raises(ValueError, match="at least one"):
        Spread.of([])


def m(label: str, threads: int | None, *samples: float, cut: bool = False) -> Measured:
    return Measured(label, threads, samples, cut)


@pytest.mark.parametrize(("operator", "others", "kind", "best", "ratio"), [
    # The operator's 1 thread against 2 and 8 threads: clearly the best.
    (m("op", 1, 25, 26), [m("2", 2, 20, 21), m("8", 8, 0.07, cut=True)], MET, "2", 25.5 / 20.5),
    # The run: "sweep 1" (the same 1 thread) measured faster. It is not
    # a rival: the same command, only noise between them.
    (m("op", 1, 17.9), [m("sweep 1", 1, 23.0), m("sweep 2", 2, 2.4)], MET, "sweep 2",
     17.9 / 2.4),
    # 2 threads' median higher, but its rounds overlap the operator's.
    (m("op", 1, 18, 24), [m("2", 2, 22, 23)], INSIDE, "2", 21 / 22.5),
    # 2 threads faster in every round: below.
    (m("op", 1, 18, 19), [m("2", 2, 22, 23)], BELOW, "2", 18.5 / 22.5),
    # Exactly at the bar.
    (m("op", 1, 19), [m("2", 2, 20)], MET, "2", 0.95),
    # An engine default whose count is not known is a rival.
    (m("op", 1, 10), [m("default", None, 20)], BELOW, "default", 0.5),
])
def test_verdict(operator: Measured, others: list[Measured], kind: str, best: str,
                 ratio: float) -> None:
    v = verdict(operator, others)
    assert (v.kind, v.best) == (kind, best)
    assert v.ratio == pytest.approx(ratio)
    assert v.kind in v.text()


def test_verdict_without_another_thread_count_says_so() -> None:
    v = verdict(m("op", 1, 20), [m("sweep 1", 1, 30), m("empty", 2)])
    assert (v.kind, v.ratio) == (NO_OTHER, None)
    assert NO_OTHER in v.text()
    with pytest.raises(ValueError, match="op: no samples"):
        verdict(m("op", 1), [])


def test_a_best_cut_at_the_cap_makes_the_ratio_a_lower_bound() -> None:
    v = verdict(m("op", 4, 0.2, cut=True), [m("1", 1, 0.1, cut=True)])
    assert v.lower_bound and v.text().startswith(
        "operator / best of the other thread counts (1) decode >2.00")


rates = st.lists(st.floats(0.01, 1000), min_size=1, max_size=5)


@given(rates, st.lists(st.tuples(st.integers(1, 8), rates), max_size=5),
       st.floats(0.1, 10))
def test_verdict_properties(op: list[float], rivals: list[tuple[int, list[float]]],
                            scale: float) -> None:
    operator = Measured("op", 1, tuple(op))
    others = [Measured(f"p{i}", t, tuple(s)) for i, (t, s) in enumerate(rivals)]
    v = verdict(operator, others)
    differing = [o for o in others if o.threads != 1]
    if not differing:
        assert v.kind == NO_OTHER
        return
    # The best is the highest median among the other thread counts, never the same count.
    best = next(o for o in differing if o.label == v.best)
    assert best.threads != 1
    assert v.other is not None and v.operator is not None and v.ratio is not None
    assert all(Spread.of(o.samples).median <= v.other.median for o in differing)
    # The three verdicts, by their definitions.
    if v.kind == MET:
        assert v.ratio >= 0.95
    elif v.kind == INSIDE:
        assert v.ratio < 0.95 and v.operator.high >= v.other.low
    else:
        assert v.kind == BELOW and v.ratio < 0.95 and v.operator.high < v.other.low
    # Units do not matter: every rate scaled alike gives the same verdict.
    scaled = verdict(Measured("op", 1, tuple(x * scale for x in op)),
                     [Measured(o.label, o.threads, tuple(x * scale for x in o.samples))
                      for o in others])
    assert scaled.ratio == pytest.approx(v.ratio, rel=1e-9)
    if abs(v.ratio - 0.95) > 1e-9 and abs(v.operator.high - v.other.low) > 1e-6 * v.other.low:
        assert scaled.kind == v.kind
