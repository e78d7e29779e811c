"""The node index, eligibility, and the one definition of "fits".

A *view* is the set of nodes one node selector matches (one view for "no
selector", one per distinct broad selector); within a view, nodes with the same
taints form a *taint class*, which keeps its usable nodes in sorted fit lists
(`ByOccupancy`), one pair per distinct sidecar CPU overhead. A selector that
matches few nodes gets no view: its nodes are searched directly.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from itertools import islice
from operator import attrgetter, itemgetter

from localmodel.api import Toleration, TolerationOperator
from localmodel.facts import NodeFacts, Taint
from localmodel.planner.cpus import CpuLimit, cpu_limit
from localmodel.planner.fit import MIN, ByOccupancy, Entry, SortedEntries
from localmodel.planner.model import ModelDemand, PlannerSettings, Usage
from localmodel.planner.text import gib, need_cpu_text, taint_text

Selector = tuple[tuple[str, str], ...]
Signature = tuple[Selector, tuple[Toleration, ...]]
Verdict = tuple[Taint | None, int]  # (first untolerated hard taint, PreferNoSchedule count)


class RejectKind(Enum):
    """Why a node cannot take a replica, in the order checks (and messages) use.
    The first three are static: they hold whatever else is placed."""

    UNSCHEDULABLE = "unschedulable"
    SELECTOR = "selector"
    TAINT = "taint"
    REPLICA = "replica"
    SCHEDULER = "scheduler"
    EXCLUSIVE = "exclusive"
    SHARED = "shared"
    CPU = "cpu"
    MEMORY = "memory"

    @property
    def rank(self) -> int:
        return _KIND_ORDER.index(self)

    @property
    def static(self) -> bool:
        return self.rank <= RejectKind.TAINT.rank


_KIND_ORDER = tuple(RejectKind)


@dataclass(frozen=True, slots=True)
class Category:
    """A kind of rejection; taint rejections are counted per taint."""

    kind: RejectKind
    taint: Taint | None = None

    @property
    def sort_key(self) -> tuple[int, str]:
        return self.kind.rank, taint_text(self.taint) if self.taint is not None else ""


UNSCHEDULABLE = Category(RejectKind.UNSCHEDULABLE)
SELECTOR = Category(RejectKind.SELECTOR)
REPLICA = Category(RejectKind.REPLICA)
SCHEDULER = Category(RejectKind.SCHEDULER)
EXCLUSIVE = Category(RejectKind.EXCLUSIVE)
SHARED = Category(RejectKind.SHARED)
CPU = Category(RejectKind.CPU)
MEMORY = Category(RejectKind.MEMORY)

Rejected = tuple[Category, str]  # (category, the reason in words)


def tolerates(toleration: Toleration, taint: Taint) -> bool:
    """Whether a (validated) toleration tolerates a taint, as Kubernetes matches:
    an empty key with ``Exists`` matches every key, no effect every effect, and
    ``Equal`` compares values (a missing value is the empty string)."""
    if toleration.effect and toleration.effect != taint.effect:
        return False
    if toleration.key and toleration.key != taint.key:
        return False
    return (
        toleration.operator is TolerationOperator.EXISTS or (toleration.value or "") == taint.value
    )


def signature(d: ModelDemand) -> Signature:
    return d.selector, d.tolerations


@dataclass(eq=False, slots=True)
class TaintClass:
    """The nodes of one view with the same taints: they look the same to every
    demand that may use the view. ``fits`` holds their usable nodes per sidecar
    CPU overhead, sorted by (whole CPUs free for the engine, free memory, name)."""

    index: int
    taints: tuple[Taint, ...]
    fits: dict[int, ByOccupancy] = field(default_factory=dict)


@dataclass(eq=False, slots=True)
class Node:
    """Keeps one node's room as the planner places: free CPU and memory, occupants, exclusive
    holder and where it is indexed."""

    name: str
    labels: Mapping[str, str]
    taints: tuple[Taint, ...]
    schedulable: bool
    free_cpu_milli: int
    free_memory: int
    cpu_limit: CpuLimit  # what a process there may run on (`cpus.cpu_limit`)
    occupants: dict[str, int] = field(default_factory=dict)  # model -> replica
    exclusive_holder: str | None = None
    classes: list[TaintClass] = field(default_factory=list)  # one per view it is in
    # Where it is indexed: the fit lists, and its entry in each (two lists,
    # not a list of pairs: one tuple fewer per list for the collector to visit).
    indexed: list[SortedEntries] = field(default_factory=list)
    indexed_entries: list[Entry] = field(default_factory=list)

    def free_cpus(self, overhead: int) -> int:
        """Whole CPUs left for an engine whose sidecars take ``overhead`` milli."""
        return (self.free_cpu_milli - overhead) // 1000

    def entry(self, overhead: int) -> Entry:
        # (free_cpus(overhead), written out: this runs for every node and list)
        return ((self.free_cpu_milli - overhead) // 1000, self.free_memory, self.name)


@dataclass(frozen=True, slots=True)
class Eligibility:
    """The nodes a (selector, tolerations) pair may use: the classes of its view
    with their PreferNoSchedule penalty, or a short list of nodes."""

    classes: tuple[tuple[int, TaintClass], ...] = ()
    direct: tuple[tuple[int, Node], ...] | None = None


class TaintVerdicts:
    """Decides whether tolerations let a demand onto a node with these taints,
    and keeps each verdict, keyed on (taints, tolerations): many nodes share
    their taints, many demands their tolerations."""

    def __init__(self) -> None:
        self._seen: dict[tuple[tuple[Taint, ...], tuple[Toleration, ...]], Verdict] = {}

    def __call__(self, taints: tuple[Taint, ...], tolerations: tuple[Toleration, ...]) -> Verdict:
        """(first untolerated hard taint or None, untolerated PreferNoSchedule count)."""
        key = (taints, tolerations)
        cached = self._seen.get(key)
        if cached is not None:
            return cached
        blocking: Taint | None = None
        penalty = 0
        for t in taints:
            if any(tolerates(tol, t) for tol in tolerations):
                continue
            if t.effect == "PreferNoSchedule":
                penalty += 1
            elif blocking is None:  # NoSchedule, NoExecute (and anything unknown)
                blocking = t
        self._seen[key] = (blocking, penalty)
        return blocking, penalty


class NodeIndex:
    """Keeps every node with what is free on it, indexed for the demands at
    hand: views by node selector, taint classes, sorted fit lists."""

    def __init__(
        self,
        models: Sequence[ModelDemand],
        nodes: Sequence[NodeFacts],
        usage: Mapping[str, Usage],
        settings: PlannerSettings,
    ) -> None:
        self.settings = settings
        self.nodes: dict[str, Node] = {}
        # Nodes with the same taints share one sorted tuple (most have none).
        sorted_taints: dict[tuple[Taint, ...], tuple[Taint, ...]] = {}
        none = Usage()
        for f in sorted(nodes, key=attrgetter("name")):
            if f.name in self.nodes:
                raise ValueError(f"node {f.name} is listed twice")
            used = usage.get(f.name, none)
            taints = sorted_taints.get(f.taints)
            if taints is None:
                taints = sorted_taints[f.taints] = _sorted_taints(f.taints)
            self.nodes[f.name] = Node(
                name=f.name,
                labels=f.labels,
                taints=taints,
                schedulable=f.schedulable,
                free_cpu_milli=f.allocatable_cpu_milli - used.cpu_milli,
                free_memory=f.allocatable_memory_bytes - used.memory_bytes,
                cpu_limit=cpu_limit(f),
            )
        self.schedulable = [node for node in self.nodes.values() if node.schedulable]
        self.unschedulable = [name for name, node in self.nodes.items() if not node.schedulable]
        self.overheads = sorted({d.overhead_cpu_milli for d in models})
        self.verdict = TaintVerdicts()
        self._eligibility: dict[Signature, Eligibility] = {}
        self._build({d.selector for d in models})

    def _build(self, selectors: set[Selector]) -> None:
        """Views: one index for all nodes and one per broad node selector, each
        split into classes by taints, with per-overhead sorted fit lists."""
        keys = {k for selector in selectors for k, _ in selector}
        self.postings: dict[tuple[str, str], list[str]] = {}  # label -> nodes, by name
        for node in self.nodes.values():
            for k in keys:
                v = node.labels.get(k)
                if v is not None:
                    self.postings.setdefault((k, v), []).append(node.name)

        self.keys = keys
        self.views: dict[Selector, list[TaintClass]] = {}
        self._by_taints: dict[Selector, dict[tuple[Taint, ...], TaintClass]] = {}
        for selector in sorted(selectors):
            if selector:
                members = self.members(selector)
                if len(members) <= self.settings.direct_search:
                    continue
                in_view = [self.nodes[n] for n in sorted(members)]
            else:
                in_view = list(self.nodes.values())
            by_taints: dict[tuple[Taint, ...], TaintClass] = {}
            for node in in_view:
                if not node.schedulable:
                    continue
                cls = by_taints.get(node.taints)
                if cls is None:
                    cls = by_taints[node.taints] = self._new_class(len(by_taints), node.taints)
                node.classes.append(cls)
            self.views[selector] = list(by_taints.values())
            self._by_taints[selector] = by_taints
        self._fill()

    def _new_class(self, number: int, taints: tuple[Taint, ...]) -> TaintClass:
        """A view's new taint class, with an empty pair of fit lists per overhead."""
        chunk = self.settings.chunk_size
        fits = {o: ByOccupancy(SortedEntries(chunk), SortedEntries(chunk)) for o in self.overheads}
        return TaintClass(number, taints, fits)

    def _fill(self) -> None:
        """Index every usable node of a fresh index (nothing placed yet: every
        node is empty). Per overhead, the nodes' entries are sorted once and
        dealt out in order to the classes each node is in, so every list is
        built sorted instead of sorted alone (a node is in a list per view it
        is in). The nodes come by name; sorted by free memory (stable: then by
        name), each overhead's entries need only a stable sort by free CPUs,
        which compares plain integers instead of tuples."""
        by_memory = sorted(
            (node for node in self.nodes.values() if node.classes), key=attrgetter("free_memory")
        )
        nodes = self.nodes
        for overhead in self.overheads:
            dealt: dict[TaintClass, tuple[list[Entry], SortedEntries]] = {
                cls: ([], cls.fits[overhead].empty)
                for classes in self.views.values()
                for cls in classes
            }
            entries = sorted([node.entry(overhead) for node in by_memory], key=itemgetter(0))
            # (Entries without a whole CPU left: no demand can use them.)
            for entry in islice(entries, bisect_left(entries, (1, MIN, "")), None):
                node = nodes[entry[2]]
                for cls in node.classes:
                    to, into = dealt[cls]
                    to.append(entry)
                    node.indexed.append(into)
                    node.indexed_entries.append(entry)
            for to, into in dealt.values():
                into.load(to)

    def index(self, node: Node) -> None:
        if node.exclusive_holder is not None:
            return
        for overhead in self.overheads:
            entry = node.entry(overhead)
            if entry[0] < 1:  # no demand can use it
                continue
            for cls in node.classes:
                empty, shared = cls.fits[overhead]
                entries = shared if node.occupants else empty
                entries.add(entry)
                node.indexed.append(entries)
                node.indexed_entries.append(entry)

    def unindex(self, node: Node) -> None:
        for entries, entry in zip(node.indexed, node.indexed_entries, strict=True):
            entries.remove(entry)
        node.indexed.clear()
        node.indexed_entries.clear()

    # ------------------------------------------------------- across passes

    def views_hold(self, selectors: set[Selector]) -> bool:
        """Whether this index has exactly the views ``selectors`` would get
        (after label changes, a selector may cross the direct-search size)."""
        for selector in selectors:
            if selector and (len(self.members(selector)) > self.settings.direct_search) != (
                selector in self.views
            ):
                return False
        return True

    def reset(self, node: Node, facts: NodeFacts, used: Usage) -> None:
        """Put an (unindexed) node back to what its facts and other pods' usage
        leave free, with none of our models on it; new labels or taints move it
        between views and classes. The caller indexes it again."""
        taints = _sorted_taints(facts.taints)
        if facts.labels != node.labels or taints != node.taints:
            self._relabel(node, facts.labels, taints)
        node.free_cpu_milli = facts.allocatable_cpu_milli - used.cpu_milli
        node.free_memory = facts.allocatable_memory_bytes - used.memory_bytes
        node.cpu_limit = cpu_limit(facts)
        node.occupants.clear()
        node.exclusive_holder = None

    def _relabel(self, node: Node, labels: Mapping[str, str], taints: tuple[Taint, ...]) -> None:
        for k in self.keys:
            old, new = node.labels.get(k), labels.get(k)
            if old == new:
                continue
            if old is not None:
                names = self.postings[(k, old)]
                del names[bisect_left(names, node.name)]
            if new is not None:
                insort(self.postings.setdefault((k, new), []), node.name)
        node.labels, node.taints = labels, taints
        node.classes.clear()
        if node.schedulable:
            for selector, by_taints in self._by_taints.items():
                if any(labels.get(k) != v for k, v in selector):
                    continue
                cls = by_taints.get(taints)
                if cls is None:
                    cls = by_taints[taints] = self._new_class(len(by_taints), taints)
                    self.views[selector].append(cls)
                node.classes.append(cls)
        self._eligibility.clear()

    # ------------------------------------------------------------ eligibility

    def members(self, selector: Selector) -> frozenset[str]:
        """Nodes (schedulable or not) whose labels match every selector item."""
        lists = sorted((self.postings.get(item, []) for item in selector), key=len)
        members = frozenset(lists[0])
        for names in lists[1:]:
            members = members.intersection(names)
        return members

    def eligible(self, d: ModelDemand) -> Eligibility:
        sig = signature(d)
        found = self._eligibility.get(sig)
        if found is not None:
            return found
        selector, tolerations = sig
        if selector in self.views:
            classes = []
            for cls in self.views[selector]:
                blocking, penalty = self.verdict(cls.taints, tolerations)
                if blocking is None:
                    classes.append((penalty, cls))
            classes.sort(key=lambda pc: (pc[0], pc[1].index))
            found = Eligibility(classes=tuple(classes))
        else:  # a selector matching few nodes: no view, search them directly
            direct = []
            for name in sorted(self.members(selector)):
                node = self.nodes[name]
                if node.schedulable:
                    blocking, penalty = self.verdict(node.taints, tolerations)
                    if blocking is None:
                        direct.append((penalty, node))
            direct.sort(key=lambda pn: pn[0])  # stable: then by name
            found = Eligibility(direct=tuple(direct))
        self._eligibility[sig] = found
        return found

    # ------------------------------------------------------------- the checks
    # One definition of "fits": keeping, the direct search and every explanation
    # use these; the index is an accelerated form of the same test.

    def static_rejection(self, node: Node, d: ModelDemand) -> Rejected | None:
        """(category, reason) when the node can never take this model."""
        if not node.schedulable:
            return UNSCHEDULABLE, "unschedulable (cordoned)"
        for k, want in sorted(d.node_selector.items()):
            have = node.labels.get(k)
            if have != want:
                if have is None:
                    return SELECTOR, f"label {k} missing (nodeSelector wants {k}={want})"
                return SELECTOR, f"label {k}={have} does not match nodeSelector {k}={want}"
        blocking, _ = self.verdict(node.taints, d.tolerations)
        if blocking is not None:
            why = f"taint {taint_text(blocking)} not tolerated"
            return Category(RejectKind.TAINT, blocking), why
        return None

    def rejection(self, node: Node, d: ModelDemand) -> Rejected | None:
        return self.static_rejection(node, d) or dynamic_rejection(node, d)


