"""The table of watched resources (controller/watched.py) is the snapshot, by name,
and the kopf registry is built from it: one index and one trigger per row. What
each row keeps is only what the operator reads: a read of anything else raises
(`watch_shape.NotKept`), and the operator's whole pass over the kept objects is the
pass over the whole ones."""

from __future__ import annotations

import copy
import json
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from benchmarks.planner import NOW, OPTIONS, watched_bodies
from localmodel.contract import (
    ANNOTATION_NODE,
    CONTAINER_GATEWAY,
    LABEL_MANAGED_BY,
    LABEL_NAME,
    LABEL_REPLICA,
    MANAGED_BY,
    VOLUME_WEIGHTS,
)
from localmodel.controller import watched
from localmodel.controller.config import OperatorConfig
from localmodel.controller.handlers import build_registry
from localmodel.controller.objects import owned_pod
from localmodel.controller.observed import unschedulable
from localmodel.controller.operator_metrics import OperatorMetrics
from localmodel.controller.plan import plan_pass
from localmodel.controller.reconcile import Reconciler
from localmodel.controller.snapshot import Snapshot, observe
from localmodel.controller.volumes import volume_reaches
from localmodel.controller.watch_shape import NotKept
from localmodel.controller.watched import WATCHED, Watched
from localmodel.facts.node import NodeFactsError, from_node
from localmodel.facts.pod import pod_requests
from localmodel.kube import Credentials
from tests.builders import MakeNode

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def test_every_row_is_a_snapshot_field_and_every_field_a_row() -> None:
    assert [w.name for w in WATCHED] == [f.name for f in fields(Snapshot)]
    assert len({(w.group, w.plural) for w in WATCHED}) == len(WATCHED)


def test_the_registry_has_one_index_and_one_trigger_per_row() -> None:
    reconciler = Reconciler(OperatorConfig(), None, OperatorMetrics())  # type: ignore[arg-type]
    registry = build_registry(reconciler, Credentials(server="https://127.0.0.1:6443"))

    def registered(handlers: Any) -> set[tuple[Any, ...]]:
        return {(str(h.id), h.selector.group, h.selector.version, h.selector.any_name,
                 tuple(sorted((h.labels or {}).items()))) for h in handlers}

    def table(id_of: Any) -> set[tuple[Any, ...]]:
        return {(id_of(w), w.group, w.version, w.plural, tuple(sorted((w.labels or {}).items())))
                for w in WATCHED}

    assert registered(registry._indexing.get_all_handlers()) == table(lambda w: w.index_id)
    assert registered(registry._watching.get_all_handlers()) == table(
        lambda w: f"wake-{w.plural}")


def test_a_row_selects_by_its_labels() -> None:
    rows = {w.name: w for w in WATCHED}
    ours = {"metadata": {"labels": {LABEL_MANAGED_BY: MANAGED_BY}}}
    theirs = {"metadata": {"labels": {LABEL_MANAGED_BY: "helm"}}}
    assert rows["claims"].selected(ours) and not rows["claims"].selected(theirs)
    assert rows["pods"].selected(theirs) and rows["pods"].selected({})


POD = {
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": "p", "namespace": "ai", "uid": "u", "resourceVersion": "7",
                 "labels": {LABEL_MANAGED_BY: MANAGED_BY, LABEL_NAME: "m", LABEL_REPLICA: "0",
                            "team": "x"},
                 "annotations": {ANNOTATION_NODE: "n1", "kubectl.kubernetes.io/x": "big"},
                 "ownerReferences": [{"apiVersion": "localmodel.dev/v1alpha1",
                                      "kind": "LocalModel", "name": "m", "uid": "lm",
                                      "controller": True, "blockOwnerDeletion": True}],
                 "managedFields": [{"manager": "kubelet"}]},
    "spec": {"nodeName": "n1", "hostNetwork": False,
             "containers": [{"name": "engine", "image": "e", "env": [{"name": "X"}],
                             "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                                           "limits": {"cpu": "1"}}},
                            {"name": CONTAINER_GATEWAY, "image": "g", "resources": {}}],
             "volumes": [{"name": VOLUME_WEIGHTS, "persistentVolumeClaim": {"claimName": "w"}},
                         {"name": "kube-api-access", "projected": {"sources": []}}]},
    "status": {"phase": "Running", "podIP": "10.85.0.7", "hostIP": "10.0.0.1",
               "conditions": [{"type": "Ready", "status": "True", "lastProbeTime": None}],
               "containerStatuses": [{"name": "engine"}]},
}


