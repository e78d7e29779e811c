"""Requests held for a sleeping model (docs/router.md, Sleeping models).

A model that may sleep (`spec.idle`, router/cluster.py) with no Ready
replica, or whose replica answered `503` with `X-LocalModel-Asleep: 1` (its
gateway closed for sleep before its engine saw a byte), has the request held
here instead of refused: the router already keeps the caller's bytes
(router/wanted.py), and the request keeps its admission place (--places)
while it waits. A model that is off (`spec.replicas: 0`) is never held: 503
at once, with that reason. A keyed model with no replica is not held either:
without a replica no one can check the caller's key, and a request whose key
is not checked must not count as a wish to wake.

Bounds: at most --hold-per-model requests per model (past it 503 with
Retry-After, naming the bound); each waits until its deadline, the least of
the caller's X-Request-Timeout (what is left of it), the model's
`spec.idle.holdSeconds` and the router's --deadline, then 503 with
Retry-After (the model's last wake time less what it waited, at least 1 s)
and the reason its status gives (`status.idle.wake.message`). A caller that
leaves is dropped at once (aiohttp cancels its handler).

Order: one model's held requests go on in arrival order, one at a time until
each is sent (`Holding.sent`), through the router's normal decision
(sessions keep their owners); a request arriving while others wait joins the
end. A replica that answered asleep is not tried again by that request
until RETRY_CLOSED_S passed (its gateway's close is a lease that may lapse)
or the model's route changed (a replica came or went, its status moved); a
request goes as soon as its model has a Ready replica it may try. The
route table is looked at again on every change a source tells (ClusterSource
`listen`) and at least every RECHECK_S.

`GET /waiting` (gateway_contract/waiting_answer.py) reads `waiting()`:
which models have requests held, how many, how long; `serial` changes with
what is held. The operator reads it to wake them; the router writes nothing
to the API.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import math
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from aiohttp import web
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from localmodel.gateway_contract.headers import (
    MAX_WOKE_MS,
    MAX_WOKE_REQUEST_ID,
    REQUEST_ID_HEADER,
    WOKE_HEADER,
    WOKE_MARK_HEADER,
)
from localmodel.gateway_contract.marks import sign_woke
from localmodel.gateway_contract.waiting_answer import (
    MAX_SERIAL,
    MAX_WAIT_S,
    WaitingModel,
    waiting_document,
)
from localmodel.router.metrics import RouterMetrics
from localmodel.router.table import HOLD_SECONDS, ModelRoute, Replica, RouteTable

RECHECK_S = 1.0  # the table looked at again at least this often while a request is held
RETRY_CLOSED_S = 5.0  # a replica that answered asleep is tried again after this
DEFAULT_WAKE_S = 30.0  # a wake's time for Retry-After when the status says none
MAX_POLLERS = 32  # /waiting long polls waiting at once; past them, answered at once

RouteKey = tuple[str, str]  # (namespace, served name): a route's identity in the table


class Refused(Exception):
    """A held request answered without a replica: its status, message and Retry-After."""

    def __init__(self, status: int, message: str, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.retry_after = status, message, retry_after

    @property
    def headers(self) -> dict[str, str]:
        return {} if self.retry_after is None else {"Retry-After": str(self.retry_after)}


# ---- pure: who is held, until when, and what they are told ------------------------------


def key_of(route: ModelRoute) -> RouteKey:
    return route.namespace, route.name


def refusal(route: ModelRoute) -> Refused | None:
    """Why a request for a model with no Ready replica is answered at once
    rather than held; None when it is held (it may sleep, is on, asks for no key)."""
    if route.idle is None:  # never sleeps: as before sleep existed
        return Refused(503, f"model {route.qualified} has no Ready replica")
    if route.wanted == 0:
        return Refused(503, f"model {route.qualified} is off (spec.replicas: 0)")
    if route.keyed:
        return Refused(503, f"model {route.qualified} is asleep and asks for API keys; with "
                            "no replica to check the key, the router does not hold the request",
                       retry_after(route, 0.0))
    return None


def hold_seconds(route: ModelRoute) -> float:
    return route.idle.hold_seconds if route.idle is not None else HOLD_SECONDS


def caller_timeout(header: str | None) -> float | None:
    """X-Request-Timeout in seconds when it is one (> 0, finite); None
    otherwise (the gateway refuses a bad one itself)."""
    if header is None:
        return None
    try:
        value = float(header[:64])
    except ValueError:
        return None
    return value if 0 < value < math.inf else None


def deadline_at(started: float, now: float, route: ModelRoute, timeout: float | None,
                router_deadline: float) -> float:
    """When a request held from `now` stops waiting: the least of what is left
    of the caller's timeout (counted from `started`), the model's hold and the
    router's --deadline."""
    left = [now + hold_seconds(route), now + router_deadline]
    if timeout is not None:
        left.append(started + timeout)
    return min(left)


