"""Why a replica fits nowhere, explained against the planner's final state.

Only reads the final state: capacity only shrinks while planning, so a replica
that fits nowhere at the end fit nowhere when it was tried, and the explanation
is the same when the plan is re-planned. Small clusters are checked node by
node; large ones are counted over sorted entries (a `Census`), with a bounded
sample of rejected nodes.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from localmodel.planner.census import Census
from localmodel.planner.fit import MIN, Entry
from localmodel.planner.index import (
    CPU,
    EXCLUSIVE,
    MEMORY,
    REPLICA,
    SCHEDULER,
    SHARED,
    Category,
    Node,
    NodeIndex,
    RejectKind,
    Selector,
    Signature,
    signature,
)
from localmodel.planner.model import ModelDemand, Unplaced, UnplacedReason
from localmodel.planner.text import demand_text, gib, need_cpu_text, taint_text


@dataclass(frozen=True, slots=True)
class _Explained:
    """Keeps one unplaced replica's explanation with what it was made from (demand, census and
    its version, held nodes): reused while they are the same."""

    demand: ModelDemand
    census: Census
    version: int
    held: frozenset[str]
    unplaced: Unplaced


@dataclass(slots=True)
class Findings:
    """Why nodes rejected one replica: counts per category, a sample, extremes."""

    counts: dict[Category, int] = field(default_factory=dict)
    examples: dict[Category, list[str]] = field(default_factory=dict)
    most_cpu: int | None = None  # most free CPUs among nodes rejected for CPU
    most_memory: int | None = None  # most free memory among nodes rejected for memory

    def add(self, category: Category, count: int) -> None:
        if count > 0:
            self.counts[category] = self.counts.get(category, 0) + count

    def sample(self, category: Category, names: list[str]) -> None:
        if names:
            self.examples.setdefault(category, []).extend(names)


class Explainer:
    """Explains unplaced replicas; one census per (selector, tolerations,
    overhead), kept (``update``) while the planner that owns it lives."""

    def __init__(self, index: NodeIndex) -> None:
        self.index = index
        self.held: Mapping[str, Collection[str]] = {}  # model -> nodes its replicas are on
        self.k = index.settings.examples_per_category
        self._censuses: dict[tuple[Signature, int], Census] = {}
        self._used: set[tuple[Signature, int]] = set()
        # Where a node's change can matter: censuses without a selector, and
        # selector censuses by their first item (a node they count has it).
        self._broad: list[Census] = []
        self._by_item: dict[tuple[str, str], list[Census]] = {}
        # (model, replica) -> the explanation, and what it was read from: the
        # demand, its census at a version, and the nodes its replicas are on.
        self._explained: dict[tuple[str, int], _Explained] = {}
        self._explained_now: set[tuple[str, int]] = set()
        # A selector's nodes by name, for the censuses of one call (its
        # censuses for other tolerations or overheads count the same nodes).
        self._members: dict[Selector, list[Node]] = {}

    def update(self, node: Node, relabelled: bool = False) -> None:
        """A node's state or facts changed: recount it in the censuses that count
        it (every census when its labels changed: it may join or leave one)."""
        index, k = self.index, self.k
        if relabelled:
            for census in self._censuses.values():
                census.update(index, node, k)
            return
        for census in self._broad:
            census.update(index, node, k)
        by_item = self._by_item
        if by_item:
            for item in node.labels.items():
                for census in by_item.get(item, ()):
                    census.update(index, node, k)

    def _route(self, census: Census) -> None:
        if census.selector:
            self._by_item.setdefault(census.selector[0], []).append(census)
        else:
            self._broad.append(census)

    def forget_unused(self) -> None:
        """Drop the censuses no replica needed since the last call (keeping them
        would cost an update per changed node for nothing)."""
        self._members = {}  # (labels may change before the next call)
        if len(self._used) < len(self._censuses):
            self._censuses = {key: c for key, c in self._censuses.items() if key in self._used}
            self._broad, self._by_item = [], {}
            for census in self._censuses.values():
                self._route(census)
        self._used = set()
        if len(self._explained_now) < len(self._explained):
            self._explained = {
                key: e for key, e in self._explained.items() if key in self._explained_now
            }
        self._explained_now = set()

    def explain(self, d: ModelDemand, replica: int) -> Unplaced:
        settings, nodes = self.index.settings, self.index.nodes
        total = len(nodes)
        head = f"no node for replica {replica} ({demand_text(d)})"
        if total == 0:
            message = f"{head}: there are no nodes"
            return Unplaced(d.key, replica, UnplacedReason.NO_NODES, message, MappingProxyType({}))
        if total <= settings.max_rejections:
            findings, rejections = self._findings_direct(d)
        else:
            census = self._census(d)
            held = frozenset(self.held.get(d.key, ()))
            memo_key = (d.key, replica)
            self._explained_now.add(memo_key)
            found = self._explained.get(memo_key)
            if (
                found is not None
                and found.demand is d
                and found.census is census
                and found.version == census.version
                and found.held == held
            ):
                return found.unplaced
            explained = self._explain_counted(d, replica, head, total)
            self._explained[memo_key] = _Explained(d, census, census.version, held, explained)
            return explained
        return self._worded(d, replica, head, total, findings, rejections)

    def _explain_counted(self, d: ModelDemand, replica: int, head: str, total: int) -> Unplaced:
        nodes = self.index.nodes
        findings = self._findings_counted(d)
        sample = {
            name: self.index.rejection(nodes[name], d)
            for names in findings.examples.values()
            for name in names
        }
        rejections = {n: r[1] for n, r in sorted(sample.items()) if r is not None}
        return self._worded(d, replica, head, total, findings, rejections)

    def _worded(
        self,
        d: ModelDemand,
        replica: int,
        head: str,
        total: int,
        findings: Findings,
        rejections: dict[str, str],
    ) -> Unplaced:
        settings = self.index.settings
        if total <= settings.list_nodes:
            message = f"{head}: " + "; ".join(f"{n}: {why}" for n, why in rejections.items())
        else:
            counted = sorted(findings.counts.items(), key=lambda cn: (-cn[1], cn[0].sort_key))
            parts = ", ".join(_phrase(c, n, d, findings) for c, n in counted)
            rejected = "1 node" if total == 1 else f"{total} nodes"
            message = f"{head}: {rejected} rejected: {parts}"
        static = all(c.kind.static for c in findings.counts)
        reason = UnplacedReason.NO_MATCHING_NODE if static else UnplacedReason.NO_FEASIBLE_NODE
        return Unplaced(d.key, replica, reason, message, MappingProxyType(rejections))

    def _findings_direct(self, d: ModelDemand) -> tuple[Findings, dict[str, str]]:
        """Check every node (small clusters)."""
        findings = Findings()
        rejections: dict[str, str] = {}
        for node in self.index.nodes.values():
            rejected = self.index.rejection(node, d)
            if rejected is None:  # cannot happen: the replica would have been placed
                continue
            category, why = rejected
            findings.add(category, 1)
            findings.sample(category, [node.name])
            rejections[node.name] = why
            if category == CPU:
                free = node.free_cpus(d.overhead_cpu_milli)
                findings.most_cpu = max(findings.most_cpu or MIN, free)
            elif category == MEMORY:
                findings.most_memory = max(findings.most_memory or MIN, node.free_memory)
        return findings, rejections

    def _census(self, d: ModelDemand) -> Census:
        """The final state split the way ``NodeIndex.rejection`` would split it,
        once per (selector, tolerations, overhead)."""
        sig = signature(d)
        key = (sig, d.overhead_cpu_milli)
        self._used.add(key)
        found = self._censuses.get(key)
        if found is not None:
            return found
        index = self.index
        census = Census(sig[0], sig[1], d.overhead_cpu_milli)
        # By name; a selector's census looks at the nodes it matches only.
        if sig[0]:
            members = self._members.get(sig[0])
            if members is None:
                nodes = index.nodes
                members = self._members[sig[0]] = [
                    nodes[name] for name in sorted(index.members(sig[0]))
                ]
            census.fill(index, members)
        else:
            census.fill(index, index.nodes.values())
        census.selector_examples = census._selector_examples(index, self.k)
        self._censuses[key] = census
        self._route(census)
        return census

    def _findings_counted(self, d: ModelDemand) -> Findings:
        """The categories of ``_findings_direct``, counted over a census in about
        one bisect per distinct CPU count instead of one check per node."""
        census, nodes, k = self._census(d), self.index.nodes, self.k
        findings = Findings(*census.static(self.index, k))
        own = sorted(n for n in set(self.held.get(d.key, ())) if n in census.eligible)
        findings.add(REPLICA, len(own))
        findings.sample(REPLICA, own[:k])
        avoided = sorted(n for n in d.avoid if n in census.eligible and n not in own)
        findings.add(SCHEDULER, len(avoided))
        findings.sample(SCHEDULER, avoided[:k])
        # An exclusive model's own nodes are held by it and count as "replica";
        # a non-exclusive model's own nodes sit among the shared entries.
        own_held = {n for n in own if nodes[n].exclusive_holder is not None}
        own_shared = [nodes[n].entry(d.overhead_cpu_milli) for n in own if n not in own_held]
        findings.add(EXCLUSIVE, len(census.exclusive) - len(own_held))
        findings.sample(
            EXCLUSIVE, [n for n in census.exclusive[: k + len(own_held)] if n not in own_held][:k]
        )
        need = d.cpu.least
        if d.exclusive:
            findings.add(SHARED, len(census.shared))
            findings.sample(SHARED, census.shared_names[:k])
            self._count_resources(census.empty, need, d.memory_bytes, [], findings)
        else:
            self._count_resources(census.empty, need, d.memory_bytes, [], findings)
            self._count_resources(census.shared, need, d.memory_bytes, own_shared, findings)
        overhead = d.overhead_cpu_milli
        for category in (CPU, MEMORY):  # keep the k closest to fitting
            if category in findings.examples:
                rejected = [nodes[n] for n in findings.examples[category]]
                if category == CPU:
                    rejected.sort(key=lambda n: (-n.free_cpus(overhead), -n.free_memory, n.name))
                else:
                    rejected.sort(key=lambda n: (-n.free_memory, -n.free_cpus(overhead), n.name))
                findings.examples[category] = [n.name for n in rejected[:k]]
        return findings

    def _sample_below(self, entries: list[Entry], lo: int, hi: int, skip: set[str]) -> list[Entry]:
        """Up to k entries of entries[lo:hi], from the top down, leaving out ``skip``."""
        out: list[Entry] = []
        i = hi - 1
        while i >= lo and len(out) < self.k:
            if entries[i][2] not in skip:
                out.append(entries[i])
            i -= 1
        return out

    def _count_resources(
        self, entries: list[Entry], need: int, memory: int, own: list[Entry], findings: Findings
    ) -> None:
        """Count entries with too few CPUs, then (with enough CPUs) too little memory,
        leaving out this model's own nodes (``own``); sample those closest to fitting."""
        skip = {e[2] for e in own}
        split = bisect_left(entries, (need, MIN, ""))
        findings.add(CPU, split - sum(1 for e in own if e[0] < need))
        too_few = self._sample_below(entries, 0, split, skip)
        if too_few:
            findings.most_cpu = max(findings.most_cpu or MIN, too_few[0][0])
            findings.sample(CPU, [e[2] for e in too_few])
        short = 0
        samples: list[Entry] = []
        i, n = split, len(entries)
        while i < n:
            cpus = entries[i][0]
            j = bisect_left(entries, (cpus, memory, ""), i)
            short += j - i
            samples.extend(self._sample_below(entries, i, j, skip))
            i = bisect_left(entries, (cpus + 1, MIN, ""), j)
        findings.add(MEMORY, short - sum(1 for e in own if e[0] >= need and e[1] < memory))
        if samples:
            findings.most_memory = max(findings.most_memory or MIN, max(e[1] for e in samples))
            findings.sample(MEMORY, [e[2] for e in samples])


