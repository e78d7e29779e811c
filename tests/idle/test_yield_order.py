"""Who gives a node to a waking model (`choose_yield`): never a busy one, never
one that never sleeps or is inside an awake window, only one of at most the
waker's priority while within its own `after`, not one that just woke; the
waker's home first, then the lowest priority, the longest idle, the key; and
only where the waker fits once the candidate left."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localmodel.idle import (
    Candidate,
    IdlePolicy,
    Reading,
    Waker,
    Window,
    YieldAsk,
    choose_yield,
    choose_yields,
    may_yield,
)
from localmodel.planner import CpuRequest, ModelDemand, Plan, fits_after_removal, plan
from tests.builders import MakeNode

pytestmark = pytest.mark.unit

G = 1 << 30
NOW = datetime(2026, 12, 7, 23, 0, tzinfo=UTC)
GRACE = 30.0


def demand(key: str, cpu: int = 4) -> ModelDemand:
    return ModelDemand(key, 1, CpuRequest(cpu), 4 * G)


def policy(priority: int = 0, after_s: float = 1800, windows: Sequence[Window] = ()) -> IdlePolicy:
    return IdlePolicy(after_s=after_s, priority=priority, windows=tuple(windows))


def idle(seconds: float) -> tuple[Reading, ...]:
    return (Reading(in_flight=0, queued=0, idle_seconds=seconds),)


class Cluster:
    """Nodes with one exclusive model on each (``placed``: model -> node)."""

    def __init__(self, placed: dict[str, str], cpus: dict[str, int] | None = None) -> None:
        cpus = cpus or {}
        self.nodes = {n: MakeNode(n).cpus(cpus.get(n, 8)).memory_gib(32).facts()
                      for n in sorted(set(placed.values()) | set(cpus))}
        self.demands = {m: demand(m) for m in placed}
        self.plan: Plan = plan(list(self.demands.values()), list(self.nodes.values()),
                               {m: [n] for m, n in placed.items()})
        assert {a.model: a.node for a in self.plan.placements} == placed

    def choose(self, waker: Waker, *candidates: Candidate) -> YieldAsk | None:
        return choose_yield(waker, candidates, self.plan, self.nodes, {}, self.demands,
                            now=NOW, grace_s=GRACE)


TWO = Cluster({"ai/v": "n1", "ai/u": "n2"})
WAKER = Waker(demand("ai/w"), policy(priority=5))


@pytest.mark.parametrize(
    ("candidate", "why"),
    [
        (Candidate("ai/v", policy(), (Reading(1, 0, 9999),)), "serving (1 in flight, 0 queued)"),
        (Candidate("ai/v", policy(), (Reading(0, 2, 9999),)), "serving (0 in flight, 2 queued)"),
        (Candidate("ai/v", policy(), (*idle(9999), Reading(1, 0, 0))), "serving"),
        (Candidate("ai/v", policy(), idle(9999), held=3), "3 request(s) wait for it at a router"),
        (Candidate("ai/v", policy(), (None,)), "no activity reading"),
        (Candidate("ai/v", policy(), ()), "no activity reading"),
        (Candidate("ai/v", policy(), idle(29)), "idle only 29 s (grace 30 s)"),
        (Candidate("ai/v", None, idle(9999)), "never sleeps"),
        (Candidate("ai/v", policy(windows=[Window.of("22:00", "06:00")]), idle(9999)),
         "inside an awake window"),
        (Candidate("ai/v", policy(), idle(9999), woke_s_ago=10), "woke 10 s ago"),
        (Candidate("ai/v", policy(priority=6), idle(600)), "priority 6 > 5"),
        (Candidate("ai/w", policy(), idle(9999)), "the model waking"),
    ],
)
def test_a_model_that_may_not_yield_is_never_asked_and_the_reason_says_why(
    candidate: Candidate, why: str
) -> None:
    refusal = may_yield(candidate, WAKER, NOW, GRACE)
    assert refusal is not None and why in refusal
    assert TWO.choose(WAKER, candidate) is None


def test_a_quiet_model_of_at_most_the_wakers_priority_yields_its_node() -> None:
    for priority in (-100, 0, 5):
        ask = TWO.choose(WAKER, Candidate("ai/v", policy(priority=priority), idle(60)))
        assert ask is not None and (ask.model, ask.node, ask.for_) == ("ai/v", "n1", "ai/w")
        assert ask.reason == f"gave n1 to ai/w: idle 60 s, priority {priority} <= 5"


def test_a_higher_priority_model_past_its_own_after_yields_too() -> None:
    """Rule 4: a borrower of higher priority keeps a sleeper's home only until
    its own `after`; then it would sleep anyway."""
    chat = Candidate("ai/v", policy(priority=10, after_s=600), idle(600))
    ask = TWO.choose(WAKER, chat)
    assert ask is not None and "past its after, priority 10" in ask.reason
    assert TWO.choose(WAKER, Candidate("ai/v", policy(priority=10, after_s=600), idle(599))) is None


def test_the_wakers_home_comes_first_then_lowest_priority_longest_idle_and_key() -> None:
    c = Cluster({"ai/a": "n1", "ai/b": "n2", "ai/c": "n3", "ai/d": "n4"})
    a = Candidate("ai/a", policy(priority=5), idle(31))
    b = Candidate("ai/b", policy(priority=0), idle(100))
    cc = Candidate("ai/c", policy(priority=0), idle(5000))
    d = Candidate("ai/d", policy(priority=0), idle(5000))
    home = Waker(demand("ai/w"), policy(priority=5), homes=frozenset({"n1"}))
    assert pick(c, home, a, b, cc, d) == "ai/a"  # its home, though busiest and highest
    away = Waker(demand("ai/w"), policy(priority=5))
    assert pick(c, away, a, b, cc, d) == "ai/c"  # lowest priority, longest idle, then key
    assert pick(c, away, a, b, d) == "ai/d"
    assert pick(c, away, a, b) == "ai/b"


def pick(c: Cluster, waker: Waker, *candidates: Candidate) -> str | None:
    ask = c.choose(waker, *candidates)
    return None if ask is None else ask.model


def test_a_candidate_whose_node_the_waker_would_not_fit_on_is_passed_over() -> None:
    c = Cluster({"ai/small": "n1", "ai/big": "n2"}, cpus={"n1": 4, "n2": 16})
    waker = Waker(demand("ai/w", cpu=8), policy())
    small = Candidate("ai/small", policy(priority=-10), idle(9999))
    big = Candidate("ai/big", policy(), idle(31))
    assert pick(c, waker, small, big) == "ai/big"
    assert pick(c, waker, small) is None


def test_each_waker_gets_its_own_candidate_the_highest_priority_first() -> None:
    c = Cluster({"ai/a": "n1", "ai/b": "n2"})
    cands = [Candidate("ai/a", policy(), idle(500)), Candidate("ai/b", policy(), idle(100))]
    low = Waker(demand("ai/low"), policy(priority=0))
    high = Waker(demand("ai/high"), policy(priority=9))
    third = Waker(demand("ai/third"), policy(priority=9))
    asks = choose_yields([low, third, high], cands, c.plan, c.nodes, {}, c.demands,
                         now=NOW, grace_s=GRACE)
    assert [(x.for_, x.model, x.node) for x in asks] == [
        ("ai/high", "ai/a", "n1"), ("ai/third", "ai/b", "n2")]


# ---------------------------------------------------------------- properties


@st.composite
def scenes(draw: st.DrawFn) -> tuple[Cluster, Waker, list[Candidate]]:
    n = draw(st.integers(1, 5))
    placed = {f"ai/m{i}": f"n{i}" for i in range(n)}
    cpus = {f"n{i}": draw(st.sampled_from([4, 8, 16])) for i in range(n)}
    cluster = Cluster(placed, cpus)
    some = st.sampled_from([0, 0, 0, 0, 0, 1])  # mostly quiet: most scenes ask someone
    readings = st.sampled_from([None, *[Reading(0, 0, s) for s in (29.0, 30.0, 600.0, 5000.0)]] * 2
                               ) | st.builds(Reading, some, some, st.sampled_from([10.0, 600.0]))
    policies = st.sampled_from([None]) | st.builds(
        IdlePolicy, st.sampled_from([60.0, 600.0, 3600.0]), st.integers(-2, 2))
    candidates = [
        Candidate(m, draw(policies), tuple(draw(st.lists(readings, min_size=1, max_size=2))),
                  held=draw(some), woke_s_ago=draw(st.sampled_from([None, None, 5.0, 900.0])))
        for m in placed
    ]
    homes = frozenset(draw(st.lists(st.sampled_from(sorted(cluster.nodes)), max_size=2)))
    waker = Waker(demand("ai/w", cpu=draw(st.sampled_from([2, 4, 8]))),
                  IdlePolicy(600.0, draw(st.integers(-2, 2))), homes)
    return cluster, waker, candidates


@settings(max_examples=300, deadline=None)
@given(scenes())
def test_never_a_busy_one_and_the_first_that_may_yield_and_fits_is_asked(
    scene: tuple[Cluster, Waker, list[Candidate]],
) -> None:
    cluster, waker, candidates = scene
    ask = cluster.choose(waker, *candidates)
    by_key = {c.key: c for c in candidates}

    def fits(c: Candidate, node: str) -> bool:
        return fits_after_removal(waker.demand, cluster.nodes[node], cluster.plan,
                                  cluster.demands, c.key)

    def rank(c: Candidate, node: str) -> tuple[bool, int, float, str]:
        assert c.policy is not None
        return node not in waker.homes, c.policy.priority, -c.idle_s, c.key

    able = [(c, a.node) for c in candidates if may_yield(c, waker, NOW, GRACE) is None
            for a in cluster.plan.placements_for(c.key) if fits(c, a.node)]
    if ask is None:
        assert not able
        return
    chosen = by_key[ask.model]
    for r in chosen.readings:  # never a busy one
        assert r is not None and r.in_flight == r.queued == 0 and r.idle_seconds >= GRACE
    assert chosen.held == 0 and chosen.policy is not None
    assert fits(chosen, ask.node)
    assert rank(chosen, ask.node) == min(rank(c, node) for c, node in able)
