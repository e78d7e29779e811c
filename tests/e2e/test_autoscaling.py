"""The scale subresource and the autoscaling examples of docs/autoscaling.md,
against the real API server and kube-controller-manager's HPA controller.

KEDA is not installed in the test cluster; its ScaledObject CRD is: it comes
from KEDA's Go module (`github.com/kedacore/keda/v2`, through the Go module
proxy, cached in Go's module cache), so the API server validates the docs'
ScaledObject against KEDA's own schema.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from localmodel.api import parse_local_model
from localmodel.desired import desired_state
from localmodel.facts.node import from_node_list
from tests.builders import MakeLocalModel
from tests.e2e.conftest import ROOT, install_crd
from tests.harness import TestCluster
from tests.harness.chart import render_chart, user_roles
from tests.harness.processes import wait_until

pytestmark = pytest.mark.e2e

DOC = ROOT / "docs" / "autoscaling.md"
KEDA_MODULE = "github.com/kedacore/keda/v2@v2.21.0"
NOW = "2026-12-01T00:00:00Z"


def doc_blocks() -> list[Any]:
    """Every YAML document in the fenced ```yaml blocks of docs/autoscaling.md."""
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), flags=re.S)
    assert blocks, f"no yaml blocks in {DOC}"
    return [doc for block in blocks for doc in yaml.safe_load_all(block) if doc is not None]


@pytest.fixture(scope="module")
def keda_crd(cluster: TestCluster) -> None:
    try:
        out = subprocess.run(
            ["go", "mod", "download", "-json", KEDA_MODULE],
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.fail(
            f"cannot fetch KEDA's CRD from the Go module {KEDA_MODULE}: {exc}", pytrace=False
        )
    path = Path(json.loads(out)["Dir"]) / "config" / "crd" / "bases" / "keda.sh_scaledobjects.yaml"
    install_crd(cluster, path, "scaledobjects.keda.sh")


QWEN = MakeLocalModel("m").namespace(None)  # created in the request's namespace


def test_kubectl_scale_drives_spec_replicas_and_the_scale_subresource_reads_status(
    cluster: TestCluster, crd: str, namespace: str
) -> None:
    api = cluster.api()
    status, body = api.request("POST", f"{crd}/namespaces/{namespace}/localmodels",
                               QWEN.named("qwen3").manifest())
    assert status == 201, body
    out = cluster.kubectl("scale", "lm", "qwen3", "-n", namespace, "--replicas", "2").stdout
    assert "scaled" in out
    obj = api.get(f"{crd}/namespaces/{namespace}/localmodels/qwen3")
    assert obj["spec"]["replicas"] == 2
    # The operator's status (computed as the operator does) feeds the scale's status.
    nodes = from_node_list(api.get("/api/v1/nodes"))
    result = desired_state([parse_local_model(obj)], nodes, now=NOW).models[0]
    patch = {"status": result.status.model_dump(by_alias=True, exclude_none=True, mode="json")}
    api.merge_patch(f"{crd}/namespaces/{namespace}/localmodels/qwen3/status", patch)
    scale = json.loads(
        cluster.kubectl(
            "get", "lm", "qwen3", "-n", namespace, "--subresource", "scale", "-o", "json"
        ).stdout
    )
    assert scale["kind"] == "Scale"
    assert scale["spec"]["replicas"] == 2
    assert scale["status"]["selector"] == "localmodel.dev/name=qwen3"
    assert scale["status"]["replicas"] == result.status.replicas
    # The schema still holds through the subresource.
    refused = cluster.kubectl(
        "scale", "lm", "qwen3", "-n", namespace, "--replicas", "5000", check=False
    )
    assert refused.returncode != 0
    assert "spec.replicas" in refused.stderr


def test_users_with_edit_may_kubectl_scale_and_view_may_only_read(
    cluster: TestCluster, crd: str, namespace: str
) -> None:
    """The chart's roles aggregated into the cluster's edit and view, as
    kube-controller-manager's aggregation controller folds them in."""
    assert cluster.tools is not None
    api = cluster.api()
    status, body = api.request("POST", f"{crd}/namespaces/{namespace}/localmodels",
                               QWEN.named("shared").manifest())
    assert status == 201, body
    for user, role in (("alice", "edit"), ("bob", "view")):
        api.create(
            f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings",
            {
                "metadata": {"name": f"{user}-{role}"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": role},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                              "name": user}],
            },
        )

    def can(user: str, verb: str, *extra: str) -> bool:
        out = cluster.kubectl(
            "auth", "can-i", verb, "localmodels.localmodel.dev", *extra, "-n", namespace,
            "--as", user, check=False,
        )
        return out.stdout.strip() == "yes"

    def scale(user: str, replicas: int) -> subprocess.CompletedProcess[str]:
        return cluster.kubectl(
            "scale", "lm", "shared", "-n", namespace, "--replicas", str(replicas),
            "--as", user, check=False,
        )

    # Without the chart's roles, edit knows nothing of LocalModels.
    assert not can("alice", "patch", "--subresource=scale")
    assert "forbidden" in scale("alice", 2).stderr.lower()
    roles = user_roles(
        render_chart(cluster.tools, kube_version=cluster.tools.kubernetes_version)
    )
    assert len(roles) == 2
    cluster.apply(roles)
    try:
        wait_until(
            "the aggregation controller to fold the chart's roles into edit and view",
            lambda: can("alice", "patch", "--subresource=scale") and can("bob", "get"),
            timeout=60,
            interval=0.5,
        )
        out = scale("alice", 2)
        assert out.returncode == 0 and "scaled" in out.stdout, out.stderr
        path = f"{crd}/namespaces/{namespace}/localmodels/shared"
        assert api.get(path)["spec"]["replicas"] == 2
        assert can("alice", "delete") and not can("alice", "patch", "--subresource=status")
        got = cluster.kubectl("get", "lm", "shared", "-n", namespace, "--as", "bob")
        assert "shared" in got.stdout
        refused = scale("bob", 3)
        assert refused.returncode != 0 and "forbidden" in refused.stderr.lower()
        assert api.get(path)["spec"]["replicas"] == 2
    finally:
        for role in roles:
            api.delete(f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{role['metadata']['name']}")


def test_an_hpa_reads_the_localmodels_scale(cluster: TestCluster, crd: str, namespace: str) -> None:
    """kube-controller-manager's HPA controller finds the LocalModel's scale
    subresource (no metrics API runs here, so it cannot compute a target)."""
    api = cluster.api()
    status, body = api.request("POST", f"{crd}/namespaces/{namespace}/localmodels",
                               QWEN.named("qwen3").manifest())
    assert status == 201, body
    hpa = next(d for d in doc_blocks() if d.get("kind") == "HorizontalPodAutoscaler")
    hpa["metadata"]["namespace"] = namespace
    cluster.apply([hpa])
    path = f"/apis/autoscaling/v2/namespaces/{namespace}/horizontalpodautoscalers/qwen3"

    def got_scale() -> bool:
        conds = {c["type"]: c for c in (api.get(path).get("status") or {}).get("conditions") or []}
        able = conds.get("AbleToScale")
        return able is not None and able["reason"] == "SucceededGetScale"

    wait_until("the HPA to read the LocalModel's scale subresource", got_scale, timeout=60)


def test_the_docs_examples_validate_against_the_api_server(
    cluster: TestCluster, crd: str, keda_crd: None, namespace: str
) -> None:
    docs = doc_blocks()
    kinds = sorted(d.get("kind", "(scrape config)") for d in docs)
    assert kinds == [
        "(scrape config)",
        "ConfigMap",
        "HorizontalPodAutoscaler",
        "LocalModel",
        "ScaledObject",
        "Secret",
    ]
    objects = []
    for doc in docs:
        if "kind" not in doc:
            assert "scrape_configs" in doc  # Prometheus' config: only YAML here
            continue
        doc["metadata"]["namespace"] = namespace
        objects.append(doc)
    out = cluster.kubectl(
        "apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump_all(objects)
    ).stdout
    for kind in ("localmodel", "horizontalpodautoscaler", "scaledobject", "secret", "configmap"):
        assert re.search(rf"^{kind}[^/]*/\S+ created \(server dry run\)$", out, flags=re.M), out
    # The same examples, broken, are refused: the dry run really validates.
    by_kind = {o["kind"]: o for o in objects}
    scaled, model = by_kind["ScaledObject"], by_kind["LocalModel"]
    bad = [
        {**scaled, "spec": {**scaled["spec"], "maxReplicaCount": "many"}},
        {**model, "spec": {**model["spec"], "gateway": {"overflow": {"url": "ftp://x"}}}},
    ]
    for obj in bad:
        refused = cluster.kubectl(
            "apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(obj), check=False
        )
        assert refused.returncode != 0, obj["kind"]
