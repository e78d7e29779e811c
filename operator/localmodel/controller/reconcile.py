"""The one reconciler: wait for a trigger, debounce, snapshot, plan, apply, report.

One task, because the planner is global (exclusive models claim whole nodes):
per-object handlers planning at once could put two models on one node. Every
watch event only records and triggers; a pass reads the whole in-memory
snapshot (`indexes`, kept by kopf from its watches: nothing here lists the
cluster), calls the pure core (`observe`, `desired_state`, `model_changes`,
`status_events`), then writes what differs. A pass that fails part-way is
harmless: the next one starts again from what the watches show.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from localmodel import API_VERSION, KIND
from localmodel.api import LocalModelStatus
from localmodel.contract import (
    ANNOTATION_APPLIED_HASH,
    EVENT_REPORTING_COMPONENT,
    EVENT_SOURCE_COMPONENT,
    OPERATOR,
)
from localmodel.controller.changes import (
    Apply,
    Change,
    Create,
    Delete,
    ModelChanges,
    choose_claim,
    model_changes,
)
from localmodel.controller.config import OperatorConfig
from localmodel.controller.observed import (
    ModelObject,
    Observed,
    Snapshot,
    current_placements,
    observe,
    readiness,
    unschedulable,
)
from localmodel.controller.writer import Kube, KubeError
from localmodel.desired import desired_state
from localmodel.metrics import LATENCY_BUCKETS, Counter, Gauge, Histogram, Metric
from localmodel.render import RenderOptions
from localmodel.status import (
    EventReason,
    EventSpec,
    invalid_status,
    status_body,
    status_changed,
    status_events,
    with_progress,
)

log = logging.getLogger("localmodel.reconcile")
RESOURCES = ("localmodels", "nodes", "pods", "claims", "volumes", "configmaps", "services")
# A write is expected to show in the watches within this long; after that the
# next pass acts on what it sees, whatever was written before.
EXPECT_SECONDS = 30.0
# A node the scheduler could not run a model's pod on is avoided this long.
AVOID_SECONDS = 600.0
# A change that failed is tried again after this long (doubling per failure).
RETRY_SECONDS = (1.0, 2.0, 5.0, 10.0, 30.0)


def rfc3339(now: float) -> str:
    return dt.datetime.fromtimestamp(now, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class OperatorMetrics:
    passes: Counter = field(default_factory=lambda: Counter(
        "localmodel_operator_passes_total", "Reconcile passes by result.", ("result",)))
    pass_seconds: Histogram = field(default_factory=lambda: Histogram(
        "localmodel_operator_pass_duration_seconds", "Time one reconcile pass took.",
        LATENCY_BUCKETS))
    writes: Counter = field(default_factory=lambda: Counter(
        "localmodel_operator_api_writes_total",
        "API write requests by verb, kind and HTTP status code.", ("verb", "kind", "code")))
    leader: float = 0.0
    models_by_condition: dict[tuple[str, ...], float] = field(default_factory=dict)

    def all(self) -> list[Metric]:
        return [
            self.passes,
            self.pass_seconds,
            self.writes,
            Gauge("localmodel_operator_models", "LocalModels by condition and status.",
                  lambda: dict(self.models_by_condition), ("condition", "status")),
            Gauge("localmodel_operator_leader", "Whether this replica holds the Lease (1 or 0).",
                  lambda: {(): self.leader}),
        ]

    def on_write(self, verb: str, kind: str, code: int) -> None:
        self.writes.inc(labels=(verb, kind, str(code)))


@dataclass
class PassResult:
    writes: int = 0
    failures: int = 0
    models: int = 0


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
        self._failures: dict[str, int] = {}
        self._last_failure_event: dict[str, str] = {}
        self._retry: asyncio.TimerHandle | None = None
        self.synced = asyncio.Event()
        self.passes = 0
        self._current: asyncio.Task[PassResult] | None = None
        self._aborted = False
        # model -> node -> until when: nodes whose pods stayed Unschedulable
        self.avoid: dict[str, dict[str, float]] = {}
        self._reported_stuck: dict[str, str] = {}  # pod -> message already reported
        # Expectations (controller-runtime's idea): what this replica wrote and the
        # watches have not shown yet. A pass that starts before the watch event of
        # an earlier write arrives would otherwise repeat the write (a 409 create,
        # a second delete, the same status again): more writes per model as N grows.
        self._expected: dict[tuple[str, str, str], tuple[str, float]] = {}
        self._written_status: dict[str, tuple[str, str]] = {}  # model -> (rv seen, body)
        self._placed: dict[str, dict[int, str]] = {}  # the last pass's placements

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

        return Snapshot(*(take(name) for name in RESOURCES))

    # ---- the loop ----------------------------------------------------------

    async def run(self, leading: asyncio.Event) -> None:
        await self.synced.wait()
        while True:
            await self._wake.wait()
            await leading.wait()
            # Coalesce a burst: wait until it is quiet, but not forever.
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
            started = time.monotonic()
            self._current = asyncio.create_task(self.reconcile_once())
            try:
                result = await self._current
            except asyncio.CancelledError:
                if not self._aborted:
                    raise
                self._aborted = False
                log.warning("reconcile pass aborted: leadership lost")
                self.metrics.passes.inc(labels=("aborted",))
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

    async def reconcile_once(self) -> PassResult:
        now = self.clock()
        now_s = rfc3339(now)
        obs = observe(self.snapshot(), self.config.namespaces)
        for name, why in obs.bad_nodes.items():
            log.warning("node %s is left out of placement: %s", name, why)
        extra_events = self._avoid_stuck(obs, now)
        state = desired_state(
            obs.valid_models(),
            list(obs.nodes.values()),
            now=now_s,
            current=self._current_with_memory(obs),
            usage=obs.usage,
            ready=readiness(obs),
            options=RenderOptions(operator_image=self.config.operator_image),
            claims=lambda lm, replica, node: choose_claim(lm, replica, node, obs),
            avoid={m: frozenset(nodes) for m, nodes in self.avoid.items()},
        )
        self._placed = {
            r.model.key: {rep.replica: rep.node for rep in r.replicas} for r in state.models
        }
        result = PassResult(models=len(obs.models))
        work: list[tuple[ModelObject, ModelChanges, LocalModelStatus]] = []
        for model_result in state.models:
            mo = obs.models[model_result.model.key]
            if model_result.problems:
                changes = ModelChanges()  # an invalid spec changes nothing but its status
                new_status = model_result.status
            else:
                changes = model_changes(model_result, mo.uid, obs)
                new_status = with_progress(model_result.status, changes.rolling,
                                           model_result.model, now_s)
            work.append((mo, changes, new_status))
        for mo in obs.models.values():
            if mo.model is None:
                work.append((mo, ModelChanges(),
                             invalid_status(mo.generation, mo.error, mo.status, now_s)))
        self._count_models([status for _, _, status in work])
        await asyncio.gather(*(self._model(mo, ch, st, now_s, result, obs,
                                           extra_events.get(mo.key, []))
                               for mo, ch, st in work))
        return result

    def _current_with_memory(self, obs: Observed) -> dict[str, list[str | None]]:
        """Where replicas are: what the watches show, else where the last pass put
        them (its pods and status may not have reached the watches yet; without
        this, a pass right after a big one would plan those models afresh and
        move them)."""
        current = current_placements(obs)
        for key, nodes in current.items():
            remembered = self._placed.get(key, {})
            for replica, node in enumerate(nodes):
                if node is None and replica in remembered:
                    nodes[replica] = remembered[replica]
        return current

    def _avoid_stuck(self, obs: Observed, now: float) -> dict[str, list[EventSpec]]:
        """Nodes whose pods the scheduler left Unschedulable for a while are
        rejected for that model (for AVOID_SECONDS), so the replica moves on to
        the next eligible node; younger stuck pods are looked at again when they
        mature, without waiting for a watch event."""
        events: dict[str, list[EventSpec]] = {}
        for model, nodes in list(self.avoid.items()):
            for node, until in list(nodes.items()):
                if until <= now:
                    del nodes[node]
            if not nodes:
                del self.avoid[model]
        threshold = self.config.unschedulable_seconds
        for stuck in unschedulable(obs):
            age = now - stuck.since
            if age < threshold:
                self.trigger_later(threshold - age + 0.5)
                continue
            if not stuck.node_specific:
                # Another node would not help (e.g. a claim with no StorageClass
                # and no default): say so once, keep the placement.
                if self._reported_stuck.get(stuck.pod) != stuck.message:
                    self._reported_stuck[stuck.pod] = stuck.message
                    events.setdefault(stuck.model, []).append(EventSpec(
                        EventReason.UNSCHEDULABLE,
                        f"replica {stuck.replica}: pod {stuck.pod} cannot be scheduled on "
                        f"any node: {stuck.message[:400]}", warning=True))
                continue
            nodes = self.avoid.setdefault(stuck.model, {})
            if stuck.node not in nodes:
                events.setdefault(stuck.model, []).append(EventSpec(
                    EventReason.UNSCHEDULABLE,
                    f"replica {stuck.replica}: the scheduler left pod {stuck.pod} "
                    f"Unschedulable on node {stuck.node} for {age:.0f} s; placing the "
                    "replica on another eligible node", warning=True))
                log.warning("%s: pod %s Unschedulable on %s for %.0f s: avoiding that node",
                            stuck.model, stuck.pod, stuck.node, age)
            nodes[stuck.node] = now + AVOID_SECONDS
        return events

    def _count_models(self, statuses: list[LocalModelStatus]) -> None:
        counts: dict[tuple[str, ...], float] = {}
        for status in statuses:
            for c in status.conditions:
                k = (c.type, c.status.value)
                counts[k] = counts.get(k, 0) + 1
        self.metrics.models_by_condition = counts

    async def _model(
        self,
        mo: ModelObject,
        changes: ModelChanges,
        status: LocalModelStatus,
        now: str,
        result: PassResult,
        obs: Observed,
        extra: list[EventSpec],
    ) -> None:
        events: list[EventSpec] = list(extra)
        failed: list[str] = []
        sem = asyncio.Semaphore(self.config.write_concurrency)

        async def one(change: Change) -> None:
            if self._still_expected(change, obs):
                return
            async with sem:
                try:
                    await self._apply(change)
                    self._expect(change)
                    result.writes += 1
                    event = getattr(change, "event", None)
                    if event is not None:
                        events.append(event)
                except KubeError as exc:
                    if exc.status in (404, 409) and isinstance(change, Delete | Create):
                        return  # already gone / already there: the next pass sees it
                    if _namespace_ending(exc):
                        return  # the namespace (and the model in it) is being deleted
                    result.failures += 1
                    failed.append(str(exc))
                    log.warning("%s: %s", mo.key, exc)
                except (TimeoutError, OSError) as exc:
                    result.failures += 1
                    failed.append(f"API unreachable: {exc}")

        # A pod's claim and ConfigMap first: a pod the scheduler sees before its
        # claim exists fails scheduling and waits out a back-off.
        def is_pod_create(c: Change) -> bool:
            return isinstance(c, Create) and c.manifest.get("kind") == "Pod"

        await asyncio.gather(*(one(c) for c in changes.changes if not is_pod_create(c)))
        await asyncio.gather(*(one(c) for c in changes.changes if is_pod_create(c)))
        if failed:
            n = self._failures.get(mo.key, 0)
            self._failures[mo.key] = n + 1
            self.trigger_later(RETRY_SECONDS[min(n, len(RETRY_SECONDS) - 1)])
            message = "; ".join(sorted(set(failed)))[:1000]
            if self._last_failure_event.get(mo.key) != message:
                self._last_failure_event[mo.key] = message
                events.append(EventSpec(EventReason.FAILED, message, warning=True))
        else:
            self._failures.pop(mo.key, None)
            self._last_failure_event.pop(mo.key, None)
        events = status_events(mo.status, status) + events
        for event in events:
            await self._event(mo, event, now)
        if status_changed(mo.status, status):
            body = json.dumps(status_body(status), sort_keys=True)
            # Written already, and the watch has not shown it yet: not again.
            if self._written_status.get(mo.key) != (
                mo.resource_version, body
            ) and await self._write_status(mo, status):
                self._written_status[mo.key] = (mo.resource_version, body)

    def _still_expected(self, change: Change, obs: Observed) -> bool:
        """Whether this change was already made and the watches lag behind."""
        kind, ns, name = _describe(change)
        key = (kind, ns, name)
        seen = self._expected.get(key)
        if seen is None:
            return False
        what, until = seen
        if time.monotonic() > until:
            del self._expected[key]
            return False
        present = _observed_has(obs, kind, ns, name)
        if (what == "delete" and not present) or (what == "create" and present):
            del self._expected[key]  # the watch caught up
            return False
        if what.startswith("apply:"):
            digest = _applied_hash(change)
            have = obs.objects.get((kind, ns, name))
            if have is not None and have.applied_hash == what[len("apply:"):]:
                del self._expected[key]
                return False
            return digest == what[len("apply:"):]
        return what == ("delete" if isinstance(change, Delete) else "create")

    def _expect(self, change: Change) -> None:
        key = _describe(change)
        if isinstance(change, Delete):
            what = "delete"
        elif isinstance(change, Create):
            what = "create"
        else:
            what = "apply:" + _applied_hash(change)
        self._expected[key] = (what, time.monotonic() + EXPECT_SECONDS)

    async def _apply(self, change: Change) -> None:
        if isinstance(change, Create):
            await self.kube.create(change.manifest)
        elif isinstance(change, Apply):
            await self.kube.apply(change.manifest)
        else:
            await self.kube.delete(change.kind, change.namespace, change.name, change.uid,
                                   force=change.force)
        log.info("%s %s %s/%s: %s", type(change).__name__.lower(),
                 *_describe(change), change.why)

    async def _write_status(self, mo: ModelObject, status: LocalModelStatus) -> bool:
        body = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": mo.name, "namespace": mo.namespace},
            "status": status_body(status),
        }
        try:
            await self.kube.apply(body, subresource="status")
        except KubeError as exc:
            if exc.status != 404 and not _namespace_ending(exc):  # a model gone needs none
                log.warning("%s: status not written: %s", mo.key, exc)
                self.trigger_later(RETRY_SECONDS[1])
            return False
        except (TimeoutError, OSError) as exc:
            log.warning("%s: status not written: %s", mo.key, exc)
            self.trigger_later(RETRY_SECONDS[1])
            return False
        return True

    async def _event(self, mo: ModelObject, event: EventSpec, now: str) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{mo.name}.", "namespace": mo.namespace},
            "involvedObject": {"apiVersion": API_VERSION, "kind": KIND, "name": mo.name,
                               "namespace": mo.namespace, "uid": mo.uid},
            "reason": event.reason.value,
            "message": event.message[:1024],
            "type": "Warning" if event.warning else "Normal",
            "source": {"component": EVENT_SOURCE_COMPONENT},
            "reportingComponent": EVENT_REPORTING_COMPONENT,
            "reportingInstance": self.identity[:128],
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self.kube.create(body)
        except KubeError as exc:
            if not _namespace_ending(exc):
                log.warning("%s: event not posted: %s", mo.key, exc)
        except (TimeoutError, OSError) as exc:
            log.warning("%s: event not posted: %s", mo.key, exc)


def _applied_hash(change: Change) -> str:
    if isinstance(change, Delete):
        return ""
    annotations = change.manifest["metadata"].get("annotations") or {}
    return str(annotations.get(ANNOTATION_APPLIED_HASH, "")) or json.dumps(
        change.manifest, sort_keys=True)


def _observed_has(obs: Observed, kind: str, ns: str, name: str) -> bool:
    if kind == "Pod":
        return (ns, name) in obs.pods
    if kind == "PersistentVolumeClaim":
        return (ns, name) in obs.claims
    if kind in ("ConfigMap", "Service"):
        return (kind, ns, name) in obs.objects
    return False


def _namespace_ending(exc: KubeError) -> bool:
    """The API server refuses new objects in a namespace being deleted (403,
    reason Forbidden, "being terminated"): nothing to retry or report."""
    return exc.status == 403 and "being terminated" in str(exc)


def _describe(change: Change) -> tuple[str, str, str]:
    if isinstance(change, Delete):
        return change.kind, change.namespace, change.name
    meta = change.manifest["metadata"]
    return str(change.manifest["kind"]), str(meta["namespace"]), str(meta["name"])