def test_a_kept_pod_reads_as_the_api_object_for_every_field_the_table_keeps() -> None:
    kept = watched.pod(POD)
    assert kept["metadata"]["name"] == "p" and kept["spec"]["nodeName"] == "n1"
    assert kept["spec"]["containers"][1]["image"] == "g"
    assert kept["spec"]["containers"][0]["resources"]["requests"]["memory"] == "1Gi"
    assert kept["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == "w"
    assert kept["status"]["podIP"] == "10.85.0.7"
    assert dict(kept["metadata"]["labels"]) == {LABEL_MANAGED_BY: MANAGED_BY,
                                                LABEL_NAME: "m", LABEL_REPLICA: "0"}
    assert pod_requests(kept) == pod_requests(POD) == (1000, 2**30)
    assert owned_pod(kept) == owned_pod(POD) is not None


# A field kept by no row: reading it, in any of the ways a reader can ask.
DROPPED = [
    ("metadata.managedFields", lambda k: k["metadata"]["managedFields"]),
    ("spec.hostNetwork", lambda k: k["spec"].get("hostNetwork")),
    ("status.hostIP", lambda k: "hostIP" in k["status"]),
    ("spec.containers[].env", lambda k: k["spec"]["containers"][0].get("env")),
    ("spec.containers[].resources.limits", lambda k: k["spec"]["containers"][0]["resources"]
     .get("limits")),
    ("status.conditions[].lastProbeTime", lambda k: k["status"]["conditions"][0]
     .get("lastProbeTime", "absent")),
    ("metadata.labels['team']", lambda k: k["metadata"]["labels"].get("team")),
    ("metadata.annotations['kubectl.kubernetes.io/x']",
     lambda k: k["metadata"]["annotations"]["kubectl.kubernetes.io/x"]),
]


@pytest.mark.parametrize(("field", "read"), DROPPED, ids=[d[0] for d in DROPPED])
def test_reading_a_field_the_table_drops_raises_naming_it(field: str, read: Any) -> None:
    read(POD)  # the whole object answers; the kept one refuses, never "absent"
    with pytest.raises(NotKept) as err:
        read(watched.pod(POD))
    assert field.split("[")[0] in str(err.value) and "docs/operator.md" in str(err.value)
    # Not a KeyError, ValueError or TypeError: no reader's "absent" or "bad
    # object" branch can swallow it.
    assert not isinstance(err.value, KeyError | ValueError | TypeError | AttributeError)


def test_a_kept_field_the_object_lacks_reads_as_absent() -> None:
    kept = watched.pod({"metadata": {"name": "p", "labels": {LABEL_MANAGED_BY: MANAGED_BY}}})
    assert kept.get("spec") is None and "spec" not in kept
    with pytest.raises(KeyError):
        kept["status"]
    assert kept["metadata"].get("deletionTimestamp") is None


def test_another_pod_keeps_only_its_nodes_usage() -> None:
    other = {**POD, "metadata": {**POD["metadata"], "labels": {"app": "ds"}}}
    kept = watched.pod(other)
    assert owned_pod(kept) is None
    assert pod_requests(kept) == (1000, 2**30) and kept["spec"]["nodeName"] == "n1"
    for read in (lambda k: k["status"]["conditions"], lambda k: k["spec"]["volumes"],
                 lambda k: k["metadata"]["ownerReferences"]):
        with pytest.raises(NotKept):
            read(kept)


def test_a_kept_node_gives_the_same_facts_and_drops_the_rest() -> None:
    node = MakeNode("n0").cpu_flags({"AVX2", "AVX512F"}).registered().manifest()
    node["status"]["images"] = [{"names": ["a"], "sizeBytes": 1}]
    node["metadata"]["managedFields"] = [{"manager": "kubelet"}]
    kept = rows()["nodes"].keep(node)
    assert from_node(kept) == from_node(node)
    with pytest.raises(NotKept):
        kept["status"]["images"]


def test_kept_strings_are_shared_between_objects() -> None:
    a, b = (rows()["nodes"].keep(json.loads(json.dumps(
        MakeNode(n).cpu_flags({"AVX2"}).registered().manifest()))) for n in ("a", "b"))
    ka = next(k for k in a["metadata"]["labels"] if "AVX2" in k)
    kb = next(k for k in b["metadata"]["labels"] if "AVX2" in k)
    assert ka is kb and a["metadata"]["labels"][ka] is b["metadata"]["labels"][kb]


def test_a_value_of_the_wrong_shape_is_kept_for_the_reader_to_report() -> None:
    kept = rows()["nodes"].keep({"kind": "Node", "metadata": {"name": "n"},
                                 "spec": {"taints": "all"}, "status": {}})
    with pytest.raises(NodeFactsError, match=r"spec\.taints: expected a list of taints"):
        from_node(kept)


def rows() -> dict[str, Watched]:
    return {w.name: w for w in WATCHED}


def _docs_table() -> list[tuple[str, str, str]]:
    text = (ROOT / "docs" / "operator.md").read_text()
    section = text.split("## What the watches keep", 1)[1].split("\n## ", 1)[0]
    out = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0] not in ("kind", "---"):
            out.append((cells[0], cells[1].strip("`"), cells[2]))
    return out


