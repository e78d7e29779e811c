"""Sending a queued request to the overflow endpoint: whether it may go
(route, breaker, translation), the call itself, and the breaker told of each
result. The request and reply shapes are `overflow`'s (pure); the race against
the local queue is `queueing`'s; relaying the answer is `relay`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import aiohttp

from localmodel.gateway.budget import KEYLESS, Budgets
from localmodel.gateway.keys import Budget
from localmodel.gateway.metrics import GatewayMetrics
from localmodel.gateway.overflow import (
    OVERFLOW_PATHS,
    OverflowBreaker,
    OverflowRequest,
    Untranslatable,
    overflow_request,
)
from localmodel.gateway.record import RequestRecord
from localmodel.gateway.routes import Route
from localmodel.gateway.wire import Upstreams
from localmodel.gateway_contract import GatewayConfig


@dataclass(frozen=True)
class Overflowed:
    """The overflow endpoint answered (2xx) a request that left the queue."""

    plan: OverflowRequest
    upstream: aiohttp.ClientResponse


@dataclass(frozen=True)
class OverflowTry:
    """The overflow side of one queued request's wait: when it may start, how
    it starts (None: it may not go, the reason counted) and what a wait that
    ran out of time with an attempt still open tells."""

    after: float
    start: Callable[[], Coroutine[Any, Any, Overflowed | None] | None]
    timed_out: Callable[[], None]


class OverflowClient:
    """Sends requests to the overflow endpoint, within the breaker and each account's budget."""

    def __init__(
        self,
        config: GatewayConfig,
        upstreams: Upstreams,
        metrics: GatewayMetrics,
        breaker: OverflowBreaker,
        clock: Callable[[], float],
    ) -> None:
        self.config = config
        self.upstreams = upstreams
        self.metrics = metrics
        self.breaker = breaker
        self._clock = clock
        default = config.overflow_budget
        self.budgets = Budgets(None if default is None else Budget(*default))

    def attempt_for(self, route: Route, raw: bytes, rec: RequestRecord) -> OverflowTry:
        """One request's overflow attempt, to race its wait in the queue."""

        def start() -> Coroutine[Any, Any, Overflowed | None] | None:
            plan = self.plan(route, raw, rec)
            return None if plan is None else self.send(plan, rec)

        def timed_out() -> None:
            self._failed(rec, "timeout")

        return OverflowTry(self.config.overflow_after, start, timed_out)

    def plan(self, route: Route, raw: bytes, rec: RequestRecord) -> OverflowRequest | None:
        """The request for the endpoint, or None (the reason counted)."""
        if route.kind not in OVERFLOW_PATHS:
            self.metrics.overflow_skip(rec, "route")
            return None
        if not self.breaker.allows(self._clock()):
            self.metrics.overflow_skip(rec, "cooling_down")
            return None
        try:
            request = overflow_request(route, raw, self.config)
        except Untranslatable:
            self.metrics.overflow_skip(rec, "untranslatable")
            return None
        key = rec.key
        if key is not None and not key.overflow:
            self.metrics.overflow_skip(rec, "not_allowed")
            return None
        account = KEYLESS if key is None else "key:" + key.caller
        if not self.budgets.take(account, None if key is None else key.budget, self._clock()):
            self.metrics.overflow_skip(rec, "budget")
            return None
        return request

    def refusal(self, rec: RequestRecord) -> str:
        """What the caller is told when its key or budget kept it from the
        overflow endpoint ("" otherwise)."""
        if rec.overflow_skipped == "not_allowed":
            return f"; caller {rec.caller}'s key does not allow overflow"
        if rec.overflow_skipped == "budget":
            limit = self.budgets.limit(None if rec.key is None else rec.key.budget)
            who = f"caller {rec.caller}'s" if rec.key is not None else "the keyless callers'"
            return f"; {who} overflow budget ({limit}) is spent"
        return ""

    async def send(self, plan: OverflowRequest, rec: RequestRecord) -> Overflowed | None:
        """Send to the overflow endpoint; its response once it answered 2xx,
        else None (the failure is counted and the breaker told)."""
        headers = {"Content-Type": "application/json"}
        if self.config.overflow_api_key:
            headers["Authorization"] = f"Bearer {self.config.overflow_api_key}"
        url = self.upstreams.url(self.config.overflow_url, plan.path)
        try:
            upstream = await self.upstreams.session.post(url, data=plan.body, headers=headers)
        except (aiohttp.ClientError, TimeoutError):
            self._failed(rec, "connect")
            return None
        if upstream.status >= 300:
            # The body is not read: an endpoint may echo what it was sent.
            upstream.close()
            self._failed(rec, "status", upstream.status)
            return None
        self.breaker.succeeded()
        return Overflowed(plan, upstream)

    def _failed(self, rec: RequestRecord, kind: str, status: int | None = None) -> None:
        self.metrics.overflow_failed(rec, kind, status)
        self.breaker.failed(self._clock())
