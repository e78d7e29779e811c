"""The leak check fails a test that leaves a process behind, names the test
and the process, and kills it; a test that stops what it starts passes, and a
module-scoped fixture's process is not the test's, even when a test restarted
it.

Each case runs a small pytest session in a subprocess with the plugin
(`-p tests.leaks`), as the suite itself runs it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]

CASES = '''
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.processes import ManagedProcess


def sleeper(tmp_path: Path, seconds: int) -> ManagedProcess:
    return ManagedProcess("sleep", ["sleep", str(seconds)], tmp_path / f"sleep-{seconds}.log")


def test_clean(tmp_path: Path) -> None:
    p = sleeper(tmp_path, 60)
    p.start()
    p.stop()


def test_leaks_a_child(tmp_path: Path) -> None:
    p = sleeper(tmp_path, 61)
    p.start()
    (tmp_path.parent / "child.pid").write_text(str(p.pid))


def test_leaks_an_orphan(tmp_path: Path) -> None:
    # The shell exits at once; its background job is reparented to init, as
    # an init script's `ollama serve &` was when `set -e` ended the script.
    pidfile = tmp_path.parent / "orphan.pid"
    subprocess.run(
        ["/bin/sh", "-c", f"HOME={tmp_path} sleep 62 & echo $! > {pidfile}"], check=True
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedProcess]:
    p = sleeper(tmp_path_factory.mktemp("server"), 63)
    p.start()
    yield p
    p.stop()


def test_uses_a_module_server(server: ManagedProcess) -> None:
    assert server.running()


def test_again_with_the_module_server(server: ManagedProcess) -> None:
    assert server.running()


def test_restarts_the_module_server(server: ManagedProcess) -> None:
    # Like the operator tests' failover: the fixture's process, restarted by
    # the test, is the fixture's again (it stops it at the end of the module).
    server.kill()
    server.start()
'''


def run_session(tmp_path: Path, *select: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_cases.py").write_text(CASES)
    return subprocess.run(
        [
            sys.executable, "-m", "pytest", "-p", "tests.leaks", "-p", "no:cacheprovider",
            "--rootdir", str(tmp_path), "--basetemp", str(tmp_path / "base"),
            "-q", *[f"test_cases.py::{s}" for s in select],
        ],
        cwd=tmp_path,
        env=os.environ | {"PYTHONPATH": f"{ROOT}:{ROOT / 'operator'}"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_leaked_child_fails_the_test_and_is_killed(tmp_path: Path) -> None:
    out = run_session(tmp_path, "test_leaks_a_child")
    assert out.returncode == 1, out.stdout + out.stderr
    pid = int((tmp_path / "base" / "child.pid").read_text())
    assert re.search(
        rf"ERROR at teardown of test_leaks_a_child.*test_cases.py::test_leaks_a_child left 1 "
        rf"process\(es\) running \(killed now\):\s+pid {pid} \(started under this test run\): "
        r"sleep 61",
        out.stdout,
        re.S,
    ), out.stdout
    assert gone(pid)


def test_an_orphan_naming_the_tests_tmp_dir_fails_the_test_and_is_killed(tmp_path: Path) -> None:
    out = run_session(tmp_path, "test_leaks_an_orphan")
    assert out.returncode == 1, out.stdout + out.stderr
    pid = int((tmp_path / "base" / "orphan.pid").read_text())
    assert "test_cases.py::test_leaks_an_orphan left 1 process(es)" in out.stdout, out.stdout
    assert re.search(rf"pid {pid} \(orphaned, parent pid \d+\): sleep 62", out.stdout), out.stdout
    assert gone(pid)


def test_clean_tests_and_module_fixtures_pass(tmp_path: Path) -> None:
    out = run_session(
        tmp_path,
        "test_clean",
        "test_uses_a_module_server",
        "test_restarts_the_module_server",
        "test_again_with_the_module_server",
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "4 passed" in out.stdout
