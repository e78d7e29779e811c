"""The node probe as a process with its own identity, against the real API server.

The chart's probe objects (ServiceAccount, ClusterRole, binding, DaemonSet and
the ValidatingAdmissionPolicy) are applied as rendered. The DaemonSet controller
(kube-controller-manager) creates a probe pod on every fake node; the probe's
identity is a real token of the chart's ServiceAccount bound to the pod on
PROBE_NODE (TokenRequest, as a pod's projected token), so RBAC and the policy
see exactly what they would see from that pod. What stands in: kwok runs no
containers, so `localmodel probe` runs here as a process with that token and
labels the fake node with THIS machine's facts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from localmodel.facts.machine import read_machine
from localmodel.facts.node import PROBE_FACTS_ANNOTATION, bandwidth_from_labels, from_node
from tests.harness import TestCluster
from tests.harness.chart import of_kind, probe_objects, render_chart
from tests.harness.cluster import Identity
from tests.harness.processes import wait_until

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
# Its own namespace, so the operator's smoke tests own theirs.
NAMESPACE = "localmodel-probe"
PROBE_NODE = "small-0"
OTHER_NODE = "amx-0"


def run_probe(cluster: TestCluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "operator")}
    env.pop("KUBECONFIG", None)
    return subprocess.run(
        [sys.executable, "-m", "localmodel.cli", "probe", "--kubeconfig",
         str(cluster.kubeconfig("probe")), "--once", *args],
        capture_output=True, text=True, timeout=120, env=env,
    )


@pytest.fixture(scope="module")
def probe(cluster: TestCluster) -> Identity:
    assert cluster.tools is not None
    admin = cluster.api()
    admin.create("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
    rendered = probe_objects(
        render_chart(cluster.tools, namespace=NAMESPACE,
                     kube_version=cluster.tools.kubernetes_version)
    )
    cluster.apply(rendered)
    [account] = of_kind(rendered, "ServiceAccount")
    sa = account["metadata"]["name"]
    selector = "app.kubernetes.io/component=node-probe"

    def probe_pod() -> str | None:
        pods = admin.get(
            f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector={selector}"
            f"&fieldSelector=spec.nodeName={PROBE_NODE}"
        )["items"]
        return pods[0]["metadata"]["name"] if pods else None

    wait_until(f"the DaemonSet's probe pod on {PROBE_NODE}", lambda: probe_pod() is not None,
               timeout=60)
    pod = probe_pod()
    assert pod is not None
    ident = cluster.bound_token_identity("probe", NAMESPACE, sa, pod)
    api = cluster.api("probe")
    wait_until("the probe's RBAC", lambda: api.status_of(
        "GET", f"/api/v1/nodes/{PROBE_NODE}") == 200, timeout=30)
    # The admission policy is loaded asynchronously: wait until it refuses.
    wait_until("the probe's admission policy", lambda: api.request(
        "PATCH", f"/api/v1/nodes/{OTHER_NODE}",
        {"metadata": {"labels": {"localmodel.dev/cpu-physical-cores": "1"}}},
        content_type="application/merge-patch+json")[0] == 403, timeout=30)
    return ident


def node(cluster: TestCluster, name: str) -> dict[str, Any]:
    return cluster.api().get(f"/api/v1/nodes/{name}")


def test_probe_labels_its_node_and_writes_only_on_change(
    cluster: TestCluster, probe: Identity
) -> None:
    before = node(cluster, PROBE_NODE)
    # (the bandwidth is measured by test_probe_measures_the_bandwidth_or_says_why_not)
    first = run_probe(cluster, "--node", PROBE_NODE, "--no-bandwidth")
    assert first.returncode == 0, first.stderr
    assert f"node {PROBE_NODE}: updated" in first.stderr

    after = node(cluster, PROBE_NODE)
    here = read_machine()
    labels = after["metadata"]["labels"]
    assert labels["localmodel.dev/cpu-flags-known"] == "true"
    assert labels["localmodel.dev/cpu-physical-cores"] == str(here.topology.physical_cores)
    assert labels["localmodel.dev/cpu-threads-per-core"] == str(here.topology.threads_per_core)
    facts = json.loads(after["metadata"]["annotations"][PROBE_FACTS_ANNOTATION])
    assert facts["host_cpus"] == os.cpu_count()
    assert facts["amx_kernel"] in ("offered", "not-offered", "no-arch-prctl-xcomp")
    # Everything that was not the probe's is as it was (NFD's labels win when read).
    for key, value in before["metadata"]["labels"].items():
        assert labels[key] == value
    read = from_node(after)
    assert read.physical_cores == here.topology.physical_cores
    assert read.source.value == "nfd"  # this fake node has NFD labels: they are preferred

    second = run_probe(cluster, "--node", PROBE_NODE, "--no-bandwidth")
    assert second.returncode == 0, second.stderr
    assert f"node {PROBE_NODE}: unchanged" in second.stderr
    again = node(cluster, PROBE_NODE)
    assert again["metadata"]["resourceVersion"] == after["metadata"]["resourceVersion"]


def test_probe_measures_the_bandwidth_or_says_why_not(
    cluster: TestCluster, probe: Identity
) -> None:
    result = run_probe(cluster, "--node", PROBE_NODE, "--bandwidth")
    assert result.returncode == 0, result.stderr
    labels = node(cluster, PROBE_NODE)["metadata"]["labels"]
    bandwidth, why = bandwidth_from_labels(labels)
    if "memory bandwidth not measured: the node is busy" in result.stderr:
        # A shared CI machine is rarely quiet: the probe said so and wrote nothing.
        assert bandwidth is None and why == "", labels
        return
    assert "memory bandwidth: " in result.stderr and " GB/s at 1 thread" in result.stderr
    assert bandwidth is not None and why == "", labels
    assert from_node(node(cluster, PROBE_NODE)).memory_bandwidth == bandwidth


def test_probe_is_refused_anything_but_its_own_nodes_probe_keys(
    cluster: TestCluster, probe: Identity
) -> None:
    api = cluster.api("probe")
    other = node(cluster, OTHER_NODE)

    # The probe process pointed at another node: the patch is refused, it exits 1.
    result = run_probe(cluster, "--node", OTHER_NODE)
    assert result.returncode == 1
    assert "403" in result.stderr and "only the Node its own pod runs on" in result.stderr
    assert node(cluster, OTHER_NODE)["metadata"]["labels"] == other["metadata"]["labels"]

    merge = "application/merge-patch+json"
    own = f"/api/v1/nodes/{PROBE_NODE}"
    refused = {
        "another node's probe label": (f"/api/v1/nodes/{OTHER_NODE}",
                                       {"metadata": {"labels": {"localmodel.dev/x": "1"}}}),
        "its node's other labels": (own, {"metadata": {"labels": {
            "node.kubernetes.io/instance-type": "huge"}}}),
        "its node's NFD labels": (own, {"metadata": {"labels": {
            "feature.node.kubernetes.io/cpu-cpuid.AVX2": None}}}),
        "its node's other annotations": (own, {"metadata": {"annotations": {"a": "b"}}}),
        "its node's spec": (own, {"spec": {"unschedulable": True}}),
        "its node's status": (own + "/status", {"status": {"capacity": {"cpu": "1"}}}),
        "a pod": (f"/api/v1/namespaces/{NAMESPACE}/pods/x", {"metadata": {"labels": {"a": "b"}}}),
        "a configmap": (f"/api/v1/namespaces/{NAMESPACE}/configmaps/x", {"data": {"a": "b"}}),
    }
    statuses = {what: api.request("PATCH", path, body, content_type=merge)[0]
                for what, (path, body) in refused.items()}
    assert statuses == {what: 403 for what in refused}
    others = {
        ("GET", "/api/v1/nodes"): 403,  # get, not list
        ("DELETE", own): 403,
        ("GET", f"/api/v1/namespaces/{NAMESPACE}/secrets"): 403,
        ("GET", "/api/v1/pods"): 403,
    }
    assert {k: api.status_of(*k) for k in others} == others
    # And what it may do still works: its own node's probe keys.
    ok = api.request("PATCH", own, {"metadata": {"labels": {"localmodel.dev/numa-nodes": "1"}}},
                     content_type=merge)
    assert ok[0] == 200, ok[1]
