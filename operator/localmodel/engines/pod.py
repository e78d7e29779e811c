"""An engine adapter's pod part (engines/adapter.py): what the renderer
(localmodel/render/) asks of an engine to build a model's pods.

The renderer decides the pod (bound to its node, the weights claim, the
gateway sidecar, the digests); the engine says its containers and init
steps, their readiness and health, its port and what of the model's ConfigMap
its pods mount. Its inputs are typed here by what they must offer, so the
engines import nothing of the renderer (the renderer imports them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from localmodel.api import LocalModel
from localmodel.facts.quantity import format_bytes

if TYPE_CHECKING:  # the rules' shapes: `import localmodel.rules` would import the registry
    from localmodel.rules.model import Tuning

# A Kubernetes object, or a part of one, as the renderer writes it.
Manifest = dict[str, Any]


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
        replicas, cpu or placement: see `incremental.PodParts`), the replica's
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


# Pod Security (kubernetes.io/docs/concepts/security/pod-security-standards/):
# the user every container that can runs as: the operator image's own
# (Dockerfile `USER 65532:65532`), numeric, so `runAsNonRoot` is checked
# without reading the image's /etc/passwd.
NONROOT_UID = 65532


def seccomp() -> Manifest:
    """A pod `securityContext` with the runtime's default seccomp profile."""
    return {"seccompProfile": {"type": "RuntimeDefault"}}


def restricted_pod(uid: int = NONROOT_UID) -> Manifest:
    """A pod `securityContext` for the `restricted` level: every container
    runs as ``uid`` (not root), the runtime's default seccomp profile, and the
    volumes group-writable by ``uid``'s group (`fsGroup`), so a non-root init
    step can write the weights volume."""
    return {"runAsNonRoot": True, "runAsUser": uid, "runAsGroup": uid, "fsGroup": uid, **seccomp()}


def container_security(read_only_root: bool, uid: int | None = None) -> Manifest:
    """A container's `securityContext`: no capabilities, no privilege
    escalation, the root filesystem read-only when it writes nothing there;
    with ``uid``, that user (not root) whatever the pod says. A new object
    each time: a manifest never shares a part (YAML would write an alias)."""
    context: Manifest = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    if read_only_root:
        context["readOnlyRootFilesystem"] = True
    if uid is not None:
        context |= {"runAsNonRoot": True, "runAsUser": uid, "runAsGroup": uid}
    return context


def env_list(values: Mapping[str, str]) -> list[dict[str, str]]:
    """A container's `env`, from name -> value."""
    return [{"name": k, "value": v} for k, v in values.items()]


def resources(cpu: str, memory: str) -> dict[str, Any]:
    """A container's `resources`: requests equal to limits."""
    both = {"cpu": cpu, "memory": memory}
    return {"requests": dict(both), "limits": dict(both)}


def engine_env(lm: LocalModel, t: Tuning) -> list[dict[str, str]]:
    """The engine container's `env`: the tuning's, then the user's (`spec.env`,
    which the API keeps off the variables the rules manage)."""
    return env_list(dict(t.env) | {e.name: e.value for e in lm.spec.env})


def engine_resources(t: Tuning) -> dict[str, Any]:
    """The engine's and its init steps' `resources`: the tuning's whole CPUs and memory."""
    return resources(str(t.cpu), format_bytes(t.memory_bytes))
