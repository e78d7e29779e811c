"""The pieces of a pod manifest that the renderer and the engine adapters both
write: the `Manifest` type, Pod Security contexts, a container's env and
resources. It sits below both (the renderer builds the pod, an adapter its
engine's containers), so neither borrows them from the other."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# A Kubernetes object, or a part of one, as the renderer writes it.
Manifest = dict[str, Any]


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
