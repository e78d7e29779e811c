"""What a Pod object asks of its node. Pure.

A pod's effective request is what the scheduler charges the node for it
(kube-scheduler `computePodResourceRequest`): the sum over its containers, or
the largest init container's request if that is larger (init containers run
one at a time, before the others), plus the pod's `overhead`. Pods that have
finished (Succeeded/Failed) hold nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from localmodel.facts.quantity import parse_bytes, parse_cpu_milli

_FINISHED = ("Succeeded", "Failed")


def _requests(container: Any) -> tuple[int, int]:
    if not isinstance(container, Mapping):
        return 0, 0
    resources = container.get("resources")
    requests = resources.get("requests") if isinstance(resources, Mapping) else None
    if not isinstance(requests, Mapping):
        return 0, 0
    try:
        cpu = parse_cpu_milli(requests["cpu"]) if "cpu" in requests else 0
        memory = parse_bytes(requests["memory"]) if "memory" in requests else 0
    except (ValueError, TypeError):
        return 0, 0  # the API server validated it; an unreadable value counts as nothing
    return cpu, memory


def pod_requests(pod: Mapping[str, Any]) -> tuple[int, int]:
    """(milli-CPUs, bytes) the scheduler charges a pod's node for it."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return 0, 0
    status = pod.get("status")
    if isinstance(status, Mapping) and status.get("phase") in _FINISHED:
        return 0, 0
    cpu = memory = 0
    for c in spec.get("containers") or []:
        c_cpu, c_mem = _requests(c)
        cpu, memory = cpu + c_cpu, memory + c_mem
    for c in spec.get("initContainers") or []:
        i_cpu, i_mem = _requests(c)
        cpu, memory = max(cpu, i_cpu), max(memory, i_mem)
    overhead = spec.get("overhead")
    if isinstance(overhead, Mapping):
        o_cpu, o_mem = _requests({"resources": {"requests": overhead}})
        cpu, memory = cpu + o_cpu, memory + o_mem
    return cpu, memory


def pod_node(pod: Mapping[str, Any]) -> str | None:
    spec = pod.get("spec")
    node = spec.get("nodeName") if isinstance(spec, Mapping) else None
    return node if isinstance(node, str) and node else None