def test_the_docs_table_of_what_is_kept_is_the_code_s() -> None:
    assert _docs_table() == list(watched.table())


def test_the_operators_pass_over_kept_objects_equals_the_pass_over_raw_ones() -> None:
    """The operator's whole pass (`observe` + `plan_pass`) over a generated
    cluster (benchmarks/planner.py: nodes with NFD labels, taints, cordons, images,
    managedFields; converged models with status; their pods, claims, ConfigMaps and
    Services; DaemonSet pods) as the watches keep it: every read of a dropped
    field would raise (a failed model here, or the pass); the result is the one
    the whole objects give."""
    _, bodies = watched_bodies(120)
    bodies["pods"] += [_stuck_pod(bodies["pods"][0]), _terminating(bodies["pods"][1])]
    bodies["volumes"] = [{"metadata": {"name": "pv"}, "spec": {"nodeAffinity": {"required": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "kubernetes.io/hostname",
                                                     "operator": "In",
                                                     "values": ["node-00001"]}]}]}}}}]
    raw = Snapshot(**{w.name: [b for b in bodies.get(w.name, []) if w.selected(b)]
                      for w in WATCHED})
    kept = Snapshot(**{w.name: [w.keep(b) for b in getattr(raw, w.name)] for w in WATCHED})

    def run(snap: Snapshot) -> tuple[Any, ...]:
        obs = observe(snap)
        out = plan_pass(obs, NOW, OPTIONS, placed={}, avoid={})
        assert [w.failure for w in out.work if w.failure] == []
        reaches = {v.name: [n for n in obs.nodes.values() if volume_reaches(v, n)]
                   for v in obs.volumes.values()}
        return (obs.nodes, obs.bad_nodes, obs.pods, obs.claims, obs.objects, reaches,
                obs.usage, unschedulable(obs), {k: (m.error, m.status, m.uid, m.generation)
                                                for k, m in obs.models.items()},
                out.placed, [(w.model.key, w.changes, w.status) for w in out.work])

    got, want = run(kept), run(raw)
    assert got == want
    assert len(got[2]) > 50 and got[7]  # pods read, a stuck one among them
    assert [n.name for n in got[5]["pv"]] == ["node-00001"]


def _stuck_pod(pod: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(pod)
    out["metadata"]["name"] += "-stuck"
    out["metadata"]["labels"][LABEL_REPLICA] = "1"
    del out["spec"]["nodeName"]
    out["status"] = {"phase": "Pending", "conditions": [{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "lastTransitionTime": NOW, "message": "0/3 nodes are available"}]}
    return out


def _terminating(pod: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(pod)
    out["metadata"]["deletionTimestamp"] = NOW
    return out
