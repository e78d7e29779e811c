"""`desired_state` that keeps its work between passes (`Desired`: the operator's).

An optimisation of the plain path (`localmodel.desired.desired_state`, the
specification): the same steps, prepare -> plan -> rules -> render -> status,
each reused while what it read is the same (`Roster`: the model list and its
preparations; `planner.Planner`: the plan; `Rereads`: which models' reads
changed), and shared by value between alike models and nodes within a pass
(`Evaluations`, `PodParts`, `AppliedDigests`). Property tests hold the two
equal over random sequences of changes (tests/controller/test_incremental_desired.py,
test_pass_memo.py).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Collection, Iterable, Mapping, Sequence
from itertools import repeat
from operator import is_
from typing import NamedTuple, cast

from localmodel.api import DecisionStatus, LocalModel, LocalModelSpec
from localmodel.desired import (
    ClaimChooser,
    DesiredState,
    ModelResult,
    failed_result,
    failure_text,
    model_status,
    tuning_view,
)
from localmodel.facts import NodeFacts
from localmodel.idle.decide import NO_IDLE, IdleInputs
from localmodel.incremental.applied_digests import AppliedDigests
from localmodel.incremental.evaluations import Evaluations
from localmodel.incremental.pod_parts import PodParts, pod_digest
from localmodel.incremental.rereads import PassInputs, Rereads
from localmodel.incremental.roster import PreparedSpec, Roster
from localmodel.planner import Cpus, Planner, Unplaced, Usage
from localmodel.render import RenderOptions, ReplicaPlan
from localmodel.rules.model import Tuning
from localmodel.status import took_now


class _Tuned(NamedTuple):
    """One replica's spec, node, CPUs and tuning (a tuple: made per replica, cheaply)."""

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
    released: bool  # asleep and released (`IdleInputs.released`)


# id(tuning) -> (the tuning, held; its settings and decisions as status shows them)
_TuningViews = dict[int, tuple[Tuning, dict[str, str], list[DecisionStatus]]]


