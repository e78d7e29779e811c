"""The table of watched resources (controller/watched.py) is the snapshot, by name,
and the kopf registry is built from it: one index and one trigger per row."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from localmodel.contract import CONTAINER_GATEWAY, LABEL_MANAGED_BY, MANAGED_BY, VOLUME_WEIGHTS
from localmodel.controller.config import OperatorConfig
from localmodel.controller.handlers import build_registry
from localmodel.controller.observed import Snapshot
from localmodel.controller.reconcile import OperatorMetrics, Reconciler
from localmodel.controller.watched import WATCHED, reduced_pod
from localmodel.kube import Credentials


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


def test_a_pod_is_kept_reduced_to_what_placement_and_readiness_read() -> None:
    pod = {
        "metadata": {"name": "p", "namespace": "ai", "uid": "u", "labels": {"a": "b"},
                     "managedFields": [{"manager": "kubelet"}]},
        "spec": {"nodeName": "n1",
                 "containers": [{"name": "c", "image": "i", "env": [{"name": "X"}],
                                 "resources": {"requests": {"cpu": "1"}}}],
                 "volumes": [{"name": VOLUME_WEIGHTS, "persistentVolumeClaim": {"claimName": "w"}},
                             {"name": "kube-api-access", "projected": {}}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
                   "containerStatuses": [{"name": "c"}]},
    }
    kept = reduced_pod(pod)
    assert "managedFields" not in kept["metadata"]
    assert kept["spec"]["containers"] == [{"resources": {"requests": {"cpu": "1"}}}]
    assert kept["spec"]["volumes"] == [pod["spec"]["volumes"][0]]
    assert kept["status"] == {"phase": "Running", "conditions": pod["status"]["conditions"]}


def test_a_pods_ip_is_kept_for_reading_its_gateway_speed() -> None:
    pod = {"metadata": {"name": "p"}, "spec": {},
           "status": {"phase": "Running", "podIP": "10.85.0.7", "hostIP": "10.0.0.1"}}
    assert reduced_pod(pod)["status"] == {"phase": "Running", "conditions": [],
                                          "podIP": "10.85.0.7"}


def test_a_pods_gateway_image_is_kept_for_vouching_for_its_speed() -> None:
    pod = {"metadata": {"name": "p"},
           "spec": {"containers": [{"name": "engine", "image": "e", "resources": {}},
                                   {"name": CONTAINER_GATEWAY, "image": "g", "env": [],
                                    "resources": {}}]}}
    assert reduced_pod(pod)["spec"]["containers"] == [
        {"resources": {}}, {"resources": {}, "name": CONTAINER_GATEWAY, "image": "g"}]
