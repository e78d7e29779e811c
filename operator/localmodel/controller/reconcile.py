"""The one reconciler: wait for a trigger, debounce, snapshot, plan, apply, report.

One task, because the planner is global (exclusive models claim whole nodes):
per-object handlers planning at once could put two models on one node. Every
watch event only records and triggers; a pass reads the whole in-memory
snapshot (`indexes`, kept by kopf from its watches: nothing here lists the
cluster), calls the pure core (`observe`, then `policy.plan_pass`: desired
state and each model's changes and status; `policy` also decides what a
refused write means, what the watches have yet to show and which nodes a model
avoids), then writes what differs and posts the Events. A pass that fails
part-way is harmless: the next one starts again from what the watches show.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from localmodel import API_VERSION, KIND
from localmodel.api import LocalModelStatus
from localmodel.contract import OPERATOR
from localmodel.controller.changes import (
    Apply,
    Change,
    Create,
    Delete,
    ModelChanges,
    Target,
    mounted,
)
from localmodel.controller.clock import rfc3339
from localmodel.controller.config import OperatorConfig
from localmodel.controller.expectations import EXPECT_SECONDS, Expectations
from localmodel.controller.model_work import ModelWork, PassPlan
from localmodel.controller.objects import ModelObject
from localmodel.controller.observed import Observed, changed_keys, unschedulable
from localmodel.controller.operator_metrics import ConditionTally, OperatorMetrics
from localmodel.controller.parse_memo import Parsed
from localmodel.controller.plan import plan_pass
from localmodel.controller.refused import event_settled, refusal, settled, status_settled
from localmodel.controller.reports import RETRY_SECONDS, Failures, Involved, event_manifest
from localmodel.controller.secrets import MAX_AGE_SECONDS as SECRET_MAX_AGE
from localmodel.controller.secrets import SecretLabels
from localmodel.controller.signing import RouterSigning
from localmodel.controller.snapshot import Snapshot, observe
from localmodel.controller.speed import SpeedBook
from localmodel.controller.stuck import avoid_stuck
from localmodel.controller.watched import WATCHED
from localmodel.controller.work_memo import KeptWork
from localmodel.controller.writer import Kube, KubeError, NotLeading
from localmodel.events import EventReason, EventSpec, status_events
from localmodel.incremental import Desired
from localmodel.render import RenderOptions
from localmodel.status import status_body, status_changed
from localmodel.tenancy import needs_secrets

log = logging.getLogger("localmodel.reconcile")


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Hold the cycle collector off while a pass computes. A pass allocates
    container objects by the hundred thousand and keeps most of them, and the
    collector's repeated scans of everything alive cost more than the pass
    itself (measured: a cold pass at 4k nodes 3.7 s with it, 1.7 s paused,
    docs/benchmarks.md). Reference counting still frees what a pass drops at
    once; one collection of the young generations afterwards finds any cycles."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect(1)


@dataclass
class PassResult:
    writes: int = 0
    failures: int = 0
    models: int = 0


def _is_pod_create(change: Change) -> bool:
    return isinstance(change, Create) and change.manifest.get("kind") == "Pod"


def render_options(config: OperatorConfig) -> RenderOptions:
    """What the operator's settings give every render."""
    return RenderOptions(
        operator_image=config.operator_image,
        allow_http_downloads=config.allow_http_downloads,
        network_policy=config.network_policy,
        image_registry=config.image_registry,
        image_pull_secrets=config.image_pull_secrets,
        # The operator's own namespace first: it reads the gateways' /speed.
        admin_namespaces=tuple(dict.fromkeys((config.leader_namespace,
                                              *config.admin_namespaces))),
        router_namespace=config.router_namespace,
    )


