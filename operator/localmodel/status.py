"""The status vocabulary and the building of a LocalModel's status. Pure.

One home for the condition types and their reasons (kubebuilder's
`metav1.Condition` shape: CamelCase reasons, `observedGeneration`,
`lastTransitionTime` that moves only when the status does), for building the
status from what was planned and observed, and for deciding whether a status
write is needed at all (`status_changed`). The Events that tell the story of a
change are `events.py`'s. `desired.py` and the operator both use it; nothing
here reads a clock, the environment or the cluster.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from typing import Any

from localmodel.api import (
    Condition,
    ConditionStatus,
    DecisionStatus,
    LocalModel,
    LocalModelStatus,
    PlacementStatus,
    SpeedStatus,
)
from localmodel.api.parse import CONDITIONS
from localmodel.facts.quantity import format_bytes
from localmodel.speed import Published, SpeedPolicy, ratio_of


class ConditionType(StrEnum):
    """A LocalModel condition's type: the operator's own, and kstatus's pair (Reconciling,
    Stalled) derived from them."""

    VALID = "Valid"
    PLACED = "Placed"
    READY = "Ready"
    PROGRESSING = "Progressing"
    SLOW_REPLICA = "SlowReplica"
    AWAKE = "Awake"  # spec.idle's, informational (idle_status.py); kstatus reads none of it
    # kstatus's "abnormal-true" pair (sigs.k8s.io/cli-utils, what Flux and Argo CD's
    # health check read): present only while True, derived from the four above by
    # `with_health`. Reconciling: the operator is still working toward the spec
    # (a roll, pods not Ready yet). Stalled: it cannot get there without a change
    # from outside (an invalid spec, a replica no node can take).
    RECONCILING = "Reconciling"
    STALLED = "Stalled"


class Reason(StrEnum):
    """Every condition reason the operator writes."""

    SPEC_VALID = "SpecValid"
    INVALID_SPEC = "InvalidSpec"
    # The admin's policy refused the spec (localmodel.tenancy): nothing is created.
    REFUSED_BY_POLICY = "RefusedByPolicy"
    ALL_REPLICAS_PLACED = "AllReplicasPlaced"
    # Unplaced replicas carry the planner's reason (planner.UnplacedReason):
    # NoNodes, NoMatchingNode, NoFeasibleNode.
    NOT_DEPLOYED = "NotDeployed"
    ALL_REPLICAS_READY = "AllReplicasReady"
    REPLICAS_NOT_READY = "ReplicasNotReady"
    # Ready=False, with what to change (localmodel/gaps.py): an image the kubelet
    # cannot pull, a claim with no StorageClass to bind it, a pod the scheduler
    # left Unschedulable (its own reason).
    IMAGE_PULL_FAILED = "ImagePullFailed"
    STORAGE_CLASS_NOT_FOUND = "StorageClassNotFound"
    NO_DEFAULT_STORAGE_CLASS = "NoDefaultStorageClass"
    UNSCHEDULABLE = "Unschedulable"
    # Ready=False: a container of a replica keeps failing (any cause: its
    # reason, restarts and last message, localmodel/gaps.py).
    CONTAINER_FAILING = "ContainerFailing"
    ROLLING = "RollingUpdate"
    UP_TO_DATE = "UpToDate"
    BELOW_EXPECTED_SPEED = "BelowExpectedSpeed"
    AS_EXPECTED = "AsExpected"
    # The operator failed computing or writing this model (an exception: a bug,
    # or input nothing else refused); the other models go on (controller/plan.py).
    RECONCILE_FAILED = "ReconcileFailed"
    # spec.idle (idle_status.py): Ready=True and Placed=True while asleep, Ready=True
    # while waking; the Awake condition's reasons (AWAKE_REASONS there).
    ASLEEP = "Asleep"
    WAKING = "Waking"
    SERVING = "Serving"
    IDLE = "Idle"
    WAITING_FOR_NODE = "WaitingForNode"
    ROUTER_OFF = "RouterOff"
    SLEEP_PREVENTED = "SleepPrevented"


# Ready=False reasons that say what is wrong in the cluster (localmodel/gaps.py):
# the kstatus pair says them before a roll's progress, which cannot end first.
GAP_REASONS = frozenset({Reason.IMAGE_PULL_FAILED, Reason.STORAGE_CLASS_NOT_FOUND,
                         Reason.NO_DEFAULT_STORAGE_CLASS, Reason.UNSCHEDULABLE,
                         Reason.CONTAINER_FAILING})


@dataclass(frozen=True)
class ReplicaStatusInput:
    """What status needs of one placed replica (a view of render.ReplicaPlan)."""

    replica: int
    node: str
    pod: str
    threads: int
    cpu: int
    memory_bytes: int
    settings: Mapping[str, str]
    decisions: Sequence[DecisionStatus]
    warnings: Sequence[str]
    reason: str


@dataclass(frozen=True)
class UnplacedInput:
    """One unplaced replica as its status needs it: which, the reason and the message."""

    replica: int
    reason: str
    message: str


def condition(
    type_: ConditionType,
    ok: bool | None,
    reason: str,
    message: str,
    lm: LocalModel,
    now: str,
) -> Condition:
    status = _STATUS_OF[ok]
    type_name = type_.value
    previous = None
    if lm.status is not None:
        # (the last of a type, should a status someone else wrote repeat one)
        previous = next((c for c in reversed(lm.status.conditions) if c.type == type_name), None)
    # lastTransitionTime moves only when the status does (metav1.Condition).
    since = previous.last_transition_time if previous and previous.status == status else now
    return _condition(type_name, status, lm.metadata.generation, since, reason, message)


_STATUS_OF = {None: ConditionStatus.UNKNOWN, True: ConditionStatus.TRUE,
              False: ConditionStatus.FALSE}


@lru_cache(maxsize=4096)  # (the same arguments again: no key to work out)
def _condition(
    type_: str,
    status: ConditionStatus,
    generation: int | None,
    since: str,
    reason: str,
    message: str,
) -> Condition:
    """One `Condition` per distinct value while in use (`api.parse.CONDITIONS`;
    a model is frozen, so statuses may share one): a pass makes thousands that
    read the same ("spec accepted", the Ready count), each made anew would be
    validated anew, and a settled model's stored status holds the same one."""
    raw: dict[str, Any] = {"type": type_, "status": status.value}
    if generation is not None:  # as a written status has it (`status_body`: no nulls)
        raw["observedGeneration"] = generation
    raw |= {"lastTransitionTime": since, "reason": reason, "message": message}
    return CONDITIONS.of(raw)


