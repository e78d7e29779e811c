"""One request, start to end: its deadline, its place counted against the
queue (a full queue refuses it before its body is read), its body read in time
and parsed (a few at a time, --body-reads: gateway/intake.py, with the API
key's check), the pure rewrite, a slot (or a
place in the queue, or the overflow endpoint), the upstream exchange, and at
the end its record: metrics and one log line.

Each step either passes its result on or answers the caller at once, raising
`intake.Answered` with the outcome already recorded; `Pipeline.handle` is the one
place that turns what escapes (a caller gone, a shutdown, a bug) into an
outcome, and that gives the slot back.
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from aiohttp import web

from localmodel.gateway.body import Exchange
from localmodel.gateway.door import Door
from localmodel.gateway.intake import Answered, BodyIntake, CallerKeys, Deadline, answer
from localmodel.gateway.keys import KeyRing
from localmodel.gateway.ledger import (
    MAX_ID,
    Ledger,
    Sessions,
    identify,
)
from localmodel.gateway.metrics import GatewayMetrics
from localmodel.gateway.overflow_client import OverflowClient, Overflowed, OverflowTry
from localmodel.gateway.owned import OwnedSessions, RouterMarks
from localmodel.gateway.queueing import SlotQueue
from localmodel.gateway.record import Outcome, RequestRecord, ledger_entry, log_line
from localmodel.gateway.relay import Relay
from localmodel.gateway.rewrite import (
    BadRequest,
    request_deadline,
)
from localmodel.gateway.routes import Route
from localmodel.gateway.slots import Admission, Priority, parse_priority
from localmodel.gateway_contract import GatewayConfig
from localmodel.gateway_contract.headers import (
    ASLEEP,
    ASLEEP_RETRY_AFTER_S,
    ASLEEP_VALUE,
    CALLER_HEADER,
    MAX_ROUTED,
    ROUTE_HEADER,
    SESSION_HEADER,
)
from localmodel.gateway_contract.replies import error_response
from localmodel.printable import printable

REQUEST_ID = web.RequestKey("request_id", str)
SERVED_BY = web.RequestKey("served_by", str)


@dataclass
class _Slot:
    """The slot a request holds (ticket 0: none), given back when it ends, and
    the place counted for it while its body is read (`reserved`)."""

    ticket: int = 0
    reserved: bool = False
    counted: bool = False  # counted in the door's activity (gateway/door.py)


class Pipeline:
    """Decides each request's way through the gateway, step by step, and keeps
    what the steps share: the requests in flight, the sessions owned here,
    the record each request ends with."""

    def __init__(
        self,
        config: GatewayConfig,
        queue: SlotQueue,
        relay: Relay,
        overflow: OverflowClient | None,
        metrics: GatewayMetrics,
        access_log: Callable[[str], None],
        clock: Callable[[], float],
        ledger: Ledger | None = None,
        wall: Callable[[], float] = time.time,
        keys: Callable[[], KeyRing] | None = None,
        *,
        door: Door,
    ) -> None:
        self.config = config
        self.door = door  # slot requests' activity and the close (POST /yield)
        # API keys (--keys-file), or None: off.
        self.callers = CallerKeys(keys) if keys is not None else None
        self.ledger = ledger
        # Sessions' last prompts, for the rewrite check: with the ledger only.
        self.sessions = Sessions() if ledger is not None else None
        # The sessions routers sent here as their owner (listed in /slots).
        self.owned = OwnedSessions(clock=clock)
        self.marks = RouterMarks.of(config)  # which of them the router did send
        self._wall = wall
        self.queue = queue
        self.relay = relay
        self.overflow = overflow
        self.metrics = metrics
        self._access_log = access_log
        self._clock = clock
        self.in_flight = 0  # requests being handled now, any route
        self.unexpected_errors = 0
        self.closing = False  # the gateway is shutting down
        self.intake = BodyIntake(config, self.sessions, metrics)

    async def handle(self, request: web.Request, route: Route) -> web.StreamResponse:
        rec = self._record(request, route)
        slot = _Slot()
        self.in_flight += 1
        try:
            return await self._serve(request, route, rec, slot)
        except Answered as answered:
            return answered.response
        except asyncio.CancelledError:
            if self.closing:
                rec.finish(Outcome.SHUTDOWN, 499, "gateway shutting down")
            else:
                rec.gone(self._clock())
                rec.finish(Outcome.CANCELLED_DISCONNECT, 499, "caller disconnected")
            raise
        except ConnectionError:
            # Whatever escaped on the caller's side: it is gone.
            rec.gone(self._clock())
            rec.finish(Outcome.CANCELLED_DISCONNECT, 499, "caller disconnected")
            return error_response(499, "caller disconnected", openai=route.is_openai)
        except Exception as exc:
            self.unexpected_errors += 1
            rec.finish(Outcome.INTERNAL_ERROR, 500, f"{type(exc).__name__}: {exc}")
            print(f"gateway: unexpected error in {route.path}: {printable(repr(exc), 1024)}",
                  file=sys.stderr)
            return error_response(500, "internal gateway error", openai=route.is_openai)
        finally:
            self._end(rec, slot)

    def _record(self, request: web.Request, route: Route) -> RequestRecord:
        rec = RequestRecord(
            # The caller's id as the log, the ledger and the echo show it.
            request_id=printable(request.headers.get("X-Request-Id") or "", MAX_ID)
            or uuid.uuid4().hex[:16],
            route=route.path,
            priority=parse_priority(request.headers.get("X-Priority")).value,
            start=self._clock(),
        )
        request[REQUEST_ID] = rec.request_id
        headers = request.headers
        rec.caller, rec.session = identify(headers.get(CALLER_HEADER), headers.get(SESSION_HEADER))
        # Only a generation turn can make its session owned here.
        rec.owned = self.marks.owned(headers) if route.streams else None
        rec.routed = printable(headers.get(ROUTE_HEADER) or "", MAX_ROUTED) or None
        rec.wake_wait = self.marks.woke(headers)  # only with the router's signed mark
        rec.arrival = self._wall()
        return rec

    def _end(self, rec: RequestRecord, slot: _Slot) -> None:
        if self.callers is not None:
            self.callers.release(rec)
        if slot.counted:
            self.door.end()
        if slot.reserved:
            self.queue.unreserve()
        if slot.ticket:
            if self.queue.holds(slot.ticket):
                rec.slot_released_at = self._clock()
                self.queue.release(slot.ticket)
            rec.behind = self.queue.behind(slot.ticket)
        self.in_flight -= 1
        rec.end = self._clock()
        self.metrics.record(rec)
        if self.ledger is not None:
            self.ledger.add(ledger_entry(rec))
        if 200 <= rec.status < 300:  # a turn this replica served
            self.owned.touch(rec.owned)
        if self.sessions is not None and rec.rewrite is not None and rec.session is not None:
            total = rec.timing.prompt_total if rec.timing is not None else None
            self.sessions.read((rec.caller, rec.session), rec.turn, total)
        self._access_log(log_line(rec, datetime.now(UTC).isoformat(timespec="milliseconds")))

    async def _serve(
        self, request: web.Request, route: Route, rec: RequestRecord, slot: _Slot
    ) -> web.StreamResponse:
        if self.callers is not None:
            self.callers.authenticate(request, rec)
        if route.uses_slot:
            self._enter(rec, slot)  # no await before it: see gateway/door.py
        deadline = self._deadline(request, rec)
        if route.reads_body:
            self._admit(route, rec, slot)  # metadata (/api/show) keeps its place to the end
        raw, prepared = await self.intake.read(request, route, rec, deadline)
        if route.uses_slot:
            overflowed = await self._take_slot(route, raw, rec, deadline, slot)
            if overflowed is not None:
                return await self._from_overflow(request, route, overflowed, rec, deadline)
        ex = Exchange(route, rec)
        work = self.relay.local(request, prepared, ex)
        return await self.relay.guarded(ex, deadline.seconds, work, deadline.at)

    # ---- the steps -----------------------------------------------------------

    def _enter(self, rec: RequestRecord, slot: _Slot) -> None:
        """Count a slot request in the door's activity, or refuse it (503,
        asleep) because the door is closed: before any byte goes to the engine."""
        slot.counted = self.door.arrive()
        if not slot.counted:
            raise answer(rec, Outcome.ASLEEP, 503, "asleep",
                         self.door.asleep_message(self.config.model),
                         {ASLEEP: ASLEEP_VALUE, "Retry-After": str(ASLEEP_RETRY_AFTER_S)})

    def _deadline(self, request: web.Request, rec: RequestRecord) -> Deadline:
        try:
            seconds = request_deadline(
                request.headers.get("X-Request-Timeout"), self.config.deadline
            )
        except BadRequest as exc:
            raise answer(rec, Outcome.BAD_REQUEST, 400, str(exc)) from None
        return Deadline(seconds, asyncio.get_running_loop().time() + seconds)

    def _admit(self, route: Route, rec: RequestRecord, slot: _Slot) -> None:
        """Count the request against the queue before its body is read: a full
        queue (or, for background, no slot) refuses it now. With an overflow
        endpoint a full queue still reads a slot route's body: the overflow may
        take it (never a metadata body)."""
        admission = self.queue.reserve(Priority(rec.priority))
        if admission is Admission.QUEUED:
            slot.reserved = True
        elif (admission is Admission.REJECTED_BUSY or self.overflow is None
              or not route.uses_slot):
            raise self._refuse(rec, admission)

    async def _take_slot(
        self, route: Route, raw: bytes, rec: RequestRecord, deadline: Deadline, slot: _Slot
    ) -> Overflowed | None:
        """Hold a slot (None), or the overflow endpoint's answer instead."""
        priority = Priority(rec.priority)
        reserved, slot.reserved = slot.reserved, False
        admission, ticket = self.queue.request(priority, (rec.caller, priority.value), reserved)
        slot.ticket = ticket  # 0 when rejected; holds a slot only once granted
        if admission is Admission.REJECTED_BUSY:
            raise self._refuse(rec, admission)
        if admission is not Admission.ADMITTED:
            rec.queued_at = rec.start
            overflowed = await self._wait(route, raw, rec, ticket, deadline)
            if overflowed is not None:
                return overflowed
            if not ticket:
                raise self._refuse(rec, Admission.REJECTED_QUEUE_FULL)
        rec.slot_at = self._clock()
        return None

    def _refuse(self, rec: RequestRecord, admission: Admission) -> Answered:
        """The answer to a request the slots and the queue cannot take."""
        if admission is Admission.REJECTED_BUSY:
            return answer(
                rec, Outcome.REJECTED_BUSY, 429, "no free slot",
                "no free slot; background requests are not queued", self._retry_after(),
            )
        return answer(
            rec, Outcome.REJECTED_QUEUE_FULL, 503, "queue full",
            f"queue full ({self.config.max_queue} waiting){self._not_overflowed(rec)}",
            self._retry_after(),
        )

    async def _wait(
        self, route: Route, raw: bytes, rec: RequestRecord, ticket: int, deadline: Deadline
    ) -> Overflowed | None:
        """Wait in the queue (ticket 0: the queue is full), racing the overflow."""
        attempt: OverflowTry | None = None
        if self.overflow is not None:
            attempt = self.overflow.attempt_for(route, raw, rec)
        try:
            return await self.queue.wait(ticket, deadline.at, attempt)
        except TimeoutError:
            message = f"deadline of {deadline.seconds:g}s passed while queued"
            message += self._not_overflowed(rec)
            raise answer(rec, Outcome.CANCELLED_DEADLINE, 504, message) from None

    async def _from_overflow(
        self,
        request: web.Request,
        route: Route,
        overflowed: Overflowed,
        rec: RequestRecord,
        deadline: Deadline,
    ) -> web.StreamResponse:
        request[SERVED_BY] = rec.served_by = "overflow"
        ex = Exchange(route, rec, upstream=overflowed.upstream)
        work = self.relay.body.overflow(request, overflowed.plan, ex)
        return await self.relay.guarded(ex, deadline.seconds, work, deadline.at)

    def _not_overflowed(self, rec: RequestRecord) -> str:
        """Why a request that could have overflowed did not, when it was the
        caller's budget or key (an error the caller can act on)."""
        if self.overflow is None:
            return ""
        return self.overflow.refusal(rec)

    def _retry_after(self) -> dict[str, str]:
        return self.queue.retry_after(self.metrics.mean_slot_seconds)
