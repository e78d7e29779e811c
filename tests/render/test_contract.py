"""The operator's contract with the cluster (localmodel/contract.py), both ways.

A round trip: objects rendered by the real pipeline (`desired_state`), stored as
the API server and the kubelet would, reduced the way the watches reduce them,
and read back through the controller's own readers (`observe`, `readiness`,
`current_placements`, `unschedulable`, `model_changes`). If the renderer and
the controller ever spell a label, an annotation or a volume name differently,
the operator stops recognising its own objects: these tests fail first. The
one-sided renames below show that they do.

And a grep: no label or annotation key is written out under operator/ (or the
chart) other than in the contract module.
"""

from __future__ import annotations

import ast
import copy
from pathlib import Path
from typing import Any

import pytest

from localmodel import API_VERSION, contract, render
from localmodel.controller import changes as changes_module
from localmodel.controller import objects, watched
from localmodel.controller.changes import ModelChanges, choose_claim, model_changes
from localmodel.controller.observed import Observed, current_placements, readiness, unschedulable
from localmodel.controller.snapshot import Snapshot, observe
from localmodel.controller.watch_shape import NotKept
from localmodel.desired import ModelResult, desired_state
from localmodel.render import names as render_names
from localmodel.render import objects as render_objects
from localmodel.render import pods as render_pods
from tests.architecture import codebase
from tests.builders import MakeLocalModel, MakeNode

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
UID = "uid-chat"
NOW = "2026-12-01T00:00:00Z"
Raw = dict[str, Any]

GGUF = {
    "url": "https://example.com/m/qwen3-0.6b-q4_k_m.gguf",
    "sha256": "a" * 64,
}
SPECS: dict[str, Raw] = {
    "ollama": {"model": "qwen3:1.7b"},
    "ollama, no gateway": {"model": "qwen3:1.7b", "gateway": {"enabled": False}},
    "llama-server": {"model": "qwen3:0.6b", "engine": {"name": "llama-server"}, "gguf": GGUF},
    "owned claims": {"model": "qwen3:1.7b", "storage": {"retain": False}},
}


CHAT = (MakeLocalModel("chat").uid(UID).generation(1).without("model")
        .spec(cpu=4, context=4096, replicas=2))
NODE = MakeNode("n0").cpu_flags({"AVX2"}).registered()


def rendered(spec: Raw) -> tuple[Snapshot, Observed, ModelResult]:
    snap = Snapshot(localmodels=[CHAT.spec(**spec).manifest()],
                    nodes=[NODE.named(n).manifest() for n in ("n0", "n1", "n2")])
    obs = observe(snap)
    state = desired_state(
        obs.valid_models(), list(obs.nodes.values()), now=NOW,
        current=current_placements(obs), usage=obs.usage, ready=readiness(obs),
        claims=lambda lm, r, n: choose_claim(lm, r, n, obs),
    )
    [result] = state.models
    assert not result.problems, result.problems
    return snap, obs, result


WATCHED_AS = {"Pod": "pods", "PersistentVolumeClaim": "claims", "ConfigMap": "configmaps",
              "Service": "services"}


