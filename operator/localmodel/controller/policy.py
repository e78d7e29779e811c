"""The reconciler's decisions, apart from its I/O. Pure.

* Refused writes: what an API error means (by its HTTP code, `reason` and
  `details.causes`, never its message text) and whether it is worth a retry.
* Expectations: what this replica wrote and the watches have not shown yet, so
  a pass that starts before the watch event arrives does not write it again.
* Stuck pods: a node the scheduler left a model's pod Unschedulable on for a
  while is avoided for that model, so the replica moves on; a pod no node could
  take is reported once and keeps its placement.
* The Event object for an `EventSpec`, and the retry back-off.
* A pass's plan: the desired state (placements the watches do not show yet
  remembered from the last pass), and per model its changes and status.

Each is a table in tests/unit/test_policy.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from itertools import chain
from typing import Any, cast

from localmodel import API_VERSION, KIND
from localmodel.api import LocalModel
from localmodel.contract import (
    ANNOTATION_APPLIED_HASH,
    EVENT_REPORTING_COMPONENT,
    EVENT_SOURCE_COMPONENT,
)
from localmodel.controller.changes import (
    Apply,
    Change,
    Create,
    Delete,
    ModelChanges,
    Target,
)
from localmodel.controller.kept_work import KeptWork, Shares, model_work
from localmodel.controller.observed import (
    Observed,
    StuckPod,
    current_placements,
    readiness,
)
from localmodel.controller.pass_work import ModelWork, PassPlan
from localmodel.desired import ModelResult, failure_text
from localmodel.errors import format_errors
from localmodel.events import EventReason, EventSpec
from localmodel.incremental import Desired
from localmodel.render import RenderOptions
from localmodel.speed import Published, SpeedPolicy
from localmodel.status import Reason, failed_status, invalid_status
from localmodel.tenancy import SecretLabels, TenantPolicy, refusals

# A write is expected to show in the watches within this long; after that the
# next pass acts on what it sees, whatever was written before.
EXPECT_SECONDS = 30.0
# A node the scheduler could not run a model's pod on is avoided this long.
AVOID_SECONDS = 600.0
# A change that failed is tried again after this long (growing per failure).
RETRY_SECONDS = (1.0, 2.0, 5.0, 10.0, 30.0)
# A stuck pod is looked at again this long after it matures.
RECHECK_MARGIN_SECONDS = 0.5


def retry_after(failures: int) -> float:
    """The wait before the next try, after `failures` failed ones in a row."""
    return RETRY_SECONDS[min(failures, len(RETRY_SECONDS) - 1)]


# metav1.StatusCause `reason` of the NamespaceLifecycle admission's refusal.
NAMESPACE_TERMINATING_CAUSE = "NamespaceTerminating"


class Refusal(Enum):
    NOT_FOUND = "not found"  # 404
    CONFLICT = "conflict"  # 409: already exists, or the uid precondition failed
    NAMESPACE_ENDING = "namespace ending"  # 403: the namespace is being deleted
    OTHER = "other"


def refusal(code: int, causes: Collection[str] = ()) -> Refusal:
    """What an API error says, from its code and its `details.causes` reasons."""
    if code == 404:
        return Refusal.NOT_FOUND
    if code == 409:
        return Refusal.CONFLICT
    if code == 403 and NAMESPACE_TERMINATING_CAUSE in causes:
        return Refusal.NAMESPACE_ENDING
    return Refusal.OTHER


def settled(change: Change, why: Refusal) -> bool:
    """Whether a refused change needs no retry and no report: already gone or
    already there (the next pass sees it), or the namespace (and the model in
    it) is being deleted."""
    if why is Refusal.NAMESPACE_ENDING:
        return True
    return why in (Refusal.NOT_FOUND, Refusal.CONFLICT) and isinstance(change, Delete | Create)


def status_settled(why: Refusal) -> bool:
    """A status write refused because the model or its namespace is going."""
    return why in (Refusal.NOT_FOUND, Refusal.NAMESPACE_ENDING)


def event_settled(why: Refusal) -> bool:
    """An Event refused because its namespace is going: nothing to report."""
    return why is Refusal.NAMESPACE_ENDING


class Wrote(Enum):
    CREATED = "created"
    DELETED = "deleted"
    APPLIED = "applied"


@dataclass(frozen=True)
class Expectation:
    """What this replica wrote to one object, until when to wait for the watch."""

    wrote: Wrote
    until: float
    digest: str = ""  # APPLIED: the applied manifest's hash
    owner: str = ""  # CREATED: the uid of the model it was made for


def applied_digest(change: Create | Apply) -> str:
    """The hash an applied object carries (else the manifest itself, as text)."""
    annotations = change.manifest["metadata"].get("annotations") or {}
    return str(annotations.get(ANNOTATION_APPLIED_HASH, "")) or json.dumps(
        change.manifest, sort_keys=True)


def owner_uid(manifest: Mapping[str, Any]) -> str:
    """The uid of the object's first owner (the model it is made for), or ""."""
    refs = manifest.get("metadata", {}).get("ownerReferences") or []
    return str(refs[0].get("uid", "")) if refs else ""


