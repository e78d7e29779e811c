"""`desired_state` that keeps its work between passes (`Desired`: the operator's).

An optimisation of the plain path (`localmodel.desired.desired_state`, the
specification): the same steps, prepare -> plan -> rules -> render -> status,
each reused while what it read is the same, and shared by value between alike
models and nodes within a pass (`Evaluations`, `render.PodParts`,
`render.AppliedDigests`). Property tests hold the two equal over random
sequences of changes (tests/unit/test_incremental_desired.py, test_pass_memo.py).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Collection, Iterable, Mapping, Sequence
from functools import partial
from itertools import repeat
from operator import is_
from typing import NamedTuple, cast

from localmodel.api import DecisionStatus, LocalModel, LocalModelSpec
from localmodel.desired import (
    ClaimChooser,
    DesiredState,
    ModelResult,
    Prepared,
    demand,
    failed_result,
    failure_text,
    model_status,
    prepared,
    tuning_view,
)
from localmodel.facts import NodeFacts
from localmodel.incremental.evaluations import Evaluations
from localmodel.planner import Cpus, ModelDemand, Plan, Planner, Unplaced, Usage
from localmodel.render import AppliedDigests, PodParts, RenderOptions, ReplicaPlan, pod_digest
from localmodel.rules.evaluate import spec_key
from localmodel.rules.model import Tuning
from localmodel.status import took_now


class _Spec(NamedTuple):
    """A model's spec, what it alone decides (`Prepared`) and its `spec_key`
    (the key of a pass's memos)."""

    spec: LocalModelSpec
    prepared: Prepared
    key: str


class _Tuned(NamedTuple):  # (a tuple: made per replica, cheaply)
    spec: LocalModelSpec
    node: NodeFacts
    cpu: Cpus
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


class _Pass(NamedTuple):
    """One call's inputs, as the models' steps read them."""

    plan: Plan
    # Whether a kept result still holds for the plan: the same plan, or a
    # model the planner did not touch (None: it may have touched any).
    plan_same: bool
    touched: frozenset[str] | None
    ready: Mapping[str, Mapping[int, bool]] | None
    options: RenderOptions | None
    now: str
    claims: ClaimChooser | None
    claims_again: Collection[str] | None  # the models `claims` may answer differently


# id(tuning) -> (the tuning, held; its settings and decisions as status shows them)
_TuningViews = dict[int, tuple[Tuning, dict[str, str], list[DecisionStatus]]]


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
        self._prepared: dict[str, _Spec] = {}
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
        self._now_prepared: dict[str, _Spec] = {}
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
        self._failed: set[str] = set()  # models whose last result failed: computed again
        self._claims = False
        self._complete = True  # the last call returned
        self._plan: Plan | None = None
        self._evaluations = Evaluations()
        self._prepared_by_key: dict[str, Prepared] = {}
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
        claims_again: Collection[str] | None = None,
    ) -> DesiredState:
        """What `desired_state` returns for the same arguments. `claims_again`:
        the models for which `claims` may choose otherwise than the last call's
        `claims` did (None: any; each model is then asked again)."""
        # By value, for this pass: specs and nodes that read the same share
        # their preparation and tunings (what a model keeps is kept per model).
        self._evaluations, self._prepared_by_key = Evaluations(), {}
        self._parts, self._applied, self._views = PodParts(), AppliedDigests(), {}
        if not self._complete:  # the last call raised (a model listed twice): start over
            self._listed = None
        self._complete = False
        again = self._sync(tuple(models), avoid or {})  # None: every model
        the_plan = self.planner.plan(self._now_demands, nodes, current or {}, usage or {})
        plan_same, touched, again = self._planned(the_plan, again)
        now_pass = _Pass(the_plan, plan_same, touched, ready, options, now, claims, claims_again)
        again = self._read_again(again, now_pass)
        if again is not None:
            again |= self._failed
        keys, results = self._keys, self._results
        if again is None:
            positions: Iterable[int] = range(len(keys))
        else:
            positions = sorted(bisect_left(keys, k) for k in again if k in self._model)
        for i in positions:
            results[i] = self._model_result(keys[i], now_pass, results[i] is not None)
        out = tuple(results)
        assert not any(map(is_, out, repeat(None)))  # (`None in out` calls each result's __eq__)
        self._complete = True
        # This pass's memos go now: freeing a big pass's (every model worked
        # out) is that pass's cost, not the next one's (measured: several ms
        # at 5 000 models, in the first small pass after it).
        self._evaluations, self._prepared_by_key = Evaluations(), {}
        self._parts, self._applied, self._views = PodParts(), AppliedDigests(), {}
        return DesiredState(cast(tuple[ModelResult, ...], out), the_plan)

    def _planned(
        self, the_plan: Plan, again: set[str] | None
    ) -> tuple[bool, frozenset[str] | None, set[str] | None]:
        """Whether the plan is the last one, the models the planner touched, and
        the models to look at again. The planner hands back the same plan only
        when no node's facts changed, and names the models a new plan may place
        or explain differently (the nodes of the others were not re-kept: their
        facts are the same too)."""
        plan_same = the_plan is self._plan
        touched = self.planner.touched if self._plan is not None else None
        if not plan_same:
            if touched is None:
                again = None
            elif again is not None:
                again |= touched
        self._plan = the_plan
        return plan_same, touched, again

    def _read_again(self, again: set[str] | None, now: _Pass) -> set[str] | None:
        """The models whose results read what changed since the last pass: the
        options, whether claims are chosen, readiness, the clock."""
        if now.options != self._options or ((bool(now.claims) or self._claims) and not (
                now.claims and self._claims and now.claims_again is not None)):
            again = None  # (claims: a function, asked again for every replica)
        elif now.claims and again is not None:
            again |= set(now.claims_again or ())
        self._options, self._claims = now.options, now.claims is not None
        ready = now.ready
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
        if now.now != self._now:
            if again is not None:
                again |= self._took_now
            self._now = now.now
        return again

    def _model_result(self, key: str, now: _Pass, had: bool) -> ModelResult:
        """One model's result in this pass: the kept one while what it read
        holds (``had``: the model has a result in the list), else worked out."""
        lm = self._model[key]
        seen = None if now.ready is None else now.ready.get(key, {})
        done = self._done.get(key)
        claims = now.claims
        if (
            had
            and (now.plan_same or (now.touched is not None and key not in now.touched))
            and done is not None
            and done.model is lm
            and done.options == now.options
            and done.ready == seen
            and (done.now == now.now or not done.took_now)
            and all(
                (claims(lm, r.replica, r.node) if claims else "") == r.claim
                for r in done.replicas
            )
        ):
            return done.result
        prep = self._now_prepared[key]
        if prep.prepared.failure:
            return failed_result(lm, prep.prepared.failure, now.now)
        try:
            result = self._worked_out(key, lm, prep, now, seen)
        except Exception as exc:  # one model's failure is that model's (not kept)
            self._done.pop(key, None)
            self._took_now.discard(key)
            self._failed.add(key)
            return failed_result(lm, failure_text("tuning, render or status", exc), now.now)
        self._failed.discard(key)
        return result

    def _worked_out(
        self, key: str, lm: LocalModel, prep: _Spec, now: _Pass, seen: Mapping[int, bool] | None
    ) -> ModelResult:
        claims = now.claims
        replicas: tuple[ReplicaPlan, ...] = ()
        unplaced: tuple[Unplaced, ...] = ()
        if not prep.prepared.problems:
            by_node = self.planner.nodes_by_name
            replicas = tuple(
                ReplicaPlan(
                    p.replica,
                    p.node,
                    self._tune(key, lm, prep, by_node[p.node], p.replica, p.cpu),
                    p.reason,
                    claims(lm, p.replica, p.node) if claims else "",
                )
                for p in now.plan.placements_for(key)
            )
            unplaced = now.plan.unplaced_for(key)
        result = self._result(key, lm, prep, replicas, unplaced, seen, now.options, now.now)
        (self._took_now.add if self._done[key].took_now else self._took_now.discard)(key)
        return result

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
            self._arrive(key, lm)
        if avoid != self._avoid:
            changed |= {
                k for k in avoid.keys() | self._avoid.keys() if avoid.get(k) != self._avoid.get(k)
            }
        for key in changed:
            self._set_demand(key, avoid.get(key, frozenset()))
        self._listed, self._avoid = listed, dict(avoid)
        return changed

    def _arrive(self, key: str, lm: LocalModel) -> None:
        """A model new to the list, or a new version of one."""
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
            if not (prep.prepared.problems or prep.prepared.failure):
                self._demand_keys.append(key)
                self._now_demands.append(
                    self._demand(key, lm, prep.prepared, avoid.get(key, frozenset()))
                )
        keys = set(self._now_prepared)
        for kept in (self._prepared, self._demands, self._done, self._tuned):
            for gone in [k for k in kept if k not in keys]:
                del kept[gone]
        self._took_now &= keys
        self._failed &= keys

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
        self._failed.discard(key)

    def _set_demand(self, key: str, avoid: frozenset[str]) -> None:
        """The key's place in the demand list, after its model or avoided nodes changed."""
        j = bisect_left(self._demand_keys, key)
        there = j < len(self._demand_keys) and self._demand_keys[j] == key
        lm = self._model.get(key)
        prep = None if lm is None else self._now_prepared[key].prepared
        if prep is None or prep.problems or prep.failure:
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

    def _prepare(self, key: str, lm: LocalModel) -> _Spec:
        memo = self._prepared.get(key)
        if memo is not None and memo.spec is lm.spec:
            return memo
        value = spec_key(lm.spec)
        prep = self._prepared_by_key.get(value)
        if prep is None:
            prep = prepared(lm.spec, partial(self._evaluations, key=value))
            if prep.failure:  # that model's alone: an alike one prepares its own
                return _Spec(lm.spec, prep, value)
            self._prepared_by_key[value] = prep
        made = self._prepared[key] = _Spec(lm.spec, prep, value)
        return made

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
        self, key: str, lm: LocalModel, prep: _Spec, node: NodeFacts, replica: int, cpu: Cpus
    ) -> Tuning:
        memo = self._tuned.get(key, {}).get(replica)
        if (
            memo is not None
            and memo.spec is lm.spec
            and memo.cpu == cpu
            and (memo.node is node or memo.node == node)
        ):
            return memo.tuning
        shape, version = prep.prepared.shape, prep.prepared.version
        tuning = self._evaluations(lm.spec, node, cpu, shape, version, prep.key)
        self._tuned.setdefault(key, {})[replica] = _Tuned(lm.spec, node, cpu, tuning)
        return tuning

    def _result(
        self,
        key: str,
        lm: LocalModel,
        prep: _Spec,
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
        problems = prep.prepared.problems
        if kept is not None:
            hashes, applied = kept.pod_hashes, kept.applied_hashes
        elif problems:
            hashes, applied = {}, {}
        else:
            opts = options or RenderOptions()
            hashes = {
                r.replica: pod_digest(lm, r, self._parts.containers(lm, r, opts, prep.key), opts)
                for r in replicas
            }
            applied = self._applied(lm, replicas, prep.key, opts)
        status = model_status(lm, problems, replicas, unplaced, ready, now, self._view)
        result = ModelResult(lm, problems, replicas, unplaced, status, options, hashes, applied)
        if kept is not None:
            result.reusing(kept)
        self._done[key] = _Done(
            lm, replicas, unplaced, ready, options, now, result, took_now(lm, status)
        )
        return result

    def _view(self, t: Tuning) -> tuple[dict[str, str], list[DecisionStatus]]:
        """`tuning_view`, once per tuning in a pass (status copies both, so one
        pass's replicas of one tuning share them)."""
        found = self._views.get(id(t))
        if found is not None and found[0] is t:
            return found[1], found[2]
        settings, decisions = tuning_view(t)
        self._views[id(t)] = (t, settings, decisions)
        return settings, decisions
