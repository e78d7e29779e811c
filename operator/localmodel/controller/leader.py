"""Leader election on a coordination.k8s.io Lease (client-go's algorithm, small).

Why a Lease rather than kopf peering: kopf's peering pauses operators of the
same priority instead of electing one, needs its own cluster-scoped CRD, and
its default lifetime makes failover take a minute; a Lease is what every
Kubernetes controller uses, needs one namespaced object, and fails over in
`lease_seconds`. Every replica watches and keeps its caches warm; only the
holder reconciles, so two replicas never write at once.

Expiry is judged by the local clock from when this replica last *saw the
record change* (as client-go does), never by comparing another machine's
timestamps, so clock skew cannot make two holders. The holder stops acting
when it cannot renew within `renew_deadline` (< lease duration), before a
follower may take over.

The rounds run on a thread of their own (`LeaseThread`), with an event loop
and an HTTP client of their own: a pass holds the operator's event loop for
seconds of CPU at a thousand models (observe, plan), and a renewal waiting
for that loop came too late (nine lost Leases in one converge run at 1 000
models, docs/benchmarks.md). A thread is what cannot be starved: CPython
hands the interpreter to another thread every few milliseconds
(`sys.getswitchinterval`), whatever the pass does in between, where making
every pass yield would hold only while every piece of it remembered to.

The elector's state is shared with the operator's loop under a lock; the
loop learns of a change through `on_change` (called on the Lease's thread:
the caller hands it over with `call_soon_threadsafe`). Every write the
operator sends asks `holds()` first (the writer's fence,
`writer.Kube(fence=...)`): a pass that held the loop while the Lease was lost
finds out at its next write, before it is sent, not only once the loop has
caught up with the news.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import datetime as dt
import logging
import threading
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any

from localmodel.controller.writer import Kube, KubeError, collection_path, object_path
from localmodel.metrics import Counter

log = logging.getLogger("localmodel.leader")

# Why this replica stopped leading without giving the Lease up (the label
# values of localmodel_operator_leases_lost_total).
LOST_DEADLINE = "renewal_deadline"  # no renewal went through within renew_deadline
LOST_TAKEN = "taken"  # another replica holds it (it saw the Lease expire)
LOST_TASK = "task_failed"  # the Lease's task failed (the supervisor restarts it)
LOST_REASONS = (LOST_DEADLINE, LOST_TAKEN, LOST_TASK)


def leases_lost_counter() -> Counter:
    """localmodel_operator_leases_lost_total, every series from the start (it is
    incremented on the Lease's thread: no series is added while one renders)."""
    return Counter(
        "localmodel_operator_leases_lost_total",
        "Times this replica stopped leading other than by giving the Lease up, by reason "
        "(renewal_deadline: no renewal went through in time; taken: another replica "
        "holds it; task_failed: the Lease's task failed).", ("reason",),
        values={(why,): 0.0 for why in LOST_REASONS})


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class LeaderElector:
    """Keeps the operator's leadership: takes and renews its Lease, and says when it is won or
    lost."""

    kube: Kube | None  # the Lease's own client, on the loop the rounds run on
    namespace: str
    name: str
    identity: str
    lease_seconds: float = 12.0
    renew_seconds: float = 4.0
    retry_seconds: float = 2.0
    # Both are called on the thread the rounds run on.
    on_change: Callable[[bool], None] | None = None
    on_lost: Callable[[str], None] | None = None
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._leading = False
        self._observed: tuple[str, float] | None = None  # (resourceVersion, monotonic seen)
        # When the round of the last renewal that went through began (monotonic):
        # the Lease was valid from no earlier than that.
        self._last_renew = 0.0
        self.transitions = 0
        # When the API server last answered a round (monotonic; any HTTP answer
        # counts, a refusal too): what `supervise.watch_api` reads.
        self.last_answer = self.clock()

    @property
    def renew_deadline(self) -> float:
        return self.lease_seconds * 2 / 3

    @property
    def leading(self) -> bool:
        return self._leading

    def holds(self) -> bool:
        """Whether this replica may write now: it leads, and its last renewal
        began less than `renew_deadline` ago (any thread; the writer's fence)."""
        with self._lock:
            return self._leading and self.clock() - self._last_renew < self.renew_deadline

    def _renewed(self, began: float) -> None:
        with self._lock:
            self._last_renew = began

    def _lease(self, rv: str | None, acquire: bool, transitions: int) -> dict[str, Any]:
        now = _now()
        spec: dict[str, Any] = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.lease_seconds)),
            "renewTime": now,
            "leaseTransitions": transitions,
        }
        if acquire:
            spec["acquireTime"] = now
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if rv:
            meta["resourceVersion"] = rv
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta,
                "spec": spec}

    def _set(self, leading: bool, lost: str = "") -> None:
        """`lost`: why leading ended, when it ends other than by a release."""
        with self._lock:
            if leading == self._leading:
                return
            self._leading = leading
        if leading:
            log.info("became the leader (Lease %s/%s, identity %s)", self.namespace, self.name,
                     self.identity)
        else:
            log.warning("lost the leadership (Lease %s/%s)%s", self.namespace, self.name,
                        f": {lost}" if lost else "")
            if lost and self.on_lost:
                self.on_lost(lost)
        if self.on_change:
            self.on_change(leading)

    def _client(self) -> Kube:
        if self.kube is None:
            raise RuntimeError("the elector has no client: run it through LeaseThread")
        return self.kube

    async def try_once(self) -> bool:
        """One round: acquire, renew or observe. Returns whether we lead."""
        kube = self._client()
        began = self.clock()
        path = object_path("Lease", self.namespace, self.name)
        try:
            lease = await kube.get(path)
        except KubeError as exc:
            if exc.status != 404:
                raise
            try:
                await kube.request("POST", collection_path("Lease", self.namespace),
                                   self._lease(None, True, 0), kind="Lease")
            except KubeError as exc2:
                if exc2.status == 409:
                    return False
                raise
            self._renewed(began)
            return True
        meta, spec = lease.get("metadata", {}), lease.get("spec") or {}
        rv = str(meta.get("resourceVersion", ""))
        holder = spec.get("holderIdentity") or ""
        transitions = int(spec.get("leaseTransitions") or 0)
        mono = self.clock()
        if self._observed is None or self._observed[0] != rv:
            self._observed = (rv, mono)
        if holder == self.identity:
            if mono - self._last_renew < self.renew_seconds and self._leading:
                return True
            await kube.request("PUT", path, self._lease(rv, False, transitions), kind="Lease")
            self._renewed(began)
            return True
        duration = float(spec.get("leaseDurationSeconds") or self.lease_seconds)
        expired = not holder or mono - self._observed[1] > duration
        if not expired:
            return False
        await kube.request("PUT", path, self._lease(rv, True, transitions + 1), kind="Lease")
        self._renewed(began)
        self.transitions += 1
        log.info("took over the Lease from %r", holder or "nobody")
        return True

    async def run(self) -> None:
        while True:
            try:
                # A round that hangs must not keep the holder leading: it ends by
                # the renewal deadline, as a failed one.
                leading = await asyncio.wait_for(self.try_once(), self.renew_deadline)
                self.last_answer = self.clock()
                lost = LOST_TAKEN
            except (TimeoutError, KubeError, OSError) as exc:
                if isinstance(exc, KubeError):
                    self.last_answer = self.clock()  # refused, but it answered
                # 409: someone else renewed or took it first; anything else: the
                # API is unreachable. Either way, stop acting once the renewal
                # deadline passes without a successful renewal.
                log.debug("leader election round failed: %r", exc)
                leading = self.holds()
                lost = LOST_DEADLINE
            self._set(leading, lost)
            # The next renewal begins `renew_seconds` after the last one began,
            # not after it ended: on a slow API server (seconds per request) a
            # sleep after each round let the fence's deadline pass between
            # successful renewals (converge at 300 models, load 25).
            await asyncio.sleep(self._until_next() if leading else self.retry_seconds)

    def _until_next(self) -> float:
        return max(0.0, self._last_renew + self.renew_seconds - self.clock())

    def step_down(self) -> None:
        """Stop acting as the leader at once (this replica's Lease task failed: it
        cannot renew, so it must not write). The next round of a restarted task
        renews or takes the Lease again."""
        self._renewed(0.0)
        self._set(False, LOST_TASK)

    async def release(self) -> None:
        """Give the Lease up on shutdown so a follower takes over at once."""
        if not self._leading:
            return
        kube = self._client()
        path = object_path("Lease", self.namespace, self.name)
        try:
            lease = await kube.get(path)
            if (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            body = self._lease(str(lease["metadata"]["resourceVersion"]), False,
                               int((lease.get("spec") or {}).get("leaseTransitions") or 0))
            body["spec"]["holderIdentity"] = ""
            body["spec"]["leaseDurationSeconds"] = 1
            await kube.request("PUT", path, body, kind="Lease")
        except (TimeoutError, KubeError, OSError) as exc:
            log.warning("could not release the Lease: %s", exc)
        finally:
            self._renewed(0.0)
            self._set(False)


class LeaseThread:
    """Runs an elector's rounds on a thread of its own, with its own event loop
    and its own client (`client()` opens one, on that loop), so that nothing
    the operator's loop does can delay a renewal.

    `run()` is the supervisor's job, on the operator's loop: it starts the
    thread and returns (or raises) when the rounds end; cancelling it stops
    them. `release()` stops the rounds and gives the Lease up, on that thread;
    after it, `run()` starts nothing again (a supervisor's restart must not
    take the Lease back during shutdown)."""

    def __init__(self, elector: LeaderElector,
                 client: Callable[[], AbstractAsyncContextManager[Kube]]) -> None:
        self.elector = elector
        self._client = client
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._thread: threading.Thread | None = None
        self._done: concurrent.futures.Future[None] | None = None
        self._release = False
        self._closed = False

    async def run(self) -> None:
        if self._closed:
            await asyncio.Event().wait()  # released: until cancelled
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        thread = threading.Thread(target=self._main, args=(done,), name="lease", daemon=True)
        with self._lock:
            self._done, self._thread = done, thread
        thread.start()
        try:
            await asyncio.wrap_future(done)
        finally:
            self._stop(release=False)
            thread.join(timeout=10)
        if self._closed:  # released (shutdown): not an end to restart from
            await asyncio.Event().wait()

    async def release(self) -> None:
        """Stop the rounds and give the Lease up (shutdown), waiting 10 s at most."""
        self._closed = True
        done = self._done
        if done is None or done.done():
            self.elector._set(False)
            return
        self._stop(release=True)
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.wrap_future(done), 10)
        self.elector._set(False)

    def _stop(self, release: bool) -> None:
        with self._lock:
            self._release = self._release or release
            loop, task = self._loop, self._task
        if loop is not None and task is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # its loop closed meanwhile
                loop.call_soon_threadsafe(task.cancel)

    def _main(self, done: concurrent.futures.Future[None]) -> None:
        try:
            asyncio.run(self._rounds())
        except BaseException as exc:  # handed to the operator's loop, which logs it
            if not done.done():
                done.set_exception(exc)
        else:
            if not done.done():
                done.set_result(None)
        finally:
            with self._lock:
                self._loop = self._task = None

    async def _rounds(self) -> None:
        with self._lock:
            self._loop, self._task = asyncio.get_running_loop(), asyncio.current_task()
            if self._release or self._closed:
                return
        async with self._client() as kube:
            self.elector.kube = kube
            try:
                await self.elector.run()
            except asyncio.CancelledError:
                if self._release:
                    await self.elector.release()
                    return
                raise
            finally:
                self.elector.kube = None
