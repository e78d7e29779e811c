"""Desired state: models x nodes -> placements, tunings, objects and status. Pure.

The one place that strings validation, the planner, the rules and the renderer
together, so `localmodel render` and the operator's handlers compute exactly
the same thing. The caller supplies the clock (`now`) and what it observed
(current placements, other pods' usage, which pods are ready).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from localmodel.api import DecisionStatus, LocalModel, LocalModelStatus
from localmodel.catalog import lookup
from localmodel.errors import FieldError, format_errors
from localmodel.facts import NodeFacts
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
from localmodel.status import ReplicaStatusInput, UnplacedInput, build_status

# A node nothing is known about, for sizing before placement: unknown CPU
# features make every guard fire, so the estimate is the worst case (a
# quantized KV cache that falls back to f16 only grows).
_UNKNOWN_NODE = NodeFacts(name="", allocatable_cpu_milli=10**9, allocatable_memory_bytes=10**18)


# (model, replica, node) -> the claim the replica mounts there
ClaimChooser = Callable[[LocalModel, int, str], str]


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


def demand(lm: LocalModel, avoid: frozenset[str] = frozenset()) -> ModelDemand:
    """What the planner must fit: engine CPUs and memory plus the gateway sidecar.
    `avoid`: nodes where the scheduler could not run this model's pod."""
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
        avoid=avoid,
    )


def _status(
    lm: LocalModel,
    found: Sequence[FieldError],
    replicas: Sequence[ReplicaPlan],
    unplaced: Sequence[Unplaced],
    ready: Mapping[int, bool] | None,
    now: str,
) -> LocalModelStatus:
    return build_status(
        lm,
        format_errors(found) if found else "",
        [
            ReplicaStatusInput(
                replica=r.replica,
                node=r.node,
                pod=pod_name(lm, r.replica),
                threads=r.tuning.threads,
                cpu=r.tuning.cpu,
                memory_bytes=r.tuning.memory_bytes,
                settings=r.tuning.env
                | {f"modelfile.{k}": v for k, v in sorted(r.tuning.modelfile.items())}
                | ({"args": shlex.join(r.tuning.args)} if r.tuning.args else {}),
                decisions=[
                    DecisionStatus(rule=d.rule, effect=d.effect, reason=d.reason, source=d.source)
                    for d in r.tuning.decisions
                ],
                warnings=r.tuning.warnings,
                reason=r.reason,
            )
            for r in replicas
        ],
        [UnplacedInput(u.replica, u.reason, u.message) for u in unplaced],
        ready,
        now,
        endpoint=endpoint(lm),
        selector=pod_selector(lm),
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
    claims: ClaimChooser | None = None,
    avoid: Mapping[str, frozenset[str]] | None = None,
) -> DesiredState:
    """Everything the operator would create for these models on these nodes.

    ``claims`` names the weights claim a replica mounts on its node (the
    operator's choice among existing claims); by default, the replica's own.
    ``avoid`` maps a model to the nodes its pods could not be scheduled on."""
    found = {lm.key: tuple(problems(lm.spec)) for lm in models}
    valid = [lm for lm in models if not found[lm.key]]
    avoid = avoid or {}
    the_plan = plan(
        [demand(lm, avoid.get(lm.key, frozenset())) for lm in valid],
        nodes,
        current or {},
        usage or {},
    )
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
                claim = claims(lm, p.replica, p.node) if claims else ""
                replicas.append(ReplicaPlan(p.replica, p.node, tuning, p.reason, claim))
            unplaced = the_plan.unplaced_for(lm.key)
        seen = None if ready is None else ready.get(lm.key, {})
        status = _status(lm, found[lm.key], replicas, unplaced, seen, now)
        objects = render_objects(lm, replicas, options) if not found[lm.key] else []
        results.append(
            ModelResult(lm, found[lm.key], tuple(replicas), unplaced, tuple(objects), status)
        )
    return DesiredState(tuple(results), the_plan)
