"""The README's walk-through, `bash hack/demo.sh`, runs to its end.

The demo brings up its own control plane and operator through the harness (a
state file of its own, so it runs beside the session's cluster) and tears it
down on exit. Its last two steps are the story a newcomer is told: a node goes
away and, with no free node left, the model waits with the reason in its
status; a node joins and the model is placed there on a new claim.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.harness.tools import REPO_ROOT

pytestmark = pytest.mark.e2e


def test_the_demo_walks_through_to_its_end(tmp_path: Path) -> None:
    env = {**os.environ, "LOCALMODEL_DEMO_STATE": str(tmp_path / "state.json")}
    result = subprocess.run(
        ["bash", str(REPO_ROOT / "hack" / "demo.sh")],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, f"hack/demo.sh exited {result.returncode}:\n{out[-4000:]}"
    # The invalid model is refused by the API server with its reason.
    assert "is invalid" in out or "Invalid value" in out, out[-4000:]
    # The node went away: the model waited, and its status said why.
    waiting = out.split("a node goes away", 1)[1].split("a node joins", 1)[0]
    assert "no node for replica 0" in waiting, waiting
    # A node joined: the model runs there, on a new claim bound to its local disk.
    joined = out.split("a node joins", 1)[1]
    assert "qwen3-weights-0-1   Bound    local-small-new-0" in joined, joined
    assert "AllReplicasReady" in joined and "small-new" in joined, joined
    assert "test cluster stopped" in out
