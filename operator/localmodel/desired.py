"""Desired state: models x nodes -> placements, tunings, objects and status. Pure.

The one place that strings validation, the planner, the rules and the renderer
together, so `localmodel render` and the operator's handlers compute exactly
the same thing. The caller supplies the clock (`now`) and what it observed
(current placements, other pods' usage, which pods are ready).
"""

from __future__ import annotations

import shlex
from bisect import bisect_left
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple, cast

from localmodel.api import DecisionStatus, LocalModel, LocalModelSpec, LocalModelStatus
from localmodel.catalog import ModelShape, lookup
from localmodel.errors import FieldError, format_errors
from localmodel.facts import NodeFacts
from localmodel.planner import ModelDemand, Plan, Planner, Unplaced, Usage
from localmodel.render import (
    AppliedDigests,
    Manifest,
    PodParts,
    RenderOptions,
    ReplicaPlan,
    pod_digest,
    render_objects,
)
from localmodel.render.names import (
    GATEWAY_CPU_MILLI,
    GATEWAY_MEMORY_BYTES,
    endpoint,
    pod_name,
    pod_selector,
)
from localmodel.rules import Evaluations, Tuning, engine_version, shape_problems, spec_key
from localmodel.rules.model import Version
from localmodel.status import ReplicaStatusInput, UnplacedInput, build_status, took_now

# A node nothing is known about, for sizing before placement: unknown CPU
# features make every guard fire, so the estimate is the worst case (a
# quantized KV cache that falls back to f16 only grows).
_UNKNOWN_NODE = NodeFacts(name="", allocatable_cpu_milli=10**9, allocatable_memory_bytes=10**18)


# (model, replica, node) -> the claim the replica mounts there
ClaimChooser = Callable[[LocalModel, int, str], str]


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
    models: tuple[ModelResult, ...]
    plan: Plan = field(default_factory=lambda: Plan((), ()))


@dataclass(frozen=True)
class Prepared:
    """What one model's spec alone decides, worked out once per spec: the
    problems that make it invalid, its shape (catalog or spec.modelInfo), its
    engine version, and the memory the planner must fit (the worst case, on a
    node nothing is known about, plus the gateway sidecar). ``key``: the spec
    as far as the rules read it (`rules.spec_key`)."""

    problems: tuple[FieldError, ...]
    shape: ModelShape | None
    version: Version | None
    memory_bytes: int
    key: Hashable = None


def prepare(
    spec: LocalModelSpec, evaluations: Evaluations | None = None, key: Hashable = None
) -> Prepared:
    """``evaluations``: a pass's memo; ``key``: the spec's `spec_key`, when known."""
    key = spec_key(spec) if key is None else key
    shape = lookup(spec.model, spec.model_info)
    found = tuple(shape_problems(spec, shape))
    if found:
        return Prepared(found, shape, None, 0, key)
    # Sized for an unknown node and an unknown engine version: every guard fires.
    worst = (evaluations or Evaluations())(spec, _UNKNOWN_NODE, 1, shape, None, key)
    memory = worst.memory_bytes + (GATEWAY_MEMORY_BYTES if spec.gateway.enabled else 0)
    return Prepared(found, shape, engine_version(spec), memory, key)


def demand(
    lm: LocalModel, avoid: frozenset[str] = frozenset(), prepared: Prepared | None = None
) -> ModelDemand:
    """What the planner must fit: engine CPUs and memory plus the gateway sidecar.
    `avoid`: nodes where the scheduler could not run this model's pod."""
    spec = lm.spec
    memory = (prepared or prepare(spec)).memory_bytes
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


# id(tuning) -> (the tuning, held; its settings and decisions as status shows them)
_TuningViews = dict[int, tuple[Tuning, dict[str, str], list[DecisionStatus]]]


def _tuning_view(
    t: Tuning, views: _TuningViews | None
) -> tuple[dict[str, str], list[DecisionStatus]]:
    """A tuning's settings and decisions as status shows them (status copies
    both, so one pass's replicas of one tuning share them)."""
    found = None if views is None else views.get(id(t))
    if found is not None and found[0] is t:
        return found[1], found[2]
    settings = (
        t.env
        | {f"modelfile.{k}": v for k, v in sorted(t.modelfile.items())}
        | ({"args": shlex.join(t.args)} if t.args else {})
    )
    decisions = [
        DecisionStatus(rule=d.rule, effect=d.effect, reason=d.reason, source=d.source)
        for d in t.decisions
    ]
    if views is not None:
        views[id(t)] = (t, settings, decisions)
    return settings, decisions