def took_now(lm: LocalModel, status: LocalModelStatus) -> bool:
    """Whether `build_status` gave `status` the clock: some condition's status
    differs from the stored one (`condition` moves lastTransitionTime to `now`
    exactly then). Otherwise the same inputs give the same status at any time."""
    if lm.status is None:  # (a first status: every condition is new)
        return bool(status.conditions)
    previous = {c.type: c.status for c in lm.status.conditions}
    return any(previous.get(c.type) != c.status for c in status.conditions)


def build_status(
    lm: LocalModel,
    invalid: str,
    replicas: Sequence[ReplicaStatusInput],
    unplaced: Sequence[UnplacedInput],
    ready: Mapping[int, bool] | None,
    now: str,
    *,
    endpoint: str,
    selector: str = "",
) -> LocalModelStatus:
    """The status for one model: `invalid` is the formatted validation errors
    (errors.format_errors; empty when valid); `ready` is None for an offline
    render (nothing runs)."""
    want = lm.spec.replicas
    n_ready = 0 if ready is None else sum(1 for r in replicas if ready.get(r.replica))
    if invalid:
        conditions = _invalid_conditions(lm, invalid, now)
    else:
        conditions = _conditions(lm, replicas, unplaced, ready, n_ready, now)
    return LocalModelStatus(
        observed_generation=lm.metadata.generation,
        conditions=_with_health(conditions, lm.metadata.generation, lm.status, now),
        placements=[
            _as_stored(lm.status, PlacementStatus(
                replica=r.replica,
                node=r.node,
                pod=r.pod,
                threads=r.threads,
                cpu=r.cpu,
                memory=format_bytes(r.memory_bytes),
                settings=dict(r.settings),
                decisions=list(r.decisions),
                reason=_stable_reason(lm, r),
            ))
            for r in replicas
        ],
        replicas=len(replicas),
        selector=selector,
        ready_replicas=n_ready,
        ready=f"{n_ready}/{want}",
        nodes=",".join(r.node for r in replicas),
        endpoint=endpoint if not invalid else "",
    )


