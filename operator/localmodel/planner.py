"""Placement planner: which node runs each replica of each model.

Pure: ``plan(models, nodes, current, usage) -> Plan``. No clock, no environment,
no Kubernetes client; the same inputs, in any order, give the same plan.

Rules
-----
* A replica needs ``cpu`` whole CPUs (``cpu=None`` means "node": every free
  whole CPU of the chosen node, at least one) and ``memory_bytes``. Both must fit
  the node's allocatable resources minus ``usage`` (other pods' requests) minus
  what this plan already put there. Nothing is ever over-committed.
* An exclusive model never shares a node with any other of our models; a
  non-exclusive one may share with other non-exclusive ones. Replicas of one
  model are always on different nodes.
* Unschedulable nodes, nodes that miss a ``node_selector`` label and nodes with an
  untolerated ``NoSchedule``/``NoExecute`` taint are rejected. An untolerated
  ``PreferNoSchedule`` taint is only a penalty: such a node is used only when no
  node without the penalty fits.

Algorithm
---------
1. **Keep.** Models are processed in a fixed order: demands with a fixed CPU
   count first, then ``cpu: node`` demands (they take whatever CPU is left on a
   node, so they must come after everything else that shares it), each group by
   model key, then replica. Every existing placement (``current``) whose node
   still exists, is still eligible and still fits is kept, in that order.
2. **Place.** The remaining replicas, in the same order, are placed greedily on
   the best node (tie-break below). Nodes are indexed, not scanned. A *view* is
   the set of nodes one node selector matches (one view for "no selector", one
   per distinct broad selector); within a view, nodes with the same taints form
   a *class*, which keeps its usable nodes in two sorted lists of
   ``(whole CPUs free for the engine, free memory, name)``: nodes without our
   models, and nodes shared by non-exclusive models (a node held by an exclusive
   model leaves the index). A query bisects to the first entry with enough CPU,
   skips a CPU bucket's too-small-memory entries by bisecting again, and
   compares the few classes whose taints the demand tolerates. A selector that
   matches few nodes (a hostname, say) searches those nodes directly instead.
   The sorted lists are chunked so an update costs about sqrt(n), and there is
   one set of lists per distinct sidecar CPU overhead (usually one or two).
   Cost: about ``O(nodes * views + models * classes * log(nodes))``.
3. **Explain.** Each replica that fits nowhere is explained against the final
   state (it did not fit earlier either: capacity only shrinks while planning, so
   the explanation is true and identical when the plan is re-planned). Small
   clusters list every node; large ones are summarised by counting over the
   sorted lists, with a bounded sample of rejected nodes.

Tie-break
---------
For a fixed CPU count: **best fit** — the node with the fewest free whole CPUs
that still fit, then the least free memory, then the node name. For CPU inference
the engine gets exactly ``cpu`` threads, so spare cores on the chosen node are
wasted for it; packing keeps the large nodes whole for the large models (and for
``cpu: node`` models) instead of nibbling every node, and exclusive models
(the default) waste least when they take the smallest node that fits.
For ``cpu: node``: the node with the **most** free whole CPUs (the user asked
for a machine; more cores mean more threads), then the least free memory, then
the name. Before all that, fewer untolerated ``PreferNoSchedule`` taints win.

Stability: kept placements never move; a new model never moves an existing one.
Re-planning a plan's own output as ``current`` returns an equal plan (the kept
order puts ``cpu: node`` demands last, so they get the same CPU count again).
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from localmodel.facts import NodeFacts, Taint

__all__ = ["ModelDemand", "Placement", "Plan", "Toleration", "Unplaced", "Usage", "plan"]

# A selector matching at most this many nodes (a hostname, say) searches them
# one by one; broader selectors get their own index (a view).
_DIRECT_SEARCH = 128
# Up to this many nodes, an unplaced replica's rejections name every node.
_MAX_REJECTIONS = 50
# Up to this many nodes, the message lists every node instead of counting.
_LIST_NODES = 10
# Sample size per rejection category in large clusters.
_EXAMPLES_PER_CATEGORY = 5

_MIN = -(1 << 62)  # below any free memory or CPU count, for bisecting

Entry = tuple[int, int, str]  # (free whole CPUs, free memory bytes, node name)


# --------------------------------------------------------------------------- API


@dataclass(frozen=True)
class Toleration:
    """A pod toleration, matched like Kubernetes does.

    An empty (or None) key with ``Exists`` tolerates every taint; ``effect=None``
    matches every effect.
    """

    key: str | None
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str = ""
    effect: str | None = None

    def __post_init__(self) -> None:
        if self.operator not in ("Equal", "Exists"):
            raise ValueError(f"toleration operator must be Equal or Exists, not {self.operator!r}")
        if not self.key and self.operator != "Exists":
            raise ValueError("a toleration with an empty key must use operator Exists")
        if self.operator == "Exists" and self.value:
            raise ValueError("a toleration with operator Exists must not have a value")

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        return self.operator == "Exists" or self.value == taint.value


@dataclass(frozen=True)
class ModelDemand:
    """What one model asks for, per replica.

    ``cpu`` is a whole number of CPUs, or None for "node": all free whole
    allocatable CPUs of the chosen node (at least one).
    """

    key: str  # "namespace/name"
    replicas: int
    cpu: int | None
    memory_bytes: int
    exclusive: bool = True
    node_selector: Mapping[str, str] = field(default_factory=dict, hash=False)
    tolerations: tuple[Toleration, ...] = ()
    # milli-CPUs per replica on top of the engine's whole CPUs (sidecars such as
    # the gateway); must fit too, but is not part of ``Placement.cpu``.
    overhead_cpu_milli: int = 0

    def __post_init__(self) -> None:
        if self.replicas < 0:
            raise ValueError(f"{self.key}: replicas must be >= 0, not {self.replicas}")
        if self.cpu is not None and self.cpu < 1:
            raise ValueError(f"{self.key}: cpu must be a positive integer or None, not {self.cpu}")
        if self.memory_bytes < 0:
            raise ValueError(f"{self.key}: memory_bytes must be >= 0, not {self.memory_bytes}")
        if self.overhead_cpu_milli < 0:
            raise ValueError(f"{self.key}: overhead_cpu_milli must be >= 0")


@dataclass(frozen=True)
class Usage:
    """Resources already requested on a node by pods that are not ours."""

    cpu_milli: int = 0
    memory_bytes: int = 0


@dataclass(frozen=True)
class Placement:
    """One replica on one node. ``reason`` explains the choice and is not compared:
    two plans are equal when they make the same decisions."""

    model: str
    replica: int
    node: str
    cpu: int  # whole CPUs for the engine (overhead not included)
    memory_bytes: int
    reason: str = field(default="", compare=False)


@dataclass(frozen=True)
class Unplaced:
    """A replica no node can take: ``reason`` is CamelCase (for a condition),
    ``message`` is for people, ``rejections`` maps node -> why (every node in small
    clusters, a bounded sample per kind of rejection in large ones)."""

    model: str
    replica: int
    reason: str  # NoNodes | NoMatchingNode | NoFeasibleNode
    message: str
    rejections: Mapping[str, str] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class Plan:
    placements: tuple[Placement, ...] = ()
    unplaced: tuple[Unplaced, ...] = ()

    def placements_for(self, model: str) -> tuple[Placement, ...]:
        return tuple(p for p in self.placements if p.model == model)

    def unplaced_for(self, model: str) -> tuple[Unplaced, ...]:
        return tuple(u for u in self.unplaced if u.model == model)

    def on_node(self, node: str) -> tuple[Placement, ...]:
        return tuple(p for p in self.placements if p.node == node)

    def node_of(self, model: str, replica: int) -> str | None:
        for p in self.placements:
            if p.model == model and p.replica == replica:
                return p.node
        return None

    def as_current(self) -> dict[str, tuple[str | None, ...]]:
        """This plan in the shape ``plan(current=...)`` takes: model -> node per
        replica (None for an unplaced replica)."""
        size: dict[str, int] = {}
        for model, replica in [(p.model, p.replica) for p in self.placements] + [
            (u.model, u.replica) for u in self.unplaced
        ]:
            size[model] = max(size.get(model, 0), replica + 1)
        out: dict[str, list[str | None]] = {m: [None] * n for m, n in size.items()}
        for p in self.placements:
            out[p.model][p.replica] = p.node
        return {m: tuple(nodes) for m, nodes in sorted(out.items())}


def plan(
    models: Sequence[ModelDemand],
    nodes: Sequence[NodeFacts],
    current: Mapping[str, Sequence[str | None]] | None = None,
    usage: Mapping[str, Usage] | None = None,
) -> Plan:
    """Place every replica of every model, keeping existing placements that still
    fit. See the module docstring for the rules, the order and the tie-break."""
    return _Planner(models, nodes, current or {}, usage or {}).run()


# ---------------------------------------------------------------------- internals


def _gib(n: int) -> str:
    if abs(n) >= 1 << 30:
        return f"{n / (1 << 30):.1f} GiB"
    return f"{n / (1 << 20):.0f} MiB"


def _taint_text(t: Taint) -> str:
    return f"{t.key}={t.value}:{t.effect}" if t.value else f"{t.key}:{t.effect}"


def _need_cpu_text(d: ModelDemand) -> str:
    need = str(d.cpu) if d.cpu is not None else "1"
    if d.overhead_cpu_milli:
        return f"{need} whole after {d.overhead_cpu_milli}m for sidecars"
    return need


def _demand_text(d: ModelDemand) -> str:
    cpu = "cpu: node" if d.cpu is None else f"{d.cpu} CPU{'' if d.cpu == 1 else 's'}"
    if d.overhead_cpu_milli:
        cpu += f" + {d.overhead_cpu_milli}m"
    return f"{cpu}, {_gib(d.memory_bytes)}"


class _Sorted:
    """A sorted list of entries in chunks, so that adding or removing one costs
    about sqrt(n) instead of moving the whole list (what sortedcontainers does;
    not a dependency for 60 lines). Positions are global indices."""

    _LOAD = 512  # chunks are split at twice this

    __slots__ = ("_chunks", "_len", "_maxes", "_starts")

    def __init__(self) -> None:
        self._chunks: list[list[Entry]] = []
        self._maxes: list[Entry] = []  # last entry of each chunk
        self._starts: list[int] = []  # global index of each chunk's first entry
        self._len = 0

    def append(self, entry: Entry) -> None:
        """Add in any order while building; ``freeze`` sorts."""
        if not self._chunks:
            self._chunks.append([])
        self._chunks[0].append(entry)
        self._len += 1

    def freeze(self) -> None:
        flat = sorted(e for chunk in self._chunks for e in chunk)
        self._chunks = [flat[i : i + self._LOAD] for i in range(0, len(flat), self._LOAD)]
        self._reindex()

    def _reindex(self) -> None:
        self._maxes = [chunk[-1] for chunk in self._chunks]
        self._starts = []
        total = 0
        for chunk in self._chunks:
            self._starts.append(total)
            total += len(chunk)
        self._len = total

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, i: int) -> Entry:
        c = bisect_right(self._starts, i) - 1
        return self._chunks[c][i - self._starts[c]]

    def bisect_left(self, key: Entry, lo: int = 0, hi: int | None = None) -> int:
        """The first index in [lo, hi] whose entry is >= key."""
        c = bisect_left(self._maxes, key)
        i = (
            self._len
            if c == len(self._chunks)
            else self._starts[c] + bisect_left(self._chunks[c], key)
        )
        return min(max(i, lo), self._len if hi is None else hi)

    def add(self, entry: Entry) -> None:
        if not self._chunks:
            self._chunks.append([entry])
            self._reindex()
            return
        c = min(bisect_left(self._maxes, entry), len(self._chunks) - 1)
        chunk = self._chunks[c]
        insort(chunk, entry)
        if len(chunk) > 2 * self._LOAD:
            self._chunks[c : c + 1] = [chunk[: self._LOAD], chunk[self._LOAD :]]
            self._reindex()
            return
        self._maxes[c] = chunk[-1]
        self._shift(c, 1)

    def remove(self, entry: Entry) -> None:
        c = bisect_left(self._maxes, entry)
        chunk = self._chunks[c]
        del chunk[bisect_left(chunk, entry)]
        if not chunk:
            del self._chunks[c]
            self._reindex()
            return
        self._maxes[c] = chunk[-1]
        self._shift(c, -1)

    def _shift(self, c: int, by: int) -> None:
        starts = self._starts
        for k in range(c + 1, len(starts)):
            starts[k] += by
        self._len += by


@dataclass(eq=False, slots=True)
class _Class:
    """The nodes of one view with the same taints: they look the same to every
    demand that may use the view.

    Per CPU overhead: (nodes without our models, nodes shared by non-exclusive
    models), each sorted by (whole CPUs free for the engine, free memory, name).
    """

    index: int
    taints: tuple[Taint, ...]
    pools: dict[int, tuple[_Sorted, _Sorted]] = field(default_factory=dict)


@dataclass(eq=False, slots=True)
class _Node:
    name: str
    labels: Mapping[str, str]
    taints: tuple[Taint, ...]
    schedulable: bool
    free_cpu_milli: int
    free_memory: int
    occupants: dict[str, int] = field(default_factory=dict)  # model -> replica
    exclusive_holder: str | None = None
    classes: list[_Class] = field(default_factory=list)  # one per view it is in
    indexed: list[tuple[_Sorted, Entry]] = field(default_factory=list)

    def free_cpus(self, overhead: int) -> int:
        """Whole CPUs left for an engine whose sidecars take ``overhead`` milli."""
        return (self.free_cpu_milli - overhead) // 1000

    def entry(self, overhead: int) -> Entry:
        return (self.free_cpus(overhead), self.free_memory, self.name)


@dataclass(frozen=True, slots=True)
class _Eligibility:
    """The nodes a (selector, tolerations) pair may use: the classes of its view
    with their PreferNoSchedule penalty, or a short list of nodes."""

    classes: tuple[tuple[int, _Class], ...] = ()
    direct: tuple[tuple[int, _Node], ...] | None = None


@dataclass(slots=True)
class _Pools:
    """The final state as one (selector, tolerations, overhead) sees it."""

    static_counts: dict[str, int]
    static_examples: dict[str, list[str]]
    eligible: set[str]
    exclusive: list[str]  # eligible nodes held by an exclusive model, by name
    empty: list[Entry]
    shared: list[Entry]


@dataclass(slots=True)
class _Findings:
    """Why nodes rejected one replica: counts per category, a sample, extremes."""

    counts: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[str]] = field(default_factory=dict)
    most_cpu: int | None = None  # most free CPUs among nodes rejected for CPU
    most_memory: int | None = None  # most free memory among nodes rejected for memory

    def add(self, category: str, count: int) -> None:
        if count > 0:
            self.counts[category] = self.counts.get(category, 0) + count

    def sample(self, category: str, names: list[str]) -> None:
        if names:
            self.examples.setdefault(category, []).extend(names)


Signature = tuple[tuple[tuple[str, str], ...], tuple[Toleration, ...]]
Verdict = tuple[Taint | None, int]


def _signature(d: ModelDemand) -> Signature:
    return tuple(sorted(d.node_selector.items())), d.tolerations


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
    ) -> None:
        self.models = sorted(models, key=_order)
        if len({d.key for d in self.models}) != len(self.models):
            raise ValueError("model keys must be unique")
        self.current = current
        self.nodes: dict[str, _Node] = {}
        for f in sorted(nodes, key=lambda f: f.name):
            if f.name in self.nodes:
                raise ValueError(f"node {f.name} is listed twice")
            used = usage.get(f.name, Usage())
            self.nodes[f.name] = _Node(
                name=f.name,
                labels=f.labels,
                taints=tuple(sorted(set(f.taints), key=lambda t: (t.key, t.value, t.effect))),
                schedulable=f.schedulable,
                free_cpu_milli=f.allocatable_cpu_milli - used.cpu_milli,
                free_memory=f.allocatable_memory_bytes - used.memory_bytes,
            )
        self.schedulable = [node for node in self.nodes.values() if node.schedulable]
        self.unschedulable = [name for name, node in self.nodes.items() if not node.schedulable]
        self.overheads = sorted({d.overhead_cpu_milli for d in self.models})
        self.placements: list[Placement] = []
        self.held: dict[str, list[str]] = {d.key: [] for d in self.models}  # model -> nodes
        self._verdicts: dict[tuple[tuple[Taint, ...], tuple[Toleration, ...]], Verdict] = {}
        self._eligibility: dict[Signature, _Eligibility] = {}
        self._pools: dict[tuple[Signature, int], _Pools] = {}
        self._build_index()

    # ----------------------------------------------------------------- index

    def _build_index(self) -> None:
        """Views: one index for all nodes and one per broad node selector, each
        split into classes by taints, with per-overhead sorted pools."""
        selectors = {tuple(sorted(d.node_selector.items())) for d in self.models}
        keys = {k for selector in selectors for k, _ in selector}
        self.postings: dict[tuple[str, str], list[str]] = {}  # label -> nodes, by name
        for node in self.nodes.values():
            for k in keys:
                v = node.labels.get(k)
                if v is not None:
                    self.postings.setdefault((k, v), []).append(node.name)

        self.views: dict[tuple[tuple[str, str], ...], list[_Class]] = {}
        for selector in sorted(selectors):
            if selector:
                members = self._members(selector)
                if len(members) <= _DIRECT_SEARCH:
                    continue
                in_view = [self.nodes[n] for n in sorted(members)]
            else:
                in_view = list(self.nodes.values())
            by_taints: dict[tuple[Taint, ...], _Class] = {}
            for node in in_view:
                if not node.schedulable:
                    continue
                cls = by_taints.get(node.taints)
                if cls is None:
                    cls = by_taints[node.taints] = _Class(len(by_taints), node.taints)
                    cls.pools = {o: (_Sorted(), _Sorted()) for o in self.overheads}
                node.classes.append(cls)
            self.views[selector] = list(by_taints.values())
        for node in self.nodes.values():
            self._index(node, keep_sorted=False)
        for classes in self.views.values():
            for cls in classes:
                for empty, shared in cls.pools.values():
                    empty.freeze()
                    shared.freeze()

    def _index(self, node: _Node, keep_sorted: bool = True) -> None:
        if node.exclusive_holder is not None:
            return
        for overhead in self.overheads:
            entry = node.entry(overhead)
            if entry[0] < 1:  # no demand can use it
                continue
            for cls in node.classes:
                empty, shared = cls.pools[overhead]
                pool = shared if node.occupants else empty
                if keep_sorted:
                    pool.add(entry)
                else:
                    pool.append(entry)
                node.indexed.append((pool, entry))

    def _unindex(self, node: _Node) -> None:
        for pool, entry in node.indexed:
            pool.remove(entry)
        node.indexed.clear()

    # ------------------------------------------------------------ eligibility

    def _verdict(self, taints: tuple[Taint, ...], tolerations: tuple[Toleration, ...]) -> Verdict:
        """(first untolerated hard taint or None, untolerated PreferNoSchedule count)."""
        key = (taints, tolerations)
        cached = self._verdicts.get(key)
        if cached is not None:
            return cached
        blocking: Taint | None = None
        penalty = 0
        for t in taints:
            if any(tol.tolerates(t) for tol in tolerations):
                continue
            if t.effect == "PreferNoSchedule":
                penalty += 1
            elif blocking is None:  # NoSchedule, NoExecute (and anything unknown)
                blocking = t
        self._verdicts[key] = (blocking, penalty)
        return blocking, penalty

    def _members(self, selector: tuple[tuple[str, str], ...]) -> frozenset[str]:
        """Nodes (schedulable or not) whose labels match every selector item."""
        lists = sorted((self.postings.get(item, []) for item in selector), key=len)
        members = frozenset(lists[0])
        for names in lists[1:]:
            members = members.intersection(names)
        return members

    def _eligible(self, d: ModelDemand) -> _Eligibility:
        sig = _signature(d)
        found = self._eligibility.get(sig)
        if found is not None:
            return found
        selector, tolerations = sig
        if selector in self.views:
            classes = []
            for cls in self.views[selector]:
                blocking, penalty = self._verdict(cls.taints, tolerations)
                if blocking is None:
                    classes.append((penalty, cls))
            classes.sort(key=lambda pc: (pc[0], pc[1].index))
            found = _Eligibility(classes=tuple(classes))
        else:  # a selector matching few nodes: no view, search them directly
            direct = []
            for name in sorted(self._members(selector)):
                node = self.nodes[name]
                if node.schedulable:
                    blocking, penalty = self._verdict(node.taints, tolerations)
                    if blocking is None:
                        direct.append((penalty, node))
            direct.sort(key=lambda pn: pn[0])  # stable: then by name
            found = _Eligibility(direct=tuple(direct))
        self._eligibility[sig] = found
        return found

    # ------------------------------------------------------------- the checks
    # One definition of "fits": keeping, the direct search and every explanation
    # use these; the index is an accelerated form of the same test.

    def _static_rejection(self, node: _Node, d: ModelDemand) -> tuple[str, str] | None:
        """(category, reason) when the node can never take this model."""
        if not node.schedulable:
            return "unschedulable", "unschedulable (cordoned)"
        for k, want in sorted(d.node_selector.items()):
            have = node.labels.get(k)
            if have != want:
                if have is None:
                    return "selector", f"label {k} missing (nodeSelector wants {k}={want})"
                return "selector", f"label {k}={have} does not match nodeSelector {k}={want}"
        blocking, _ = self._verdict(node.taints, d.tolerations)
        if blocking is not None:
            text = _taint_text(blocking)
            return f"taint {text}", f"taint {text} not tolerated"
        return None

    def _dynamic_rejection(self, node: _Node, d: ModelDemand) -> tuple[str, str] | None:
        """(category, reason) when the node cannot take this model now."""
        if d.key in node.occupants:
            return "replica", f"already runs replica {node.occupants[d.key]} of this model"
        if node.exclusive_holder is not None:
            return "exclusive", f"holds exclusive model {node.exclusive_holder}"
        if d.exclusive and node.occupants:
            names = sorted(node.occupants)
            more = f" and {len(names) - 3} more" if len(names) > 3 else ""
            return "shared", f"runs {', '.join(names[:3])}{more}; this model is exclusive"
        free = node.free_cpus(d.overhead_cpu_milli)
        if free < (d.cpu or 1):
            return "cpu", f"too few free CPUs (need {_need_cpu_text(d)}, free {max(free, 0)})"
        if node.free_memory < d.memory_bytes:
            return "memory", (
                f"too little free memory (need {_gib(d.memory_bytes)}, "
                f"free {_gib(max(node.free_memory, 0))})"
            )
        return None

    def _rejection(self, node: _Node, d: ModelDemand) -> tuple[str, str] | None:
        return self._static_rejection(node, d) or self._dynamic_rejection(node, d)

    # ---------------------------------------------------------------- placing

    def run(self) -> Plan:
        pending: list[tuple[ModelDemand, int, str]] = []  # (model, replica, why it moves)
        for d in self.models:
            was = self.current.get(d.key, ())
            for r in range(d.replicas):
                name = was[r] if r < len(was) else None
                if name is None:
                    pending.append((d, r, ""))
                    continue
                node = self.nodes.get(name)
                if node is None:
                    pending.append((d, r, f"was on {name}: node is gone"))
                    continue
                rejected = self._rejection(node, d)
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

        return Plan(
            placements=tuple(sorted(self.placements, key=lambda p: (p.model, p.replica))),
            unplaced=tuple(
                self._explain(d, r) for d, r in sorted(unplaced, key=lambda dr: (dr[0].key, dr[1]))
            ),
        )

    def _place(self, node: _Node, d: ModelDemand, replica: int, reason: str) -> None:
        cpu = node.free_cpus(d.overhead_cpu_milli) if d.cpu is None else d.cpu
        self._unindex(node)
        node.free_cpu_milli -= cpu * 1000 + d.overhead_cpu_milli
        node.free_memory -= d.memory_bytes
        node.occupants[d.key] = replica
        if d.exclusive:
            node.exclusive_holder = d.key
        self._index(node)
        self.held[d.key].append(node.name)
        self.placements.append(Placement(d.key, replica, node.name, cpu, d.memory_bytes, reason))

    def _best(self, d: ModelDemand) -> tuple[int, _Node] | None:
        """The best node for one more replica of ``d`` (with its penalty), or None."""
        elig = self._eligible(d)
        overhead, memory = d.overhead_cpu_milli, d.memory_bytes
        if elig.direct is not None:
            best: tuple[int, int, int, str] | None = None
            chosen: tuple[int, _Node] | None = None
            for penalty, node in elig.direct:
                if best is not None and penalty > best[0]:
                    break
                if self._dynamic_rejection(node, d) is not None:
                    continue
                free = node.free_cpus(overhead)
                score = (penalty, free if d.cpu is not None else -free, node.free_memory, node.name)
                if best is None or score < best:
                    best, chosen = score, (penalty, node)
            return chosen

        key, nodes = d.key, self.nodes

        def accept(name: str) -> bool:  # this model's other replicas stay apart
            return key not in nodes[name].occupants

        best_score: tuple[int, int, int, str] | None = None
        for penalty, cls in elig.classes:
            if best_score is not None and penalty > best_score[0]:
                break
            empty, shared = cls.pools[overhead]
            for pool in (empty,) if d.exclusive else (empty, shared):
                if d.cpu is None:
                    entry = _largest_fit(pool, memory, accept)
                else:
                    entry = _first_fit(pool, d.cpu, memory, accept)
                if entry is None:
                    continue
                cpus = entry[0] if d.cpu is not None else -entry[0]
                score = (penalty, cpus, entry[1], entry[2])
                if best_score is None or score < best_score:
                    best_score = score
        if best_score is None:
            return None
        return best_score[0], self.nodes[best_score[3]]

    # ------------------------------------------------------------- explaining

    def _explain(self, d: ModelDemand, replica: int) -> Unplaced:
        total = len(self.nodes)
        head = f"no node for replica {replica} ({_demand_text(d)})"
        if total == 0:
            message = f"{head}: there are no nodes"
            return Unplaced(d.key, replica, "NoNodes", message, MappingProxyType({}))
        if total <= _MAX_REJECTIONS:
            findings, rejections = self._findings_direct(d)
        else:
            findings = self._findings_counted(d)
            sample = {
                name: self._rejection(self.nodes[name], d)
                for names in findings.examples.values()
                for name in names
            }
            rejections = {n: r[1] for n, r in sorted(sample.items()) if r is not None}
        if total <= _LIST_NODES:
            message = f"{head}: " + "; ".join(f"{n}: {why}" for n, why in rejections.items())
        else:
            order = _ordered(findings.counts)
            counted = sorted(findings.counts.items(), key=lambda cn: (-cn[1], order.index(cn[0])))
            parts = ", ".join(_phrase(c, n, d, findings) for c, n in counted)
            nodes = "1 node" if total == 1 else f"{total} nodes"
            message = f"{head}: {nodes} rejected: {parts}"
        static = all(_rank(c) <= _rank("taint") for c in findings.counts)
        reason = "NoMatchingNode" if static else "NoFeasibleNode"
        return Unplaced(d.key, replica, reason, message, MappingProxyType(rejections))

    def _findings_direct(self, d: ModelDemand) -> tuple[_Findings, dict[str, str]]:
        """Check every node (small clusters)."""
        findings = _Findings()
        rejections: dict[str, str] = {}
        for node in self.nodes.values():
            rejected = self._rejection(node, d)
            if rejected is None:  # cannot happen: the replica would have been placed
                continue
            category, why = rejected
            findings.add(category, 1)
            findings.sample(category, [node.name])
            rejections[node.name] = why
            if category == "cpu":
                free = node.free_cpus(d.overhead_cpu_milli)
                findings.most_cpu = max(findings.most_cpu or _MIN, free)
            elif category == "memory":
                findings.most_memory = max(findings.most_memory or _MIN, node.free_memory)
        return findings, rejections

    def _pools_for(self, d: ModelDemand) -> _Pools:
        """The final state split the way ``_rejection`` would split it, once per
        (selector, tolerations, overhead)."""
        sig = _signature(d)
        found = self._pools.get((sig, d.overhead_cpu_milli))
        if found is not None:
            return found
        selector, tolerations = sig
        k = _EXAMPLES_PER_CATEGORY
        pools = _Pools({}, {}, set(), [], [], [])
        counts, examples = pools.static_counts, pools.static_examples
        if self.unschedulable:
            counts["unschedulable"] = len(self.unschedulable)
            examples["unschedulable"] = self.unschedulable[:k]
        schedulable = self.schedulable
        matching = schedulable
        if selector:
            members = self._members(selector)
            matching = [self.nodes[n] for n in sorted(members) if self.nodes[n].schedulable]
            if len(matching) < len(schedulable):
                counts["selector"] = len(schedulable) - len(matching)
                examples["selector"] = []
                for node in schedulable:
                    if node.name not in members:
                        examples["selector"].append(node.name)
                        if len(examples["selector"]) == k:
                            break
        for node in matching:
            blocking, _ = self._verdict(node.taints, tolerations)
            if blocking is not None:
                category = f"taint {_taint_text(blocking)}"
                counts[category] = counts.get(category, 0) + 1
                if len(examples.setdefault(category, [])) < k:
                    examples[category].append(node.name)
            elif node.exclusive_holder is not None:
                pools.eligible.add(node.name)
                pools.exclusive.append(node.name)
            else:
                pools.eligible.add(node.name)
                pool = pools.shared if node.occupants else pools.empty
                pool.append(node.entry(d.overhead_cpu_milli))
        pools.empty.sort()
        pools.shared.sort()
        self._pools[(sig, d.overhead_cpu_milli)] = pools
        return pools

    def _findings_counted(self, d: ModelDemand) -> _Findings:
        """The categories of ``_findings_direct``, counted over sorted pools in
        about one bisect per distinct CPU count instead of one check per node."""
        pools = self._pools_for(d)
        k = _EXAMPLES_PER_CATEGORY
        findings = _Findings(
            dict(pools.static_counts), {c: list(e) for c, e in pools.static_examples.items()}
        )
        own = sorted(n for n in set(self.held[d.key]) if n in pools.eligible)
        findings.add("replica", len(own))
        findings.sample("replica", own[:k])
        # An exclusive model's own nodes are held by it and count as "replica";
        # a non-exclusive model's own nodes sit in the shared pool.
        own_held = {n for n in own if self.nodes[n].exclusive_holder is not None}
        own_shared = [self.nodes[n].entry(d.overhead_cpu_milli) for n in own if n not in own_held]
        findings.add("exclusive", len(pools.exclusive) - len(own_held))
        findings.sample(
            "exclusive", [n for n in pools.exclusive[: k + len(own_held)] if n not in own_held][:k]
        )
        need = d.cpu or 1
        if d.exclusive:
            findings.add("shared", len(pools.shared))
            findings.sample("shared", heapq.nsmallest(k, (e[2] for e in pools.shared)))
            _count_resources(pools.empty, need, d.memory_bytes, [], findings)
        else:
            _count_resources(pools.empty, need, d.memory_bytes, [], findings)
            _count_resources(pools.shared, need, d.memory_bytes, own_shared, findings)
        overhead = d.overhead_cpu_milli
        for category in ("cpu", "memory"):  # keep the k closest to fitting
            if category in findings.examples:
                nodes = [self.nodes[n] for n in findings.examples[category]]
                if category == "cpu":
                    nodes.sort(key=lambda n: (-n.free_cpus(overhead), -n.free_memory, n.name))
                else:
                    nodes.sort(key=lambda n: (-n.free_memory, -n.free_cpus(overhead), n.name))
                findings.examples[category] = [n.name for n in nodes[:k]]
        return findings


def _chosen_reason(d: ModelDemand, node: _Node, penalty: int, moved: str) -> str:
    free = node.free_cpus(d.overhead_cpu_milli)
    if d.cpu is None:
        why = f"chosen: most free CPUs ({free}); cpu: node takes them all"
    else:
        why = f"chosen: best fit, fewest CPUs left over ({free - d.cpu} of {free} free)"
    if penalty:
        why += "; has an untolerated PreferNoSchedule taint, but no node without one fits"
    return f"{moved}; {why}" if moved else why


def _first_fit(pool: _Sorted, cpu: int, memory: int, accept: Callable[[str], bool]) -> Entry | None:
    """The first entry with at least ``cpu`` CPUs and ``memory`` that ``accept``s."""
    i = pool.bisect_left((cpu, memory, ""))
    n = len(pool)
    while i < n:
        cpus, free, name = pool[i]
        if free < memory:  # a CPU bucket's small-memory nodes: skip to its fitting ones
            i = pool.bisect_left((cpus, memory, ""), i)
            continue
        if accept(name):
            return pool[i]
        i += 1
    return None


def _largest_fit(pool: _Sorted, memory: int, accept: Callable[[str], bool]) -> Entry | None:
    """The entry with the most CPUs (at least one), then the least memory that fits."""
    hi = len(pool)
    while hi > 0:
        cpus = pool[hi - 1][0]
        if cpus < 1:
            return None
        lo = pool.bisect_left((cpus, _MIN, ""), 0, hi)
        for i in range(pool.bisect_left((cpus, memory, ""), lo, hi), hi):
            if accept(pool[i][2]):
                return pool[i]
        hi = lo
    return None


def _sample_below(pool: list[Entry], lo: int, hi: int, skip: set[str]) -> list[Entry]:
    """Up to k entries of pool[lo:hi], from the top down, leaving out ``skip``."""
    out: list[Entry] = []
    i = hi - 1
    while i >= lo and len(out) < _EXAMPLES_PER_CATEGORY:
        if pool[i][2] not in skip:
            out.append(pool[i])
        i -= 1
    return out


def _count_resources(
    pool: list[Entry], need: int, memory: int, own: list[Entry], findings: _Findings
) -> None:
    """Count entries with too few CPUs, then (with enough CPUs) too little memory,
    leaving out this model's own nodes (``own``); sample those closest to fitting."""
    skip = {e[2] for e in own}
    split = bisect_left(pool, (need, _MIN, ""))
    findings.add("cpu", split - sum(1 for e in own if e[0] < need))
    too_few = _sample_below(pool, 0, split, skip)
    if too_few:
        findings.most_cpu = max(findings.most_cpu or _MIN, too_few[0][0])
        findings.sample("cpu", [e[2] for e in too_few])
    short = 0
    samples: list[Entry] = []
    i, n = split, len(pool)
    while i < n:
        cpus = pool[i][0]
        j = bisect_left(pool, (cpus, memory, ""), i)
        short += j - i
        samples.extend(_sample_below(pool, i, j, skip))
        i = bisect_left(pool, (cpus + 1, _MIN, ""), j)
    findings.add("memory", short - sum(1 for e in own if e[0] >= need and e[1] < memory))
    if samples:
        findings.most_memory = max(findings.most_memory or _MIN, max(e[1] for e in samples))
        findings.sample("memory", [e[2] for e in samples])