def retry_after(route: ModelRoute, waited: float) -> int:
    """Seconds until the model may answer: its last wake's time less what was
    waited (DEFAULT_WAKE_S when unknown), at least 1."""
    wake = route.idle.last_wake_seconds if route.idle is not None else None
    expected = DEFAULT_WAKE_S if wake is None else wake
    return max(1, math.ceil(expected - waited))


def expired(route: ModelRoute, waited: float, allowed: float) -> Refused:
    """A held request's deadline (`allowed` seconds after it arrived)
    passed: 503, Retry-After, and the status's reason."""
    shown = f"{allowed:.0f}" if allowed >= 10 else f"{allowed:.1f}".rstrip("0").rstrip(".")
    message = f"{route.resource} did not wake within {shown} s"
    if route.idle is not None and route.idle.wake_message:
        message += f": {route.idle.wake_message}"
    return Refused(503, message, retry_after(route, waited))


def full(route: ModelRoute, bound: int) -> Refused:
    waiting = f"{bound} requests already wait" if bound else "the router holds no requests"
    return Refused(503, f"{waiting} for {route.resource} to wake (--hold-per-model)",
                   retry_after(route, 0.0))


def open_replicas(route: ModelRoute, closed: Mapping[str, float],
                  now: float) -> tuple[Replica, ...]:
    """The route's Ready replicas a request may try: not one it found closed
    less than RETRY_CLOSED_S ago."""
    return tuple(r for r in route.replicas if now - closed.get(r.id, -math.inf) >= RETRY_CLOSED_S)


def foreground(priority: str | None) -> bool:
    """Whether X-Priority leaves the request foreground (the gateway's own
    reading, gateway/slots.py: only `background`, any case, is not)."""
    return priority is None or priority.strip().lower() != "background"


# ---- the queues ---------------------------------------------------------------------------


def woke_told(signing_key: Ed25519PrivateKey | None, replica: Replica, ticket: Ticket,
              now: float) -> dict[str, str]:
    """A held request's wait for the wake, signed for the replica it goes to
    and this request (the gateway's ledger keeps it as "waited for a wake");
    a request the caller did not name gets an id of the router's. Nothing
    without a key, or for an id too long to sign."""
    request_id = ticket.request_id or f"lm-{secrets.token_hex(8)}"
    if signing_key is None or len(request_id) > MAX_WOKE_REQUEST_ID:
        return {}
    ms = min(MAX_WOKE_MS, max(0, round((now - ticket.since) * 1000)))
    mark = sign_woke(signing_key, replica.namespace, replica.name, request_id, ms, time.time())
    return {REQUEST_ID_HEADER: request_id, WOKE_HEADER: str(ms), WOKE_MARK_HEADER: mark}


@dataclass(eq=False)
class Ticket:
    """One request's place among its model's held ones: its arrival order,
    when it was first held, its deadline, whether it is foreground, and the
    replicas it found closed (replica id -> when)."""

    seq: int
    key: RouteKey
    resource: str  # namespace/<LocalModel name>, for /waiting and the metrics
    started: float  # when the request arrived
    timeout: float | None  # its X-Request-Timeout, seconds
    since: float  # when it was first held
    deadline: float
    foreground: bool
    closed: dict[str, float] = field(default_factory=dict)
    seen: ModelRoute | None = None  # the model's route when it found a replica closed
    future: asyncio.Future[ModelRoute] | None = None
    held: bool = False  # counted once it was first held
    request_id: str | None = None  # the caller's X-Request-Id, if any


