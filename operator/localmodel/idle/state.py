"""A model's idle state and its moves: Awake -> Asleep (resident, or released)
-> Waking -> Awake; and `due_to_sleep`, the hint that a model may sleep.

Pure: the shell passes what it read (each replica's last `/speed` activity as a
`Reading`, the router-held requests, the time) and the events it saw; nothing
here reads a clock. The gateway decides a close on its own counts at the
moment of the close (a signed `POST /yield`): `due_to_sleep` only says when to
ask.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum

from localmodel.idle.schedule import Window, is_awake_window


class Release(StrEnum):
    """When an asleep model's pods leave their nodes (`spec.idle.release`)."""

    ON_DEMAND = "OnDemand"  # asleep but resident until another model needs the node
    WHEN_ASLEEP = "WhenAsleep"  # deleted as it falls asleep


@dataclass(frozen=True)
class IdlePolicy:
    """A model's `spec.idle`, as the pure core reads it (the operator builds it
    from the spec): idle for `after_s` seconds it may sleep; it yields only to
    a waker of at least its `priority` while within `after_s`; `windows` keep it
    awake."""

    after_s: float
    priority: int = 0
    release: Release = Release.ON_DEMAND
    windows: tuple[Window, ...] = ()

    def __post_init__(self) -> None:
        if self.after_s <= 0:
            raise ValueError(f"after must be positive, not {self.after_s} s")


@dataclass(frozen=True)
class Reading:
    """One replica's last activity (`/speed` `activity`): requests in flight,
    queued, and seconds since the later of the last arrival and the last end."""

    in_flight: int
    queued: int
    idle_seconds: float


def quiet_for(readings: Sequence[Reading | None], seconds: float) -> bool:
    """Whether every replica (at least one) has a reading, and each shows no
    request in flight, none queued, and idle for at least ``seconds``: the one
    definition of "quiet" that sleeping and yielding both ask."""
    return bool(readings) and all(
        r is not None and r.in_flight == 0 and r.queued == 0 and r.idle_seconds >= seconds
        for r in readings
    )


def due_to_sleep(
    policy: IdlePolicy, readings: Sequence[Reading | None], held: int, now: datetime
) -> bool:
    """Whether to ask the model's gateways to let it sleep: every replica
    quiet for `after`, no request held for it at a router, outside its awake
    windows. A hint: the gateway answers on its own counts."""
    return held == 0 and quiet_for(readings, policy.after_s) and not is_awake_window(
        policy.windows, now
    )


class State(StrEnum):
    """`status.idle.state`."""

    AWAKE = "Awake"
    ASLEEP = "Asleep"
    WAKING = "Waking"


class Event(StrEnum):
    """What the shell saw happen to a model."""

    SLEPT = "Slept"  # due to sleep, `OnDemand`: asleep, its pods stay (resident)
    RELEASED = "Released"  # its gateways answered 200 closed and its pods went (sleep or yield)
    WANTED = "Wanted"  # a request held for it, or an awake window began
    UNWANTED = "Unwanted"  # waking, but nothing wants it any more (held requests ended)
    ACTIVE = "Active"  # a reading shows a request: a resident sleeper served one
    READY = "Ready"  # a replica is Ready


@dataclass(frozen=True)
class Phase:
    """Where a model is: its state, whether its pods hold their nodes
    (`resident`: always while awake; asleep, only under `OnDemand` until it
    yields), and since when (the shell's clock, seconds)."""

    state: State = State.AWAKE
    resident: bool = True
    since: float = 0.0


AWAKE = Phase()


def advance(phase: Phase, event: Event, now: float) -> Phase:
    """The phase after ``event``; the same phase (the very object) when the
    event moves nothing from here:

    ==================  ==========  ===================
    from                event       to
    ==================  ==========  ===================
    Awake               Slept       Asleep, resident
    Awake               Released    Asleep, released
    Asleep, resident    Released    Asleep, released
    Asleep, resident    Active      Awake
    Asleep, resident    Wanted      Awake (its pods serve at once)
    Asleep, released    Wanted      Waking
    Waking              Ready       Awake
    Waking              Unwanted    Asleep, released
    ==================  ==========  ===================
    """
    state, resident = phase.state, phase.resident
    to: tuple[State, bool] | None = None
    if state is State.AWAKE:
        to = {Event.SLEPT: (State.ASLEEP, True), Event.RELEASED: (State.ASLEEP, False)}.get(event)
    elif state is State.ASLEEP and resident:
        to = {
            Event.RELEASED: (State.ASLEEP, False),
            Event.ACTIVE: (State.AWAKE, True),
            Event.WANTED: (State.AWAKE, True),
        }.get(event)
    elif state is State.ASLEEP:
        to = (State.WAKING, False) if event is Event.WANTED else None
    else:  # waking
        to = {Event.READY: (State.AWAKE, True), Event.UNWANTED: (State.ASLEEP, False)}.get(event)
    if to is None:
        return phase
    return replace(phase, state=to[0], resident=to[1], since=now)
