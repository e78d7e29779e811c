"""The slot gate's aiohttp glue: its parts wired into one app, and serving it.

Cancellation is the reason this exists. The server runs with aiohttp's
handler cancellation on, so a caller that goes away cancels its handler task
at once, even while a non-streaming caller is only waiting; every path that
leaves a handler early closes the upstream response (`ClientResponse.close`,
which closes its TCP connection), and the engine, which is always asked to
stream, stops at its next token (docs/engine-facts.md, Cancellation).

The parts, each in its module: `pipeline` (one request, start to end),
`queueing` (slots, the queue and its race with the overflow endpoint),
`overflow_client` (the call to that endpoint), `relay` (the upstream call
under the deadline), `body` (the answer relayed, assembled or translated),
`readiness` (/readyz and the warm-up), `wire` (bytes to the caller and from the
upstream), `door` (the idle signal in /speed and the operator's signed close,
POST /yield on the admin port).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from localmodel.gateway.door import BadYield, Door, SeenMarks, parse_yield
from localmodel.gateway.keys import KeyRing, KeysFile, key_check_answer
from localmodel.gateway.ledger import BadQuery, Ledger, WaitBook, parse_query
from localmodel.gateway.metrics import GatewayMetrics
from localmodel.gateway.overflow import OverflowBreaker
from localmodel.gateway.overflow_client import OverflowClient
from localmodel.gateway.pipeline import REQUEST_ID, SERVED_BY, Pipeline
from localmodel.gateway.queueing import SlotQueue
from localmodel.gateway.readiness import Readiness
from localmodel.gateway.relay import Relay
from localmodel.gateway.routes import ROUTES, Route
from localmodel.gateway.slots import SlotBoard, slots_document
from localmodel.gateway.speed import SpeedRecord, speed_document
from localmodel.gateway.wire import Upstreams
from localmodel.gateway_contract import (
    HEALTH_PATH,
    LEDGER_PATH,
    METRICS_PATH,
    READY_PATH,
    SLOTS_PATH,
    SPEED_PATH,
    YIELD_PATH,
    GatewayConfig,
)
from localmodel.gateway_contract.headers import SERVED_BY_HEADER
from localmodel.gateway_contract.keys import KEY_CHECK_PATH
from localmodel.gateway_contract.replies import json_response
from localmodel.settings import PortTaken

KEYS_CHECK_SECONDS = 2.0  # how often the keys file is looked at (a stat) for a change


class SlotGate:
    """The gateway in one model pod (not the LocalModel's `spec.gateway`,
    which is `localmodel.api.Gateway`): routes, status endpoints, lifecycle."""

    def __init__(
        self,
        config: GatewayConfig,
        access_log: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        # The ledger (--ledger-size 0: none): the ring, and the book of who
        # waited behind whom.
        self.ledger = Ledger(config.ledger_size) if config.ledger_size else None
        book = WaitBook() if self.ledger is not None else None
        self.queue = SlotQueue(config.slots, config.max_queue, book, clock)
        self.speed = SpeedRecord()
        self._clock = clock
        self.door = Door(config.yield_lease, lambda: self.board.snapshot().queued, clock)
        self._seen_marks = SeenMarks()
        log = access_log if access_log is not None else _stdout_line
        # With --keys-file, a file that cannot be read or used stops the start.
        self.keys = KeysFile(config.keys_file, _stderr_line) if config.keys_file else None
        self.metrics = GatewayMetrics(self.board.snapshot, lambda: self.pipeline.in_flight,
                                      self.speed, clock, closed=lambda: self.door.closed)
        self.breaker = OverflowBreaker()
        self.upstreams = Upstreams()
        overflow = None
        if config.overflow:
            overflow = OverflowClient(config, self.upstreams, self.metrics, self.breaker, clock)
        relay = Relay(config, self.upstreams, self.metrics, clock)
        self.pipeline = Pipeline(
            config,
            self.queue,
            relay,
            overflow,
            self.metrics,
            log,
            clock,
            self.ledger,
            keys=None if self.keys is None else self._ring,
            door=self.door,
        )
        self.readiness = Readiness(config, self.upstreams, clock, self.speed)
        self._keys_task: asyncio.Task[None] | None = None

    @property
    def board(self) -> SlotBoard:
        return self.queue.board

    @property
    def in_flight(self) -> int:
        """Requests being handled now, any route."""
        return self.pipeline.in_flight

    @property
    def waiters(self) -> int:
        """Queued requests with a live wait (must equal the board's queue)."""
        return self.queue.waiters

    @property
    def unexpected_errors(self) -> int:
        return self.pipeline.unexpected_errors

    # ---- lifecycle -------------------------------------------------------

    def _ring(self) -> KeyRing:
        assert self.keys is not None
        return self.keys.ring

    def app(self) -> web.Application:
        """The inference port's app: the engine's routes (with keys on, each
        needs one), readiness, health and slots."""
        app = web.Application(client_max_size=self.config.max_body_bytes)
        for route in ROUTES:
            for method in route.methods:
                app.router.add_route(method, route.path, self._route_handler(route))
        app.router.add_get(SLOTS_PATH, self.handle_slots)
        app.router.add_get(KEY_CHECK_PATH, self.handle_key_check)
        app.router.add_get(HEALTH_PATH, self.handle_healthz)
        app.router.add_get(READY_PATH, self.readiness.handle_readyz)
        app.on_response_prepare.append(_tag_response)
        app.on_startup.append(self._on_startup)
        app.on_shutdown.append(self._on_shutdown)
        app.on_cleanup.append(self._on_cleanup)
        return app

    def admin_app(self) -> web.Application:
        """The admin port's app (--admin-listen; the Service does not expose
        it): metrics, speed, the ledger, health, and the operator's signed close."""
        app = web.Application(client_max_size=1024)
        app.router.add_get(METRICS_PATH, self.handle_metrics)
        app.router.add_get(SPEED_PATH, self.handle_speed)
        app.router.add_post(YIELD_PATH, self.handle_yield)
        app.router.add_get(LEDGER_PATH, self.handle_ledger)
        app.router.add_get(HEALTH_PATH, self.handle_healthz)
        return app

    def _route_handler(self, route: Route) -> Callable[[web.Request], Any]:
        async def handler(request: web.Request) -> web.StreamResponse:
            return await self.pipeline.handle(request, route)

        return handler

    async def _on_startup(self, app: web.Application) -> None:
        self.upstreams.open()
        if self.keys is not None:
            self._keys_task = asyncio.create_task(self._watch_keys(self.keys))

    async def _watch_keys(self, keys: KeysFile) -> None:
        """A mounted Secret changes in place: look for a change now and then."""
        while True:
            await asyncio.sleep(KEYS_CHECK_SECONDS)
            keys.check()

    async def _on_shutdown(self, app: web.Application) -> None:
        self.pipeline.closing = True

    async def _on_cleanup(self, app: web.Application) -> None:
        if self._keys_task is not None:
            self._keys_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keys_task
        await self.readiness.stop()
        await self.upstreams.close()

    # ---- status endpoints ------------------------------------------------

    async def handle_slots(self, request: web.Request) -> web.Response:
        c = self.config
        # Session keys only to the router (its signed mark): to anyone else, none.
        owned = self.pipeline.owned.listed() if self.pipeline.marks.slots(request.headers) else []
        return json_response(
            200, slots_document(self.board.snapshot(), c.model, c.engine, c.threads, c.context,
                                owned)
        )

    async def handle_speed(self, request: web.Request) -> web.Response:
        c = self.config
        doc = speed_document(self.speed, self._clock(), c.engine, c.model, c.threads)
        return json_response(200, {**doc, "activity": self.door.activity()})

    async def handle_yield(self, request: web.Request) -> web.Response:
        """The operator's close (gateway/door.py): a signed `yield` mark made
        for this pod and this body, taken once; then one synchronous decision."""
        try:
            call = parse_yield(await request.read())
        except BadYield as exc:
            self.metrics.yields.inc(1, ("unknown", "bad_request"))
            return json_response(400, {"error": str(exc)})
        mark = self.pipeline.marks.yielding(request.headers, call.reason, call.idle_at_least)
        if mark is None or not self._seen_marks.take(mark, time.time()):
            self.metrics.yields.inc(1, (call.reason.value, "forbidden"))
            return json_response(403, {"error": "a yield needs the operator's signed mark, "
                                                "made for this pod and this call, used once"})
        verdict = self.door.decide(call)  # no await since the mark: one step
        result = "refused" if verdict.status == 409 else "accepted"
        self.metrics.yields.inc(1, (call.reason.value, result))
        return json_response(verdict.status, verdict.body)

    async def handle_healthz(self, request: web.Request) -> web.Response:
        return json_response(200, {"status": "ok"})

    async def handle_key_check(self, request: web.Request) -> web.Response:
        """The router's question before it lists this model to a caller: does
        one of the keys give this proof for this nonce? No engine work, no
        place, no ledger record (gateway/keys.py, `key_check_answer`)."""
        return key_check_answer(None if self.keys is None else self.keys.ring, request.headers)

    async def handle_ledger(self, request: web.Request) -> web.Response:
        """The ledger's records, oldest first; filters `since`, `caller`, `priority`."""
        if self.ledger is None:
            return json_response(404, {"error": "the ledger is off (--ledger-size 0)"})
        try:
            query = parse_query(request.query, time.time())
        except BadQuery as exc:
            return json_response(400, {"error": str(exc)})
        return json_response(200, self.ledger.document(query))

    async def handle_metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            body=self.metrics.render().encode(),
            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
        )


