"""A real CPU-quota or memory cgroup for tests and benchmarks (root only): v2
where the machine has the controller, else v1.

    with cpu_quota_cgroup(cpus=1) as group:
        ManagedProcess(name, argv, log, preexec=group.join).start()   # runs inside it
    with memory_cgroup(limit_bytes) as group:   # a leaf with memory.max (v1: limit_in_bytes)
        group.read("memory.stat")

The cgroup is removed afterwards (its processes must have ended).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
PERIOD_US = 100_000


class CgroupUnavailableError(RuntimeError):
    pass


@dataclass(frozen=True)
class Cgroup:
    path: Path
    version: int  # 1 or 2

    def join(self) -> None:
        """Move the calling process into this cgroup (a child's preexec hook)."""
        (self.path / "cgroup.procs").write_text(f"{os.getpid()}\n")

    def read(self, name: str) -> str:
        """One of the cgroup's files ("" if it is gone)."""
        try:
            return (self.path / name).read_text()
        except OSError:
            return ""


def _removed(path: Path) -> None:
    """Remove an emptied cgroup (a killed process leaves it asynchronously)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            path.rmdir()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@contextlib.contextmanager
def memory_cgroup(limit_bytes: int | None = None) -> Iterator[Cgroup]:
    """A leaf memory cgroup with `limit_bytes` as its limit (None: no limit): v2
    `memory.max` where the unified hierarchy has the memory controller, else v1
    `memory.limit_in_bytes` (the kubelet's cgroupfs on a v1 machine does the same)."""
    name = f"localmodel-test-{secrets.token_hex(3)}"
    controllers = ROOT / "cgroup.controllers"
    try:
        if controllers.exists() and "memory" in controllers.read_text().split():
            subtree = ROOT / "cgroup.subtree_control"
            if "memory" not in subtree.read_text().split():
                subtree.write_text("+memory\n")
            group = Cgroup(ROOT / name, 2)
            group.path.mkdir()
            if limit_bytes is not None:
                (group.path / "memory.max").write_text(f"{limit_bytes}\n")
        elif (ROOT / "memory" / "memory.limit_in_bytes").exists():
            group = Cgroup(ROOT / "memory" / name, 1)
            group.path.mkdir()
            if limit_bytes is not None:
                (group.path / "memory.limit_in_bytes").write_text(f"{limit_bytes}\n")
        else:
            raise CgroupUnavailableError(f"no cgroup v2 memory controller or v1 memory mount "
                                         f"in {ROOT}")
    except OSError as e:
        raise CgroupUnavailableError(
            f"cannot create a memory cgroup under {ROOT} (needs root): {e}") from e
    try:
        yield group
    finally:
        _removed(group.path)


@contextlib.contextmanager
def cpu_quota_cgroup(cpus: float) -> Iterator[Cgroup]:
    name = f"localmodel-test-{secrets.token_hex(3)}"
    quota = int(cpus * PERIOD_US)
    controllers = ROOT / "cgroup.controllers"
    try:
        if controllers.exists() and "cpu" in controllers.read_text().split():
            subtree = ROOT / "cgroup.subtree_control"
            if "cpu" not in subtree.read_text().split():
                subtree.write_text("+cpu\n")
            group = Cgroup(ROOT / name, 2)
            group.path.mkdir()
            (group.path / "cpu.max").write_text(f"{quota} {PERIOD_US}\n")
        elif (ROOT / "cpu" / "cpu.cfs_quota_us").exists():
            group = Cgroup(ROOT / "cpu" / name, 1)
            group.path.mkdir()
            (group.path / "cpu.cfs_period_us").write_text(f"{PERIOD_US}\n")
            (group.path / "cpu.cfs_quota_us").write_text(f"{quota}\n")
        else:
            raise CgroupUnavailableError(f"no cgroup v2 cpu controller or v1 cpu mount in {ROOT}")
    except OSError as e:
        raise CgroupUnavailableError(
            f"cannot create a CPU-quota cgroup under {ROOT} (needs root): {e}"
        ) from e
    try:
        yield group
    finally:
        _removed(group.path)
