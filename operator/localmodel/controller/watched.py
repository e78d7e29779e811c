"""The resources the operator watches, in one table. Pure.

Each row names a field of `snapshot.Snapshot` and says what kopf watches for
it (group, version, plural, label selector) and what the in-memory index keeps
of each object: only the fields the operator reads (`SHAPES`, kept as
`watch_shape.Kept`, which refuses a read of any other field). `handlers` registers
one index and one trigger per row and the reconciler builds its `Snapshot`
from the rows by name, so a resource is added or changed here and nowhere
else (tests/controller/test_watched.py holds the table to the snapshot's fields and
to docs/operator.md's table of what is kept).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from localmodel import GROUP, PLURAL, VERSION
from localmodel.contract import (
    ANNOTATION_APPLIED_HASH,
    ANNOTATION_NODE,
    ANNOTATION_POD_SPEC_HASH,
    LABEL_MANAGED_BY,
    LABEL_NAME,
    LABEL_REPLICA,
    LABEL_ROLE,
    MANAGED_BY,
    OWNED_SELECTOR,
)
from localmodel.controller.watch_shape import MAP, SCALAR, WHOLE, Only, Shape, Spec
from localmodel.gaps import DEFAULT_CLASS_ANNOTATIONS, kept_container_statuses

Raw = Mapping[str, Any]
Keep = Callable[[Raw], Mapping[str, Any]]


def _section(body: Raw, name: str) -> Mapping[str, Any]:
    value = body.get(name)
    return value if isinstance(value, Mapping) else {}


# What each kind's readers read (objects.py, volumes.py, facts/node.py,
# facts/pod.py); `watch_shape.Shape` refuses a read of anything else. The docs'
# table (docs/operator.md, What the watches keep) is printed from these.
_OWNER_REFS: Spec = [{"apiVersion": SCALAR, "kind": SCALAR, "uid": SCALAR, "controller": SCALAR}]
_REQUESTS: Spec = {"cpu": SCALAR, "memory": SCALAR}
_CONTAINERS: Spec = [{"name": SCALAR, "image": SCALAR, "resources": {"requests": _REQUESTS}}]
_USAGE_SPEC: dict[str, Spec] = {  # what the scheduler charges a node for a pod (facts/pod.py)
    "nodeName": SCALAR,
    "containers": [{"resources": {"requests": _REQUESTS}}],
    "initContainers": [{"resources": {"requests": _REQUESTS}}],
    "overhead": _REQUESTS,
}
_ENDED: Spec = {"exitCode": SCALAR, "reason": SCALAR, "message": SCALAR}
# image waits and failing containers only, cut (pod() below; localmodel/gaps.py)
_CONTAINER_STATUSES: Spec = [{
    "name": SCALAR, "image": SCALAR, "restartCount": SCALAR,
    "state": {"waiting": {"reason": SCALAR, "message": SCALAR}, "terminated": _ENDED},
    "lastState": {"terminated": _ENDED}}]
_OURS_LABELS = Only(LABEL_MANAGED_BY, LABEL_NAME, LABEL_REPLICA)
# A pod of ours is a replica's, or a doorman's (its role: render/doorman.py).
_POD_LABELS = Only(LABEL_MANAGED_BY, LABEL_NAME, LABEL_REPLICA, LABEL_ROLE)
_OWNED_META: dict[str, Spec] = {
    "name": SCALAR, "namespace": SCALAR, "uid": SCALAR, "labels": _OURS_LABELS,
    "ownerReferences": _OWNER_REFS, "deletionTimestamp": SCALAR}

SHAPES: dict[str, Shape] = {
    "localmodels": Shape("LocalModel", {
        "apiVersion": SCALAR, "kind": SCALAR,
        "metadata": {"name": SCALAR, "namespace": SCALAR, "uid": SCALAR,
                     "generation": SCALAR, "resourceVersion": SCALAR},
        "spec": WHOLE,  # parsed in full (api/): every field is read
        "status": WHOLE,  # the operator's own, compared with the next one it writes
    }),
    "nodes": Shape("Node", {
        "kind": SCALAR,
        "metadata": {"name": SCALAR, "uid": SCALAR, "resourceVersion": SCALAR,
                     "labels": MAP},  # selectors, zones and CPU facts may name any label
        "spec": {"taints": [{"key": SCALAR, "value": SCALAR, "effect": SCALAR}],
                 "unschedulable": SCALAR},
        "status": {"allocatable": _REQUESTS, "capacity": _REQUESTS},
    }),
    "pods": Shape("Pod (the operator's)", {
        "metadata": {**_OWNED_META, "labels": _POD_LABELS,
                     "annotations": Only(ANNOTATION_NODE, ANNOTATION_POD_SPEC_HASH)},
        "spec": {**_USAGE_SPEC, "containers": _CONTAINERS,  # the gateway's image: speed.py
                 # (a native sidecar is an init container that restarts: gaps.py)
                 "initContainers": [{"name": SCALAR, "restartPolicy": SCALAR,
                                     "resources": {"requests": _REQUESTS}}],
                 "volumes": [{"name": SCALAR,
                              "persistentVolumeClaim": {"claimName": SCALAR}}]},
        "status": {"phase": SCALAR, "podIP": SCALAR,
                   "conditions": [{"type": SCALAR, "status": SCALAR, "reason": SCALAR,
                                   "message": SCALAR, "lastTransitionTime": SCALAR}],
                   "containerStatuses": _CONTAINER_STATUSES,
                   "initContainerStatuses": _CONTAINER_STATUSES},
    }),
    "other pods": Shape("Pod (any other)", {
        "metadata": {"name": SCALAR, "namespace": SCALAR, "uid": SCALAR,
                     "labels": _OURS_LABELS},
        "spec": _USAGE_SPEC,
        "status": {"phase": SCALAR},
    }),
    "claims": Shape("PersistentVolumeClaim", {
        "metadata": _OWNED_META, "spec": {"volumeName": SCALAR, "storageClassName": SCALAR}}),
    "volumes": Shape("PersistentVolume", {
        "metadata": {"name": SCALAR},
        "spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [{
            "matchExpressions": [{"key": SCALAR, "operator": SCALAR, "values": WHOLE}],
            "matchFields": [{"key": SCALAR, "operator": SCALAR, "values": WHOLE}]}]}}}}),
    "owned": Shape("ConfigMap, Service, NetworkPolicy", {
        "metadata": {**_OWNED_META, "annotations": Only(ANNOTATION_APPLIED_HASH)}}),
    # whether a claim can bind: its class exists, or a default one (localmodel/gaps.py)
    "storageclasses": Shape("StorageClass", {
        "metadata": {"name": SCALAR, "annotations": Only(*DEFAULT_CLASS_ANNOTATIONS)}}),
}


def _shape(name: str) -> Keep:
    shape = SHAPES[name]
    return lambda body: shape.keep(body)


def pod(body: Raw) -> Mapping[str, Any]:
    """Every pod in the cluster is kept: the operator's with what placement,
    readiness, rolls and speed reads need; any other with its node's usage only."""
    labels = _section(_section(body, "metadata"), "labels")
    ours = labels.get(LABEL_MANAGED_BY) == MANAGED_BY
    if not ours:
        return SHAPES["other pods"].keep(body)  # type: ignore[no-any-return]
    # Of the container statuses, only an image the kubelet cannot pull and a
    # container that keeps failing (said in the model's status,
    # localmodel/gaps.py), their strings cut there.
    if "status" not in body:
        return SHAPES["pods"].keep(body)  # type: ignore[no-any-return]
    status = _section(body, "status")
    kept_status = {k: v for k, v in status.items()
                   if k not in ("containerStatuses", "initContainerStatuses")}
    kept_status |= kept_container_statuses(status)
    return SHAPES["pods"].keep({**body, "status": kept_status})  # type: ignore[no-any-return]


