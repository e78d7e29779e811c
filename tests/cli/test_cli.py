"""`localmodel render`: objects out, or exit 2 with the field path and nothing on stdout."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from localmodel.api import parse_local_model
from localmodel.cli import main
from localmodel.commands import explain
from localmodel.desired import desired_state
from tests.builders import MakeLocalModel, MakeNode

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
EX = ROOT / "examples"
FLEET = (
    "-f",
    str(EX / "models.yaml"),
    "--nodes",
    str(EX / "nodes-amx.yaml"),
    "--nodes",
    str(EX / "nodes-avx2.yaml"),
)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_render_example_for_this_machine(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "render", "-f", str(EX / "qwen3.yaml"))
    assert rc == 0, err
    docs = list(yaml.safe_load_all(out))
    kinds = [d["kind"] for d in docs]
    assert kinds == ["LocalModel", "ConfigMap", "PersistentVolumeClaim", "Pod", "Service"]
    status = docs[0]["status"]
    assert {c["type"]: c["status"] for c in status["conditions"]}["Placed"] == "True"
    threads = status["placements"][0]["threads"]
    assert 1 <= threads <= len(os.sched_getaffinity(0))  # cpu: node on this machine


def test_render_llama_server_example(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(
        capsys,
        "render",
        "-f",
        str(EX / "gemma-llama-server.yaml"),
        "--nodes",
        str(EX / "nodes-avx2.yaml"),
    )
    assert rc == 0, err
    docs = list(yaml.safe_load_all(out))
    assert [d["kind"] for d in docs] == ["LocalModel", "PersistentVolumeClaim", "Pod", "Service"]
    pod = docs[2]
    engine = pod["spec"]["containers"][0]
    assert engine["name"] == "llama-server"
    assert " ".join(engine["args"]).startswith("-t 1 -tb 1 -m /models/gemma-3-270m-q4_k_m.gguf")
    assert docs[0]["status"]["placements"][0]["settings"]["args"] == " ".join(engine["args"])


def test_render_airgapped_ollama_example(capsys: pytest.CaptureFixture[str]) -> None:
    """The air-gapped example: a download step, then the model created from the
    file; nothing pulls from Ollama's registry."""
    rc, out, err = run(
        capsys,
        "render",
        "-f",
        str(EX / "gemma-ollama-airgapped.yaml"),
        "--nodes",
        str(EX / "nodes-avx2.yaml"),
    )
    assert rc == 0, err
    docs = list(yaml.safe_load_all(out))
    kinds = [d["kind"] for d in docs]
    assert kinds == ["LocalModel", "ConfigMap", "PersistentVolumeClaim", "Pod", "Service"]
    sha = docs[0]["spec"]["gguf"]["sha256"]
    assert docs[1]["data"]["replica-0.Modelfile"].startswith(
        f"FROM /root/.ollama/models/blobs/sha256-{sha}\n"
    )
    inits = docs[3]["spec"]["initContainers"]
    assert [c["name"] for c in inits] == ["download", "pull"]
    assert "models.internal.example" in inits[0]["command"][2]
    assert "ollama pull" not in inits[1]["command"][2]


