"""Keep: each node's current replicas that still fit stay there, decided per
node and kept between `Planner` calls (`Keeping`)."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from localmodel.facts import NodeFacts
from localmodel.planner.assign import take
from localmodel.planner.index import Node, NodeIndex
from localmodel.planner.model import Assignment, ModelDemand, Usage

NO_USAGE = Usage()
BY_MODEL = attrgetter("model", "replica")
Claim = tuple[ModelDemand, int]  # a replica's current placement on a node

# A node with no replicas on it, as most are in a cold pass: one shared empty
# list and dict (a memo's lists and dict are read, never changed in place).
_NOTHING_HERE: list[Any] = []
_NONE_MOVED: dict[tuple[str, int], str] = {}


@dataclass(slots=True)
class NodeMemo:
    """What keeping did on one node, and the inputs it depended on: the node's
    facts, other pods' usage there, and the replicas currently on it (in the
    planner's order). Keeping is local to a node: whether a replica is kept
    depends on nothing else."""

    facts: NodeFacts
    used: Usage
    claims: list[Claim]
    kept: list[Assignment]
    moved: dict[tuple[str, int], str]  # (model, replica) -> why it cannot stay


class Keeping:
    """Keeps what keeping did on each node of one index (a `NodeMemo`), keyed on
    the node's facts, its other pods' usage and the replicas currently on it;
    and the kept assignments, in (model, replica) order.

    The index holds the kept state: every node with the replicas kept on it.
    A node is kept again only when one of its memo's inputs changed."""

    def __init__(self, index: NodeIndex) -> None:
        self.index = index
        self.memo: dict[str, NodeMemo] = {}
        self.held: dict[str, set[str]] = {}  # model -> nodes it is kept on
        self.moving: set[str] = set()  # the nodes whose memo moves a replica
        self._kept: dict[tuple[str, int], Assignment] = {}
        # The kept assignments sorted by (model, replica), kept up to date for
        # the (model, replica) keys `keep` changed (None: sort them all again).
        self._kept_sorted: list[Assignment] | None = None
        self._kept_dirty: set[tuple[str, int]] = set()

    def keep_all(
        self,
        by_name: Mapping[str, NodeFacts],
        usage: Mapping[str, Usage],
        claims: Mapping[str, list[Claim]],
    ) -> None:
        """Keep on every node of a new index."""
        index = self.index
        for name, f in by_name.items():
            used = usage.get(name, NO_USAGE)
            here = claims.get(name)
            if here is None:
                self.memo[name] = NodeMemo(f, used, _NOTHING_HERE, _NOTHING_HERE, _NONE_MOVED)
                continue
            node = index.nodes[name]
            index.unindex(node)
            self.keep(node, f, used, here)

    def suspects(
        self,
        by_name: Mapping[str, NodeFacts],
        refaced: set[str] | None,
        usage: tuple[Mapping[str, Usage], Mapping[str, Usage]],
        claims: tuple[Mapping[str, list[Claim]], Mapping[str, list[Claim]]],
    ) -> set[str]:
        """The only nodes whose kept state can differ: those whose facts
        object changed, whose usage changed, or whose current replicas changed
        (``usage`` and ``claims``: the last call's and this call's)."""
        suspects: set[str] = set()
        if refaced is not None:
            suspects.update(refaced)
        else:
            memo_of = self.memo
            suspects.update(name for name, f in by_name.items() if memo_of[name].facts is not f)
        old_usage, new_usage = usage
        if new_usage != old_usage:
            suspects.update(
                name
                for name in old_usage.keys() | new_usage.keys()
                if name in by_name and old_usage.get(name) != new_usage.get(name)
            )
        old, new = claims
        if new is not old:
            suspects.update(
                name for name in old.keys() | new.keys() if old.get(name) != new.get(name)
            )
        return suspects

    def rekeep(
        self,
        by_name: Mapping[str, NodeFacts],
        suspects: set[str],
        usage: Mapping[str, Usage],
        claims: dict[str, list[Claim]],
        touched: set[str],
    ) -> tuple[list[Node], set[str]]:
        """Keep again on the suspect nodes whose inputs did change; those nodes,
        and those of them relabelled. ``touched`` gains the models involved."""
        index = self.index
        changed: list[Node] = []
        relabelled: set[str] = set()
        for name in sorted(suspects):
            f = by_name[name]
            memo = self.memo[name]
            used = usage.get(name, NO_USAGE)
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
            self.keep(node, f, used, here)
            changed.append(node)
        return changed, relabelled

    def keep(self, node: Node, f: NodeFacts, used: Usage, claims: list[Claim]) -> None:
        """Keep the node's current replicas that still fit, in order; the node
        is unindexed and reset, and is indexed again here."""
        old = self.memo.get(node.name)
        if old is not None:
            for a in old.kept:
                self.held[a.model].discard(node.name)
                if self._kept.get((a.model, a.replica)) is a:  # not re-kept elsewhere yet
                    del self._kept[(a.model, a.replica)]
                    self._kept_dirty.add((a.model, a.replica))
        kept: list[Assignment] = []
        moved: dict[tuple[str, int], str] = {}
        index, name = self.index, node.name
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
            self.held.setdefault(d.key, set()).add(name)
        index.index(node)
        self.memo[name] = NodeMemo(f, used, claims, kept, moved)
        (self.moving.add if moved else self.moving.discard)(name)

    def in_order(self) -> list[Assignment]:
        """A new list of the kept assignments sorted by (model, replica)."""
        in_order = self._kept_sorted
        dirty = self._kept_dirty
        if in_order is None or len(dirty) * 8 > len(in_order):
            in_order = sorted(self._kept.values(), key=BY_MODEL)
        else:
            kept = self._kept
            for key in dirty:
                at = bisect_left(in_order, key, key=BY_MODEL)
                if at < len(in_order) and BY_MODEL(in_order[at]) == key:
                    del in_order[at]
                a = kept.get(key)
                if a is not None:
                    in_order.insert(at, a)
        self._kept_sorted, self._kept_dirty = in_order, set()
        return list(in_order)


def current_claims(
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
