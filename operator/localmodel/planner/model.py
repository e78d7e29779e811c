"""The planner's inputs and outputs (pure data), and its tuning settings."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from operator import attrgetter
from typing import TypeVar

from localmodel.api import Toleration
from localmodel.planner.cpus import CpuRequest, Cpus


@dataclass(frozen=True)
class PlannerSettings:
    """How the planner trades index size against direct search, and how much it
    explains. None of these change which nodes are chosen, only how fast and
    how verbosely; tests set them low to exercise the other code paths."""

    # A selector matching at most this many nodes (a hostname, say) searches
    # them one by one; broader selectors get their own index (a view).
    direct_search: int = 128
    # Up to this many nodes, an unplaced replica's rejections name every node.
    max_rejections: int = 50
    # Up to this many nodes, the message lists every node instead of counting.
    list_nodes: int = 10
    # Sample size per rejection category in large clusters.
    examples_per_category: int = 5
    # Entries per chunk of a sorted fit list (chunks are split at twice this).
    chunk_size: int = 512

    def __post_init__(self) -> None:
        if self.chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, not {self.chunk_size}")


DEFAULT_SETTINGS = PlannerSettings()


@dataclass(frozen=True)
class ModelDemand:
    """What one model asks for, per replica."""

    key: str  # "namespace/name"
    replicas: int
    cpu: CpuRequest
    memory_bytes: int
    exclusive: bool = True
    node_selector: Mapping[str, str] = field(default_factory=dict, hash=False)
    # Validated once, by the API model; the planner only matches them.
    tolerations: tuple[Toleration, ...] = ()
    # milli-CPUs per replica on top of the engine's whole CPUs (sidecars such as
    # the gateway); must fit too, but is not part of ``Assignment.cpu``.
    overhead_cpu_milli: int = 0
    # Nodes where the scheduler left this model's pod Unschedulable (something
    # the planner cannot see, such as a volume or a device): rejected for it.
    avoid: frozenset[str] = field(default_factory=frozenset, hash=False)
    # Per replica, a node it prefers (a sleeper's home, where its claim is; a
    # node yielded to it): where it is placed, among the nodes that fit and
    # carry the fewest untolerated PreferNoSchedule taints, the preferred one
    # wins over best fit. Placing only: a kept replica never moves for it.
    prefer: tuple[str | None, ...] = field(default=(), hash=False)

    def preferred(self, replica: int) -> str | None:
        """The node replica ``replica`` prefers, if any."""
        return self.prefer[replica] if replica < len(self.prefer) else None

    @cached_property
    def selector(self) -> tuple[tuple[str, str], ...]:
        """``node_selector`` as sorted items (worked out once per demand)."""
        return tuple(sorted(self.node_selector.items()))

    def __post_init__(self) -> None:
        if self.replicas < 0:
            raise ValueError(f"{self.key}: replicas must be >= 0, not {self.replicas}")
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
class Assignment:
    """One replica on one node (``Plan.placements``; not the API's ``Placement``,
    which is the policy in ``spec.placement``). ``reason`` explains the choice and
    is not compared: two plans are equal when they make the same decisions."""

    model: str
    replica: int
    node: str
    cpu: Cpus  # for the engine (overhead not included)
    memory_bytes: int
    reason: str = field(default="", compare=False)


class UnplacedReason(StrEnum):
    """Why a replica has no node, CamelCase for a condition's ``reason``."""

    NO_NODES = "NoNodes"  # the cluster has no nodes at all
    NO_MATCHING_NODE = "NoMatchingNode"  # every node is ruled out for good (selector, taints)
    NO_FEASIBLE_NODE = "NoFeasibleNode"  # some node matches, but none has room now


@dataclass(frozen=True)
class Unplaced:
    """A replica no node can take: ``message`` is for people, ``rejections`` maps
    node -> why (every node in small clusters, a bounded sample per kind of
    rejection in large ones)."""

    model: str
    replica: int
    reason: UnplacedReason
    message: str
    rejections: Mapping[str, str] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class Plan:
    """The planner's decision: every replica placed or unplaced, each model's found by bisection
    once ordered."""

    placements: tuple[Assignment, ...] = ()
    unplaced: tuple[Unplaced, ...] = ()
    # Set by the planner: both are sorted by (model, replica), so one model's
    # are found by bisection instead of an index of every model.
    ordered: bool = field(default=False, compare=False, repr=False)

    @cached_property
    def _by_model(self) -> dict[str, tuple[list[Assignment], list[Unplaced]]]:
        """Placements and unplaced replicas per model, built once on first use."""
        out: dict[str, tuple[list[Assignment], list[Unplaced]]] = {}
        for p in self.placements:
            out.setdefault(p.model, ([], []))[0].append(p)
        for u in self.unplaced:
            out.setdefault(u.model, ([], []))[1].append(u)
        return out

    def placements_for(self, model: str) -> tuple[Assignment, ...]:
        if self.ordered:
            return _of(self.placements, model)
        return tuple(self._by_model.get(model, ([], []))[0])

    def unplaced_for(self, model: str) -> tuple[Unplaced, ...]:
        if self.ordered:
            return _of(self.unplaced, model)
        return tuple(self._by_model.get(model, ([], []))[1])

    def on_node(self, node: str) -> tuple[Assignment, ...]:
        return tuple(p for p in self.placements if p.node == node)

    def node_of(self, model: str, replica: int) -> str | None:
        for p in self.placements_for(model):
            if p.replica == replica:
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


_MODEL = attrgetter("model")
_T = TypeVar("_T", Assignment, Unplaced)


def _of(items: tuple[_T, ...], model: str) -> tuple[_T, ...]:
    """One model's items of a tuple sorted by model: one bisection to the
    first, then a step per item (a model has a replica or a few, so this
    is cheaper than bisecting again for the end)."""
    lo = hi = bisect_left(items, model, key=_MODEL)
    n = len(items)
    while hi < n and items[hi].model == model:
        hi += 1
    return items[lo:hi]
