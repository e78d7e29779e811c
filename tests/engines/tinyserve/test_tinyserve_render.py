"""tinyserve rendered and placed as any engine is: `localmodel render` (a
program, inheriting the session's LOCALMODEL_ENGINE_PACKAGES) turns its
LocalModel into a placed Pod running tinyserve from its config file, and
the planner puts each replica on a node of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from localmodel import engines
from tests.builders import MakeLocalModel, MakeNode
from tests.conformance.subjects import render_on
from tests.engines.tinyserve import CONFIG_FILE, IMAGE, NAME, PORT
from tests.engines.tinyserve.pod import CONTAINER_CONFIGURE
from tests.harness.tools import REPO_ROOT

HERE = Path(__file__).resolve().parent


def _render(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "localmodel.cli", "render", *args], capture_output=True,
        text=True, cwd=REPO_ROOT, env=env, timeout=120, check=False)


def test_localmodel_render_places_a_tinyserve_pod_running_its_config_file() -> None:
    args = ("-f", str(HERE / "golden" / "gemma-tinyserve.yaml"),
            "--nodes", str(REPO_ROOT / "examples" / "nodes-avx2.yaml"), "-o", "json")
    done = _render(*args, env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    items = json.loads(done.stdout)["items"]
    [model] = [o for o in items if o["kind"] == "LocalModel"]
    placed = {c["type"]: c["status"] for c in model["status"]["conditions"]}
    assert placed["Placed"] == "True"
    [pod] = [o for o in items if o["kind"] == "Pod"]
    [engine] = [c for c in pod["spec"]["containers"] if c["name"] == NAME]
    assert engine["image"] == IMAGE and engine["command"][-1] == CONFIG_FILE
    assert engine["ports"][0]["containerPort"] == PORT
    assert CONTAINER_CONFIGURE in [c["name"] for c in pod["spec"]["initContainers"]]
    # Without the variable that registers it, it is no engine at all.
    bare = {k: v for k, v in os.environ.items() if k != engines.ENV}
    refused = _render(*args, env=bare)
    assert refused.returncode == 2 and "spec.engine.name" in refused.stderr


def test_the_planner_puts_each_tinyserve_replica_on_a_node_of_its_own() -> None:
    nodes = [MakeNode(f"node-{i}").cpus(4).memory_gib(8).cpu_flags(["AVX2"]).facts()
             for i in range(3)]
    made = (MakeLocalModel("tiny").model("gemma3:270m").engine(NAME).gguf().cpu(2)
            .replicas(3))
    [result] = render_on(made, nodes).models
    pods = [o for o in result.objects if o["kind"] == "Pod"]
    placed = sorted(p["metadata"]["annotations"]["localmodel.dev/node"] for p in pods)
    assert placed == ["node-0", "node-1", "node-2"]
