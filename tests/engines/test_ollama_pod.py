"""The pod's own artifacts, executed against the real Ollama.

The operator renders a pod for Gemma 3 270M on a 1-CPU budget with a 2048
context. Its init script runs for real (/bin/sh, the real `ollama` CLI and
server) against a volume that already holds the weights, in a network
namespace with only loopback: no pull is possible, so the script must not
need one. Then `ollama serve` runs with the engine container's environment and
the tuned model answers with the operator's thread count and context.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from localmodel.desired import desired_state
from localmodel.engines.ollama import PS_PATH, SHOW_PATH
from tests.builders import MakeLocalModel, MakeNode
from tests.engines.conftest import OllamaFactory
from tests.engines.real_ollama import MODEL
from tests.harness.engines import ollama_env, ollama_version
from tests.harness.processes import free_port

pytestmark = pytest.mark.engine

CONTEXT = 2048  # not Ollama's CPU default (4096): visibly the operator's
THREADS = 1


def rendered() -> tuple[dict[str, Any], str]:
    """The pod and its Modelfile, rendered for this machine kind's CPU (no AMX)."""
    lm = (MakeLocalModel("gemma").model(MODEL).cpu(THREADS).context(CONTEXT)
          .spec(engine={"version": ollama_version()}).obj())
    node = MakeNode("n").cpus(2).memory_gib(8).cpu_flags({"AVX2", "FMA"}).facts()
    objects = desired_state([lm], [node], now="t").models[0].objects
    pod = next(o for o in objects if o["kind"] == "Pod")
    configmap = next(o for o in objects if o["kind"] == "ConfigMap")
    return pod, configmap["data"]["replica-0.Modelfile"]


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container["env"]}


def run_init(pod: dict[str, Any], modelfile: str, models: Path, work: Path) -> str:
    """The init container: its script and environment, with the pod's paths
    (/etc/localmodel, /root/.ollama, /tmp) pointed at this test's directories,
    in a network namespace that has only loopback."""
    init = pod["spec"]["initContainers"][0]
    assert init["command"][:2] == ["/bin/sh", "-c"]
    (work / "etc").mkdir(parents=True, exist_ok=True)
    (work / "etc" / "Modelfile").write_text(modelfile)
    script = (
        init["command"][2]
        .replace("/etc/localmodel/Modelfile", str(work / "etc" / "Modelfile"))
        .replace("/tmp/ollama.log", str(work / "init-serve.log"))
    )
    env = env_of(init)
    assert env["OLLAMA_MODELS"] == "/root/.ollama/models"
    env |= ollama_env(work / "home", models, free_port())
    (work / "home").mkdir(exist_ok=True)
    unshare = shutil.which("unshare")
    assert unshare, "the engine tier needs util-linux unshare (network namespace)"
    done = subprocess.run(
        [
            unshare,
            "--net",
            "--",
            "/bin/sh",
            "-c",
            'ip link set lo up && exec /bin/sh -c "$0"',
            script,
        ],
        env=env | {"PATH": env["PATH"] + ":/usr/sbin:/sbin"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out + (work / "init-serve.log").read_text(errors="replace")
    return out


def test_network_namespace_really_has_no_network(tmp_path: Path) -> None:
    """The premise of the offline tests: inside `unshare --net` a pull cannot
    reach any registry (the real CLI fails to pull)."""
    models = tmp_path / "models"
    script = (
        "ip link set lo up; ollama serve >serve.log 2>&1 & s=$!; "
        "until ollama list >/dev/null 2>&1; do sleep 0.2; done; "
        "ollama pull gemma3:270m; rc=$?; kill $s; exit $rc"
    )
    env = ollama_env(tmp_path / "home", models, free_port())
    (tmp_path / "home").mkdir()
    done = subprocess.run(
        ["unshare", "--net", "--", "/bin/sh", "-c", script],
        env=env | {"PATH": env["PATH"] + ":/usr/sbin:/sbin"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode != 0, done.stdout + done.stderr


def test_init_script_builds_the_tuned_model_offline_and_the_engine_runs_it(
    models: Path, tmp_path: Path, ollama: OllamaFactory
) -> None:
    pod, modelfile = rendered()
    assert modelfile == (f"FROM {MODEL}\nPARAMETER num_batch 512\nPARAMETER num_ctx {CONTEXT}\n"
                         f"PARAMETER num_thread {THREADS}\n")

    out = run_init(pod, modelfile, models, tmp_path / "init")
    assert "already on the volume: no pull" in out
    assert "pulling" not in out

    # The engine container: `ollama serve` with the rendered environment.
    engine = pod["spec"]["containers"][0]
    env = env_of(engine)
    assert env["OLLAMA_CONTEXT_LENGTH"] == str(CONTEXT)
    env.pop("OLLAMA_HOST")
    env.pop("OLLAMA_MODELS")
    server = ollama(env=env)

    status, show = server.api(SHOW_PATH, {"model": MODEL})
    assert status == 200, show
    params = dict(line.split(None, 1) for line in show["parameters"].splitlines())
    assert params["num_thread"].strip() == str(THREADS)
    assert params["num_ctx"].strip() == str(CONTEXT)
    # A model option, so Ollama does not choose the batch itself (server/routes.go
    # usesAutomaticNumBatch): the micro-batch the memory decision counts.
    assert params["num_batch"].strip() == "512"

    # A caller that sends no options gets the operator's settings.
    status, answer = server.api(
        "/api/generate",
        {"model": MODEL, "prompt": "Hi", "stream": False, "options": {"num_predict": 2}},
    )
    assert status == 200, answer
    status, ps = server.api(PS_PATH)
    assert status == 200
    assert [m["name"] for m in ps["models"]] == [MODEL]
    assert ps["models"][0]["context_length"] == CONTEXT

    child = server.runner().cmdline()
    assert child[child.index("-t") + 1] == str(THREADS)
    assert child[child.index("-c") + 1] == str(CONTEXT)
    log = server.log_text()
    threads = re.findall(r"n_threads = (\d+)", log)
    assert threads and set(threads) == {str(THREADS)}, log[-3000:]


def test_restart_with_the_model_built_needs_no_network(models: Path, tmp_path: Path) -> None:
    pod, modelfile = rendered()
    run_init(pod, modelfile, models, tmp_path / "first")
    again = run_init(pod, modelfile, models, tmp_path / "restart")
    assert "already on the volume: no pull" in again


def test_init_script_pulls_when_the_weights_are_missing(tmp_path: Path) -> None:
    """The other branch, against the real CLI: an empty volume makes the
    script pull, and with no network the pull fails the pod start."""
    pod, modelfile = rendered()
    with pytest.raises(AssertionError, match="pull model manifest"):
        run_init(pod, modelfile, tmp_path / "empty-models", tmp_path / "init")
