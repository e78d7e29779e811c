"""The slot gate's aiohttp glue: read, call the pure modules, relay, record.

Cancellation is the reason this exists. The server runs with aiohttp's
handler cancellation on, so a caller that goes away cancels its handler task
at once, even while a non-streaming caller is only waiting; every path that
leaves a handler early closes the upstream response (`ClientResponse.close`,
which closes its TCP connection), and the engine, which is always asked to
stream, stops at its next token (ENGINE-FACTS.md, Cancellation).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp
from aiohttp import web
from yarl import URL

from localmodel.gateway.assemble import (
    LineSplitter,
    OllamaAssembler,
    OpenAIAssembler,
    StreamError,
    StreamWatcher,
    decode_event,
    decode_ndjson,
    sse_data,
)
from localmodel.gateway.config import GatewayConfig
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


class _RelayResponse(web.StreamResponse):
    """A streamed response whose headers wait for the first body write, as
    aiohttp's `web.Response` does: when the engine's headers arrive with its
    first chunk (the usual case), both go to the caller in one write instead
    of two. `_relay` writes at once when no chunk is there yet, so a caller
    still sees the status as soon as the engine sent its own. (An aiohttp
    without this class attribute just sends headers at `prepare`, as before.)"""

    _send_headers_immediately = False


class _CallerGone(Exception):
    """Writing to the caller failed: it went away."""


class _UpstreamBroke(Exception):
    """Reading the engine's stream failed mid-way."""


async def _read_chunk(upstream: aiohttp.ClientResponse) -> bytes:
    try:
        return await upstream.content.readany()
    except aiohttp.ClientError as exc:
        raise _UpstreamBroke(f"engine stream broke: {exc!r}") from exc


