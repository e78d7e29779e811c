"""The generated CRD and the rendered objects against a real API server and scheduler.

What a mock cannot show: CEL messages, defaulting, pruning, the status
subresource accepting what we render, printer columns, and rendered pods that
kube-scheduler really binds to the planned node with their weights claims.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from localmodel.api import parse_local_model
from localmodel.desired import ModelResult, desired_state
from localmodel.facts.node import from_node_list
from localmodel.render import RenderOptions
from tests.builders import MakeLocalModel
from tests.harness import TestCluster
from tests.harness.processes import wait_until

pytestmark = pytest.mark.e2e

NOW = "2026-11-29T00:00:00Z"


SHA = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GGUF = {"url": "https://models.example/gemma-3-270m-q4_k_m.gguf", "sha256": SHA}
LLAMA: dict[str, Any] = {"model": "gemma3:270m", "engine": {"name": "llama-server"}, "gguf": GGUF}


QWEN = MakeLocalModel("m").namespace(None)  # created in the request's namespace


def create(cluster: TestCluster, base: str, ns: str, obj: dict[str, Any]) -> tuple[int, Any]:
    return cluster.api().request("POST", f"{base}/namespaces/{ns}/localmodels", obj)


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        (
            {"kvCache": "q4_0", "flashAttention": "disabled"},
            "a quantized kvCache needs flash attention",
        ),
        ({"env": [{"name": "OLLAMA_HOST", "value": "x"}]}, "sets a variable the operator manages"),
        ({"env": [{"name": "A"}, {"name": "A"}]}, "each variable name may appear once"),
        ({"cpu": 0}, "spec.cpu: Invalid value: must be a positive integer or 'node'"),
        ({"cpu": "lots"}, "spec.cpu: Invalid value: must be a positive integer or 'node'"),
        ({"context": 100}, "spec.context"),
        ({"kvCache": "q2"}, "spec.kvCache"),
        ({"engine": {"name": "llama-server"}}, "engine llama-server serves a GGUF file"),
        ({"gguf": GGUF | {"sha256": "abc"}}, "spec.gguf.sha256"),
        (LLAMA | {"keepAlive": "5m"}, "llama-server always keeps its model loaded"),
        (LLAMA | {"placement": {"safeCpuPath": True}}, "Ollama's AMX workaround"),
        (LLAMA | {"gguf": GGUF | {"url": "https://h/blob?x=1"}}, "set gguf.file"),
        (LLAMA | {"gguf": GGUF | {"sha256": "abc"}}, "spec.gguf.sha256"),
        ({"env": [{"name": "LLAMA_ARG_THREADS", "value": "64"}]}, "operator manages"),
        ({"memory": "a lot"}, "spec.memory"),
        ({"gateway": {"enabled": False, "auth": {"keysSecretRef": {"name": "k", "key": "k"}}}},
         "auth needs the gateway"),
        ({"gateway": {"auth": {"keysSecretRef": {"name": "k", "key": "a/b"}}}},
         "spec.gateway.auth.keysSecretRef.key"),
        ({"gateway": {"overflow": {"url": "https://x/v1", "model": "m",
                                   "budget": {"requests": 1, "windowSeconds": 0}}}},
         "spec.gateway.overflow.budget.windowSeconds"),
        ({"gateway": {"networkPolicy": {"namespaces": ["Team_A"]}}},
         "spec.gateway.networkPolicy.namespaces[0]"),
        ({"gateway": {"networkPolicy": {"podLabels": {"bad key!": "x"}}}},
         "spec.gateway.networkPolicy.podLabels"),
    ],
)
def test_api_server_rejects_invalid_models_with_the_reason(
    cluster: TestCluster, crd: str, namespace: str, spec: dict[str, Any], words: str
) -> None:
    status, body = create(cluster, crd, namespace, QWEN.named("bad").spec(**spec).manifest())
    assert status == 422, body
    assert words in body["message"]


def test_defaults_filled_and_unknown_fields_pruned(
    cluster: TestCluster, crd: str, namespace: str
) -> None:
    obj = QWEN.named("qwen3").spec(
        colour="blue", placement={"nodeSelector": {"pool": "a"}, "shiny": True}).manifest()
    status, body = create(cluster, crd, namespace, obj)
    assert status == 201, body.get("message", body)
    spec = body["spec"]
    assert "colour" not in spec and "shiny" not in spec["placement"]
    assert (spec["cpu"], spec["context"], spec["slots"], spec["kvCache"]) == (4, 8192, 1, "f16")
    assert spec["engine"] == {"name": "ollama"}
    assert spec["placement"]["exclusive"] is True
    assert spec["storage"]["retain"] is True
    assert spec["gateway"]["maxQueue"] == 16
    # The defaulted object is a valid pydantic LocalModel: one API, two enforcers.
    parse_local_model(body)


def test_rendered_status_is_accepted_by_the_status_subresource(
    cluster: TestCluster, crd: str, namespace: str
) -> None:
    status, body = create(cluster, crd, namespace, QWEN.named("withstatus").spec(cpu=4).manifest())
    assert status == 201, body.get("message", body)
    model = parse_local_model(body)
    nodes = from_node_list(cluster.api().get("/api/v1/nodes"))
    result = desired_state([model], nodes, now=NOW).models[0]
    patch = {"status": result.status.model_dump(by_alias=True, exclude_none=True, mode="json")}
    path = f"{crd}/namespaces/{namespace}/localmodels/withstatus/status"
    after = cluster.api().merge_patch(path, patch)
    assert after["status"]["placements"][0]["threads"] == 4
    assert after["status"]["conditions"][1]["type"] == "Placed"
    assert after["spec"] == body["spec"]
    # A spec change through /status is ignored: the subresource owns only status.
    changed = copy.deepcopy(patch) | {"spec": {"cpu": 9}}
    assert cluster.api().merge_patch(path, changed)["spec"]["cpu"] == 4
    table = cluster.kubectl("get", "lm", "-n", namespace, "withstatus").stdout
    header = table.splitlines()[0].split()
    for column in ("MODEL", "ENGINE", "CPU", "CONTEXT", "READY", "NODES", "AGE"):
        assert column in header
    assert "qwen3:1.7b" in table and "0/1" in table


def test_kubectl_explain_teaches_the_api(cluster: TestCluster, crd: str) -> None:
    out = cluster.kubectl("explain", "localmodel.spec.cpu").stdout
    assert "threads" in out
    out = cluster.kubectl("explain", "lm.spec.placement.safeCpuPath").stdout
    assert "AMX" in out


def test_rendered_objects_schedule_onto_the_planned_nodes(
    cluster: TestCluster, crd: str, namespace: str
) -> None:
    """Plan against the cluster's real nodes, apply what render produced, and watch
    kube-scheduler bind each pod to its planned node with its weights claim bound
    to that node's local volume; deleting the model collects pods, keeps weights."""
    status, body = create(
        cluster,
        crd,
        namespace,
        QWEN.named("fleet").spec(
            cpu=6,
            replicas=2,
            placement={"nodeSelector": {"node.kubernetes.io/instance-type": "avx2-8"}},
            storage={"storageClassName": "local-disk", "size": "10Gi"},
        ).manifest(),
    )
    assert status == 201, body.get("message", body)
    model = parse_local_model(body)
    nodes = from_node_list(cluster.api().get("/api/v1/nodes"))
    result = desired_state([model], nodes, now=NOW, options=RenderOptions()).models[0]
    planned = {r.replica: r.node for r in result.replicas}
    assert len(set(planned.values())) == 2
    cluster.apply(yaml.safe_dump_all(list(result.objects)))
    api = cluster.api()

    def pods_running() -> bool:
        for replica, node in planned.items():
            pod = api.get(f"/api/v1/namespaces/{namespace}/pods/fleet-{replica}")
            if pod["spec"].get("nodeName") != node or pod["status"].get("phase") != "Running":
                return False
        return True

    wait_until("rendered pods to run on their planned nodes", pods_running, timeout=60)
    for replica, node in planned.items():
        pvc = api.get(
            f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/fleet-weights-{replica}"
        )
        assert pvc["status"]["phase"] == "Bound"
        pv = api.get(f"/api/v1/persistentvolumes/{pvc['spec']['volumeName']}")
        terms = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
        assert node in terms[0]["matchExpressions"][0]["values"]
        pod = api.get(f"/api/v1/namespaces/{namespace}/pods/fleet-{replica}")
        assert pod["status"]["qosClass"] == "Guaranteed"

    api.delete(f"{crd}/namespaces/{namespace}/localmodels/fleet")

    def collected() -> bool:
        return (
            all(
                api.status_of("GET", f"/api/v1/namespaces/{namespace}/pods/fleet-{r}") == 404
                for r in planned
            )
            and api.status_of("GET", f"/api/v1/namespaces/{namespace}/services/fleet") == 404
        )

    wait_until("pods and service to be garbage-collected with the model", collected, timeout=60)
    for replica in planned:  # storage.retain: the weights outlive the model
        path = f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/fleet-weights-{replica}"
        assert api.status_of("GET", path) == 200


