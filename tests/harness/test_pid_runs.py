"""`pid_runs`, the harness's guard against reused pids (`down`, `models-url`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.harness.processes import pid_runs


def test_a_process_started_by_a_bare_name_runs_the_linked_interpreter(tmp_path: Path) -> None:
    # As `python -m ...` from a virtualenv: argv[0] is the bare name, while the
    # state file records sys.executable, the venv's link to the interpreter.
    real = os.path.realpath(sys.executable)
    link = tmp_path / "venv-python"
    link.symlink_to(real)
    child = subprocess.Popen(["python", "-c", "import time; time.sleep(60)"], executable=real)
    try:
        assert pid_runs(child.pid, str(link))
        assert pid_runs(child.pid, "python")  # argv[0] itself
        assert not pid_runs(child.pid, "/bin/sh")  # another program under a reused pid
        assert not pid_runs(child.pid, "sh")
    finally:
        child.kill()
        child.wait()
    assert not pid_runs(child.pid, str(link))  # gone
