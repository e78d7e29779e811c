"""A census: the planner's final state as one (selector, tolerations, sidecar
overhead) sees it, counted over sorted entries, so a large cluster's
unplaced replica is explained in about one bisect per distinct CPU count
(`explain.Explainer`). Kept up to date node by node across passes."""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import cast

from localmodel.api import Toleration
from localmodel.facts import Taint
from localmodel.planner.fit import Entry, sort_named_in_order
from localmodel.planner.index import (
    SELECTOR,
    UNSCHEDULABLE,
    Category,
    Node,
    NodeIndex,
    RejectKind,
    Selector,
)

# What one node adds to a census: nothing (unschedulable: counted for all),
# a selector miss, a taint that rejects it, held by an exclusive model (with
# who is on it: the rejections name them), or its fit entry among the empty or
# shared nodes.
Part = tuple[str, Category | Entry | tuple[tuple[str, int], ...] | None]
_UNSCHEDULABLE: Part = ("unschedulable", None)
_NOT_MATCHING: Part = ("selector", None)


@dataclass(slots=True)
class Census:
    """The final state as one (selector, tolerations, overhead) sees it: static
    rejections counted, and the eligible nodes sorted by occupancy. Kept up to
    date node by node (``update``) across passes by a long-lived planner."""

    selector: Selector
    tolerations: tuple[Toleration, ...]
    overhead: int
    matching: int = 0  # schedulable nodes the selector matches
    selector_examples: list[str] = field(default_factory=list)
    taint_names: dict[Category, list[str]] = field(default_factory=dict)  # sorted
    eligible: set[str] = field(default_factory=set)
    exclusive: list[str] = field(default_factory=list)  # eligible, held by an exclusive model
    empty: list[Entry] = field(default_factory=list)
    shared: list[Entry] = field(default_factory=list)
    shared_names: list[str] = field(default_factory=list)  # the shared nodes, by name
    parts: dict[str, Part] = field(default_factory=dict)  # the counted nodes
    # Who runs on each shared node (its rejections name them; not in its entry).
    shared_who: dict[str, tuple[tuple[str, int], ...]] = field(default_factory=dict)
    # Moves whenever what the census counts changes (an explanation read
    # from an unchanged census, for the same replica, is the same).
    version: int = 0

    def part(self, index: NodeIndex, node: Node) -> Part:
        if not node.schedulable:
            return _UNSCHEDULABLE
        if self.selector and any(node.labels.get(k) != v for k, v in self.selector):
            return _NOT_MATCHING
        blocking, _ = index.verdict(node.taints, self.tolerations)
        if blocking is not None:
            return ("taint", Category(RejectKind.TAINT, blocking))
        if node.exclusive_holder is not None:
            return ("exclusive", tuple(node.occupants.items()))
        return ("shared" if node.occupants else "empty", node.entry(self.overhead))

    def add(self, name: str, part: Part) -> None:
        """Count one node's part, in its sorted place (``fill`` counts a fresh
        census). Unschedulable and non-matching nodes are not kept: they are
        counted from the index (a hostname selector's census holds a node or two)."""
        kind, value = part
        if kind in ("unschedulable", "selector"):
            return
        self.parts[name] = part
        self.matching += 1
        if kind == "taint":
            assert isinstance(value, Category)
            insort(self.taint_names.setdefault(value, []), name)
            return
        self.eligible.add(name)
        if kind == "exclusive":
            insort(self.exclusive, name)
            return
        insort(self.shared if kind == "shared" else self.empty, cast(Entry, value))
        if kind == "shared":
            insort(self.shared_names, name)

    def fill(self, index: NodeIndex, nodes: Iterable[Node]) -> None:
        """Count a fresh census's nodes, which come by name and all match its
        selector: what ``part`` then ``add`` do node by node, with the taint
        verdict worked out once per distinct set of taints. (Explaining a
        large cluster is mostly these loops over a few thousand nodes.)"""
        by_taints: dict[tuple[Taint, ...], tuple[Part, list[str]] | None] = {}
        overhead = self.overhead
        parts, eligible, exclusive = self.parts, self.eligible, self.exclusive
        empty, shared, shared_names, shared_who = (
            self.empty,
            self.shared,
            self.shared_names,
            self.shared_who,
        )
        for node in nodes:
            if not node.schedulable:
                continue
            name, taints = node.name, node.taints
            if taints in by_taints:
                rejected = by_taints[taints]
            else:
                blocking, _ = index.verdict(taints, self.tolerations)
                rejected = None
                if blocking is not None:
                    category = Category(RejectKind.TAINT, blocking)
                    rejected = ("taint", category), self.taint_names.setdefault(category, [])
                by_taints[taints] = rejected
            if rejected is not None:
                parts[name] = rejected[0]
                rejected[1].append(name)
                continue
            eligible.add(name)
            if node.exclusive_holder is not None:
                parts[name] = ("exclusive", tuple(node.occupants.items()))
                exclusive.append(name)
            elif node.occupants:
                entry = node.entry(overhead)
                parts[name] = ("shared", entry)
                shared.append(entry)
                shared_names.append(name)
                shared_who[name] = tuple(node.occupants.items())
            else:
                entry = node.entry(overhead)
                parts[name] = ("empty", entry)
                empty.append(entry)
        self.matching = len(parts)
        sort_named_in_order(empty)
        sort_named_in_order(shared)

    def who(self, node: Node) -> tuple[tuple[str, int], ...]:
        return tuple(node.occupants.items())

    def _see(self, node: Node, part: Part) -> None:
        if part[0] == "shared":
            self.shared_who[node.name] = self.who(node)
        else:
            self.shared_who.pop(node.name, None)

    def remove(self, name: str) -> None:
        kind, value = self.parts.pop(name)
        self.matching -= 1
        if kind == "taint":
            assert isinstance(value, Category)
            names = self.taint_names[value]
            del names[bisect_left(names, name)]
            if not names:
                del self.taint_names[value]
            return
        self.eligible.discard(name)
        if kind == "exclusive":
            del self.exclusive[bisect_left(self.exclusive, name)]
            return
        entries = self.shared if kind == "shared" else self.empty
        del entries[bisect_left(entries, cast(Entry, value))]
        if kind == "shared":
            del self.shared_names[bisect_left(self.shared_names, name)]

    def update(self, index: NodeIndex, node: Node, k: int) -> None:
        """Recount one node whose state or facts changed."""
        part = self.part(index, node)
        old = self.parts.get(node.name)  # None: not counted (unschedulable, not matching)
        uncounted = part[0] in ("unschedulable", "selector")
        if old is None and uncounted:  # (cordoning rebuilds the index)
            if node.name in self.selector_examples:  # its labels are quoted
                self.version += 1
            return
        if part == old:
            if part[0] == "shared" and self.shared_who.get(node.name) != self.who(node):
                self.shared_who[node.name] = self.who(node)
                self.version += 1
            return
        self.version += 1
        if old is not None:
            self.remove(node.name)
        self.add(node.name, part)
        self._see(node, part)
        if old is None or uncounted:  # it joined or left the selector's nodes
            self.selector_examples = self._selector_examples(index, k)

    def _selector_examples(self, index: NodeIndex, k: int) -> list[str]:
        """The first k schedulable nodes, by name, the selector does not match."""
        out: list[str] = []
        if self.matching < len(index.schedulable):
            for node in index.schedulable:
                if node.name not in self.parts:
                    out.append(node.name)
                    if len(out) == k:
                        break
        return out

    def static(
        self, index: NodeIndex, k: int
    ) -> tuple[dict[Category, int], dict[Category, list[str]]]:
        """Static rejections: (counts, examples) per category."""
        counts: dict[Category, int] = {}
        examples: dict[Category, list[str]] = {}
        if index.unschedulable:
            counts[UNSCHEDULABLE] = len(index.unschedulable)
            examples[UNSCHEDULABLE] = index.unschedulable[:k]
        if self.matching < len(index.schedulable):
            counts[SELECTOR] = len(index.schedulable) - self.matching
            examples[SELECTOR] = list(self.selector_examples)
        for category, names in self.taint_names.items():
            counts[category] = len(names)
            examples[category] = names[:k]
        return counts, examples
