"""The resources the operator watches, in one table. Pure.

Each row names a field of `observed.Snapshot` and says what kopf watches for
it (group, version, plural, label selector) and what the in-memory index keeps
of each object. `handlers` registers one index and one trigger per row and the
reconciler builds its `Snapshot` from the rows by name, so a resource is added
or changed here and nowhere else (tests/unit/test_watched.py holds the table
to the snapshot's fields).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from localmodel import GROUP, PLURAL, VERSION
from localmodel.contract import CONTAINER_GATEWAY, OWNED_SELECTOR, VOLUME_WEIGHTS
from localmodel.gaps import kept_image_waits

Raw = Mapping[str, Any]
Keep = Callable[[Raw], dict[str, Any]]


def _section(body: Raw, name: str) -> Mapping[str, Any]:
    value = body.get(name)
    return value if isinstance(value, Mapping) else {}


def whole(body: Raw) -> dict[str, Any]:
    return dict(body)


def metadata_only(body: Raw) -> dict[str, Any]:
    return {"metadata": dict(_section(body, "metadata"))}


def reduced_pod(body: Raw) -> dict[str, Any]:
    """What placement, readiness and the changes read of a pod (every pod in the
    cluster is indexed: memory stays small in big clusters)."""
    meta, spec, status = (_section(body, n) for n in ("metadata", "spec", "status"))

    def resources(containers: Any) -> list[dict[str, Any]]:
        # The gateway's image too: whether its speed may be a peer's (controller/speed.py).
        return [{"resources": c.get("resources") or {},
                 **({"name": CONTAINER_GATEWAY, "image": c.get("image")}
                    if c.get("name") == CONTAINER_GATEWAY else {})}
                for c in containers or []]

    return {
        "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "labels", "annotations",
                                          "ownerReferences", "deletionTimestamp") if k in meta},
        "spec": {
            "nodeName": spec.get("nodeName"),
            "containers": resources(spec.get("containers")),
            "initContainers": resources(spec.get("initContainers")),
            "overhead": spec.get("overhead"),
            "volumes": [v for v in spec.get("volumes") or [] if v.get("name") == VOLUME_WEIGHTS],
        },
        "status": {"phase": status.get("phase"), "conditions": status.get("conditions") or [],
                   # where the operator reads a Ready replica's gateway speed
                   **({"podIP": status["podIP"]} if status.get("podIP") else {}),
                   # an image the kubelet cannot pull, said in the model's status
                   **({"containerStatuses": w} if (w := kept_image_waits(status)) else {})},
    }


def claim(body: Raw) -> dict[str, Any]:
    return {"metadata": dict(_section(body, "metadata")), "spec": dict(_section(body, "spec"))}


def volume(body: Raw) -> dict[str, Any]:
    return {"metadata": {"name": _section(body, "metadata").get("name")},
            "spec": {"nodeAffinity": _section(body, "spec").get("nodeAffinity")}}


@dataclass(frozen=True)
class Watched:
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
    Watched("localmodels", GROUP, VERSION, PLURAL, whole),
    Watched("nodes", "", "v1", "nodes", whole),
    Watched("pods", "", "v1", "pods", reduced_pod),
    Watched("claims", "", "v1", "persistentvolumeclaims", claim, OWNED_SELECTOR),
    Watched("volumes", "", "v1", "persistentvolumes", volume),
    Watched("configmaps", "", "v1", "configmaps", metadata_only, OWNED_SELECTOR),
    Watched("services", "", "v1", "services", metadata_only, OWNED_SELECTOR),
    Watched("networkpolicies", "networking.k8s.io", "v1", "networkpolicies", metadata_only,
            OWNED_SELECTOR),
    # whether a claim can bind: its class exists, or a default one (localmodel/gaps.py)
    Watched("storageclasses", "storage.k8s.io", "v1", "storageclasses", metadata_only),
)
