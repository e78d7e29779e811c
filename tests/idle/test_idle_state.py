"""The idle states and their moves (Awake -> Asleep, resident or released ->
Waking -> Awake), and `due_to_sleep`: every replica quiet for `after`, nothing
held at a router, outside the awake windows."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localmodel.idle import (
    AWAKE,
    Event,
    IdlePolicy,
    Phase,
    Reading,
    Release,
    State,
    Window,
    advance,
    due_to_sleep,
    quiet_for,
)

pytestmark = pytest.mark.unit

NOON = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)  # a Monday
POLICY = IdlePolicy(after_s=1800)
QUIET = Reading(in_flight=0, queued=0, idle_seconds=1800)

RESIDENT = Phase(State.ASLEEP, resident=True)
RELEASED = Phase(State.ASLEEP, resident=False)
WAKING = Phase(State.WAKING, resident=False)


@pytest.mark.parametrize(
    ("readings", "held", "due"),
    [
        ([QUIET], 0, True),
        ([QUIET, QUIET], 0, True),
        ([QUIET, Reading(1, 0, 5000)], 0, False),  # a stream in flight on one replica
        ([Reading(0, 1, 5000)], 0, False),  # a request queued
        ([Reading(0, 0, 1799.9)], 0, False),  # not idle for `after` yet
        ([QUIET, None], 0, False),  # a replica not read yet
        ([], 0, False),  # no replicas: nothing to say it is idle
        ([QUIET], 1, False),  # a request held for it at a router
    ],
)
def test_a_model_is_due_to_sleep_only_when_every_replica_is_quiet_and_nothing_is_held(
    readings: list[Reading | None], held: int, due: bool
) -> None:
    assert due_to_sleep(POLICY, readings, held, NOON) is due


def test_an_awake_window_keeps_a_quiet_model_awake_and_after_it_after_applies_again() -> None:
    office = IdlePolicy(after_s=60, windows=(Window.of("08:00", "18:00", "UTC"),))
    assert not due_to_sleep(office, [QUIET], 0, NOON)
    assert due_to_sleep(office, [QUIET], 0, datetime(2026, 12, 7, 18, 0, tzinfo=UTC))


def test_quiet_is_one_definition_for_sleep_and_yield() -> None:
    assert quiet_for([Reading(0, 0, 30)], 30) and not quiet_for([Reading(0, 0, 29)], 30)
    assert not quiet_for([Reading(1, 0, 10_000)], 0)


def test_a_policy_needs_a_positive_after() -> None:
    with pytest.raises(ValueError):
        IdlePolicy(after_s=0)
    assert IdlePolicy(after_s=60).release is Release.ON_DEMAND


@pytest.mark.parametrize(
    ("start", "event", "end"),
    [
        (AWAKE, Event.SLEPT, RESIDENT),
        (AWAKE, Event.RELEASED, RELEASED),  # WhenAsleep, or yielded while awake
        (RESIDENT, Event.RELEASED, RELEASED),  # yielded while asleep
        (RESIDENT, Event.ACTIVE, AWAKE),  # served at once: its pods are there
        (RESIDENT, Event.WANTED, AWAKE),
        (RELEASED, Event.WANTED, WAKING),
        (WAKING, Event.READY, AWAKE),
        (WAKING, Event.UNWANTED, RELEASED),  # its held requests ended, no window
    ],
)
def test_the_moves_between_states(start: Phase, event: Event, end: Phase) -> None:
    moved = advance(start, event, now=42.0)
    assert (moved.state, moved.resident) == (end.state, end.resident)
    assert moved.since == 42.0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(list(Event)), max_size=30))
def test_every_sequence_of_events_keeps_the_states_consistent(events: list[Event]) -> None:
    """Awake is always resident, Waking never is; an event that moves nothing
    returns the very phase (its `since` stays); Waking is reached only from a
    released sleeper, and Awake from Waking only by a Ready replica."""
    phase = AWAKE
    for i, event in enumerate(events):
        moved = advance(phase, event, now=float(i + 1))
        assert moved.state is not State.AWAKE or moved.resident
        assert moved.state is not State.WAKING or not moved.resident
        if moved is phase:
            continue
        assert moved.since == i + 1
        if moved.state is State.WAKING:
            assert (phase.state, phase.resident, event) == (State.ASLEEP, False, Event.WANTED)
        if phase.state is State.WAKING and moved.state is State.AWAKE:
            assert event is Event.READY
        phase = moved


def test_an_event_that_moves_nothing_keeps_the_phase() -> None:
    for start, event in [(AWAKE, Event.WANTED), (AWAKE, Event.READY), (RELEASED, Event.ACTIVE),
                         (WAKING, Event.WANTED), (RELEASED, Event.SLEPT)]:
        assert advance(start, event, now=9.0) is start
