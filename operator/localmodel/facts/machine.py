"""NodeFacts for the machine this command runs on (and, in a pod, for the pod).

The CPU budget is what a process here may really use: the smallest of the CPU
count, the cpuset (``sched_getaffinity``) and the cgroup CPU quota. Engines get
this wrong by themselves: llama.cpp counts every host CPU, and Ollama reads only
cgroup v2 ``cpu.max`` and never the cpuset (docs/engine-facts.md "Threads", "What a
pod sees as its CPU budget").

Every file is read under ``root`` so tests can build a fake ``/proc`` and
``/sys`` tree. The few facts that come from system calls (CPU count, affinity,
total memory, host name) go through `HostCalls`, which reads the same facts from
files under ``root`` when ``root`` is not ``/``.
"""

from __future__ import annotations

import ctypes
import os
import platform
import socket
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction
from pathlib import Path

import psutil

from localmodel.facts.flags import cpuid_name
from localmodel.facts.model import FactSource, NodeFacts
from localmodel.facts.node import is_label_value
from localmodel.facts.topology import Topology, format_cpu_list, parse_cpu_list, read_topology

__all__ = [
    "AmxKernel",
    "CgroupLimits",
    "CpuInfo",
    "HostCalls",
    "MachineFacts",
    "MachineFactsError",
    "from_this_machine",
    "kernel_amx",
    "parse_cpu_list",
    "parse_cpuinfo",
    "read_cgroup_limits",
    "read_machine",
]

HOSTNAME_LABEL = "kubernetes.io/hostname"

# cpuinfo vendor_id -> the vendor names NFD uses (cpu-model.vendor_id).
_VENDORS = {"GenuineIntel": "Intel", "AuthenticAMD": "AMD", "HygonGenuine": "Hygon"}


_V1_UNLIMITED = 2**62


class MachineFactsError(ValueError):
    """A system file under root has content we cannot read; names the file."""


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


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (FileNotFoundError, NotADirectoryError, PermissionError, IsADirectoryError):
        return None


def _file_cpu_count(root: Path) -> int | None:
    online = _read(root / "sys/devices/system/cpu/online")
    if online is not None and online.strip():
        return len(parse_cpu_list(online))
    cpuinfo = _read(root / "proc/cpuinfo")
    if cpuinfo is None:
        return None
    count = sum(1 for line in cpuinfo.splitlines() if line.split(":")[0].strip() == "processor")
    return count or None


def _file_affinity(root: Path) -> Collection[int] | None:
    status = _read(root / "proc/self/status")
    for line in (status or "").splitlines():
        key, _, value = line.partition(":")
        if key == "Cpus_allowed_list":
            return parse_cpu_list(value)
    return None


def _file_total_memory(root: Path) -> int | None:
    meminfo = _read(root / "proc/meminfo")
    for line in (meminfo or "").splitlines():
        key, _, value = line.partition(":")
        if key == "MemTotal":
            number, _, unit = value.strip().partition(" ")
            return int(number) * (1024 if unit.strip() == "kB" else 1)
    return None


def _file_hostname(root: Path) -> str:
    for name in ("proc/sys/kernel/hostname", "etc/hostname"):
        text = _read(root / name)
        if text and text.strip():
            return text.strip()
    return "localhost"


@dataclass(frozen=True)
class CgroupLimits:
    """The tightest cgroup limits on this process, v1 and v2 together."""

    cpu_quota: float | None = None  # CPUs (quota / period); None = unlimited
    cpu_quota_milli: int | None = None  # the same, floored to whole millicores
    memory_bytes: int | None = None  # None = unlimited


def _self_cgroups(root: Path, proc: str = "self") -> dict[str, str]:
    """Controller -> the process's cgroup path, from /proc/<proc>/cgroup ("" = v2)."""
    text = _read(root / "proc" / proc / "cgroup") or ""
    paths: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, cgroup_path = parts
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller] = cgroup_path
    return paths