def _as_stored(stored: LocalModelStatus | None, placement: PlacementStatus) -> PlacementStatus:
    """The stored status's own placement when it says the same (a settled
    model's status and the stored one then hold one object, not two)."""
    if stored is not None:
        for p in stored.placements:
            if p.replica == placement.replica and p == placement:
                return p
    return placement


def _invalid_conditions(lm: LocalModel, invalid: str, now: str) -> list[Condition]:
    """Valid, Placed and Ready all False: the spec is invalid."""
    msg = invalid
    return [
        condition(ConditionType.VALID, False, Reason.INVALID_SPEC, msg, lm, now),
        condition(
            ConditionType.PLACED, False, Reason.INVALID_SPEC,
            "not placed: the spec is invalid", lm, now,
        ),
        condition(
            ConditionType.READY, False, Reason.INVALID_SPEC,
            "not deployed: the spec is invalid", lm, now,
        ),
    ]


def _conditions(
    lm: LocalModel,
    replicas: Sequence[ReplicaStatusInput],
    unplaced: Sequence[UnplacedInput],
    ready: Mapping[int, bool] | None,
    n_ready: int,
    now: str,
) -> list[Condition]:
    """Valid, Placed and Ready of a valid spec."""
    want = lm.spec.replicas
    conditions = [
        condition(ConditionType.VALID, True, Reason.SPEC_VALID, "spec accepted", lm, now)
    ]
    warnings = sorted({w for r in replicas for w in r.warnings})
    if unplaced:
        msg = "; ".join(f"replica {u.replica}: {u.message}" for u in unplaced)
        conditions.append(
            condition(ConditionType.PLACED, False, unplaced[0].reason, msg, lm, now)
        )
    else:
        nodes = ", ".join(r.node for r in replicas) or "none"
        msg = f"{len(replicas)}/{want} replicas placed on {nodes}"
        if warnings:
            msg += "; warnings: " + "; ".join(warnings)
        conditions.append(
            condition(ConditionType.PLACED, True, Reason.ALL_REPLICAS_PLACED, msg, lm, now)
        )
    if ready is None:
        conditions.append(
            condition(
                ConditionType.READY, None, Reason.NOT_DEPLOYED,
                "offline render: nothing is running", lm, now,
            )
        )
    else:
        ok = n_ready == want
        reason = Reason.ALL_REPLICAS_READY if ok else Reason.REPLICAS_NOT_READY
        conditions.append(
            condition(ConditionType.READY, ok, reason, f"{n_ready}/{want} replicas ready",
                      lm, now)
        )
    return conditions


def _stable_reason(lm: LocalModel, r: ReplicaStatusInput) -> str:
    """A kept placement keeps the reason it was made for: re-planning says
    "kept: ...", which is true but would rewrite status on every pass."""
    if r.reason.startswith("kept") and lm.status is not None:
        for p in lm.status.placements:
            if p.replica == r.replica and p.node == r.node and p.reason:
                return p.reason
    return r.reason


def invalid_status(lm_meta_generation: int | None, message: str, previous: LocalModelStatus | None,
                   now: str, reason: Reason = Reason.INVALID_SPEC) -> LocalModelStatus:
    """Status for an object the operator cannot parse at all (no usable spec), or
    one the admin's policy refuses (`reason` RefusedByPolicy): Valid=False naming
    the field, and the previous placements kept for the record."""
    why = ("refused by the admin policy" if reason == Reason.REFUSED_BY_POLICY
           else "the spec is invalid")

    def cond(type_: ConditionType, msg: str) -> Condition:
        old = {c.type: c for c in (previous.conditions if previous else [])}.get(type_.value)
        since = (old.last_transition_time
                 if old and old.status == ConditionStatus.FALSE else now)
        return _condition(type_.value, ConditionStatus.FALSE, lm_meta_generation, since,
                          reason.value, msg)

    status = LocalModelStatus(
        observed_generation=lm_meta_generation,
        conditions=[
            cond(ConditionType.VALID, message),
            cond(ConditionType.PLACED, f"not placed: {why}"),
            cond(ConditionType.READY, f"not reconciled: {why}"),
        ],
        placements=list(previous.placements) if previous else [],
        ready_replicas=previous.ready_replicas if previous else 0,
        ready=previous.ready if previous else "",
        nodes=previous.nodes if previous else "",
    )
    return with_health(status, lm_meta_generation, previous, now)


