"""Ollama with `gguf` rendered: weights from a URL, never from Ollama's registry.

The download step (operator image, Python) puts the checked file where Ollama's
store keeps a blob of that content; the create step builds the tuned model
FROM it with no pull. The scripts run for real in
tests/engines/test_gguf_init_script.py (download) and against the real Ollama,
offline, in tests/engines/test_ollama_gguf.py.
"""

from __future__ import annotations

import shlex
from typing import Any

import pytest

from localmodel.api import LocalModel
from localmodel.desired import desired_state
from localmodel.engines import ollama
from localmodel.render import RenderOptions, render_objects
from tests.builders import MakeLocalModel, MakeNode, by_kind_name

pytestmark = pytest.mark.unit

SHA = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
URL = "http://models.internal:8000/gemma-3-270m-q4_k_m.gguf"
BLOB = f"/root/.ollama/models/blobs/sha256-{SHA}"
NOW = "2026-12-01T00:00:00Z"


GEMMA = MakeLocalModel("g").spec(model="gemma3:270m", cpu=2)
NODE = MakeNode("n1").cpu_flags({"AVX2"})


def render(model: LocalModel) -> dict[str, Any]:
    result = desired_state([model], [NODE.facts()], now=NOW).models[0]
    assert result.replicas, result.status.conditions
    return by_kind_name(result.objects)


def inits(objects: dict[str, Any]) -> list[dict[str, Any]]:
    spec = objects["Pod/g-0"]["spec"]
    return list(spec["initContainers"])


def env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", [])}


def test_download_comes_first_then_the_create_step() -> None:
    objects = render(GEMMA.gguf(URL, SHA).obj())
    assert [c["name"] for c in inits(objects)] == ["download", "pull"]
    assert [c["name"] for c in objects["Pod/g-0"]["spec"]["containers"]] == ["ollama", "gateway"]


def test_download_runs_in_the_operator_image_as_the_volume_owner() -> None:
    """Ollama's image has no downloader; the operator image has Python. The
    volume's files are Ollama's (root's): the step runs as root with no
    capabilities and no way to gain any."""
    model = GEMMA.gguf(URL, SHA).obj()
    result = desired_state([model], [NODE.facts()], now=NOW).models[0]
    options = RenderOptions(operator_image="registry.internal/localmodel:1")
    objects = {
        f"{o['kind']}/{o['metadata']['name']}": o
        for o in render_objects(model, result.replicas, options)
    }
    download = inits(objects)[0]
    assert download["image"] == "registry.internal/localmodel:1"
    assert download["securityContext"] == {
        "runAsUser": 0,
        "runAsGroup": 0,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,  # it writes the volume only
    }
    assert download["volumeMounts"] == [{"name": "weights", "mountPath": ollama.HOME}]
    engine = objects["Pod/g-0"]["spec"]["containers"][0]
    assert download["resources"] == engine["resources"]
    script = download["command"][2]
    assert download["command"][:2] == ["/bin/sh", "-c"]
    assert f"file={BLOB}\n" in script
    assert f"want={SHA}\n" in script and f"url={shlex.quote(URL)}\n" in script
    assert "part=/root/.ollama/download/gemma-3-270m-q4_k_m.gguf.part\n" in script
    assert "python3 -I -c" in script and "curl" not in script


def test_the_model_is_created_from_the_file_with_no_registry_call() -> None:
    objects = render(GEMMA.gguf(URL, SHA).spec(context=2048).obj())
    modelfile = objects["ConfigMap/g-modelfile"]["data"]["replica-0.Modelfile"]
    assert modelfile == (f"FROM {BLOB}\nPARAMETER num_batch 512\nPARAMETER num_ctx 2048\n"
                         "PARAMETER num_thread 2\n")
    create = inits(objects)[1]
    script = create["command"][2]
    assert "ollama pull" not in script and "ollama show" not in script
    assert script.rstrip().endswith("ollama create gemma3:270m -f /etc/localmodel/Modelfile")
    # The downloaded blob is in no manifest until the create: no prune at start.
    assert env(create)["OLLAMA_NOPRUNE"] == "1"
    engine = objects["Pod/g-0"]["spec"]["containers"][0]
    assert "OLLAMA_NOPRUNE" not in env(engine)


@pytest.mark.parametrize(
    ("gguf", "part"),
    [
        ({"url": URL, "sha256": SHA}, "gemma-3-270m-q4_k_m.gguf"),
        ({"url": "https://h/blob/1?raw=1", "sha256": SHA, "file": "g.gguf"}, "g.gguf"),
    ],
)
def test_the_blob_is_named_by_the_checksum_whatever_the_file(
    gguf: dict[str, str], part: str
) -> None:
    objects = render(GEMMA.spec(gguf=gguf).obj())
    script = inits(objects)[0]["command"][2]
    assert f"file={BLOB}\n" in script
    assert f"part=/root/.ollama/download/{part}.part\n" in script
    assert objects["ConfigMap/g-modelfile"]["data"]["replica-0.Modelfile"].startswith(
        f"FROM {BLOB}\n"
    )


def test_without_gguf_the_registry_pull_stays_the_default() -> None:
    objects = render(GEMMA.obj())
    assert [c["name"] for c in inits(objects)] == ["pull"]
    create = inits(objects)[0]
    script = create["command"][2]
    assert "ollama pull gemma3:270m" in script and "ollama show gemma3:270m" in script
    assert "OLLAMA_NOPRUNE" not in env(create)
    modelfile = objects["ConfigMap/g-modelfile"]["data"]["replica-0.Modelfile"]
    assert modelfile.startswith("FROM gemma3:270m\n")


def test_a_new_checksum_is_a_new_pod_spec() -> None:
    """A changed file restarts the pod (its download step changes), so the new
    weights are fetched and the model re-created."""
    a = render(GEMMA.gguf(URL, SHA).obj())["Pod/g-0"]
    b = render(GEMMA.gguf(URL, "b" * 64).obj())["Pod/g-0"]
    key = "localmodel.dev/pod-spec-hash"
    assert a["metadata"]["annotations"][key] != b["metadata"]["annotations"][key]


def test_the_volume_holds_the_weights_once() -> None:
    """The file is the blob (no second copy), so the claim is sized as for a
    pull: twice the weights (an update's new blob lands before the old is
    pruned) plus 1Gi, the same as without `gguf`."""
    with_file = render(GEMMA.gguf(URL, SHA).obj())["PersistentVolumeClaim/g-weights-0"]
    pulled = render(GEMMA.obj())["PersistentVolumeClaim/g-weights-0"]
    assert with_file["spec"]["resources"] == pulled["spec"]["resources"]
