"""The close caller: each `CloseAsk` a pass makes goes as a signed
`POST /yield` to the pod's gateway admin port (gateway/door.py), and its
answer, a `Closed`, is kept for the next pass's `IdleSignals.closes`
(docs/idle.md, Never a busy one). Leader only.

The gateway decides on its own counts in one step (200 closed, 409 busy);
this only carries the ask and reads the answer. Each call is signed with
the router's key (`marks.sign_yield`, the key `RouterSigning` keeps; never
logged), has a deadline (CALL_TIMEOUT_SECONDS) and reads at most
`signals.CLOSE_ANSWER_MAX_BYTES` of the answer, never follows a redirect.
At most one call is under way per pod: an ask for a pod whose call is under
way waits for it, and a newer ask for that pod replaces an older waiting one.
A close is a lease (60 s at the gateway): while a release is under way
(`retain`), `run` renews each closed pod's close before it lapses
(`signals.renewals`). Whatever a gateway does is one `CloseResult`, never an
exception out of here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from types import MappingProxyType

import aiohttp
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from localmodel.events import EventSpec, close_event
from localmodel.gateway_contract import ADMIN_PORT, YIELD_PATH
from localmodel.gateway_contract.marks import MARK_HEADER, sign_yield
from localmodel.idle.asks import CloseAsk, Closed, CloseResult
from localmodel.idle.signals import (
    CLOSE_ANSWER_MAX_BYTES,
    address,
    closed_from_answer,
    pod_key,
    renewals,
    yield_body,
)
from localmodel.metrics import Counter

log = logging.getLogger("localmodel.close")

CALL_TIMEOUT_SECONDS = 5.0  # one call: connect, request and answer
RENEW_TICK_SECONDS = 5.0  # how often `run` looks for closes to renew
MAX_KEPT = 4096  # answers kept (pods): more is forgotten, oldest first

# The `result` label of localmodel_operator_yields_total.
RESULTS = tuple(r.value for r in CloseResult)


def yields_counter() -> Counter:
    return Counter("localmodel_operator_yields_total",
                   "Closes the operator asked of a replica's gateway (POST /yield, to sleep or "
                   "to give its node to another model) by the gateway's answer: closed, busy "
                   "(409), forbidden (403), unreachable or bad.", ("result",))


class Closer:
    """Sends asks one at a time per pod, keeps each pod's latest answer and
    renews the closes a release still needs."""

    def __init__(self, key: Callable[[], Ed25519PrivateKey | None],
                 on_change: Callable[[], None], yields: Counter | None = None, *,
                 port: int = ADMIN_PORT, clock: Callable[[], float] = time.time) -> None:
        self.key = key  # the router's private key as last read (None: not yet)
        self.on_change = on_change
        self.yields = yields or yields_counter()
        self.port = port
        self.clock = clock
        self.wake = asyncio.Event()
        self._closes: dict[str, Closed] = {}  # "namespace/pod" -> its latest answer
        self._first: dict[str, float] = {}  # "namespace/pod" -> when its close was first taken
        self._keep: frozenset[str] | None = None
        self._waiting: dict[str, CloseAsk] = {}  # per pod, the next ask to send
        self._calls: dict[str, asyncio.Task[None]] = {}  # per pod, the call under way
        self._counted: dict[str, bool] = {}  # per pod, whether its waiting ask is a pass's
        self._signed: dict[str, int] = {}  # per pod, the second of its last mark
        self._events: dict[str, list[EventSpec]] = {}  # model key -> Events to post
        self._session: aiohttp.ClientSession | None = None
        self._no_key_said = False

    def closes(self) -> Mapping[str, Closed]:
        """The latest answer per pod ("namespace/pod"), for `IdleSignals.closes`."""
        return MappingProxyType(dict(self._closes))

    def send(self, asks: Iterable[CloseAsk]) -> None:
        """Send these asks (at once, or after the pod's call under way); not
        leading (`run` not under way), none is sent: the next pass asks again."""
        for ask in asks:
            self._queue(ask, counted=True)

    def take_events(self) -> dict[str, list[EventSpec]]:
        """The Events the answers since the last call tell (Yielded,
        YieldRefused), by model key; the pass posts them."""
        events, self._events = self._events, {}
        return events

    def retain(self, pods: Iterable[str]) -> None:
        """The pods ("namespace/pod") whose close a release still needs: only
        these are renewed; the others' leases lapse and their answers are
        forgotten."""
        self._keep = frozenset(pods)
        for pod in [p for p in self._closes if p not in self._keep]:
            self._closes.pop(pod, None)
            self._first.pop(pod, None)

    def forget(self) -> None:
        """Drop every answer kept and every ask waiting (the Lease was lost:
        no renewal goes out, and the next term asks afresh)."""
        self._closes.clear()
        self._first.clear()
        self._waiting.clear()
        self._keep = None

    async def idle(self) -> None:
        """Return once no call is under way or waiting (tests, shutdown)."""
        while self._calls:
            await asyncio.gather(*self._calls.values(), return_exceptions=True)

    async def run(self, leading: asyncio.Event) -> None:
        """Renew the closes due while leading (calls need the session this opens)."""
        async with self.session():
            while True:
                if not leading.is_set():
                    self.forget()  # a new term starts from what the gateways say then
                    await leading.wait()
                self.renew_due()
                self.wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), timeout=RENEW_TICK_SECONDS)

    def renew_due(self) -> None:
        for ask in renewals(self._closes, self._first, self.clock(), self._keep):
            if pod_key(ask) not in self._calls:
                self._queue(ask, counted=False)

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[None]:
        timeout = aiohttp.ClientTimeout(total=None, connect=None, sock_connect=None,
                                        sock_read=None)
        async with aiohttp.ClientSession(timeout=timeout, auto_decompress=False,
                                         connector=aiohttp.TCPConnector(force_close=True),
                                         cookie_jar=aiohttp.DummyCookieJar()) as session:
            self._session = session
            try:
                yield
            finally:
                await self.idle()
                self._session = None

    def _queue(self, ask: CloseAsk, counted: bool) -> None:
        if self._session is None:
            return
        pod = pod_key(ask)
        self._waiting[pod] = ask
        self._counted[pod] = counted
        if pod not in self._calls:
            self._calls[pod] = asyncio.create_task(self._calls_of(pod), name=f"close {pod}")

    async def _calls_of(self, pod: str) -> None:
        try:
            while (ask := self._waiting.pop(pod, None)) is not None:
                counted = self._counted.pop(pod, False)
                closed = await self._call(ask)
                self._keep_answer(pod, closed)
                if counted and ask.reason != "reopen":
                    self.yields.inc(labels=(closed.result.value,))
                    if (event := close_event(closed)) is not None:
                        self._events.setdefault(ask.key, []).append(event)
                self.on_change()
        finally:
            self._calls.pop(pod, None)

    def _keep_answer(self, pod: str, closed: Closed) -> None:
        if closed.result is CloseResult.CLOSED:
            self._first.setdefault(pod, closed.at)
        else:
            self._first.pop(pod, None)
        self._closes.pop(pod, None)
        self._closes[pod] = closed
        while len(self._closes) > MAX_KEPT:
            oldest = next(iter(self._closes))
            self._closes.pop(oldest)
            self._first.pop(oldest, None)

    def _mark(self, ask: CloseAsk, key: Ed25519PrivateKey) -> str:
        """A fresh mark: a gateway takes each once, so two calls to one pod
        are signed in different seconds."""
        pod, now = pod_key(ask), self.clock()
        second = max(int(now), self._signed.get(pod, -1) + 1)
        self._signed[pod] = second
        return sign_yield(key, ask.namespace, ask.pod, ask.reason, ask.idle_at_least,
                          float(second))

    async def _call(self, ask: CloseAsk) -> Closed:
        key = self.key()
        if key is None:
            if not self._no_key_said:
                log.warning("no router signing key known yet: closes are not sent")
                self._no_key_said = True
            return Closed(ask, CloseResult.FORBIDDEN, self.clock())
        ip = address(ask.ip)
        if ip is None or self._session is None:  # no address (or not one): nowhere to call
            return Closed(ask, CloseResult.UNREACHABLE, self.clock())
        host = f"[{ip}]" if ":" in ip else ip
        url = f"http://{host}:{self.port}{YIELD_PATH}"
        try:
            async with asyncio.timeout(CALL_TIMEOUT_SECONDS):
                status, body = await self._post(url, ask, self._mark(ask, key))
        except (TimeoutError, aiohttp.ClientConnectionError, OSError) as exc:
            log.info("close of %s (%s): unreachable: %s", pod_key(ask), ask.reason,
                     type(exc).__name__)
            return Closed(ask, CloseResult.UNREACHABLE, self.clock())
        except Exception as exc:  # a malformed answer, anything it set off
            log.info("close of %s (%s): bad answer: %s", pod_key(ask), ask.reason,
                     type(exc).__name__)
            return Closed(ask, CloseResult.BAD, self.clock())
        closed = closed_from_answer(ask, status, body, self.clock())
        log.info("close of %s (%s, idle %d s%s): %s", pod_key(ask), ask.reason, ask.idle_at_least,
                 f", for {ask.for_}" if ask.for_ else "", closed.result.value)
        return closed

    async def _post(self, url: str, ask: CloseAsk, mark: str) -> tuple[int, bytes]:
        assert self._session is not None
        async with self._session.post(url, data=yield_body(ask), allow_redirects=False,
                                      headers={MARK_HEADER: mark,
                                               "Content-Type": "application/json"}) as resp:
            body = bytearray()  # past the bound it is BAD: never parsed cut short
            while len(body) <= CLOSE_ANSWER_MAX_BYTES and (
                    chunk := await resp.content.read(CLOSE_ANSWER_MAX_BYTES + 1 - len(body))):
                body += chunk
            return resp.status, bytes(body)
