"""Which sleeping models are wanted: one long poll per router pod of the
router's `GET /waiting` (its admin port), merged into `IdleSignals.waiting`
(docs/idle.md, Asking for the wake). Leader only.

The router pods are the router Service's Ready endpoints, listed from its
EndpointSlices in --router-namespace (`signals.ROUTER_SLICE_SELECTOR`) every
LIST_EVERY_S. Each pod has one task that asks `?after=<serial>&wait=<s>`:
the router answers at once when its serial is another, else when what it
holds changes, so a hold reaches the operator one round-trip after it
happens. A change of which models are held, or how many, asks for a pass
(`on_change`).

A router's answer is hostile (any pod can listen on a router's address):
redirects are not followed, at most `waiting_answer.MAX_BYTES` is read, the
whole answer is checked by `parse_waiting` or none of it is used, and a poll
has a deadline. A router that is down or answers garbage is logged once (and
once more when it answers again), its held requests no longer count, and it
is asked again after a backoff (`signals.retry_in`); the other routers' polls
never wait for it. The pure parts are in idle/signals.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from types import MappingProxyType

import aiohttp

from localmodel.controller.writer import Kube
from localmodel.gateway_contract.waiting_answer import (
    MAX_BYTES,
    WAITING_PATH,
    BadWaiting,
    Waiting,
    WaitingModel,
    parse_waiting,
)
from localmodel.idle.signals import (
    ROUTER_SLICE_SELECTOR,
    RouterPod,
    merge_waiting,
    retry_in,
    router_pods,
)

log = logging.getLogger("localmodel.wake")

WAIT_S = 25  # the long poll's `wait`
POLL_GRACE_S = 10.0  # a poll's deadline is WAIT_S plus this
MIN_GAP_S = 0.5  # two polls of one router start at least this far apart
LIST_EVERY_S = 30.0  # the router's EndpointSlices listed again this often

FindRouters = Callable[[], Awaitable[tuple[RouterPod, ...]]]


def slice_finder(kube: Kube, namespace: str) -> FindRouters:
    """The router pods of --router-namespace, from its Service's EndpointSlices."""
    path = (f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices"
            f"?labelSelector={ROUTER_SLICE_SELECTOR}")

    async def find() -> tuple[RouterPod, ...]:
        listed = await kube.get(path)
        items = listed.get("items") if isinstance(listed, Mapping) else None
        return router_pods(items if isinstance(items, list) else ())

    return find


