"""An engine adapter's pod part (engines/adapter.py): what the renderer
(localmodel/render/) asks of an engine to build a model's pods.

The renderer decides the pod (bound to its node, the weights claim, the
gateway sidecar, the digests); the engine says its containers and init
steps, their readiness and health, its port and what of the model's ConfigMap
its pods mount. Its inputs are typed here by what they must offer, so the
engines import nothing of the renderer (the renderer imports them); the
manifest pieces both write are `localmodel.podspec`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

from localmodel.api import LocalModel
from localmodel.facts.quantity import format_bytes
from localmodel.podspec import Manifest, env_list, resources
from localmodel.rules.model import Tuning


class PodOptions(Protocol):
    """What an engine's containers read of the render options (`render.RenderOptions`)."""

    @property
    def operator_image(self) -> str: ...

    @property
    def pull_policy(self) -> str: ...

    @property
    def allow_http_downloads(self) -> bool: ...

    @property
    def image_registry(self) -> str: ...


class PlacedReplica(Protocol):
    """What an engine's ConfigMap reads of a placed replica (`render.ReplicaPlan`)."""

    @property
    def replica(self) -> int: ...

    @property
    def tuning(self) -> Tuning: ...


class EngineContainers(NamedTuple):
    """An engine's containers in a pod: its init steps, in order, and its server."""

    inits: list[Manifest]
    engine: Manifest


class EnginePod(Protocol):
    """Its containers, init steps, readiness and health."""

    @property
    def port(self) -> int:
        """The server's port in the pod (the gateway's upstream)."""
        ...

    @property
    def pod_security(self) -> Manifest:
        """Its pods' `securityContext` (seccomp, and the user when every
        container runs as one: `restricted_pod`), see docs/operator.md, Pod Security."""
        ...

    @property
    def has_config(self) -> bool:
        """Whether its pods mount the model's ConfigMap (`config_data`)."""
        ...

    def containers(self, lm: LocalModel, tuning: Tuning, options: PodOptions) -> EngineContainers:
        """Its containers for one replica. They read the spec (never its
        replicas, cpu or placement: see `render.PodParts`), the replica's
        tuning and the options, nothing of the model's name or the node."""
        ...

    def config_data(self, lm: LocalModel, replicas: Sequence[PlacedReplica]) -> dict[str, str]:
        """The model's ConfigMap data, by the key (`config_key`) each pod mounts."""
        ...

    def config_key(self, replica: int) -> str:
        """The key of a replica's entry in the model's ConfigMap."""
        ...

    def config_volumes(self, configmap: str, key: str) -> list[Manifest]:
        """A pod's volumes besides the weights claim: the ConfigMap (named
        ``configmap``) entry ``key``, when it mounts one."""
        ...


def engine_env(lm: LocalModel, t: Tuning) -> list[dict[str, str]]:
    """The engine container's `env`: the tuning's, then the user's (`spec.env`,
    which the API keeps off the variables the rules manage)."""
    return env_list(dict(t.env) | {e.name: e.value for e in lm.spec.env})


def engine_resources(t: Tuning) -> dict[str, Any]:
    """The engine's and its init steps' `resources`: the tuning's whole CPUs and memory."""
    return resources(str(t.cpu), format_bytes(t.memory_bytes))