def failed_status(generation: int | None, failure: str, previous: LocalModelStatus | None,
                  now: str) -> LocalModelStatus:
    """Status for a model the operator failed to compute (`failure`: the stage
    and the exception): Ready=False with reason ReconcileFailed naming it, and
    everything else as stored (its objects are left as they are)."""
    old = {c.type: c for c in (previous.conditions if previous else [])}
    was = old.get(ConditionType.READY.value)
    same = was is not None and was.status == ConditionStatus.FALSE
    ready = _condition(
        ConditionType.READY.value, ConditionStatus.FALSE, generation,
        was.last_transition_time if same and was else now, Reason.RECONCILE_FAILED.value,
        f"the operator failed on this model ({failure[:600]}); its objects are left as "
        "they are, the other models are not affected, and it is worked out again on the "
        "next passes",
    )
    kept = [c for c in (previous.conditions if previous else [])
            if c.type != ConditionType.READY.value]
    base = previous or LocalModelStatus()
    return base.model_copy(update={"conditions": [*kept, ready]})


def with_progress(status: LocalModelStatus, rolling: str | None, lm: LocalModel,
                  now: str) -> LocalModelStatus:
    """Add the Progressing condition: True with the roll's story while pods are
    being replaced or started, False (UpToDate) once every pod runs the spec."""
    if rolling is None:
        cond = condition(ConditionType.PROGRESSING, False, Reason.UP_TO_DATE,
                         "every replica runs the current spec", lm, now)
    else:
        cond = condition(ConditionType.PROGRESSING, True, Reason.ROLLING, rolling, lm, now)
    others = [c for c in status.conditions if c.type != ConditionType.PROGRESSING.value]
    status = status.model_copy(update={"conditions": [*others, cond]})
    return with_health(status, lm.metadata.generation, lm.status, now)


_HEALTH = (ConditionType.RECONCILING.value, ConditionType.STALLED.value)


def with_health(status: LocalModelStatus, generation: int | None,
                previous: LocalModelStatus | None, now: str) -> LocalModelStatus:
    """Set the kstatus pair from the other conditions (replacing any earlier pair).

    Stalled=True, with the blocking condition's reason and message, when the spec
    is invalid (Valid=False) or a replica has no node (Placed=False). Otherwise
    Reconciling=True with Ready's reason and message when Ready=False says a
    gap (GAP_REASONS: a container that keeps failing, an image that cannot be
    pulled...), else while a roll is under way (Progressing=True), else while
    replicas are not Ready (Ready=False). Neither is present at rest, so kstatus falls through
    to the Ready condition: Current when Ready=True (docs/gitops.md).
    """
    conditions = _with_health(status.conditions, generation, previous, now)
    return status.model_copy(update={"conditions": conditions})


def _with_health(conditions: list[Condition], generation: int | None,
                 previous: LocalModelStatus | None, now: str) -> list[Condition]:
    """`with_health`'s conditions (build_status sets them before it makes the
    status, instead of copying the status made without them)."""
    by_type = {c.type: c for c in conditions}

    def false(type_: ConditionType) -> Condition | None:
        c = by_type.get(type_.value)
        return c if c is not None and c.status == ConditionStatus.FALSE else None

    progressing = by_type.get(ConditionType.PROGRESSING.value)
    health: list[Condition] = []
    blocked = false(ConditionType.VALID) or false(ConditionType.PLACED)
    gap = false(ConditionType.READY)
    if blocked is not None:
        health.append(_true(ConditionType.STALLED, blocked.reason, blocked.message,
                            generation, previous, now))
    elif gap is not None and gap.reason in GAP_REASONS:
        health.append(_true(ConditionType.RECONCILING, gap.reason, gap.message,
                            generation, previous, now))
    elif progressing is not None and progressing.status == ConditionStatus.TRUE:
        health.append(_true(ConditionType.RECONCILING, progressing.reason, progressing.message,
                            generation, previous, now))
    elif (not_ready := false(ConditionType.READY)) is not None:
        health.append(_true(ConditionType.RECONCILING, not_ready.reason, not_ready.message,
                            generation, previous, now))
    others = [c for c in conditions if c.type not in _HEALTH]
    return [*others, *health]


