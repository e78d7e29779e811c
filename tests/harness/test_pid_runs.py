"""`pid_runs`, the harness's guard against reused pids (`down`, `models-url`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tests.harness.processes import pid_runs


def test_a_process_is_known_by_the_file_it_runs_not_only_by_its_argv0(tmp_path: Path) -> None:
    # As `python -m pytest` from a virtualenv: argv[0] is the bare name, while a
    # state file records sys.executable, the venv's link to the interpreter.
    # This process's argv[0] is never a link made just now in tmp_path.
    link = tmp_path / "venv-python"
    link.symlink_to(os.path.realpath(sys.executable))
    me = os.getpid()
    argv0 = Path(f"/proc/{me}/cmdline").read_bytes().split(b"\0")[0].decode()
    assert argv0 != str(link)
    assert pid_runs(me, str(link))
    assert pid_runs(me, argv0)
    assert not pid_runs(me, "/bin/sh")  # another program under a reused pid
    assert not pid_runs(me, "sh")  # a bare name is only ever compared as argv[0]
    assert not pid_runs(me, str(tmp_path / "missing"))
