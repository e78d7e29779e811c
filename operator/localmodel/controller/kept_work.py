"""Each model's share of a pass, kept between passes while what it read holds. Pure.

`policy.plan_pass` works out, per valid model, its changes (`changes.py`), its
status (progress and speed added) and the replicas whose speed can be read.
That reads the model's result (from `incremental.Desired`, which hands back
the same object while the model's inputs hold), the model as stored, what the
watches show of its own objects (pods, claims, ConfigMaps, Services,
NetworkPolicies, by label, by owner and by the names the result gives them),
the nodes its pods and replicas are on, its published speeds and the clock.
`KeptWork` keeps what was worked out with all of that, and gives it back while
every piece is the same: the same objects (all frozen; `observe` hands back
the same ones for objects that did not change), or equal values. The clock
counts only when the status took it (`status.took_now`: a condition moved).

So a pass after one event works out again only the models that event touched,
and a quiet pass (the same `Observed`, the same results) none. While only the
models and nodes sections changed (a label, a status written), a pass does not
even go over the models: it copies the last pass's shares (`Shares`) and
looks only at the models `KeptWork.shares_again` names, found by name: those
whose result or stored object changed, whose kept share read a node that
changed (`by_node`), whose status took a clock that moved, whose speeds
changed; the plan names the work that is not the last plan's
(`PassPlan.since`) for the reconciler.
tests/unit/test_pass_incremental.py holds a pass with a long-lived `KeptWork`
equal to one without, over random sequences of events.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import compress
from operator import is_not
from typing import Any, cast

from localmodel.api import LocalModel
from localmodel.controller.changes import choose_claim, model_changes
from localmodel.controller.gaps import gap_of
from localmodel.controller.objects import ModelObject
from localmodel.controller.observed import Observed, changed_keys
from localmodel.controller.pass_work import (
    ByNode,
    ModelWork,
    PassPlan,
    index_node,
    rfc3339,
    speed_targets,
    took_clock,
    unindex_node,
)
from localmodel.controller.speed import SpeedTarget
from localmodel.desired import ModelResult
from localmodel.facts import NodeFacts
from localmodel.gaps import with_gap
from localmodel.render import replica_claim
from localmodel.speed import Published, SpeedPolicy
from localmodel.status import took_now, with_progress, with_speed
from localmodel.tenancy import Refusal, SecretLabels, TenantPolicy, refusals


def model_work(result: ModelResult, mo: ModelObject, obs: Observed, now: str,
                published: Mapping[int, Published], policy: SpeedPolicy, own_image: str,
                pull_secrets: Sequence[str] = ()) -> tuple[ModelWork, list[SpeedTarget]]:
    """One valid model's changes and status (progress, the cluster's gaps and
    speed added), and its replicas to read."""
    changes = model_changes(result, mo.uid, obs)
    status = with_progress(result.status, changes.rolling, result.model, now)
    status = with_gap(status, gap_of(result.model, mo.uid, obs, pull_secrets),
                      result.model, now)  # the cluster's own gaps, said up front
    status = with_speed(status, {replica: (p, rfc3339(p.measured_at))
                                 for replica, p in published.items()},
                        policy, result.model, now)
    if status == mo.status:  # settled: the stored status itself, not a second copy of it
        status = mo.status
    return ModelWork(mo, changes, status), speed_targets(result, obs, own_image)


Worked = tuple[ModelWork, list[SpeedTarget]]  # a model's share, its replicas to read
Admitted = tuple[list[LocalModel], list[ModelWork]]  # `policy.admitted`: admitted, refused
Current = Mapping[str, Sequence[str | None]]  # model -> replica's node (None: not placed)
Chooser = Callable[[LocalModel, int, str], str]  # `changes.choose_claim` of one Observed


class _Kept:
    """One model's share and what it was worked out from."""

    __slots__ = (
        "images",
        "nodes",
        "now",
        "policy",
        "published",
        "reads",
        "result",
        "took_now",
        "worked",
    )

    def __init__(self, result: ModelResult, published: Mapping[int, Published],
                 policy: SpeedPolicy, images: tuple[str, tuple[str, ...]], now: str, took_now: bool,
                 reads: tuple[Any, ...], worked: Worked, nodes: frozenset[str]) -> None:
        self.result, self.published, self.policy = result, published, policy
        self.images, self.now, self.took_now = images, now, took_now
        self.reads = reads  # what it read of the `Observed`, part by part (`_READS`)
        self.worked = worked
        self.nodes = nodes  # the nodes of its pods and replicas (the last part it read)


