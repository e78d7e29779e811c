"""The chart with every optional piece on, against a real API server that has
the Prometheus Operator's CRDs (monitoring.coreos.com, from its Go module:
hack/build-tools.sh): kubeconform (strict) passes against schemas made from
this API server's own OpenAPI (the CRDs' included), the ServiceMonitor,
PodMonitor and PrometheusRule pass the API server's dry run with strict field
validation, and `helm install` with a wrong value fails naming its path,
installing nothing."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.harness import TestCluster
from tests.harness.chart import ALL_OPTIONAL, CHART_DIR, render_chart
from tests.harness.processes import wait_for
from tests.harness.schemas import api_version_kinds, kubeconform, write_schemas

pytestmark = pytest.mark.e2e

GROUP = "monitoring.coreos.com"
PLURALS = {"ServiceMonitor": "servicemonitors", "PodMonitor": "podmonitors",
           "PrometheusRule": "prometheusrules"}


@pytest.fixture(scope="module")
def monitoring_crds(cluster: TestCluster) -> Iterator[list[str]]:
    """The Prometheus Operator's CRDs, created and Established; deleted after."""
    assert cluster.tools is not None
    source = cluster.tools["monitoring-crds"]
    if not source.is_file():
        pytest.fail(f"{source} is not there: run `bash hack/build-tools.sh`", pytrace=False)
    crds = [d for d in yaml.safe_load_all(source.read_text()) if d]
    assert sorted(c["spec"]["names"]["kind"] for c in crds) == sorted(PLURALS)
    api = cluster.api()
    path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    names = [c["metadata"]["name"] for c in crds]
    for crd in crds:
        api.create(path, crd)

    def established() -> bool:
        for name in names:
            conditions = api.get(f"{path}/{name}").get("status", {}).get("conditions", [])
            if not any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
                return False
        return True

    wait_for("the monitoring CRDs to be Established", established, 60)
    yield names
    for name in names:
        api.request("DELETE", f"{path}/{name}")


@pytest.fixture
def release_namespace(cluster: TestCluster) -> Iterator[str]:
    with cluster.fresh_namespace("chart") as name:
        yield name


def openapi_with(cluster: TestCluster, kinds: set[str]) -> dict[str, Any]:
    """/openapi/v2 once it publishes every one of `kinds` (a CRD's schema shows
    up there a moment after it is Established)."""

    def published() -> dict[str, Any] | None:
        doc: dict[str, Any] = cluster.api().get("/openapi/v2")
        found = {gvk["kind"] for d in doc["definitions"].values()
                 for gvk in d.get("x-kubernetes-group-version-kind", [])
                 if gvk.get("group") == GROUP}
        return doc if kinds <= found else None

    return wait_for("the monitoring kinds in /openapi/v2", published, 60)


def test_chart_with_every_optional_piece_is_valid_for_kubeconform_strict(
    cluster: TestCluster, monitoring_crds: list[str], tmp_path: Path
) -> None:
    assert cluster.tools is not None
    rendered = render_chart(cluster.tools, kube_version=cluster.tools.kubernetes_version,
                            set_values=ALL_OPTIONAL)
    kinds = {m["kind"] for m in rendered if m["apiVersion"].startswith(GROUP + "/")}
    assert kinds == set(PLURALS)
    doc = openapi_with(cluster, kinds)
    written = write_schemas(doc, tmp_path, api_version_kinds(rendered))
    assert len(written) == len(api_version_kinds(rendered))
    summary = kubeconform(cluster.tools["kubeconform"], tmp_path, rendered)
    assert f"Valid: {len(rendered)}, Invalid: 0, Errors: 0, Skipped: 0" in summary
    # The monitors' schemas are strict too: a misspelt field fails.
    [monitor] = [m for m in rendered if m["kind"] == "PodMonitor"]
    monitor["spec"]["podMetricsEndpoints"][0]["intervall"] = "30s"
    with pytest.raises(AssertionError, match="intervall"):
        kubeconform(cluster.tools["kubeconform"], tmp_path, rendered)


def contains(got: Any, sent: Any) -> bool:
    """Everything in `sent` is in `got` with the same value (defaults may be added)."""
    if isinstance(sent, dict):
        return isinstance(got, dict) and all(k in got and contains(got[k], v)
                                             for k, v in sent.items())
    if isinstance(sent, list):
        return (isinstance(got, list) and len(got) == len(sent)
                and all(contains(g, s) for g, s in zip(got, sent, strict=True)))
    return bool(got == sent)


def dry_run(cluster: TestCluster, manifest: dict[str, Any]) -> tuple[int, Any]:
    version = manifest["apiVersion"]
    path = (f"/apis/{version}/namespaces/{manifest['metadata']['namespace']}/"
            f"{PLURALS[manifest['kind']]}?dryRun=All&fieldValidation=Strict")
    return cluster.api().request("POST", path, manifest)


def test_monitors_and_rules_pass_the_api_servers_dry_run(
    cluster: TestCluster, monitoring_crds: list[str], release_namespace: str
) -> None:
    assert cluster.tools is not None
    rendered = render_chart(cluster.tools, namespace=release_namespace, set_values=ALL_OPTIONAL)
    monitors = [m for m in rendered if m["kind"] in PLURALS]
    assert len(monitors) == 3
    for manifest in monitors:
        status, body = dry_run(cluster, manifest)
        assert status == 201, (manifest["kind"], body)
        # Nothing pruned: all that was sent comes back (the CRD may add defaults).
        assert contains(body["spec"], manifest["spec"]), (manifest["kind"], body["spec"])
    # Dry run: nothing was stored.
    for kind, plural in PLURALS.items():
        items = cluster.api().get(
            f"/apis/{GROUP}/v1/namespaces/{release_namespace}/{plural}")["items"]
        assert items == [], kind
    # The CRDs' schemas bite: an unknown field and a wrong type are refused.
    [monitor] = [m for m in monitors if m["kind"] == "ServiceMonitor"]
    monitor["spec"]["endpoints"][0]["scrapeIntervall"] = "30s"
    status, body = dry_run(cluster, monitor)
    assert status == 400 and "scrapeIntervall" in body["message"], body
    [rule] = [m for m in monitors if m["kind"] == "PrometheusRule"]
    rule["spec"]["groups"][0]["rules"][0]["for"] = 5
    status, body = dry_run(cluster, rule)
    assert status == 422 and "for" in body["message"], body


def test_helm_install_with_a_wrong_value_fails_naming_its_path(
    cluster: TestCluster, release_namespace: str
) -> None:
    assert cluster.tools is not None
    result = subprocess.run(
        [str(cluster.tools["helm"]), "install", "typo", str(CHART_DIR),
         "--kubeconfig", str(cluster.admin_kubeconfig), "--namespace", release_namespace,
         "--set", "serviceMonitor.enabled=true", "--set", "serviceMonitor.interval=30"],
        capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode != 0
    assert "at '/serviceMonitor/interval': got number, want string" in result.stderr
    status, _ = cluster.api().request(
        "GET", f"/apis/apps/v1/namespaces/{release_namespace}/deployments/typo-localmodel-operator")
    assert status == 404
    stored = cluster.api().get(f"/api/v1/namespaces/{release_namespace}/secrets")["items"]
    assert not [s for s in stored if s["metadata"]["name"].startswith("sh.helm.release")]