def stored(manifest: Raw, *, scheduled: bool = True, stuck: bool = False) -> Raw:
    """What the API server holds after the create (and the scheduler and kubelet
    acted)."""
    obj = copy.deepcopy(manifest)
    meta = obj["metadata"]
    meta["uid"] = f"uid-{meta['name']}"
    if obj["kind"] == "Pod":
        if scheduled:
            # The scheduler binds the pod where its node affinity points.
            [term] = obj["spec"]["affinity"]["nodeAffinity"][
                "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            obj["spec"]["nodeName"] = term["matchFields"][0]["values"][0]
            obj["status"] = {"phase": "Running",
                             "conditions": [{"type": "Ready", "status": "True"}]}
        elif stuck:
            obj["status"] = {"phase": "Pending", "conditions": [{
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "lastTransitionTime": NOW, "message": "0/3 nodes are available"}]}
    return obj


def as_watched(snap: Snapshot, result: ModelResult, **kw: Any) -> Snapshot:
    """The rendered objects as the watches deliver them (`watched.WATCHED`): only
    what passes a row's label selector, reduced to what its index keeps."""
    rows = {w.name: w for w in watched.WATCHED}
    by_row: dict[str, list[Raw]] = {
        "localmodels": [rows["localmodels"].keep(b) for b in snap.localmodels],
        "nodes": [rows["nodes"].keep(b) for b in snap.nodes]}
    for manifest in result.objects:
        if manifest["kind"] in ("ConfigMap", "Service"):
            manifest = changes_module.with_applied_hash(manifest)
        row = rows[WATCHED_AS[manifest["kind"]]]
        obj = stored(manifest, **kw)
        if row.selected(obj):
            by_row.setdefault(row.name, []).append(row.keep(obj))
    return Snapshot(**by_row)


def round_trip(spec: Raw) -> list[str]:
    """Everything the controller reads back that differs from what was rendered."""
    snap, _, result = rendered(spec)
    lm = result.model
    planned = {r.replica: r for r in result.replicas}
    pods = {m["metadata"]["name"]: m for m in result.objects if m["kind"] == "Pod"}
    claims = [m for m in result.objects if m["kind"] == "PersistentVolumeClaim"]
    applied = [m for m in result.objects if m["kind"] in ("ConfigMap", "Service")]
    obs = observe(as_watched(snap, result))
    wrong: list[str] = []

    def check(what: str, have: object, want: object) -> None:
        if have != want:
            wrong.append(f"{what}: read back {have!r}, rendered {want!r}")

    check("pods", sorted(name for _, name in obs.pods), sorted(pods))
    for pod in obs.pods.values():
        r = planned[pod.replica]
        check(f"pod {pod.name} model", pod.model, lm.key)
        check(f"pod {pod.name} owner", pod.owner_uid, UID)
        check(f"pod {pod.name} replica", pod.name, render_names.pod_name(lm, r.replica))
        check(f"pod {pod.name} node", pod.node, r.node)
        check(f"pod {pod.name} spec hash", pod.spec_hash,
              render.manifest_hash(pods[pod.name]["spec"]))
        check(f"pod {pod.name} claim", pod.claim, render.replica_claim(lm, r))
    check("claims", sorted(name for _, name in obs.claims),
          sorted(m["metadata"]["name"] for m in claims))
    for claim in obs.claims.values():
        check(f"claim {claim.name} model", claim.model, lm.key)
        check(f"claim {claim.name} replica", claim.name,
              render.replica_claim(lm, planned[claim.replica]))
        check(f"claim {claim.name} owner", claim.owner_uid,
              None if lm.spec.storage.retain else UID)
    check("applied objects", sorted(obs.objects),
          sorted((m["kind"], lm.metadata.namespace, m["metadata"]["name"]) for m in applied))
    for obj in obs.objects.values():
        want = changes_module.with_applied_hash(
            next(m for m in applied if m["metadata"]["name"] == obj.name and
                 m["kind"] == obj.kind))
        check(f"{obj.kind} {obj.name} applied hash", obj.applied_hash,
              want["metadata"]["annotations"][contract.ANNOTATION_APPLIED_HASH])
        check(f"{obj.kind} {obj.name} owner", obj.owner_uid, UID)
    check("readiness", readiness(obs), {lm.key: dict.fromkeys(planned, True)})
    check("placements", current_placements(obs),
          {lm.key: [planned[i].node for i in sorted(planned)]})
    # The strongest read-back: what was rendered, stored, is what is wanted.
    check("changes", model_changes(result, UID, obs), ModelChanges())

    # Before the scheduler binds a pod, its node is the annotation's.
    unbound = observe(as_watched(snap, result, scheduled=False, stuck=True))
    check("unbound nodes", {p.replica: p.node for p in unbound.pods.values()},
          {i: r.node for i, r in planned.items()})
    check("stuck pods", sorted((s.replica, s.node) for s in unschedulable(unbound)),
          sorted((i, r.node) for i, r in planned.items()))
    return wrong


@pytest.mark.parametrize("case", SPECS)
def test_rendered_objects_read_back_as_rendered(case: str) -> None:
    assert round_trip(SPECS[case]) == []


# One side renamed, the other not: the round trip must notice. Each names the
# module whose copy of the contract name is changed (render writes, the
# controller's readers read; `watched` keeps the contract's names themselves,
# and a reader asking for another is refused: NotKept).
ONE_SIDED = [
    (render_names, "LABEL_NAME"),
    (render_names, "LABEL_REPLICA"),
    (render_names, "LABEL_MANAGED_BY"),
    (render_names, "MANAGED_BY"),
    (render_objects, "ANNOTATION_NODE"),
    (render_objects, "ANNOTATION_POD_SPEC_HASH"),
    (render_pods, "VOLUME_WEIGHTS"),
    (objects, "LABEL_NAME"),
    (objects, "LABEL_REPLICA"),
    (objects, "LABEL_MANAGED_BY"),
    (objects, "MANAGED_BY"),
    (objects, "ANNOTATION_NODE"),
    (objects, "ANNOTATION_POD_SPEC_HASH"),
    (objects, "ANNOTATION_APPLIED_HASH"),
    (objects, "VOLUME_WEIGHTS"),
    (changes_module, "ANNOTATION_APPLIED_HASH"),
]


@pytest.mark.parametrize(("module", "name"), ONE_SIDED,
                         ids=[f"{m.__name__.rsplit('.', 1)[-1]}.{n}" for m, n in ONE_SIDED])
def test_a_name_changed_on_one_side_breaks_the_round_trip(
    module: Any, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert getattr(module, name) == getattr(contract, name), "not the contract's name"
    monkeypatch.setattr(module, name, getattr(contract, name) + "-renamed")
    try:
        wrong = round_trip(SPECS["ollama"])
    except KeyError as exc:  # a reader that indexes by the name fails outright
        wrong = [f"KeyError {exc}"]
    except NotKept as exc:  # a reader asks the watches for a label they do not keep
        wrong = [f"NotKept {exc}"]
    assert wrong, f"{module.__name__}.{name} renamed on one side only went unnoticed"


def test_the_watch_selector_is_the_labels_the_renderer_puts_on_every_object() -> None:
    _, _, result = rendered(SPECS["owned claims"])
    for manifest in result.objects:
        labels = manifest["metadata"]["labels"]
        assert contract.OWNED_SELECTOR.items() <= labels.items(), manifest["metadata"]["name"]
        assert labels[contract.LABEL_NAME] == "chat"


# ---- no second home -------------------------------------------------------------

KEY_PREFIXES = (contract.PREFIX, "app.kubernetes.io/")
CONTRACT_VALUES = {
    value for name, value in vars(contract).items()
    if name.isupper() and isinstance(value, str) and "/" in value
}
# Not a label or annotation: the API's own group/version (localmodel/__init__.py,
# and the `apiVersion` literal the API model must spell out).
ALLOWED = {API_VERSION}


def _literals(tree: ast.AST) -> list[ast.Constant]:
    """String constants, docstrings and other bare string statements left out."""
    bare = {id(node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}
    return [node for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in bare]


def contract_literals_outside_home() -> list[str]:
    home = ROOT / "operator" / "localmodel" / "contract.py"
    found = []
    for path in codebase.files(codebase.BASE, "*.py"):
        if path == home:
            continue
        for node in _literals(codebase.tree(path)):
            text = node.value
            if text in ALLOWED:
                continue
            if text.startswith(KEY_PREFIXES) or text in CONTRACT_VALUES:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {text!r}")
    return found


def test_no_label_or_annotation_key_is_spelled_outside_the_contract() -> None:
    found = contract_literals_outside_home()
    assert not found, "use localmodel.contract instead:\n" + "\n".join(found)


def test_the_grep_finds_a_key_written_out() -> None:
    tree = ast.parse('"""localmodel.dev/name in a docstring"""\nx = {"localmodel.dev/name": 1}\n')
    assert [c.value for c in _literals(tree)] == ["localmodel.dev/name"]


def test_the_chart_spells_no_operator_label_and_lets_the_probe_write_the_prefix() -> None:
    templates = ROOT / "charts" / "localmodel-operator" / "templates"
    keys = {v for v in CONTRACT_VALUES if v.startswith(contract.PREFIX) and v != contract.PREFIX}
    for path in sorted(templates.rglob("*")):
        if path.is_file():
            text = path.read_text()
            assert not [k for k in keys if k in text], path
    # The node probe's admission policy allows exactly the contract's prefix.
    assert f"startsWith('{contract.PREFIX}')" in (templates / "probe.yaml").read_text()
