"""kopf glue only: watches feed in-memory indexes and wake the reconciler.

No handler plans, renders or writes. kopf indexes are used (rather than a
store filled by event handlers) because kopf fills every index from its
initial listing *before* any other handler runs: the first trigger, and so the
first pass, sees the whole cluster, never a half-listed one that would make the
planner move models off nodes it has not seen yet. Pods are indexed in a
reduced form (what placement and readiness need), so memory stays small in big
clusters. kopf's own writes are all off: no progress annotations or finalizers
(no change handlers), no posting of log messages as Events, no peering.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import kopf

from localmodel import GROUP, PLURAL, VERSION
from localmodel.contract import (
    KOPF_ANNOTATIONS_PREFIX,
    KOPF_DIFFBASE_KEY,
    KOPF_FINALIZER,
    OWNED_SELECTOR,
    VOLUME_WEIGHTS,
)
from localmodel.controller.reconcile import Reconciler
from localmodel.kube import Credentials

_OURS = OWNED_SELECTOR


def _reduced_pod(body: Mapping[str, Any]) -> dict[str, Any]:
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    status = body.get("status") or {}

    def resources(containers: Any) -> list[dict[str, Any]]:
        return [{"resources": c.get("resources") or {}} for c in containers or []]

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
        "status": {"phase": status.get("phase"), "conditions": status.get("conditions") or []},
    }


def _metadata_only(body: Mapping[str, Any]) -> dict[str, Any]:
    return {"metadata": dict(body.get("metadata") or {})}


def _values(index: kopf.Index[Any, Any]) -> Iterable[Mapping[str, Any]]:
    for store in index.values():
        yield from store


def _reader(index: kopf.Index[Any, Any]) -> Callable[[], Iterable[Mapping[str, Any]]]:
    return lambda: _values(index)


def build_registry(reconciler: Reconciler, creds: Credentials) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()

    # Every handler is async: kopf runs sync ones in threads, and the reconciler's
    # trigger is an asyncio primitive of this loop.
    @kopf.on.startup(registry=registry)
    async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.posting.enabled = False  # the reconciler posts its own Events
        settings.scanning.disabled = True  # fixed resources: no CRD/namespace scanning
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
            prefix=KOPF_ANNOTATIONS_PREFIX)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix=KOPF_ANNOTATIONS_PREFIX, key=KOPF_DIFFBASE_KEY)
        settings.persistence.finalizer = KOPF_FINALIZER
        settings.watching.server_timeout = 270
        settings.watching.client_timeout = 300
        settings.networking.request_timeout = 60

    @kopf.on.login(registry=registry)
    async def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(
            server=creds.server,
            ca_path=creds.ca_file,
            insecure=creds.insecure or None,
            token=creds.bearer(),
            scheme="Bearer" if creds.bearer() else None,
            certificate_path=creds.cert_file,
            private_key_path=creds.key_file,
        )

    # ---- indexes: what the reconciler's snapshot reads ----------------------

    @kopf.index(GROUP, VERSION, PLURAL, registry=registry, id="localmodels_idx")
    async def localmodels_idx(uid: str, body: kopf.Body, **_: Any) -> dict[str, Any]:
        return {uid: dict(body)}

    @kopf.index("", "v1", "nodes", registry=registry, id="nodes_idx")
    async def nodes_idx(uid: str, body: kopf.Body, **_: Any) -> dict[str, Any]:
        return {uid: dict(body)}

    @kopf.index("", "v1", "pods", registry=registry, id="pods_idx")
    async def pods_idx(uid: str, body: kopf.Body, **_: Any) -> dict[str, Any]:
        return {uid: _reduced_pod(body)}

    @kopf.index("", "v1", "persistentvolumeclaims", labels=_OURS, registry=registry,
                id="claims_idx")
    async def claims_idx(uid: str, body: kopf.Body, **_: Any) -> dict[str, Any]:
        return {uid: {"metadata": dict(body.metadata), "spec": dict(body.spec)}}

    @kopf.index("", "v1", "persistentvolumes", registry=registry, id="volumes_idx")
    async def volumes_idx(uid: str, body: kopf.Body, **_: Any) -> dict[str, Any]:
        spec = body.spec
        return {uid: {"metadata": {"name": body.metadata.name},
                      "spec": {"nodeAffinity": spec.get("nodeAffinity")}}}

    @kopf.index("", "v1", "configmaps", labels=_OURS, registry=registry, id="configmaps_idx")
    async def configmaps_idx(uid: str, body: kopf.Body, **_: Any) -> dict[str, Any]:
        return {uid: _metadata_only(body)}

    @kopf.index("", "v1", "services", labels=_OURS, registry=registry, id="services_idx")
    async def services_idx(uid: str, body: kopf.Body, **_: Any) -> dict[str, Any]:
        return {uid: _metadata_only(body)}

    names = {
        "localmodels": "localmodels_idx",
        "nodes": "nodes_idx",
        "pods": "pods_idx",
        "claims": "claims_idx",
        "volumes": "volumes_idx",
        "configmaps": "configmaps_idx",
        "services": "services_idx",
    }

    # ---- triggers: any change wakes the one reconciler ----------------------

    async def wake(**kwargs: Any) -> None:
        if not reconciler.sources:
            for resource, index_name in names.items():
                reconciler.sources[resource] = _reader(kwargs[index_name])
            reconciler.synced.set()
        reconciler.trigger()

    for group, version, plural, labels in (
        (GROUP, VERSION, PLURAL, None),
        ("", "v1", "nodes", None),
        ("", "v1", "pods", None),
        ("", "v1", "persistentvolumeclaims", _OURS),
        ("", "v1", "persistentvolumes", None),
        ("", "v1", "configmaps", _OURS),
        ("", "v1", "services", _OURS),
    ):
        kopf.on.event(group, version, plural, labels=labels, registry=registry,
                      id=f"wake-{plural}")(wake)

    return registry
