"""The gateway's door: the idle signal it serves in /speed (`activity`), and
its close, which the operator asks for before it gives this replica's node to
another model (docs/gateway.md, Sleep and yield). Pure but for the clock.

**Activity.** Only slot routes count (generation, chat, embeddings): never
listings, /slots, /speed, /metrics or probes, so a poller keeps nothing
awake. `in_flight` is every slot request from its arrival to its end (queued
ones and those whose body is being read included), `queued` those of them
waiting for a slot, `arrived` every slot request since the start (those a
closed door refused included: each is a wish to wake), `idle_seconds` the
time since the later of the last admitted arrival and the last end (or the
start), on the gateway's monotonic clock; 0 while one is in flight.

**The close** (`POST /yield`, admin port, signed: gateway/server.py) is
decided in one synchronous step, `Door.decide`: with nothing in flight,
nothing queued and idle for at least `idle_at_least` seconds it closes (200),
else it refuses and says why (409). An arrival is counted, or refused because
the door is closed, in one synchronous step too (`Door.arrive`): on the one
event loop, either the close came first and the request is refused before
any byte goes to the engine, or the request came first and the close is
refused. The close is a lease: without a renewing call within `lease_s` it
reopens by itself, so an operator that crashed mid-yield never leaves a live
pod refusing work. `reopen` opens at once.
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from localmodel.gateway_contract.headers import ASLEEP_RETRY_AFTER_S
from localmodel.gateway_contract.marks import MARK_WINDOW_S

# The longest idle time a close can ask for: spec.idle.after's bound (7 days).
MAX_IDLE_AT_LEAST = 7 * 86400
MAX_YIELD_BODY = 256  # bytes of a yield call's body read at all
SEEN_MARKS = 1024  # yield marks remembered against replay (each valid one only)


class Reason(StrEnum):
    """Why the operator calls: to sleep, to yield the node to another model, or
    to undo a close."""

    SLEEP = "sleep"
    YIELD = "yield"
    REOPEN = "reopen"


@dataclass(frozen=True)
class YieldCall:
    """A `POST /yield` body, parsed: the reason and the idle time asked for."""

    reason: Reason
    idle_at_least: int  # whole seconds


class BadYield(ValueError):
    """A yield body that is not `{"reason": ..., "idle_at_least": seconds}`."""


def parse_yield(raw: bytes) -> YieldCall:
    """The body of a yield call; BadYield naming what is wrong. `idle_at_least`
    is a whole number of seconds, 0 to MAX_IDLE_AT_LEAST (optional for reopen)."""
    if len(raw) > MAX_YIELD_BODY:
        raise BadYield(f"longer than {MAX_YIELD_BODY} bytes")
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise BadYield("not JSON") from None
    if not isinstance(doc, dict) or set(doc) - {"reason", "idle_at_least"}:
        raise BadYield('expected {"reason": ..., "idle_at_least": seconds} and nothing else')
    reason = doc.get("reason")
    if reason not in tuple(Reason):
        raise BadYield(f"reason must be one of {', '.join(Reason)}")
    value = doc.get("idle_at_least", 0 if reason == Reason.REOPEN else None)
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not 0 <= value <= MAX_IDLE_AT_LEAST or not float(value).is_integer()):
        raise BadYield(f"idle_at_least must be whole seconds from 0 to {MAX_IDLE_AT_LEAST}")
    return YieldCall(Reason(reason), int(value))


class SeenMarks:
    """Keeps the yield marks already taken, until they could no longer verify,
    so each is taken once (a replay within the marks' window is refused)."""

    def __init__(self, window: float = MARK_WINDOW_S, limit: int = SEEN_MARKS) -> None:
        self.window = window
        self.limit = limit
        self._seen: OrderedDict[str, float] = OrderedDict()  # mark -> wall time taken

    def take(self, mark: str, now: float) -> bool:
        """True the first time `mark` (already verified; its canonical form,
        marks.signed_message) is taken; False after."""
        while self._seen:
            first, at = next(iter(self._seen.items()))
            if now - at <= 2 * self.window and len(self._seen) < self.limit:
                break
            del self._seen[first]
        if mark in self._seen:
            return False
        self._seen[mark] = now
        return True


@dataclass(frozen=True)
class Verdict:
    """The answer to a yield call: its status and body."""

    status: int
    body: dict[str, Any]


class Door:
    """Keeps this gateway's slot requests (in flight, arrived, when it was last
    busy) and whether it is closed, and decides each close."""

    def __init__(self, lease_s: float, queued: Callable[[], int],
                 clock: Callable[[], float]) -> None:
        self.lease_s = lease_s
        self._queued = queued
        self._clock = clock
        self.in_flight = 0
        self.arrived = 0
        self._last_busy = clock()  # the later of the last admitted arrival and the last end
        self._closed_until: float | None = None

    @property
    def closed(self) -> bool:
        """Closed now (a lease that ran out has reopened it)."""
        until = self._closed_until
        if until is not None and self._clock() >= until:
            self._closed_until = until = None
        return until is not None

    def idle_seconds(self) -> float:
        return 0.0 if self.in_flight else max(0.0, self._clock() - self._last_busy)

    def arrive(self) -> bool:
        """A slot request arrived: counted in flight (True), or refused because
        the door is closed (False: answer it asleep, and do not `end` it)."""
        self.arrived += 1
        if self.closed:
            return False
        self.in_flight += 1
        self._last_busy = self._clock()
        return True

    def end(self) -> None:
        """A request `arrive` counted has ended."""
        self.in_flight -= 1
        self._last_busy = self._clock()

    def decide(self, call: YieldCall) -> Verdict:
        """Close (or renew the close) when nothing is in flight or queued and
        it has been idle long enough; refuse with the counts otherwise;
        `reopen` opens. One synchronous step: nothing can arrive in between."""
        if call.reason is Reason.REOPEN:
            self._closed_until = None
            return Verdict(200, {"closed": False})
        queued, idle = self._queued(), self.idle_seconds()
        if self.in_flight or queued or idle < call.idle_at_least:
            return Verdict(409, {"in_flight": self.in_flight, "queued": queued,
                                 "idle_seconds": _seconds(idle)})
        self._closed_until = self._clock() + self.lease_s
        return Verdict(200, {"closed": True, "lease_seconds": _seconds(self.lease_s)})

    def activity(self) -> dict[str, Any]:
        """The `activity` of GET /speed."""
        return {"in_flight": self.in_flight, "queued": self._queued(), "arrived": self.arrived,
                "idle_seconds": _seconds(self.idle_seconds()), "closed": self.closed}

    def asleep_message(self, model: str) -> str:
        """What a refused caller reads."""
        return (f"{model or 'this model'} is asleep (its gateway is closed while its node "
                "goes to other work); a request through the router is held while it wakes, "
                f"or retry after {ASLEEP_RETRY_AFTER_S} s")


def _seconds(value: float) -> float:
    return round(value, 3) if math.isfinite(value) else 0.0
