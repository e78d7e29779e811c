"""One upstream exchange under the request's deadline: send the request to the
engine (once more after a keep-alive race), relay a refusal as it is, and hand
the body to `body.BodyRelay` (relayed, assembled, or the overflow's translated).

Every early end (deadline, caller gone, upstream broken) goes through
`Relay.guarded`, which closes the upstream connection at once: the engine,
always asked to stream, stops at its next token.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any

import aiohttp
from aiohttp import web

from localmodel.gateway.body import BodyRelay, Exchange
from localmodel.gateway.metrics import GatewayMetrics
from localmodel.gateway.overflow import scrub
from localmodel.gateway.record import Outcome
from localmodel.gateway.rewrite import Prepared
from localmodel.gateway.routes import Route
from localmodel.gateway.stream import StreamError
from localmodel.gateway.wire import (
    CallerGone,
    UpstreamBroke,
    Upstreams,
    read_limited,
    stream_error,
)
from localmodel.gateway_contract import GatewayConfig
from localmodel.gateway_contract.replies import error_response

RELAY_ERROR_BODY_LIMIT = 1024 * 1024


class Relay:
    """Relays a request to the engine and its answer back, within the deadline."""

    def __init__(
        self,
        config: GatewayConfig,
        upstreams: Upstreams,
        metrics: GatewayMetrics,
        clock: Callable[[], float],
    ) -> None:
        self.config = config
        self.upstreams = upstreams
        self.metrics = metrics
        self._clock = clock
        self.body = BodyRelay(config, clock)

    # ---- the deadline and early ends ---------------------------------------

    async def guarded(
        self,
        ex: Exchange,
        deadline: float,
        work: Coroutine[Any, Any, web.StreamResponse],
        deadline_at: float,
    ) -> web.StreamResponse:
        """Run one upstream exchange under the request's deadline; every early
        end closes the upstream connection at once."""
        timeout = asyncio.timeout_at(deadline_at)
        try:
            async with timeout:
                return await work
        except TimeoutError:
            if not timeout.expired():
                raise
            return await self._end_early(
                ex, Outcome.CANCELLED_DEADLINE, 504, f"deadline of {deadline:g}s passed"
            )
        except CallerGone:
            ex.rec.gone(self._clock())
            ex.rec.finish(Outcome.CANCELLED_DISCONNECT, 499, "caller disconnected")
            ex.close_upstream()
            assert ex.response is not None
            return ex.response
        except (StreamError, UpstreamBroke) as exc:
            # The upstream broke its stream or a limit.
            ex.rec.upstream_error = "stream"
            return await self._end_early(ex, Outcome.UPSTREAM_ERROR, 502, str(exc))
        finally:
            ex.settle()

    async def _end_early(
        self, ex: Exchange, outcome: Outcome, status: int, message: str
    ) -> web.StreamResponse:
        """Stop the upstream now, then tell the caller, in the shape it is
        reading if it is reading a stream already."""
        ex.close_upstream()
        message = scrub(message, self.config.overflow_api_key)
        ex.rec.finish(outcome, status, message)
        if ex.response is None:
            return error_response(status, message, openai=ex.route.is_openai)
        with contextlib.suppress(ConnectionError, RuntimeError):
            await ex.response.write(stream_error(ex.route, message))
            await ex.response.write_eof()
        return ex.response

    # ---- the local engine ----------------------------------------------------

    async def local(
        self, request: web.Request, prepared: Prepared, ex: Exchange
    ) -> web.StreamResponse:
        route, rec = ex.route, ex.rec
        try:
            ex.upstream = upstream = await self._send(request, route, prepared)
        except aiohttp.ClientConnectionError as exc:
            rec.upstream_error = "connect"
            message = f"engine unreachable at {self.config.upstream}: {exc}"
            rec.finish(Outcome.UPSTREAM_UNAVAILABLE, 502, message)
            return error_response(502, message, openai=route.is_openai)
        if upstream.status >= 300:
            return await self._engine_refused(ex, upstream)
        if route.streams and not prepared.caller_streams:
            return await self.body.assemble(ex)
        return await self.body.stream(request, ex, watch=route.streams)

    async def _send(
        self, request: web.Request, route: Route, prepared: Prepared
    ) -> aiohttp.ClientResponse:
        """Send upstream; once more if the engine closed the connection before
        answering (a keep-alive race). Safe for generation too: the request
        streams, so whatever the closed connection had started was cancelled
        with it."""
        post = request.method == "POST"
        for attempt in (1, 2):
            try:
                return await self.upstreams.session.request(
                    request.method,
                    self.upstreams.url(self.config.upstream, route.path),
                    data=prepared.body if post else None,
                    headers={"Content-Type": "application/json"} if post else None,
                    params=request.query if request.query else None,
                )
            except aiohttp.ServerDisconnectedError:
                if attempt == 2:
                    raise
                self.metrics.upstream_errors.inc(1, ("disconnect_retried",))
        raise AssertionError("unreachable")

    async def _engine_refused(
        self, ex: Exchange, upstream: aiohttp.ClientResponse
    ) -> web.Response:
        """The engine's non-2xx answer, relayed as it is (its start kept in the record)."""
        ex.rec.upstream_error = "status"
        body = await read_limited(upstream, RELAY_ERROR_BODY_LIMIT)
        ex.rec.finish(
            Outcome.UPSTREAM_STATUS, upstream.status, body[:200].decode("utf-8", "replace")
        )
        return web.Response(
            status=upstream.status,
            body=body,
            content_type=upstream.content_type or "application/json",
        )
