"""Keep, then place: the greedy pass over the index (see the package docstring)."""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import compress
from operator import attrgetter, is_not
from typing import Any

from localmodel.facts import NodeFacts
from localmodel.planner.assign import Pending, Undo, place_each, take
from localmodel.planner.explain import Explainer
from localmodel.planner.index import Node, NodeIndex
from localmodel.planner.model import (
    DEFAULT_SETTINGS,
    Assignment,
    ModelDemand,
    Plan,
    PlannerSettings,
    Unplaced,
    Usage,
)


def plan(
    models: Sequence[ModelDemand],
    nodes: Sequence[NodeFacts],
    current: Mapping[str, Sequence[str | None]] | None = None,
    usage: Mapping[str, Usage] | None = None,
    *,
    settings: PlannerSettings = DEFAULT_SETTINGS,
) -> Plan:
    """Place every replica of every model, keeping existing placements that still
    fit. See the package docstring for the rules, the order and the tie-break."""
    return Planner(settings, one_shot=True).plan(models, nodes, current or {}, usage or {})


def _order(d: ModelDemand) -> tuple[bool, str]:
    # Fixed CPU counts first: a cpu: node demand takes what is left on its node.
    return d.cpu.whole_node, d.key


_NO_USAGE = Usage()
_BY_MODEL = attrgetter("model", "replica")
Claim = tuple[ModelDemand, int]  # a replica's current placement on a node


# A node with no replicas on it, as most are in a cold pass: one shared empty
# list and dict (a memo's lists and dict are read, never changed in place).
_NOTHING_HERE: list[Any] = []
_NONE_MOVED: dict[tuple[str, int], str] = {}


@dataclass(slots=True)
class _NodeMemo:
    """What keeping did on one node, and the inputs it depended on: the node's
    facts, other pods' usage there, and the replicas currently on it (in the
    planner's order). Keeping is local to a node: whether a replica is kept
    depends on nothing else."""

    facts: NodeFacts
    used: Usage
    claims: list[Claim]
    kept: list[Assignment]
    moved: dict[tuple[str, int], str]  # (model, replica) -> why it cannot stay


