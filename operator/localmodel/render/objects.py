"""Every object of one LocalModel: the ConfigMap its engine's pods mount,
the weights claims, the pods and the Service."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

from localmodel.api import LocalModel
from localmodel.contract import ANNOTATION_NODE, ANNOTATION_POD_SPEC_HASH, ANNOTATION_THREADS
from localmodel.facts.quantity import format_bytes
from localmodel.podspec import Manifest
from localmodel.render.applied import applied_objects
from localmodel.render.digests import PodParts, manifest_hash, pod_digest
from localmodel.render.names import Meta, claim_owned, pod_name
from localmodel.render.plan import RenderOptions, ReplicaPlan, replica_claim
from localmodel.render.pods import Containers, build_pod_spec


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
    parts: Containers | None = None,
    meta: Meta | None = None,
) -> Manifest:
    spec = build_pod_spec(lm, r, options, parts)
    digest = manifest_hash(spec) if parts is None else pod_digest(lm, r, parts, options)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": (meta or Meta(lm))(
            pod_name(lm, r.replica),
            replica=r.replica,
            annotations={
                ANNOTATION_NODE: r.node,
                ANNOTATION_THREADS: str(r.tuning.threads),
                ANNOTATION_POD_SPEC_HASH: digest,
            },
        ),
        "spec": spec,
    }


def render_objects(
    lm: LocalModel,
    replicas: Sequence[ReplicaPlan],
    options: RenderOptions | None = None,
    parts: PodParts | None = None,
    key: Hashable = None,
) -> list[Manifest]:
    """Every object for one LocalModel: ConfigMap (Ollama's Modelfiles), claims,
    pods, Service, NetworkPolicy (when wanted). ``parts``: a pass's `PodParts` (``key``: the spec's
    `rules.spec_key`, when the caller has it)."""
    options = options or RenderOptions()
    replicas = sorted(replicas, key=lambda r: r.replica)
    meta = Meta(lm)
    applied = applied_objects(lm, replicas, meta, options=options)
    configmap = [o for o in applied if o["kind"] == "ConfigMap"]
    return [
        *configmap,
        *(render_claim(lm, r, meta) for r in replicas),
        *(
            render_pod(
                lm, r, options, None if parts is None else parts.containers(lm, r, options, key),
                meta,
            )
            for r in replicas
        ),
        *(o for o in applied if o["kind"] != "ConfigMap"),  # the Service, the NetworkPolicy
    ]