class Desired:
    """Keeps each model's result between passes, keyed on the LocalModel object,
    its placements, its readiness, the options and (for a status that took it)
    the clock; and each replica's tuning, keyed on its spec, node and CPUs.

    `desired_state` that costs what changed: each model goes one straight way,
    its spec prepared once (`Roster`), placed by a long-lived `Planner`, each
    replica tuned, then rendered, then its status, and each step's result is
    reused while what it read is the same: a LocalModel (or spec) is the same
    when it is the same object (they are frozen; the operator parses each
    stored version once), node facts when equal. A status is reused at a
    later `now` only when it did not take the clock (`took_now`). The result
    is always what a fresh pass computes: held equal to
    `desired.desired_state` by tests/controller/test_incremental_desired.py
    (random sequences of changes) and test_pass_memo.py (alike models)."""

    def __init__(self) -> None:
        self.planner = Planner()
        self._roster = Roster()
        self._reads = Rereads()
        self._tuned: dict[str, dict[int, _Tuned]] = {}
        self._done: dict[str, _Done] = {}
        self._complete = True  # the last call returned
        self._released: frozenset[str] = frozenset()  # this pass's (`IdleInputs.released`)
        self._new_pass()

    def _new_pass(self) -> None:
        """This pass's memos, by value: specs and nodes that read the same share
        their tunings, pod parts and digests (a model's own work is kept per model)."""
        self._evaluations = Evaluations()
        self._parts, self._applied = PodParts(), AppliedDigests()
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
        idle: IdleInputs = NO_IDLE,
    ) -> DesiredState:
        """What `desired_state` returns for the same arguments. `claims_again`:
        the models for which `claims` may choose otherwise than the last call's
        `claims` did (None: any; each model is then asked again)."""
        self._new_pass()
        roster = self._roster
        if not self._complete:  # the last call raised (a model listed twice): start over
            roster.forget_list()
        self._complete = False
        # None: every model
        again = roster.sync(tuple(models), avoid or {}, self._evaluations, idle)
        self._released = idle.released
        self._forget(again is None)
        the_plan = self.planner.plan(roster.now_demands, nodes, current or {}, usage or {})
        plan_same, touched, again = self._reads.planned(the_plan, self.planner.touched, again)
        now_pass = PassInputs(the_plan, plan_same, touched, ready, options, now, claims,
                              claims_again)
        again = self._reads.again(again, now_pass)
        keys, results = roster.keys, roster.results
        if again is None:
            positions: Iterable[int] = range(len(keys))
        else:
            positions = sorted(bisect_left(keys, k) for k in again if k in roster.model)
        for i in positions:
            results[i] = self._model_result(keys[i], now_pass, results[i] is not None)
        out = tuple(results)
        assert not any(map(is_, out, repeat(None)))  # (`None in out` calls each result's __eq__)
        self._complete = True
        # This pass's memos go now: freeing a big pass's (every model worked
        # out) is that pass's cost, not the next one's (measured: several ms
        # at 5 000 models, in the first small pass after it).
        self._new_pass()
        return DesiredState(cast(tuple[ModelResult, ...], out), the_plan,
                            tuple(roster.now_demands))

    def _forget(self, relisted: bool) -> None:
        """Drop what was kept of the models no longer listed (``relisted``:
        the roster was made again from the whole list)."""
        listed = self._roster.model
        gone = (
            {k for k in (*self._done, *self._tuned, *self._reads.took_now, *self._reads.failed)
             if k not in listed}
            if relisted else set(self._roster.gone)
        )
        for key in gone:
            self._done.pop(key, None)
            self._tuned.pop(key, None)
        self._reads.forget(gone)

    def _model_result(self, key: str, now: PassInputs, had: bool) -> ModelResult:
        """One model's result in this pass: the kept one while what it read
        holds (``had``: the model has a result in the list), else worked out."""
        lm = self._roster.model[key]
        seen = None if now.ready is None else now.ready.get(key, {})
        done = self._done.get(key)
        claims = now.claims
        if (
            had
            and (now.plan_same or (now.touched is not None and key not in now.touched))
            and done is not None
            and done.model is lm
            and done.released == (key in self._released)
            and done.options == now.options
            and done.ready == seen
            and (done.now == now.now or not done.took_now)
            and all(
                (claims(lm, r.replica, r.node) if claims else "") == r.claim
                for r in done.replicas
            )
        ):
            return done.result
        prep = self._roster.now_prepared[key]
        if prep.prepared.failure:
            return failed_result(lm, prep.prepared.failure, now.now)
        try:
            result = self._worked_out(key, lm, prep, now, seen)
        except Exception as exc:  # one model's failure is that model's (not kept)
            self._done.pop(key, None)
            self._reads.took_now.discard(key)
            self._reads.failed.add(key)
            return failed_result(lm, failure_text("tuning, render or status", exc), now.now)
        self._reads.failed.discard(key)
        return result

    def _worked_out(
        self,
        key: str,
        lm: LocalModel,
        prep: PreparedSpec,
        now: PassInputs,
        seen: Mapping[int, bool] | None,
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
        took = self._reads.took_now
        (took.add if self._done[key].took_now else took.discard)(key)
        return result

    def _tune(
        self, key: str, lm: LocalModel, prep: PreparedSpec, node: NodeFacts, replica: int, cpu: Cpus
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
        prep: PreparedSpec,
        replicas: tuple[ReplicaPlan, ...],
        unplaced: tuple[Unplaced, ...],
        ready: Mapping[int, bool] | None,
        options: RenderOptions | None,
        now: str,
    ) -> ModelResult:
        memo = self._done.get(key)
        kept: ModelResult | None = None  # of the same model, replicas and options
        released = key in self._released and not prep.prepared.problems
        if (
            memo is not None
            and memo.model is lm
            and memo.released == released
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
        result = ModelResult(lm, problems, replicas, unplaced, status, options, hashes, applied,
                             released=released)
        if kept is not None:
            result.reusing(kept)
        self._done[key] = _Done(
            lm, replicas, unplaced, ready, options, now, result, took_now(lm, status), released
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
