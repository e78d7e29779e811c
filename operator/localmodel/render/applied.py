"""The objects the operator server-side applies and keeps equal to the spec
by their hash: the model's ConfigMap (what its engine's pods mount, Ollama's
Modelfiles) and its Service."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from localmodel.api import LocalModel
from localmodel.contract import LABEL_NAME, PORT_ENGINE, PORT_HTTP
from localmodel.podspec import Manifest
from localmodel.render.names import SERVICE_PORT, Meta, configmap_name
from localmodel.render.plan import RenderOptions, ReplicaPlan
from localmodel.render.pods import engine_pod
from localmodel.render.policy import render_network_policy, wants_network_policy


def configmap_data(lm: LocalModel, replicas: Sequence[ReplicaPlan]) -> dict[str, str]:
    """Each replica's entry, by the key its pod mounts (its engine's `config_data`)."""
    return engine_pod(lm).config_data(lm, replicas)


def render_configmap(
    lm: LocalModel,
    replicas: Sequence[ReplicaPlan],
    meta: Meta | None = None,
    data: Any = None,
) -> Manifest:
    """``data``: `configmap_data`, when the caller has it (or a text template's mark)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": (meta or Meta(lm))(configmap_name(lm)),
        "data": configmap_data(lm, replicas) if data is None else data,
    }


def render_service(lm: LocalModel, meta: Meta | None = None) -> Manifest:
    target = PORT_HTTP if lm.spec.gateway.enabled else PORT_ENGINE
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": (meta or Meta(lm))(lm.metadata.name),
        "spec": {
            "type": "ClusterIP",
            "selector": {LABEL_NAME: lm.metadata.name},
            "ports": [
                {"name": PORT_HTTP, "port": SERVICE_PORT, "targetPort": target, "protocol": "TCP"}
            ],
        },
    }


def applied_objects(
    lm: LocalModel,
    replicas: Sequence[ReplicaPlan],
    meta: Meta | None = None,
    data: Any = None,
    options: RenderOptions | None = None,
) -> list[Manifest]:
    """The objects the operator server-side applies and keeps equal to the spec
    by their hash: the ConfigMap its engine's pods mount (Ollama's Modelfiles,
    once a replica is placed), then the Service, then the NetworkPolicy when
    one is wanted (`render.policy`). ``data``: the ConfigMap's
    (`render_configmap`)."""
    options = options or RenderOptions()
    meta = meta or Meta(lm)
    replicas = sorted(replicas, key=lambda r: r.replica)
    configmap = (
        [render_configmap(lm, replicas, meta, data)]
        if replicas and engine_pod(lm).has_config
        else []
    )
    policy = (
        [render_network_policy(lm, options, meta)] if wants_network_policy(lm, options) else []
    )
    return [*configmap, render_service(lm, meta), *policy]
