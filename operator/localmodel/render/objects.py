"""Every object of one LocalModel: the ConfigMap its engine's pods mount,
the weights claims, the pods and the Service."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from localmodel.api import LocalModel
from localmodel.contract import ANNOTATION_NODE, ANNOTATION_POD_SPEC_HASH, ANNOTATION_THREADS
from localmodel.facts.quantity import format_bytes
from localmodel.podspec import Manifest
from localmodel.render.applied import applied_objects
from localmodel.render.digests import manifest_hash
from localmodel.render.names import Meta, claim_owned, pod_name
from localmodel.render.plan import RenderOptions, ReplicaPlan, replica_claim
from localmodel.render.pods import build_pod_spec


def render_claim(lm: LocalModel, r: ReplicaPlan, meta: Meta | None = None) -> Manifest:
    spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": format_bytes(r.tuning.storage_bytes)}},
    }
    if lm.spec.storage.storage_class_name:
        spec["storageClassName"] = lm.spec.storage.storage_class_name
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": (meta or Meta(lm))(
            replica_claim(lm, r), owned=claim_owned(lm), replica=r.replica
        ),
        "spec": spec,
    }


def render_pod(
    lm: LocalModel,
    r: ReplicaPlan,
    options: RenderOptions,
    meta: Meta | None = None,
) -> Manifest:
    spec = build_pod_spec(lm, r, options)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": (meta or Meta(lm))(
            pod_name(lm, r.replica),
            replica=r.replica,
            annotations={
                ANNOTATION_NODE: r.node,
                ANNOTATION_THREADS: str(r.tuning.threads),
                ANNOTATION_POD_SPEC_HASH: manifest_hash(spec),
            },
        ),
        "spec": spec,
    }


def render_objects(
    lm: LocalModel,
    replicas: Sequence[ReplicaPlan],
    options: RenderOptions | None = None,
) -> list[Manifest]:
    """Every object for one LocalModel: ConfigMap (Ollama's Modelfiles), claims,
    pods, Service, NetworkPolicy (when wanted)."""
    options = options or RenderOptions()
    replicas = sorted(replicas, key=lambda r: r.replica)
    meta = Meta(lm)
    applied = applied_objects(lm, replicas, meta, options=options)
    configmap = [o for o in applied if o["kind"] == "ConfigMap"]
    return [
        *configmap,
        *(render_claim(lm, r, meta) for r in replicas),
        *(render_pod(lm, r, options, meta) for r in replicas),
        *(o for o in applied if o["kind"] != "ConfigMap"),  # the Service, the NetworkPolicy
    ]
