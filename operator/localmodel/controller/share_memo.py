"""The memo layer of `model_work.model_work` (`ShareMemo`): each model's share
of a pass (its changes, status and replicas to read), kept while all it read
holds. Pure.

`model_work` reads the model's result (from `incremental.Desired`, which hands
back the same object while the model's inputs hold), the model as stored, what
the watches show of its own objects (pods and doormen, claims, ConfigMaps,
Services, NetworkPolicies, by label, by owner and by the names the result
gives them),
the nodes its pods and replicas are on, its published speeds and the clock.
The key is all of that (`reads`, part by part, each with the sections of the
`Observed` it depends on): the same objects (all frozen; `observe` hands back
the same ones for objects that did not change), or equal values. The clock
counts only when the status took it (`status.took_now`: a condition moved).

So a pass after one event works out again only the models that event touched,
and a quiet pass (the same `Observed`, the same results) none: the whole last
plan comes back for the very same inputs (`same_pass`). While only the models
and nodes sections changed (a label, a status written), a pass does not even go
over the models: it copies the last pass's shares (`Shares`) and looks only at
the models `shares_again` names, found by name: those whose result or stored
object changed, whose kept share read a node that changed (`by_node`), whose
status took a clock that moved, whose speeds changed; the plan names the work
that is not the last plan's (`PassPlan.since`) for the reconciler.
tests/controller/test_pass_incremental.py holds a pass with a long-lived memo equal
to one without, over random sequences of events.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import compress
from operator import is_not
from typing import Any

from localmodel.controller.model_work import ModelWork, PassPlan, Worked, took_clock
from localmodel.controller.observed import Observed
from localmodel.controller.since import Since
from localmodel.controller.speed import SpeedTarget
from localmodel.desired import ModelResult
from localmodel.facts import NodeFacts
from localmodel.idle_status import IdleReport
from localmodel.render import replica_claim
from localmodel.speed import Published, SpeedPolicy
from localmodel.status import took_now

# node -> models: a tuple while a few (most nodes run one or two models; a
# set costs four times the memory of a small tuple: megabytes at 10 000
# nodes), a set beyond.
ByNode = dict[str, tuple[str, ...] | set[str]]
_FEW = 8


def index_node(by: ByNode, node: str, key: str) -> None:
    there = by.get(node)
    if there is None:
        by[node] = (key,)
    elif isinstance(there, set):
        there.add(key)
    elif key not in there:
        by[node] = (*there, key) if len(there) < _FEW else {*there, key}


def unindex_node(by: ByNode, node: str, key: str) -> None:
    there = by.get(node)
    if isinstance(there, set):
        there.discard(key)
    elif there is not None and key in there:
        there = tuple(k for k in there if k != key)
        by[node] = there
    if not there and there is not None:
        del by[node]




class _Kept:
    """One model's share and what it was worked out from."""

    __slots__ = (
        "images",
        "nodes",
        "now",
        "policy",
        "published",
        "reads",
        "report",
        "result",
        "took_now",
        "worked",
    )

    def __init__(self, result: ModelResult, published: Mapping[int, Published],
                 policy: SpeedPolicy, images: tuple[str, tuple[str, ...]], now: str, took_now: bool,
                 reads: tuple[Any, ...], worked: Worked, nodes: frozenset[str],
                 report: IdleReport | None = None) -> None:
        self.result, self.published, self.policy = result, published, policy
        self.report = report  # its idle state (`idle_status.IdleReport`), of a model with idle
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
    (("pods",), lambda r, uid, obs: (obs.pods_of(r.model.key), obs.doormen_of(r.model.key))),
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


# The sections whose changes a pass finds the models of by name (`Since.begin`:
# the models changed, the nodes changed and the models that read them): while
# only these changed, a pass looks only at those models (`ShareMemo.shares_again`).
BY_NAME = frozenset(("models", "nodes"))
Images = tuple[str, tuple[str, ...]]  # the operator's image, the pull secrets


@dataclass
class Shares:
    """Each valid model's share of a pass, in the order of the pass's results
    (`plan.plan_pass`), where it puts each model's replicas, and what all of
    it was worked out with. The next pass copies the lists and works out again
    only the positions `ShareMemo.shares_again` names."""

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
    reports: Mapping[str, IdleReport]  # the idle models' (`idle.decide.IdleOutcome`)


