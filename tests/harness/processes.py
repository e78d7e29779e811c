"""The one way tests and benchmarks start, wait for and stop a server process.

    proc = ManagedProcess("gateway", argv, log_path)
    with proc.running("the gateway /healthz", lambda: http_ok(url + "/healthz"), 20):
        ...

Every child gets its own session (so a Ctrl-C in the terminal reaches only the
harness, which then stops the children in order; stopping signals the whole
session, so an engine's own children go with it) and, on Linux, a parent-death
signal, so even a SIGKILLed harness leaves no control plane or engine behind
(the signal comes when the *thread* that started the child ends: start children
from the main thread or a long-lived one). Its output goes to a log file.

`free_port` / `free_ports` are the one way to pick a loopback port.
tests/harness/engines.py starts the real engines through this module;
tests/architecture/test_one_launcher.py fails on a process started anywhere else.
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
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TypeVar

from tests.harness.tools import REPO_ROOT

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


def free_port() -> int:
    """One port on 127.0.0.1 that nothing listens on (also: a closed port to connect to)."""
    [port] = free_ports(1)
    return port


def port_is_listening(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


def http_ok(url: str, timeout: float = 2.0, headers: Mapping[str, str] | None = None) -> bool:
    """True if GET `url` answers 200 (False on any connection or HTTP error)."""
    request = urllib.request.Request(url, headers=dict(headers or {}))
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


class StartupError(RuntimeError):
    """A component did not come up; the message carries the tail of its log."""


_STARTED: list[ManagedProcess] = []


def started_processes() -> list[ManagedProcess]:
    """Every process started through this module in this interpreter that still runs."""
    return [p for p in _STARTED if p.running()]


@dataclass
class ManagedProcess:
    """One started binary: its argv, log file and pid."""

    name: str
    argv: list[str]
    log_path: Path  # stdout, and stderr unless err_path is given (os.devnull: discard)
    env: dict[str, str] | None = None  # None: this process's environment
    # Runs in the child before exec, after the die-with-parent setup (e.g. join a cgroup).
    preexec: Callable[[], None] | None = field(default=None, repr=False)
    err_path: Path | None = None  # stderr apart from stdout
    cwd: Path | None = None
    detached: bool = False  # outlives this process (no parent-death signal)
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _log: IO[bytes] | None = field(default=None, repr=False)
    _err: IO[bytes] | None = field(default=None, repr=False)

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None

    @property
    def returncode(self) -> int | None:
        return self.popen.poll() if self.popen else None

    def start(self) -> None:
        self._log = self.log_path.open("ab")
        self._err = self.err_path.open("ab") if self.err_path is not None else None
        self.popen = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=self._err if self._err is not None else subprocess.STDOUT,
            env=self.env,
            cwd=self.cwd,
            start_new_session=True,
            preexec_fn=self._preexec,
        )
        _STARTED.append(self)

    def _preexec(self) -> None:
        if not self.detached:
            _die_with_parent()
        if self.preexec is not None:
            self.preexec()

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def wait_ready(self, what: str, check: Callable[[], bool], timeout: float) -> None:
        """Poll `check` until true; StartupError (with the log's tail) if the process
        exits first or `timeout` seconds pass."""
        try:
            wait_until(what, check, timeout, self.check_alive)
        except StartupError as exc:
            if self.running():  # timed out: say what the process wrote
                tail = self.log_tail()
                raise StartupError(f"{exc}; last lines of {self.log_path}:\n{tail}") from None
            raise

    @contextlib.contextmanager
    def serving(
        self, what: str, check: Callable[[], bool], timeout: float
    ) -> Iterator[ManagedProcess]:
        """Start, wait until `check` is true, yield; stop afterwards (also on failure)."""
        self.start()
        try:
            self.wait_ready(what, check, timeout)
            yield self
        finally:
            self.stop()

    def wait(self, timeout: float) -> int:
        """Wait for the process to exit by itself; its exit code."""
        assert self.popen is not None, f"{self.name} was never started"
        return self.popen.wait(timeout=timeout)

    def log_text(self) -> str:
        """What it wrote: the log, then its stderr if that went to err_path."""
        text = ""
        for path in (self.log_path, self.err_path):
            if path is not None:
                with contextlib.suppress(OSError):
                    text += path.read_text(errors="replace")
        return text

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def check_alive(self) -> None:
        if self.popen is not None and self.popen.poll() is not None:
            raise StartupError(
                f"{self.name} exited with code {self.popen.returncode}; "
                f"last lines of {self.log_path}:\n{self.log_tail()}"
            )

    def kill(self, timeout: float = 10.0) -> None:
        """SIGKILL the process alone and reap it: a crash or an OOM kill (no cleanup)."""
        if self.popen is not None and self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.popen.pid, signal.SIGKILL)
            self.popen.wait(timeout=timeout)

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM to its session, then SIGKILL after `timeout` seconds; always reaps
        the pid, and SIGKILLs whatever of its session is left (an engine's children).
        Returns the exit code (None if it was never started)."""
        if self.popen is None:
            return None
        group = self.popen.pid  # its own session: the group id is its pid
        if self.popen.poll() is None:
            _kill_group(group, signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _kill_group(group, signal.SIGKILL)
                self.popen.wait(timeout=timeout)
        _kill_group(group, signal.SIGKILL)
        for f in (self._log, self._err):
            if f is not None:
                f.close()
        self._log = self._err = None
        return self.popen.returncode


def _kill_group(group: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, sig)


def localmodel_process(
    name: str,
    args: Sequence[str],
    log_path: Path,
    env: Mapping[str, str] | None = None,
    *,
    preexec: Callable[[], None] | None = None,
    err_path: Path | None = None,
) -> ManagedProcess:
    """`localmodel ARGS` (e.g. `run`, `gateway`) from this checkout, not started:
    `python -m localmodel.cli` with operator/ first on PYTHONPATH; `env` is its
    environment otherwise (default: ours)."""
    full = dict(os.environ if env is None else env)
    full["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO_ROOT / "operator"), full.get("PYTHONPATH", "")) if p
    )
    argv = [sys.executable, "-m", "localmodel.cli", *args]
    return ManagedProcess(
        name, argv, log_path, env=full, preexec=preexec, err_path=err_path, cwd=REPO_ROOT
    )


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
    """True if `pid` is alive and runs `executable` (guards against reused pids).

    Its argv[0] names `executable`, or both are the same file: a process started
    as bare `python` from a virtualenv has argv[0] `python`, while its
    `sys.executable` is the venv's absolute path (a link to the interpreter)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    if not cmdline or not cmdline[0]:
        return False
    if cmdline[0].decode(errors="replace") == executable:
        return True
    if not os.path.isabs(executable):
        return False
    try:
        return os.path.realpath(f"/proc/{pid}/exe") == os.path.realpath(executable)
    except OSError:
        return False


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
