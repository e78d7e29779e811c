"""The operator under test: `localmodel run` as a real process, as the chart's identity.

`install_operator(cluster)` creates the operator's namespace, the generated CRD
and the chart's rendered RBAC (ClusterRole, Role and their bindings, whose
subject is the harness's operator token), so the operator runs with exactly
what the chart grants, never as admin. `OperatorProcess` starts `localmodel
run` from this checkout (not an installed copy) and can stop it gently or
SIGKILL it.
"""

from __future__ import annotations

import os
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.harness.chart import NAMESPACE, operator_objects, render_chart
from tests.harness.cluster import OPERATOR, TestCluster
from tests.harness.processes import ManagedProcess, free_ports, localmodel_process, wait_until
from tests.harness.tools import REPO_ROOT

CRD_FILE = REPO_ROOT / "crds" / "localmodel.dev_localmodels.yaml"
RBAC_KINDS = ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")


def chart_rbac(cluster: TestCluster) -> list[dict[str, Any]]:
    assert cluster.tools is not None
    rendered = render_chart(cluster.tools, kube_version=cluster.tools.kubernetes_version,
                            set_values=("probe.enabled=false",))
    return [m for m in operator_objects(rendered) if m["kind"] in RBAC_KINDS]


def install_operator(cluster: TestCluster) -> list[dict[str, Any]]:
    """Namespace, CRD (Established) and the chart's RBAC; returns the RBAC objects."""
    api = cluster.api()
    if api.status_of("GET", f"/api/v1/namespaces/{NAMESPACE}") == 404:
        api.create("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
    cluster.apply(CRD_FILE)
    crd_path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/localmodels.localmodel.dev"

    def established() -> bool:
        conditions = (api.get(crd_path).get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Established" and c.get("status") == "True"
                   for c in conditions)

    wait_until("the LocalModel CRD to be Established", established, timeout=30)
    rbac = chart_rbac(cluster)
    cluster.apply(rbac)
    operator = cluster.api(OPERATOR)
    wait_until("the chart's RBAC to take effect",
               lambda: operator.status_of(
                   "GET", "/apis/localmodel.dev/v1alpha1/localmodels") == 200, timeout=30)
    return rbac


@dataclass
class OperatorProcess:
    """One `localmodel run` replica against the cluster, as the operator identity."""

    cluster: TestCluster
    identity: str = "operator-a"
    extra_args: tuple[str, ...] = ()
    health_port: int = 0
    metrics_port: int = 0
    starts: int = 0
    proc: ManagedProcess | None = field(default=None, repr=False)

    @property
    def log_path(self) -> Path:
        return self.cluster.workdir / "logs" / f"localmodel-run-{self.identity}.log"

    def start(self, wait_ready: bool = True) -> None:
        self.health_port, self.metrics_port = free_ports(2)
        args = [
            "run",
            "--kubeconfig", str(self.cluster.kubeconfig(OPERATOR)),
            "--identity", self.identity,
            "--leader-namespace", NAMESPACE,
            "--health-listen", f"127.0.0.1:{self.health_port}",
            "--metrics-listen", f"127.0.0.1:{self.metrics_port}",
            "--operator-image", "ghcr.io/localmodel/localmodel-operator:e2e",
            *self.extra_args,
        ]
        self.proc = localmodel_process(f"localmodel-run-{self.identity}", args, self.log_path,
                                       os.environ | {"PYTHONUNBUFFERED": "1"})
        self.proc.start()
        self.starts += 1
        if wait_ready:
            self.proc.wait_ready(f"localmodel run ({self.identity}) /readyz", self.ready, 60)

    def _get(self, port: int, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as resp:
                return resp.status, resp.read().decode()
        except OSError:
            return 0, ""

    def ready(self) -> bool:
        return self._get(self.health_port, "/readyz")[0] == 200

    def metrics(self) -> str:
        return self._get(self.metrics_port, "/metrics")[1]

    def alive(self) -> bool:
        return self.proc is not None and self.proc.popen is not None and (
            self.proc.popen.poll() is None)

    def kill(self) -> None:
        """SIGKILL: no Lease release, no cleanup, as a crash or an OOM kill."""
        if self.proc is not None:
            self.proc.kill()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text().splitlines()[-lines:])
        except OSError:
            return ""


def wait_condition(cluster: TestCluster, namespace: str, name: str, condition: str,
                   status: str = "True", timeout: float = 60) -> dict[str, Any]:
    """Wait until the LocalModel's condition has this status; returns the object."""
    api = cluster.api()
    path = f"/apis/localmodel.dev/v1alpha1/namespaces/{namespace}/localmodels/{name}"
    seen: dict[str, Any] = {}

    def check() -> bool:
        nonlocal seen
        if api.status_of("GET", path) != 200:
            return False
        seen = api.get(path)
        for c in (seen.get("status") or {}).get("conditions") or []:
            if c.get("type") == condition and c.get("status") == status:
                return True
        return False

    try:
        wait_until(f"{namespace}/{name} {condition}={status}", check, timeout=timeout)
    except Exception as exc:
        raise AssertionError(f"{exc}\nlast seen status: "
                             f"{yaml.safe_dump(seen.get('status'))}") from exc
    return seen


__all__ = ["OperatorProcess", "chart_rbac", "install_operator", "wait_condition"]