def _cgroup_dirs(mount: Path, cgroup_path: str | None) -> Iterator[Path]:
    """The mount root and every ancestor of our cgroup that is visible under it.

    Limits are hierarchical (the effective one is the smallest on the way up), so
    every level counts. In a container with a cgroup namespace the mount root *is*
    the pod's cgroup; without one, our own path lies below it.
    """
    yield mount
    if not cgroup_path:
        return
    current = mount
    for part in Path(cgroup_path).parts:
        if part == "/":
            continue
        current = current / part
        if current.is_dir():
            yield current


def read_cgroup_limits(root: Path = Path("/"), proc: str = "self") -> CgroupLimits:
    """CPU quota and memory limit from cgroup v2 and v1 files under ``root``.

    v2: ``cpu.max`` = "QUOTA PERIOD" or "max PERIOD"; ``memory.max`` = bytes or
    "max". v1: ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (-1 = unlimited);
    ``memory.limit_in_bytes`` (a huge number = unlimited). The tightest wins.
    ``proc`` is the process whose cgroups count (``self``, or a pid).
    """
    cgroup = root / "sys/fs/cgroup"
    own = _self_cgroups(root, proc)
    quotas: list[tuple[int, int]] = []
    memory: list[int] = []

    v2_path = own.get("")
    for mount in (cgroup, cgroup / "unified"):  # unified: v2 in a hybrid layout
        for directory in _cgroup_dirs(mount, v2_path):
            quota = _cpu_max(directory / "cpu.max")
            if quota is not None:
                quotas.append(quota)
            limit = _memory_max(directory / "memory.max")
            if limit is not None:
                memory.append(limit)

    for mount in (cgroup / "cpu", cgroup / "cpu,cpuacct", cgroup / "cpuacct,cpu"):
        for directory in _cgroup_dirs(mount, own.get("cpu")):
            quota = _cfs_quota(directory)
            if quota is not None:
                quotas.append(quota)
    for directory in _cgroup_dirs(cgroup / "memory", own.get("memory")):
        limit = _int_file(directory / "memory.limit_in_bytes")
        # v1 writes "no limit" as PAGE_COUNTER_MAX pages (9223372036854771712 with
        # 4 KiB pages): nothing real is that large.
        if limit is not None and 0 <= limit < _V1_UNLIMITED:
            memory.append(limit)

    if not quotas:
        return CgroupLimits(memory_bytes=min(memory, default=None))
    quota_us, period_us = min(quotas, key=lambda q: Fraction(q[0], q[1]))
    return CgroupLimits(
        cpu_quota=quota_us / period_us,
        cpu_quota_milli=quota_us * 1000 // period_us,
        memory_bytes=min(memory, default=None),
    )


def _cpu_max(path: Path) -> tuple[int, int] | None:
    text = _read(path)
    if text is None:
        return None
    fields = text.split()
    try:
        if len(fields) == 1 and fields[0] == "max":  # period omitted: unlimited
            return None
        if len(fields) != 2:
            raise ValueError
        if fields[0] == "max":
            int(fields[1])
            return None
        quota, period = int(fields[0]), int(fields[1])
        if quota <= 0 or period <= 0:
            raise ValueError
    except ValueError:
        raise MachineFactsError(
            f"{path}: {text.strip()!r} is not 'QUOTA PERIOD' or 'max PERIOD'"
        ) from None
    return quota, period


def _cfs_quota(directory: Path) -> tuple[int, int] | None:
    quota = _int_file(directory / "cpu.cfs_quota_us")
    if quota is None or quota < 0:  # -1 = unlimited
        return None
    period = _int_file(directory / "cpu.cfs_period_us")
    if period is None or period <= 0 or quota == 0:
        raise MachineFactsError(
            f"{directory}: cpu.cfs_quota_us={quota} with cpu.cfs_period_us={period} "
            "is not a CPU quota"
        )
    return quota, period


def _memory_max(path: Path) -> int | None:
    text = _read(path)
    if text is None or text.strip() == "max":
        return None
    return _int_text(path, text)


def _int_file(path: Path) -> int | None:
    text = _read(path)
    return None if text is None else _int_text(path, text)


