"""One stored object, read: a LocalModel (parsed, or the field error that stops
it), and the pods (its replicas' and its doormen), claims, ConfigMaps and
Services the operator recognises as its own. Pure.

The operator's objects are recognised by its labels *and* (for everything the
LocalModel owns) an owner reference to the LocalModel, so nothing the operator
did not create is ever taken for its own. `observed.py` reads a whole snapshot
with these.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from localmodel import API_VERSION, KIND
from localmodel.api import LocalModel, LocalModelStatus, parse_local_model
from localmodel.api.parse import parse_status
from localmodel.contract import (
    ANNOTATION_APPLIED_HASH,
    ANNOTATION_NODE,
    ANNOTATION_POD_SPEC_HASH,
    CONTAINER_GATEWAY,
    LABEL_MANAGED_BY,
    LABEL_NAME,
    LABEL_REPLICA,
    LABEL_ROLE,
    MANAGED_BY,
    ROLE_DOORMAN,
    VOLUME_WEIGHTS,
)
from localmodel.errors import InvalidObject, format_errors
from localmodel.facts.pod import pod_node
from localmodel.gaps import ContainerFailure, ImageWait, failing_containers, image_waits

Raw = Mapping[str, Any]
Key = tuple[str, str]  # (namespace, name)


@dataclass(frozen=True)
class ModelObject:
    """One LocalModel as stored: parsed, or the reason it cannot be."""

    namespace: str
    name: str
    uid: str
    generation: int | None
    model: LocalModel | None
    error: str  # empty when `model` parsed
    status: LocalModelStatus | None  # what is stored (None if absent or unreadable)
    resource_version: str = ""
    key: str = field(init=False, repr=False, compare=False)  # "namespace/name"

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", f"{self.namespace}/{self.name}")


@dataclass(frozen=True)
class OwnedPod:
    """What the operator reads of a pod it owns: its model, replica, node, spec hash and state."""

    namespace: str
    name: str
    uid: str
    model: str  # "namespace/name" of the LocalModel
    owner_uid: str
    replica: int
    node: str | None
    spec_hash: str
    ready: bool
    terminating: bool
    claim: str | None
    # lastTransitionTime of PodScheduled=False/Unschedulable, if the pod is stuck
    unschedulable_since: str | None = None
    unschedulable_message: str = ""
    ip: str | None = None  # status.podIP: where its gateway answers
    gateway_image: str | None = None  # the image its gateway container runs
    # containers waiting on an image the kubelet cannot pull (localmodel/gaps.py)
    image_waits: tuple[ImageWait, ...] = ()
    # containers that keep failing, bounded and cleaned (localmodel/gaps.py)
    failing: tuple[ContainerFailure, ...] = ()

    @property
    def key(self) -> Key:
        return (self.namespace, self.name)


@dataclass(frozen=True)
class OwnedDoorman:
    """What the operator reads of a model's doorman pod (`localmodel.dev/role:
    doorman`, render/doorman.py): whose it is, its node, whether it is going."""

    namespace: str
    name: str
    uid: str
    model: str  # "namespace/name" of the LocalModel
    owner_uid: str
    node: str | None
    ready: bool
    terminating: bool

    @property
    def key(self) -> Key:
        return (self.namespace, self.name)


@dataclass(frozen=True)
class OwnedClaim:
    """What the operator reads of a model's claim: its replica, owner (None: retained), volume and
    state."""

    namespace: str
    name: str
    uid: str
    model: str
    replica: int
    owner_uid: str | None  # None: retained (not owned, survives the model)
    volume: str | None
    terminating: bool
    storage_class: str | None = None  # spec.storageClassName (localmodel/gaps.py)

    @property
    def key(self) -> Key:
        return (self.namespace, self.name)


@dataclass(frozen=True)
class OwnedObject:
    """A ConfigMap, Service or NetworkPolicy the operator applied."""

    kind: str
    namespace: str
    name: str
    uid: str
    model: str
    owner_uid: str
    applied_hash: str


def section(obj: Raw, name: str) -> Mapping[str, Any]:
    value = obj.get(name)
    return value if isinstance(value, Mapping) else {}


def metadata(obj: Raw) -> Mapping[str, Any]:
    return section(obj, "metadata")


def _str_map(value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        return {}
    return {str(k): str(v) for k, v in value.items()}


def _controller_uid(meta: Mapping[str, Any]) -> str | None:
    for ref in meta.get("ownerReferences") or []:
        if (
            isinstance(ref, Mapping)
            and ref.get("apiVersion") == API_VERSION
            and ref.get("kind") == KIND
            and ref.get("controller")
        ):
            uid = ref.get("uid")
            return str(uid) if uid else None
    return None


def _ours(meta: Mapping[str, Any]) -> tuple[str, str] | None:
    """(namespace, model name) when the object carries the operator's labels."""
    labels = _str_map(meta.get("labels"))
    if labels.get(LABEL_MANAGED_BY) != MANAGED_BY or not labels.get(LABEL_NAME):
        return None
    return str(meta.get("namespace") or ""), labels[LABEL_NAME]


def _replica(meta: Mapping[str, Any]) -> int | None:
    raw = _str_map(meta.get("labels")).get(LABEL_REPLICA, "")
    return int(raw) if raw.isdigit() else None


def parse_model(body: Raw) -> ModelObject:
    """A stored LocalModel: the spec strictly, the status tolerantly (fields
    others wrote are ignored; a status that cannot be read counts as none)."""
    meta = metadata(body)
    namespace = str(meta.get("namespace") or "")
    name = str(meta.get("name") or "")
    uid = str(meta.get("uid") or "")
    generation = meta.get("generation") if isinstance(meta.get("generation"), int) else None
    rv = str(meta.get("resourceVersion") or "")
    status: LocalModelStatus | None = None
    raw_status = body.get("status")
    if isinstance(raw_status, Mapping) and raw_status:
        try:
            status = parse_status(raw_status)
        except ValidationError:
            status = None
    without_status = {k: v for k, v in body.items() if k != "status"}
    try:
        model = parse_local_model(without_status, status)
    except InvalidObject as exc:
        return ModelObject(namespace, name, uid, generation, None, format_errors(exc.errors),
                           status, rv)
    return ModelObject(namespace, name, uid, generation, model, "", status, rv)


def _pod_ready(status: Mapping[str, Any]) -> bool:
    for c in status.get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == "Ready":
            return c.get("status") == "True"
    return False


def _unschedulable(status: Mapping[str, Any]) -> tuple[str | None, str]:
    """(since, message) of a PodScheduled=False/Unschedulable condition."""
    for c in status.get("conditions") or []:
        if (
            isinstance(c, Mapping)
            and c.get("type") == "PodScheduled"
            and c.get("status") == "False"
            and c.get("reason") == "Unschedulable"
        ):
            return str(c.get("lastTransitionTime") or "") or None, str(c.get("message") or "")
    return None, ""


def _pod_claim(spec: Mapping[str, Any]) -> str | None:
    for v in spec.get("volumes") or []:
        if isinstance(v, Mapping) and v.get("name") == VOLUME_WEIGHTS:
            pvc = v.get("persistentVolumeClaim")
            if isinstance(pvc, Mapping) and pvc.get("claimName"):
                return str(pvc["claimName"])
    return None


def owned_pod(body: Raw) -> OwnedPod | None:
    meta = metadata(body)
    who = _ours(meta)
    if who is None:  # any other pod: the watch keeps its node's usage only
        return None
    replica = _replica(meta)
    owner = _controller_uid(meta)
    if replica is None or owner is None:
        return None
    spec, status = section(body, "spec"), section(body, "status")
    annotations = _str_map(meta.get("annotations"))
    since, why = _unschedulable(status)
    return OwnedPod(
        namespace=who[0],
        name=str(meta.get("name")),
        uid=str(meta.get("uid") or ""),
        model=f"{who[0]}/{who[1]}",
        owner_uid=owner,
        replica=replica,
        node=pod_node(body) or annotations.get(ANNOTATION_NODE),
        spec_hash=annotations.get(ANNOTATION_POD_SPEC_HASH, ""),
        ready=_pod_ready(status) and not meta.get("deletionTimestamp"),
        terminating=bool(meta.get("deletionTimestamp")),
        claim=_pod_claim(spec),
        unschedulable_since=since,
        unschedulable_message=why,
        ip=str(status["podIP"]) if status.get("podIP") else None,
        gateway_image=_gateway_image(spec),
        image_waits=image_waits(status),
        failing=failing_containers(spec, status),
    )


def owned_doorman(body: Raw) -> OwnedDoorman | None:
    """A doorman pod of the operator's (its labels, the role, a controller
    owner, never a replica label); None for any other pod."""
    meta = metadata(body)
    who = _ours(meta)
    if who is None or _str_map(meta.get("labels")).get(LABEL_ROLE) != ROLE_DOORMAN:
        return None
    owner = _controller_uid(meta)
    if owner is None or _replica(meta) is not None:
        return None
    return OwnedDoorman(
        namespace=who[0],
        name=str(meta.get("name")),
        uid=str(meta.get("uid") or ""),
        model=f"{who[0]}/{who[1]}",
        owner_uid=owner,
        node=pod_node(body),
        ready=_pod_ready(section(body, "status")) and not meta.get("deletionTimestamp"),
        terminating=bool(meta.get("deletionTimestamp")),
    )


def _gateway_image(spec: Mapping[str, Any]) -> str | None:
    for c in spec.get("containers") or []:
        if isinstance(c, Mapping) and c.get("name") == CONTAINER_GATEWAY and c.get("image"):
            return str(c["image"])
    return None


def owned_claim(body: Raw) -> OwnedClaim | None:
    meta = metadata(body)
    who = _ours(meta)
    replica = _replica(meta)
    if who is None or replica is None:
        return None
    spec = section(body, "spec")
    return OwnedClaim(
        namespace=who[0],
        name=str(meta.get("name")),
        uid=str(meta.get("uid") or ""),
        model=f"{who[0]}/{who[1]}",
        replica=replica,
        owner_uid=_controller_uid(meta),
        volume=str(spec.get("volumeName")) if spec.get("volumeName") else None,
        terminating=bool(meta.get("deletionTimestamp")),
        storage_class=str(spec["storageClassName"]) if spec.get("storageClassName") else None,
    )


def owned_object(body: Raw, kind: str) -> OwnedObject | None:
    meta = metadata(body)
    who = _ours(meta)
    owner = _controller_uid(meta)
    if who is None or owner is None:
        return None
    return OwnedObject(
        kind=kind,
        namespace=who[0],
        name=str(meta.get("name")),
        uid=str(meta.get("uid") or ""),
        model=f"{who[0]}/{who[1]}",
        owner_uid=owner,
        applied_hash=_str_map(meta.get("annotations")).get(ANNOTATION_APPLIED_HASH, ""),
    )