def _nodes(result: ModelResult, obs: Observed) -> tuple[NodeFacts | None, ...]:
    pods = obs.pods_of(result.model.key)
    return (*(obs.nodes.get(p.node or "") for p in pods),
            *(obs.nodes.get(r.node) for r in result.replicas))


# What one model's changes, status and speed targets read of an `Observed`, part
# by part, each with the sections of the `Observed` it depends on: a part whose
# sections are the very objects of the last check is not read again.
_READS: tuple[tuple[tuple[str, ...], Callable[[ModelResult, str, Observed], Any]], ...] = (
    (("models",), lambda r, uid, obs: obs.models.get(r.model.key)),
    (("pods",), lambda r, uid, obs: obs.pods_of(r.model.key)),
    (("claims",), lambda r, uid, obs: (
        obs.claims_of(r.model.key),
        tuple(obs.claims.get((r.model.metadata.namespace, replica_claim(r.model, p)))
              for p in r.replicas))),
    (("objects",), lambda r, uid, obs: (
        tuple(obs.objects.get((kind, r.model.metadata.namespace, name))
              for kind, name in r.applied_hashes),
        obs.objects_owned(r.model.metadata.namespace, uid))),
    (("pods", "nodes"), lambda r, uid, obs: _nodes(r, obs)),
    (("storage_classes",), lambda r, uid, obs: obs.storage_classes),  # its gap (gaps.py)
)


def reads(result: ModelResult, uid: str, obs: Observed) -> tuple[Any, ...]:
    """Everything of `obs` one model's share reads: its pods and claims (by
    label), the claims and applied objects named by its result, the objects it
    owns, and the nodes of its pods and replicas."""
    return tuple(read(result, uid, obs) for _, read in _READS)


# The sections of an `Observed` the kept work reads; `observe` hands back the
# same object for a section none of whose objects changed.
SECTIONS = ("models", "nodes", "pods", "claims", "objects", "volumes", "storage_classes")
# The sections whose changes a pass finds the models of by name (`KeptWork.begin`:
# the models changed, the nodes changed and the models that read them): while
# only these changed, a pass looks only at those models (`KeptWork.shares`).
BY_NAME = frozenset(("models", "nodes"))
Images = tuple[str, tuple[str, ...]]  # the operator's image, the pull secrets


@dataclass
class Shares:
    """Each valid model's share of a pass, in the order of the pass's results
    (`policy.plan_pass`), where it puts each model's replicas, and what all of
    it was worked out with. The next pass copies the lists and works out again
    only the positions `KeptWork.shares` names."""

    results: tuple[ModelResult, ...]
    at: dict[str, int]  # model -> its position
    work: list[ModelWork | None]  # (None: not worked out yet)
    targets: list[Sequence[SpeedTarget]]
    placed: dict[str, dict[int, str]]
    unkept: set[int]  # positions whose share is not kept (invalid, failed): every pass
    now: str
    speeds: Mapping[str, Mapping[int, Published]]
    policy: SpeedPolicy
    images: Images


