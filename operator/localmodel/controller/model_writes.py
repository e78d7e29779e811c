"""One model's writes of a pass (`ModelWriter`): its changes (a pod's claim and
ConfigMap before the pod), its status and its Events, each write bounded by
the client's connections; and what the writes keep between passes: what was
written and not yet shown by the watches, which status was written, which
failures were told, and the models whose last work needed no write.

A failure in one model's writes is that model's (an Event, the metric, a
retry), never the pass's: the others go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from localmodel import API_VERSION, KIND
from localmodel.api import LocalModelStatus
from localmodel.controller.changes import (
    Apply,
    Change,
    Create,
    Delete,
    ModelChanges,
    Target,
    mounted,
)
from localmodel.controller.expectations import EXPECT_SECONDS, Expectations
from localmodel.controller.model_work import ModelWork
from localmodel.controller.objects import ModelObject
from localmodel.controller.observed import Observed
from localmodel.controller.operator_metrics import OperatorMetrics
from localmodel.controller.refused import event_settled, refusal, settled, status_settled
from localmodel.controller.reports import RETRY_SECONDS, Failures, Involved, event_manifest
from localmodel.controller.writer import Kube, KubeError, NotLeading
from localmodel.events import EventReason, EventSpec, status_events
from localmodel.status import status_body, status_changed

log = logging.getLogger("localmodel.reconcile")


@dataclass
class PassResult:
    """What one pass did: its writes, the ones that failed, the models it saw."""

    writes: int = 0
    failures: int = 0
    models: int = 0


def _is_pod_create(change: Change) -> bool:
    return isinstance(change, Create) and change.manifest.get("kind") == "Pod"


class ModelWriter:
    """Writes each model's share of a pass, and keeps what its writes left."""

    def __init__(self, kube: Kube, metrics: OperatorMetrics, identity: str,
                 concurrency: int, trigger_later: Callable[[float], None]) -> None:
        self.kube = kube
        self.metrics = metrics
        self.identity = identity
        self.trigger_later = trigger_later  # wake the reconciler then (a retry)
        # Every write of a pass (objects, statuses, Events) takes one of these
        # first, as many as the client has connections: a request waits here,
        # not in the client's pool, whose time limit would count the wait (at
        # 1 000 models, writes timed out queued behind each other).
        self._writing = asyncio.Semaphore(concurrency)
        self.expected = Expectations()  # writes the watches have not shown yet
        self._written_status: dict[str, tuple[str, str]] = {}  # model -> (rv seen, body's)
        self.failed_models: dict[str, str] = {}  # model -> the failure its Event told
        self._failures = Failures()
        self.idle: dict[str, ModelWork] = {}  # model -> its last work, if it wrote nothing

    def forget_gone(self, obs: Observed) -> None:
        """Forget what the watches show written, and the models that are gone."""
        self.expected.forget_shown(obs, time.monotonic())
        self.failed_models = {k: v for k, v in self.failed_models.items() if k in obs.models}
        if len(self.idle) > len(obs.models):
            self.idle = {k: w for k, w in self.idle.items() if k in obs.models}

    async def model(self, work: ModelWork, now: str, result: PassResult, obs: Observed,
                     extra: list[EventSpec]) -> None:
        """One model's writes; an exception in them is this model's failure (an
        Event, the metric, a retry), never the pass's: the others go on."""
        key = work.model.key
        if work.failure:
            self.metrics.model_failures.inc(labels=("compute",))
            log.error("%s: %s", key, work.failure)
            self.trigger_later(RETRY_SECONDS[-1])
            if self.failed_models.get(key) != work.failure:
                self.failed_models[key] = work.failure
                extra = [*extra, EventSpec(EventReason.RECONCILE_FAILED,
                                           f"the operator failed on this model: {work.failure}",
                                           warning=True)]
        else:
            self.failed_models.pop(key, None)
        self.idle.pop(key, None)
        try:
            if not (await self._model_writes(work, now, result, obs, extra) or work.failure
                    or work.changes.changes):
                self.idle[key] = work
        except NotLeading:
            raise  # the Lease is not held: the pass ends (`run`), no model failed
        except Exception as exc:  # (a cancellation is not an Exception: it passes)
            result.failures += 1
            self.metrics.model_failures.inc(labels=("write",))
            log.exception("%s: writing this model failed; the pass goes on", key)
            self.trigger_later(RETRY_SECONDS[-1])
            with contextlib.suppress(Exception):
                await self.event(work.model, EventSpec(
                    EventReason.RECONCILE_FAILED, "the operator failed writing this model: "
                    f"{type(exc).__name__}: {str(exc)[:300]}", warning=True), now)

    async def _model_writes(self, work: ModelWork, now: str, result: PassResult, obs: Observed,
                            extra: list[EventSpec]) -> bool:
        """Whether it posted an Event or wrote (or had to write) the status."""
        mo, status = work.model, work.status
        events, failed = await self._write_changes(mo, work.changes, obs, result)
        events = list(extra) + events
        retry_in, failure = self._failures.after_pass(mo.key, failed)
        if retry_in is not None:
            self.trigger_later(retry_in)
        if failure is not None:
            events.append(failure)
        events = status_events(mo.status, status) + events
        if status.idle is not None:
            self.metrics.idle.transition(mo.key, mo.status, status)
        for event in events:
            await self.event(mo, event, now)
        if not status_changed(mo.status, status):
            return bool(events)
        # (a digest of the body, not the body: one per model is kept)
        body = hashlib.sha256(json.dumps(status_body(status), sort_keys=True).encode()).hexdigest()
        # Written already, and the watch has not shown it yet: not again.
        if self._written_status.get(mo.key) != (
            mo.resource_version, body
        ) and await self._write_status(mo, status):
            self._written_status[mo.key] = (mo.resource_version, body)
        return True

    async def _write_changes(self, mo: ModelObject, changes: ModelChanges, obs: Observed,
                             result: PassResult) -> tuple[list[EventSpec], list[str]]:
        """Make the changes the watches do not show yet: the Events they earned,
        and why the ones that failed did."""
        events: list[EventSpec] = []
        failed: list[str] = []
        unmade: set[Target] = set()  # objects this pass failed to create or apply

        async def one(change: Change) -> None:
            if self.expected.waiting(change, obs, time.monotonic()):
                # Held back until the watches show it; look again once the wait
                # is over, should no watch event come (a pod made, then deleted
                # by someone else before it was seen).
                self.trigger_later(EXPECT_SECONDS + 0.5)
                return
            async with self._writing:
                try:
                    await self._write(change)
                except KubeError as exc:
                    if not settled(change, refusal(exc.status, exc.causes)):
                        result.failures += 1
                        failed.append(str(exc))
                        log.warning("%s: %s", mo.key, exc)
                        if not isinstance(change, Delete):
                            unmade.add(change.target)
                    return
                except (TimeoutError, OSError) as exc:
                    result.failures += 1
                    failed.append(f"API unreachable: {exc}")
                    if not isinstance(change, Delete):
                        unmade.add(change.target)
                    return
            self.expected.wrote(change, time.monotonic())
            result.writes += 1
            if change.event is not None:
                events.append(change.event)

        # A pod's claim and ConfigMap first: a pod the scheduler sees before its
        # claim exists fails scheduling and waits out a back-off. A pod whose
        # claim or ConfigMap could not be made waits for a later pass (the
        # failure retries it).
        await asyncio.gather(*(one(c) for c in changes.changes if not _is_pod_create(c)))
        ready: list[Change] = []
        for c in changes.changes:
            if not _is_pod_create(c):
                continue
            assert isinstance(c, Create)
            if waits_for := sorted(mounted(c.manifest) & unmade):
                log.info("%s: pod %s not created yet: %s not made", mo.key, c.target.name,
                         ", ".join(f"{t.kind} {t.name}" for t in waits_for))
            else:
                ready.append(c)
        await asyncio.gather(*(one(c) for c in ready))
        return events, failed

    async def _write(self, change: Change) -> None:
        if isinstance(change, Create):
            await self.kube.create(change.manifest)
        elif isinstance(change, Apply):
            await self.kube.apply(change.manifest)
        else:
            await self.kube.delete(change.kind, change.namespace, change.name, change.uid,
                                   force=change.force)
        log.info("%s %s %s/%s: %s", type(change).__name__.lower(), *change.target, change.why)

    async def _write_status(self, mo: ModelObject, status: LocalModelStatus) -> bool:
        body = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": mo.name, "namespace": mo.namespace},
            "status": status_body(status),
        }
        try:
            async with self._writing:
                await self.kube.apply(body, subresource="status")
        except KubeError as exc:
            if not status_settled(refusal(exc.status, exc.causes)):  # a model gone needs none
                log.warning("%s: status not written: %s", mo.key, exc)
                self.trigger_later(RETRY_SECONDS[1])
            return False
        except (TimeoutError, OSError) as exc:
            log.warning("%s: status not written: %s", mo.key, exc)
            self.trigger_later(RETRY_SECONDS[1])
            return False
        return True

    async def event(self, mo: ModelObject, event: EventSpec, now: str) -> None:
        body = event_manifest(Involved(mo.namespace, mo.name, mo.uid), event, now, self.identity)
        try:
            async with self._writing:
                await self.kube.create(body)
        except KubeError as exc:
            if not event_settled(refusal(exc.status, exc.causes)):
                log.warning("%s: event not posted: %s", mo.key, exc)
        except (TimeoutError, OSError) as exc:
            log.warning("%s: event not posted: %s", mo.key, exc)