def _int_text(path: Path, text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise MachineFactsError(f"{path}: {text.strip()!r} is not an integer") from None


@dataclass(frozen=True)
class CpuInfo:
    """What /proc/cpuinfo says about the first CPU."""

    flags: frozenset[str] | None = None  # NFD spelling; None = no flags line
    vendor: str | None = None
    family: str | None = None
    model_id: str | None = None
    siblings: int | None = None  # logical CPUs per package
    cores: int | None = None  # physical cores per package
    model_name: str | None = None  # "Intel(R) Xeon(R) Platinum 8481C"


def parse_cpuinfo(text: str) -> CpuInfo:
    """The first processor block of /proc/cpuinfo (x86 names; ARM's "Features")."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break  # end of the first processor block
            continue
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    raw_flags = fields.get("flags", fields.get("Features"))
    vendor = fields.get("vendor_id")
    return CpuInfo(
        flags=None if raw_flags is None else frozenset(map(cpuid_name, raw_flags.split())),
        vendor=_VENDORS.get(vendor, vendor) if vendor else None,
        family=fields.get("cpu family") or None,
        model_id=fields.get("model") or None,
        siblings=_optional_int(fields.get("siblings")),
        cores=_optional_int(fields.get("cpu cores")),
        model_name=fields.get("model name") or None,
    )


def _optional_int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


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


# arch_prctl(2) codes (Linux arch/x86/include/uapi/asm/prctl.h) and the AMX tile
# data state component (XFEATURE_XTILEDATA, bit 18): the kernel offers AMX to user
# space only when ARCH_GET_XCOMP_SUPP's mask has it; a process must then ask for it
# with ARCH_REQ_XCOMP_PERM (Linux Documentation/arch/x86/xstate.rst).
_SYS_ARCH_PRCTL_X86_64 = 158
_ARCH_GET_XCOMP_SUPP = 0x1021
_XFEATURE_XTILEDATA = 18


class AmxKernel(StrEnum):
    """Whether this kernel lets user space use AMX (ARCH_GET_XCOMP_SUPP)."""

    OFFERED = "offered"  # the XTILEDATA bit is in the supported mask
    NOT_OFFERED = "not-offered"  # arch_prctl answers, without XTILEDATA
    NO_XCOMP = "no-arch-prctl-xcomp"  # arch_prctl refuses the code: kernel before 5.16
    NOT_X86 = "not-x86"  # no such thing here


def kernel_amx() -> AmxKernel:
    """Ask this kernel (a container shares its node's) through arch_prctl(2)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return AmxKernel.NOT_X86
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        mask = ctypes.c_uint64(0)
        result = libc.syscall(_SYS_ARCH_PRCTL_X86_64, _ARCH_GET_XCOMP_SUPP, ctypes.byref(mask))
    except (OSError, AttributeError):
        return AmxKernel.NO_XCOMP
    if result != 0:
        return AmxKernel.NO_XCOMP
    return AmxKernel.OFFERED if mask.value >> _XFEATURE_XTILEDATA & 1 else AmxKernel.NOT_OFFERED


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

    cpuinfo_text = _read(root / "proc/cpuinfo")
    cpu = parse_cpuinfo(cpuinfo_text) if cpuinfo_text is not None else CpuInfo()
    name = host.hostname()
    # The label the kubelet puts on every node, so a nodeSelector on the host
    # name means the same here as in a cluster.
    hostname_label = name.lower()
    labels = {HOSTNAME_LABEL: hostname_label} if is_label_value(hostname_label) else {}
    node = NodeFacts(
        name=name,
        labels=labels,
        allocatable_cpu_milli=min(budgets),
        allocatable_memory_bytes=min(memory_caps),
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
    return MachineFacts(
        node=node,
        topology=topology,
        host_cpus=count,
        host_memory_bytes=total,
        cpu_model_name=cpu.model_name,
        amx_kernel=amx() if amx is not None else None,
        cgroup=limits,
    )


def _topology(root: Path) -> Topology:
    try:
        return read_topology(root)
    except ValueError as e:
        raise MachineFactsError(str(e)) from None
