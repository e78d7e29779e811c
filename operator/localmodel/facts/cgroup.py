"""The cgroup limits on a process: its CPU quota and memory limit, from the
cgroup v1 and v2 files under ``root``. Limits are hierarchical, so the tightest
on the way up wins. Part of this machine's CPU budget (`machine.read_machine`),
and what doctor reads of a running engine's process.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from localmodel.facts.files import MachineFactsError, read_text

_V1_UNLIMITED = 2**62


@dataclass(frozen=True)
class CgroupLimits:
    """The tightest cgroup limits on this process, v1 and v2 together."""

    cpu_quota: float | None = None  # CPUs (quota / period); None = unlimited
    cpu_quota_milli: int | None = None  # the same, floored to whole millicores
    memory_bytes: int | None = None  # None = unlimited


def _self_cgroups(root: Path, proc: str = "self") -> dict[str, str]:
    """Controller -> the process's cgroup path, from /proc/<proc>/cgroup ("" = v2)."""
    text = read_text(root / "proc" / proc / "cgroup") or ""
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
    text = read_text(path)
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
    text = read_text(path)
    if text is None or text.strip() == "max":
        return None
    return _int_text(path, text)


def _int_file(path: Path) -> int | None:
    text = read_text(path)
    return None if text is None else _int_text(path, text)


def _int_text(path: Path, text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise MachineFactsError(f"{path}: {text.strip()!r} is not an integer") from None
