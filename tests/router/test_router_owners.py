"""Sessions' owners with bounded loads (router/owners.py): the cap, no new
session over it, stickiness while the replicas stay, and a replica joining
or leaving moving only the sessions it must. Tables and properties."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localmodel.router.owners import Owners, cap, place
from localmodel.router.session import ranking

pytestmark = pytest.mark.unit

MODEL = "static/m"


@pytest.mark.parametrize(("sessions", "replicas", "want"), [
    (1, 2, 1), (2, 2, 1), (3, 2, 2), (4, 2, 2), (5, 2, 3), (8, 2, 5), (10, 2, 6),
    (4, 3, 2), (9, 3, 3), (100, 4, 31), (1, 1, 1), (7, 1, 7), (2, 1, 2), (0, 2, 0), (3, 0, 0),
])
def test_the_cap_is_factor_times_the_even_share_rounded_down_but_never_below_it(
        sessions: int, replicas: int, want: int) -> None:
    assert cap(sessions, replicas) == want


def test_four_sessions_on_two_replicas_two_each_whatever_the_hash() -> None:
    """The benchmark's shape: plain rendezvous puts 3 of these on one replica."""
    names = ["a", "b"]
    plain = [ranking(f"{MODEL}\0s{i}", names)[0] for i in range(4)]
    owners = Owners()
    placed = [owners.owner(MODEL, f"s{i}", names, 0.0) for i in range(4)]
    assert sorted(placed.count(n) for n in names) == [2, 2], (plain, placed)
    assert owners.loads(MODEL) == {"a": 2, "b": 2}


def test_the_order_is_the_owner_then_the_rest_of_the_ranking() -> None:
    owners = Owners()
    names = ["a", "b", "c"]
    for i in range(6):
        order = owners.order(MODEL, f"s{i}", names, 0.0)
        rest = [n for n in ranking(f"{MODEL}\0s{i}", names) if n != order[0]]
        assert order == [owners.owner(MODEL, f"s{i}", names, 0.0), *rest]


def test_place_takes_the_first_in_order_under_the_limit() -> None:
    assert place(["x", "y", "z"], {"x": 2, "y": 1}, 2) == "y"
    assert place(["x", "y", "z"], {"x": 2, "y": 1}, 2, allowed={"z"}) == "z"
    assert place(["x", "y"], {"x": 2, "y": 2}, 2) is None


NAMES = st.lists(st.sampled_from([f"r{i}" for i in range(8)]), min_size=1, max_size=6,
                 unique=True)
# A workload: turns of sessions, each `(session, seconds since the previous turn)`.
TURNS = st.lists(st.tuples(st.integers(0, 40), st.floats(0, 5)), min_size=1, max_size=120)


@settings(max_examples=150, deadline=None)
@given(names=NAMES, turns=TURNS, factor=st.sampled_from([1.0, 1.25, 1.5, 2.0]))
def test_no_new_session_lands_on_a_replica_at_its_cap_and_none_ever_moves(
        names: list[str], turns: list[tuple[int, float]], factor: float) -> None:
    owners = Owners(factor=factor, idle_s=1e9)
    first: dict[str, str] = {}
    now = 0.0
    for session, gap in turns:
        now += gap
        key = f"s{session}"
        loads = owners.loads(MODEL)
        live = sum(loads.values()) + (key not in first)
        got = owners.owner(MODEL, key, names, now)
        if key in first:  # sticky: the replicas did not change, so neither does its owner
            assert got == first[key]
            continue
        first[key] = got
        limit = cap(live, len(names), factor)
        assert loads.get(got, 0) < limit
        # ...and it went to the first replica of its ranking with room (what plain
        # rendezvous does whenever no replica is full).
        order = ranking(f"{MODEL}\0{key}", names)
        assert got == next(n for n in order if loads.get(n, 0) < limit)
        # With sessions only arriving, every replica stays within the bound, and
        # within the paper's ceil(c * m / n).
        after = owners.loads(MODEL)
        assert max(after.values()) <= limit <= math.ceil(factor * live / len(names))
        assert sum(after.values()) == live


@settings(max_examples=150, deadline=None)
@given(names=NAMES, joiner=st.sampled_from(["j1", "j2"]),
       sessions=st.integers(1, 40), factor=st.sampled_from([1.0, 1.25, 2.0]))
def test_a_joining_replica_takes_only_sessions_that_rank_it_above_their_owner(
        names: list[str], joiner: str, sessions: int, factor: float) -> None:
    owners = Owners(factor=factor)
    before = {f"s{i}": owners.owner(MODEL, f"s{i}", names, 0.0) for i in range(sessions)}
    grown = [*names, joiner]
    after = {s: owners.owner(MODEL, s, grown, 1.0) for s in before}
    for s, was in before.items():
        now = after[s]
        if now != was:
            assert now == joiner
            order = ranking(f"{MODEL}\0{s}", grown)
            assert order.index(joiner) < order.index(was)
    limit = cap(sessions, len(grown), factor)
    assert list(after.values()).count(joiner) <= limit
    # Settled: the next turns stay where they are.
    assert {s: owners.owner(MODEL, s, grown, 2.0) for s in before} == after


@settings(max_examples=150, deadline=None)
@given(names=NAMES.filter(lambda n: len(n) > 1), sessions=st.integers(1, 40),
       data=st.data())
