"""The idle decisions of one pass (`idle.decide`, then `idle.wakers.after_plan`), as a
table: a model due to sleep falls asleep (resident under `OnDemand`, by its
gateways' closes under `WhenAsleep`), one not due, busy, or with a missing or
stale reading stays awake (unknown is not idle), an awake window keeps it
awake and wakes it at its start, every replica closed releases it, one
refusal reopens the others, a held request wakes a released sleeper, which
prefers its home or the node a yield reserved for it (for a bounded time),
and a model without `spec.idle` never takes a released sleeper's home."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localmodel.api import IdleHome, IdleStatus, IdleWake
from localmodel.gateway_contract.waiting_answer import WaitingModel
from localmodel.idle import IdlePolicy, Reading, Release, Window
from localmodel.idle.asks import (
    CloseAsk,
    Closed,
    CloseResult,
    IdleSettings,
    IdleSignals,
)
from localmodel.idle.decide import (
    Decided,
    IdleModel,
    decide,
    epoch,
    fresh_readings,
    last_request,
    stamp,
)
from localmodel.idle.wakers import after_plan
from localmodel.idle_status import IdleReport
from localmodel.planner import CpuRequest, ModelDemand, Plan, Unplaced, UnplacedReason, plan
from localmodel.speed import Activity, Rates, Totals
from localmodel.speed import Reading as SpeedReading
from localmodel.status import Reason
from tests.builders import MakeNode

pytestmark = pytest.mark.unit

G = 1 << 30
NOW = datetime(2026, 12, 7, 23, 0, tzinfo=UTC).timestamp()
AFTER = 1800.0
ON_DEMAND = IdlePolicy(AFTER)
WHEN_ASLEEP = IdlePolicy(AFTER, release=Release.WHEN_ASLEEP)
QUIET = Reading(0, 0, 2 * AFTER)
HOME = IdleHome(replica=0, node="n1", claim="q-weights-0")
ASLEEP_RELEASED = IdleStatus(state="Asleep", resident=False, since=stamp(NOW - 3600),
                             homes=[HOME])


def model(key: str = "ai/q", policy: IdlePolicy = ON_DEMAND, replicas: int = 1,
          stored: IdleStatus | None = None, readings: tuple[Reading | None, ...] | None = None,
          homes: tuple[IdleHome, ...] = (), ready_on: tuple[str, ...] = ()) -> IdleModel:
    name = key.partition("/")[2]
    return IdleModel(key, policy, tuple(f"{name}-{r}" for r in range(replicas)), 120.0, stored,
                     (QUIET,) * replicas if readings is None else readings, homes, ready_on)


def signals(now: float = NOW, held: Mapping[str, int] | None = None,
            closes: tuple[Closed, ...] = (), **settings: object) -> IdleSignals:
    waiting = {k: WaitingModel(k, n, 0, 5.0) for k, n in (held or {}).items()}
    return IdleSignals(now, waiting, {f"{c.ask.namespace}/{c.ask.pod}": c for c in closes},
                       settings=IdleSettings(**settings))  # type: ignore[arg-type]


def closed(m: IdleModel, replica: int, result: CloseResult = CloseResult.CLOSED,
           reason: str = "sleep", at: float = NOW - 1, for_: str = "", node: str = "") -> Closed:
    ask = CloseAsk(m.namespace, m.name, m.pods[replica], reason, 0,  # type: ignore[arg-type]
                   for_=for_, node=node)
    return Closed(ask, result, at, lease_seconds=60.0 if result is CloseResult.CLOSED else 0.0)


def one(m: IdleModel, sig: IdleSignals | None = None, **kw: object) -> Decided:
    return decide([m], sig or signals(), **kw)  # type: ignore[arg-type]


def state(d: Decided, key: str = "ai/q") -> tuple[str, bool, Reason]:
    s = d.steps[key]
    return s.idle.state, s.idle.resident, s.awake


# ---- falling asleep ------------------------------------------------------------------


@pytest.mark.parametrize(("readings", "expected"), [
    ((QUIET,), ("Asleep", True, Reason.ASLEEP)),  # due: OnDemand sleeps, resident
    ((Reading(0, 0, AFTER - 1),), ("Awake", True, Reason.IDLE)),  # not due yet
    ((Reading(1, 0, 0),), ("Awake", True, Reason.SERVING)),  # busy
    ((Reading(0, 1, 0),), ("Awake", True, Reason.SERVING)),  # queued
    ((None,), ("Awake", True, Reason.IDLE)),  # unknown is not idle
    ((QUIET, None), ("Awake", True, Reason.IDLE)),  # one replica unknown
])
def test_a_model_sleeps_only_when_every_replica_is_known_to_be_quiet_for_after(
        readings: tuple[Reading | None, ...], expected: tuple[str, bool, Reason]) -> None:
    d = one(model(replicas=len(readings), readings=readings))
    assert state(d) == expected
    assert not d.steps["ai/q"].asks and not d.inputs.released


def test_an_on_demand_sleep_asks_no_close_and_keeps_its_pods() -> None:
    d = one(model())
    assert d.steps["ai/q"].idle.since == stamp(NOW)
    assert d.inputs.released == frozenset()


def test_a_held_request_keeps_a_due_model_awake() -> None:
    assert state(one(model(), signals(held={"ai/q": 1}))) == ("Awake", True, Reason.IDLE)


def test_a_model_inside_an_awake_window_never_sleeps() -> None:
    always = IdlePolicy(AFTER, windows=(Window.of("22:00", "23:30"),))
    assert state(one(model(policy=always)))[0] == "Awake"


def test_without_a_router_nothing_sleeps() -> None:
    assert state(one(model(), signals(router=False))) == ("Awake", True, Reason.ROUTER_OFF)
    m = model(policy=WHEN_ASLEEP)  # a close left from before the router went: undone
    d = one(m, signals(closes=(closed(m, 0),), router=False))
    assert state(d) == ("Awake", True, Reason.ROUTER_OFF) and not d.inputs.released
    assert d.steps["ai/q"].asks == (CloseAsk("ai", "q", "q-0", "reopen"),)
    assert state(one(model(stored=ASLEEP_RELEASED), signals(router=False)))[0] == "Waking"


def test_when_asleep_asks_each_replica_to_close_and_stays_awake_until_all_did() -> None:
    m = model(policy=WHEN_ASLEEP, replicas=2)
    d = one(m)
    assert state(d) == ("Awake", True, Reason.IDLE)
    assert d.steps["ai/q"].asks == tuple(
        CloseAsk("ai", "q", pod, "sleep", int(AFTER)) for pod in ("q-0", "q-1"))
    # one closed: the other is still asked, the closed one not again (its lease runs)
    d = one(m, signals(closes=(closed(m, 0),)))
    assert [a.pod for a in d.steps["ai/q"].asks] == ["q-1"]
    assert not d.inputs.released


def test_every_replica_closed_releases_the_model_and_its_demand() -> None:
    m = model(policy=WHEN_ASLEEP, replicas=2, homes=(HOME,))
    d = one(m, signals(closes=(closed(m, 0, at=NOW - 3), closed(m, 1, at=NOW - 2))))
    assert state(d) == ("Asleep", False, Reason.ASLEEP)
    assert d.steps["ai/q"].idle.since == stamp(NOW - 2)  # the last close: the same each pass
    assert d.inputs.released == {"ai/q"}
    assert "ai/q" not in d.inputs.prefer


def test_a_close_refused_by_one_replica_reopens_the_others() -> None:
    m = model(policy=WHEN_ASLEEP, replicas=3)
    d = one(m, signals(closes=(closed(m, 0), closed(m, 1, CloseResult.BUSY))))
    assert state(d) == ("Awake", True, Reason.IDLE)
    assert d.steps["ai/q"].asks == (CloseAsk("ai", "q", "q-0", "reopen"),)
    assert not d.inputs.released


def test_a_close_from_before_the_model_woke_or_past_its_lease_counts_for_nothing() -> None:
    woke = IdleStatus(state="Awake", since=stamp(NOW - 10))
    m = model(policy=WHEN_ASLEEP, stored=woke)
    assert not one(m, signals(closes=(closed(m, 0, at=NOW - 20),))).inputs.released
    lapsed = model(policy=WHEN_ASLEEP)
    assert not one(lapsed, signals(closes=(closed(lapsed, 0, at=NOW - 61),))).inputs.released


def test_a_refused_or_unreachable_close_is_not_asked_again_within_the_grace() -> None:
    m = model(policy=WHEN_ASLEEP)
    busy = one(m, signals(closes=(closed(m, 0, CloseResult.BUSY, at=NOW - 5),)))
    assert state(busy) == ("Awake", True, Reason.IDLE) and not busy.steps["ai/q"].asks
    gone = one(m, signals(closes=(closed(m, 0, CloseResult.UNREACHABLE, at=NOW - 5),)))
    assert state(gone) == ("Awake", True, Reason.SLEEP_PREVENTED)
    assert not gone.steps["ai/q"].asks
    later = one(m, signals(closes=(closed(m, 0, CloseResult.UNREACHABLE, at=NOW - 31),)))
    assert [a.reason for a in later.steps["ai/q"].asks] == ["sleep"]


# ---- waking -------------------------------------------------------------------------


def test_a_resident_sleeper_that_serves_or_is_wanted_is_awake_at_once() -> None:
    asleep = IdleStatus(state="Asleep", resident=True, since=stamp(NOW - 600))
    served = one(model(stored=asleep, readings=(Reading(0, 0, 4),)))
    assert state(served) == ("Awake", True, Reason.IDLE)
    wanted = one(model(stored=asleep), signals(held={"ai/q": 2}))
    assert state(wanted)[0] == "Awake"
    quiet = one(model(stored=asleep))
    assert state(quiet) == ("Asleep", True, Reason.ASLEEP) and quiet.steps["ai/q"].idle == asleep
    unknown = one(model(stored=asleep, readings=(None,)))  # (the operator restarted)
    assert state(unknown) == ("Asleep", True, Reason.ASLEEP)


def test_a_held_request_wakes_a_released_sleeper_which_prefers_its_home() -> None:
    m = model(stored=ASLEEP_RELEASED, homes=(HOME,))
    quiet = one(m)
    assert state(quiet) == ("Asleep", False, Reason.ASLEEP) and quiet.inputs.released == {"ai/q"}
    d = one(m, signals(held={"ai/q": 2}))
    assert state(d) == ("Waking", False, Reason.WAKING)
    wake = d.steps["ai/q"].idle.wake
    assert wake is not None and wake.held == 2 and wake.wanted_at == stamp(NOW)
    assert not d.inputs.released and d.inputs.prefer == {"ai/q": ("n1",)}


def test_an_awake_window_wakes_a_released_sleeper_at_its_start() -> None:
    window = Window.of("23:00", "23:30")
    m = model(policy=IdlePolicy(AFTER, windows=(window,)), stored=ASLEEP_RELEASED)
    assert state(one(m, signals(now=NOW - 1)))[0] == "Asleep"
    assert state(one(m))[0] == "Waking"


def test_a_waking_model_is_awake_at_its_first_ready_replica() -> None:
    waking = IdleStatus(state="Waking", resident=False, since=stamp(NOW - 14), wakes=3,
                        wake=IdleWake(wanted_at=stamp(NOW - 14), held=1))
    d = one(model(stored=waking, homes=(HOME,), ready_on=("n1",)), signals(held={"ai/q": 1}))
    assert state(d) == ("Awake", True, Reason.SERVING)
    idle = d.steps["ai/q"].idle
    assert idle.wakes == 4 and idle.wake is None and idle.last_wake is not None
    assert (idle.last_wake.seconds, idle.last_wake.node, idle.last_wake.warm_cache) == (
        14.0, "n1", True)


def test_a_waking_model_nothing_wants_any_more_sleeps_again_after_its_hold_time() -> None:
    waking = IdleStatus(state="Waking", resident=False, since=stamp(NOW - 60),
                        wake=IdleWake(wanted_at=stamp(NOW - 60)))
    assert state(one(model(stored=waking)))[0] == "Waking"  # within the hold time
    late = waking.model_copy(update={"wake": IdleWake(wanted_at=stamp(NOW - 121))})
    assert state(one(model(stored=late))) == ("Asleep", False, Reason.ASLEEP)


def test_a_waking_model_whose_pod_has_an_address_is_not_put_back_to_sleep() -> None:
    """The router relays a held request as soon as it sees the woken replica
    Ready, so its hold ends before a pass sees the pod Ready: the model stays
    Waking (and is Awake at the next pass), never released with its pod
    serving that request."""
    late = IdleStatus(state="Waking", resident=False, since=stamp(NOW - 200),
                      wake=IdleWake(wanted_at=stamp(NOW - 200)))
    started = replace(model(stored=late), ips=("10.244.0.9",))
    d = one(started)
    assert state(d) == ("Waking", False, Reason.WAKING)
    assert "ai/q" not in d.inputs.released and not d.steps["ai/q"].asks
    assert state(one(replace(started, ips=("",)))) == ("Asleep", False, Reason.ASLEEP)


# ---- yields, reservations and rule 4 ------------------------------------------------


def cluster() -> tuple[dict[str, object], Plan, dict[str, ModelDemand]]:
    nodes = {n: MakeNode(n).cpus(8).memory_gib(32).facts() for n in ("n1", "n2")}
    demands = {k: ModelDemand(k, 1, CpuRequest(4), 4 * G) for k in ("ai/a", "ai/b", "ai/w")}
    the_plan = plan(list(demands.values()), list(nodes.values()),
                    {"ai/a": ["n1"], "ai/b": ["n2"]})
    return dict(nodes), the_plan, demands


def test_a_waker_the_plan_left_unplaced_asks_the_longest_idle_model_never_a_busy_one() -> None:
    nodes, the_plan, demands = cluster()
    assert the_plan.unplaced_for("ai/w")
    waking = IdleStatus(state="Waking", resident=False, since=stamp(NOW - 5),
                        wake=IdleWake(wanted_at=stamp(NOW - 5), held=1))
    w = model("ai/w", stored=waking)
    a = model("ai/a", readings=(Reading(1, 0, 0),))  # serving: never asked
    b = model("ai/b", readings=(Reading(0, 0, 600),), stored=IdleStatus(state="Awake"))
    sig = signals(held={"ai/w": 1})
    d = decide([a, b, w], sig)
    out = after_plan(d, [a, b, w], the_plan, nodes, {}, demands, sig)  # type: ignore[arg-type]
    assert out.reports["ai/w"].awake is Reason.WAITING_FOR_NODE
    assert out.closes == (CloseAsk("ai", "b", "b-0", "yield", 30, for_="ai/w", node="n2"),)
    # b refused: not asked again within the grace, and nobody else may be
    refused = signals(held={"ai/w": 1}, closes=(closed(b, 0, CloseResult.BUSY, "yield"),))
    d = decide([a, b, w], refused)
    assert after_plan(d, [a, b, w], the_plan, nodes, {}, demands,  # type: ignore[arg-type]
                      refused).closes == ()


def test_a_yield_releases_the_yielder_and_reserves_its_node_for_the_waker() -> None:
    waking = IdleStatus(state="Waking", resident=False, since=stamp(NOW - 5),
                        wake=IdleWake(wanted_at=stamp(NOW - 5), held=1), homes=[HOME])
    w = model("ai/w", stored=waking, homes=(HOME,))
    b = model("ai/b", stored=IdleStatus(state="Awake", yields=2))
    c = model("ai/c", policy=IdlePolicy(AFTER), readings=(Reading(1, 0, 0),))
    sig = signals(held={"ai/w": 1}, closes=(closed(b, 0, reason="yield", for_="ai/w",
                                                   node="n2", at=NOW - 1),))
    d = decide([w, b, c], sig, pending=["ai/w", "ai/c", "ai/plain"], plain=["ai/plain"])
    assert state(d, "ai/b") == ("Asleep", False, Reason.ASLEEP)
    assert d.steps["ai/b"].idle.yields == 3
    wake = d.steps["ai/w"].idle.wake
    assert wake is not None and (wake.node, wake.reserved) == ("n2", True)
    assert d.steps["ai/w"].idle.since == stamp(NOW - 1)  # the reservation runs from the close
    assert d.inputs.prefer["ai/w"] == ("n2",)  # the node given, before its home
    assert d.inputs.avoid == {"ai/c": {"n2"}, "ai/plain": {"n2"}}  # reserved for ai/w
    # the next pass reads it from status; past reserve_s the reservation lapses
    kept = d.steps["ai/w"].idle
    for now, reserved in ((NOW + 100, True), (NOW + 120, False)):
        again = decide([model("ai/w", stored=kept, homes=(HOME,))],
                       signals(now=now, held={"ai/w": 1}), pending=["ai/c"])
        wake = again.steps["ai/w"].idle.wake
        assert wake is not None and wake.reserved is reserved, now
        assert again.inputs.prefer["ai/w"] == ("n2" if reserved else "n1",)
        assert bool(again.inputs.avoid) is reserved


def test_a_half_closed_model_nobody_asks_any_more_is_reopened() -> None:
    """A yield whose waker found a node elsewhere: the replica that closed
    serves again at once, not when its lease lapses."""
    nodes, the_plan, demands = cluster()
    b = model("ai/b", replicas=2, readings=(Reading(0, 0, 600),) * 2)
    sig = signals(closes=(closed(b, 0, reason="yield", for_="ai/w", node="n2"),))
    d = decide([b], sig)
    assert not d.steps["ai/b"].asks and not d.inputs.released
    out = after_plan(d, [b], the_plan, nodes, {}, demands, sig)  # type: ignore[arg-type]
    assert out.closes == (CloseAsk("ai", "b", "b-0", "reopen"),)


def test_a_model_that_never_sleeps_avoids_a_released_sleepers_home_only_while_pending() -> None:
    sleeper = model("ai/s", stored=ASLEEP_RELEASED, homes=(HOME,))
    d = decide([sleeper], signals(), pending=["ai/embed", "ai/other"], plain=["ai/embed", "ai/x"])
    assert d.inputs.avoid == {"ai/embed": {"n1"}}  # not the placed ai/x, not idle ai/other


def test_the_waking_model_reports_its_node_and_the_cost_of_waking_away_from_home() -> None:
    nodes, _, demands = cluster()
    waking = IdleStatus(state="Waking", resident=False, since=stamp(NOW - 5),
                        wake=IdleWake(wanted_at=stamp(NOW - 5), held=1))
    w = model("ai/w", stored=waking, homes=(HOME,))
    sig = signals(held={"ai/w": 1})
    d = decide([w], sig)
    elsewhere = plan([demands["ai/w"]], [nodes["n2"]], {})  # type: ignore[list-item]
    report = after_plan(d, [w], elsewhere, nodes, {}, demands, sig).reports["ai/w"]  # type: ignore[arg-type]
    assert report.awake is Reason.WAKING and report.idle.wake is not None
    assert report.idle.wake.node == "n2"
    assert report.idle.wake.cost == "new claim on n2 (the claim on n1 is kept), a download"
    home = plan([demands["ai/w"]], [nodes["n1"]], {})  # type: ignore[list-item]
    wake = after_plan(d, [w], home, nodes, {}, demands, sig).reports["ai/w"].idle.wake  # type: ignore[arg-type]
    assert wake is not None and (wake.node, wake.cost) == ("n1", "none")


# ---- the edges ----------------------------------------------------------------------


def test_a_stale_or_missing_reading_is_unknown() -> None:
    def read(at: float, activity: Activity | None) -> SpeedReading:
        return SpeedReading(at, Rates(), Totals(), activity=activity)
    got = fresh_readings({0: read(NOW - 10, Activity(idle_seconds=99)),
                          1: read(NOW - 200, Activity(idle_seconds=99)),
                          2: read(NOW, None)}, 4, NOW, 180.0)
    assert got == (Reading(0, 0, 99), None, None, None)


def test_a_stored_time_anyone_may_have_written_is_read_or_ignored() -> None:
    assert epoch(stamp(NOW)) == NOW
    assert epoch("yesterday") is None and epoch("") is None and epoch("2026-12-07T23:00") is None
    garbled = IdleStatus(state="Waking", since="soon", wake=IdleWake(wanted_at="whenever"))
    assert state(one(model(stored=garbled)))[0] == "Waking"


def test_the_same_signals_give_the_same_decisions() -> None:
    """A pass is a function of its inputs: a re-applied spec (an equal model)
    while asleep decides the very same (no wake, nothing asked)."""
    m = model(stored=ASLEEP_RELEASED, homes=(HOME,))
    again = model(stored=ASLEEP_RELEASED.model_copy(), homes=(HOME,))
    assert one(m) == one(again)
    assert state(one(again)) == ("Asleep", False, Reason.ASLEEP)


def test_a_sleep_eligible_model_left_without_a_node_waits_for_one_and_asks_a_yield() -> None:
    """Never Stalled while a node it may take could hold it: Waking,
    WaitingForNode, and the longest idle model is asked for its node."""
    nodes, the_plan, demands = cluster()
    w = model("ai/w", readings=(None,))  # new: never served
    a = model("ai/a", readings=(Reading(1, 0, 0),))
    b = model("ai/b", readings=(Reading(0, 0, 600),))
    sig = signals()
    d = decide([a, b, w], sig)
    out = after_plan(d, [a, b, w], the_plan, nodes, {}, demands, sig)  # type: ignore[arg-type]
    report = out.reports["ai/w"]
    assert (report.idle.state, report.awake) == ("Waking", Reason.WAITING_FOR_NODE)
    assert report.idle.wake is not None and report.idle.wake.wanted_at == stamp(NOW)
    assert [(c.model, c.reason, c.for_) for c in out.closes] == [("b", "yield", "ai/w")]
    # one whose pod still serves where the plan left it is awake, not waking
    serving = model("ai/w", readings=(None,), ready_on=("n9",))
    d2 = decide([a, b, serving], sig)
    out = after_plan(d2, [a, b, serving], the_plan, nodes, {}, demands, sig)  # type: ignore[arg-type]
    assert out.reports["ai/w"].idle.state == "Awake" and out.closes == ()
    # one no node could ever take (its selector matches none) stays as the plan says
    never = Plan((), (Unplaced("ai/w", 0, UnplacedReason.NO_MATCHING_NODE, "no node"),))
    out = after_plan(d, [a, b, w], never, nodes, {}, demands, sig)  # type: ignore[arg-type]
    assert out.reports["ai/w"].idle.state == "Awake" and out.closes == ()


def test_last_request_at_moves_in_steps_not_on_every_read() -> None:
    def read(idle_s: float) -> dict[int, SpeedReading]:
        return {0: SpeedReading(NOW, Rates(), Totals(), activity=Activity(idle_seconds=idle_s))}
    assert last_request(read(100), NOW, 180) == NOW - 100
    assert last_request(read(100), NOW + 200, 180) is None  # stale
    unknown = one(model(readings=(Reading(0, 0, 100),)))
    assert unknown.steps["ai/q"].idle.last_request_at == ""
    seen = IdleStatus(state="Awake", last_request_at=stamp(NOW - 600))
    near = IdleModel("ai/q", ON_DEMAND, ("q-0",), stored=seen, readings=(Reading(1, 0, 0),),
                     last_request=NOW - 400)
    assert one(near).steps["ai/q"].idle.last_request_at == stamp(NOW - 600)
    later = IdleModel("ai/q", ON_DEMAND, ("q-0",), stored=seen, readings=(Reading(1, 0, 0),),
                      last_request=NOW - 290)
    assert one(later).steps["ai/q"].idle.last_request_at == stamp((NOW - 290) // 60 * 60)


# ---- properties ---------------------------------------------------------------------

STATES = [None, IdleStatus(state="Awake", since=stamp(NOW - 50)),
          IdleStatus(state="Asleep", resident=True, since=stamp(NOW - 50)),
          ASLEEP_RELEASED,
          IdleStatus(state="Waking", resident=False, since=stamp(NOW - 50),
                     wake=IdleWake(wanted_at=stamp(NOW - 200), node="n2", reserved=True))]
READINGS = [None, QUIET, Reading(1, 0, 0), Reading(0, 2, 0), Reading(0, 0, 40)]


@st.composite
def worlds(draw: st.DrawFn) -> tuple[list[IdleModel], IdleSignals]:
    models, closes = [], []
    for i in range(draw(st.integers(1, 4))):
        replicas = draw(st.integers(1, 2))
        m = model(f"ai/m{i}", draw(st.sampled_from([ON_DEMAND, WHEN_ASLEEP])), replicas,
                  draw(st.sampled_from(STATES)),
                  tuple(draw(st.sampled_from(READINGS)) for _ in range(replicas)),
                  draw(st.sampled_from([(), (HOME,)])), draw(st.sampled_from([(), ("n1",)])))
        models.append(m)
        for r in range(replicas):
            if draw(st.booleans()):
                closes.append(closed(m, r, draw(st.sampled_from(list(CloseResult))),
                                     draw(st.sampled_from(["sleep", "yield", "reopen"])),
                                     NOW - draw(st.sampled_from([0, 10, 45, 100])),
                                     draw(st.sampled_from(["", "ai/m0", "ai/m1"])),
                                     draw(st.sampled_from(["", "n1", "n2"]))))
    held = {m.key: 1 for m in models if draw(st.booleans())}
    return models, signals(held=held, closes=tuple(closes),
                           router=draw(st.sampled_from([True, True, False])))


@settings(max_examples=300, deadline=None)
@given(worlds())
def test_no_close_is_asked_of_a_busy_model_and_only_closed_ones_are_released(
        world: tuple[list[IdleModel], IdleSignals]) -> None:
    models, sig = world
    d = decide(models, sig, pending=["ai/m0", "ai/plain"], plain=["ai/plain"])
    assert d == decide(models, sig, pending=["ai/m0", "ai/plain"], plain=["ai/plain"])
    for m in models:
        step = d.steps[m.key]
        busy = any(r is not None and (r.in_flight or r.queued) for r in m.readings)
        if busy:  # sleep and yield closes are never sent to a model seen serving
            assert all(a.reason == "reopen" for a in step.asks)
        if m.key in d.inputs.released:  # stored released (or waking, unwanted), or every
            stored = m.stored  # replica just closed
            was = stored is not None and stored.state in ("Asleep", "Waking") and not (
                stored.resident)
            answers = [sig.closes.get(f"ai/{pod}") for pod in m.pods]
            assert was or all(c is not None and c.result is CloseResult.CLOSED
                              and c.ask.reason != "reopen" for c in answers)
            assert (step.idle.state, step.idle.resident) == ("Asleep", False)
        if not sig.settings.router:  # nothing holds a request: nothing sleeps
            assert step.idle.state != "Asleep" or (m.key in d.inputs.released and (
                m.stored is not None and m.stored.state == "Asleep"))
            assert not any(a.reason == "sleep" for a in step.asks)
        IdleReport(step.idle, step.awake)  # every reason fits its state
    assert set(d.inputs.avoid) <= {"ai/m0", "ai/plain"}  # pending models only