def expectation(change: Change, now: float) -> Expectation:
    until = now + EXPECT_SECONDS
    if isinstance(change, Delete):
        return Expectation(Wrote.DELETED, until)
    if isinstance(change, Create):
        return Expectation(Wrote.CREATED, until, owner=owner_uid(change.manifest))
    return Expectation(Wrote.APPLIED, until, applied_digest(change))


class Lag(Enum):
    """How a change stands against what was written to its object before."""

    WAIT = "wait"  # written, the watches lag behind: do not write it again
    CAUGHT_UP = "caught up"  # the watches show it (or waited long enough): forget it
    OTHER = "other"  # a different write: make it, keep the expectation


def present(obs: Observed, target: Target) -> bool:
    kind, ns, name = target
    if kind == "Pod":
        return (ns, name) in obs.pods
    if kind == "PersistentVolumeClaim":
        return (ns, name) in obs.claims
    if kind in ("ConfigMap", "Service", "NetworkPolicy"):
        return target in obs.objects
    return False


def shown(expected: Expectation, target: Target, obs: Observed, now: float) -> bool:
    """Whether the watches show the write (or it was waited for long enough)."""
    if now > expected.until:
        return True
    if expected.wrote is Wrote.APPLIED:
        have = obs.objects.get(target)
        return have is not None and have.applied_hash == expected.digest
    return present(obs, target) is (expected.wrote is Wrote.CREATED)


def lag(expected: Expectation, change: Change, obs: Observed, now: float) -> Lag:
    if shown(expected, change.target, obs, now):
        return Lag.CAUGHT_UP
    if expected.wrote is Wrote.APPLIED:
        same = not isinstance(change, Delete) and applied_digest(change) == expected.digest
        return Lag.WAIT if same else Lag.OTHER
    if isinstance(change, Create) and expected.owner != owner_uid(change.manifest):
        # Made for an earlier model of the same name (deleted, its objects
        # collected, before the watches showed them): this one needs its own.
        return Lag.OTHER
    wrote = Wrote.DELETED if isinstance(change, Delete) else Wrote.CREATED
    return Lag.WAIT if expected.wrote is wrote else Lag.OTHER


@dataclass
class Expectations:
    """This replica's writes the watches have not shown yet (controller-runtime's
    idea): without them a pass that starts before the watch event of an earlier
    write arrives would repeat it (a 409 create, a second delete)."""

    by_target: dict[Target, Expectation] = field(default_factory=dict)

    def waiting(self, change: Change, obs: Observed, now: float) -> bool:
        """Whether `change` was already made and the watches lag behind."""
        expected = self.by_target.get(change.target)
        if expected is None:
            return False
        state = lag(expected, change, obs, now)
        if state is Lag.CAUGHT_UP:
            del self.by_target[change.target]
        return state is Lag.WAIT

    def wrote(self, change: Change, now: float) -> None:
        self.by_target[change.target] = expectation(change, now)

    def forget_shown(self, obs: Observed, now: float) -> None:
        """Forget every write the watches show, whether or not a change is wanted
        for its object now: a pod created, seen, then deleted by someone else
        within EXPECT_SECONDS is a pod to create, not a create the watches lag on."""
        self.by_target = {target: expected for target, expected in self.by_target.items()
                          if not shown(expected, target, obs, now)}


