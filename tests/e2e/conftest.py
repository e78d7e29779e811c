"""The e2e tier's control plane: one real cluster per test session.

The fixture FAILS (never skips) when the binaries are missing or the cluster
cannot start: a green run must mean the tests really ran against Kubernetes.
Set LOCALMODEL_KEEP_CLUSTER=1 to keep the temp dir (logs, kubeconfigs) after the run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import ApiError, StartupError, TestCluster
from tests.harness.fixtures import tools_or_fail
from tests.harness.processes import pid_runs, wait_until

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "crds" / "localmodel.dev_localmodels.yaml"


@pytest.fixture(scope="session")
def cluster() -> Iterator[TestCluster]:
    """A running cluster: `.admin_kubeconfig`, `.operator_kubeconfig`, `.server`,
    `.apply(...)`, `.kubectl(...)` and `.api(identity)`."""
    tools = tools_or_fail()
    problem = ""
    keep = os.environ.get("LOCALMODEL_KEEP_CLUSTER", "") not in ("", "0")
    test_cluster = TestCluster(tools=tools, keep_workdir=keep)
    try:
        test_cluster.start()
    except (StartupError, ApiError, OSError) as exc:
        problem = f"the test cluster did not start: {exc}"
    if problem:
        pytest.fail(problem, pytrace=False)
    print(f"\ntest cluster ready in {test_cluster.startup_seconds:.1f} s at {test_cluster.server}")
    try:
        yield test_cluster
    finally:
        pids = {p.pid: p.argv[0] for p in test_cluster.processes if p.pid}
        test_cluster.stop()
    # Teardown is part of the contract: nothing left running, no ports left open.
    assert not [pid for pid, exe in pids.items() if pid_runs(pid, exe)], "processes left running"
    assert test_cluster.listening_ports() == [], "ports still listening after stop()"


@pytest.fixture
def namespace(cluster: TestCluster) -> Iterator[str]:
    """A fresh namespace with its default ServiceAccount, deleted afterwards."""
    api = cluster.api()
    with cluster.fresh_namespace("e2e") as name:

        def has_default_sa() -> bool:
            return api.status_of(
                "GET", f"/api/v1/namespaces/{name}/serviceaccounts/default") == 200

        wait_until(f"the default ServiceAccount in {name}", has_default_sa, timeout=30)
        yield name


def install_crd(cluster: TestCluster, path: Path, name: str) -> None:
    """Apply a CRD and wait until the API server serves it."""
    cluster.apply(path)
    api = cluster.api()

    def established() -> bool:
        status, body = api.request(
            "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
        )
        conds = {c["type"]: c["status"] for c in (body.get("status") or {}).get("conditions") or []}
        return status == 200 and conds.get("Established") == "True"

    wait_until(f"the {name} CRD to be established", established, timeout=30)


@pytest.fixture(scope="module")
def crd(cluster: TestCluster) -> str:
    """The generated LocalModel CRD, installed; returns the API group's base path."""
    install_crd(cluster, CRD, "localmodels.localmodel.dev")
    return "/apis/localmodel.dev/v1alpha1"