def _phrase(category: Category, n: int, d: ModelDemand, findings: Findings) -> str:
    kind = category.kind
    if kind is RejectKind.UNSCHEDULABLE:
        return f"{n} unschedulable"
    if kind is RejectKind.SELECTOR:
        wanted = ",".join(f"{k}={v}" for k, v in sorted(d.node_selector.items()))
        return f"{n} not matching nodeSelector {wanted}"
    if kind is RejectKind.TAINT:
        assert category.taint is not None
        return f"{n} with taint {taint_text(category.taint)} not tolerated"
    if kind is RejectKind.REPLICA:
        return f"{n} already running a replica of this model"
    if kind is RejectKind.SCHEDULER:
        return f"{n} where the scheduler left this model's pod Unschedulable"
    if kind is RejectKind.EXCLUSIVE:
        return f"{n} already holding an exclusive model"
    if kind is RejectKind.SHARED:
        return f"{n} running other models (this model is exclusive)"
    if kind is RejectKind.CPU:
        most = max(findings.most_cpu or 0, 0)
        return f"{n} with too few free CPUs (need {need_cpu_text(d)}, most free {most})"
    most_memory = gib(max(findings.most_memory or 0, 0))
    return f"{n} with too little free memory (need {gib(d.memory_bytes)}, most free {most_memory})"
