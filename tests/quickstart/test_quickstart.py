"""docs/quickstart.md, executed as written on the real node.

A real-node cluster with no fake nodes (so the chart's pods can only land on the
real kubelet), as the doc's "Before you start" asks: the images in a registry
the node trusts (the harness's TLS registry; the node's containerd starts with
no image at all and pulls every one from it), a default StorageClass (the
local-path provisioner: no volume is made by hand), and the GGUF served from a
model server the node reaches. Then every `<!-- quickstart:step -->` block of
the doc runs, verbatim and in order, in one `bash -euo pipefail` with the real
kubectl and helm on PATH, KUBECONFIG set, and a fresh virtualenv (the system's
packages visible) for the doc's `pip install` lines; the settings block is the
one part replaced, by this test's model server URL and registry.

Its own package (not tests/realnode): there is one real node per machine, and
the journey tier's package-scoped cluster must be gone before this one starts.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.harness import TestCluster, engines
from tests.harness.fixtures import real_node_parts_or_fail, real_node_started_or_fail
from tests.harness.models import ModelFileServer
from tests.harness.processes import ManagedProcess
from tests.harness.tools import REPO_ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.realnode]

DOC = REPO_ROOT / "docs" / "quickstart.md"
NO_FAKE_NODES = REPO_ROOT / "tests" / "fixtures" / "no-fake-nodes.yaml"
BLOCK = re.compile(r"<!-- quickstart:(settings|step) -->\n```sh\n(.*?)```", re.S)


def doc_blocks() -> tuple[str, list[str]]:
    """(the settings block, the step blocks) of docs/quickstart.md, in order."""
    found = BLOCK.findall(DOC.read_text())
    settings = [text for kind, text in found if kind == "settings"]
    steps = [text for kind, text in found if kind == "step"]
    assert len(settings) == 1 and len(steps) >= 3, found
    return settings[0], steps


def test_the_doc_has_one_settings_block_and_its_steps() -> None:
    settings, steps = doc_blocks()
    assert settings.strip().startswith("export GGUF_URL=")
    assert "\nexport REGISTRY=" in settings
    assert "--set global.imageRegistry=$REGISTRY" in steps[0]
    assert steps[0].lstrip().startswith("helm install")
    assert any("import ollama" in s and "from openai import OpenAI" in s for s in steps)


def test_quickstart_runs_as_written_to_a_first_answer(tmp_path: Path) -> None:
    settings, steps = doc_blocks()
    tools, gguf = real_node_parts_or_fail("the quickstart")
    # No mirror entries for docker.io or ghcr.io on the node: an image the doc's one
    # registry value does not reach would not be pulled at all.
    cluster = TestCluster(fixture=NO_FAKE_NODES, tools=tools, real_node=True,
                          mirror_upstream=False)
    began = time.monotonic()
    real_node_started_or_fail(cluster)
    models = ModelFileServer(gguf.parent, bind=cluster.node_address)
    try:
        models.start()
        assert cluster.real_node is not None and cluster.registry is not None
        print(f"cluster with the real node up in {time.monotonic() - began:.0f} s "
              f"(registry up in {cluster.registry.start_seconds:.1f} s, every image pushed "
              f"in {cluster.registry.push_seconds:.1f} s)")
        # Nothing pre-loaded: the node pulls what the doc's steps run.
        assert cluster.real_node.image_names() == []

        venv = tmp_path / "venv"
        # ensurepip took over 120 s on this loaded machine: a generous bound.
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                       check=True, timeout=900)
        bin_dir = tmp_path / "tools"
        bin_dir.mkdir()
        for name in ("kubectl", "helm"):
            (bin_dir / name).symlink_to(tools[name])
        # A user's environment: no test-only engine registered (tests/engines/).
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("PYTHON", "VIRTUAL_ENV", "LOCALMODEL_ENGINE_PACKAGES"))}
        env |= {"PATH": f"{venv / 'bin'}{os.pathsep}{bin_dir}{os.pathsep}{env['PATH']}",
                "VIRTUAL_ENV": str(venv), "KUBECONFIG": str(cluster.admin_kubeconfig),
                "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
        # The replaced lines: where this test serves the GGUF and its registry.
        site = (f"export GGUF_URL={models.url_of(gguf.name)}\n"
                f"export REGISTRY={cluster.registry.host}\n")
        script = site + "\n".join(steps)
        print(f"--- settings: {site.strip()} (the doc's: {settings.strip()})\n"
              "--- then the doc's steps, as written")
        started = time.monotonic()
        # Its own session (ManagedProcess): whatever the script leaves behind (the
        # port-forward, if it fails before `kill %1`) goes with it at stop().
        out_path, err_path = tmp_path / "quickstart.out", tmp_path / "quickstart.err"
        proc = ManagedProcess("quickstart", ["bash", "-euo", "pipefail", "-c", script],
                              out_path, env=env, err_path=err_path, cwd=REPO_ROOT)
        proc.start()
        try:
            code = proc.wait(timeout=1500)
        finally:
            proc.stop()
        run = subprocess.CompletedProcess(proc.argv, code, out_path.read_text(),
                                          err_path.read_text())
        seconds = time.monotonic() - started
        print(run.stdout)
        print(run.stderr[-4000:], file=sys.stderr)
        print(f"quickstart steps: {seconds:.0f} s")
        pulled = cluster.kubectl("get", "pods", "-A", "-o", "jsonpath={.items[*].spec."
                                 "containers[*].image}").stdout.split()
        # Every image the doc's pods run came through the one registry value.
        assert pulled and all(i.startswith(f"{cluster.registry.host}/") for i in pulled), pulled
        for line in cluster.kubectl("get", "events", "-A", "--field-selector=reason=Pulled",
                                    "-o", "custom-columns=OBJ:.involvedObject.name,"
                                    "MSG:.message", check=False).stdout.splitlines():
            print(f"  {line}")
        assert run.returncode == 0, f"the quickstart failed ({run.returncode}):\n{run.stderr}"
        answers = dict(re.findall(r"^(ollama|openai): (.+)$", run.stdout, re.M))
        assert set(answers) == {"ollama", "openai"} and all(answers.values()), run.stdout
        # The example's chat template reached the engine: no ChatML markers.
        assert not any(engines.template_markers(a) for a in answers.values()), answers
        assert "usage: kubectl localmodel" in run.stdout  # kubectl found the plugin
        # The last status, after the answers: the replica's speed is measured.
        tables = [t for t in run.stdout.split("NAME") if t.strip().startswith("MODEL")]
        assert len(tables) >= 2, run.stdout
        [row] = [line.split() for line in tables[-1].splitlines()[1:]
                 if line.startswith("gemma")]
        assert row[1:4] == ["gemma3:270m", "ollama", "1/1"], row
        assert row[6] == "1", row  # threads = the CPU limit
        assert float(row[9]) > 0, row  # TOK/S, from the gateway's counters
    finally:
        models.stop()
        cluster.stop()