class Planner:
    """``plan()`` that keeps its work between calls, so a call costs what changed.

    The state after keeping (every node with the replicas kept on it) is kept
    in the node index, with a memo per node of the inputs keeping read there.
    A call re-keeps only the nodes whose facts, usage or current replicas
    changed, then places the replicas that must move on that state (undoing
    those placements at the start of the next call, so a call begins on the
    kept state and a planner used once never pays for the undoing), or
    returns the last plan when nothing changed. The index is rebuilt when its
    shape changes: nodes added, removed, cordoned or uncordoned, a new node
    selector or sidecar overhead, or a selector crossing the direct-search
    size. The result is always what a fresh ``plan()`` returns (a property
    test holds the two together over random sequences of changes)."""

    def __init__(
        self, settings: PlannerSettings = DEFAULT_SETTINGS, *, one_shot: bool = False
    ) -> None:
        self.settings = settings
        # One call only (`plan()`): the placements need not be undone afterwards.
        self.one_shot = one_shot
        self.rebuilds = 0  # how many calls built the index from scratch
        self.nodes_rekept = 0  # nodes re-kept by the last call
        # Models whose placements or explanations may differ from the plan
        # before the last call's (None: any model; a rebuild).
        self.touched: frozenset[str] | None = None
        self._index: NodeIndex | None = None
        self._explainer: Explainer | None = None
        self._shape: tuple[object, ...] = ()
        self._memo: dict[str, _NodeMemo] = {}
        self._held: dict[str, set[str]] = {}  # model -> nodes it is kept on
        self._kept: dict[tuple[str, int], Assignment] = {}
        self._last: tuple[list[Pending], Plan] | None = None
        self._given: tuple[ModelDemand, ...] = ()
        self._order: list[ModelDemand] = []
        self._selectors: set[tuple[tuple[str, str], ...]] = set()
        self._overheads: tuple[int, ...] = ()
        self._listed: tuple[NodeFacts, ...] = ()
        self._by_name: dict[str, NodeFacts] = {}
        self._position: dict[str, int] = {}  # node name -> its place in _listed
        self._cordoned: frozenset[str] = frozenset()
        self._current: dict[str, tuple[str | None, ...]] = {}
        self._usage: dict[str, Usage] = {}
        self._claims: dict[str, list[Claim]] = {}
        # The pending replicas that no node's keeping decides (no node yet, or
        # a node that is gone), valid while the demands, `current` and the node
        # names are those of the call that listed them; the nodes whose memo
        # moves a replica; each model's place in the planner's order.
        self._unheld: list[Pending] | None = None
        self._moving: set[str] = set()
        self._rank: dict[str, int] = {}
        # The kept assignments sorted by (model, replica), kept up to date for
        # the (model, replica) keys `_keep` changed (None: sort them all again).
        self._kept_sorted: list[Assignment] | None = None
        self._kept_dirty: set[tuple[str, int]] = set()
        # The last call's placements to undo (and the nodes whose census counts
        # to redo), done at the start of the next call: `_restore`.
        self._undo: tuple[list[Undo], list[Node]] = ([], [])

    @property
    def nodes_by_name(self) -> Mapping[str, NodeFacts]:
        """The nodes of the last call, by name."""
        return self._by_name

    def plan(
        self,
        models: Sequence[ModelDemand],
        nodes: Sequence[NodeFacts],
        current: Mapping[str, Sequence[str | None]],
        usage: Mapping[str, Usage],
    ) -> Plan:
        self._restore()
        # What is the same as last time is found by comparisons that stop at
        # identity (the operator passes the same objects while nothing changed),
        # so an unchanged pass costs a few comparisons, not a loop over the cluster.
        demands_same = self._take_demands(tuple(models))
        listed = tuple(nodes)
        nodes_same = listed == self._listed
        refaced = set() if nodes_same else self._take_nodes(listed)
        by_name = self._by_name
        current_same = self._take_current(current) and demands_same
        old_usage, usage_same = self._usage, usage == self._usage
        self._usage = dict(usage)
        shape = (frozenset(self._selectors), self._overheads, self._cordoned)
        index = self._index
        rebuild = index is None or shape != self._shape
        if not (rebuild or nodes_same):
            assert index is not None  # (the same nodes, or a rebuild)
            rebuild = by_name.keys() != index.nodes.keys()
        if not rebuild and nodes_same and current_same and usage_same and self._last:
            self.nodes_rekept, self.touched = 0, frozenset()
            return self._last[1]
        # (Rebuilt: nodes may have gone.)
        kept_claims = current_same and not rebuild
        claims = self._claims if kept_claims else _claims(self._order, current, by_name)
        changed: list[Node] = []
        relabelled: set[str] = set()
        touched: set[str] = set()
        if not rebuild:
            assert index is not None
            suspects = self._suspects(refaced, old_usage, usage, claims)
            changed, relabelled = self._rekeep(suspects, usage, claims, touched)
            rebuild = bool(relabelled) and not index.views_hold(self._selectors)
        self._claims = claims
        if rebuild:
            self._rebuild(self._order, by_name, usage, claims)
            self._shape = shape
        self.nodes_rekept = len(by_name) if rebuild else len(changed)
        self.touched = None if rebuild or self._last is None else frozenset(touched)
        explainer = self._explainer
        assert self._index is not None and explainer is not None
        for node in changed:
            explainer.update(node, node.name in relabelled)
        if current_same and not rebuild and not changed and self._last is not None:
            return self._last[1]  # the same replicas on the same kept state
        pending = self._pending(current, rebuild or not current_same)
        if not rebuild and not changed and self._last is not None and self._last[0] == pending:
            return self._last[1]
        if not rebuild and self._last is not None:  # every replica placed afresh may move
            touched |= {d.key for d, _, _ in (*pending, *self._last[0])}
            self.touched = frozenset(touched)
        result = self._place_pending(self._index, explainer, pending)
        self._last = (pending, result)
        return result

    def _take_demands(self, given: tuple[ModelDemand, ...]) -> bool:
        """Take this call's demands, in the planner's order; whether they are the last's."""
        if given == self._given:
            self._given = given  # (equal copies: compared by identity from now on)
            return True
        order = sorted(given, key=_order)
        if len({d.key for d in order}) != len(order):
            raise ValueError("model keys must be unique")
        self._given, self._order = given, order
        self._selectors = {d.selector for d in order}
        self._overheads = tuple(sorted({d.overhead_cpu_milli for d in order}))
        self._rank = {d.key: i for i, d in enumerate(order)}
        return False

    def _take_current(self, current: Mapping[str, Sequence[str | None]]) -> bool:
        """Take this call's current placements; whether they are the last call's."""
        # (A mapping of tuples, as `Plan.as_current` gives, compares in C.)
        if current == self._current:
            return True
        placed_now = {key: tuple(was) for key, was in current.items()}
        same = placed_now == self._current
        self._current = placed_now
        return same

    def _take_nodes(self, listed: tuple[NodeFacts, ...]) -> set[str] | None:
        """Take this call's nodes (a list other than the last); the names of
        the nodes whose facts object changed (None: unknown, many changed)."""
        refaced = self._refaced(listed)
        if refaced is not None:  # the same nodes in the same order, a few new facts
            by_name = self._by_name
            cordoned = set(self._cordoned)
            for one in refaced:
                f = by_name[one] = listed[self._position[one]]
                (cordoned.add if not f.schedulable else cordoned.discard)(one)
            self._cordoned = frozenset(cordoned)
            self._listed = listed
            return refaced
        by_name = {f.name: f for f in listed}
        if len(by_name) != len(listed):
            seen: set[str] = set()
            for f in listed:
                if f.name in seen:
                    raise ValueError(f"node {f.name} is listed twice")
                seen.add(f.name)
        self._listed, self._by_name = listed, by_name
        self._position = {f.name: i for i, f in enumerate(listed)}
        self._cordoned = frozenset(name for name, f in by_name.items() if not f.schedulable)
        return None

    def _suspects(
        self,
        refaced: set[str] | None,
        old_usage: Mapping[str, Usage],
        usage: Mapping[str, Usage],
        claims: dict[str, list[Claim]],
    ) -> set[str]:
        """The only nodes whose kept state can differ: those whose facts
        object changed, whose usage changed, or whose current replicas changed."""
        by_name = self._by_name
        suspects: set[str] = set()
        if refaced is not None:
            suspects.update(refaced)
        else:
            memo_of = self._memo
            suspects.update(name for name, f in by_name.items() if memo_of[name].facts is not f)
        if usage != old_usage:
            suspects.update(
                name
                for name in old_usage.keys() | usage.keys()
                if name in by_name and old_usage.get(name) != usage.get(name)
            )
        if claims is not self._claims:
            old = self._claims
            suspects.update(
                name for name in old.keys() | claims.keys() if old.get(name) != claims.get(name)
            )
        return suspects

    def _rekeep(
        self,
        suspects: set[str],
        usage: Mapping[str, Usage],
        claims: dict[str, list[Claim]],
        touched: set[str],
    ) -> tuple[list[Node], set[str]]:
        """Keep again on the suspect nodes whose inputs did change; those nodes,
        and those of them relabelled. ``touched`` gains the models involved."""
        index = self._index
        assert index is not None
        changed: list[Node] = []
        relabelled: set[str] = set()
        for name in sorted(suspects):
            f = self._by_name[name]
            memo = self._memo[name]
            used = usage.get(name, _NO_USAGE)
            here = claims.get(name, [])
            if (
                (memo.facts is f or memo.facts == f)
                and (memo.used is used or memo.used == used)
                and memo.claims == here
            ):
                continue
            node = index.nodes[name]
            if f.labels != node.labels:
                relabelled.add(name)
            index.unindex(node)
            index.reset(node, f, used)
            touched.update(a.model for a in memo.kept)
            touched.update(model for model, _ in memo.moved)
            touched.update(d.key for d, _ in here)
            self._keep(node, f, used, here)
            changed.append(node)
        return changed, relabelled

    def _pending(
        self, current: Mapping[str, Sequence[str | None]], relist: bool
    ) -> list[Pending]:
        """In the planner's order: replicas without a node, on a node that is
        gone, or on a node that keeping moved them off. The first two depend
        only on the demands, `current` and the node names, so they are listed
        again only when one of those changed (``relist``: a rebuild, or not
        the same current placements); the moved ones come from the nodes
        whose memo moves any."""
        if relist or self._unheld is None:
            pending: list[Pending] = []
            unheld: list[Pending] = []
            for d in self._order:
                was = current.get(d.key, ())
                for r in range(d.replicas):
                    name = was[r] if r < len(was) else None
                    if name is None:
                        unheld.append((d, r, ""))
                        pending.append((d, r, ""))
                    elif name not in self._by_name:
                        gone = (d, r, f"was on {name}: node is gone")
                        unheld.append(gone)
                        pending.append(gone)
                    else:
                        why = self._memo[name].moved.get((d.key, r))
                        if why is not None:
                            pending.append((d, r, why))
            self._unheld = unheld
            return pending
        pending = list(self._unheld)
        if self._moving:
            memos = self._memo
            for name in self._moving:
                memo = memos[name]
                for d, r in memo.claims:
                    why = memo.moved.get((d.key, r))
                    if why is not None:
                        pending.append((d, r, why))
            rank = self._rank
            pending.sort(key=lambda p: (rank[p[0].key], p[1]))
        return pending

    def _restore(self) -> None:
        """Put the index back to the kept state: undo the last call's placements
        (and recount the censuses that counted them)."""
        undo, recount = self._undo
        if not undo:
            return
        self._undo = ([], [])
        index, explainer = self._index, self._explainer
        assert index is not None and explainer is not None
        for u in undo:
            index.unindex(u.node)
            u.node.free_cpu_milli, u.node.free_memory = u.free_cpu_milli, u.free_memory
            u.node.occupants, u.node.exclusive_holder = u.occupants, u.exclusive_holder
            index.index(u.node)
        for node in recount:
            explainer.update(node)

    def _refaced(self, listed: tuple[NodeFacts, ...]) -> set[str] | None:
        """The names of the nodes whose facts object changed, when the list is
        otherwise the last one (same names in the same order, few changed)."""
        old = self._listed
        if len(listed) != len(old) or not old:
            return None
        changed = list(compress(range(len(listed)), map(is_not, listed, old)))
        if len(changed) * 8 > len(listed) or any(listed[i].name != old[i].name for i in changed):
            return None
        return {listed[i].name for i in changed}

    def _rebuild(
        self,
        order: list[ModelDemand],
        by_name: Mapping[str, NodeFacts],
        usage: Mapping[str, Usage],
        claims: Mapping[str, list[Claim]],
    ) -> None:
        self.rebuilds += 1
        index = NodeIndex(order, list(by_name.values()), usage, self.settings)
        self._index, self._explainer = index, Explainer(index)
        self._memo, self._held, self._kept = {}, {}, {}
        self._last = None
        self._unheld, self._moving = None, set()
        self._kept_sorted, self._kept_dirty = None, set()
        for name, f in by_name.items():
            used = usage.get(name, _NO_USAGE)
            here = claims.get(name)
            if here is None:
                self._memo[name] = _NodeMemo(f, used, _NOTHING_HERE, _NOTHING_HERE, _NONE_MOVED)
                continue
            node = index.nodes[name]
            index.unindex(node)
            self._keep(node, f, used, here)

    def _keep(self, node: Node, f: NodeFacts, used: Usage, claims: list[Claim]) -> None:
        """Keep the node's current replicas that still fit, in order; the node
        is unindexed and reset, and is indexed again here."""
        old = self._memo.get(node.name)
        if old is not None:
            for a in old.kept:
                self._held[a.model].discard(node.name)
                if self._kept.get((a.model, a.replica)) is a:  # not re-kept elsewhere yet
                    del self._kept[(a.model, a.replica)]
                    self._kept_dirty.add((a.model, a.replica))
        kept: list[Assignment] = []
        moved: dict[tuple[str, int], str] = {}
        index, name = self._index, node.name
        assert index is not None
        for d, r in claims:
            rejected = index.rejection(node, d)
            if rejected is not None:
                moved[(d.key, r)] = f"was on {name}: {rejected[1]}"
                continue
            cpu = take(node, d, r)
            a = Assignment(
                d.key, r, name, cpu, d.memory_bytes, f"kept: already on {name} and still fits"
            )
            kept.append(a)
            self._kept[(d.key, r)] = a
            self._kept_dirty.add((d.key, r))
            self._held.setdefault(d.key, set()).add(name)
        index.index(node)
        self._memo[name] = _NodeMemo(f, used, claims, kept, moved)
        (self._moving.add if moved else self._moving.discard)(name)

    def _place_pending(
        self, index: NodeIndex, explainer: Explainer, pending: list[Pending]
    ) -> Plan:
        """Place the replicas that must move on the kept state and explain those
        that fit nowhere; the next call puts the index back to the kept state."""
        placed, unplaced, undo = place_each(index, pending, save=not self.one_shot)
        held: dict[str, list[str]] = {}
        for a in placed:
            held.setdefault(a.model, []).append(a.node)
        explained: tuple[Unplaced, ...] = ()
        if unplaced:
            touched = {id(u.node): u.node for u in undo}.values()
            for node in touched:
                explainer.update(node)
            explainer.held = {
                d.key: self._held.get(d.key, set()) | set(held.get(d.key, ())) for d, _ in unplaced
            }
            explained = tuple(
                explainer.explain(d, r)
                for d, r in sorted(unplaced, key=lambda dr: (dr[0].key, dr[1]))
            )
        explainer.forget_unused()
        # Back to the kept state, lazily: at the start of the next call (a
        # planner used for one pass, as a cold pass's is, never pays for it).
        self._undo = (undo, list(touched) if unplaced else [])
        placements = self._kept_in_order()
        if len(placed) * 8 > len(placements):
            placements += placed
            placements.sort(key=_BY_MODEL)
        else:
            for a in placed:
                insort(placements, a, key=_BY_MODEL)
        return Plan(placements=tuple(placements), unplaced=explained, ordered=True)

    def _kept_in_order(self) -> list[Assignment]:
        """A new list of the kept assignments sorted by (model, replica)."""
        in_order = self._kept_sorted
        dirty = self._kept_dirty
        if in_order is None or len(dirty) * 8 > len(in_order):
            in_order = sorted(self._kept.values(), key=_BY_MODEL)
        else:
            kept = self._kept
            for key in dirty:
                at = bisect_left(in_order, key, key=_BY_MODEL)
                if at < len(in_order) and _BY_MODEL(in_order[at]) == key:
                    del in_order[at]
                a = kept.get(key)
                if a is not None:
                    in_order.insert(at, a)
        self._kept_sorted, self._kept_dirty = in_order, set()
        return list(in_order)


def _claims(
    order: list[ModelDemand],
    current: Mapping[str, Sequence[str | None]],
    by_name: Mapping[str, NodeFacts],
) -> dict[str, list[Claim]]:
    """Node -> the replicas currently on it (of nodes that exist), in order."""
    claims: dict[str, list[Claim]] = {}
    for d in order:
        was = current.get(d.key, ())
        for r in range(min(d.replicas, len(was))):
            name = was[r]
            if name is not None and name in by_name:
                claims.setdefault(name, []).append((d, r))
    return claims
