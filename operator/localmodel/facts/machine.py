"""NodeFacts for the machine this command runs on (and, in a pod, for the pod).

The CPU budget is what a process here may really use: the smallest of the CPU
count, the cpuset (``sched_getaffinity``) and the cgroup CPU quota. Engines get
this wrong by themselves: llama.cpp counts every host CPU, and Ollama reads only
cgroup v2 ``cpu.max`` and never the cpuset (docs/engine-facts.md "Threads", "What a
pod sees as its CPU budget").

Every file is read under ``root`` so tests can build a fake ``/proc`` and
``/sys`` tree. The few facts that come from system calls (CPU count, affinity,
total memory, host name) go through `HostCalls`, which reads the same facts from
files under ``root`` when ``root`` is not ``/``. The cgroup limits are read by
`cgroup.py`, the CPU's description (/proc/cpuinfo, the kernel's AMX offer) by
`cpu.py`, the topology by `topology.py`.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

import psutil

from localmodel.facts.cgroup import CgroupLimits, read_cgroup_limits
from localmodel.facts.cpu import AmxKernel, CpuInfo, kernel_amx, parse_cpuinfo
from localmodel.facts.files import MachineFactsError, read_text
from localmodel.facts.model import FactSource, NodeFacts
from localmodel.facts.node import is_label_value
from localmodel.facts.topology import Topology, format_cpu_list, parse_cpu_list, read_topology

__all__ = ["HostCalls", "MachineFacts", "from_this_machine", "read_machine"]

HOSTNAME_LABEL = "kubernetes.io/hostname"


@dataclass(frozen=True)
class HostCalls:
    """The facts that come from system calls rather than files; injectable."""

    cpu_count: Callable[[], int | None]
    affinity: Callable[[], Collection[int] | None]
    total_memory: Callable[[], int | None]
    hostname: Callable[[], str]

    @classmethod
    def live(cls) -> HostCalls:
        """The running system: os, psutil, socket."""
        return cls(
            cpu_count=os.cpu_count,
            affinity=_live_affinity,
            total_memory=lambda: int(psutil.virtual_memory().total),
            hostname=socket.gethostname,
        )

    @classmethod
    def from_files(cls, root: Path) -> HostCalls:
        """The same facts from the files under ``root`` (a fake tree in tests)."""
        return cls(
            cpu_count=lambda: _file_cpu_count(root),
            affinity=lambda: _file_affinity(root),
            total_memory=lambda: _file_total_memory(root),
            hostname=lambda: _file_hostname(root),
        )


def _live_affinity() -> Collection[int] | None:
    getaffinity = getattr(os, "sched_getaffinity", None)  # Linux only
    return set(getaffinity(0)) if getaffinity is not None else None


def _file_cpu_count(root: Path) -> int | None:
    online = read_text(root / "sys/devices/system/cpu/online")
    if online is not None and online.strip():
        return len(parse_cpu_list(online))
    cpuinfo = read_text(root / "proc/cpuinfo")
    if cpuinfo is None:
        return None
    count = sum(1 for line in cpuinfo.splitlines() if line.split(":")[0].strip() == "processor")
    return count or None


def _file_affinity(root: Path) -> Collection[int] | None:
    status = read_text(root / "proc/self/status")
    for line in (status or "").splitlines():
        key, _, value = line.partition(":")
        if key == "Cpus_allowed_list":
            return parse_cpu_list(value)
    return None


def _file_total_memory(root: Path) -> int | None:
    meminfo = read_text(root / "proc/meminfo")
    for line in (meminfo or "").splitlines():
        key, _, value = line.partition(":")
        if key == "MemTotal":
            number, _, unit = value.strip().partition(" ")
            return int(number) * (1024 if unit.strip() == "kB" else 1)
    return None


def _file_hostname(root: Path) -> str:
    for name in ("proc/sys/kernel/hostname", "etc/hostname"):
        text = read_text(root / name)
        if text and text.strip():
            return text.strip()
    return "localhost"


def _hyperthreading(topology: Topology, cpu: CpuInfo) -> bool | None:
    # The cpuinfo "ht" flag is no evidence: x86 CPUs set it whatever the topology
    # (this AMD VM has "ht" with 2 siblings on 2 cores). The kernel's SMT switch is
    # authoritative, then the sibling sets, then logical-vs-physical counts, as
    # NFD's cpu-hardware_multithreading ("logical CPUs > physical CPUs").
    if topology.smt_active is not None:
        return topology.smt_active
    if topology.threads_per_core is not None:
        return topology.threads_per_core > 1
    if cpu.siblings is not None and cpu.cores is not None:
        return cpu.siblings > cpu.cores
    return None


@dataclass(frozen=True)
class MachineFacts:
    """Everything the probe and `doctor --local` read about one machine."""

    node: NodeFacts  # the budget and CPU features, as the rules see them
    topology: Topology
    host_cpus: int  # logical CPUs of the host (online), whatever this process may use
    host_memory_bytes: int | None  # the host's memory, before any cgroup limit
    cpu_model_name: str | None
    amx_kernel: AmxKernel | None  # None when not asked (a recorded tree)
    cgroup: CgroupLimits

    @property
    def cpu_budget(self) -> float:
        """CPUs this process may really use: min(host CPUs, cpuset, cgroup quota)."""
        return self.node.allocatable_cpu_milli / 1000

    def as_json(self) -> dict[str, object]:
        """The full facts, as the probe's node annotation and `doctor -o json` carry them."""
        topo, node = self.topology, self.node
        return {
            "hostname": node.name,
            "host_cpus": self.host_cpus,
            "cpu_budget": self.cpu_budget,
            "cpuset_cpus": node.cpuset_cpus,
            "cgroup_cpu_quota": self.cgroup.cpu_quota,
            "memory_bytes": node.allocatable_memory_bytes,
            "host_memory_bytes": self.host_memory_bytes,
            "cgroup_memory_bytes": self.cgroup.memory_bytes,
            "physical_cores": topo.physical_cores,
            "threads_per_core": topo.threads_per_core,
            "sockets": topo.sockets,
            "smt_active": topo.smt_active,
            "numa_nodes": {str(n): format_cpu_list(c) for n, c in topo.numa_nodes.items()},
            "cpu_vendor": node.cpu_vendor,
            "cpu_family": node.cpu_family,
            "cpu_model_id": node.cpu_model_id,
            "cpu_model_name": self.cpu_model_name,
            "cpu_flags": sorted(node.cpu_flags) if node.cpu_flags is not None else None,
            "amx_kernel": self.amx_kernel.value if self.amx_kernel is not None else None,
        }


