"""A model's pod spec and its pieces: the engine's containers and init steps
(its adapter's pod part, engines/pod.py), the gateway sidecar, the affinity
to the planned node and the volumes."""

from __future__ import annotations

from dataclasses import dataclass

from localmodel.api import LocalModel
from localmodel.contract import VOLUME_WEIGHTS
from localmodel.engines.pod import EnginePod
from localmodel.engines.registry import engine
from localmodel.podspec import Manifest
from localmodel.render.gateway import build_gateway_container, gateway_volumes
from localmodel.render.names import configmap_name
from localmodel.render.plan import RenderOptions, ReplicaPlan, replica_claim
from localmodel.rules.model import Tuning


def engine_pod(lm: LocalModel) -> EnginePod:
    """The pod part of the model's engine's adapter."""
    return engine(lm.spec.engine.name).pod


def build_containers(
    lm: LocalModel, r: ReplicaPlan, options: RenderOptions
) -> tuple[list[Manifest], list[Manifest]]:
    """A pod's init containers and containers. They read the spec (never its
    replicas, cpu or placement: see `PodParts`), the replica's tuning and the
    options, nothing of the model's name or the replica's node."""
    inits, server = engine_pod(lm).containers(lm, r.tuning, options)
    containers = [server]
    if lm.spec.gateway.enabled:
        containers.append(build_gateway_container(lm, r, options))
    return [_says_why(c) for c in inits], [_says_why(c) for c in containers]


def _says_why(container: Manifest) -> Manifest:
    """A container whose failure says why: with nothing written to its
    termination message, the kubelet keeps the end of its log (at most 2 KiB
    or 80 lines) as `lastState.terminated.message`, which the model's status
    says, cut and cleaned (localmodel/gaps.py: ContainerFailing)."""
    return {**container, "terminationMessagePolicy": "FallbackToLogsOnError"}


@dataclass(frozen=True)
class Containers:
    """A pod's containers, as `PodParts` keeps them."""

    tuning: Tuning  # held: its id is part of the key
    inits: list[Manifest]
    containers: list[Manifest]
    json: dict[str, str]  # field -> its JSON text, for the pod spec's hash


def node_affinity(node: str) -> Manifest:
    """A pod's affinity: bound to its planned node."""
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            }
        }
    }


def volume_names(lm: LocalModel, r: ReplicaPlan) -> tuple[str, str, str]:
    """What a pod's volumes name: its weights claim, its ConfigMap, and the
    key of its replica's entry there."""
    return replica_claim(lm, r), configmap_name(lm), engine_pod(lm).config_key(r.replica)


def pod_volumes(pod: EnginePod, claim: str, configmap: str, key: str) -> list[Manifest]:
    """A pod's volumes: the weights claim, and what of the ConfigMap its engine mounts."""
    weights: Manifest = {"name": VOLUME_WEIGHTS, "persistentVolumeClaim": {"claimName": claim}}
    return [weights, *pod.config_volumes(configmap, key)]


def build_pod_spec(
    lm: LocalModel,
    r: ReplicaPlan,
    options: RenderOptions,
    parts: Containers | None = None,
) -> Manifest:
    """The pod spec: bound to the planned node, the containers, the volumes."""
    if parts is None:
        inits, containers = build_containers(lm, r, options)
    else:
        inits, containers = parts.inits, parts.containers
    return {
        "affinity": node_affinity(r.node),
        "initContainers": inits,
        "containers": containers,
        "volumes": [*pod_volumes(engine_pod(lm), *volume_names(lm, r)), *gateway_volumes(lm)],
        **pod_spec_rest(lm, options),
    }


def pod_spec_rest(lm: LocalModel, options: RenderOptions | None = None) -> Manifest:
    """A pod spec's fields besides its affinity, containers and volumes (the
    ones `pod_digest` has as text): they read the spec and the pull secrets."""
    # No ServiceAccount token: nothing in a model pod calls the API server.
    # The pod's securityContext is its engine's (seccomp, and the user when
    # every container can run as one: docs/operator.md, Pod Security).
    rest: Manifest = {
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "securityContext": engine_pod(lm).pod_security,
    }
    if options is not None and options.image_pull_secrets:
        # Each must exist in the model's namespace: a missing one is an image
        # that cannot be pulled, which the model's status says (localmodel/gaps.py).
        rest["imagePullSecrets"] = [{"name": s} for s in options.image_pull_secrets]
    if lm.spec.placement.node_selector:
        rest["nodeSelector"] = dict(lm.spec.placement.node_selector)
    if lm.spec.placement.tolerations:
        rest["tolerations"] = [
            t.model_dump(by_alias=True, exclude_none=True, mode="json")
            for t in lm.spec.placement.tolerations
        ]
    return rest