def _sorted_taints(taints: Sequence[Taint]) -> tuple[Taint, ...]:
    """A node's distinct taints in one order (the key of its taint class)."""
    return tuple(sorted(set(taints), key=lambda t: (t.key, t.value, t.effect)))


def dynamic_rejection(node: Node, d: ModelDemand) -> Rejected | None:
    """(category, reason) when the node cannot take this model now."""
    if d.key in node.occupants:
        return REPLICA, f"already runs replica {node.occupants[d.key]} of this model"
    if node.name in d.avoid:
        return SCHEDULER, "the scheduler left this model's pod Unschedulable here"
    if node.exclusive_holder is not None:
        return EXCLUSIVE, f"holds exclusive model {node.exclusive_holder}"
    if d.exclusive and node.occupants:
        names = sorted(node.occupants)
        more = f" and {len(names) - 3} more" if len(names) > 3 else ""
        return SHARED, f"runs {', '.join(names[:3])}{more}; this model is exclusive"
    free = node.free_cpus(d.overhead_cpu_milli)
    if free < d.cpu.least:
        return CPU, f"too few free CPUs (need {need_cpu_text(d)}, free {max(free, 0)})"
    if node.free_memory < d.memory_bytes:
        return MEMORY, (
            f"too little free memory (need {gib(d.memory_bytes)}, "
            f"free {gib(max(node.free_memory, 0))})"
        )
    return None
