"""The cluster `localmodel doctor` is tested against: what each finding needs.

Pods as they run after scheduling (``spec.nodeName`` set): the operator's own,
rendered by `desired_state` for the given nodes, and two pods someone started by
hand with a pre-fix Ollama image. Used by the unit tier (pure checks) and the
e2e tier (the same pods created on the real API server).

- ``chat``: a LocalModel with the gateway, planned on an AVX2 node;
- ``stray``: a hand-made Ollama pod on ``chat``'s node -> two models on a node;
- ``nogw``: a LocalModel with ``gateway.enabled: false`` -> served without the gateway;
- ``amx-legacy``: a hand-made Ollama 0.31.0 pod on an AMX node, no guard -> the AMX finding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from localmodel.api import LocalModel
from localmodel.desired import desired_state
from localmodel.facts import NodeFacts
from tests.builders import MakeLocalModel

NOW = "2026-12-01T00:00:00Z"
LEGACY_OLLAMA = "docker.io/ollama/ollama:0.31.0"

Manifest = dict[str, Any]


def local_models(namespace: str) -> list[LocalModel]:
    def on(instance_type: str) -> dict[str, Any]:
        return {"nodeSelector": {"node.kubernetes.io/instance-type": instance_type}}

    base = MakeLocalModel("chat").namespace(namespace).cpu(4)
    return [
        base.spec(placement=on("avx2-8")).obj(),
        base.named("nogw").spec(gateway={"enabled": False}, placement=on("small-2"), cpu=2,
                                context=4096).obj(),
    ]


def _hand_made(name: str, namespace: str, node: str, image: str) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "ollama",
                    "image": image,
                    "env": [{"name": "OLLAMA_CONTEXT_LENGTH", "value": "32768"}],
                    "resources": {"limits": {"cpu": "8", "memory": "24Gi"}},
                }
            ],
        },
    }


def scenario_pods(nodes: Sequence[NodeFacts], namespace: str, amx_node: str) -> list[Manifest]:
    """Every pod of the scenario, each with the node it runs on."""
    state = desired_state(local_models(namespace), list(nodes), now=NOW)
    pods: list[Manifest] = []
    for result in state.models:
        for obj in result.objects:
            if obj["kind"] == "Pod":
                obj["spec"]["nodeName"] = obj["metadata"]["annotations"]["localmodel.dev/node"]
                pods.append(obj)
    chat = next(p for p in pods if p["metadata"]["labels"]["localmodel.dev/name"] == "chat")
    pods.append(_hand_made("stray", namespace, chat["spec"]["nodeName"], LEGACY_OLLAMA))
    pods.append(_hand_made("amx-legacy", namespace, amx_node, LEGACY_OLLAMA))
    return pods


def chat_pod_key(pods: Sequence[Manifest]) -> str:
    chat = next(
        p for p in pods if p["metadata"].get("labels", {}).get("localmodel.dev/name") == "chat"
    )
    return f"{chat['metadata']['namespace']}/{chat['metadata']['name']}"
