"""A replica's CPUs: what a model asks for (`CpuRequest`, the one spelling of
``spec.cpu`` past the API) and what the planner's fit decides (`Cpus`).

The API validates ``spec.cpu`` as written; the planner decides how many CPUs
each replica gets (`replica_cpus`, called where a replica takes its node), and
the rules only read that decision (threads = the decided count)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from localmodel.facts import NodeFacts


@dataclass(frozen=True)
class CpuRequest:
    """Whole CPUs per replica for the engine: ``count``, or None for "node":
    every free whole allocatable CPU of the chosen node (at least one)."""

    count: int | None = None

    def __post_init__(self) -> None:
        if self.count is not None and self.count < 1:
            raise ValueError(f"cpu must be a positive integer or 'node', not {self.count}")

    @classmethod
    def of(cls, cpu: int | Literal["node"]) -> CpuRequest:
        """From ``spec.cpu`` (validated by the API): a count, or ``node``."""
        return cls(None if cpu == "node" else cpu)

    @property
    def whole_node(self) -> bool:
        return self.count is None

    @property
    def least(self) -> int:
        """The fewest whole CPUs a node must have free for one replica."""
        return 1 if self.count is None else self.count


# What a process on a node may run on, and which limit says so.
CpuLimit = tuple[int, str]


@dataclass(frozen=True)
class Cpus:
    """A replica's CPUs as the planner decided them: ``reserved`` whole CPUs
    taken on its node (the request's count, or for ``cpu: node`` every free
    whole CPU), and ``count``, the engine's threads and CPU limit: ``reserved``
    lowered to what a process on the node may run on (its allocatable CPUs,
    cpuset or CPU quota: ``capped_by`` names the lowest; "" when none is
    lower). On a node from the API (no cpuset or quota known) or this machine
    (whose allocatable CPUs are already the least of the three), ``count`` is
    ``reserved``."""

    reserved: int
    count: int
    capped_by: str = ""


def cpu_limit(node: NodeFacts) -> CpuLimit:
    """The most whole CPUs a process on the node may run on (at least one),
    and which limit that is: the first lowest of its allocatable CPUs, its
    cpuset (sched_getaffinity) and its cgroup CPU quota."""
    limits = {"node allocatable CPUs": node.allocatable_cpus}
    if node.cpuset_cpus is not None:
        limits["cpuset (sched_getaffinity)"] = node.cpuset_cpus
    if node.cgroup_cpu_quota is not None:
        limits["cgroup CPU quota"] = int(node.cgroup_cpu_quota)
    what, most = min(limits.items(), key=lambda kv: kv[1])
    return max(most, 1), what


def replica_cpus(limit: CpuLimit, reserved: int) -> Cpus:
    """A replica's CPUs, with ``reserved`` taken on a node whose processes may
    run on ``limit`` (`cpu_limit`)."""
    most, what = limit
    if reserved <= most:
        return Cpus(reserved, reserved)
    return Cpus(reserved, most, what)