async def _read_limited(upstream: aiohttp.ClientResponse, limit: int) -> bytes:
    body = bytearray()
    while len(body) < limit and (chunk := await _read_chunk(upstream)):
        body += chunk
    return bytes(body[:limit])


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
        self._access_log = access_log if access_log is not None else _stdout_line
        self._clock = clock
        self._session: aiohttp.ClientSession | None = None
        self._urls: dict[str, URL] = {}  # parsed once per route
        self._ready = _Ready()
        self._warmup: asyncio.Task[None] | None = None
        self._closing = False
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
        app.on_response_prepare.append(_echo_request_id)
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
        url = self._urls.get(path)
        if url is None:
            url = self._urls[path] = URL(self.config.upstream + path)
        return url

    # ---- slots -----------------------------------------------------------

    def _release(self, ticket: int) -> None:
        granted = self.board.release(ticket)
        if granted is not None:
            waiter = self._waiters.pop(granted, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    async def _wait_for_slot(self, ticket: int) -> None:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[ticket] = waiter
        try:
            await waiter
        except BaseException:
            self._waiters.pop(ticket, None)
            if not self.board.withdraw(ticket):
                # Granted in the same instant we were cancelled: pass it on.
                self._release(ticket)
            raise

    def _retry_after(self) -> dict[str, str]:
        snap = self.board.snapshot()
        seconds = retry_after_seconds(self.metrics.mean_slot_seconds, snap.queued, snap.total)
        return {"Retry-After": str(seconds)}

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
            rec.model = prepared.model
            rec.caller_streams = prepared.caller_streams

            if route.uses_slot:
                admission, ticket = self.board.request(Priority(rec.priority))
                if admission is Admission.REJECTED_BUSY:
                    rec.finish(Outcome.REJECTED_BUSY, 429, "no free slot")
                    return _error(
                        429, "no free slot; background requests are not queued", self._retry_after()
                    )
                if admission is Admission.REJECTED_QUEUE_FULL:
                    rec.finish(Outcome.REJECTED_QUEUE_FULL, 503, "queue full")
                    return _error(
                        503, f"queue full ({self.config.max_queue} waiting)", self._retry_after()
                    )
                if admission is Admission.QUEUED:
                    rec.queued_at = rec.start
                    try:
                        async with asyncio.timeout_at(deadline_at):
                            await self._wait_for_slot(ticket)
                    except TimeoutError:
                        ticket = 0  # withdrawn (or passed on) by _wait_for_slot
                        message = f"deadline of {deadline:g}s passed while queued"
                        rec.finish(Outcome.CANCELLED_DEADLINE, 504, message)
                        return _error(504, message)
                    except BaseException:
                        ticket = 0
                        raise
                rec.slot_at = self._clock()
            return await self._forward(request, route, prepared, rec, deadline, deadline_at)
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

    async def _forward(
        self,
        request: web.Request,
        route: Route,
        prepared: Prepared,
        rec: RequestRecord,
        deadline: float,
        deadline_at: float,
    ) -> web.StreamResponse:
        timeout = asyncio.timeout_at(deadline_at)
        response: web.StreamResponse | None = None
        upstream: aiohttp.ClientResponse | None = None
        try:
            async with timeout:
                try:
                    upstream = await self._send(request, route, prepared)
                except aiohttp.ClientConnectionError as exc:
                    rec.upstream_error = "connect"
                    message = f"engine unreachable at {self.config.upstream}: {exc}"
                    rec.finish(Outcome.UPSTREAM_UNAVAILABLE, 502, message)
                    return _error(502, message)
                if upstream.status >= 300:
                    rec.upstream_error = "status"
                    body = await _read_limited(upstream, RELAY_ERROR_BODY_LIMIT)
                    rec.finish(
                        Outcome.UPSTREAM_STATUS,
                        upstream.status,
                        body[:200].decode("utf-8", "replace"),
                    )
                    return web.Response(
                        status=upstream.status,
                        body=body,
                        content_type=upstream.content_type or "application/json",
                    )
                if route.streams and not prepared.caller_streams:
                    return await self._assemble(route, upstream, rec)
                response = _RelayResponse(status=upstream.status)
                response.content_type = upstream.content_type or "application/json"
                try:
                    await response.prepare(request)
                except ConnectionError as exc:
                    raise _CallerGone from exc
                await self._relay(route, upstream, response, rec)
                return response
        except TimeoutError:
            if not timeout.expired():
                raise
            message = f"deadline of {deadline:g}s passed"
            rec.finish(Outcome.CANCELLED_DEADLINE, 504, message)
            if upstream is not None:
                upstream.close()  # stop the engine now, before anything else
            if response is None:
                return _error(504, message)
            with contextlib.suppress(ConnectionError, RuntimeError):
                await response.write(self._stream_error(route, message))
                await response.write_eof()
            return response
        except _CallerGone:
            rec.finish(Outcome.CANCELLED_DISCONNECT, 499, "caller disconnected")
            if upstream is not None:
                upstream.close()
            assert response is not None
            return response
        except (StreamError, _UpstreamBroke) as exc:
            # The engine broke its stream or a limit: tell the caller in the
            # shape it is reading, if it is reading one already.
            rec.upstream_error = "stream"
            rec.finish(Outcome.UPSTREAM_ERROR, 502, str(exc))
            if upstream is not None:
                upstream.close()
            if response is None:
                return _error(502, str(exc))
            with contextlib.suppress(ConnectionError, RuntimeError):
                await response.write(self._stream_error(route, str(exc)))
                await response.write_eof()
            return response
        finally:
            if upstream is not None:
                if (
                    rec.outcome in (None, Outcome.OK, Outcome.UPSTREAM_STATUS)
                    and upstream.content.at_eof()
                ):
                    upstream.release()
                else:
                    # Anything unfinished: drop the connection so the engine
                    # sees it close and stops generating.
                    upstream.close()

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

    def _stream_error(self, route: Route, message: str) -> bytes:
        if route.is_openai:
            event = {"error": {"message": message, "type": "gateway_error"}}
            return b"data: " + json.dumps(event).encode() + b"\n\n"
        return json.dumps({"error": message}).encode() + b"\n"

    async def _relay(
        self,
        route: Route,
        upstream: aiohttp.ClientResponse,
        response: web.StreamResponse,
        rec: RequestRecord,
    ) -> None:
        watcher = StreamWatcher(route.kind) if route.streams else None
        content = upstream.content
        # The hot loop: one read and one write per token; errors are told
        # apart by where they happen (the engine's side or the caller's).
        # Headers are still unsent (_RelayResponse): they go with the first
        # chunk if it came with the engine's headers, else now.
        try:
            chunk = content.read_nowait()
        except aiohttp.ClientError as exc:
            raise _UpstreamBroke(f"engine stream broke: {exc!r}") from exc
        if not chunk:
            try:
                await response.write(b"")  # sends the buffered headers alone
            except ConnectionError as exc:
                raise _CallerGone from exc
        while True:
            if not chunk:
                try:
                    chunk = await content.readany()
                except aiohttp.ClientError as exc:
                    raise _UpstreamBroke(f"engine stream broke: {exc!r}") from exc
                if not chunk:
                    break
            if watcher is not None:
                if rec.first_token_at is None:
                    rec.first_token_at = self._clock()
                watcher.feed(chunk)
            try:
                if content.at_eof():
                    # The engine's last chunk came with the end of its body:
                    # ours leave in one write too.
                    await response.write_eof(chunk)
                    break
                await response.write(chunk)
            except ConnectionError as exc:
                raise _CallerGone from exc
            chunk = b""
        try:
            await response.write_eof()  # a no-op if already sent
        except ConnectionError as exc:
            raise _CallerGone from exc
        if watcher is not None:
            watcher.close()
            rec.timing = watcher.timing
            if watcher.error is not None:
                rec.upstream_error = "stream"
                rec.finish(Outcome.UPSTREAM_ERROR, 200, watcher.error)
                return
        rec.finish(Outcome.OK, response.status)

    async def _assemble(
        self, route: Route, upstream: aiohttp.ClientResponse, rec: RequestRecord
    ) -> web.Response:
        limit = max(4 * 1024 * 1024, self.config.max_tokens * 256)
        lines = LineSplitter()
        assembler: OllamaAssembler | OpenAIAssembler
        if route.is_ollama_native:
            assembler = OllamaAssembler(route.kind, limit)
        else:
            assembler = OpenAIAssembler(route.kind, limit)

        def feed(line: bytes) -> None:
            if isinstance(assembler, OllamaAssembler):
                obj = decode_ndjson(line)
                if obj is not None:
                    assembler.feed(obj)
            else:
                payload = sse_data(line)
                if payload is not None:
                    assembler.feed(decode_event(payload))

        # Read to the end even after the final object, so the connection
        # can go back to the pool.
        while chunk := await _read_chunk(upstream):
            if rec.first_token_at is None:
                rec.first_token_at = self._clock()
            for line in lines.feed(chunk):
                if not assembler.finished:
                    feed(line)
        rest = lines.flush()
        if rest and not assembler.finished:
            feed(rest)
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


async def _echo_request_id(request: web.Request, response: web.StreamResponse) -> None:
    request_id = request.get(REQUEST_ID)
    if isinstance(request_id, str):
        response.headers["X-Request-Id"] = request_id


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
    port = config.listen_port
    server = site._server  # the bound socket tells us the port when 0 was asked
    if isinstance(server, asyncio.Server) and server.sockets:
        port = server.sockets[0].getsockname()[1]
    host = config.listen_host if config.listen_host not in ("0.0.0.0", "::", "") else "127.0.0.1"
    return RunningGateway(gateway, runner, host, port)
