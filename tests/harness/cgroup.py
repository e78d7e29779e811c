"""A real CPU-quota cgroup for tests (root only): v2 where the machine has it, else v1.

    with cpu_quota_cgroup(cpus=1) as group:
        ManagedProcess(name, argv, log, preexec=group.join).start()   # runs inside it

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
        deadline = time.monotonic() + 10
        while True:
            try:
                group.path.rmdir()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
