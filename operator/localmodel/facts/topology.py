"""CPU topology of this machine from the kernel's sysfs files: cores, SMT, NUMA.

Read under ``root`` (a fake tree in tests, ``/host`` in the probe's pod):

- ``sys/devices/system/cpu/online``: the online logical CPUs;
- ``sys/devices/system/cpu/cpuN/topology/thread_siblings_list``: the logical
  CPUs sharing cpuN's physical core (its SMT siblings), and
  ``physical_package_id``: its socket;
- ``sys/devices/system/cpu/smt/active``: whether the kernel runs SMT siblings;
- ``sys/devices/system/node/nodeN/cpulist``: the CPUs of each NUMA node.

A physical core is one distinct sibling set among the online CPUs (the way
lscpu and llama.cpp's ``cpu_get_num_physical_cores`` count, llama.cpp
``common/common.cpp``). Without sysfs, ``/proc/cpuinfo``'s per-processor
``physical id`` / ``core id`` pairs stand in. What cannot be read is ``None``,
never a guess.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from localmodel.facts.files import read_text

__all__ = ["Topology", "format_cpu_list", "parse_cpu_list", "read_topology"]

_CPU_DIR = re.compile(r"cpu(\d+)")
_NODE_DIR = re.compile(r"node(\d+)")


@dataclass(frozen=True)
class Topology:
    """Logical CPUs, physical cores, SMT and NUMA nodes; ``None`` = not readable."""

    logical_cpus: int | None = None
    physical_cores: int | None = None
    threads_per_core: int | None = None  # the largest sibling set (1 = no SMT)
    sockets: int | None = None
    smt_active: bool | None = None  # the kernel's SMT switch
    # NUMA node id -> its CPUs; empty when the kernel shows no node directories.
    numa_nodes: Mapping[int, frozenset[int]] = field(default_factory=dict)
    # Each physical core as its set of logical CPUs (sorted by lowest CPU).
    cores: tuple[frozenset[int], ...] = ()


def parse_cpu_list(text: str) -> frozenset[int]:
    """A Linux CPU list ("0-3,8,10-11") as a set of CPU numbers."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        first, dash, last = part.partition("-")
        try:
            low = int(first)
            high = int(last) if dash else low
        except ValueError:
            raise ValueError(f"{text.strip()!r} is not a CPU list") from None
        if low < 0 or high < low:
            raise ValueError(f"{text.strip()!r} is not a CPU list")
        cpus.update(range(low, high + 1))
    return frozenset(cpus)


def format_cpu_list(cpus: frozenset[int] | set[int]) -> str:
    """The Linux spelling of a CPU set: {0, 1, 2, 3, 8} -> "0-3,8"."""
    parts: list[str] = []
    ordered = sorted(cpus)
    start = prev = None
    for cpu in [*ordered, None]:
        if cpu is not None and prev is not None and cpu == prev + 1:
            prev = cpu
            continue
        if start is not None and prev is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = cpu
    return ",".join(parts)


def _cpu_list_file(path: Path) -> frozenset[int] | None:
    text = read_text(path)
    if text is None:
        return None
    try:
        return parse_cpu_list(text)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


def _numbered_dirs(directory: Path, pattern: re.Pattern[str]) -> dict[int, Path]:
    try:
        entries = list(directory.iterdir())
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return {}
    found = {}
    for entry in entries:
        match = pattern.fullmatch(entry.name)
        if match:
            found[int(match.group(1))] = entry
    return found


def read_topology(root: Path = Path("/")) -> Topology:
    """The topology under ``root``; raises ValueError naming a file it cannot parse."""
    cpu_dir = root / "sys/devices/system/cpu"
    online = _cpu_list_file(cpu_dir / "online")
    per_cpu = _numbered_dirs(cpu_dir, _CPU_DIR)
    if online is None and per_cpu:
        online = frozenset(per_cpu)

    siblings: dict[int, frozenset[int]] = {}
    packages: set[str] = set()
    for cpu in sorted(online or ()):
        topo = cpu_dir / f"cpu{cpu}" / "topology"
        sibs = _cpu_list_file(topo / "thread_siblings_list")
        if sibs is not None:
            siblings[cpu] = sibs & online if online else sibs
        package = read_text(topo / "physical_package_id")
        if package is not None and package.strip():
            packages.add(package.strip())

    cores: tuple[frozenset[int], ...] = ()
    if online and len(siblings) == len(online):
        cores = tuple(sorted(set(siblings.values()), key=min))
    elif not siblings:
        cores, cpuinfo_packages = _cpuinfo_cores(root)
        packages = packages or cpuinfo_packages
        if online is None and cores:
            online = frozenset().union(*cores)

    smt = read_text(cpu_dir / "smt/active")
    numa: dict[int, frozenset[int]] = {}
    for node, path in sorted(_numbered_dirs(root / "sys/devices/system/node", _NODE_DIR).items()):
        cpus = _cpu_list_file(path / "cpulist")
        if cpus is not None:
            numa[node] = cpus

    return Topology(
        logical_cpus=len(online) if online else None,
        physical_cores=len(cores) if cores else None,
        threads_per_core=max(len(c) for c in cores) if cores else None,
        sockets=len(packages) if packages else None,
        smt_active={"1": True, "0": False}.get(smt.strip()) if smt is not None else None,
        numa_nodes=numa,
        cores=cores,
    )


def _cpuinfo_cores(root: Path) -> tuple[tuple[frozenset[int], ...], set[str]]:
    """Cores from /proc/cpuinfo's processor / physical id / core id lines (no sysfs)."""
    text = read_text(root / "proc/cpuinfo")
    if text is None:
        return (), set()
    by_core: dict[tuple[str, str], set[int]] = {}
    packages: set[str] = set()
    for block in re.split(r"\n\s*\n", text):
        fields = {}
        for line in block.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields[key.strip()] = value.strip()
        if "processor" not in fields or "core id" not in fields:
            continue
        try:
            cpu = int(fields["processor"])
        except ValueError:
            continue
        package = fields.get("physical id", "0")
        packages.add(package)
        by_core.setdefault((package, fields["core id"]), set()).add(cpu)
    cores = tuple(sorted((frozenset(c) for c in by_core.values()), key=min))
    return cores, packages