class Reconciler:
    def __init__(
        self,
        config: OperatorConfig,
        kube: Kube,
        metrics: OperatorMetrics,
        *,
        identity: str = OPERATOR,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.kube = kube
        self.metrics = metrics
        self.identity = identity
        self.clock = clock
        self.sources: dict[str, Callable[[], Iterable[Mapping[str, Any]]]] = {}
        self._wake = asyncio.Event()
        self._first_trigger = 0.0
        self._failures = Failures()
        self._retry: asyncio.TimerHandle | None = None
        self.synced = asyncio.Event()
        self.passes = 0
        self._current: asyncio.Task[PassResult] | None = None
        self._aborted = False
        # model -> node -> until when: nodes whose pods stayed Unschedulable
        self.avoid: dict[str, dict[str, float]] = {}
        self._reported_stuck: dict[str, str] = {}  # pod -> message already reported
        self._expected = Expectations()  # writes the watches have not shown yet
        self._written_status: dict[str, tuple[str, str]] = {}  # model -> (rv seen, body's)
        self._placed: dict[str, dict[int, str]] = {}  # the last pass's placements
        self._failed_models: dict[str, str] = {}  # model -> the failure its Event told
        self._render_options = render_options(config)
        # Each Ready replica's speed, filled by controller.speed.SpeedReader.
        self.speed = SpeedBook(config.speed_policy)
        self.speed_wake: Callable[[], None] = lambda: None  # a replica to read appeared
        metrics.speed_ratios = self.speed.ratios
        self._parsed = Parsed()  # each stored version of a model or node parsed once
        self._desired = Desired()  # what passes worked out, reused while its inputs hold
        self._kept = KeptWork()  # each model's changes and status, the same way
        self._tally = ConditionTally()
        self._idle: dict[str, ModelWork] = {}  # model -> its last work, if it wrote nothing
        # The number of the last plan whose work was all gone through, and that
        # work's models that were not idle (`PassPlan.since`: the next plan's
        # other models have the same, idle work).
        self._serial: int | None = None
        self._busy: dict[str, ModelWork] = {}
        self._wanted: tuple[object, set[tuple[str, str]]] = (None, set())
        self._needs: dict[str, tuple[tuple[str, str], ...]] = {}  # model -> Secrets it names
        # Every write of a pass (objects, statuses, Events) takes one of these
        # first, as many as the client has connections: a request waits here,
        # not in the client's pool, whose time limit would count the wait (at
        # 1 000 models, writes timed out queued behind each other).
        self._writing = asyncio.Semaphore(config.write_concurrency)
        self._secrets = SecretLabels(kube)  # named Secrets' labels, for the policy
        self._signing = RouterSigning.of(kube, config, self.trigger_later)  # router's key

    def abort_pass(self) -> None:
        """Stop a pass under way (this replica lost the Lease: it must not write)."""
        if self._current is not None and not self._current.done():
            self._aborted = True
            self._current.cancel()

    # ---- triggers ---------------------------------------------------------

    def trigger(self) -> None:
        if not self._wake.is_set():
            self._first_trigger = time.monotonic()
        self._wake.set()

    def trigger_later(self, seconds: float) -> None:
        """Wake the reconciler in `seconds` (one timer: the earliest wins)."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        pending = self._retry is not None and self._retry.when() > now
        if pending and self._retry is not None and self._retry.when() <= now + seconds:
            return
        if self._retry is not None:
            self._retry.cancel()
        self._retry = loop.call_later(seconds, self.trigger)

    def snapshot(self) -> Snapshot:
        def take(name: str) -> list[Mapping[str, Any]]:
            source = self.sources.get(name)
            return list(source()) if source else []

        return Snapshot(**{w.name: take(w.name) for w in WATCHED})

    # ---- the loop ----------------------------------------------------------

    async def run(self, leading: asyncio.Event) -> None:
        await self.synced.wait()
        while True:
            await self._wake.wait()
            await leading.wait()
            await self._quiet()
            started = time.monotonic()
            self._current = asyncio.create_task(self.reconcile_once())
            try:
                result = await self._current
            except (asyncio.CancelledError, NotLeading) as exc:  # NotLeading: the fence's
                if isinstance(exc, asyncio.CancelledError) and not self._aborted:
                    raise
                self._aborted = False
                log.warning("reconcile pass aborted: leadership lost")
                self.metrics.passes.inc(labels=("aborted",))
                self.trigger_later(RETRY_SECONDS[0])  # it runs once the Lease is held
                continue
            except Exception:  # one bad pass must never stop the operator
                log.exception("reconcile pass failed; retrying")
                self.metrics.passes.inc(labels=("error",))
                self.trigger_later(RETRY_SECONDS[1])
                continue
            finally:
                self.metrics.pass_seconds.observe(time.monotonic() - started)
            self.passes += 1
            self.metrics.passes.inc(labels=("failed" if result.failures else "ok",))

    async def _quiet(self) -> None:
        """Coalesce a burst: wait until it is quiet, but not forever."""
        while True:
            self._wake.clear()
            waited = time.monotonic() - self._first_trigger
            quiet = min(self.config.debounce_seconds,
                        max(0.0, self.config.max_delay_seconds - waited))
            if quiet <= 0:
                break
            await asyncio.sleep(quiet)
            if not self._wake.is_set():
                break
        self._wake.clear()

    async def reconcile_once(self) -> PassResult:
        now = self.clock()
        now_s = rfc3339(now)
        with gc_paused():
            obs = observe(self.snapshot(), self.config.namespaces, self._parsed)
            self._expected.forget_shown(obs, time.monotonic())
            self._failed_models = {k: v for k, v in self._failed_models.items()
                                   if k in obs.models}
            for name, why in obs.bad_nodes.items():
                log.warning("node %s is left out of placement: %s", name, why)
            extra_events = self._avoid_stuck(obs, now)
            secrets = await self._secret_labels(obs)
            if self._signing is not None:
                self._render_options = await self._signing.options(self._render_options)
            planned = self._plan(obs, now_s, secrets)
        result = PassResult(models=len(obs.models))
        since = planned.since
        new = ({} if planned.serial == self._serial else since[1]
               if since is not None and since[0] == self._serial else None)
        if new is not None and not extra_events:  # only `new` differs from the work gone through
            if not new and not self._busy:
                return result  # the very work gone through, all of which needed no write
            work = {**self._busy, **new}
            if new:
                self.metrics.models_by_condition = self._tally.recount(
                    {k: w.status for k, w in new.items()})
        else:
            work = {w.model.key: w for w in planned.work}
            self.metrics.models_by_condition = self._tally.count(
                {k: w.status for k, w in work.items()})
        if len(self._idle) > len(obs.models):
            self._idle = {k: w for k, w in self._idle.items() if k in obs.models}
        idle = self._idle
        await asyncio.gather(*(self._model(w, now_s, result, obs, extra_events.get(k, []))
                               for k, w in work.items() if idle.get(k) is not w
                               or k in extra_events))
        self._busy = {k: w for k, w in work.items() if idle.get(k) is not w}
        self._serial = planned.serial
        return result

    async def _secret_labels(self, obs: Observed) -> dict[tuple[str, str], Mapping[str, str]]:
        """The labels of the Secrets models name that the admin's policy must see;
        while a model waits for one, the next pass re-reads it (secrets.py)."""
        if self._wanted[0] is not obs.models:  # (the same models: the same Secrets)
            tenants, needs = self.config.tenants, self._needs
            changed = (None if not isinstance(self._wanted[0], dict)
                       else changed_keys(self._wanted[0], obs.models))
            if changed is None:
                needs.clear()
            for m in (obs.models.values() if changed is None else map(obs.models.get, changed)):
                if m is not None and m.model is not None and (
                        k := needs_secrets(m.model, tenants)):
                    needs[m.key] = k
                elif changed is not None and m is not None:
                    needs.pop(m.key, None)
            self._wanted = (obs.models, {k for ks in needs.values() for k in ks})
        if not (wanted := self._wanted[1]):
            return {}
        found = await self._secrets.labels(wanted)
        rule = self.config.tenants.secret_label
        if any(k not in found or (rule and not rule.holds(found[k])) for k in wanted):
            self.trigger_later(SECRET_MAX_AGE)
        return found

    def _plan(self, obs: Observed, now: str,
              secrets: Mapping[tuple[str, str], Mapping[str, str]]) -> PassPlan:
        planned = plan_pass(obs, now, self._render_options,
                            placed=self._placed, avoid=self.avoid,
                            speeds=self.speed.published_by_model(),
                            speed_policy=self.speed.policy, desired=self._desired,
                            tenants=self.config.tenants, secrets=secrets, kept=self._kept)
        self._placed = planned.placed
        if self.speed.retarget(planned.speed_targets):
            self.speed_wake()
        return planned

    def _avoid_stuck(self, obs: Observed, now: float) -> dict[str, list[EventSpec]]:
        """Apply `policy.avoid_stuck`: the nodes to avoid, the Events, a recheck."""
        verdict = avoid_stuck(unschedulable(obs), self.avoid, self._reported_stuck, now,
                              self.config.unschedulable_seconds)
        self.avoid, self._reported_stuck = verdict.avoid, verdict.reported
        if verdict.recheck_in is not None:
            self.trigger_later(verdict.recheck_in)
        for stuck, age in verdict.moved:
            log.warning("%s: pod %s Unschedulable on %s for %.0f s: avoiding that node",
                        stuck.model, stuck.pod, stuck.node, age)
        return verdict.events

    # ---- one model ---------------------------------------------------------

    async def _model(self, work: ModelWork, now: str, result: PassResult, obs: Observed,
                     extra: list[EventSpec]) -> None:
        """One model's writes; an exception in them is this model's failure (an
        Event, the metric, a retry), never the pass's: the others go on."""
        key = work.model.key
        if work.failure:
            self.metrics.model_failures.inc(labels=("compute",))
            log.error("%s: %s", key, work.failure)
            self.trigger_later(RETRY_SECONDS[-1])
            if self._failed_models.get(key) != work.failure:
                self._failed_models[key] = work.failure
                extra = [*extra, EventSpec(EventReason.RECONCILE_FAILED,
                                           f"the operator failed on this model: {work.failure}",
                                           warning=True)]
        else:
            self._failed_models.pop(key, None)
        self._idle.pop(key, None)
        try:
            if not (await self._model_writes(work, now, result, obs, extra) or work.failure
                    or work.changes.changes):
                self._idle[key] = work
        except NotLeading:
            raise  # the Lease is not held: the pass ends (`run`), no model failed
        except Exception as exc:  # (a cancellation is not an Exception: it passes)
            result.failures += 1
            self.metrics.model_failures.inc(labels=("write",))
            log.exception("%s: writing this model failed; the pass goes on", key)
            self.trigger_later(RETRY_SECONDS[-1])
            with contextlib.suppress(Exception):
                await self._event(work.model, EventSpec(
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
        for event in events:
            await self._event(mo, event, now)
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
            if self._expected.waiting(change, obs, time.monotonic()):
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
            self._expected.wrote(change, time.monotonic())
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

    async def _event(self, mo: ModelObject, event: EventSpec, now: str) -> None:
        body = event_manifest(Involved(mo.namespace, mo.name, mo.uid), event, now, self.identity)
        try:
            async with self._writing:
                await self.kube.create(body)
        except KubeError as exc:
            if not event_settled(refusal(exc.status, exc.causes)):
                log.warning("%s: event not posted: %s", mo.key, exc)
        except (TimeoutError, OSError) as exc:
            log.warning("%s: event not posted: %s", mo.key, exc)