def table() -> Iterator[tuple[str, str, str]]:
    """(kind, field, what is kept) for every field every watch keeps: the docs'
    table (docs/operator.md, What the watches keep)."""
    for shape in SHAPES.values():
        for path, what in shape.fields():
            yield shape.kind, path, what


@dataclass(frozen=True)
class Watched:
    """One watch of the operator: the resource it lists, its label selector and what its index
    keeps of each object."""

    name: str  # the `Snapshot` field it fills
    group: str
    version: str
    plural: str
    keep: Keep  # what the index keeps of each object
    labels: Mapping[str, str] | None = None  # the watch's label selector

    @property
    def index_id(self) -> str:
        return f"{self.name}_idx"

    def selected(self, body: Raw) -> bool:
        """Whether the watch's label selector lets the object through."""
        labels = _section(_section(body, "metadata"), "labels")
        return all(labels.get(k) == v for k, v in (self.labels or {}).items())


WATCHED: tuple[Watched, ...] = (
    Watched("localmodels", GROUP, VERSION, PLURAL, _shape("localmodels")),
    Watched("nodes", "", "v1", "nodes", _shape("nodes")),
    Watched("pods", "", "v1", "pods", pod),
    Watched("claims", "", "v1", "persistentvolumeclaims", _shape("claims"), OWNED_SELECTOR),
    Watched("volumes", "", "v1", "persistentvolumes", _shape("volumes")),
    Watched("configmaps", "", "v1", "configmaps", _shape("owned"), OWNED_SELECTOR),
    Watched("services", "", "v1", "services", _shape("owned"), OWNED_SELECTOR),
    Watched("networkpolicies", "networking.k8s.io", "v1", "networkpolicies", _shape("owned"),
            OWNED_SELECTOR),
    Watched("storageclasses", "storage.k8s.io", "v1", "storageclasses",
            _shape("storageclasses")),
)
