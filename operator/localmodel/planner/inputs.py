"""A `Planner` call's inputs, kept from the last call to say what is the same
(`PlannerInputs`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import compress
from operator import is_not
from typing import NamedTuple

from localmodel.facts import NodeFacts
from localmodel.planner.model import ModelDemand, Usage


def planner_order(d: ModelDemand) -> tuple[bool, str]:
    """The planner's order of demands. Fixed CPU counts first: a cpu: node
    demand takes what is left on its node."""
    return d.cpu.whole_node, d.key


class Sameness(NamedTuple):
    """What of a call's inputs is the last call's."""

    nodes_same: bool  # the very same node list
    refaced: set[str] | None  # nodes whose facts object changed (None: unknown, many)
    current_same: bool  # the same demands and current placements
    old_usage: Mapping[str, Usage]  # the last call's usage
    usage_same: bool


class PlannerInputs:
    """Keeps the last call's demands (in the planner's order), nodes (by name
    and position), current placements and usage, and decides what of a new
    call's is the same. Comparisons stop at identity (the operator passes the
    same objects while nothing changed), so an unchanged call costs a few
    comparisons, not a loop over the cluster."""

    def __init__(self) -> None:
        self.given: tuple[ModelDemand, ...] = ()
        self.order: list[ModelDemand] = []
        self.selectors: set[tuple[tuple[str, str], ...]] = set()
        self.overheads: tuple[int, ...] = ()
        self.rank: dict[str, int] = {}  # each model's place in the planner's order
        self.listed: tuple[NodeFacts, ...] = ()
        self.by_name: dict[str, NodeFacts] = {}
        self.cordoned: frozenset[str] = frozenset()
        self.usage: dict[str, Usage] = {}
        self._position: dict[str, int] = {}  # node name -> its place in `listed`
        self._current: dict[str, tuple[str | None, ...]] = {}

    @property
    def shape(self) -> tuple[object, ...]:
        """What the node index is built for: its views, overheads and cordons."""
        return frozenset(self.selectors), self.overheads, self.cordoned

    def take(
        self,
        models: Sequence[ModelDemand],
        nodes: Sequence[NodeFacts],
        current: Mapping[str, Sequence[str | None]],
        usage: Mapping[str, Usage],
    ) -> Sameness:
        """Take a call's inputs; what of them is the last call's."""
        demands_same = self._take_demands(tuple(models))
        listed = tuple(nodes)
        nodes_same = listed == self.listed
        refaced = set() if nodes_same else self._take_nodes(listed)
        current_same = self._take_current(current) and demands_same
        old_usage, usage_same = self.usage, usage == self.usage
        self.usage = dict(usage)
        return Sameness(nodes_same, refaced, current_same, old_usage, usage_same)

    def _take_demands(self, given: tuple[ModelDemand, ...]) -> bool:
        """Take this call's demands, in the planner's order; whether they are the last's."""
        if given == self.given:
            self.given = given  # (equal copies: compared by identity from now on)
            return True
        order = sorted(given, key=planner_order)
        if len({d.key for d in order}) != len(order):
            raise ValueError("model keys must be unique")
        self.given, self.order = given, order
        self.selectors = {d.selector for d in order}
        self.overheads = tuple(sorted({d.overhead_cpu_milli for d in order}))
        self.rank = {d.key: i for i, d in enumerate(order)}
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
            by_name = self.by_name
            cordoned = set(self.cordoned)
            for one in refaced:
                f = by_name[one] = listed[self._position[one]]
                (cordoned.add if not f.schedulable else cordoned.discard)(one)
            self.cordoned = frozenset(cordoned)
            self.listed = listed
            return refaced
        by_name = {f.name: f for f in listed}
        if len(by_name) != len(listed):
            seen: set[str] = set()
            for f in listed:
                if f.name in seen:
                    raise ValueError(f"node {f.name} is listed twice")
                seen.add(f.name)
        self.listed, self.by_name = listed, by_name
        self._position = {f.name: i for i, f in enumerate(listed)}
        self.cordoned = frozenset(name for name, f in by_name.items() if not f.schedulable)
        return None

    def _refaced(self, listed: tuple[NodeFacts, ...]) -> set[str] | None:
        """The names of the nodes whose facts object changed, when the list is
        otherwise the last one (same names in the same order, few changed)."""
        old = self.listed
        if len(listed) != len(old) or not old:
            return None
        changed = list(compress(range(len(listed)), map(is_not, listed, old)))
        if len(changed) * 8 > len(listed) or any(listed[i].name != old[i].name for i in changed):
            return None
        return {listed[i].name for i in changed}