def _true(type_: ConditionType, reason: str, message: str, generation: int | None,
          previous: LocalModelStatus | None, now: str) -> Condition:
    """A True condition whose lastTransitionTime holds while it stays True."""
    old = {c.type: c for c in (previous.conditions if previous else [])}.get(type_.value)
    since = old.last_transition_time if old and old.status == ConditionStatus.TRUE else now
    return _condition(type_.value, ConditionStatus.TRUE, generation, since, reason, message)


def _tps(value: float | None) -> float | None:
    """Rates as written to status: three significant figures; a number that is not
    finite is not written (status fields are finite numbers, and JSON has no NaN)."""
    return None if value is None or not math.isfinite(value) else float(f"{value:.3g}")


def speed_status(p: Published, now_of: str) -> SpeedStatus:
    ratio = ratio_of(p.recent.decode, p.expected.decode)
    return SpeedStatus(
        calibration_decode=_tps(p.calibration.decode),
        calibration_prefill=_tps(p.calibration.prefill),
        recent_decode=_tps(p.recent.decode),
        recent_prefill=_tps(p.recent.prefill),
        expected_decode=_tps(p.expected.decode),
        expected_source=p.expected.describe if p.expected.decode is not None else "",
        ratio=None if ratio is None else round(ratio, 2),
        slow=p.slow,
        measured_at=now_of,
    )


def with_speed(status: LocalModelStatus, speeds: Mapping[int, tuple[Published, str]],
               policy: SpeedPolicy, lm: LocalModel, now: str) -> LocalModelStatus:
    """Add each placed replica's speed (`speeds`: replica -> its published numbers
    and when they were measured, RFC 3339) and the SlowReplica condition.

    A replica with no fresh numbers keeps what its status says while it runs in
    the same pod on the same node (an operator that restarted has read nothing
    yet); a model none of whose replicas was ever read gets neither field."""
    stored = lm.status.placements if lm.status else []
    kept = {(p.replica, p.node, p.pod): p.speed for p in stored if p.speed is not None}
    placements = []
    for p in status.placements:
        if p.replica in speeds:
            p = p.model_copy(update={"speed": speed_status(*speeds[p.replica])})
        elif (p.replica, p.node, p.pod) in kept:
            p = p.model_copy(update={"speed": kept[(p.replica, p.node, p.pod)]})
        placements.append(p)
    if not any(p.speed is not None for p in placements):
        return status
    slow = [p for p in placements if p.speed is not None and p.speed.slow]
    if slow:
        message = "; ".join(
            f"replica {p.replica} on node {p.node} decodes {_show(p.speed.recent_decode)} "
            f"tok/s, expected {_show(p.speed.expected_decode)} tok/s "
            f"({p.speed.expected_source}), ratio {_show(p.speed.ratio)}: below "
            f"{policy.slow_ratio:g} for {policy.slow_after:g} s of traffic"
            for p in slow if p.speed is not None)
        cond = condition(ConditionType.SLOW_REPLICA, True, Reason.BELOW_EXPECTED_SPEED,
                         message, lm, now)
    else:
        cond = condition(ConditionType.SLOW_REPLICA, False, Reason.AS_EXPECTED,
                         "no replica runs below its expected decode speed", lm, now)
    others = [c for c in status.conditions if c.type != ConditionType.SLOW_REPLICA.value]
    return status.model_copy(update={"placements": placements, "conditions": [*others, cond]})


def _show(value: float | None) -> str:
    return "?" if value is None else f"{value:.3g}"


def status_body(status: LocalModelStatus) -> dict[str, Any]:
    return status.model_dump(by_alias=True, exclude_none=True, mode="json")


def status_changed(old: LocalModelStatus | None, new: LocalModelStatus) -> bool:
    """Whether a status write is needed: never when nothing changed (quiet at rest)."""
    return old is not new and (old is None or status_body(old) != status_body(new))
