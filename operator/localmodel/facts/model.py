"""NodeFacts: what the operator knows about one node's CPU budget and CPU features.

Pure data. Readers in this package build it from a Kubernetes Node object
(`from_node`) or from the machine the command runs on (`from_this_machine`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from localmodel.facts.flags import NFD_UNLABELLED_BY_DEFAULT, PROBE_CPU_FLAGS


class FactSource(StrEnum):
    """Where the CPU feature facts came from."""

    NFD = "nfd"  # feature.node.kubernetes.io/cpu-* labels
    PROBE = "probe"  # localmodel.dev/cpu-* labels written by our node probe
    MACHINE = "machine"  # read from /proc/cpuinfo on this machine
    NONE = "none"  # nothing known: every feature is unknown


@dataclass(frozen=True)
class Taint:
    """One node taint: key, value and effect."""

    key: str
    value: str = ""
    effect: str = "NoSchedule"  # NoSchedule | PreferNoSchedule | NoExecute


@dataclass(frozen=True)
class MemoryBandwidth:
    """A node's memory read bandwidth as its probe measured it (localmodel.probe.stream), in bytes
    per second: one thread's, and ``threads`` threads' together when measured."""

    one_thread: int
    all_threads: int | None = None
    threads: int | None = None


@dataclass(frozen=True)
class NodeFacts:
    """One node's budget and CPU features.

    ``cpu_flags`` holds upper-case CPUID feature names (``AVX2``, ``AMXTILE``...).
    ``None`` means the features are unknown (no NFD, no probe): a rule must treat
    a feature as *unknown*, never as absent.
    """

    name: str
    allocatable_cpu_milli: int
    allocatable_memory_bytes: int
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    cpu_flags: frozenset[str] | None = None
    source: FactSource = FactSource.NONE
    cpu_vendor: str | None = None  # e.g. "Intel", "AMD" (NFD cpu-model.vendor_id)
    cpu_family: str | None = None
    cpu_model_id: str | None = None
    hyperthreading: bool | None = None
    # CPUs this process may run on (sched_getaffinity); None when not known
    # (a remote node). Threads never exceed it.
    cpuset_cpus: int | None = None
    # cgroup CPU quota in CPUs (quota / period), None when unlimited or unknown.
    cgroup_cpu_quota: float | None = None
    schedulable: bool = True
    # Topology (probe labels or this machine's sysfs); None when not known.
    physical_cores: int | None = None
    threads_per_core: int | None = None  # 1 = no SMT; 2 = two hardware threads per core
    numa_nodes: int | None = None
    # Measured by the probe (labels read by facts/node.py); None when not known.
    memory_bandwidth: MemoryBandwidth | None = None

    def has(self, flag: str) -> bool | None:
        """True/False when the CPU feature is known, None when it is not.

        Features are unknown when ``cpu_flags`` is None, and also when the source
        never reports that feature: NFD leaves some features out of its labels by
        default (``NFD_UNLABELLED_BY_DEFAULT``, e.g. F16C, SSE42), and our probe
        labels only ``PROBE_CPU_FLAGS``. A feature that is present is always True.
        """
        if self.cpu_flags is None:
            return None
        name = flag.upper()
        if name in self.cpu_flags:
            return True
        if self.source is FactSource.NFD and name in NFD_UNLABELLED_BY_DEFAULT:
            return None
        if self.source is FactSource.PROBE and name not in PROBE_CPU_FLAGS:
            return None
        return False

    @property
    def allocatable_cpus(self) -> int:
        """Whole CPUs the node can give to pods (rounded down)."""
        return self.allocatable_cpu_milli // 1000
