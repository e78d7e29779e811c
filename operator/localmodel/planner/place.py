"""Keep, then place: the greedy pass over the index (see the package docstring)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from localmodel.facts import NodeFacts
from localmodel.planner.explain import Explainer
from localmodel.planner.fit import first_fit, largest_fit
from localmodel.planner.index import Node, NodeIndex, dynamic_rejection
from localmodel.planner.model import (
    DEFAULT_SETTINGS,
    Assignment,
    ModelDemand,
    Plan,
    PlannerSettings,
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
    return _Planner(models, nodes, current or {}, usage or {}, settings).run()


def _order(d: ModelDemand) -> tuple[bool, str]:
    # Fixed CPU counts first: a cpu: node demand takes what is left on its node.
    return d.cpu is None, d.key


class _Planner:
    def __init__(
        self,
        models: Sequence[ModelDemand],
        nodes: Sequence[NodeFacts],
        current: Mapping[str, Sequence[str | None]],
        usage: Mapping[str, Usage],
        settings: PlannerSettings,
    ) -> None:
        self.models = sorted(models, key=_order)
        if len({d.key for d in self.models}) != len(self.models):
            raise ValueError("model keys must be unique")
        self.current = current
        self.index = NodeIndex(self.models, nodes, usage, settings)
        self.placements: list[Assignment] = []
        self.held: dict[str, list[str]] = {d.key: [] for d in self.models}  # model -> nodes

    def run(self) -> Plan:
        nodes = self.index.nodes
        pending: list[tuple[ModelDemand, int, str]] = []  # (model, replica, why it moves)
        for d in self.models:
            was = self.current.get(d.key, ())
            for r in range(d.replicas):
                name = was[r] if r < len(was) else None
                if name is None:
                    pending.append((d, r, ""))
                    continue
                node = nodes.get(name)
                if node is None:
                    pending.append((d, r, f"was on {name}: node is gone"))
                    continue
                rejected = self.index.rejection(node, d)
                if rejected is not None:
                    pending.append((d, r, f"was on {name}: {rejected[1]}"))
                    continue
                self._place(node, d, r, f"kept: already on {name} and still fits")

        unplaced: list[tuple[ModelDemand, int]] = []
        for d, r, moved in pending:
            best = self._best(d)
            if best is None:
                unplaced.append((d, r))
                continue
            penalty, node = best
            self._place(node, d, r, _chosen_reason(d, node, penalty, moved))

        explainer = Explainer(self.index, self.held)
        return Plan(
            placements=tuple(sorted(self.placements, key=lambda p: (p.model, p.replica))),
            unplaced=tuple(
                explainer.explain(d, r)
                for d, r in sorted(unplaced, key=lambda dr: (dr[0].key, dr[1]))
            ),
        )

    def _place(self, node: Node, d: ModelDemand, replica: int, reason: str) -> None:
        cpu = node.free_cpus(d.overhead_cpu_milli) if d.cpu is None else d.cpu
        self.index.unindex(node)
        node.free_cpu_milli -= cpu * 1000 + d.overhead_cpu_milli
        node.free_memory -= d.memory_bytes
        node.occupants[d.key] = replica
        if d.exclusive:
            node.exclusive_holder = d.key
        self.index.index(node)
        self.held[d.key].append(node.name)
        self.placements.append(Assignment(d.key, replica, node.name, cpu, d.memory_bytes, reason))

    def _best(self, d: ModelDemand) -> tuple[int, Node] | None:
        """The best node for one more replica of ``d`` (with its penalty), or None."""
        elig = self.index.eligible(d)
        overhead, memory = d.overhead_cpu_milli, d.memory_bytes
        if elig.direct is not None:
            best: tuple[int, int, int, str] | None = None
            chosen: tuple[int, Node] | None = None
            for penalty, node in elig.direct:
                if best is not None and penalty > best[0]:
                    break
                if dynamic_rejection(node, d) is not None:
                    continue
                free = node.free_cpus(overhead)
                score = (penalty, free if d.cpu is not None else -free, node.free_memory, node.name)
                if best is None or score < best:
                    best, chosen = score, (penalty, node)
            return chosen

        key, nodes = d.key, self.index.nodes

        avoid = d.avoid

        def accept(name: str) -> bool:  # this model's other replicas stay apart
            return key not in nodes[name].occupants and name not in avoid

        best_score: tuple[int, int, int, str] | None = None
        for penalty, cls in elig.classes:
            if best_score is not None and penalty > best_score[0]:
                break
            empty, shared = cls.fits[overhead]
            for entries in (empty,) if d.exclusive else (empty, shared):
                if d.cpu is None:
                    entry = largest_fit(entries, memory, accept)
                else:
                    entry = first_fit(entries, d.cpu, memory, accept)
                if entry is None:
                    continue
                cpus = entry[0] if d.cpu is not None else -entry[0]
                score = (penalty, cpus, entry[1], entry[2])
                if best_score is None or score < best_score:
                    best_score = score
        if best_score is None:
            return None
        return best_score[0], nodes[best_score[3]]


def _chosen_reason(d: ModelDemand, node: Node, penalty: int, moved: str) -> str:
    free = node.free_cpus(d.overhead_cpu_milli)
    if d.cpu is None:
        why = f"chosen: most free CPUs ({free}); cpu: node takes them all"
    else:
        why = f"chosen: best fit, fewest CPUs left over ({free - d.cpu} of {free} free)"
    if penalty:
        why += "; has an untolerated PreferNoSchedule taint, but no node without one fits"
    return f"{moved}; {why}" if moved else why
