"""The router's cluster source (router/follow.py, router/cluster.py) against the
real API server, with the chart's own router RBAC: LocalModels, the Services
the operator's renderer makes for them, pods on kwok nodes (kwok marks them
Running and Ready with an IP; no container runs) and the EndpointSlices the real
EndpointSlice controller derives. The source follows models and replicas as
they come and go; a router bound to one namespace sees only it; the router's
identity may read what it reads and nothing else."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from localmodel.api.parse import parse_local_model
from localmodel.contract import LABEL_NAME
from localmodel.kube import api_client
from localmodel.render.applied import render_service
from localmodel.router.follow import ClusterSource
from localmodel.router.table import RouteTable
from tests.builders import MakeLocalModel
from tests.harness import KubeApi, TestCluster
from tests.harness.chart import of_kind, render_chart, router_objects
from tests.harness.fixtures import tools_or_fail
from tests.harness.processes import wait_until

Manifest = dict[str, Any]
WAIT = 60.0  # the machine is loaded: generous bounds, never timed assertions


def _router_identity(cluster: TestCluster, namespace: str, tmp_path: Path) -> tuple[Path, str]:
    """The chart's router ServiceAccount and read-only RBAC, applied as the chart
    renders them (release namespace: `namespace`); a kubeconfig with its token."""
    release = f"rt{secrets.token_hex(2)}"
    rendered = render_chart(tools_or_fail(("helm",)), release=release, namespace=namespace,
                            set_values=("router.enabled=true",))
    objects = [m for m in router_objects(rendered)
               if m["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")]
    cluster.apply(objects)
    [account] = of_kind(objects, "ServiceAccount")
    name = account["metadata"]["name"]
    token = cluster.api().create(
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
         "spec": {"expirationSeconds": 3600}})["status"]["token"]
    path = tmp_path / "router.kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": cluster.server,
                                               "certificate-authority": str(cluster.ca_file)}}],
        "users": [{"name": "router", "user": {"token": token}}],
        "contexts": [{"name": "router", "context": {"cluster": "c", "user": "router"}}],
        "current-context": "router"}))
    return path, token


def _model(cluster: TestCluster, crd: str, namespace: str, name: str, served: str,
           **spec: Any) -> None:
    """A LocalModel, and its Service exactly as the operator renders it."""
    body = cluster.api().create(f"{crd}/namespaces/{namespace}/localmodels",
                                MakeLocalModel(name, namespace).spec(model=served, **spec)
                                .manifest())
    cluster.api().create(f"/api/v1/namespaces/{namespace}/services",
                         render_service(parse_local_model(body)))


def _pod(cluster: TestCluster, namespace: str, model: str, pod: str) -> None:
    """A model pod on a kwok node (kwok makes it Running and Ready, with an IP)."""
    node = cluster.api().get("/api/v1/nodes")["items"][0]["metadata"]["name"]
    cluster.api().create(f"/api/v1/namespaces/{namespace}/pods", {
        "metadata": {"name": pod, "labels": {LABEL_NAME: model}},
        "spec": {"nodeName": node, "containers": [{
            "name": "gateway", "image": "registry.invalid/none:1",
            "ports": [{"name": "http", "containerPort": 8080}]}]}})


def _ip(cluster: TestCluster, namespace: str, pod: str) -> str:
    status = cluster.api().get(f"/api/v1/namespaces/{namespace}/pods/{pod}").get("status") or {}
    return str(status.get("podIP") or "")


def _shape(table: RouteTable) -> dict[str, list[tuple[str, str, str | None]]]:
    return {r.qualified: [(x.name, x.url, x.admin_url) for x in r.replicas] for r in table}


@pytest.fixture
def other_namespace(cluster: TestCluster) -> Iterator[str]:
    with cluster.fresh_namespace("e2e") as name:
        yield name


def test_the_source_follows_models_and_their_ready_replicas(
    cluster: TestCluster, crd: str, namespace: str, other_namespace: str, tmp_path: Path
) -> None:
    kubeconfig, token = _router_identity(cluster, namespace, tmp_path)
    ns, other = namespace, other_namespace
    _model(cluster, crd, ns, "qwen", "qwen3:1.7b")
    _model(cluster, crd, ns, "raw", "raw:1b", gateway={"enabled": False})
    _model(cluster, crd, other, "gemma", "gemma3:270m")
    _pod(cluster, ns, "qwen", "qwen-0")
    _pod(cluster, ns, "raw", "raw-0")
    _pod(cluster, other, "gemma", "gemma-0")

    # Watches the server ends every 2 s: each resumes from the last version it saw.
    everywhere = ClusterSource(api_client(str(kubeconfig)), watch_seconds=2).start()
    one = ClusterSource(api_client(str(kubeconfig)), namespaces=(ns,), watch_seconds=2).start()
    try:
        assert everywhere.wait_synced(WAIT) and one.wait_synced(WAIT)
        def replicas(ns: str, pod: str) -> tuple[str, str, str]:
            ip = _ip(cluster, ns, pod)
            return (pod, f"http://{ip}:8080", f"http://{ip}:8090")

        def shows(source: ClusterSource, want: dict[str, list[str]]) -> bool:
            got = _shape(source.routes())
            return source.synced() and got == {
                m: [replicas(m.split("/")[0], p) for p in pods] for m, pods in want.items()}

        # The model without its gateway is not routed; the namespaced source sees one namespace.
        both = {f"{ns}/qwen3:1.7b": ["qwen-0"], f"{other}/gemma3:270m": ["gemma-0"]}
        wait_until("the cluster-wide source to show both models", lambda: shows(everywhere, both),
                   timeout=WAIT)
        wait_until("the namespaced source to show its model",
                   lambda: shows(one, {f"{ns}/qwen3:1.7b": ["qwen-0"]}), timeout=WAIT)

        # A replica joins, then the first leaves: the watch follows both.
        _pod(cluster, ns, "qwen", "qwen-1")
        wait_until("the second replica", lambda: shows(
            one, {f"{ns}/qwen3:1.7b": ["qwen-0", "qwen-1"]}), timeout=WAIT)
        cluster.api().delete(f"/api/v1/namespaces/{ns}/pods/qwen-0",
                             {"gracePeriodSeconds": 0})
        wait_until("the first replica gone", lambda: shows(
            one, {f"{ns}/qwen3:1.7b": ["qwen-1"]}), timeout=WAIT)

        # A model deleted leaves the table.
        cluster.api().delete(f"{crd}/namespaces/{other}/localmodels/gemma")
        wait_until("gemma gone", lambda: shows(everywhere, {f"{ns}/qwen3:1.7b": ["qwen-1"]}),
                   timeout=WAIT)
        # The server ends every watch after 2 s; each resumes from the last version it
        # saw (no new list), and what changes after that is still seen.
        followers = everywhere.followers + one.followers
        wait_until("every watch to have ended and resumed twice",
                   lambda: all(f.watches >= 3 for f in followers), timeout=WAIT)
        _pod(cluster, ns, "qwen", "qwen-2")
        wait_until("a replica that joined after the resumptions", lambda: shows(
            one, {f"{ns}/qwen3:1.7b": ["qwen-1", "qwen-2"]}), timeout=WAIT)
        assert all(f.lists == 1 for f in followers), [(f.what, f.lists) for f in followers]
    finally:
        everywhere.stop()
        one.stop()

    # The router's identity reads LocalModels and EndpointSlices, and nothing else.
    router = KubeApi(cluster.server, token, cluster.ca_file)
    assert router.status_of("GET", f"{crd}/localmodels") == 200
    assert router.status_of("GET", "/apis/discovery.k8s.io/v1/endpointslices") == 200
    for path in (f"/api/v1/namespaces/{ns}/pods", f"/api/v1/namespaces/{ns}/secrets",
                 f"/api/v1/namespaces/{ns}/services", f"{crd}/namespaces/{ns}/localmodels/qwen"):
        assert router.status_of("GET", path) == 403, path
    assert router.status_of("DELETE", f"{crd}/namespaces/{ns}/localmodels/qwen") == 403