def test_render_yaml_writes_each_object_whole_without_aliases(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A pass shares objects between manifests (a model's labels and owner
    reference, alike pods' containers): each YAML document is still written
    out whole, never with an anchor and an alias to another part of it."""
    rc, out, err = run(capsys, "render", *FLEET)
    assert rc == 0, err
    assert "&id" not in out and "*id" not in out
    pods = [d for d in yaml.safe_load_all(out) if d["kind"] == "Pod"]
    assert len(pods) == 4


def test_render_against_node_pools_json(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(
        capsys,
        "render",
        *FLEET,
        "-o",
        "json",
    )
    assert rc == 0, err
    items = json.loads(out)["items"]
    pods = {i["metadata"]["name"]: i for i in items if i["kind"] == "Pod"}
    assert set(pods) == {"qwen3-8b-0", "llama-0", "llama-1", "gemma-0"}
    assert pods["qwen3-8b-0"]["metadata"]["annotations"]["localmodel.dev/node"].startswith("amx-")
    nodes = {p["metadata"]["annotations"]["localmodel.dev/node"] for p in pods.values()}
    assert len(nodes) == 4  # exclusive: one model per node


def test_explain_lists_placements_and_rules(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(
        capsys,
        "render",
        *FLEET,
        "--explain",
    )
    assert rc == 0
    # 0.31.0 on an AMX node: the crashing variant is removed, flash attention
    # (and with it the q8_0 cache) stays on (docs/engine-facts.md#amx).
    assert "amx-remove-cpu-variant" in out and "amx-safe-path-forced" in out
    assert "amx-guard " not in out and "kv-cache-falls-back-to-f16" not in out
    assert "replica 1 -> node avx2-" in out


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        ("spec: {model: 'qwen3:1.7b', cpu: 0}", "spec.cpu: must be a positive integer or 'node'"),
        (
            "spec: {model: 'qwen3:1.7b', kvCache: q4_0, flashAttention: disabled}",
            "spec.kvCache: a quantized kvCache needs flash attention",
        ),
        (
            "spec: {model: 'qwen3:1.7b', env: [{name: OLLAMA_HOST, value: x}]}",
            "spec.env: sets a variable the operator manages",
        ),
        ("spec: {model: 'qwen3:1.7b', context: 10}", "spec.context: Input should be greater"),
        ("spec: {modle: 'qwen3:1.7b'}", "spec.model: Field required"),
        ("spec: [1, 2", "not valid YAML"),
    ],
)
def test_invalid_input_exits_2_naming_the_field(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, expect: str
) -> None:
    f = tmp_path / "m.yaml"
    f.write_text(
        "apiVersion: localmodel.dev/v1alpha1\nkind: LocalModel\nmetadata: {name: m}\n" + text + "\n"
    )
    rc, out, err = run(capsys, "render", "-f", str(f))
    assert rc == 2
    assert out == ""
    assert expect in err


def test_bad_nodes_file_names_the_node_field(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    f = tmp_path / "nodes.yaml"
    f.write_text(
        "apiVersion: v1\nkind: List\nitems:\n- kind: Node\n  metadata: {name: a}\n"
        "  status: {allocatable: {cpu: lots, memory: 1Gi}}\n"
    )
    rc, out, err = run(capsys, "render", "-f", str(EX / "qwen3.yaml"), "--nodes", str(f))
    assert (rc, out) == (2, "")
    assert "allocatable.cpu" in err


def test_missing_file_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "render", "-f", "/nonexistent.yaml")
    assert (rc, out) == (2, "") and "cannot read" in err


def test_unknown_model_exits_2_saying_what_to_add(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    f = tmp_path / "m.yaml"
    f.write_text(
        "apiVersion: localmodel.dev/v1alpha1\nkind: LocalModel\nmetadata: {name: m}\n"
        "spec: {model: 'acme/private:7b', cpu: 1}\n"
    )
    rc, out, err = run(capsys, "render", "-f", str(f))
    assert (rc, out) == (2, "")
    assert f"{f}: LocalModel m: spec.memory: model 'acme/private:7b'" in err
    assert "set spec.modelInfo" in err and "explicit spec.memory" in err
    # The operator's pure path reports the same as Valid=False and renders nothing.
    model = parse_local_model(yaml.safe_load(f.read_text()))
    result = desired_state([model], [MakeNode("n").cpus(8).facts()], now="t").models[0]
    valid = next(c for c in result.status.conditions if c.type == "Valid")
    assert valid.status.value == "False" and "spec.modelInfo" in valid.message
    assert result.objects == ()


def test_crd_and_rules_commands(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "crd")
    assert rc == 0 and yaml.safe_load(out)["kind"] == "CustomResourceDefinition"
    rc, out, _ = run(capsys, "rules")
    assert rc == 0 and "| `amx-guard` |" in out


def test_unknown_command(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, "frobnicate")
    assert rc == 2 and "unknown command" in err


def test_explain_when_an_earlier_replica_is_unplaced() -> None:
    model = MakeLocalModel("q").replicas(2).obj()
    node = MakeNode("b").facts()
    state = desired_state([model], [node], now="t", current={"ai/q": [None, "b"]})
    text = explain(state)
    assert "replica 1 -> node b: threads=4 cpu=4 memory=" in text
    assert "Placed  False" in text and "replica 0:" in text
