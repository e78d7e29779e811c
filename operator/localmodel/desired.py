"""Desired state: models x nodes -> placements, tunings, objects and status. Pure.

The one place that strings validation, the planner, the rules and the renderer
together, so `localmodel render` and the operator's handlers compute exactly
the same thing. The caller supplies the clock (`now`) and what it observed
(current placements, other pods' usage, which pods are ready).

This is the plain path, the specification: it reads top to bottom and keeps
nothing. For each model: its spec prepared and validated (`prepare`), every
valid model placed by the planner (`demand`, `planner.plan`), each placed
replica tuned by the rules (`rules.evaluate`), then rendered (its objects and
their digests) and its status built (`_model_result`). The operator runs the
same pass incrementally (`localmodel.incremental.Desired`: it keeps its work
between passes and shares it between alike models); property tests hold the
two equal (tests/controller/test_incremental_desired.py, test_pass_memo.py).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from localmodel.api import DecisionStatus, LocalModel, LocalModelSpec, LocalModelStatus
from localmodel.api.parse import DECISIONS
from localmodel.catalog import ModelShape, lookup
from localmodel.contract import LABEL_REPLICA
from localmodel.errors import FieldError, format_errors
from localmodel.facts import NodeFacts
from localmodel.idle.decide import NO_IDLE, IdleInputs
from localmodel.planner import (
    CpuRequest,
    Cpus,
    ModelDemand,
    Plan,
    Unplaced,
    Usage,
    cpu_limit,
    plan,
    replica_cpus,
)
from localmodel.render import (
    Manifest,
    RenderOptions,
    ReplicaPlan,
    applied_hashes,
    manifest_hash,
    render_objects,
)
from localmodel.render.names import (
    endpoint,
    gateway_cpu_milli,
    gateway_memory_bytes,
    pod_name,
    pod_selector,
)
from localmodel.rules.evaluate import engine_version, evaluate, shape_problems
from localmodel.rules.model import Tuning
from localmodel.status import ReplicaStatusInput, UnplacedInput, build_status, failed_status
from localmodel.versions import Version

# A node nothing is known about, for sizing before placement: unknown CPU
# features make every guard fire, so the estimate is the worst case (a
# quantized KV cache that falls back to f16 only grows).
_UNKNOWN_NODE = NodeFacts(name="", allocatable_cpu_milli=10**9, allocatable_memory_bytes=10**18)
_ONE_CPU = replica_cpus(cpu_limit(_UNKNOWN_NODE), 1)


# (model, replica, node) -> the claim the replica mounts there
ClaimChooser = Callable[[LocalModel, int, str], str]
# The rules for one replica: `rules.evaluate`'s signature (a pass may memoize it).
Evaluate = Callable[[LocalModelSpec, NodeFacts, Cpus, ModelShape | None, Version | None], Tuning]
# A tuning's settings and decisions as status shows them (`tuning_view`).
TuningView = Callable[[Tuning], tuple[dict[str, str], list[DecisionStatus]]]


@dataclass(frozen=True)
class ModelResult:
    """One model's outcome. A pass works out what the operator compares with
    what exists: each pod's spec digest (`pod_hashes`: replica -> digest) and
    each applied object's (`applied_hashes`: (kind, name) -> digest). The
    manifests are made when first read (`objects`): for a pod, claim or
    applied object to write, or a render. They follow from the fields
    (rendering is pure), so results with equal fields have equal objects."""

    model: LocalModel
    problems: tuple[FieldError, ...]
    replicas: tuple[ReplicaPlan, ...]
    unplaced: tuple[Unplaced, ...]
    status: LocalModelStatus
    options: RenderOptions | None = None
    pod_hashes: Mapping[int, str] = field(default_factory=dict)
    applied_hashes: Mapping[tuple[str, str], str] = field(default_factory=dict)
    # Non-empty when computing this model raised (`failed_result`): the stage and
    # the exception. Such a result changes nothing; its status says why.
    failure: str = ""
    # Asleep and released (`spec.idle`, `IdleInputs.released`): no replica is
    # placed and its pods go as a scale-down's do; its claims stay.
    released: bool = False

    @property
    def with_status(self) -> LocalModel:
        return self.model.model_copy(update={"status": self.status})

    @cached_property
    def objects(self) -> tuple[Manifest, ...]:
        """Every manifest (`render_objects`); none for an invalid spec."""
        if self.problems:
            return ()
        return tuple(render_objects(self.model, self.replicas, self.options))

    def manifest(self, kind: str, name: str) -> Manifest:
        """One of `objects`."""
        return next(
            o for o in self.objects if o["kind"] == kind and o["metadata"]["name"] == name
        )

    def reusing(self, other: ModelResult) -> ModelResult:
        """This result, with the manifests `other` (of the same model, replicas
        and options) already made."""
        if "objects" in vars(other):
            vars(self)["objects"] = other.objects
        return self


@dataclass(frozen=True)
class DesiredState:
    """Decides what should exist: every model's result and the plan they come from."""

    models: tuple[ModelResult, ...]
    plan: Plan = field(default_factory=lambda: Plan((), ()))
    # The planner's demands (valid models, by key order): what a yield asks of a node.
    demands: tuple[ModelDemand, ...] = field(default=(), compare=False)


