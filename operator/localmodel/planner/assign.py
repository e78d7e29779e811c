"""Placing replicas on the kept state, greedily in the planner's order: the
best node for each, taking it, and why it was chosen."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from localmodel.planner.cpus import Cpus, replica_cpus
from localmodel.planner.fit import first_fit, largest_fit
from localmodel.planner.index import Node, NodeIndex, dynamic_rejection
from localmodel.planner.model import Assignment, ModelDemand

Pending = tuple[ModelDemand, int, str]  # (model, replica, why it moves)


@dataclass(slots=True)
class Undo:
    """A node's state before this call placed anything on it."""

    node: Node
    free_cpu_milli: int
    free_memory: int
    occupants: dict[str, int]
    exclusive_holder: str | None


def place_each(
    index: NodeIndex, pending: Sequence[Pending], *, save: bool
) -> tuple[list[Assignment], list[tuple[ModelDemand, int]], list[Undo]]:
    """Place the replicas that must move, in order, each on its best node:
    the placements, the replicas that fit nowhere, and (``save``) the state
    of each node before its first placement, to undo them."""
    undo: list[Undo] = []
    placed: list[Assignment] = []
    unplaced: list[tuple[ModelDemand, int]] = []
    first: set[str] = set()  # nodes whose kept state is saved already
    for d, r, moved in pending:
        best = preferred = preferred_node(index, d, r)
        if best is None or best[0] > 0:  # a node with fewer penalties may beat it
            other = best_node(index, d)
            if other is not None and (best is None or other[0] < best[0]):
                best = other
        if best is None:
            unplaced.append((d, r))
            continue
        penalty, node = best
        reason = chosen_reason(d, node, penalty, moved, best is preferred)
        if save and node.name not in first:
            first.add(node.name)
            undo.append(
                Undo(
                    node,
                    node.free_cpu_milli,
                    node.free_memory,
                    dict(node.occupants),
                    node.exclusive_holder,
                )
            )
        index.unindex(node)
        cpu = take(node, d, r)
        index.index(node)
        placed.append(Assignment(d.key, r, node.name, cpu, d.memory_bytes, reason))
    return placed, unplaced, undo


def best_node(index: NodeIndex, d: ModelDemand) -> tuple[int, Node] | None:
    """The best node for one more replica of ``d`` (with its penalty), or None."""
    elig = index.eligible(d)
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
            score = (penalty, -free if d.cpu.whole_node else free, node.free_memory, node.name)
            if best is None or score < best:
                best, chosen = score, (penalty, node)
        return chosen

    key, nodes = d.key, index.nodes

    avoid = d.avoid

    def accept(name: str) -> bool:  # this model's other replicas stay apart
        return key not in nodes[name].occupants and name not in avoid

    best_score: tuple[int, int, int, str] | None = None
    for penalty, cls in elig.classes:
        if best_score is not None and penalty > best_score[0]:
            break
        empty, shared = cls.fits[overhead]
        for entries in (empty,) if d.exclusive else (empty, shared):
            if d.cpu.count is None:
                entry = largest_fit(entries, memory, accept)
            else:
                entry = first_fit(entries, d.cpu.count, memory, accept)
            if entry is None:
                continue
            cpus = -entry[0] if d.cpu.whole_node else entry[0]
            score = (penalty, cpus, entry[1], entry[2])
            if best_score is None or score < best_score:
                best_score = score
    if best_score is None:
        return None
    return best_score[0], nodes[best_score[3]]


def preferred_node(index: NodeIndex, d: ModelDemand, replica: int) -> tuple[int, Node] | None:
    """The node this replica prefers (`ModelDemand.prefer`) with its count of
    untolerated PreferNoSchedule taints, when it fits (the one definition of
    "fits", `NodeIndex.rejection`); else None. It wins over every node with as
    many such taints or more: the PreferNoSchedule tier first, then the
    preference, then best fit."""
    name = d.preferred(replica)
    node = None if name is None else index.nodes.get(name)
    if node is None or index.rejection(node, d) is not None:
        return None
    return index.verdict(node.taints, d.tolerations)[1], node


def take(node: Node, d: ModelDemand, replica: int) -> Cpus:
    """Put one replica of ``d`` on an unindexed node; the replica's CPUs (the
    one place they are decided: `cpus.replica_cpus`)."""
    count = d.cpu.count
    cpu = node.free_cpus(d.overhead_cpu_milli) if count is None else count
    occupy(node, d, replica, cpu)
    return replica_cpus(node.cpu_limit, cpu)


def occupy(node: Node, d: ModelDemand, replica: int, reserved: int) -> None:
    """Count one replica of ``d`` with ``reserved`` whole CPUs on an unindexed node."""
    node.free_cpu_milli -= reserved * 1000 + d.overhead_cpu_milli
    node.free_memory -= d.memory_bytes
    node.occupants[d.key] = replica
    if d.exclusive:
        node.exclusive_holder = d.key


def chosen_reason(
    d: ModelDemand, node: Node, penalty: int, moved: str, preferred: bool = False
) -> str:
    free = node.free_cpus(d.overhead_cpu_milli)
    if preferred:
        why = "chosen: the node this replica prefers (its home, or one yielded to it)"
    elif d.cpu.count is None:
        why = f"chosen: most free CPUs ({free}); cpu: node takes them all"
    else:
        why = f"chosen: best fit, fewest CPUs left over ({free - d.cpu.count} of {free} free)"
    if penalty:
        why += "; has an untolerated PreferNoSchedule taint, but no node without one fits"
    return f"{moved}; {why}" if moved else why