def test_api_server_rejects_a_keyless_equal_toleration(
    cluster: TestCluster, crd: str, namespace: str
) -> None:
    bad = QWEN.named("tol").spec(
        placement={"tolerations": [{"operator": "Equal", "value": "x"}]}).manifest()
    status, body = create(cluster, crd, namespace, bad)
    assert status == 422, body
    assert "without a key must use operator Exists" in body["message"]


def _rendered_and_running(
    cluster: TestCluster, namespace: str, body: dict[str, Any], what: str
) -> tuple[dict[str, Any], ModelResult]:
    """What the operator would render of `body` (the LocalModel as the API server
    stored it), applied; once its first pod runs on its planned node: that pod,
    and the render."""
    model = parse_local_model(body)
    nodes = from_node_list(cluster.api().get("/api/v1/nodes"))
    result = desired_state([model], nodes, now=NOW).models[0]
    assert result.replicas, result.status.conditions
    node = result.replicas[0].node
    cluster.apply(yaml.safe_dump_all(list(result.objects)))
    api = cluster.api()
    path = f"/api/v1/namespaces/{namespace}/pods/{body['metadata']['name']}-0"

    def running() -> bool:
        pod = api.get(path)
        return pod["spec"].get("nodeName") == node and pod["status"].get("phase") == "Running"

    wait_until(f"{what} to run on its planned node", running, timeout=60)
    return api.get(path), result


