"""The router's aiohttp glue: one endpoint for both APIs, the routing
decision per request, the replicas' state read in the background, metrics on
an admin port. `start_router` serves on the given ports (0: any free one).

A request's way (`Router.handle`): a place of --places held before anything
else (none free: 503 unread; router/admission.py); its body read within
--max-body-bytes and the body timeout, a few at a time (--body-reads,
gateway_contract/reads.py), parsed and bounded like the gateway bounds it
(gateway_contract/bounds.py), only what routing needs kept (router/wanted.py:
its `model` field looked up in router/table.py, `namespace/name` or a bare
name one namespace serves, and its session's key, salted); its session's
owner and the decision (router/session.py, router/owners.py,
router/decide.py); then relayed (router/proxy.py, over router/upstream.py's
kept connections), the owner told with a mark signed for that replica
(gateway_contract/marks.py) and remembered once the replica answered with a
2xx. The decision goes back in `X-LocalModel-Route`, in the access log (one
JSON line per request, a malformed request's included) and in the metrics.
A request for a sleeping model (no Ready replica, or a replica's asleep
answer) is held until one is Ready, keeping its place (router/holding.py);
the admin port's `GET /waiting` says which models requests wait for
(gateway_contract/waiting_answer.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import secrets
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from localmodel.gateway_contract import (
    HEALTH_PATH,
    METRICS_PATH,
    READY_PATH,
    client_api,
)
from localmodel.gateway_contract.headers import (
    OWNED_SESSION_HEADER,
    REPLICA_HEADER,
    ROUTE_HEADER,
    SESSION_HEADER,
)
from localmodel.gateway_contract.marks import MARK_HEADER, OWNED, SLOTS, sign
from localmodel.gateway_contract.reads import BodyReads
from localmodel.gateway_contract.replies import json_response
from localmodel.gateway_contract.waiting_answer import WAITING_PATH
from localmodel.printable import printable
from localmodel.router.account import SessionBook, tokens_from_tail
from localmodel.router.admission import RETRY_AFTER_S, SMALL_BODY, Places
from localmodel.router.config import RouterConfig, hold_bound
from localmodel.router.decide import OWNER, Decision, decide
from localmodel.router.holding import Holding, Refused, Ticket, refusal
from localmodel.router.keyed import KeyChecks
from localmodel.router.metrics import RouterMetrics
from localmodel.router.owners import Owners
from localmodel.router.proxy import Relayed, relay
from localmodel.router.replicas import ReplicaWatch
from localmodel.router.session import ranking
from localmodel.router.signing import session_salt
from localmodel.router.table import ModelRoute, Replica, ReplicaSource, listed_names
from localmodel.router.told import Told
from localmodel.router.upstream import Pool
from localmodel.router.wanted import SESSION_PATHS, BadRequest, Wanted, wanted
from localmodel.settings import PortTaken

INFERENCE_PATHS = (*SESSION_PATHS, client_api.SHOW_PATH)


class Router:
    """Decides where each request goes (the session's owner, or a spill) and
    relays it there; keeps what the decisions read (the replicas' state, the
    sessions' owners and tokens) and serves the listings."""

    def __init__(self, config: RouterConfig, source: ReplicaSource,
                 log: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.source = source
        self.log = log or _stdout_line
        self.watch = ReplicaWatch(clock)
        self.book = SessionBook()
        self.owners = Owners()
        self.keys = KeyChecks(clock)  # who sees a keyed model listed
        # Marks only this router's key makes (gateway_contract/marks.py); without
        # --signing-key, one of its own that no gateway knows (cli.py says so).
        self.signing_key = config.signing_key or Ed25519PrivateKey.generate()
        self.salt = session_salt(self.signing_key)
        self.metrics = RouterMetrics(self.watch.reads, lambda: len(self.book),
                                     lambda: len(self.owners), self.keys.answered,
                                     self._admission, lambda: self.holding.held())
        self.holding = Holding(hold_bound(config.places, config.hold_per_model),
                               source.routes, clock, self.metrics, self.signing_key)
        self.places = Places(config.places)
        self.reads = BodyReads(config.body_reads, SMALL_BODY)
        self._clock = clock
        self.told = Told(self.metrics, self.log, clock)  # each request's end
        self._session: aiohttp.ClientSession | None = None  # for /slots and /speed
        self.pool = Pool(config.connect_timeout)  # for the requests relayed
        self._poller: asyncio.Task[None] | None = None

    # ---- apps and lifecycle --------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.config.max_body_bytes)
        for path in INFERENCE_PATHS:
            app.router.add_post(path, self.handle)
        app.router.add_get("/v1/models", self.handle_models)
        app.router.add_get(client_api.TAGS_PATH, self.handle_tags)
        app.router.add_get(HEALTH_PATH, self.handle_health)
        app.router.add_get(READY_PATH, self.handle_health)
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        return app

    def admin_app(self) -> web.Application:
        app = web.Application(client_max_size=1024)
        app.router.add_get(METRICS_PATH, self.handle_metrics)
        app.router.add_get(HEALTH_PATH, self.handle_health)
        app.router.add_get(WAITING_PATH, self.holding.handle_waiting)
        return app

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "the router's app is not started"
        return self._session

    async def _on_startup(self, app: web.Application) -> None:
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, connect=self.config.connect_timeout),
            auto_decompress=False,
            connector=aiohttp.TCPConnector(limit=0, enable_cleanup_closed=True),
            # No cookies: one caller's answer must never set what another caller sends
            # (and no jar to consult on every request).
            cookie_jar=aiohttp.DummyCookieJar(),
        )
        self._poller = asyncio.create_task(self._poll_forever())
        self.holding.follow(self.source)

    async def _on_cleanup(self, app: web.Application) -> None:
        self.holding.close()
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        if self._session is not None:
            await self._session.close()
        self.pool.close()

    async def _poll_forever(self) -> None:
        while True:
            try:
                await self.poll()
            except Exception as exc:  # a source's failure must not end the polling
                _stderr_line(f"localmodel router: reading the replicas failed: {exc!r}")
            await asyncio.sleep(self.config.poll_interval)

    async def poll(self) -> None:
        """Read every replica's /slots and /speed once (tests call it to not wait)."""
        await self.watch.poll(self.session, self.source.routes(), self._slots_mark)

    def _slots_mark(self, namespace: str, pod: str) -> dict[str, str]:
        """The header that lets the replica's /slots list its session keys."""
        return {MARK_HEADER: sign(self.signing_key, SLOTS, namespace, pod, "", time.time())}

    def _admission(self) -> dict[str, int]:
        return {"places_held": self.places.held, "body_reads": self.reads.reading,
                "body_reads_waiting": self.reads.waiting}

    def http_log(self) -> logging.Logger:
        """aiohttp's logger for the main port: what it refuses before any
        handler runs (a malformed request line or header: 400) gets the
        router's access-log line and is counted, not a traceback."""
        logger = logging.Logger("localmodel.router.http", logging.DEBUG)
        logger.addHandler(_Refusals(self))
        return logger

    # ---- listing and status ---------------------------------------------------

    async def _listed(self, request: web.Request) -> tuple[str, ...]:
        """The names this caller may see: open models, and keyed ones whose
        gateway accepts its key (router/keyed.py)."""
        table = self.source.routes()
        shown = await self.keys.visible(self.session, table, request.headers.get("Authorization"))
        return listed_names(table, shown)

    async def handle_models(self, request: web.Request) -> web.Response:
        data = [{"id": name, "object": "model", "created": 0, "owned_by": "localmodel"}
                for name in await self._listed(request)]
        self.metrics.requests.inc(1, ("/v1/models", "200"))
        return json_response(200, {"object": "list", "data": data})

    async def handle_tags(self, request: web.Request) -> web.Response:
        models = [{"name": name, "model": name, "modified_at": "1970-01-01T00:00:00Z",
                   "size": 0, "digest": "", "details": {}}
                  for name in await self._listed(request)]
        self.metrics.requests.inc(1, (client_api.TAGS_PATH, "200"))
        return json_response(200, {"models": models})

    async def handle_health(self, request: web.Request) -> web.Response:
        return json_response(200, {"status": "ok"})

    async def handle_metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render().encode(),
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    # ---- one request ------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.StreamResponse:
        openai = request.path.startswith("/v1/")
        started = self._clock()
        if not self.places.take():  # refused before any of its body is read
            message = (f"the router is at its limit of {self.places.limit} requests in "
                       "progress (--places)")
            return self.told.refused(request, started, 503, message, openai,
                                     {"Retry-After": str(RETRY_AFTER_S)})
        try:
            return await self._admitted(request, started, openai)
        finally:
            self.places.give()

    async def _admitted(self, request: web.Request, started: float,
                        openai: bool) -> web.StreamResponse:
        try:
            want = await self._read(request)
        except BadRequest as exc:
            return self.told.refused(request, started, exc.status, str(exc), openai)
        route, refused = want.route, None if want.route.replicas else refusal(want.route)
        if refused is not None:  # not a model that sleeps, or off: answered at once
            return self.told.unheld(request, started, route.qualified, refused, openai)
        ticket = self.holding.ticket(route, started, request.headers, self.config.deadline)
        hold = not route.replicas or self.holding.queued(route)  # held, after those before it
        while True:
            if hold:
                try:
                    route = await self.holding.wait(ticket, route)
                except Refused as exc:
                    return self.told.refused(request, started, exc.status, exc.message, openai,
                                             exc.headers)
            try:
                done, replica = await self._relay(request, route, want, started, openai, ticket)
            finally:
                self.holding.sent(ticket)  # sent or not, the model's next held request may go
            if not done.asleep:
                return done.response
            route, hold = self.holding.closed(ticket, replica, route), True

    async def _relay(self, request: web.Request, route: ModelRoute, want: Wanted,
                     started: float, openai: bool, ticket: Ticket) -> tuple[Relayed, str]:
        """The request to the replica the decision picks, and that replica; an
        asleep answer comes back unsent (`Relayed.asleep`) for it to be held."""
        key = want.key
        decision = self._decide(route, key, want.prompt)
        replica = next(r for r in route.replicas if r.id == decision.replica)
        extra = {ROUTE_HEADER: decision.header, REPLICA_HEADER: replica.id}
        told = _told(self.signing_key, decision, replica, key) | self.holding.told(ticket, replica)
        if key is not None:
            self.metrics.replica_turns.inc(1, (replica.namespace, replica.name, decision.kind))

        def answered(status: int) -> None:  # the owner is kept once a replica took the turn
            if key is not None and 200 <= status < 300:
                self.owners.keep(route.qualified, key, decision.owner,
                                 [r.id for r in route.replicas], self._clock())

        sent = functools.partial(self.holding.sent, ticket)  # the model's next held may go
        try:
            with self.watch.sending(replica.id):
                done = await relay(self.pool, request, replica.url, want.data, extra,
                                   self.config.deadline, openai, told, answered, sent,
                                   hold_asleep=self.holding.per_model > 0)
        except asyncio.CancelledError:  # the caller left: the relay closed the upstream
            self.holding.finish(ticket, "left")
            self.told.gone(request, route, key, decision, started)
            raise
        if not done.asleep:
            self.holding.finish(ticket, "relayed")
            self._after(request, route, key, decision, done, started)
        return done, replica.id

    async def _read(self, request: web.Request) -> Wanted:
        """The body, read and parsed with at most --body-reads others; only
        what routing needs is kept (router/wanted.py)."""
        limit = self.config.max_body_bytes
        too_large = BadRequest(413, f"the body is over the limit of {limit} bytes "
                                    "(--max-body-bytes)")
        if request.content_length is not None and request.content_length > limit:
            raise too_large
        async with self.reads.turn(request.content_length):
            try:
                async with asyncio.timeout(self.config.body_timeout):
                    raw = await request.read()
            except web.HTTPRequestEntityTooLarge:
                raise too_large from None
            except TimeoutError:
                raise BadRequest(408, f"the body did not arrive within "
                                      f"{self.config.body_timeout:g}s") from None
            return wanted(raw, request.path, request.headers.get(SESSION_HEADER), self.salt,
                          self.source.routes(), self.config.bounds)

    def _decide(self, route: ModelRoute, key: str | None, prompt: int) -> Decision:
        """The session's owner (router/owners.py: bounded loads, remembered),
        then its rendezvous ranking as the other candidates."""
        names = [r.id for r in route.replicas]  # namespace/pod: never another namespace's
        if key is None:  # no session: anywhere, as a Service would
            order = ranking("r:" + secrets.token_hex(8), names)
        else:
            order = self.owners.choose(route.qualified, key, names, self._clock(),
                                       self.watch.owning(names, key))
        states = {name: self.watch.state(name) for name in names}
        held = self.book.held(f"{route.qualified}\0{key}")
        return decide(order, states, held, prompt)

    def _after(self, request: web.Request, route: ModelRoute, key: str | None,
               decision: Decision, done: Relayed, started: float) -> None:
        if key is not None:  # the tokens the replica now holds of the session
            tokens = tokens_from_tail(bytes(done.tail.data)) if done.complete else None
            if tokens is not None:
                self.book.record(f"{route.qualified}\0{key}", decision.replica, tokens)
        self.told.relayed(request, route, key, decision, done, started)

def _told(signing_key: Ed25519PrivateKey, decision: Decision, replica: Replica,
          key: str | None) -> dict[str, str]:
    """What the replica is told of a turn: its ledger keeps the decision; the
    owner learns it owns the session (a spilled turn does not), signed for it
    alone: its /slots then tells every router."""
    told = {} if key is None else {ROUTE_HEADER: decision.header}
    if key is not None and decision.kind == OWNER:
        told[OWNED_SESSION_HEADER] = key
        told[MARK_HEADER] = sign(signing_key, OWNED, replica.namespace, replica.name,
                                 key, time.time())
    return told


class _Refusals(logging.Handler):
    """aiohttp's records of the requests it answered itself (a malformed
    request: its HttpProcessingError's status), as access-log lines with path
    `-` (the request line may be what was malformed); anything else it logs,
    one line on stderr."""

    def __init__(self, router: Router) -> None:
        super().__init__(logging.DEBUG)
        self.router = router

    def emit(self, record: logging.LogRecord) -> None:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            status = exc.code or 400
            why = f"malformed request: {printable(str(exc.message).splitlines()[0], 120)}"
            self.router.metrics.requests.inc(1, ("-", str(status)))
            doc = {"time": round(time.time(), 3), "path": "-", "status": status, "error": why}
            self.router.log(json.dumps(doc, separators=(",", ":")))
        elif record.levelno >= logging.WARNING:
            detail = f": {exc!r}" if exc is not None else ""
            _stderr_line(printable(f"localmodel router: {record.getMessage()}{detail}", 1024))


def _stdout_line(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _stderr_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass
class RunningRouter:
    """One router started: its server, runners, host and ports."""

    router: Router
    runner: web.AppRunner
    admin_runner: web.AppRunner
    host: str
    port: int
    admin_port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def admin_url(self) -> str:
        return f"http://{self.host}:{self.admin_port}"

    async def stop(self) -> None:
        await self.admin_runner.cleanup()
        await self.runner.cleanup()


async def start_router(config: RouterConfig, source: ReplicaSource,
                       log: Callable[[str], None] | None = None) -> RunningRouter:
    """Start serving; port 0 picks a free port (tests)."""
    router = Router(config, source, log)
    runner = web.AppRunner(router.app(), handler_cancellation=True,
                           keepalive_timeout=config.idle_timeout, access_log=None,
                           shutdown_timeout=1.0, logger=router.http_log())
    await runner.setup()
    try:
        await web.TCPSite(runner, config.listen_host, config.listen_port, backlog=1024).start()
    except OSError as exc:
        await runner.cleanup()
        raise PortTaken("listen", config.listen_host, config.listen_port, exc) from None
    port = int(runner.addresses[0][1]) if runner.addresses else config.listen_port
    host = config.listen_host if config.listen_host not in ("0.0.0.0", "::", "") else "127.0.0.1"
    admin = web.AppRunner(router.admin_app(), access_log=None, shutdown_timeout=1.0)
    await admin.setup()
    try:
        await web.TCPSite(admin, config.admin_host, config.admin_port).start()
    except OSError as exc:
        await admin.cleanup()
        await runner.cleanup()
        raise PortTaken("admin-listen", config.admin_host, config.admin_port, exc) from None
    admin_port = int(admin.addresses[0][1]) if admin.addresses else config.admin_port
    return RunningRouter(router, runner, admin, host, port, admin_port)
