"""The body of an upstream answer on its way to the caller: relayed as it
comes (`stream`, the hot loop), assembled into one object for a caller who did
not ask to stream, or translated from the overflow endpoint's answer into the
shape the caller reads. Every read and write goes through `wire`, so a failure
is told apart by side (`UpstreamBroke`, `CallerGone`); the request's deadline
and the early ends around all of this are `Relay.guarded`'s.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import aiohttp
from aiohttp import web

from localmodel.engines import timings
from localmodel.gateway.assemble import StreamWatcher, assembler_for
from localmodel.gateway.overflow import KeyScrubber, OllamaReply, OverflowRequest, scrub
from localmodel.gateway.record import Outcome, RequestRecord
from localmodel.gateway.rewrite import encode
from localmodel.gateway.routes import Route
from localmodel.gateway.stream import LineSplitter, StreamError
from localmodel.gateway.wire import (
    CallerGone,
    RelayResponse,
    read_chunk,
    read_limited,
    to_caller,
)
from localmodel.gateway_contract import GatewayConfig
from localmodel.gateway_contract.replies import error_response, json_response


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


class BodyRelay:
    """Relays answer bodies to the caller: streamed or assembled, in the shape it asked for, the
    engine's or the overflow's."""

    def __init__(self, config: GatewayConfig, clock: Callable[[], float]) -> None:
        self.config = config
        self._clock = clock
        # The most an assembled (or whole overflow) answer may hold.
        self.assembled_limit = max(4 * 1024 * 1024, config.max_tokens * 256)
        # How the engine's answers carry its own account (its package says).
        self.timing = timings.reader(config.engine)

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
        if plan.caller_streams:
            # Across chunks: a key split between two reads is still found.
            scrubber = KeyScrubber(key)
            return await self.stream(
                request, ex, watch=False, translate=scrubber.feed, end=scrubber.close
            )
        raw = scrub(await read_limited(upstream, self.assembled_limit), key)
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
        key = self.config.overflow_api_key
        reply = OllamaReply(ex.route.kind, self.config.overflow_model, now, key)
        if plan.caller_streams:
            # The key scrubbed from what the caller reads: the translated
            # lines (an escaped key upstream arrives decoded), across lines.
            scrubber = KeyScrubber(key)
            return await self.stream(
                request,
                ex,
                watch=False,
                translate=lambda data: scrubber.feed(reply.feed(data)),
                end=lambda: scrubber.feed(reply.close()) + scrubber.close(),
                content_type="application/x-ndjson",
            )
        try:
            doc = json.loads(await read_limited(upstream, self.assembled_limit))
        except ValueError as exc:
            raise StreamError(f"overflow endpoint sent invalid JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise StreamError("overflow endpoint sent a JSON value that is not an object")
        body = encode(reply.whole(doc))
        ex.rec.finish(Outcome.OK, 200)
        return web.Response(status=200, body=scrub(body, key), content_type="application/json",
                            charset="utf-8")


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
        watcher = StreamWatcher(ex.route.kind, self.timing) if watch else None
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

    async def assemble(self, ex: Exchange) -> web.Response:
        upstream, rec = ex.upstream, ex.rec
        assert upstream is not None
        lines = LineSplitter()
        assembler = assembler_for(ex.route.kind, self.assembled_limit, self.timing)
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
            return error_response(500, assembler.error, openai=ex.route.is_openai)
        body = assembler.result()
        rec.finish(Outcome.OK, 200)
        return json_response(200, body)
