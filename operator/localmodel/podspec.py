"""The pieces of a pod manifest that the renderer and the engine adapters both
write: the `Manifest` type, Pod Security contexts, a container's env and
resources, the probe periods. It sits below both (the renderer builds the pod, an adapter its
engine's containers), so neither borrows them from the other."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
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


@dataclass(frozen=True)
class ProbePeriods:
    """How often (s) the kubelet asks a model's containers: `startup` until the
    engine has loaded, `readiness` for the pod's life (the gateway's, or the
    engine's without it), `liveness` once started."""

    startup: int
    readiness: int
    liveness: int = 10

    def readiness_fields(self) -> dict[str, int]:
        """A readiness probe's period, and its failureThreshold where the
        kubelet's default (3) would not keep READINESS_PATIENCE: asked more
        often, a pod is seen Ready sooner, never dropped from its Service sooner."""
        failures = max(1, READINESS_PATIENCE // self.readiness)
        return {"periodSeconds": self.readiness} | (
            {"failureThreshold": failures} if failures != KUBELET_FAILURES else {})


# The one home of the probe periods. A probe passes up to one period after
# what it asks for is true. A model with `spec.idle` starts when a caller
# wakes it and waits: on the real node a re-created pod waited about 2.1 s for
# the 5 s startup probe and 0.8 s for the 5 s readiness probe, of a 6.6 s wake
# (docs/benchmarks.md, Waking a sleeping model), so its pods are asked every
# second. What that costs: the startup probe stops at its first success (one
# curl a second while the weights load); the readiness probe is the gateway's
# /ready, which asks the engine at most once a second (gateway/readiness.py
# READY_CACHE_SECONDS), and it is as patient with failures as before
# (READINESS_PATIENCE). Every other model keeps 5 s: its pods start at an
# apply or a roll, where no request waits on the second. Setting or removing
# `spec.idle` therefore rolls the pods once (their digest holds the probes).
# How long a readiness probe fails before the pod leaves its Service: three
# failures (the kubelet's default) 5 s apart, whatever the period.
KUBELET_FAILURES = 3
READINESS_PATIENCE = 15
PLAIN_PROBES = ProbePeriods(startup=5, readiness=5)
WAKING_PROBES = ProbePeriods(startup=1, readiness=1)


def probe_periods(wakes_on_request: bool) -> ProbePeriods:
    """The periods for a model's pods; `wakes_on_request`: it has `spec.idle`."""
    return WAKING_PROBES if wakes_on_request else PLAIN_PROBES
