"""Child processes the harness starts, and stops again by pid.

Every child gets its own session (so a Ctrl-C in the terminal reaches only the
harness, which then stops the children in order) and, on Linux, a parent-death
signal, so even a SIGKILLed harness leaves no control plane behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TypeVar

T = TypeVar("T")

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """preexec_fn: ask the kernel to SIGKILL this child when the harness dies."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def free_ports(count: int) -> list[int]:
    """Ports on 127.0.0.1 that nothing listens on (held open together so they differ)."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def port_is_listening(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


class StartupError(RuntimeError):
    """A component did not come up; the message carries the tail of its log."""


@dataclass
class ManagedProcess:
    """One started binary: its argv, log file and pid."""

    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] | None = None
    # Runs in the child before exec, after the die-with-parent setup (e.g. join a cgroup).
    preexec: Callable[[], None] | None = field(default=None, repr=False)
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None

    def start(self) -> None:
        self._log = self.log_path.open("ab")
        self.popen = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=self.env,
            start_new_session=True,
            preexec_fn=self._preexec,
        )

    def _preexec(self) -> None:
        _die_with_parent()
        if self.preexec is not None:
            self.preexec()

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def check_alive(self) -> None:
        if self.popen is not None and self.popen.poll() is not None:
            raise StartupError(
                f"{self.name} exited with code {self.popen.returncode}; "
                f"last lines of {self.log_path}:\n{self.log_tail()}"
            )

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after `timeout` seconds; always reaps the pid."""
        if self.popen is None:
            return
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout=timeout)
        if self._log is not None:
            self._log.close()
            self._log = None


def wait_until(
    what: str,
    check: Callable[[], bool],
    timeout: float,
    alive: Callable[[], None] = lambda: None,
    interval: float = 0.1,
) -> None:
    """Poll `check` until true; `alive` raises if the process being waited on died."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        alive()
        try:
            if check():
                return
        except Exception as exc:  # the thing being polled is not up yet
            last_error = exc
        time.sleep(interval)
    alive()
    detail = f" (last error: {last_error})" if last_error else ""
    raise StartupError(f"timed out after {timeout:.0f}s waiting for {what}{detail}")


def wait_for(what: str, probe: Callable[[], T | None], timeout: float, interval: float = 0.2) -> T:
    """Poll `probe` until it returns something truthy, and return that."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last seen: {last!r}")


def pid_runs(pid: int, executable: str) -> bool:
    """True if `pid` is alive and runs `executable` (guards against reused pids)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return bool(cmdline) and cmdline[0].decode(errors="replace") == executable


def terminate_pid(pid: int, timeout: float = 10.0) -> None:
    """Stop a process this harness started in an earlier run (see `down`)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not Path(f"/proc/{pid}").exists() or _is_zombie(pid):
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"