class WakeWatch:
    """Keeps each router pod's last /waiting answer and their merge; asks
    for a pass when the merge changes."""

    def __init__(self, find: FindRouters, on_change: Callable[[], None], *,
                 wait_s: float = WAIT_S, list_every: float = LIST_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.find = find
        self.on_change = on_change
        self.wait_s = wait_s
        self.list_every = list_every
        self.clock = clock
        self._answers: dict[str, Waiting] = {}  # router pod -> its last answer
        self._merged: Mapping[str, WaitingModel] = MappingProxyType({})
        self._told: tuple[tuple[str, int, int], ...] = ()  # what the last pass was asked for
        self.answers = 0  # good answers read, all routers
        self._polls: dict[RouterPod, asyncio.Task[None]] = {}
        self._session: aiohttp.ClientSession | None = None
        self._list_failed = False

    def waiting(self) -> Mapping[str, WaitingModel]:
        """The held requests per model key ("namespace/name"), summed over routers."""
        return self._merged

    def routers(self) -> tuple[RouterPod, ...]:
        return tuple(self._polls)

    async def run(self, leading: asyncio.Event) -> None:
        """List the routers and keep one poll per router while leading; stop
        every poll (and forget what they said) when the Lease is lost."""
        async with self.session():
            try:
                while True:
                    await leading.wait()
                    await self.refresh()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(_cleared(leading), timeout=self.list_every)
                    if not leading.is_set():
                        await self.retarget(())
            finally:
                await self.retarget(())

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
                self._session = None

    async def refresh(self) -> None:
        """List the router pods and poll exactly those (a failed list keeps
        the polls as they are)."""
        try:
            pods = await self.find()
        except Exception as exc:  # the API server's trouble: keep what runs
            if not self._list_failed:
                log.warning("listing the router's endpoints failed (%s: %.200s); "
                            "polling the routers known", type(exc).__name__, exc)
            self._list_failed = True
            return
        if self._list_failed:
            log.info("listing the router's endpoints works again")
        self._list_failed = False
        await self.retarget(pods)

    async def retarget(self, pods: tuple[RouterPod, ...]) -> None:
        """Poll exactly `pods`: start the new ones' polls, stop the others'."""
        wanted = set(pods)
        gone = [p for p in self._polls if p not in wanted]
        for pod in gone:
            self._polls.pop(pod).cancel()
        for pod in pods:
            if pod not in self._polls:
                self._polls[pod] = asyncio.create_task(self._poll(pod),
                                                       name=f"waiting {pod.name}")
        for pod in gone:
            self._forget(pod)

    async def _poll(self, pod: RouterPod) -> None:
        serial: int | None = None
        failures = 0
        while True:
            started = self.clock()
            query = f"?wait={self.wait_s:g}" + ("" if serial is None else f"&after={serial}")
            try:
                async with asyncio.timeout(self.wait_s + POLL_GRACE_S):
                    answer = parse_waiting(await self._get(pod.admin_url + WAITING_PATH + query))
            except Exception as exc:  # TimeoutError, a refused connection, BadWaiting...
                failures += 1
                if failures == 1:
                    log.warning("router %s (%s): /waiting failed (%s: %.200s); its held requests "
                                "no longer count, asking again with backoff", pod.name, pod.ip,
                                type(exc).__name__, exc)
                serial = None
                self._forget(pod)
                await asyncio.sleep(retry_in(failures))
                continue
            if failures:
                log.info("router %s (%s): /waiting answers again", pod.name, pod.ip)
            failures = 0
            serial = answer.serial
            self._record(pod, answer)
            await asyncio.sleep(max(0.0, MIN_GAP_S - (self.clock() - started)))

    async def _get(self, url: str) -> bytes:
        """The body of a 200 answer, at most MAX_BYTES; BadWaiting otherwise."""
        assert self._session is not None, "use `async with watch.session()`"
        async with self._session.get(url, allow_redirects=False) as resp:
            if resp.status != 200:
                raise BadWaiting(f"answered {resp.status}")
            if resp.content_length is not None and resp.content_length > MAX_BYTES:
                raise BadWaiting(f"announced {resp.content_length} bytes")
            body = bytearray()
            while chunk := await resp.content.read(MAX_BYTES + 1 - len(body)):
                body += chunk
                if len(body) > MAX_BYTES:
                    raise BadWaiting(f"longer than {MAX_BYTES} bytes")
            return bytes(body)

    def _record(self, pod: RouterPod, answer: Waiting) -> None:
        self._answers[_key(pod)] = answer
        self.answers += 1
        self._merge()

    def _forget(self, pod: RouterPod) -> None:
        if self._answers.pop(_key(pod), None) is not None:
            self._merge()

    def _merge(self) -> None:
        """Keep the merge; ask for a pass when which models are held, or how
        many, changed (not for the oldest's age alone: it grows with every
        answer while anything is held)."""
        self._merged = merge_waiting(self._answers)
        told = tuple((k, m.held, m.foreground) for k, m in self._merged.items())
        if told != self._told:
            self._told = told
            self.on_change()


def _key(pod: RouterPod) -> str:
    return f"{pod.name}@{pod.ip}:{pod.port}"


async def _cleared(event: asyncio.Event) -> None:
    """Return once `event` is cleared (polled: asyncio.Event has no wait for that)."""
    while event.is_set():
        await asyncio.sleep(1.0)
