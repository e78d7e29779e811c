"""The Events and operator metrics of a model with spec.idle (events.py,
controller/operator_metrics.py `IdleCounters`): one per change of its idle
state, never repeated at rest; Yielded and YieldRefused from the answers to
closes; wakes counted home or elsewhere with their seconds."""

from __future__ import annotations

import pytest

from localmodel.api import (
    IdleLastWake,
    IdleStatus,
    IdleWake,
    LocalModelStatus,
)
from localmodel.controller.operator_metrics import IdleCounters
from localmodel.events import EventReason, close_event, fell_asleep, finished_wake, status_events
from localmodel.idle.asks import CloseAsk, Closed, CloseResult
from localmodel.idle_status import IdleReport, with_idle
from localmodel.status import Reason
from tests.controller.test_idle_conditions import NOW, SLEEPER, plain

pytestmark = pytest.mark.unit

LM = SLEEPER.obj()
AWAKE = IdleStatus(state="Awake", since=NOW)
ASLEEP_RESIDENT = IdleStatus(state="Asleep", since=NOW, resident=True)
ASLEEP_RELEASED = IdleStatus(state="Asleep", since=NOW, resident=False)
WAKING_HOME = IdleStatus(state="Waking", since=NOW, resident=False,
                         wake=IdleWake(held=2, node="small-0", cost="none"))
WAKING_AWAY = IdleStatus(state="Waking", since=NOW, resident=False,
                         wake=IdleWake(held=1, node="avx2-0",
                                       cost="new claim on avx2-0, download 1.1 GiB"))
WOKE_HOME = IdleStatus(state="Awake", since=NOW, wakes=1,
                       last_wake=IdleLastWake(seconds=14.2, node="small-0", warm_cache=True))
WOKE_AWAY = IdleStatus(state="Awake", since=NOW, wakes=1,
                       last_wake=IdleLastWake(seconds=95.0, node="avx2-0", warm_cache=False))
AWAKE_REASON = {"Awake": Reason.IDLE, "Asleep": Reason.ASLEEP, "Waking": Reason.WAKING}


def status(idle: IdleStatus | None, awake: Reason | None = None,
           message: str = "") -> LocalModelStatus:
    base = plain(LM, {0: idle is not None and idle.state == "Awake"})
    if idle is None:
        return base
    return with_idle(base, IdleReport(idle, awake or AWAKE_REASON[idle.state], message), LM, NOW)


def reasons(old: LocalModelStatus | None, new: LocalModelStatus) -> list[tuple[str, bool]]:
    return [(e.reason.value, e.warning) for e in status_events(old, new)
            if e.reason in IDLE_REASONS]


IDLE_REASONS = {EventReason.ASLEEP, EventReason.WAKING, EventReason.WOKE,
                EventReason.WOKE_ELSEWHERE, EventReason.WAITING_FOR_NODE}


def test_each_change_of_idle_state_is_one_event_and_rest_is_silent() -> None:
    awake, resident = status(AWAKE), status(ASLEEP_RESIDENT)
    released, waking = status(ASLEEP_RELEASED), status(WAKING_HOME)
    assert reasons(awake, resident) == [("Asleep", False)]
    [asleep] = [e for e in status_events(awake, released) if e.reason is EventReason.ASLEEP]
    assert "given back" in asleep.message
    assert reasons(released, waking) == [("Waking", False)]
    [wake] = [e for e in status_events(released, waking) if e.reason is EventReason.WAKING]
    assert wake.message == "waking on small-0 for 2 held request(s)"
    assert reasons(waking, status(WOKE_HOME)) == [("Woke", False)]
    for same in (awake, resident, released, waking, status(WOKE_HOME)):
        assert reasons(same, same) == []  # at rest: nothing


def test_a_wake_elsewhere_warns_with_its_cost() -> None:
    events = [e for e in status_events(status(WAKING_AWAY), status(WOKE_AWAY))
              if e.reason in IDLE_REASONS]
    assert [(e.reason, e.warning) for e in events] == [
        (EventReason.WOKE, False), (EventReason.WOKE_ELSEWHERE, True)]
    assert events[0].message == "woke on avx2-0 in 95.0 s, cold cache"
    assert "new claim on avx2-0, download 1.1 GiB" in events[1].message


def test_waiting_for_a_node_warns_once() -> None:
    waiting = status(WAKING_AWAY, Reason.WAITING_FOR_NODE, "small-0 is held by ai/embed")
    assert reasons(status(ASLEEP_RELEASED), waiting) == [("Waking", False),
                                                         ("WaitingForNode", True)]
    assert reasons(waiting, waiting) == []


def test_a_model_without_idle_tells_no_idle_event() -> None:
    assert reasons(None, status(None)) == [] and reasons(status(None), status(None)) == []


ASK = CloseAsk("ai", "batch", "batch-0", "yield", 30, for_="ai/chat", ip="10.0.0.9")


@pytest.mark.parametrize(("result", "reason"), [
    (CloseResult.CLOSED, EventReason.YIELDED),
    (CloseResult.BUSY, EventReason.YIELD_REFUSED),
    (CloseResult.UNREACHABLE, None),
    (CloseResult.FORBIDDEN, None),
    (CloseResult.BAD, None),
])
def test_answers_to_a_yield_tell_yielded_or_refused(result: CloseResult,
                                                    reason: EventReason | None) -> None:
    event = close_event(Closed(ASK, result, 1.0, in_flight=2))
    assert (event.reason if event else None) == reason
    if event is not None:
        assert "ai/chat" in event.message and not event.warning


def test_a_sleep_closed_is_no_yield_and_a_busy_sleep_is_refused() -> None:
    sleep = CloseAsk("ai", "chat", "chat-0", "sleep", 1800)
    assert close_event(Closed(sleep, CloseResult.CLOSED, 1.0)) is None
    refused = close_event(Closed(sleep, CloseResult.BUSY, 1.0, in_flight=1, queued=3))
    assert refused is not None and "1 in flight, 3 queued" in refused.message


def test_the_counters_follow_sleeps_and_wakes_home_or_elsewhere() -> None:
    counters = IdleCounters()
    awake, asleep = status(AWAKE), status(ASLEEP_RELEASED)
    counters.transition(LM.key, awake, asleep)
    counters.transition(LM.key, asleep, asleep)  # at rest: nothing
    counters.transition(LM.key, status(WAKING_HOME), status(WOKE_HOME))
    counters.transition(LM.key, status(WAKING_AWAY), status(WOKE_AWAY))
    assert counters.sleeps.value() == 1
    ns, name = LM.key.split("/")
    assert counters.wakes.value((ns, name, "home")) == 1
    assert counters.wakes.value((ns, name, "elsewhere")) == 1
    samples = list(counters.wake_seconds.samples())
    assert "localmodel_operator_wake_seconds_count 2" in samples
    assert "localmodel_operator_wake_seconds_sum 109.2" in samples
    assert fell_asleep(awake, asleep) and not fell_asleep(asleep, asleep)
    assert finished_wake(status(WAKING_HOME), status(WOKE_HOME)) is not None


def test_every_idle_event_is_in_the_operators_docs() -> None:
    from tests.harness.tools import REPO_ROOT

    text = (REPO_ROOT / "docs" / "operator.md").read_text()
    for reason in (*IDLE_REASONS, EventReason.YIELDED, EventReason.YIELD_REFUSED):
        assert f"| `{reason.value}` |" in text, reason