class Holding:
    """Keeps every model's held requests: their order, the one released and
    not yet sent per model, the serial /waiting reports, and what the metrics read."""

    def __init__(self, per_model: int, routes: Callable[[], RouteTable],
                 clock: Callable[[], float], metrics: RouterMetrics,
                 signing_key: Ed25519PrivateKey | None = None) -> None:
        self.per_model = per_model
        self.signing_key = signing_key  # signs a held request's wait (its woke mark)
        self.routes = routes
        self.clock = clock
        self.metrics = metrics
        self.serial = 0
        self._seq = 0
        self._waiting: dict[RouteKey, list[Ticket]] = {}  # by arrival
        self._sending: dict[RouteKey, Ticket] = {}  # released, not yet sent
        self._bumped = asyncio.Event()
        self._nudge = asyncio.Event()
        self._watcher: asyncio.Task[None] | None = None
        self._pollers = 0  # /waiting long polls waiting now

    # ---- a request's side ----

    def ticket(self, route: ModelRoute, started: float, headers: Mapping[str, str],
               router_deadline: float) -> Ticket:
        """A request's place, from now: its deadline from its X-Request-Timeout,
        the model's hold and `router_deadline`; foreground from its X-Priority."""
        now = self.clock()
        self._seq += 1
        timeout = caller_timeout(headers.get("X-Request-Timeout"))
        return Ticket(self._seq, key_of(route), route.resource, started, timeout, now,
                      deadline_at(started, now, route, timeout, router_deadline),
                      foreground(headers.get("X-Priority")),
                      request_id=headers.get(REQUEST_ID_HEADER))

    def queued(self, route: ModelRoute) -> bool:
        """Whether requests already wait for this model (a new one joins them)."""
        key = key_of(route)
        return bool(self._waiting.get(key)) or key in self._sending

    async def wait(self, ticket: Ticket, route: ModelRoute) -> ModelRoute:
        """Hold `ticket` until its model has a replica it may try: that route
        (only those replicas). Refused when its queue is full, at its deadline,
        or when the model is no longer served; CancelledError (the caller left)
        passes through, the ticket dropped."""
        queued = len(self._waiting.get(ticket.key, ())) + (ticket.key in self._sending)
        if not ticket.held and queued >= self.per_model:
            self.metrics.held_total.inc(1, ("full",))
            raise full(route, self.per_model)
        queue = self._waiting.setdefault(ticket.key, [])
        if not ticket.held:
            ticket.held, ticket.since = True, self.clock()
        loop = asyncio.get_running_loop()
        ticket.future = loop.create_future()
        bisect.insort(queue, ticket, key=lambda t: t.seq)
        self._bump()
        self._pump(ticket.key, route)
        self._watch()
        try:
            async with asyncio.timeout_at(loop.time() + ticket.deadline - self.clock()):
                return await ticket.future
        except TimeoutError:
            self._drop(ticket)
            self._end(ticket, "expired")
            raise expired(route, self.clock() - ticket.since,
                          ticket.deadline - ticket.started) from None
        except asyncio.CancelledError:
            self._drop(ticket)
            self._end(ticket, "left")
            raise
        except Refused:
            self._drop(ticket)
            raise

    def sent(self, ticket: Ticket) -> None:
        """The released request's bytes went to its replica (or it ended
        without): the model's next held request may go."""
        if self._sending.get(ticket.key) is ticket:
            del self._sending[ticket.key]
            self._pump_table(ticket.key)

    def closed(self, ticket: Ticket, replica: str, route: ModelRoute) -> ModelRoute:
        """The replica answered asleep: this request does not try it again
        until RETRY_CLOSED_S passed or the model's route changed. The model's
        route now (`route` if the table has it no more)."""
        now = next((r for r in self.routes() if key_of(r) == ticket.key), route)
        ticket.closed[replica] = self.clock()
        ticket.seen = now
        return now

    def finish(self, ticket: Ticket, result: str) -> None:
        """A request that was held ended at a replica: `relayed` (it took
        it) or `left` (the caller left while it was sent)."""
        if ticket.held:
            self._end(ticket, result)

    def told(self, ticket: Ticket, replica: Replica) -> dict[str, str]:
        """What `replica` is told of a request that was held: what is left of
        the caller's X-Request-Timeout (the wait counted in it), and the wait
        itself, signed for this replica and this request (`woke_told`)."""
        if not ticket.held:
            return {}
        told = woke_told(self.signing_key, replica, ticket, self.clock())
        if ticket.timeout is not None:
            left = ticket.started + ticket.timeout - self.clock()
            told["X-Request-Timeout"] = f"{max(left, 0.001):.3f}"
        return told

    def close(self) -> None:
        """The router stops: its watcher with it."""
        if self._watcher is not None:
            self._watcher.cancel()

    def nudge(self) -> None:
        """The route table may have changed: look at it now (on the event loop)."""
        self._nudge.set()

    def follow(self, source: object) -> None:
        """Be nudged by a source that tells its changes (ClusterSource `listen`,
        from its watches' threads); call on the event loop."""
        listen = getattr(source, "listen", None)
        if not callable(listen):
            return
        loop = asyncio.get_running_loop()

        def changed() -> None:  # from a watch's thread
            with contextlib.suppress(RuntimeError):  # the loop closed: nothing is held
                loop.call_soon_threadsafe(self.nudge)
        listen(changed)

    # ---- /waiting and the metrics ----

    def waiting(self) -> list[WaitingModel]:
        now = self.clock()
        return [WaitingModel(q[0].resource, len(q), sum(t.foreground for t in q),
                             max(0.0, now - min(t.since for t in q)))
                for q in self._waiting.values() if q]

    def held(self) -> dict[tuple[str, ...], float]:
        """Held requests per (namespace, LocalModel name): the gauge's read."""
        return {tuple(q[0].resource.split("/", 1)): float(len(q))
                for q in self._waiting.values() if q}

    async def handle_waiting(self, request: web.Request) -> web.Response:
        """GET /waiting?after=<serial>&wait=<s>: the models requests are held
        for; with `after` the serial, answered when it changes or after `wait`
        seconds (at most MAX_WAIT_S; at once past MAX_POLLERS polls waiting)."""
        after, wait = request.query.get("after"), request.query.get("wait", "0")
        try:
            serial = None if after is None else int(after[:20])
            seconds = float(wait[:32])
        except ValueError:
            serial, seconds = -1, 0.0
        if (serial is not None and not 0 <= serial <= MAX_SERIAL) or not seconds >= 0:
            return web.json_response({"error": "after: a serial (a whole number); wait: "
                                               "seconds"}, status=400)
        if self._pollers >= MAX_POLLERS:
            seconds = 0.0
        self._pollers += 1
        try:
            now = await self.changed(serial, seconds)
        finally:
            self._pollers -= 1
        return web.Response(body=waiting_document(now, self.waiting()),
                            content_type="application/json")

    async def changed(self, after: int | None, wait: float) -> int:
        """The serial once it is not `after`, or after `wait` seconds (at most MAX_WAIT_S)."""
        if after == self.serial:
            bumped = self._bumped
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(max(wait, 0.0), MAX_WAIT_S)):
                    await bumped.wait()
        return self.serial

    # ---- inside ----

    def _bump(self) -> None:
        self.serial += 1
        self._bumped.set()
        self._bumped = asyncio.Event()

    def _end(self, ticket: Ticket, result: str) -> None:
        ticket.held = False
        self.metrics.held_total.inc(1, (result,))
        self.metrics.held_seconds.observe(max(0.0, self.clock() - ticket.since))

    def _drop(self, ticket: Ticket) -> None:
        queue = self._waiting.get(ticket.key, [])
        if ticket in queue:
            queue.remove(ticket)
            self._bump()
        if not queue:
            self._waiting.pop(ticket.key, None)
        self.sent(ticket)  # if it was the one released, the next may go

    def _pump(self, key: RouteKey, route: ModelRoute | None) -> None:
        """Release the model's first held request that has a replica to try,
        unless one released is not sent yet."""
        queue = self._waiting.get(key)
        if not queue or key in self._sending:
            return
        if route is None or route.wanted == 0:  # gone, or turned off: nothing will wake it
            why = (Refused(404, f"model {queue[0].resource} is not served here any more")
                   if route is None else refusal(route))
            for t in queue:
                if t.future is not None and not t.future.done() and why is not None:
                    t.future.set_exception(why)
            return
        now = self.clock()
        for ticket in queue:
            if ticket.seen is not None and ticket.seen != route:  # a replica or a status changed
                ticket.closed.clear()
                ticket.seen = None
            replicas = open_replicas(route, ticket.closed, now)
            if replicas and ticket.future is not None and not ticket.future.done():
                queue.remove(ticket)
                if not queue:
                    del self._waiting[key]
                self._sending[key] = ticket
                self._bump()
                ticket.future.set_result(replace(route, replicas=replicas))
                return

    def _pump_table(self, only: RouteKey | None = None) -> None:
        table = {key_of(r): r for r in self.routes()}
        for key in [only] if only is not None else list(self._waiting):
            self._pump(key, table.get(key))

    def _watch(self) -> None:
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.get_running_loop().create_task(self._watching())

    async def _watching(self) -> None:
        """While anything is held: the table again on every nudge, at least every RECHECK_S."""
        while self._waiting:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(RECHECK_S):
                    await self._nudge.wait()
            self._nudge.clear()
            self._pump_table()
