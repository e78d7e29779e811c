"""`kubectl localmodel` as a user runs it: the plugin installed from this
checkout's pyproject.toml (its console script) into a directory put first on
PATH, and the real kubectl finding it there.

Used by tests/e2e/test_day2.py (kwok nodes) and tests/realnode/test_timeline_on_node.py
(the real node)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.harness.tools import REPO_ROOT


class PluginInstallError(Exception):
    """pip could not install the plugin; the message has pip's output."""


def install_plugin(target: Path) -> str:
    """Install the package (no dependencies: the test environment has them)
    into `target`; the PATH with its bin directory first."""
    out = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps",
         "--target", str(target), str(REPO_ROOT)],
        capture_output=True, text=True, timeout=300, check=False)
    script = target / "bin" / "kubectl-localmodel"
    if out.returncode != 0 or not os.access(script, os.X_OK):
        raise PluginInstallError(f"pip install --target {target} {REPO_ROOT}: exit "
                                 f"{out.returncode}, {script} executable: "
                                 f"{os.access(script, os.X_OK)}\n{out.stderr}")
    return f"{target / 'bin'}{os.pathsep}{os.environ['PATH']}"


def run_kubectl(kubectl: Path, path: str, *args: str, timeout: float = 120
                ) -> subprocess.CompletedProcess[str]:
    """The real kubectl with `path` as PATH (and this checkout's code first on
    PYTHONPATH, over the installed copy's, then the checkout itself: the
    test-only engines the session registers are imported from `tests`); no
    KUBECONFIG from the environment."""
    code = os.pathsep.join([str(REPO_ROOT / "operator"), str(REPO_ROOT)])
    env = os.environ | {"PATH": path, "PYTHONPATH": code}
    env.pop("KUBECONFIG", None)
    return subprocess.run([str(kubectl), *args], capture_output=True, text=True,
                          timeout=timeout, env=env, check=False)


def shown_seconds(table: str, who: str) -> float:
    """The seconds `timeline`'s table shows on the indented line of `who` (a
    queue's "caller (priority)"), in whatever unit it chose (s or min)."""
    m = re.search(rf"^ +{re.escape(who)} ([0-9.]+) (s|min)$", table, re.MULTILINE)
    if m is None:
        raise AssertionError(f"no line `{who} N s` in:\n{table}")
    return float(m.group(1)) * (60 if m.group(2) == "min" else 1)
