"""One upstream exchange: send the request to the engine (or take the overflow
endpoint's answer), then relay the body to the caller as it comes, assemble a
stream into one object for a caller who did not ask to stream, or translate
the overflow's answer into the shape the caller reads.

Every early end (deadline, caller gone, upstream broken) goes through
`Relay.guarded`, which closes the upstream connection at once: the engine,
always asked to stream, stops at its next token.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp
from aiohttp import web

from localmodel.gateway.assemble import LineSplitter, StreamError, StreamWatcher, assembler_for
from localmodel.gateway.config import GatewayConfig
from localmodel.gateway.overflow import OllamaReply, OverflowRequest, scrub
from localmodel.gateway.record import GatewayMetrics, Outcome, RequestRecord
from localmodel.gateway.rewrite import Prepared
from localmodel.gateway.routes import Route
from localmodel.gateway.wire import (
    CallerGone,
    RelayResponse,
    UpstreamBroke,
    Upstreams,
    error_response,
    json_response,
    read_chunk,
    read_limited,
    stream_error,
    to_caller,
)

RELAY_ERROR_BODY_LIMIT = 1024 * 1024


@dataclass
class Exchange:
    """One request's upstream call and its reply to the caller, as far as they got."""

    route: Route
    rec: RequestRecord
    upstream: aiohttp.ClientResponse | None = None
    response: web.StreamResponse | None = None

    def close_upstream(self) -> None:
        """Drop the upstream connection: the engine (or overflow) sees it close
        and stops generating."""
        if self.upstream is not None:
            self.upstream.close()

    def settle(self) -> None:
        """A finished body goes back to the pool; anything unfinished is dropped."""
        upstream = self.upstream
        if upstream is None:
            return
        finished = self.rec.outcome in (None, Outcome.OK, Outcome.UPSTREAM_STATUS)
        if finished and upstream.content.at_eof():
            upstream.release()
        else:
            upstream.close()


class Relay:
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
        self._assembled_limit = max(4 * 1024 * 1024, config.max_tokens * 256)

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
            return error_response(status, message)
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
            return error_response(502, message)
        if upstream.status >= 300:
            return await self._engine_refused(ex, upstream)
        if route.streams and not prepared.caller_streams:
            return await self._assemble(ex)
        return await self.stream(request, ex, watch=route.streams)

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

    # ---- the overflow endpoint's answer --------------------------------------

    async def overflow(
        self, request: web.Request, plan: OverflowRequest, ex: Exchange
    ) -> web.StreamResponse:
        """Relay the overflow's answer in the shape the caller asked for."""
        if plan.ollama:
            return await self._overflow_as_ollama(request, plan, ex)
        upstream = ex.upstream
        assert upstream is not None
        key = self.config.overflow_api_key

        def clean(data: bytes) -> bytes:
            return scrub(data, key)

        if plan.caller_streams:
            return await self.stream(request, ex, watch=False, translate=clean)
        raw = clean(await read_limited(upstream, self._assembled_limit))
        ex.rec.finish(Outcome.OK, upstream.status)
        return web.Response(
            status=upstream.status,
            body=raw,
            content_type=upstream.content_type or "application/json",
        )

    async def _overflow_as_ollama(
        self, request: web.Request, plan: OverflowRequest, ex: Exchange
    ) -> web.StreamResponse:
        """A chat completion told back as Ollama's NDJSON stream or object."""
        upstream = ex.upstream
        assert upstream is not None
        now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
        reply = OllamaReply(ex.route.kind, self.config.overflow_model, now)
        if plan.caller_streams:
            return await self.stream(
                request,
                ex,
                watch=False,
                translate=reply.feed,
                end=reply.close,
                content_type="application/x-ndjson",
            )
        try:
            doc = json.loads(await read_limited(upstream, self._assembled_limit))
        except ValueError as exc:
            raise StreamError(f"overflow endpoint sent invalid JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise StreamError("overflow endpoint sent a JSON value that is not an object")
        body = reply.whole(doc)
        ex.rec.finish(Outcome.OK, 200)
        return json_response(200, body)

    # ---- the body ------------------------------------------------------------

    async def stream(
        self,
        request: web.Request,
        ex: Exchange,
        *,
        watch: bool,
        translate: Callable[[bytes], bytes] | None = None,
        end: Callable[[], bytes] | None = None,
        content_type: str | None = None,
    ) -> web.StreamResponse:
        """Stream the upstream's body to the caller as it comes (translated
        when the caller reads another shape; watched for the engine's final
        timing and errors)."""
        upstream, rec = ex.upstream, ex.rec
        assert upstream is not None
        response = ex.response = RelayResponse(status=upstream.status)
        response.content_type = content_type or upstream.content_type or "application/json"
        try:
            await response.prepare(request)
        except ConnectionError as exc:
            raise CallerGone from exc
        watcher = StreamWatcher(ex.route.kind) if watch else None
        content = upstream.content
        # The hot loop: one read and one write per token. Headers are still
        # unsent (RelayResponse): they go with the first chunk if it came
        # with the upstream's headers, else now.
        chunk = await read_chunk(upstream, wait=False)
        if not chunk:
            await to_caller(response)  # sends the buffered headers alone
        while True:
            if not chunk:
                chunk = await read_chunk(upstream)
                if not chunk:
                    break
            if watcher is not None:
                if rec.first_token_at is None:
                    rec.first_token_at = self._clock()
                watcher.feed(chunk)
            if translate is not None:
                chunk = translate(chunk)
            if content.at_eof():
                break  # the last chunk leaves with the end of the body, below
            if chunk:
                await to_caller(response, chunk)
            chunk = b""
        if end is not None:
            chunk += end()
        await to_caller(response, chunk, eof=True)
        return self._streamed(rec, response, watcher)

    @staticmethod
    def _streamed(
        rec: RequestRecord, response: web.StreamResponse, watcher: StreamWatcher | None
    ) -> web.StreamResponse:
        """The record of a relayed stream: the engine's timing, and an error it
        told inside the stream."""
        if watcher is not None:
            watcher.close()
            rec.timing = watcher.timing
            if watcher.error is not None:
                rec.upstream_error = "stream"
                rec.finish(Outcome.UPSTREAM_ERROR, 200, watcher.error)
                return response
        rec.finish(Outcome.OK, response.status)
        return response

    async def _assemble(self, ex: Exchange) -> web.Response:
        upstream, rec = ex.upstream, ex.rec
        assert upstream is not None
        lines = LineSplitter()
        assembler = assembler_for(ex.route.kind, self._assembled_limit)
        # Read to the end even after the final object, so the connection
        # can go back to the pool.
        while chunk := await read_chunk(upstream):
            if rec.first_token_at is None:
                rec.first_token_at = self._clock()
            for line in lines.feed(chunk):
                if not assembler.finished:
                    assembler.feed_line(line)
        rest = lines.flush()
        if rest and not assembler.finished:
            assembler.feed_line(rest)
        rec.timing = assembler.timing()
        if assembler.error is not None:
            rec.upstream_error = "stream"
            rec.finish(Outcome.UPSTREAM_ERROR, 500, assembler.error)
            return error_response(500, assembler.error)
        body = assembler.result()
        rec.finish(Outcome.OK, 200)
        return json_response(200, body)