@dataclass
class ShareMemo:
    """Keeps each model's share of the last pass (`_Kept`: its changes and
    status), the last pass's shares and plan, and the node -> models index a
    changed node's models are found by; keyed on what each share read (its
    model, its plan, the objects it owns, its speeds) and, for the whole plan,
    on the very same inputs."""

    since: Since
    by_model: dict[str, _Kept] = field(default_factory=dict)
    # The last pass that ended (`remember`): every kept share held in it.
    held_at: int = -1
    by_node: ByNode = field(default_factory=dict)  # node -> models whose share read it
    took: set[str] = field(default_factory=set)  # models whose kept share took the clock
    shares: Shares | None = None  # the last pass's
    serial: int = 0  # the last plan's number (`PassPlan.serial`)
    to_read: tuple[tuple[int, Callable[[ModelResult, str, Observed], Any]], ...] = ()
    placements: dict[str, tuple[ModelResult, dict[int, str]]] = field(default_factory=dict)
    # The last pass: its inputs, its clock, whether a status took that clock, its plan.
    last: tuple[tuple[Any, ...], str, bool, PassPlan] | None = None

    def begin(self) -> None:
        """A new pass (after `Since.begin`): the parts of a kept share to read again."""
        changed, nodes_changed = self.since.changed, self.since.nodes_changed
        self.to_read = tuple((i, read) for i, (sections, read) in enumerate(_READS)
                             if changed.intersection(sections)
                             and (sections != ("pods", "nodes") or nodes_changed is None))

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
        self.shares, self.held_at, self.serial = shares, self.since.passes, plan.serial
        self.last = None
        if not any(w.failure for w in unkept):
            clocked = bool(self.took) or any(took_clock(w) for w in unkept)
            self.last = (inputs, now, clocked, plan)
        return plan

    def held(self, result: ModelResult, uid: str, obs: Observed, now: str,
             published: Mapping[int, Published], policy: SpeedPolicy,
             images: tuple[str, tuple[str, ...]],  # the operator's image, pull secrets
             report: IdleReport | None = None) -> Worked | None:
        """The model's kept share while all it read holds; else None (and it is
        forgotten: `keep` what is worked out instead)."""
        key, nodes_changed = result.model.key, self.since.nodes_changed
        held_last = self.held_at == self.since.passes - 1
        kept = self.by_model.get(key)
        if (kept is not None and kept.result is result
                and (kept.policy is policy or kept.policy == policy)
                and (kept.images is images or kept.images == images)
                and (kept.now == now or not kept.took_now) and kept.published == published
                and kept.report == report and (
                    # held in the last pass (all kept shares did): only what changed since is read
                    all(read(result, uid, obs) == kept.reads[i] for i, read in self.to_read)
                    and (nodes_changed is None or nodes_changed.isdisjoint(kept.nodes))
                    if held_last else reads(result, uid, obs) == kept.reads)):
            return kept.worked
        self.forget(key)
        return None

    def keep(self, result: ModelResult, uid: str, obs: Observed, now: str,
             published: Mapping[int, Published], policy: SpeedPolicy,
             images: tuple[str, tuple[str, ...]], worked: Worked,
             report: IdleReport | None = None) -> None:
        """Keep the share `worked` out of `result` and what it read of `obs`."""
        key = result.model.key
        nodes = frozenset((*(p.node or "" for p in obs.pods_of(key)),
                           *(r.node for r in result.replicas)))
        self.forget(key)
        kept = self.by_model[key] = _Kept(result, published, policy, images, now,
                                          took_now(result.model, worked[0].status),
                                          reads(result, uid, obs), worked, nodes, report)
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
                     images: Images, reports: Mapping[str, IdleReport] | None = None,
                     ) -> tuple[Shares, Sequence[int], Shares | None]:
        """This pass's shares to fill in, the positions of `results` to work out
        (again), and the last pass's shares they are copied from (None: none,
        every position is to be worked out). Copied while the results are the
        same models in the same order and only sections found by name changed:
        then only the models whose result is another object, whose stored object
        changed, whose kept share read a node that changed (`by_node`) or took
        the clock that moved (`took`), whose speeds or idle reports changed, and
        those not kept."""
        last, reports = self.shares, reports if reports is not None else {}
        todo = None if last is None else self._again(last, results, now, speeds, policy, images,
                                                      reports)
        if last is None or todo is None:
            n = len(results)
            return Shares(results, {r.model.key: i for i, r in enumerate(results)}, [None] * n,
                          [()] * n, {}, set(), now, speeds, policy, images, reports), range(n), None
        return Shares(results, last.at, list(last.work), list(last.targets), dict(last.placed),
                      set(last.unkept), now, speeds, policy, images, reports), todo, last

    def _again(self, last: Shares, results: tuple[ModelResult, ...], now: str,
               speeds: Mapping[str, Mapping[int, Published]], policy: SpeedPolicy,
               images: Images, reports: Mapping[str, IdleReport]) -> list[int] | None:
        if (self.held_at != self.since.passes - 1 or self.since.nodes_changed is None
                or self.since.models_changed is None or not self.since.changed <= BY_NAME
                or len(results) != len(last.results)
                or not (last.policy is policy or last.policy == policy)
                or not (last.images is images or last.images == images)):
            return None
        was = last.results
        todo = set(compress(range(len(results)), map(is_not, results, was)))
        if any(results[i].model.key != was[i].model.key for i in todo):
            return None  # (models came and went: the positions moved)
        keys = set(self.since.models_changed)
        for node in self.since.nodes_changed:
            keys.update(self.by_node.get(node, ()))
        if now != last.now:
            keys |= self.took
        if speeds is not last.speeds and speeds != last.speeds:
            keys |= {k for k in speeds.keys() | last.speeds.keys()
                     if speeds.get(k) != last.speeds.get(k)}
        if reports is not last.reports and reports != last.reports:
            keys |= {k for k in reports.keys() | last.reports.keys()
                     if reports.get(k) != last.reports.get(k)}
        at = last.at
        todo.update(at[k] for k in keys if k in at)
        return sorted(todo | last.unkept)

    def placement(self, result: ModelResult) -> dict[int, str]:
        """Where `result` puts each replica (the same dict for the same result)."""
        key = result.model.key
        got = self.placements.get(key)
        if got is None or got[0] is not result:
            got = self.placements[key] = (result, {r.replica: r.node for r in result.replicas})
        return got[1]

    def keep_only(self, keys: Collection[str]) -> None:
        """Forget the models not in `keys` (gone, invalid, refused or failed)."""
        for key in [k for k in self.by_model if k not in keys]:
            self.forget(key)
        for key in [k for k in self.placements if k not in keys]:
            del self.placements[key]
