"""The slot gate's aiohttp glue: read, call the pure modules, relay, record.

Cancellation is the reason this exists. The server runs with aiohttp's
handler cancellation on, so a caller that goes away cancels its handler task
at once, even while a non-streaming caller is only waiting; every path that
leaves a handler early closes the upstream response (`ClientResponse.close`,
which closes its TCP connection), and the engine, which is always asked to
stream, stops at its next token (docs/engine-facts.md, Cancellation).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import sys
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp
from aiohttp import web
from yarl import URL

from localmodel.gateway.assemble import (
    LineSplitter,
    StreamError,
    StreamWatcher,
    assembler_for,
)
from localmodel.gateway.config import GatewayConfig
from localmodel.gateway.overflow import (
    OVERFLOW_PATHS,
    OllamaReply,
    OverflowBreaker,
    OverflowRequest,
    Untranslatable,
    overflow_request,
    scrub,
)
from localmodel.gateway.record import (
    GatewayMetrics,
    Outcome,
    RequestRecord,
    log_line,
    slots_document,
)
from localmodel.gateway.rewrite import (
    BadRequest,
    Prepared,
    load_request,
    model_loaded,
    prepare,
    request_deadline,
)
from localmodel.gateway.routes import ROUTES, Kind, Route
from localmodel.gateway.slots import (
    Admission,
    Priority,
    SlotBoard,
    parse_priority,
    retry_after_seconds,
)

RELAY_ERROR_BODY_LIMIT = 1024 * 1024
READY_CACHE_SECONDS = 1.0
REQUEST_ID = web.RequestKey("request_id", str)
SERVED_BY = web.RequestKey("served_by", str)
SERVED_BY_HEADER = "X-LocalModel-Served-By"


def _json(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status,
        body=json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode(),
        content_type="application/json",
        charset="utf-8",
        headers=headers,
    )


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    # {"error": "..."} is Ollama's error shape; OpenAI clients read it too.
    return _json(status, {"error": message}, headers)


def _stream_error(route: Route, message: str) -> bytes:
    """An error told inside a stream the caller is already reading."""
    if route.is_openai:
        event = {"error": {"message": message, "type": "gateway_error"}}
        return b"data: " + json.dumps(event).encode() + b"\n\n"
    return json.dumps({"error": message}).encode() + b"\n"


class _RelayResponse(web.StreamResponse):
    """A streamed response whose headers wait for the first body write, as
    aiohttp's own `web.Response` does: when the engine's headers arrive with
    its first chunk (the usual case), both go to the caller in one write
    instead of two, one syscall and one TCP segment less per response (see
    docs/gateway.md, Overhead benchmark). `_relay` writes at once when no chunk
    is there yet, so a caller still sees the status as soon as the engine sent
    its own.

    `_send_headers_immediately` is private to aiohttp (3.9+, where
    `web.Response` sets it False). tests/gateway/test_gateway_standin.py fails
    loudly if aiohttp drops it; without it headers simply go at `prepare`."""

    _send_headers_immediately = False


class _CallerGone(Exception):
    """Writing to the caller failed: it went away."""


class _UpstreamBroke(Exception):
    """Reading the upstream's stream failed mid-way."""


async def _read_chunk(upstream: aiohttp.ClientResponse, *, wait: bool = True) -> bytes:
    """The one read of an upstream body (wait=False: only what already arrived).
    A failure here is the upstream's."""
    try:
        if wait:
            return await upstream.content.readany()
        return upstream.content.read_nowait()
    except aiohttp.ClientError as exc:
        raise _UpstreamBroke(f"upstream stream broke: {exc!r}") from exc


async def _read_limited(upstream: aiohttp.ClientResponse, limit: int) -> bytes:
    body = bytearray()
    while len(body) < limit and (chunk := await _read_chunk(upstream)):
        body += chunk
    return bytes(body[:limit])


async def _to_caller(
    response: web.StreamResponse, chunk: bytes = b"", *, eof: bool = False
) -> None:
    """The one write to the caller (eof: with the end of the body). A failure
    here means the caller left."""
    try:
        if eof:
            await response.write_eof(chunk)
        else:
            await response.write(chunk)
    except ConnectionError as exc:
        raise _CallerGone from exc


@dataclass
class _Exchange:
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


@dataclass(frozen=True)
class _Overflowed:
    """The overflow endpoint answered (2xx) a request that left the queue."""

    plan: OverflowRequest
    upstream: aiohttp.ClientResponse


