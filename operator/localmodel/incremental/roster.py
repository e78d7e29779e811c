"""The model list a pass is given, kept between passes with what each spec
alone decides (`Roster`): the validation step's work, and the planner's input."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping
from functools import partial
from typing import NamedTuple

from localmodel.api import LocalModel, LocalModelSpec
from localmodel.desired import ModelResult, Prepared, idle_demand, prepared
from localmodel.idle.decide import NO_IDLE, IdleInputs
from localmodel.incremental.evaluations import Evaluations
from localmodel.incremental.keys import spec_key
from localmodel.planner import ModelDemand


class PreparedSpec(NamedTuple):
    """A model's spec, what it alone decides (`Prepared`) and its `spec_key`
    (the key of a pass's memos)."""

    spec: LocalModelSpec
    prepared: Prepared
    key: str


_IdlePart = tuple[bool, tuple[str | None, ...], frozenset[str]]  # `IdleInputs.demand_of`


class Roster:
    """Keeps the model list sorted by key, each spec's preparation (keyed on the
    spec object, shared within a pass by `spec_key`) and each valid model's
    planner demand (keyed on the spec object, its avoided nodes and what the
    idle decisions say of it: `IdleInputs.demand_of`).

    Saves the validation step (`desired.prepare`) and the demands' making for
    every model whose spec object is the last pass's: a new list is compared
    object by object and only what changed is worked out again. Held equal to
    the plain path by tests/controller/test_incremental_desired.py (through `Desired`)."""

    def __init__(self) -> None:
        self.keys: list[str] = []  # sorted
        self.model: dict[str, LocalModel] = {}
        self.results: list[ModelResult | None] = []  # the pass's, in the order of keys
        self.now_prepared: dict[str, PreparedSpec] = {}
        self.now_demands: list[ModelDemand] = []  # of the valid models, in key order
        self.gone: list[str] = []  # the models the last `sync` dropped
        self._demand_keys: list[str] = []  # sorted, the valid models'
        self._listed: tuple[LocalModel, ...] | None = None
        self._avoid: dict[str, frozenset[str]] = {}
        self._idle = NO_IDLE
        self._by_id: dict[int, str] = {}  # id(LocalModel) -> key (the models are held)
        self._prepared: dict[str, PreparedSpec] = {}
        self._demands: dict[str, tuple[LocalModelSpec, frozenset[str], _IdlePart,
                                       ModelDemand]] = {}
        # For one `sync`: the rules memo preparations read, and preparations by spec_key.
        self._evaluations = Evaluations()
        self._prepared_by_key: dict[str, Prepared] = {}

    def forget_list(self) -> None:
        """Compare the next list with nothing (the last call did not finish)."""
        self._listed = None

    def sync(
        self,
        listed: tuple[LocalModel, ...],
        avoid: Mapping[str, frozenset[str]],
        evaluations: Evaluations,
        idle: IdleInputs = NO_IDLE,
    ) -> set[str] | None:
        """Bring the sorted model list, preparations and demands up to this
        list; the keys of the models that changed (None: all of them; then
        `gone` is empty and the models not listed are gone)."""
        self._evaluations, self._prepared_by_key, self.gone = evaluations, {}, []
        try:
            return self._sync(listed, avoid, idle)
        finally:
            self._evaluations, self._prepared_by_key = Evaluations(), {}

    def _sync(
        self, listed: tuple[LocalModel, ...], avoid: Mapping[str, frozenset[str]],
        idle: IdleInputs,
    ) -> set[str] | None:
        same_idle = idle is self._idle or idle == self._idle
        if listed == self._listed and avoid == self._avoid and same_idle:
            return set()
        old_ids = self._by_id
        new_ids = {id(lm): lm for lm in listed}
        if self._listed is None or len(new_ids) != len(listed):
            self._sync_all(listed, avoid, idle)
            return None
        gone = {key for i, key in old_ids.items() if i not in new_ids}
        came = [lm for i, lm in new_ids.items() if i not in old_ids]
        changed: set[str] = set()
        for lm in came:
            key = lm.key
            if (key in self.model and key not in gone) or key in changed:
                self._sync_all(listed, avoid, idle)  # listed twice: the planner says so
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
        if not same_idle:
            was = self._idle
            changed |= {k for k in (*idle.released, *was.released, *idle.prefer, *was.prefer,
                                    *idle.avoid, *was.avoid)
                        if idle.demand_of(k) != was.demand_of(k)}
        for key in changed:
            self._set_demand(key, avoid.get(key, frozenset()), idle)
        self._listed, self._avoid, self._idle = listed, dict(avoid), idle
        return changed

    def _arrive(self, key: str, lm: LocalModel) -> None:
        """A model new to the list, or a new version of one."""
        old = self.model.get(key)
        if old is not None:
            del self._by_id[id(old)]
        else:
            i = bisect_left(self.keys, key)
            self.keys.insert(i, key)
            self.results.insert(i, None)
        self.model[key] = lm
        self._by_id[id(lm)] = key
        self.now_prepared[key] = self._prepare(key, lm)

    def _sync_all(
        self, listed: tuple[LocalModel, ...], avoid: Mapping[str, frozenset[str]],
        idle: IdleInputs,
    ) -> None:
        self._listed, self._avoid, self._idle = listed, dict(avoid), idle
        keyed = sorted(((lm.key, lm) for lm in listed), key=lambda kl: kl[0])
        self.keys = [key for key, _ in keyed]
        self.model = dict(keyed)
        self._by_id = {id(lm): key for key, lm in keyed}
        self.results = [None] * len(keyed)
        self.now_prepared = {key: self._prepare(key, lm) for key, lm in keyed}
        self._demand_keys, self.now_demands = [], []
        for key, lm in keyed:
            prep = self.now_prepared[key]
            if not (prep.prepared.problems or prep.prepared.failure):
                self._demand_keys.append(key)
                self.now_demands.append(
                    self._demand(key, lm, prep.prepared, avoid.get(key, frozenset()), idle)
                )
        for kept in (self._prepared, self._demands):
            for gone in [k for k in kept if k not in self.model]:
                del kept[gone]

    def _drop(self, key: str) -> None:
        i = bisect_left(self.keys, key)
        del self.keys[i], self.results[i]
        lm = self.model.pop(key)
        del self._by_id[id(lm)], self.now_prepared[key]
        j = bisect_left(self._demand_keys, key)
        if j < len(self._demand_keys) and self._demand_keys[j] == key:
            del self._demand_keys[j], self.now_demands[j]
        self._prepared.pop(key, None)
        self._demands.pop(key, None)
        self.gone.append(key)

    def _set_demand(self, key: str, avoid: frozenset[str], idle: IdleInputs) -> None:
        """The key's place in the demand list, after its model or avoided nodes changed."""
        j = bisect_left(self._demand_keys, key)
        there = j < len(self._demand_keys) and self._demand_keys[j] == key
        lm = self.model.get(key)
        prep = None if lm is None else self.now_prepared[key].prepared
        if prep is None or prep.problems or prep.failure:
            if there:
                del self._demand_keys[j], self.now_demands[j]
            return
        assert lm is not None
        made = self._demand(key, lm, prep, avoid, idle)
        if there:
            self.now_demands[j] = made
        else:
            self._demand_keys.insert(j, key)
            self.now_demands.insert(j, made)

    def _prepare(self, key: str, lm: LocalModel) -> PreparedSpec:
        memo = self._prepared.get(key)
        if memo is not None and memo.spec is lm.spec:
            return memo
        value = spec_key(lm.spec)
        prep = self._prepared_by_key.get(value)
        if prep is None:
            prep = prepared(lm.spec, partial(self._evaluations, key=value))
            if prep.failure:  # that model's alone: an alike one prepares its own
                return PreparedSpec(lm.spec, prep, value)
            self._prepared_by_key[value] = prep
        made = self._prepared[key] = PreparedSpec(lm.spec, prep, value)
        return made

    def _demand(
        self, key: str, lm: LocalModel, prep: Prepared, avoid: frozenset[str], idle: IdleInputs
    ) -> ModelDemand:
        # The same demand object while nothing changed: the planner's
        # comparisons then stop at identity.
        memo = self._demands.get(key)
        part = idle.demand_of(key)
        if memo is not None and memo[0] is lm.spec and memo[1] == avoid and memo[2] == part:
            return memo[3]
        made = idle_demand(lm, avoid, prep, idle)
        self._demands[key] = (lm.spec, avoid, part, made)
        return made