def test_a_leaving_replica_moves_only_its_own_sessions_to_replicas_with_room(
        names: list[str], sessions: int, data: st.DataObject) -> None:
    owners = Owners()
    before = {f"s{i}": owners.owner(MODEL, f"s{i}", names, 0.0) for i in range(sessions)}
    leaver = data.draw(st.sampled_from(names))
    rest = [n for n in names if n != leaver]
    after = {s: owners.owner(MODEL, s, rest, 1.0) for s in before}
    for s, was in before.items():
        if was != leaver:
            assert after[s] == was
        else:
            assert after[s] in rest
    # The moved ones fill up to the cap, never past it: every other replica was
    # within it before, and the leaver's sessions only go where there is room.
    assert max(owners.loads(MODEL).values()) <= cap(sessions, len(rest))


def test_the_owner_is_the_same_whatever_order_the_replicas_are_listed() -> None:
    one, two = Owners(), Owners()
    names = ["a", "b", "c"]
    for i in range(30):
        assert one.owner(MODEL, f"s{i}", names, 0.0) == two.owner(MODEL, f"s{i}",
                                                                 names[::-1], 0.0)


def test_an_idle_session_is_forgotten_and_its_place_freed() -> None:
    owners = Owners(idle_s=60.0)
    names = ["a", "b"]
    owners.owner(MODEL, "s0", names, 0.0)
    owners.owner(MODEL, "s1", names, 30.0)
    owners.owner(MODEL, "s0", names, 50.0)  # a turn within 60 s: kept
    assert len(owners) == 2
    owners.owner(MODEL, "s2", names, 100.0)  # s0 last seen at 50, s1 at 30: s1 is gone
    assert len(owners) == 2
    assert sum(owners.loads(MODEL).values()) == 2
    owners.owner(MODEL, "s3", names, 500.0)  # everyone else idle past 60 s
    assert len(owners) == 1 and sum(owners.loads(MODEL).values()) == 1


def test_the_table_is_bounded_least_recent_forgotten_first() -> None:
    owners = Owners(limit=3)
    for i in range(10):
        owners.owner(MODEL, f"s{i}", ["a", "b"], float(i))
    assert len(owners) == 3
    assert sum(owners.loads(MODEL).values()) == 3


def test_models_are_balanced_separately() -> None:
    owners = Owners()
    for i in range(4):
        owners.owner("ns/one", f"s{i}", ["a", "b"], 0.0)
        owners.owner("ns/two", f"s{i}", ["c", "d"], 0.0)
    assert owners.loads("ns/one") == {"a": 2, "b": 2}
    assert owners.loads("ns/two") == {"c": 2, "d": 2}


def test_no_replica_is_an_error() -> None:
    with pytest.raises(ValueError, match="at least one replica"):
        Owners().owner(MODEL, "s", [], 0.0)


@settings(max_examples=60, deadline=None)
@given(n_replicas=st.integers(2, 4), n_sessions=st.integers(1, 12), data=st.data())
def test_a_second_router_takes_the_owners_the_gateways_list(
        n_replicas: int, n_sessions: int, data: st.DataObject) -> None:
    """Router A places sessions in one order; router B meets them in another.
    With what the gateways list (each session at the replica A sent it to as
    owner), B's owners are A's, those A placed down their ranking included."""
    replicas = [f"r{i}" for i in range(n_replicas)]
    sessions = [f"s{i}" for i in range(n_sessions)]
    a, b = Owners(), Owners()
    placed = {s: a.owner(MODEL, s, replicas, 0.0) for s in sessions}
    later = data.draw(st.permutations(sessions))
    for s in later:
        assert b.owner(MODEL, s, replicas, 1.0, listed=[placed[s]]) == placed[s]
    assert b.loads(MODEL) == a.loads(MODEL)


def test_without_the_gateways_lists_two_routers_can_disagree() -> None:
    """Two sessions that rank one replica first: whichever a router meets
    first takes it, the other goes down its ranking (the cap)."""
    replicas = ["r0", "r1"]

    def top(s: str) -> str:
        return ranking(f"{MODEL}\0{s}", replicas)[0]

    pair = ["s0", next(f"s{i}" for i in range(1, 500) if top(f"s{i}") == top("s0"))]
    a, b = Owners(), Owners()
    seen_a = {s: a.owner(MODEL, s, replicas, 0.0) for s in pair}
    seen_b = {s: b.owner(MODEL, s, replicas, 0.0) for s in reversed(pair)}
    assert seen_a != seen_b
    # Listed where A put them, B agrees (the property above, in one example).
    c = Owners()
    assert {s: c.owner(MODEL, s, replicas, 0.0, listed=[seen_a[s]])
            for s in reversed(pair)} == seen_a


def test_a_session_this_router_owns_keeps_its_owner_whatever_is_listed() -> None:
    """The lists only place a session this router has no owner for: another
    replica listing it (a stale list, another router's choice) moves nothing."""
    owners = Owners()
    mine = owners.owner(MODEL, "s", ["r0", "r1"], 0.0)
    other = "r1" if mine == "r0" else "r0"
    assert owners.owner(MODEL, "s", ["r0", "r1"], 1.0, listed=[other]) == mine
