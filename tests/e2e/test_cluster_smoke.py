"""Proof that the e2e cluster is a real Kubernetes control plane.

Each test exercises a part that a mock API server would fake: CEL validation,
pruning, the status subresource, scheduling with local volumes, kwok's pod
lifecycle, garbage collection and RBAC with the chart's own ClusterRole.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.harness import OPERATOR, OPERATOR_USER, ApiError, TestCluster
from tests.harness.chart import NAMESPACE, operator_objects, render_chart
from tests.harness.processes import wait_for
from tests.harness.schemas import api_version_kinds, write_schemas
from tests.harness.schemas import kubeconform as run_kubeconform

pytestmark = pytest.mark.e2e

GROUP = "smoke.localmodel.dev"
CEL_MESSAGE = "minReplicas must not exceed maxReplicas"

SMOKE_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"widgets.{GROUP}"},
    "spec": {
        "group": GROUP,
        "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "properties": {
                                    "minReplicas": {"type": "integer", "minimum": 0},
                                    "maxReplicas": {"type": "integer", "minimum": 0},
                                },
                                "x-kubernetes-validations": [
                                    {
                                        "rule": "self.minReplicas <= self.maxReplicas",
                                        "message": CEL_MESSAGE,
                                    }
                                ],
                            },
                            "status": {
                                "type": "object",
                                "properties": {"phase": {"type": "string"}},
                            },
                        },
                    }
                },
            }
        ],
    },
}


@pytest.fixture(scope="module")
def widgets(cluster: TestCluster) -> str:
    """Install the smoke CRD; returns the collection path minus the namespace part."""
    cluster.apply([SMOKE_CRD])
    api = cluster.api()

    def established() -> bool:
        crd = api.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.{GROUP}")
        conditions = (crd.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    wait_for("the smoke CRD to be established", established, timeout=30)
    return f"/apis/{GROUP}/v1/namespaces"


def widget(name: str, spec: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "Widget",
        "metadata": {"name": name},
        "spec": spec,
        **extra,
    }


def test_cel_rule_rejects_an_invalid_object_with_the_rules_message(
    cluster: TestCluster, widgets: str, namespace: str
) -> None:
    api = cluster.api()
    path = f"{widgets}/{namespace}/widgets"

    with pytest.raises(ApiError) as rejected:
        api.create(path, widget("bad", {"minReplicas": 3, "maxReplicas": 1}))
    assert rejected.value.status == 422
    assert CEL_MESSAGE in rejected.value.message

    created = api.create(path, widget("good", {"minReplicas": 1, "maxReplicas": 3}))
    assert created["spec"] == {"minReplicas": 1, "maxReplicas": 3}


def test_unknown_fields_are_pruned_and_strict_validation_rejects_them(
    cluster: TestCluster, widgets: str, namespace: str
) -> None:
    api = cluster.api()
    path = f"{widgets}/{namespace}/widgets"
    spec = {"minReplicas": 1, "maxReplicas": 2, "colour": "blue"}

    api.create(path, widget("pruned", spec))
    stored = api.get(f"{path}/pruned")
    assert stored["spec"] == {"minReplicas": 1, "maxReplicas": 2}

    with pytest.raises(ApiError) as strict:
        api.create(f"{path}?fieldValidation=Strict", widget("strict", spec))
    assert strict.value.status == 400
    assert 'unknown field "spec.colour"' in strict.value.message


def test_status_is_a_subresource(cluster: TestCluster, widgets: str, namespace: str) -> None:
    api = cluster.api()
    path = f"{widgets}/{namespace}/widgets"

    created = api.create(
        path, widget("st", {"minReplicas": 0, "maxReplicas": 1}, status={"phase": "Ignored"})
    )
    assert "status" not in created  # the main resource ignores status

    api.merge_patch(f"{path}/st/status", {"status": {"phase": "Ready"}})
    api.merge_patch(f"{path}/st", {"status": {"phase": "Overwritten"}})
    stored = api.get(f"{path}/st")
    assert stored["status"] == {"phase": "Ready"}
    assert stored["metadata"]["generation"] == 1  # status writes do not bump generation


def pvc(name: str, size: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "local-disk",
            "resources": {"requests": {"storage": size}},
        },
    }


def pod(name: str, claim: str | None, cpu: str, node_selector: dict[str, str]) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "engine",
        "image": "ollama/ollama:0.12.0",
        "resources": {
            "requests": {"cpu": cpu, "memory": "1Gi"},
            "limits": {"cpu": cpu, "memory": "1Gi"},
        },
    }
    spec: dict[str, Any] = {"containers": [container], "nodeSelector": node_selector}
    if claim:
        container["volumeMounts"] = [{"name": "models", "mountPath": "/root/.ollama"}]
        spec["volumes"] = [{"name": "models", "persistentVolumeClaim": {"claimName": claim}}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c["type"] == kind:
            return dict(c)
    return None


def test_pod_with_a_local_volume_is_scheduled_bound_and_run(
    cluster: TestCluster, namespace: str
) -> None:
    api = cluster.api()
    ns = f"/api/v1/namespaces/{namespace}"
    api.create(f"{ns}/persistentvolumeclaims", pvc("models", "150Gi"))
    # WaitForFirstConsumer: nothing binds until a pod using the claim is scheduled.
    assert api.get(f"{ns}/persistentvolumeclaims/models")["status"]["phase"] == "Pending"

    # Only AMX nodes carry a 200Gi disk; the tainted AMX node does not tolerate this pod.
    amx = {"feature.node.kubernetes.io/cpu-cpuid.AMXTILE": "true"}
    api.create(f"{ns}/pods", pod("engine", "models", "16", amx))

    def running_and_ready() -> dict[str, Any] | None:
        current = api.get(f"{ns}/pods/engine")
        ready = condition(current, "Ready")
        if current["status"].get("phase") == "Running" and ready and ready["status"] == "True":
            return current
        return None

    running = wait_for("kwok to run the pod", running_and_ready, timeout=60)
    node = running["spec"]["nodeName"]
    assert node in {"amx-0", "amx-1"}
    scheduled = condition(running, "PodScheduled")
    assert scheduled is not None and scheduled["status"] == "True"

    def bound_claim() -> dict[str, Any] | None:
        current = api.get(f"{ns}/persistentvolumeclaims/models")
        return current if current["status"]["phase"] == "Bound" else None

    claim = wait_for("the claim to bind", bound_claim, timeout=30)
    volume = api.get(f"/api/v1/persistentvolumes/{claim['spec']['volumeName']}")
    assert volume["spec"]["storageClassName"] == "local-disk"
    [term] = volume["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
    assert term["matchExpressions"][0]["values"] == [node]  # the volume is on the pod's node
    assert volume["spec"]["claimRef"]["name"] == "models"

    # Retain, as on bare metal: freeing the claim releases the disk but keeps it
    # reserved until an admin clears claimRef; do that so later tests get the disk.
    pv_path = f"/api/v1/persistentvolumes/{volume['metadata']['name']}"
    api.delete(f"{ns}/pods/engine")
    api.delete(f"{ns}/persistentvolumeclaims/models")
    wait_for(
        "the volume to be released",
        lambda: api.get(pv_path)["status"]["phase"] == "Released",
        timeout=60,
    )
    api.merge_patch(pv_path, {"spec": {"claimRef": None}})
    wait_for(
        "the volume to be available again",
        lambda: api.get(pv_path)["status"]["phase"] == "Available",
        timeout=30,
    )


def test_scheduler_respects_the_fixtures_allocatable_cpu(
    cluster: TestCluster, namespace: str
) -> None:
    api = cluster.api()
    ns = f"/api/v1/namespaces/{namespace}"
    # No node has 48 allocatable CPUs: the pod stays Pending with the scheduler's reason.
    api.create(f"{ns}/pods", pod("too-big", None, "48", {}))

    def unschedulable() -> dict[str, Any] | None:
        scheduled = condition(api.get(f"{ns}/pods/too-big"), "PodScheduled")
        return scheduled if scheduled and scheduled["status"] == "False" else None

    scheduled = wait_for("the scheduler's verdict", unschedulable, timeout=30)
    assert scheduled["reason"] == "Unschedulable"
    assert "Insufficient cpu" in scheduled["message"]
    assert "untolerated taint" in scheduled["message"]  # the tainted node, counted apart


def test_deleting_an_owner_garbage_collects_its_dependents(
    cluster: TestCluster, namespace: str
) -> None:
    api = cluster.api()
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    owner = api.create(path, {"metadata": {"name": "owner"}, "data": {"k": "v"}})
    reference = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "owner",
        "uid": owner["metadata"]["uid"],
    }
    for name in ("dependent-a", "dependent-b"):
        api.create(path, {"metadata": {"name": name, "ownerReferences": [reference]}})
    api.create(path, {"metadata": {"name": "bystander"}})

    api.delete(f"{path}/owner", {"propagationPolicy": "Background"})

    def dependents_gone() -> bool:
        names = {cm["metadata"]["name"] for cm in api.get(path)["items"]}
        return not names & {"owner", "dependent-a", "dependent-b"}

    wait_for("the garbage collector", dependents_gone, timeout=60)
    assert api.status_of("GET", f"{path}/bystander") == 200


def test_operator_identity_gets_exactly_the_charts_cluster_role(cluster: TestCluster) -> None:
    assert cluster.tools is not None
    admin, operator = cluster.api(), cluster.api(OPERATOR)
    # Before the chart's RBAC exists the operator identity can do nothing.
    assert operator.status_of("GET", "/api/v1/nodes") == 403

    rendered = operator_objects(
        render_chart(cluster.tools, kube_version=cluster.tools.kubernetes_version)
    )
    rbac = [m for m in rendered if m["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    assert {m["kind"] for m in rbac} == {"ClusterRole", "ClusterRoleBinding"}
    [binding] = [m for m in rbac if m["kind"] == "ClusterRoleBinding"]
    [subject] = binding["subjects"]
    assert f"system:serviceaccount:{subject['namespace']}:{subject['name']}" == OPERATOR_USER
    admin.create("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
    cluster.apply(rbac)

    wait_for(
        "the binding to take effect",
        lambda: operator.status_of("GET", "/api/v1/nodes") == 200,
        timeout=30,
    )

    allowed = [
        ("GET", "/api/v1/nodes"),
        ("GET", "/api/v1/pods"),
        ("GET", f"/api/v1/namespaces/{NAMESPACE}/persistentvolumeclaims"),
        ("GET", f"/api/v1/namespaces/{NAMESPACE}/configmaps"),
    ]
    denied = [
        # `localmodel run` reads neither (the chart's role is what it uses, no more).
        ("GET", "/api/v1/namespaces"),
        ("GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"),
        ("GET", "/api/v1/secrets"),
        ("GET", f"/api/v1/namespaces/{NAMESPACE}/secrets"),
        ("GET", f"/api/v1/namespaces/{NAMESPACE}/secrets/anything"),
        ("DELETE", "/api/v1/nodes/amx-0"),
        ("GET", "/apis/apps/v1/deployments"),
        ("GET", "/apis/rbac.authorization.k8s.io/v1/clusterroles"),
    ]
    assert {(m, p): operator.status_of(m, p) for m, p in allowed} == {k: 200 for k in allowed}
    assert {(m, p): operator.status_of(m, p) for m, p in denied} == {k: 403 for k in denied}

    # Writes: what the operator owns yes, CRDs and Secrets no.
    cm = {"metadata": {"name": "rendered-config"}, "data": {"threads": "4"}}
    operator.create(f"/api/v1/namespaces/{NAMESPACE}/configmaps", cm)
    event = {
        "metadata": {"name": "decision.1"},
        "involvedObject": {"kind": "ConfigMap", "namespace": NAMESPACE, "name": "rendered-config"},
        "reason": "RuleFired",
        "message": "threads=4 from the CPU limit",
        "type": "Normal",
    }
    operator.create(f"/api/v1/namespaces/{NAMESPACE}/events", event)
    with pytest.raises(ApiError) as no_secret:
        operator.create(
            f"/api/v1/namespaces/{NAMESPACE}/secrets",
            {"metadata": {"name": "stolen"}, "stringData": {"k": "v"}},
        )
    assert no_secret.value.status == 403
    assert "secrets" in no_secret.value.message
    with pytest.raises(ApiError) as no_crd:
        operator.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", SMOKE_CRD)
    assert no_crd.value.status == 403


def kubeconform(cluster: TestCluster, schemas: Path, manifests: list[dict[str, Any]]) -> str:
    """Run the pinned kubeconform, offline, strict; returns its output, raises if invalid."""
    assert cluster.tools is not None
    return run_kubeconform(cluster.tools["kubeconform"], schemas, manifests)


def test_chart_is_valid_against_the_api_servers_own_schemas(
    cluster: TestCluster, tmp_path: Path
) -> None:
    assert cluster.tools is not None
    rendered = render_chart(cluster.tools, kube_version=cluster.tools.kubernetes_version)
    written = write_schemas(cluster.api().get("/openapi/v2"), tmp_path, api_version_kinds(rendered))
    assert len(written) == len(api_version_kinds(rendered))

    summary = kubeconform(cluster, tmp_path, rendered)
    assert f"Valid: {len(rendered)}, Invalid: 0, Errors: 0, Skipped: 0" in summary

    # The schemas are strict: a misspelt field fails, as it would at `kubectl apply`.
    [deployment] = [m for m in rendered if m["kind"] == "Deployment"]
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePulPolicy"] = "Always"
    with pytest.raises(AssertionError, match="imagePulPolicy"):
        kubeconform(cluster, tmp_path, rendered)