@dataclass
class _Ready:
    at: float = -1e9
    ok: bool = False
    reason: str = "not checked yet"


class Gateway:
    def __init__(
        self,
        config: GatewayConfig,
        access_log: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.board = SlotBoard(config.slots, config.max_queue)
        self._waiters: dict[int, asyncio.Future[None]] = {}
        self._in_flight = 0
        self.metrics = GatewayMetrics(self.board.snapshot, lambda: self._in_flight)
        self.breaker = OverflowBreaker()
        self._access_log = access_log if access_log is not None else _stdout_line
        self._clock = clock
        self._session: aiohttp.ClientSession | None = None
        self._urls: dict[str, URL] = {}  # parsed once per route
        self._ready = _Ready()
        self._warmup: asyncio.Task[None] | None = None
        self._closing = False
        self._assembled_limit = max(4 * 1024 * 1024, config.max_tokens * 256)
        self.unexpected_errors = 0

    # ---- lifecycle -------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.config.max_body_bytes)
        for route in ROUTES:
            for method in route.methods:
                app.router.add_route(method, route.path, self._route_handler(route))
        app.router.add_get("/slots", self.handle_slots)
        app.router.add_get("/healthz", self.handle_healthz)
        app.router.add_get("/readyz", self.handle_readyz)
        app.router.add_get("/metrics", self.handle_metrics)
        app.on_response_prepare.append(_tag_response)
        app.on_startup.append(self._on_startup)
        app.on_shutdown.append(self._on_shutdown)
        app.on_cleanup.append(self._on_cleanup)
        return app

    async def _on_startup(self, app: web.Application) -> None:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30, enable_cleanup_closed=True)
        self._session = aiohttp.ClientSession(
            connector=connector,
            # The engine sets no cookies, and one jar shared by every caller
            # must not carry any from one caller to the next (it also saves
            # a jar lookup per request).
            cookie_jar=aiohttp.DummyCookieJar(),
            # Connect fast or fail fast: the engine is on loopback. Reads are
            # bounded by each request's deadline instead (prefill can be long).
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=3.0, connect=5.0),
            auto_decompress=False,
        )

    async def _on_shutdown(self, app: web.Application) -> None:
        self._closing = True

    async def _on_cleanup(self, app: web.Application) -> None:
        if self._warmup is not None:
            self._warmup.cancel()
            with contextlib.suppress(BaseException):
                await self._warmup
        if self._session is not None:
            await self._session.close()

    @property
    def in_flight(self) -> int:
        """Requests being handled now, any route."""
        return self._in_flight

    @property
    def waiters(self) -> int:
        """Queued requests with a live wait (must equal the board's queue)."""
        return len(self._waiters)

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "gateway not started"
        return self._session

    def upstream_url(self, path: str) -> URL:
        return self._url(self.config.upstream, path)

    def _url(self, base: str, path: str) -> URL:
        key = base + path
        url = self._urls.get(key)
        if url is None:
            url = self._urls[key] = URL(key)
        return url

    # ---- slots -----------------------------------------------------------

    def _release(self, ticket: int) -> None:
        granted = self.board.release(ticket)
        if granted is not None:
            waiter = self._waiters.pop(granted, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    def _leave_queue(self, ticket: int) -> None:
        self._waiters.pop(ticket, None)
        if not self.board.withdraw(ticket):
            # Granted in the same instant it gave up: pass the slot on.
            self._release(ticket)

    def _retry_after(self) -> dict[str, str]:
        snap = self.board.snapshot()
        seconds = retry_after_seconds(self.metrics.mean_slot_seconds, snap.queued, snap.total)
        return {"Retry-After": str(seconds)}

    async def _wait(
        self, route: Route, raw: bytes, rec: RequestRecord, ticket: int, deadline_at: float
    ) -> _Overflowed | None:
        """Wait in the queue for a slot (returns None: the ticket holds one).

        With an overflow endpoint, a foreground request that has waited
        --overflow-after seconds is also sent there, once, racing the queue:
        whichever answers first serves it (a slot that frees first wins and the
        overflow connection is closed). If the overflow fails, the request
        keeps its place and waits locally. Ticket 0 (the queue is full): only
        the overflow can serve it. TimeoutError at the deadline.
        """
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        if ticket:
            self._waiters[ticket] = waiter
        attempt: asyncio.Task[_Overflowed | None] | None = None
        overflow_at = math.inf
        if self.config.overflow:
            # A full queue has no local wait to offer: overflow at once.
            overflow_at = loop.time() + (self.config.overflow_after if ticket else 0.0)
        granted = False
        try:
            while True:
                if attempt is None and loop.time() >= overflow_at:
                    overflow_at = math.inf  # one attempt per request: no retry storm
                    plan = self._overflow_plan(route, raw, rec)
                    if plan is not None:
                        attempt = loop.create_task(self._open_overflow(plan, rec))
                if attempt is None and not ticket:
                    return None
                pending: set[asyncio.Future[Any]] = {waiter}
                if attempt is not None:
                    pending.add(attempt)
                timeout = min(deadline_at, overflow_at) - loop.time()
                await asyncio.wait(
                    pending, timeout=max(0.0, timeout), return_when=asyncio.FIRST_COMPLETED
                )
                if waiter.done():
                    granted = True
                    return None
                if attempt is not None and attempt.done():
                    answered, attempt = attempt.result(), None
                    if answered is not None:
                        return answered
                    continue  # failed: wait locally
                if loop.time() >= deadline_at:
                    if attempt is not None:
                        self.metrics.overflow_failed(rec, "timeout")
                        self.breaker.failed(self._clock())
                    raise TimeoutError
        finally:
            if attempt is not None:
                if attempt.done():
                    late = attempt.result() if not attempt.cancelled() else None
                    if late is not None:
                        late.upstream.close()
                else:
                    attempt.cancel()  # closes the overflow connection
            if ticket and not granted:
                self._leave_queue(ticket)

    # ---- overflow ----------------------------------------------------------

    def _overflow_plan(
        self, route: Route, raw: bytes, rec: RequestRecord
    ) -> OverflowRequest | None:
        if route.kind not in OVERFLOW_PATHS:
            self.metrics.overflow_skip(rec, "route")
            return None
        if not self.breaker.allows(self._clock()):
            self.metrics.overflow_skip(rec, "cooling_down")
            return None
        try:
            return overflow_request(route, raw, self.config)
        except Untranslatable:
            self.metrics.overflow_skip(rec, "untranslatable")
            return None

    async def _open_overflow(self, plan: OverflowRequest, rec: RequestRecord) -> _Overflowed | None:
        """Send to the overflow endpoint; its response once it answered 2xx,
        else None (the failure is counted and the breaker told)."""
        headers = {"Content-Type": "application/json"}
        if self.config.overflow_api_key:
            headers["Authorization"] = f"Bearer {self.config.overflow_api_key}"
        try:
            upstream = await self.session.post(
                self._url(self.config.overflow_url, plan.path), data=plan.body, headers=headers
            )
        except (aiohttp.ClientError, TimeoutError):
            self.metrics.overflow_failed(rec, "connect")
            self.breaker.failed(self._clock())
            return None
        if upstream.status >= 300:
            # The body is not read: an endpoint may echo what it was sent.
            upstream.close()
            self.metrics.overflow_failed(rec, "status", upstream.status)
            self.breaker.failed(self._clock())
            return None
        self.breaker.succeeded()
        return _Overflowed(plan, upstream)

    # ---- handlers --------------------------------------------------------

    def _route_handler(self, route: Route) -> Callable[[web.Request], Any]:
        async def handler(request: web.Request) -> web.StreamResponse:
            return await self.handle(request, route)

        return handler

    async def handle(self, request: web.Request, route: Route) -> web.StreamResponse:
        rec = RequestRecord(
            request_id=request.headers.get("X-Request-Id") or uuid.uuid4().hex[:16],
            route=route.path,
            priority=parse_priority(request.headers.get("X-Priority")).value,
            start=self._clock(),
        )
        request[REQUEST_ID] = rec.request_id
        self._in_flight += 1
        ticket = 0
        try:
            try:
                deadline = request_deadline(
                    request.headers.get("X-Request-Timeout"), self.config.deadline
                )
            except BadRequest as exc:
                rec.finish(Outcome.BAD_REQUEST, 400, str(exc))
                return _error(400, str(exc))
            deadline_at = asyncio.get_running_loop().time() + deadline
            try:
                async with asyncio.timeout(self.config.body_timeout):
                    raw = await request.read()
            except web.HTTPRequestEntityTooLarge:
                message = f"request body exceeds {self.config.max_body_bytes} bytes"
                rec.finish(Outcome.TOO_LARGE, 413, message)
                return _error(413, message)
            except TimeoutError:
                message = f"request body not received within {self.config.body_timeout:g}s"
                rec.finish(Outcome.BODY_TIMEOUT, 408, message)
                return _error(408, message)
            if route.kind is Kind.PASSTHROUGH:
                prepared = Prepared(body=raw, caller_streams=False, model="")
            else:
                try:
                    prepared = prepare(route, raw, self.config)
                except BadRequest as exc:
                    rec.finish(Outcome.BAD_REQUEST, 400, str(exc))
                    return _error(400, str(exc))
                for option in prepared.rewritten:
                    self.metrics.options_rewritten.inc(1, (option,))
            rec.model = prepared.model
            rec.caller_streams = prepared.caller_streams

            if route.uses_slot:
                admission, ticket = self.board.request(Priority(rec.priority))
                if admission is Admission.REJECTED_BUSY:
                    rec.finish(Outcome.REJECTED_BUSY, 429, "no free slot")
                    return _error(
                        429, "no free slot; background requests are not queued", self._retry_after()
                    )
                if admission is not Admission.ADMITTED:
                    rec.queued_at = rec.start
                    queued, ticket = ticket, 0  # _wait keeps it only if granted
                    try:
                        overflowed = await self._wait(route, raw, rec, queued, deadline_at)
                    except TimeoutError:
                        message = f"deadline of {deadline:g}s passed while queued"
                        rec.finish(Outcome.CANCELLED_DEADLINE, 504, message)
                        return _error(504, message)
                    if overflowed is not None:
                        return await self._overflow(
                            request, route, overflowed, rec, deadline, deadline_at
                        )
                    if not queued:
                        rec.finish(Outcome.REJECTED_QUEUE_FULL, 503, "queue full")
                        return _error(
                            503,
                            f"queue full ({self.config.max_queue} waiting)",
                            self._retry_after(),
                        )
                    ticket = queued
                rec.slot_at = self._clock()
            ex = _Exchange(route, rec)
            return await self._guarded(
                ex, deadline, self._local(request, prepared, ex), deadline_at
            )
        except asyncio.CancelledError:
            if self._closing:
                rec.finish(Outcome.SHUTDOWN, 499, "gateway shutting down")
            else:
                rec.finish(Outcome.CANCELLED_DISCONNECT, 499, "caller disconnected")
            raise
        except ConnectionError:
            # Whatever escaped on the caller's side: it is gone.
            rec.finish(Outcome.CANCELLED_DISCONNECT, 499, "caller disconnected")
            return _error(499, "caller disconnected")
        except Exception as exc:
            self.unexpected_errors += 1
            rec.finish(Outcome.INTERNAL_ERROR, 500, f"{type(exc).__name__}: {exc}")
            print(f"gateway: unexpected error in {route.path}: {exc!r}", file=sys.stderr)
            return _error(500, "internal gateway error")
        finally:
            if ticket and self.board.holds(ticket):
                rec.slot_released_at = self._clock()
                self._release(ticket)
            self._in_flight -= 1
            rec.end = self._clock()
            self.metrics.record(rec)
            self._access_log(log_line(rec, datetime.now(UTC).isoformat(timespec="milliseconds")))

    async def _guarded(
        self,
        ex: _Exchange,
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
        except _CallerGone:
            ex.rec.finish(Outcome.CANCELLED_DISCONNECT, 499, "caller disconnected")
            ex.close_upstream()
            assert ex.response is not None
            return ex.response
        except (StreamError, _UpstreamBroke) as exc:
            # The upstream broke its stream or a limit.
            ex.rec.upstream_error = "stream"
            return await self._end_early(ex, Outcome.UPSTREAM_ERROR, 502, str(exc))
        finally:
            ex.settle()

    async def _end_early(
        self, ex: _Exchange, outcome: Outcome, status: int, message: str
    ) -> web.StreamResponse:
        """Stop the upstream now, then tell the caller, in the shape it is
        reading if it is reading a stream already."""
        ex.close_upstream()
        message = scrub(message, self.config.overflow_api_key)
        ex.rec.finish(outcome, status, message)
        if ex.response is None:
            return _error(status, message)
        with contextlib.suppress(ConnectionError, RuntimeError):
            await ex.response.write(_stream_error(ex.route, message))
            await ex.response.write_eof()
        return ex.response

    async def _local(
        self, request: web.Request, prepared: Prepared, ex: _Exchange
    ) -> web.StreamResponse:
        route, rec = ex.route, ex.rec
        try:
            ex.upstream = upstream = await self._send(request, route, prepared)
        except aiohttp.ClientConnectionError as exc:
            rec.upstream_error = "connect"
            message = f"engine unreachable at {self.config.upstream}: {exc}"
            rec.finish(Outcome.UPSTREAM_UNAVAILABLE, 502, message)
            return _error(502, message)
        if upstream.status >= 300:
            rec.upstream_error = "status"
            body = await _read_limited(upstream, RELAY_ERROR_BODY_LIMIT)
            rec.finish(
                Outcome.UPSTREAM_STATUS, upstream.status, body[:200].decode("utf-8", "replace")
            )
            return web.Response(
                status=upstream.status,
                body=body,
                content_type=upstream.content_type or "application/json",
            )
        if route.streams and not prepared.caller_streams:
            return await self._assemble(ex)
        return await self._relay(request, ex, watch=route.streams)

    async def _overflow(
        self,
        request: web.Request,
        route: Route,
        overflowed: _Overflowed,
        rec: RequestRecord,
        deadline: float,
        deadline_at: float,
    ) -> web.StreamResponse:
        request[SERVED_BY] = rec.served_by = "overflow"
        ex = _Exchange(route, rec, upstream=overflowed.upstream)
        return await self._guarded(
            ex, deadline, self._from_overflow(request, overflowed.plan, ex), deadline_at
        )

    async def _from_overflow(
        self, request: web.Request, plan: OverflowRequest, ex: _Exchange
    ) -> web.StreamResponse:
        """Relay the overflow's answer in the shape the caller asked for."""
        upstream, rec = ex.upstream, ex.rec
        assert upstream is not None
        key = self.config.overflow_api_key.encode()

        def clean(data: bytes) -> bytes:
            return data.replace(key, b"[redacted]") if key else data

        if plan.ollama:
            now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
            reply = OllamaReply(ex.route.kind, self.config.overflow_model, now)
            if plan.caller_streams:
                return await self._relay(
                    request,
                    ex,
                    watch=False,
                    translate=reply.feed,
                    end=reply.close,
                    content_type="application/x-ndjson",
                )
            try:
                doc = json.loads(await _read_limited(upstream, self._assembled_limit))
            except ValueError as exc:
                raise StreamError(f"overflow endpoint sent invalid JSON: {exc}") from None
            if not isinstance(doc, dict):
                raise StreamError("overflow endpoint sent a JSON value that is not an object")
            body = reply.whole(doc)
            rec.finish(Outcome.OK, 200)
            return _json(200, body)
        if plan.caller_streams:
            return await self._relay(request, ex, watch=False, translate=clean)
        raw = clean(await _read_limited(upstream, self._assembled_limit))
        rec.finish(Outcome.OK, upstream.status)
        return web.Response(
            status=upstream.status,
            body=raw,
            content_type=upstream.content_type or "application/json",
        )

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
                return await self.session.request(
                    request.method,
                    self.upstream_url(route.path),
                    data=prepared.body if post else None,
                    headers={"Content-Type": "application/json"} if post else None,
                    params=request.query if request.query else None,
                )
            except aiohttp.ServerDisconnectedError:
                if attempt == 2:
                    raise
                self.metrics.upstream_errors.inc(1, ("disconnect_retried",))
        raise AssertionError("unreachable")

    async def _relay(
        self,
        request: web.Request,
        ex: _Exchange,
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
        response = ex.response = _RelayResponse(status=upstream.status)
        response.content_type = content_type or upstream.content_type or "application/json"
        try:
            await response.prepare(request)
        except ConnectionError as exc:
            raise _CallerGone from exc
        watcher = StreamWatcher(ex.route.kind) if watch else None
        content = upstream.content
        # The hot loop: one read and one write per token. Headers are still
        # unsent (_RelayResponse): they go with the first chunk if it came
        # with the upstream's headers, else now.
        chunk = await _read_chunk(upstream, wait=False)
        if not chunk:
            await _to_caller(response)  # sends the buffered headers alone
        while True:
            if not chunk:
                chunk = await _read_chunk(upstream)
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
                await _to_caller(response, chunk)
            chunk = b""
        if end is not None:
            chunk += end()
        await _to_caller(response, chunk, eof=True)
        if watcher is not None:
            watcher.close()
            rec.timing = watcher.timing
            if watcher.error is not None:
                rec.upstream_error = "stream"
                rec.finish(Outcome.UPSTREAM_ERROR, 200, watcher.error)
                return response
        rec.finish(Outcome.OK, response.status)
        return response

    async def _assemble(self, ex: _Exchange) -> web.Response:
        upstream, rec = ex.upstream, ex.rec
        assert upstream is not None
        lines = LineSplitter()
        assembler = assembler_for(ex.route.kind, self._assembled_limit)
        # Read to the end even after the final object, so the connection
        # can go back to the pool.
        while chunk := await _read_chunk(upstream):
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
            return _error(500, assembler.error)
        body = assembler.result()
        rec.finish(Outcome.OK, 200)
        return _json(200, body)

    # ---- status endpoints ------------------------------------------------

    async def handle_slots(self, request: web.Request) -> web.Response:
        c = self.config
        return _json(
            200, slots_document(self.board.snapshot(), c.model, c.engine, c.threads, c.context)
        )

    async def handle_healthz(self, request: web.Request) -> web.Response:
        return _json(200, {"status": "ok"})

    async def handle_metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            body=self.metrics.render().encode(),
            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
        )

    async def handle_readyz(self, request: web.Request) -> web.Response:
        now = self._clock()
        if now - self._ready.at >= READY_CACHE_SECONDS:
            ok, reason = await self._check_engine()
            self._ready = _Ready(at=self._clock(), ok=ok, reason=reason)
        if self._ready.ok:
            return _json(200, {"ready": True})
        return _json(503, {"ready": False, "reason": self._ready.reason})

    async def _check_engine(self) -> tuple[bool, str]:
        try:
            async with asyncio.timeout(2.0):
                if self.config.engine == "llama-server":
                    # /health answers 503 while the model loads, 200 once loaded.
                    async with self.session.get(self.upstream_url("/health")) as resp:
                        if resp.status == 200:
                            return True, ""
                        return False, f"engine /health answered {resp.status}"
                async with self.session.get(self.upstream_url("/api/ps")) as resp:
                    if resp.status != 200:
                        return False, f"engine /api/ps answered {resp.status}"
                    doc = await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            return False, f"engine unreachable at {self.config.upstream}: {exc!r}"
        if not self.config.model or model_loaded(self.config.model, doc):
            return True, ""
        self._start_warmup()
        return False, f"model {self.config.model} not loaded yet (loading)"

    def _start_warmup(self) -> None:
        """Load the model with the owned settings, so the first caller does not
        pay for the load and the load uses the right thread count."""
        if self._warmup is not None and not self._warmup.done():
            return
        self._warmup = asyncio.get_running_loop().create_task(self._load_model())

    async def _load_model(self) -> None:
        body = load_request(self.config)
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with self.session.post(self.upstream_url("/api/generate"), json=body) as resp:
                await resp.read()


async def _tag_response(request: web.Request, response: web.StreamResponse) -> None:
    """Every response says which request it answers and where it was served."""
    request_id = request.get(REQUEST_ID)
    if isinstance(request_id, str):
        response.headers["X-Request-Id"] = request_id
    response.headers[SERVED_BY_HEADER] = request.get(SERVED_BY, "local")


def _stdout_line(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


@dataclass
class RunningGateway:
    gateway: Gateway
    runner: web.AppRunner
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def stop(self) -> None:
        await self.runner.cleanup()


async def start_gateway(
    config: GatewayConfig, access_log: Callable[[str], None] | None = None
) -> RunningGateway:
    """Start serving; port 0 picks a free port (tests)."""
    gateway = Gateway(config, access_log)
    runner = web.AppRunner(
        gateway.app(),
        handler_cancellation=True,  # a caller who leaves cancels its handler at once
        keepalive_timeout=config.idle_timeout,
        access_log=None,
        shutdown_timeout=1.0,
    )
    await runner.setup()
    site = web.TCPSite(runner, config.listen_host, config.listen_port, backlog=1024)
    await site.start()
    # The bound socket tells the port when 0 was asked.
    port = int(runner.addresses[0][1]) if runner.addresses else config.listen_port
    host = config.listen_host if config.listen_host not in ("0.0.0.0", "::", "") else "127.0.0.1"
    return RunningGateway(gateway, runner, host, port)