@dataclass(frozen=True)
class Prepared:
    """What one model's spec alone decides: the problems that make it invalid,
    its shape (catalog or spec.modelInfo), its engine version, and the memory
    the planner must fit (the worst case, on a node nothing is known about,
    plus the gateway sidecar)."""

    problems: tuple[FieldError, ...]
    shape: ModelShape | None
    version: Version | None
    memory_bytes: int
    failure: str = ""  # preparing it raised (`prepared`): not placed, nothing changed


def prepare(spec: LocalModelSpec, rules: Evaluate = evaluate) -> Prepared:
    """``rules``: `rules.evaluate`, or a pass's memo of it."""
    shape = lookup(spec.model, spec.model_info)
    found = tuple(shape_problems(spec, shape))
    if found:
        return Prepared(found, shape, None, 0)
    # Sized for an unknown node and an unknown engine version: every guard fires.
    worst = rules(spec, _UNKNOWN_NODE, _ONE_CPU, shape, None)
    gateway = gateway_memory_bytes(spec.slots, spec.gateway.max_queue)
    memory = worst.memory_bytes + (gateway if spec.gateway.enabled else 0)
    return Prepared(found, shape, engine_version(spec), memory)


def failure_text(stage: str, exc: BaseException) -> str:
    """What a failed model's status and Event say: the stage and the exception,
    bounded."""
    return f"{stage}: {type(exc).__name__}: {str(exc)[:300]}"


def prepared(spec: LocalModelSpec, rules: Evaluate = evaluate) -> Prepared:
    """`prepare`, contained: an exception (its shape, the rules) prepares a model
    that is not placed and whose result says why (`Prepared.failure`)."""
    try:
        return prepare(spec, rules)
    except Exception as exc:  # one model's failure is that model's
        return Prepared((), None, None, 0, failure_text("shape and sizing", exc))


def failed_result(lm: LocalModel, failure: str, now: str) -> ModelResult:
    """The result of a model whose computation raised: nothing to change, its
    stored status with Ready=False naming the failure."""
    return ModelResult(lm, (), (), (), failed_status(lm.metadata.generation, failure,
                                                      lm.status, now), failure=failure)


def demand(
    lm: LocalModel, avoid: frozenset[str] = frozenset(), prepared: Prepared | None = None,
    *, released: bool = False, prefer: tuple[str | None, ...] = (),
) -> ModelDemand:
    """What the planner must fit: engine CPUs and memory plus the gateway sidecar.
    `avoid`: nodes where the scheduler could not run this model's pod, or the
    idle rules keep it from; `released`: asleep and released, it asks for no
    replica; `prefer`: per replica a node it prefers (`IdleInputs`)."""
    spec = lm.spec
    memory = (prepared or prepare(spec)).memory_bytes
    return ModelDemand(
        key=lm.key,
        replicas=0 if released else spec.replicas,
        cpu=CpuRequest.of(spec.cpu),
        memory_bytes=memory,
        exclusive=spec.placement.exclusive,
        node_selector=dict(spec.placement.node_selector),
        tolerations=tuple(spec.placement.tolerations),
        overhead_cpu_milli=gateway_cpu_milli(spec.slots) if spec.gateway.enabled else 0,
        avoid=avoid,
        prefer=prefer,
    )


def idle_demand(lm: LocalModel, avoid: frozenset[str], prep: Prepared,
                idle: IdleInputs) -> ModelDemand:
    """`demand` with what the idle decisions add (`IdleInputs`)."""
    released, prefer, also = idle.demand_of(lm.key)
    return demand(lm, avoid | also if also else avoid, prep, released=released, prefer=prefer)


def tuning_view(t: Tuning) -> tuple[dict[str, str], list[DecisionStatus]]:
    """A tuning's settings and decisions as status shows them."""
    settings = (
        t.env
        | {f"modelfile.{k}": v for k, v in sorted(t.modelfile.items())}
        | ({"args": shlex.join(t.args)} if t.args else {})
    )
    decisions = [  # the very objects stored statuses hold (`api.parse.DECISIONS`)
        DECISIONS.of({"rule": d.rule, "effect": d.effect, "reason": d.reason, "source": d.source})
        for d in t.decisions
    ]
    return settings, decisions