async def _tag_response(request: web.Request, response: web.StreamResponse) -> None:
    """Every response says which request it answers and where it was served."""
    request_id = request.get(REQUEST_ID)
    if isinstance(request_id, str):
        response.headers["X-Request-Id"] = request_id
    response.headers[SERVED_BY_HEADER] = request.get(SERVED_BY, "local")


def _stdout_line(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _stderr_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass
class RunningGateway:
    """One gateway started: its server, runners, host and ports."""

    gateway: SlotGate
    runner: web.AppRunner
    host: str
    port: int
    admin_runner: web.AppRunner | None = None
    admin_port: int = 0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def admin_url(self) -> str:
        return f"http://{self.host}:{self.admin_port}"

    async def stop(self) -> None:
        if self.admin_runner is not None:
            await self.admin_runner.cleanup()
        await self.runner.cleanup()


async def start_gateway(
    config: GatewayConfig, access_log: Callable[[str], None] | None = None
) -> RunningGateway:
    """Start serving; port 0 picks a free port (tests)."""
    gateway = SlotGate(config, access_log)
    runner = web.AppRunner(
        gateway.app(),
        handler_cancellation=True,  # a caller who leaves cancels its handler at once
        keepalive_timeout=config.idle_timeout,
        access_log=None,
        shutdown_timeout=1.0,
    )
    await runner.setup()
    site = web.TCPSite(runner, config.listen_host, config.listen_port, backlog=1024)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise PortTaken("listen", config.listen_host, config.listen_port, exc) from None
    # The bound socket tells the port when 0 was asked.
    port = int(runner.addresses[0][1]) if runner.addresses else config.listen_port
    host = config.listen_host if config.listen_host not in ("0.0.0.0", "::", "") else "127.0.0.1"
    admin = web.AppRunner(gateway.admin_app(), keepalive_timeout=config.idle_timeout,
                          access_log=None, shutdown_timeout=1.0)
    await admin.setup()
    admin_host, admin_port = config.admin_address
    try:
        await web.TCPSite(admin, admin_host, admin_port).start()
    except OSError as exc:
        await admin.cleanup()
        await runner.cleanup()
        raise PortTaken("admin-listen", admin_host, admin_port, exc) from None
    admin_port = int(admin.addresses[0][1]) if admin.addresses else admin_port
    return RunningGateway(gateway, runner, host, port, admin, admin_port)
