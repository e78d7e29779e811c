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
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from localmodel.controller.writer import Kube, KubeError, collection_path, object_path

log = logging.getLogger("localmodel.leader")


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class LeaderElector:
    kube: Kube
    namespace: str
    name: str
    identity: str
    lease_seconds: float = 12.0
    renew_seconds: float = 4.0
    retry_seconds: float = 2.0
    on_change: Callable[[bool], None] | None = None

    def __post_init__(self) -> None:
        self.leading = asyncio.Event()
        self._observed: tuple[str, float] | None = None  # (resourceVersion, monotonic seen)
        self._last_renew = 0.0
        self.transitions = 0
        # When the API server last answered a round (monotonic; any HTTP answer
        # counts, a refusal too): what `supervise.watch_api` reads.
        self.last_answer = time.monotonic()

    @property
    def renew_deadline(self) -> float:
        return self.lease_seconds * 2 / 3

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

    def _set(self, leading: bool) -> None:
        if leading == self.leading.is_set():
            return
        if leading:
            self.leading.set()
            log.info("became the leader (Lease %s/%s, identity %s)", self.namespace, self.name,
                     self.identity)
        else:
            self.leading.clear()
            log.warning("lost the leadership (Lease %s/%s)", self.namespace, self.name)
        if self.on_change:
            self.on_change(leading)

    async def try_once(self) -> bool:
        """One round: acquire, renew or observe. Returns whether we lead."""
        path = object_path("Lease", self.namespace, self.name)
        try:
            lease = await self.kube.get(path)
        except KubeError as exc:
            if exc.status != 404:
                raise
            try:
                await self.kube.request("POST", collection_path("Lease", self.namespace),
                                        self._lease(None, True, 0), kind="Lease")
            except KubeError as exc2:
                if exc2.status == 409:
                    return False
                raise
            self._last_renew = time.monotonic()
            return True
        meta, spec = lease.get("metadata", {}), lease.get("spec") or {}
        rv = str(meta.get("resourceVersion", ""))
        holder = spec.get("holderIdentity") or ""
        transitions = int(spec.get("leaseTransitions") or 0)
        mono = time.monotonic()
        if self._observed is None or self._observed[0] != rv:
            self._observed = (rv, mono)
        if holder == self.identity:
            if mono - self._last_renew < self.renew_seconds and self.leading.is_set():
                return True
            await self.kube.request("PUT", path, self._lease(rv, False, transitions),
                                    kind="Lease")
            self._last_renew = time.monotonic()
            return True
        duration = float(spec.get("leaseDurationSeconds") or self.lease_seconds)
        expired = not holder or mono - self._observed[1] > duration
        if not expired:
            return False
        await self.kube.request("PUT", path, self._lease(rv, True, transitions + 1),
                                kind="Lease")
        self._last_renew = time.monotonic()
        self.transitions += 1
        log.info("took over the Lease from %r", holder or "nobody")
        return True

    async def run(self) -> None:
        while True:
            try:
                leading = await self.try_once()
                self.last_answer = time.monotonic()
            except (TimeoutError, KubeError, OSError) as exc:
                if isinstance(exc, KubeError):
                    self.last_answer = time.monotonic()  # refused, but it answered
                # 409: someone else renewed or took it first; anything else: the
                # API is unreachable. Either way, stop acting once the renewal
                # deadline passes without a successful renewal.
                log.debug("leader election round failed: %s", exc)
                leading = (self.leading.is_set()
                           and time.monotonic() - self._last_renew < self.renew_deadline)
            self._set(leading)
            await asyncio.sleep(self.renew_seconds if leading else self.retry_seconds)

    def step_down(self) -> None:
        """Stop acting as the leader at once (this replica's Lease task failed: it
        cannot renew, so it must not write). The next round of a restarted task
        renews or takes the Lease again."""
        self._last_renew = 0.0
        self._set(False)

    async def release(self) -> None:
        """Give the Lease up on shutdown so a follower takes over at once."""
        if not self.leading.is_set():
            return
        path = object_path("Lease", self.namespace, self.name)
        try:
            lease = await self.kube.get(path)
            if (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            body = self._lease(str(lease["metadata"]["resourceVersion"]), False,
                               int((lease.get("spec") or {}).get("leaseTransitions") or 0))
            body["spec"]["holderIdentity"] = ""
            body["spec"]["leaseDurationSeconds"] = 1
            await self.kube.request("PUT", path, body, kind="Lease")
        except (TimeoutError, KubeError, OSError) as exc:
            log.warning("could not release the Lease: %s", exc)
        self._set(False)