@dataclass
class KeptWork:
    """Keeps each model's share of the last passes (the admin policy's verdict,
    the claims chosen, the changes and status), keyed on what that share read
    (held equal to a fresh pass by tests/unit/test_pass_incremental.py)."""

    by_model: dict[str, _Kept] = field(default_factory=dict)
    passes: int = 0  # `begin` counts them
    # The last pass that ended (`remember`): every kept share held in it.
    held_at: int = -1
    by_node: ByNode = field(default_factory=dict)  # node -> models whose share read it
    took: set[str] = field(default_factory=set)  # models whose kept share took the clock
    # The models whose stored object is not the last pass's (None: not known,
    # or models came or went).
    models_changed: frozenset[str] | None = None
    shares: Shares | None = None  # the last pass's
    serial: int = 0  # the last plan's number (`PassPlan.serial`)
    obs: Observed | None = None  # the last pass's
    changed: frozenset[str] = frozenset(SECTIONS)  # sections this pass's `obs` changed
    to_read: tuple[tuple[int, Callable[[ModelResult, str, Observed], Any]], ...] = ()
    # The nodes whose facts are not the last pass's (None: not known, or the
    # pods changed too: the part that reads nodes is read again instead).
    nodes_changed: frozenset[str] | None = None
    claims_again: set[str] | None = None  # models whose claims may be chosen otherwise
    refused: dict[str, tuple[LocalModel, TenantPolicy, dict[Any, Any], Any]] = field(
        default_factory=dict)
    chosen: dict[tuple[str, int, str], tuple[Any, ...]] = field(default_factory=dict)
    placements: dict[str, tuple[ModelResult, dict[int, str]]] = field(default_factory=dict)
    # The last `current`: its placements, the last placements it filled in from,
    # its answer, and the pass.
    memory: tuple[Any, dict[str, Any], Current, int] | None = None
    # The last `admitted`: the models section, policy, Secrets' labels, those
    # admitted, those refused, and each admitted model's position.
    admits: tuple[Any, Any, dict[Any, Any], list[LocalModel], tuple[LocalModel, ...],
                  dict[str, int]] | None = None
    admits_before: bool = False  # whether `admits` was of the last pass's models
    unparsed: tuple[dict[str, ModelObject], list[ModelObject]] | None = None  # (`invalid`)
    # model -> (claim chosen for replica, node) keys, by node (`chooser`)
    chosen_on: ByNode = field(default_factory=dict)
    # The last pass: its inputs, its clock, whether a status took that clock, its plan.
    last: tuple[tuple[Any, ...], str, bool, PassPlan] | None = None

    def same_pass(self, inputs: tuple[Any, ...], now: str) -> PassPlan | None:
        """The last plan when `inputs` are the last pass's (each the same object,
        or equal) and no status of it took the clock, or the clock is the same."""
        if self.last is None:
            return None
        was, then, clocked, plan = self.last
        if (now == then or not clocked) and all(
                a is b or a == b for a, b in zip(was, inputs, strict=True)):
            return plan
        return None

    def remember(self, inputs: tuple[Any, ...], now: str, plan: PassPlan, shares: Shares,
                 unkept: Sequence[ModelWork]) -> PassPlan:
        """Keep `plan` for a pass with the same inputs (not one a model failed in:
        that model is worked out again), and its `shares` for the next pass.
        `unkept`: the work in `plan` that is no kept share's (the others' clock
        is `took`)."""
        self.shares, self.held_at, self.serial = shares, self.passes, plan.serial
        self.last = None
        if not any(w.failure for w in unkept):
            clocked = bool(self.took) or any(took_clock(w) for w in unkept)
            self.last = (inputs, now, clocked, plan)
        return plan

    def held(self, result: ModelResult, uid: str, obs: Observed, now: str,
             published: Mapping[int, Published], policy: SpeedPolicy,
             images: tuple[str, tuple[str, ...]],  # the operator's image, pull secrets
             ) -> Worked | None:
        """The model's kept share while all it read holds; else None (and it is
        forgotten: `keep` what is worked out instead)."""
        key = result.model.key
        kept = self.by_model.get(key)
        if (kept is not None and kept.result is result
                and (kept.policy is policy or kept.policy == policy)
                and (kept.images is images or kept.images == images)
                and (kept.now == now or not kept.took_now) and kept.published == published and (
                    # held in the last pass (all kept shares did): only what changed since is read
                    all(read(result, uid, obs) == kept.reads[i] for i, read in self.to_read)
                    and (self.nodes_changed is None or self.nodes_changed.isdisjoint(kept.nodes))
                    if self.held_at == self.passes - 1 else reads(result, uid, obs) == kept.reads)):
            return kept.worked
        self.forget(key)
        return None

    def keep(self, result: ModelResult, uid: str, obs: Observed, now: str,
             published: Mapping[int, Published], policy: SpeedPolicy,
             images: tuple[str, tuple[str, ...]], worked: Worked) -> None:
        """Keep the share `worked` out of `result` and what it read of `obs`."""
        key = result.model.key
        nodes = frozenset((*(p.node or "" for p in obs.pods_of(key)),
                           *(r.node for r in result.replicas)))
        self.forget(key)
        kept = self.by_model[key] = _Kept(result, published, policy, images, now,
                                          took_now(result.model, worked[0].status),
                                          reads(result, uid, obs), worked, nodes)
        for node in nodes:
            index_node(self.by_node, node, key)
        if kept.took_now:
            self.took.add(key)

    def forget(self, key: str) -> None:
        """Forget the model's kept share (and where the index finds it)."""
        kept = self.by_model.pop(key, None)
        if kept is None:
            return
        for node in kept.nodes:
            unindex_node(self.by_node, node, key)
        self.took.discard(key)

    def shares_again(self, results: tuple[ModelResult, ...], now: str,
                     speeds: Mapping[str, Mapping[int, Published]], policy: SpeedPolicy,
                     images: Images) -> tuple[Shares, Sequence[int], Shares | None]:
        """This pass's shares to fill in, the positions of `results` to work out
        (again), and the last pass's shares they are copied from (None: none,
        every position is to be worked out). Copied while the results are the
        same models in the same order and only sections found by name changed:
        then only the models whose result is another object, whose stored object
        changed, whose kept share read a node that changed (`by_node`) or took
        the clock that moved (`took`), whose speeds changed, and those not kept."""
        last = self.shares
        todo = None if last is None else self._again(last, results, now, speeds, policy, images)
        if last is None or todo is None:
            n = len(results)
            return Shares(results, {r.model.key: i for i, r in enumerate(results)}, [None] * n,
                          [()] * n, {}, set(), now, speeds, policy, images), range(n), None
        return Shares(results, last.at, list(last.work), list(last.targets), dict(last.placed),
                      set(last.unkept), now, speeds, policy, images), todo, last

    def _again(self, last: Shares, results: tuple[ModelResult, ...], now: str,
               speeds: Mapping[str, Mapping[int, Published]], policy: SpeedPolicy,
               images: Images) -> list[int] | None:
        if (self.held_at != self.passes - 1 or self.nodes_changed is None
                or self.models_changed is None or not self.changed <= BY_NAME
                or len(results) != len(last.results)
                or not (last.policy is policy or last.policy == policy)
                or not (last.images is images or last.images == images)):
            return None
        was = last.results
        todo = set(compress(range(len(results)), map(is_not, results, was)))
        if any(results[i].model.key != was[i].model.key for i in todo):
            return None  # (models came and went: the positions moved)
        keys = set(self.models_changed)
        for node in self.nodes_changed:
            keys.update(self.by_node.get(node, ()))
        if now != last.now:
            keys |= self.took
        if speeds is not last.speeds and speeds != last.speeds:
            keys |= {k for k in speeds.keys() | last.speeds.keys()
                     if speeds.get(k) != last.speeds.get(k)}
        at = last.at
        todo.update(at[k] for k in keys if k in at)
        return sorted(todo | last.unkept)

    def current(self, current: Current, placed: Mapping[str, Mapping[int, str]],
                fill: Callable[[Current, Mapping[str, Mapping[int, str]]], Current]) -> Current:
        """`policy.with_memory` (`fill`), the same object again while `current` is
        the same and the last placements of its unplaced replicas' models are too;
        with only the changed models' entries (and those whose last placements
        changed) filled in again while the pods are the same and a few models
        changed (the same valid ones)."""
        last = self.memory
        if last is not None:
            moved = [k for k, then in last[1].items()  # (its unplaced replicas' last nodes)
                     if not ((was := placed.get(k)) is then or was == then)]
            if last[0] is current and not moved:
                self.memory = (*last[:3], self.passes)
                return last[2]
            changed = self.models_changed
            if (changed is not None and last[3] == self.passes - 1 and "pods" not in self.changed
                    and len(current) == len(last[0])
                    and all(k in last[0] for k in changed if k in current)):
                # The pods are the same, the same valid models: only the
                # changed models' entries, and those `moved`, can differ.
                part = {k: current[k] for k in (*changed, *moved) if k in current}
                out, unplaced = {**last[2], **fill(part, placed)}, dict(last[1])
                for k, nodes in part.items():
                    if None in nodes:
                        unplaced[k] = placed.get(k)
                    else:
                        unplaced.pop(k, None)
                self.memory = (current, unplaced, out, self.passes)
                return out
        filled = fill(current, placed)
        self.memory = (current, {k: placed.get(k) for k, nodes in current.items()
                                 if None in nodes}, filled, self.passes)
        return filled

    def placement(self, result: ModelResult) -> dict[int, str]:
        """Where `result` puts each replica (the same dict for the same result)."""
        key = result.model.key
        got = self.placements.get(key)
        if got is None or got[0] is not result:
            got = self.placements[key] = (result, {r.replica: r.node for r in result.replicas})
        return got[1]

    def begin(self, obs: Observed) -> None:
        """A new pass on `obs`: which of its sections are not the last pass's."""
        before, self.obs, self.passes = self.obs, obs, self.passes + 1
        self.changed = frozenset(SECTIONS) if before is None else frozenset(
            s for s in SECTIONS if getattr(obs, s) is not getattr(before, s))
        self.models_changed = None
        self.admits_before = (before is not None and self.admits is not None
                              and self.admits[0] is before.models)
        if before is not None:
            self.models_changed = frozenset() if before.models is obs.models else changed_keys(
                before.models, obs.models)
        self.nodes_changed = None
        if before is not None and "pods" not in self.changed:
            old, new = before.nodes, obs.nodes
            since = obs.nodes_since  # (`observe` read a few nodes again: those)
            self.nodes_changed = frozenset() if old is new else since[1] if (
                since is not None and since[0] is old) else frozenset(
                n for n in old.keys() | new.keys() if old.get(n) is not new.get(n))
        self.to_read = tuple((i, read) for i, (sections, read) in enumerate(_READS)
                             if self.changed.intersection(sections)
                             and (sections != ("pods", "nodes") or self.nodes_changed is None))
        self.claims_again = None  # (the claims chosen read the model's claims, pods, volumes)
        if before is not None and not self.changed.intersection(("claims", "pods", "volumes")):
            self.claims_again = set().union(*(self.chosen_on.get(node, ())
                                              for node in self.nodes_changed or ()))

    def invalid(self, obs: Observed) -> list[ModelObject]:
        """The models that did not parse (once per models section)."""
        if self.unparsed is None or self.unparsed[0] is not obs.models:
            self.unparsed = (obs.models, [mo for mo in obs.models.values() if mo.model is None])
        return self.unparsed[1]

    def admitted(self, obs: Observed, tenants: TenantPolicy, secrets: SecretLabels,
                 admit: Callable[[Sequence[LocalModel] | None], Admitted]) -> Admitted:
        """`policy.admitted` (`admit`: of these models, None: of all), kept while
        the models, the policy and the Secrets' labels are the same: then only the
        models it refused are asked again (their status may take the clock)."""
        last = self.admits
        if (last is not None and (last[1] is tenants or last[1] == tenants)
                and last[2] == secrets):
            if last[0] is obs.models:
                ok, refused = admit(last[4])
                if not ok:  # (`refusals` is pure: a refused model stays refused)
                    return last[3], refused
            elif (kept := self._admitted_again(obs, last, admit)) is not None:
                return kept
        ok, refused = admit(None)
        self.admits = (obs.models, tenants, dict(secrets), ok,
                       tuple(w.model.model for w in refused if w.model.model is not None),
                       {lm.key: i for i, lm in enumerate(ok)})
        return ok, refused

    def _admitted_again(self, obs: Observed, last: Any,
                        admit: Callable[[Sequence[LocalModel] | None], Admitted]
                        ) -> Admitted | None:
        """`admitted` when a few models changed since the last pass's (the same
        ones in the same order): each changed model asked again, the refused
        ones too; None unless each changed one admitted before is admitted
        again, and none changed was refused (else all are asked: the order of
        the lists follows the models')."""
        if not self.admits_before or self.models_changed is None:
            return None
        position: dict[str, int] = last[5]
        refused_before = {lm.key for lm in last[4]}
        again: list[LocalModel] = []
        for key in self.models_changed:
            lm = obs.models[key].model
            if key in refused_before or (lm is None) != (key not in position):
                return None  # (refused before, or valid before and not now, or the reverse)
            if lm is not None:
                again.append(lm)
        ok, refused = admit([*again, *last[4]])
        if any(w.model.key in position for w in refused) or any(
                lm.key not in position for lm in ok):
            return None  # (one admitted before refused now, or the reverse)
        admitted = list(last[3])
        for lm in ok:
            admitted[position[lm.key]] = lm
        self.admits = (obs.models, last[1], last[2], admitted, last[4], position)
        return admitted, refused

    def refusals(self, lm: LocalModel, tenants: TenantPolicy, secrets: SecretLabels
                 ) -> tuple[Refusal, ...]:
        """`tenancy.refusals`, kept while the model, the policy and the Secrets'
        labels are the same."""
        kept = self.refused.get(lm.key)
        if (kept is not None and kept[0] is lm and (kept[1] is tenants or kept[1] == tenants)
                and kept[2] == secrets):
            return cast(tuple[Refusal, ...], kept[3])
        found = refusals(lm, tenants, secrets)
        self.refused[lm.key] = (lm, tenants, dict(secrets), found)
        return found

    def chooser(self, obs: Observed) -> Chooser:
        """`changes.choose_claim` on `obs`, kept while what it reads is the same:
        the model, its claims and pods, the node's facts and the claims' volumes."""
        quick = not self.changed.intersection(("claims", "pods", "volumes"))
        nodes_same = "nodes" not in self.changed
        passes = self.passes

        def choose(lm: LocalModel, replica: int, node: str) -> str:
            key = lm.key
            kept = self.chosen.get((key, replica, node))
            # found to hold in the last pass, and only the model or the node may differ
            if (kept is not None and quick and kept[-1] == passes - 1 and kept[0] is lm
                    and (nodes_same or kept[3] == obs.nodes.get(node))):
                self.chosen[(key, replica, node)] = (*kept[:-1], passes)
                return cast(str, kept[-2])
            claims = obs.claims_of(key)
            read = (lm, claims, obs.pods_of(key), obs.nodes.get(node),
                    tuple(obs.volumes.get(c.volume or "") for c in claims))
            if kept is None:
                index_node(self.chosen_on, node, key)
            if kept is None or kept[:-2] != read:
                kept = (*read, choose_claim(lm, replica, node, obs), passes)
            self.chosen[(key, replica, node)] = (*kept[:-1], passes)
            return cast(str, kept[-2])
        return choose

    def keep_only(self, keys: Collection[str]) -> None:
        """Forget the models not in `keys` (gone, invalid, refused or failed)."""
        for key in [k for k in self.by_model if k not in keys]:
            self.forget(key)
        for key in [k for k in self.refused if k not in keys]:
            del self.refused[key]
        for key in [k for k in self.placements if k not in keys]:
            del self.placements[key]
        for chosen in [k for k in self.chosen if k[0] not in keys]:
            del self.chosen[chosen]
            unindex_node(self.chosen_on, chosen[2], chosen[0])
