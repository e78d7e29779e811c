"""No test leaves a process behind: a pytest plugin (tests/conftest.py loads it).

Around every test (its function-scoped fixtures included; session- and
module-scoped fixtures are set up before it and stay out of it) the plugin
notes which processes exist. After the test, a process that did not exist
before and is still running is the test's leak when
- it hangs off this pytest process (a child, or a child's child, ...), or
- it was orphaned (its parent died, so it was reparented to init or to
  another ancestor of pytest) and it names this session's temporary
  directory (`tmp_path` and friends) in its command line, working
  directory, executable or environment, so other runs on a shared machine
  are never blamed.
A process started by an older process (say, the runner a session-scoped
Ollama server starts for a request) is that process's business, not a leak.

Such a process may still belong to a longer-lived fixture (a test that
kills and restarts a module-scoped operator hands the new process back to
it), so it is judged when the session ends, after every fixture has stopped
what it owns: still running then, it is a leak. Leaks get a moment to finish
exiting, then are killed, and the session fails naming each test and its
processes. `tests/harness/test_leaks.py` shows the check failing on deliberate
leaks.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import psutil
import pytest

# A process that is already being stopped gets this long to go.
GRACE_SECONDS = 3.0


@dataclass(frozen=True)
class Leak:
    pid: int
    command: str
    how: str

    def __str__(self) -> str:
        return f"pid {self.pid} ({self.how}): {self.command}"


def _mentions(p: psutil.Process, markers: Sequence[str]) -> bool:
    texts: list[str] = []
    for read in (p.cmdline, p.cwd, p.exe):
        try:
            value = read()
        except (psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
        texts += value if isinstance(value, list) else [value]
    with contextlib.suppress(psutil.AccessDenied, psutil.ZombieProcess, OSError):
        texts += list(p.environ().values())
    return any(m in t for m in markers for t in texts)


def find_leaks(before: set[int], since: float, markers: Sequence[str]) -> list[psutil.Process]:
    """Running processes new since `before` that this pytest process left behind."""
    me = os.getpid()
    elders = {p.pid for p in psutil.Process(me).parents()} | {1}
    found: list[psutil.Process] = []
    for pid in sorted(set(psutil.pids()) - before):
        try:
            p = psutil.Process(pid)
            if p.create_time() < since - 1 or p.status() == psutil.STATUS_ZOMBIE:
                continue
            # The nearest ancestor that existed before the test.
            anchor = next((a.pid for a in p.parents() if a.pid in before), 1)
            if anchor == me or (anchor in elders and _mentions(p, markers)):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def _describe(p: psutil.Process) -> Leak:
    me = os.getpid()
    try:
        command = " ".join(p.cmdline()) or p.name()
        ancestry = [a.pid for a in p.parents()]
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return Leak(p.pid, "?", "gone while inspected")
    how = "started under this test run" if me in ancestry else f"orphaned, parent pid {p.ppid()}"
    return Leak(p.pid, command[:300], how)


def reap(leaks: list[psutil.Process], grace: float = GRACE_SECONDS) -> list[Leak]:
    """Wait `grace` for the leaks to exit on their own, then kill the rest;
    returns those that had to be killed."""
    alive = wait_gone(leaks, grace)
    described = [_describe(p) for p in alive]
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(alive, timeout=5)
    return described


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_gone(procs: list[psutil.Process], grace: float = GRACE_SECONDS) -> list[psutil.Process]:
    """Those of `procs` still running after `grace` seconds."""
    deadline = time.monotonic() + grace
    alive = [p for p in procs if _running(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [p for p in alive if _running(p)]
    return alive


# Processes tests left running, with the test: judged when the session ends.
_SUSPECTS: list[tuple[str, psutil.Process]] = []


@pytest.fixture(scope="session", autouse=True)
def no_processes_left_at_the_end() -> Iterator[None]:
    """After every other fixture: a suspect still running is a leak."""
    yield
    suspects = list(_SUSPECTS)
    _SUSPECTS.clear()
    alive = {id(p) for p in wait_gone([p for _, p in suspects])}
    by_test: dict[str, list[psutil.Process]] = {}
    for nodeid, p in suspects:
        if id(p) in alive:
            by_test.setdefault(nodeid, []).append(p)
    if not by_test:
        return
    report = []
    for nodeid, procs in by_test.items():
        killed = reap(procs, grace=0)
        lines = "\n".join(f"  {k}" for k in killed)
        report.append(f"{nodeid} left {len(killed)} process(es) running (killed now):\n{lines}")
    pytest.fail("\n".join(report), pytrace=False)


@pytest.fixture(autouse=True)
def no_leaked_processes(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """Notes the processes a test leaves running; a longer-lived fixture may
    still own one (a test restarted it), so they are judged at the end."""
    markers = [str(tmp_path_factory.getbasetemp())]
    before = set(psutil.pids())
    since = time.time()
    yield
    leaks = find_leaks(before, since, markers)
    if leaks:
        _SUSPECTS.extend((request.node.nodeid, p) for p in wait_gone(leaks))