def test_ollama_model_with_a_gguf_file_is_accepted_and_its_pod_schedules(
    cluster: TestCluster, crd: str, namespace: str
) -> None:
    """Ollama takes `gguf` (no registry pull): the API server accepts it, and
    the pod render makes of it, with the download step before the create
    step, is accepted and bound."""
    spec = {"model": "gemma3:270m", "gguf": GGUF, "cpu": 1,
            "storage": {"storageClassName": "local-disk", "size": "10Gi"}}
    status, body = create(cluster, crd, namespace, QWEN.named("gemma-air").spec(**spec).manifest())
    assert status == 201, body.get("message", body)
    assert body["spec"]["gguf"] == GGUF and body["spec"]["engine"]["name"] == "ollama"
    pod, _ = _rendered_and_running(cluster, namespace, body, "the Ollama pod")
    assert [c["name"] for c in pod["spec"]["initContainers"]] == ["download", "pull"]
    assert pod["spec"]["initContainers"][0]["securityContext"]["runAsUser"] == 0


def test_llama_server_model_is_accepted_and_its_pod_schedules_guaranteed(
    cluster: TestCluster, crd: str, namespace: str
) -> None:
    """A llama-server LocalModel passes the CRD's rules, and what render makes of
    it (pod with the download init step, claim, Service) is accepted and bound."""
    spec = LLAMA | {
        "cpu": 2,
        "storage": {"storageClassName": "local-disk", "size": "10Gi"},
        # AMX nodes: none of Ollama's AMX rules may fire for llama-server.
        "placement": {"nodeSelector": {"node.kubernetes.io/instance-type": "sapphire-rapids-32"}},
    }
    status, body = create(cluster, crd, namespace, QWEN.named("gemma").spec(**spec).manifest())
    assert status == 201, body.get("message", body)
    assert body["spec"]["gguf"] == GGUF and body["spec"]["engine"]["name"] == "llama-server"
    pod, result = _rendered_and_running(cluster, namespace, body, "the llama-server pod")
    assert pod["status"]["qosClass"] == "Guaranteed"
    engine = pod["spec"]["containers"][0]
    assert engine["args"][:4] == ["-t", "2", "-tb", "2"]
    assert pod["spec"]["initContainers"][0]["name"] == "download"
    patch = {"status": result.status.model_dump(by_alias=True, exclude_none=True, mode="json")}
    after = cluster.api().merge_patch(
        f"{crd}/namespaces/{namespace}/localmodels/gemma/status", patch)
    rules = {d["rule"] for d in after["status"]["placements"][0]["decisions"]}
    assert {"threads-from-cpu-limit", "llama-server-context-per-slot"} <= rules
    assert not any(r.startswith("amx-") for r in rules)