Avoid = Mapping[str, Mapping[str, float]]  # model -> node -> avoided until


@dataclass(frozen=True)
class StuckVerdict:
    avoid: dict[str, dict[str, float]]
    reported: dict[str, str]  # pod -> the message already reported
    events: dict[str, list[EventSpec]]  # model -> Events to post
    recheck_in: float | None = None  # look again then: a young stuck pod matures
    moved: tuple[tuple[StuckPod, float], ...] = ()  # (pod, age) newly avoided, for the log


def avoid_stuck(stuck: Iterable[StuckPod], avoid: Avoid, reported: Mapping[str, str],
                now: float, threshold: float) -> StuckVerdict:
    """Nodes whose pods the scheduler left Unschedulable for `threshold` seconds
    are rejected for that model (for AVOID_SECONDS), so the replica moves on to
    the next eligible node; younger stuck pods are looked at again when they
    mature, without waiting for a watch event."""
    kept = {model: {node: until for node, until in nodes.items() if until > now}
            for model, nodes in avoid.items()}
    avoided = {model: nodes for model, nodes in kept.items() if nodes}
    told = dict(reported)
    events: dict[str, list[EventSpec]] = {}
    recheck: list[float] = []
    moved: list[tuple[StuckPod, float]] = []
    for pod in stuck:
        age = now - pod.since
        if age < threshold:
            recheck.append(threshold - age + RECHECK_MARGIN_SECONDS)
            continue
        if not pod.node_specific:
            # Another node would not help (e.g. a claim with no StorageClass
            # and no default): say so once, keep the placement.
            if told.get(pod.pod) != pod.message:
                told[pod.pod] = pod.message
                events.setdefault(pod.model, []).append(EventSpec(
                    EventReason.UNSCHEDULABLE,
                    f"replica {pod.replica}: pod {pod.pod} cannot be scheduled on "
                    f"any node: {pod.message[:400]}", warning=True))
            continue
        nodes = avoided.setdefault(pod.model, {})
        if pod.node not in nodes:
            events.setdefault(pod.model, []).append(EventSpec(
                EventReason.UNSCHEDULABLE,
                f"replica {pod.replica}: the scheduler left pod {pod.pod} "
                f"Unschedulable on node {pod.node} for {age:.0f} s; placing the "
                "replica on another eligible node", warning=True))
            moved.append((pod, age))
        nodes[pod.node] = now + AVOID_SECONDS
    return StuckVerdict(avoided, told, events, min(recheck) if recheck else None, tuple(moved))


@dataclass(frozen=True)
class Involved:
    """The LocalModel an Event is about."""

    namespace: str
    name: str
    uid: str


def event_manifest(about: Involved, event: EventSpec, now: str, instance: str) -> dict[str, Any]:
    """A core/v1 Event about a LocalModel, reported by this replica (`instance`)."""
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{about.name}.", "namespace": about.namespace},
        "involvedObject": {"apiVersion": API_VERSION, "kind": KIND, "name": about.name,
                           "namespace": about.namespace, "uid": about.uid},
        "reason": event.reason.value,
        "message": event.message[:1024],
        "type": "Warning" if event.warning else "Normal",
        "source": {"component": EVENT_SOURCE_COMPONENT},
        "reportingComponent": EVENT_REPORTING_COMPONENT,
        "reportingInstance": instance[:128],
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


