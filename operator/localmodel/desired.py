"""Desired state: models x nodes -> placements, tunings, objects and status. Pure.

The one place that strings validation, the planner, the rules and the renderer
together, so `localmodel render` and the operator's handlers compute exactly
the same thing. The caller supplies the clock (`now`) and what it observed
(current placements, other pods' usage, which pods are ready).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from localmodel.api import (
    Condition,
    ConditionStatus,
    DecisionStatus,
    LocalModel,
    LocalModelStatus,
    PlacementStatus,
)
from localmodel.catalog import lookup
from localmodel.errors import FieldError, format_errors
from localmodel.facts import NodeFacts
from localmodel.facts.quantity import format_bytes
from localmodel.planner import ModelDemand, Plan, Unplaced, Usage, plan
from localmodel.render import (
    GATEWAY_CPU_MILLI,
    GATEWAY_MEMORY_BYTES,
    Manifest,
    RenderOptions,
    ReplicaPlan,
    endpoint,
    pod_name,
    pod_selector,
    render_objects,
)
from localmodel.rules import engine_version, evaluate, problems

# A node nothing is known about, for sizing before placement: unknown CPU
# features make every guard fire, so the estimate is the worst case (a
# quantized KV cache that falls back to f16 only grows).
_UNKNOWN_NODE = NodeFacts(name="", allocatable_cpu_milli=10**9, allocatable_memory_bytes=10**18)


@dataclass(frozen=True)
class ModelResult:
    model: LocalModel
    problems: tuple[FieldError, ...]
    replicas: tuple[ReplicaPlan, ...]
    unplaced: tuple[Unplaced, ...]
    objects: tuple[Manifest, ...]
    status: LocalModelStatus

    @property
    def with_status(self) -> LocalModel:
        return self.model.model_copy(update={"status": self.status})


@dataclass(frozen=True)
class DesiredState:
    models: tuple[ModelResult, ...]
    plan: Plan = field(default_factory=lambda: Plan((), ()))


def demand(lm: LocalModel) -> ModelDemand:
    """What the planner must fit: engine CPUs and memory plus the gateway sidecar."""
    spec = lm.spec
    worst = evaluate(spec, _UNKNOWN_NODE, 1, lookup(spec.model, spec.model_info), None)
    memory = worst.memory_bytes + (GATEWAY_MEMORY_BYTES if spec.gateway.enabled else 0)
    return ModelDemand(
        key=lm.key,
        replicas=spec.replicas,
        cpu=None if spec.cpu == "node" else spec.cpu,
        memory_bytes=memory,
        exclusive=spec.placement.exclusive,
        node_selector=dict(spec.placement.node_selector),
        tolerations=tuple(spec.placement.tolerations),
        overhead_cpu_milli=GATEWAY_CPU_MILLI if spec.gateway.enabled else 0,
    )


def _condition(
    type_: str, ok: bool | None, reason: str, message: str, lm: LocalModel, now: str
) -> Condition:
    status = (
        ConditionStatus.UNKNOWN
        if ok is None
        else (ConditionStatus.TRUE if ok else ConditionStatus.FALSE)
    )
    previous = {c.type: c for c in (lm.status.conditions if lm.status else [])}.get(type_)
    # lastTransitionTime moves only when the status does (metav1.Condition).
    since = previous.last_transition_time if previous and previous.status == status else now
    return Condition(
        type=type_,
        status=status,
        observed_generation=lm.metadata.generation,
        last_transition_time=since,
        reason=reason,
        message=message,
    )


def _status(
    lm: LocalModel,
    found: Sequence[FieldError],
    replicas: Sequence[ReplicaPlan],
    unplaced: Sequence[Unplaced],
    ready: Mapping[int, bool] | None,
    now: str,
) -> LocalModelStatus:
    want = lm.spec.replicas
    n_ready = 0 if ready is None else sum(1 for r in replicas if ready.get(r.replica))
    conditions = []
    if found:
        msg = format_errors(found)
        conditions += [
            _condition("Valid", False, "InvalidSpec", msg, lm, now),
            _condition("Placed", False, "InvalidSpec", "not placed: the spec is invalid", lm, now),
            _condition("Ready", False, "InvalidSpec", "not deployed: the spec is invalid", lm, now),
        ]
    else:
        conditions.append(_condition("Valid", True, "SpecValid", "spec accepted", lm, now))
        warnings = sorted({w for r in replicas for w in r.tuning.warnings})
        if unplaced:
            msg = "; ".join(f"replica {u.replica}: {u.message}" for u in unplaced)
            conditions.append(_condition("Placed", False, unplaced[0].reason, msg, lm, now))
        else:
            nodes = ", ".join(r.node for r in replicas) or "none"
            msg = f"{len(replicas)}/{want} replicas placed on {nodes}"
            if warnings:
                msg += "; warnings: " + "; ".join(warnings)
            conditions.append(_condition("Placed", True, "AllReplicasPlaced", msg, lm, now))
        if ready is None:
            conditions.append(
                _condition(
                    "Ready", None, "NotDeployed", "offline render: nothing is running", lm, now
                )
            )
        else:
            ok = n_ready == want
            reason = "AllReplicasReady" if ok else "ReplicasNotReady"
            conditions.append(
                _condition("Ready", ok, reason, f"{n_ready}/{want} replicas ready", lm, now)
            )
    return LocalModelStatus(
        observed_generation=lm.metadata.generation,
        conditions=conditions,
        placements=[
            PlacementStatus(
                replica=r.replica,
                node=r.node,
                pod=pod_name(lm, r.replica),
                threads=r.tuning.threads,
                cpu=r.tuning.cpu,
                memory=format_bytes(r.tuning.memory_bytes),
                settings=r.tuning.env
                | {f"modelfile.{k}": v for k, v in sorted(r.tuning.modelfile.items())}
                | ({"args": shlex.join(r.tuning.args)} if r.tuning.args else {}),
                decisions=[
                    DecisionStatus(rule=d.rule, effect=d.effect, reason=d.reason, source=d.source)
                    for d in r.tuning.decisions
                ],
                reason=r.reason,
            )
            for r in replicas
        ],
        replicas=len(replicas),
        selector=pod_selector(lm),
        ready_replicas=n_ready,
        ready=f"{n_ready}/{want}",
        nodes=",".join(r.node for r in replicas),
        endpoint=endpoint(lm) if not found else "",
    )


def desired_state(
    models: Sequence[LocalModel],
    nodes: Sequence[NodeFacts],
    *,
    now: str,
    current: Mapping[str, Sequence[str | None]] | None = None,
    usage: Mapping[str, Usage] | None = None,
    ready: Mapping[str, Mapping[int, bool]] | None = None,
    options: RenderOptions | None = None,
) -> DesiredState:
    """Everything the operator would create for these models on these nodes."""
    found = {lm.key: tuple(problems(lm.spec)) for lm in models}
    valid = [lm for lm in models if not found[lm.key]]
    the_plan = plan([demand(lm) for lm in valid], nodes, current or {}, usage or {})
    by_node = {n.name: n for n in nodes}
    results = []
    for lm in sorted(models, key=lambda m: m.key):
        replicas: list[ReplicaPlan] = []
        unplaced: tuple[Unplaced, ...] = ()
        if not found[lm.key]:
            shape = lookup(lm.spec.model, lm.spec.model_info)
            version = engine_version(lm.spec)
            for p in the_plan.placements_for(lm.key):
                tuning = evaluate(lm.spec, by_node[p.node], p.cpu, shape, version)
                replicas.append(ReplicaPlan(p.replica, p.node, tuning, p.reason))
            unplaced = the_plan.unplaced_for(lm.key)
        seen = None if ready is None else ready.get(lm.key, {})
        status = _status(lm, found[lm.key], replicas, unplaced, seen, now)
        objects = render_objects(lm, replicas, options) if not found[lm.key] else []
        results.append(
            ModelResult(lm, found[lm.key], tuple(replicas), unplaced, tuple(objects), status)
        )
    return DesiredState(tuple(results), the_plan)