def from_this_machine(root: Path = Path("/"), *, host: HostCalls | None = None) -> NodeFacts:
    """NodeFacts for this machine (see `read_machine`)."""
    return read_machine(root, host=host).node


def read_machine(
    root: Path = Path("/"),
    *,
    host: HostCalls | None = None,
    amx: Callable[[], AmxKernel] | None = None,
) -> MachineFacts:
    """This machine's facts: its effective CPU budget, memory, CPU features, topology.

    ``allocatable_cpu_milli`` is min(CPU count, cpuset size, cgroup quota) in
    millicores; the quota is kept unrounded (``cgroup_cpu_quota``, in CPUs) and
    floored only to whole millicores. ``cpuset_cpus`` is the affinity size.
    Memory is the host total capped by the cgroup memory limit.

    ``host`` defaults to the live system calls when ``root`` is ``/`` and to
    reading the same facts from files under ``root`` otherwise; ``amx`` (the
    kernel's AMX offer) is asked live when ``root`` is ``/`` and left unknown
    otherwise, unless given.
    """
    live = root == Path("/")
    if host is None:
        host = HostCalls.live() if live else HostCalls.from_files(root)
    if amx is None and live:
        amx = kernel_amx

    affinity = host.affinity()
    cpuset = len(affinity) if affinity else None
    topology = _topology(root)
    count = host.cpu_count() or topology.logical_cpus or cpuset or 1
    limits = read_cgroup_limits(root)
    budgets = [count * 1000]
    if cpuset is not None:
        budgets.append(cpuset * 1000)
    if limits.cpu_quota_milli is not None:
        budgets.append(limits.cpu_quota_milli)

    total = host.total_memory()
    memory_caps = [m for m in (total, limits.memory_bytes) if m is not None]
    if not memory_caps:
        raise MachineFactsError(f"{root}: cannot tell this machine's memory size")

    cpuinfo_text = read_text(root / "proc/cpuinfo")
    cpu = parse_cpuinfo(cpuinfo_text) if cpuinfo_text is not None else CpuInfo()
    node = _node_facts(host.hostname(), min(budgets), min(memory_caps), cpu, topology,
                       cpuset, limits)
    return MachineFacts(
        node=node,
        topology=topology,
        host_cpus=count,
        host_memory_bytes=total,
        cpu_model_name=cpu.model_name,
        amx_kernel=amx() if amx is not None else None,
        cgroup=limits,
    )


def _node_facts(name: str, cpu_milli: int, memory_bytes: int, cpu: CpuInfo, topology: Topology,
                cpuset: int | None, limits: CgroupLimits) -> NodeFacts:
    """The machine as the rules see a node: its budget, CPU features and topology."""
    # The label the kubelet puts on every node, so a nodeSelector on the host
    # name means the same here as in a cluster.
    hostname_label = name.lower()
    labels = {HOSTNAME_LABEL: hostname_label} if is_label_value(hostname_label) else {}
    return NodeFacts(
        name=name,
        labels=labels,
        allocatable_cpu_milli=cpu_milli,
        allocatable_memory_bytes=memory_bytes,
        cpu_flags=cpu.flags,
        source=FactSource.MACHINE if cpu.flags is not None else FactSource.NONE,
        cpu_vendor=cpu.vendor,
        cpu_family=cpu.family,
        cpu_model_id=cpu.model_id,
        hyperthreading=_hyperthreading(topology, cpu),
        cpuset_cpus=cpuset,
        cgroup_cpu_quota=limits.cpu_quota,
        physical_cores=topology.physical_cores,
        threads_per_core=topology.threads_per_core,
        numa_nodes=len(topology.numa_nodes) or None,
    )


def _topology(root: Path) -> Topology:
    try:
        return read_topology(root)
    except ValueError as e:
        raise MachineFactsError(str(e)) from None