def failure_event(failed: Iterable[str]) -> EventSpec:
    """One Warning for a pass's failed writes to one model."""
    return EventSpec(EventReason.FAILED, "; ".join(sorted(set(failed)))[:1000], warning=True)


@dataclass
class Failures:
    """Failed writes per model across passes: when to try again (growing waits),
    and an Event only when what failed changed."""

    in_a_row: dict[str, int] = field(default_factory=dict)
    reported: dict[str, str] = field(default_factory=dict)  # model -> the message posted

    def after_pass(self, model: str, failed: Sequence[str]
                   ) -> tuple[float | None, EventSpec | None]:
        """(retry in seconds, Event to post) for `model`'s failed writes of a pass."""
        if not failed:
            self.in_a_row.pop(model, None)
            self.reported.pop(model, None)
            return None, None
        n = self.in_a_row.get(model, 0)
        self.in_a_row[model] = n + 1
        event = failure_event(failed)
        if self.reported.get(model) == event.message:
            return retry_after(n), None
        self.reported[model] = event.message
        return retry_after(n), event


Placed = Mapping[str, Mapping[int, str]]  # model -> replica -> node


def with_memory(current: Mapping[str, Sequence[str | None]], placed: Placed
                ) -> dict[str, tuple[str | None, ...]]:
    """Where replicas are: what the watches show, else where the last pass put
    them (its pods and status may not have reached the watches yet; without
    this, a pass right after a big one would plan those models afresh and
    move them). Tuples: the planner compares them with its own in C."""
    out: dict[str, tuple[str | None, ...]] = {}
    for key, nodes in current.items():
        remembered = placed.get(key) if None in nodes else None
        out[key] = tuple(nodes) if not remembered else tuple(
            remembered.get(replica) if node is None else node
            for replica, node in enumerate(nodes))
    return out


def admitted(obs: Observed, tenants: TenantPolicy, secrets: SecretLabels, now: str,
             check: Callable[..., Sequence[Any]] = refusals,
             models: Iterable[LocalModel] | None = None,
             ) -> tuple[list[LocalModel], list[ModelWork]]:
    """The models (`models`, else every valid one) the admin's policy admits, and
    the status-only work of those it refuses (Valid=False, RefusedByPolicy, each
    rule and field) or failed on."""
    ok: list[LocalModel] = []
    refused: list[ModelWork] = []
    for lm in obs.valid_models() if models is None else models:
        mo = obs.models[lm.key]
        try:
            found = check(lm, tenants, secrets)
        except Exception as exc:  # one model's failure is that model's
            failure = failure_text("admin policy", exc)
            refused.append(ModelWork(mo, ModelChanges(), failed_status(
                mo.generation, failure, mo.status, now), failure))
            continue
        if not found:
            ok.append(lm)
            continue
        refused.append(ModelWork(mo, ModelChanges(), invalid_status(mo.generation, format_errors(
            [r.error() for r in found]), mo.status, now, Reason.REFUSED_BY_POLICY)))
    return ok, refused


def _models_work(results: tuple[ModelResult, ...], obs: Observed, now: str,
                 options: RenderOptions, speeds: Mapping[str, Mapping[int, Published]],
                 policy: SpeedPolicy, kept: KeptWork, placed: Placed,
                 ) -> tuple[Shares, Sequence[int], Shares | None]:
    """Each valid model's share, and where it puts its replicas: the last pass's
    shares with the positions `KeptWork.shares_again` names worked out again
    (each kept while what it read holds, `KeptWork.held`, else worked out with
    `model_work` and kept); those positions, and the last pass's shares (None:
    all worked out)."""
    images = (options.operator_image, options.image_pull_secrets)
    shares, todo, last = kept.shares_again(results, now, speeds, policy, images)
    models, held, placement = obs.models, kept.held, kept.placement
    work, targets, placements, unkept = shares.work, shares.targets, shares.placed, shares.unkept
    none: Mapping[int, Published] = {}
    for i in todo:
        result = results[i]
        key = result.model.key
        mo = models[key]
        # A failed model keeps where it was (its pods are left as they are).
        placements[key] = dict(placed.get(key, {})) if result.failure else placement(result)
        if result.problems or result.failure:  # an invalid or failed one: its status only
            kept.forget(key)
            unkept.add(i)
            work[i], targets[i] = ModelWork(mo, ModelChanges(), result.status, result.failure), ()
            continue
        published = speeds.get(key, none)
        try:
            worked = held(result, mo.uid, obs, now, published, policy, images)
            if worked is None:
                worked = model_work(result, mo, obs, now, published, policy, *images)
                kept.keep(result, mo.uid, obs, now, published, policy, images, worked)
        except Exception as exc:  # one model's failure is that model's (not kept)
            kept.forget(key)
            unkept.add(i)
            failure = failure_text("changes or status", exc)
            work[i], targets[i] = ModelWork(mo, ModelChanges(), failed_status(
                mo.generation, failure, mo.status, now), failure), ()
            continue
        unkept.discard(i)
        work[i], targets[i] = worked
    return shares, todo, last