def _status(
    lm: LocalModel,
    found: Sequence[FieldError],
    replicas: Sequence[ReplicaPlan],
    unplaced: Sequence[Unplaced],
    ready: Mapping[int, bool] | None,
    now: str,
    views: _TuningViews | None = None,
) -> LocalModelStatus:
    """``views``: a pass's memo of `_tuning_view` (by tuning identity)."""
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
                settings=(view := _tuning_view(r.tuning, views))[0],
                decisions=view[1],
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
    ``avoid`` maps a model to the nodes its pods could not be scheduled on.
    A fresh `Desired`: the operator keeps one between passes instead."""
    return Desired().state(
        models,
        nodes,
        now=now,
        current=current,
        usage=usage,
        ready=ready,
        options=options,
        claims=claims,
        avoid=avoid,
    )


class _Tuned(NamedTuple):  # (a tuple: made per replica, cheaply)
    spec: LocalModelSpec
    node: NodeFacts
    cpu: int
    tuning: Tuning


class _Done(NamedTuple):
    """One model's result and everything it was computed from (a tuple: made
    per model, cheaply)."""

    model: LocalModel
    replicas: tuple[ReplicaPlan, ...]
    unplaced: tuple[Unplaced, ...]
    ready: Mapping[int, bool] | None
    options: RenderOptions | None
    now: str
    result: ModelResult
    took_now: bool  # whether its status took the clock (`status.took_now`)


class Desired:
    """`desired_state` that keeps its work between passes, so a pass costs what
    changed. Each model goes one straight way: its spec prepared once (shape,
    version, problems, the memory to fit), placed by a long-lived `Planner`,
    each replica tuned, then rendered, then its status. What a step read is
    kept with what it made, and reused while those inputs are the same: a
    LocalModel (or spec) is the same when it is the same object (they are
    frozen; the operator parses each stored version once), node facts when
    equal. A status is reused at a later `now` only when it did not take the
    clock (`took_now`). The result is always what a fresh pass computes: a
    property test holds the two together over random sequences of changes."""

    def __init__(self) -> None:
        self.planner = Planner()
        self._prepared: dict[str, tuple[LocalModelSpec, Prepared]] = {}
        self._demands: dict[str, tuple[LocalModelSpec, frozenset[str], ModelDemand]] = {}
        self._tuned: dict[str, dict[int, _Tuned]] = {}
        self._done: dict[str, _Done] = {}
        # The model list as last given, kept sorted by key; a new list is
        # compared object by object and only what changed is worked out again.
        self._listed: tuple[LocalModel, ...] | None = None
        self._avoid: dict[str, frozenset[str]] = {}
        self._by_id: dict[int, str] = {}  # id(LocalModel) -> key (the models are held)
        self._model: dict[str, LocalModel] = {}
        self._keys: list[str] = []  # sorted
        self._now_prepared: dict[str, Prepared] = {}
        self._demand_keys: list[str] = []  # sorted, the valid models'
        self._now_demands: list[ModelDemand] = []  # in the same order
        self._results: list[ModelResult | None] = []  # in the order of _keys
        # What the last pass's results read, to find the models a new pass must
        # look at again: the options, readiness, the clock (for statuses that
        # took it), and whether claims were chosen.
        self._options: RenderOptions | None = None
        self._ready: dict[str, dict[int, bool]] | None = None
        self._now: str | None = None
        self._took_now: set[str] = set()
        self._claims = False
        self._complete = True  # the last call returned
        self._plan: Plan | None = None
        self._evaluations = Evaluations()
        self._prepared_by_key: dict[Hashable, Prepared] = {}
        self._parts = PodParts()
        self._applied = AppliedDigests()
        self._views: _TuningViews = {}

    def state(
        self,
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
        avoid = avoid or {}
        # By value, for this pass: specs and nodes that read the same share
        # their preparation and tunings (what a model keeps is kept per model).
        self._evaluations, self._prepared_by_key = Evaluations(), {}
        self._parts, self._applied, self._views = PodParts(), AppliedDigests(), {}
        if not self._complete:  # the last call raised (a model listed twice): start over
            self._listed = None
        self._complete = False
        again = self._sync(tuple(models), avoid)  # None: every model
        the_plan = self.planner.plan(self._now_demands, nodes, current or {}, usage or {})
        # The planner hands back the same plan only when no node's facts changed,
        # and names the models a new plan may place or explain differently (the
        # nodes of the others were not re-kept: their facts are the same too).
        plan_same = the_plan is self._plan
        touched = self.planner.touched if self._plan is not None else None
        if not plan_same:
            if touched is None:
                again = None
            elif again is not None:
                again |= touched
        self._plan = the_plan
        if options != self._options or bool(claims) or self._claims:
            again = None  # (claims: a function, asked again for every replica)
        self._options, self._claims = options, claims is not None
        if ready != self._ready:  # (None, or a mapping compared in C)
            if again is not None:
                if (ready is None) != (self._ready is None):
                    again = None
                else:
                    old, new = self._ready or {}, ready or {}
                    again |= {
                        k for k in old.keys() | new.keys() if old.get(k, {}) != new.get(k, {})
                    }
            self._ready = None if ready is None else {k: dict(v) for k, v in ready.items()}
        if now != self._now:
            if again is not None:
                again |= self._took_now
            self._now = now
        keys, results = self._keys, self._results
        if again is None:
            positions: Iterable[int] = range(len(keys))
        else:
            positions = sorted(bisect_left(keys, k) for k in again if k in self._model)
        by_node: Mapping[str, NodeFacts] | None = None
        for i in positions:
            key = keys[i]
            lm = self._model[key]
            seen = None if ready is None else ready.get(key, {})
            done = self._done.get(key)
            if (
                results[i] is not None
                and (plan_same or (touched is not None and key not in touched))
                and done is not None
                and done.model is lm
                and done.options == options
                and done.ready == seen
                and (done.now == now or not done.took_now)
                and all(
                    (claims(lm, r.replica, r.node) if claims else "") == r.claim
                    for r in done.replicas
                )
            ):
                continue
            prep = self._now_prepared[key]
            replicas: tuple[ReplicaPlan, ...] = ()
            unplaced: tuple[Unplaced, ...] = ()
            if not prep.problems:
                if by_node is None:
                    by_node = self.planner.nodes_by_name
                replicas = tuple(
                    ReplicaPlan(
                        p.replica,
                        p.node,
                        self._tune(key, lm, prep, by_node[p.node], p.replica, p.cpu),
                        p.reason,
                        claims(lm, p.replica, p.node) if claims else "",
                    )
                    for p in the_plan.placements_for(key)
                )
                unplaced = the_plan.unplaced_for(key)
            results[i] = self._result(key, lm, prep, replicas, unplaced, seen, options, now)
            if self._done[key].took_now:
                self._took_now.add(key)
            else:
                self._took_now.discard(key)
        out = tuple(results)
        assert None not in out
        self._complete = True
        return DesiredState(cast(tuple[ModelResult, ...], out), the_plan)

    def _sync(
        self, listed: tuple[LocalModel, ...], avoid: Mapping[str, frozenset[str]]
    ) -> set[str] | None:
        """Bring the sorted model list, preparations and demands up to this
        list; the keys of the models that changed (None: all of them)."""
        if listed == self._listed and avoid == self._avoid:
            return set()
        old_ids = self._by_id
        new_ids = {id(lm): lm for lm in listed}
        if self._listed is None or len(new_ids) != len(listed):
            self._sync_all(listed, avoid)
            return None
        gone = {key for i, key in old_ids.items() if i not in new_ids}
        came = [lm for i, lm in new_ids.items() if i not in old_ids]
        changed: set[str] = set()
        for lm in came:
            key = lm.key
            if (key in self._model and key not in gone) or key in changed:
                self._sync_all(listed, avoid)  # listed twice: the planner says so
                return None
            changed.add(key)
        arrived = {lm.key: lm for lm in came}
        for key in gone - arrived.keys():  # removed
            self._drop(key)
        for key, lm in arrived.items():
            old = self._model.get(key)
            if old is not None:
                del self._by_id[id(old)]
            else:
                i = bisect_left(self._keys, key)
                self._keys.insert(i, key)
                self._results.insert(i, None)
            self._model[key] = lm
            self._by_id[id(lm)] = key
            self._now_prepared[key] = self._prepare(key, lm)
        if avoid != self._avoid:
            changed |= {
                k for k in avoid.keys() | self._avoid.keys() if avoid.get(k) != self._avoid.get(k)
            }
        for key in changed:
            self._set_demand(key, avoid.get(key, frozenset()))
        self._listed, self._avoid = listed, dict(avoid)
        return changed

    def _sync_all(
        self, listed: tuple[LocalModel, ...], avoid: Mapping[str, frozenset[str]]
    ) -> None:
        self._listed, self._avoid = listed, dict(avoid)
        keyed = sorted(((lm.key, lm) for lm in listed), key=lambda kl: kl[0])
        self._keys = [key for key, _ in keyed]
        self._model = dict(keyed)
        self._by_id = {id(lm): key for key, lm in keyed}
        self._results = [None] * len(keyed)
        self._now_prepared = {key: self._prepare(key, lm) for key, lm in keyed}
        self._demand_keys, self._now_demands = [], []
        for key, lm in keyed:
            prep = self._now_prepared[key]
            if not prep.problems:
                self._demand_keys.append(key)
                self._now_demands.append(
                    self._demand(key, lm, prep, avoid.get(key, frozenset()))
                )
        keys = set(self._now_prepared)
        for kept in (self._prepared, self._demands, self._done, self._tuned):
            for gone in [k for k in kept if k not in keys]:
                del kept[gone]
        self._took_now &= keys

    def _drop(self, key: str) -> None:
        i = bisect_left(self._keys, key)
        del self._keys[i], self._results[i]
        lm = self._model.pop(key)
        del self._by_id[id(lm)], self._now_prepared[key]
        j = bisect_left(self._demand_keys, key)
        if j < len(self._demand_keys) and self._demand_keys[j] == key:
            del self._demand_keys[j], self._now_demands[j]
        for kept in (self._prepared, self._demands, self._done, self._tuned):
            kept.pop(key, None)
        self._took_now.discard(key)

    def _set_demand(self, key: str, avoid: frozenset[str]) -> None:
        """The key's place in the demand list, after its model or avoided nodes changed."""
        j = bisect_left(self._demand_keys, key)
        there = j < len(self._demand_keys) and self._demand_keys[j] == key
        lm = self._model.get(key)
        prep = None if lm is None else self._now_prepared[key]
        if prep is None or prep.problems:
            if there:
                del self._demand_keys[j], self._now_demands[j]
            return
        assert lm is not None
        made = self._demand(key, lm, prep, avoid)
        if there:
            self._now_demands[j] = made
        else:
            self._demand_keys.insert(j, key)
            self._now_demands.insert(j, made)

    def _prepare(self, key: str, lm: LocalModel) -> Prepared:
        memo = self._prepared.get(key)
        if memo is not None and memo[0] is lm.spec:
            return memo[1]
        value = spec_key(lm.spec)
        prep = self._prepared_by_key.get(value)
        if prep is None:
            prep = prepare(lm.spec, self._evaluations, value)
            self._prepared_by_key[value] = prep
        self._prepared[key] = (lm.spec, prep)
        return prep

    def _demand(
        self, key: str, lm: LocalModel, prep: Prepared, avoid: frozenset[str]
    ) -> ModelDemand:
        # The same demand object while nothing changed: the planner's
        # comparisons then stop at identity.
        memo = self._demands.get(key)
        if memo is not None and memo[0] is lm.spec and memo[1] == avoid:
            return memo[2]
        made = demand(lm, avoid, prep)
        self._demands[key] = (lm.spec, avoid, made)
        return made

    def _tune(
        self, key: str, lm: LocalModel, prep: Prepared, node: NodeFacts, replica: int, cpu: int
    ) -> Tuning:
        memo = self._tuned.get(key, {}).get(replica)
        if (
            memo is not None
            and memo.spec is lm.spec
            and memo.cpu == cpu
            and (memo.node is node or memo.node == node)
        ):
            return memo.tuning
        tuning = self._evaluations(lm.spec, node, cpu, prep.shape, prep.version, prep.key)
        self._tuned.setdefault(key, {})[replica] = _Tuned(lm.spec, node, cpu, tuning)
        return tuning

    def _result(
        self,
        key: str,
        lm: LocalModel,
        prep: Prepared,
        replicas: tuple[ReplicaPlan, ...],
        unplaced: tuple[Unplaced, ...],
        ready: Mapping[int, bool] | None,
        options: RenderOptions | None,
        now: str,
    ) -> ModelResult:
        memo = self._done.get(key)
        kept: ModelResult | None = None  # of the same model, replicas and options
        if (
            memo is not None
            and memo.model is lm
            and memo.replicas == replicas
            and memo.options == options
        ):
            if (
                memo.unplaced == unplaced
                and memo.ready == ready
                and (memo.now == now or not memo.took_now)
            ):
                return memo.result
            kept = memo.result
        if kept is not None:
            hashes, applied = kept.pod_hashes, kept.applied_hashes
        elif prep.problems:
            hashes, applied = {}, {}
        else:
            opts = options or RenderOptions()
            hashes = {
                r.replica: pod_digest(lm, r, self._parts.containers(lm, r, opts, prep.key))
                for r in replicas
            }
            applied = self._applied(lm, replicas, prep.key)
        status = _status(lm, prep.problems, replicas, unplaced, ready, now, self._views)
        result = ModelResult(
            lm, prep.problems, replicas, unplaced, status, options, hashes, applied
        )
        if kept is not None:
            result.reusing(kept)
        self._done[key] = _Done(
            lm, replicas, unplaced, ready, options, now, result, took_now(lm, status)
        )
        return result
