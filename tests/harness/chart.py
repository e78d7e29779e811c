"""Render the operator's Helm chart with the real, pinned `helm`."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.harness.tools import REPO_ROOT, Tools

CHART_DIR = REPO_ROOT / "charts" / "localmodel-operator"
RELEASE = "localmodel-operator"
NAMESPACE = "localmodel-system"
# Every optional piece of the chart on (each is off by default).
ALL_OPTIONAL = (
    "serviceMonitor.enabled=true",
    "podMonitor.enabled=true",
    "dashboard.enabled=true",
    "prometheusRule.enabled=true",
)
DASHBOARD_FILE = CHART_DIR / "dashboards" / "localmodel.json"

Manifest = dict[str, Any]


def helm(tools: Tools, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(tools["helm"]), *args], capture_output=True, text=True, timeout=120, check=False
    )


def render_chart(
    tools: Tools,
    chart: Path = CHART_DIR,
    release: str = RELEASE,
    namespace: str = NAMESPACE,
    set_values: tuple[str, ...] = (),
    kube_version: str | None = None,
) -> list[Manifest]:
    """`helm template` the chart and return its objects (CRDs included).

    `kube_version` is the cluster version to render for (helm's default is the
    Kubernetes minor its client libraries come from).
    """
    args = ["template", release, str(chart), "--namespace", namespace, "--include-crds"]
    if kube_version:
        args += ["--kube-version", kube_version]
    for value in set_values:
        args += ["--set", value]
    result = helm(tools, *args)
    if result.returncode != 0:
        raise RuntimeError(f"helm template failed: {result.stderr.strip()}")
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def of_kind(manifests: list[Manifest], kind: str) -> list[Manifest]:
    return [m for m in manifests if m.get("kind") == kind]


PROBE_COMPONENT = "node-probe"


def _component(manifest: Manifest) -> object:
    labels = (manifest.get("metadata") or {}).get("labels") or {}
    return labels.get("app.kubernetes.io/component")


def is_probe(manifest: Manifest) -> bool:
    """One of the node probe's objects (its ServiceAccount, RBAC, DaemonSet)."""
    return _component(manifest) == PROBE_COMPONENT


USER_ROLES_COMPONENT = "user-roles"


def is_user_role(manifest: Manifest) -> bool:
    """One of the ClusterRoles aggregated into the cluster's admin, edit and view."""
    return _component(manifest) == USER_ROLES_COMPONENT


ROUTER_COMPONENT = "router"


def is_router(manifest: Manifest) -> bool:
    """One of the router's objects (its ServiceAccount, RBAC, Deployment, Service)."""
    return _component(manifest) == ROUTER_COMPONENT


def router_objects(manifests: list[Manifest]) -> list[Manifest]:
    return [m for m in manifests if is_router(m)]


def optional_config_maps(manifests: list[Manifest]) -> list[Manifest]:
    """The ConfigMaps of optional pieces (the dashboard's): not the policy's, always made."""
    return [m for m in of_kind(manifests, "ConfigMap")
            if not m["metadata"]["name"].endswith("-policy")]


def operator_objects(manifests: list[Manifest]) -> list[Manifest]:
    """What the operator itself runs as and with (not the probe's, the user roles, the
    router's)."""
    return [m for m in manifests if not is_probe(m) and not is_user_role(m)
            and not is_router(m)]


def user_roles(manifests: list[Manifest]) -> list[Manifest]:
    return [m for m in manifests if is_user_role(m)]


def probe_objects(manifests: list[Manifest]) -> list[Manifest]:
    return [m for m in manifests if is_probe(m)]


def split_reference(reference: str) -> tuple[str, str]:
    """`registry:5000/repo/name:tag` -> (`registry:5000/repo/name`, `tag`)."""
    name, sep, tag = reference.rpartition(":")
    if not sep or "/" in tag:
        raise ValueError(f"image reference {reference!r} has no tag")
    return name, tag


def install_chart(
    tools: Tools,
    kubeconfig: Path,
    operator_image: str,
    node_name: str,
    timeout: float = 300.0,
    extra_args: tuple[str, ...] = (),
    set_values: tuple[str, ...] = (),
) -> str:
    """`helm install` the chart as a user does, the image pulled from a registry.

    The operator's replicas are pinned to `node_name` (the test cluster's real
    node: kwok's nodes would only pretend to run them); the node probe runs on
    every node. Waits (`--wait`) until the Deployment and the DaemonSet are
    ready. `extra_args`: the operator's extra flags (the chart's `extraArgs`);
    `set_values`: more `--set` values.
    Model pods may download over plain http: the harness's model file server
    speaks it (`downloads.allowHttp`).
    Returns helm's output.
    """
    repository, tag = split_reference(operator_image)
    result = subprocess.run(
        [str(tools["helm"]), "install", RELEASE, str(CHART_DIR),
         "--kubeconfig", str(kubeconfig), "--namespace", NAMESPACE, "--create-namespace",
         "--set", f"image.repository={repository}", "--set-string", f"image.tag={tag}",
         # The harness serves the GGUF files over plain http (tests/harness/models.py).
         "--set", "downloads.allowHttp=true",
         "--set-string", f"nodeSelector.kubernetes\\.io/hostname={node_name}",
         "--set-json", f"extraArgs={json.dumps(list(extra_args))}",
         *[arg for value in set_values for arg in ("--set", value)],
         "--wait", "--timeout", f"{int(timeout)}s"],
        capture_output=True, text=True, timeout=timeout + 60, check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"helm install {CHART_DIR.name} failed: {result.stderr.strip()}")
    return result.stdout