_CATEGORY_ORDER = (
    "unschedulable",
    "selector",
    "taint",
    "replica",
    "exclusive",
    "shared",
    "cpu",
    "memory",
)


def _rank(category: str) -> int:
    return _CATEGORY_ORDER.index(category.split(" ", 1)[0])


def _ordered(counts: Mapping[str, int]) -> list[str]:
    return sorted(counts, key=lambda c: (_rank(c), c))


def _phrase(category: str, n: int, d: ModelDemand, findings: _Findings) -> str:
    if category == "unschedulable":
        return f"{n} unschedulable"
    if category == "selector":
        wanted = ",".join(f"{k}={v}" for k, v in sorted(d.node_selector.items()))
        return f"{n} not matching nodeSelector {wanted}"
    if category.startswith("taint "):
        return f"{n} with {category} not tolerated"
    if category == "replica":
        return f"{n} already running a replica of this model"
    if category == "exclusive":
        return f"{n} already holding an exclusive model"
    if category == "shared":
        return f"{n} running other models (this model is exclusive)"
    if category == "cpu":
        most = max(findings.most_cpu or 0, 0)
        return f"{n} with too few free CPUs (need {_need_cpu_text(d)}, most free {most})"
    most_memory = _gib(max(findings.most_memory or 0, 0))
    return f"{n} with too little free memory (need {_gib(d.memory_bytes)}, most free {most_memory})"
