"""The pieces of a pod manifest that the renderer and the engine adapters both
write: the `Manifest` type, Pod Security contexts, a container's env and
resources, the probe periods, and the startup probe's bound, derived from
a model's expected load time (`expected_load_seconds`, `startup_bound_seconds`;
doctor reads them too). It sits below both (the renderer builds the pod, an adapter its
engine's containers), so neither borrows them from the other."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from localmodel.engines import facts

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


# --- A model's start: its expected load time and the startup probe's bound ---
#
# A load reads the whole GGUF file from the weights volume: llama-server maps
# it with MAP_POPULATE (llama.cpp src/llama-model-loader.cpp, init_mappings;
# src/llama-mmap.cpp), Ollama's child reads it into memory (mmap off on CPU),
# and on AVX2 llama.cpp repacks the Q4_K tensors at load: CPU work per byte.
# So the expected load is the engine's fixed cost (its process, the graph
# reserve: EngineFacts.LOAD_FIXED_SECONDS), its work per GiB with the file in
# the page cache (LOAD_SECONDS_PER_GIB), both measured, plus the read of the
# file at the volume's speed. No node publishes its volume's read speed yet:
# the default is a conservative 50 MB/s (a network volume or a busy disk), see
# docs/benchmarks.md#start-time-at-real-sizes-benchmarksstartpy.
DEFAULT_DISK_BYTES_PER_SECOND = 50 * 10**6
# The startup probe allows STARTUP_MULTIPLE times the expected load, and never
# less than STARTUP_FLOOR_SECONDS: the 30 minutes every llama-server pod had
# before the bound was derived. A bound too short restarts a healthy load
# forever (the kubelet kills the container, the next load starts from zero);
# one too long only notices a hung load late, so the bound is generous and
# the floor stays.
STARTUP_MULTIPLE = 10
STARTUP_FLOOR_SECONDS = 1800
STARTUP_PERIOD_SECONDS = 5
_GIB = 1024**3


def expected_load_seconds(
    weights_bytes: int, engine: str, disk_bytes_per_second: float | None = None
) -> float:
    """How long `engine` takes to load `weights_bytes` of weights from a volume
    that reads `disk_bytes_per_second` (None, or not positive: the default),
    from a cold page cache: its fixed cost + its work per GiB + the read."""
    costs = facts(engine)
    speed = disk_bytes_per_second if disk_bytes_per_second and disk_bytes_per_second > 0 \
        else DEFAULT_DISK_BYTES_PER_SECOND
    weights = max(weights_bytes, 0)
    return (costs.LOAD_FIXED_SECONDS + costs.LOAD_SECONDS_PER_GIB * weights / _GIB
            + weights / speed)


def startup_bound_seconds(expected_seconds: float) -> int:
    """How long the startup probe lets a load take: STARTUP_MULTIPLE times the
    expected load, at least STARTUP_FLOOR_SECONDS, in whole probe periods."""
    wanted = max(STARTUP_MULTIPLE * expected_seconds, STARTUP_FLOOR_SECONDS)
    return STARTUP_PERIOD_SECONDS * math.ceil(wanted / STARTUP_PERIOD_SECONDS)


def startup_probe_timing(
    bound_seconds: int, period: int = STARTUP_PERIOD_SECONDS
) -> dict[str, int]:
    """A startup probe's period and failure threshold that allow `bound_seconds`
    (never below the floor: a tuning without a decided bound keeps the floor),
    asked every `period` seconds (`probe_periods`: every second for a model a
    request wakes)."""
    bound = max(bound_seconds, STARTUP_FLOOR_SECONDS)
    return {"periodSeconds": period, "failureThreshold": math.ceil(bound / period)}