def model_status(
    lm: LocalModel,
    found: Sequence[FieldError],
    replicas: Sequence[ReplicaPlan],
    unplaced: Sequence[Unplaced],
    ready: Mapping[int, bool] | None,
    now: str,
    view: TuningView = tuning_view,
) -> LocalModelStatus:
    """``view``: `tuning_view`, or a pass's memo of it."""
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
                settings=(shown := view(r.tuning))[0],
                decisions=shown[1],
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
    idle: IdleInputs = NO_IDLE,
) -> DesiredState:
    """Everything the operator would create for these models on these nodes.

    ``claims`` names the weights claim a replica mounts on its node (the
    operator's choice among existing claims); by default, the replica's own.
    ``avoid`` maps a model to the nodes its pods could not be scheduled on.
    ``idle``: what the idle decisions tell the planner (released models, the
    nodes each prefers and avoids: `idle.decide`).
    The operator computes the same incrementally (`incremental.Desired`)."""
    # Each spec validated and prepared on its own; the valid ones placed.
    listed = sorted(models, key=lambda lm: lm.key)
    preps = [prepared(lm.spec) for lm in listed]
    avoid = avoid or {}
    demands = [
        idle_demand(lm, avoid.get(lm.key, frozenset()), prep, idle)
        for lm, prep in zip(listed, preps, strict=True)
        if not (prep.problems or prep.failure)
    ]
    the_plan = plan(demands, nodes, current or {}, usage or {})
    by_node = {n.name: n for n in nodes}
    # Then each model: its replicas tuned by the rules, rendered, its status.
    return DesiredState(
        tuple(
            _contained(lm, prep, the_plan, by_node, claims,
                       None if ready is None else ready.get(lm.key, {}), options, now,
                       lm.key in idle.released)
            for lm, prep in zip(listed, preps, strict=True)
        ),
        the_plan,
        tuple(demands),
    )


def _contained(
    lm: LocalModel,
    prep: Prepared,
    the_plan: Plan,
    by_node: Mapping[str, NodeFacts],
    claims: ClaimChooser | None,
    ready: Mapping[int, bool] | None,
    options: RenderOptions | None,
    now: str,
    released: bool = False,
) -> ModelResult:
    """One model's result; an exception while tuning, rendering or building its
    status makes it that model's failed result, never the pass's end."""
    if prep.failure:
        return failed_result(lm, prep.failure, now)
    try:
        replicas = _replicas(lm, prep, the_plan, by_node, claims)
        unplaced = () if prep.problems else the_plan.unplaced_for(lm.key)
        return _model_result(lm, prep, replicas, unplaced, ready, options, now,
                             released and not prep.problems)
    except Exception as exc:  # one model's failure is that model's
        return failed_result(lm, failure_text("tuning, render or status", exc), now)


def _replicas(
    lm: LocalModel,
    prep: Prepared,
    the_plan: Plan,
    by_node: Mapping[str, NodeFacts],
    claims: ClaimChooser | None,
) -> tuple[ReplicaPlan, ...]:
    """Each of the model's placed replicas, tuned by the rules for its node."""
    if prep.problems:
        return ()
    return tuple(
        ReplicaPlan(
            p.replica,
            p.node,
            evaluate(lm.spec, by_node[p.node], p.cpu, prep.shape, prep.version),
            p.reason,
            claims(lm, p.replica, p.node) if claims else "",
        )
        for p in the_plan.placements_for(lm.key)
    )


def _model_result(
    lm: LocalModel,
    prep: Prepared,
    replicas: tuple[ReplicaPlan, ...],
    unplaced: tuple[Unplaced, ...],
    ready: Mapping[int, bool] | None,
    options: RenderOptions | None,
    now: str,
    released: bool = False,
) -> ModelResult:
    """The model rendered (none for an invalid spec), with the digests of its
    manifests, and its status."""
    objects: tuple[Manifest, ...] = ()
    hashes: dict[int, str] = {}
    applied: dict[tuple[str, str], str] = {}
    if not prep.problems:
        objects = tuple(render_objects(lm, replicas, options))
        hashes = {
            int(o["metadata"]["labels"][LABEL_REPLICA]): manifest_hash(o["spec"])
            for o in objects
            if o["kind"] == "Pod"
        }
        applied = applied_hashes(lm, replicas, options)
    status = model_status(lm, prep.problems, replicas, unplaced, ready, now)
    result = ModelResult(lm, prep.problems, replicas, unplaced, status, options, hashes, applied,
                         released=released)
    vars(result)["objects"] = objects  # (rendered here: `objects` need not again)
    return result