def plan_pass(obs: Observed, now: str, options: RenderOptions, *, placed: Placed,
              avoid: Avoid, speeds: Mapping[str, Mapping[int, Published]] | None = None,
              speed_policy: SpeedPolicy | None = None, desired: Desired | None = None,
              tenants: TenantPolicy | None = None, secrets: SecretLabels | None = None,
              kept: KeptWork | None = None) -> PassPlan:
    """The pure core of a pass: desired state, then each model's changes and status
    (with each replica's speed, `speeds`: model -> replica -> published numbers).
    `desired` and `kept` are the reconciler's long-lived `Desired` and `KeptWork`
    (a pass then costs what changed); without them, fresh ones: the same result.
    `tenants`: the admin's policy (models it refuses get their status only,
    `admitted`); `secrets`: the labels of the Secrets models name (`tenancy.needs_secrets`)."""
    kept = kept if kept is not None else KeptWork()
    inputs = (obs, options, placed, avoid, speeds, speed_policy, tenants, secrets, desired)
    if (same := kept.same_pass(inputs, now)) is not None:
        return same  # a quiet pass: what the last one planned, from the very same inputs
    kept.begin(obs)
    speeds = speeds or {}
    policy = speed_policy or SpeedPolicy()
    tenants, secrets = tenants or TenantPolicy(), secrets or {}
    models, refused = kept.admitted(obs, tenants, secrets, lambda some: admitted(
        obs, tenants, secrets, now, kept.refusals, some))
    state = (desired or Desired()).state(
        models,
        list(obs.nodes.values()),
        now=now,
        current=kept.current(current_placements(obs), placed, with_memory),
        usage=obs.usage,
        ready=readiness(obs),
        options=options,
        claims=kept.chooser(obs),
        avoid={m: frozenset(nodes) for m, nodes in avoid.items()},
        claims_again=kept.claims_again,
    )
    shares, todo, last = _models_work(state.models, obs, now, options, speeds, policy, kept,
                                      placed)
    if last is None:
        kept.keep_only(shares.at.keys())
        kept.took = set(kept.took)  # (a set keeps its largest table: a cold pass's 5 000)
    invalid = [ModelWork(mo, ModelChanges(), invalid_status(mo.generation, mo.error, mo.status,
                                                            now))
               for mo in kept.invalid(obs)]
    done = cast(list[ModelWork], shares.work)  # (every position worked out)
    unkept = [*refused, *(done[i] for i in shares.unkept), *invalid]
    since = None
    if last is not None:  # the work that is not the last plan's very object
        since = (kept.serial, {w.model.key: w for w in (*refused, *invalid)})
        since[1].update((done[i].model.key, done[i]) for i in todo if done[i] is not last.work[i])
    plan = PassPlan([*refused, *done, *invalid], shares.placed,
                    tuple(chain.from_iterable(shares.targets)), kept.serial + 1, since)
    return kept.remember(inputs, now, plan, shares, unkept)
