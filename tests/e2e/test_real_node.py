"""The test cluster's real node: `up --real-node` joins a real kubelet and
`helm install`s the operator onto it from the locally built image, a pod runs
with the CPU limit enforced by the kernel, and `down` leaves nothing behind.

Runs the CLI a person runs (`python -m tests.harness up --detach --real-node`,
then `down`), with its own state file, so it neither needs nor disturbs the
session's kwok cluster. Root only, like the real node itself; a machine
without the node's parts fails here, naming them.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.harness import realnode
from tests.harness.kubeapi import KubeApi
from tests.harness.processes import pid_runs, terminate_pid, wait_for
from tests.harness.tools import REPO_ROOT

# `llama`: no Ollama (hack/test.sh runs it while Ollama builds: tests/harness/prereqs.py)
pytestmark = [pytest.mark.e2e, pytest.mark.realnode, pytest.mark.llama]


def harness(state: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tests.harness", "--state", str(state), *args],
        capture_output=True, text=True, timeout=timeout, cwd=REPO_ROOT, check=False,
    )


@pytest.fixture
def real_cluster(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """`up --detach --real-node`; the state it wrote. `down` afterwards in any case."""
    state_path = tmp_path / "state.json"
    began = time.monotonic()
    up = harness(state_path, "up", "--detach", "--real-node")
    assert up.returncode == 0, f"up --real-node failed:\n{up.stdout}\n{up.stderr}"
    print(f"\nup --real-node: {time.monotonic() - began:.1f} s\n{up.stdout}")
    state: dict[str, Any] = json.loads(state_path.read_text())
    state["state_path"] = str(state_path)
    try:
        yield state
    finally:
        harness(state_path, "down")


def admin_api(state: dict[str, Any]) -> KubeApi:
    config = yaml.safe_load(Path(state["kubeconfigs"]["admin"]).read_text())
    cluster = config["clusters"][0]["cluster"]
    return KubeApi(cluster["server"], config["users"][0]["user"]["token"],
                   Path(cluster["certificate-authority"]))


def cfs_quota(pod_uid: str, container_id: str) -> tuple[int, int]:
    """(quota, period) in microseconds of the container's cgroup, as the kubelet set it
    (cgroupfs driver: kubepods/[qos/]pod<uid>/<container id>; cgroup v1 or v2)."""
    pattern = f"**/pod{pod_uid}/{container_id}"
    for v1 in (Path("/sys/fs/cgroup/cpu/kubepods"), Path("/sys/fs/cgroup/cpu,cpuacct/kubepods")):
        for group in v1.glob(pattern):
            return (int((group / "cpu.cfs_quota_us").read_text()),
                    int((group / "cpu.cfs_period_us").read_text()))
    for group in Path("/sys/fs/cgroup/kubepods").glob(pattern):
        quota, period = (group / "cpu.max").read_text().split()
        return int(quota), int(period)
    raise AssertionError(f"no cgroup for container {container_id} of pod {pod_uid}")


def test_real_node_runs_a_pod_with_its_cpu_limit_and_down_leaves_nothing(
    real_cluster: dict[str, Any],
) -> None:
    state = real_cluster
    api = admin_api(state)
    node_name = state["real_node"]["name"]
    sysctls_before = state["real_node"]["sysctls_before"]

    # The node registered itself with its client certificate and is Ready, untainted.
    node = api.get(f"/api/v1/nodes/{node_name}")
    conditions = {c["type"]: c["status"] for c in node["status"]["conditions"]}
    assert conditions["Ready"] == "True", conditions
    assert not node["spec"].get("taints"), node["spec"]
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
    assert node["status"]["nodeInfo"]["kubeletVersion"] == state["versions"]["kubernetes"]

    # The chart's operator runs on the real node from the image built here: two
    # replicas Ready, one of them holds the Lease; the probe labelled the node.
    chart = state["chart"]
    namespace_ = chart["namespace"]
    deployment = api.get(f"/apis/apps/v1/namespaces/{namespace_}/deployments/{chart['release']}")
    assert deployment["status"].get("readyReplicas") == 2, deployment["status"]
    # (chart 0.1.0's Deployment selector also matched the probe's pods, which carry a
    # component; this chart's probe pods have another app.kubernetes.io/name)
    selector = ",".join([*(f"{k}={v}" for k, v in
                           deployment["spec"]["selector"]["matchLabels"].items()),
                         "!app.kubernetes.io/component"])
    pods = api.get(f"/api/v1/namespaces/{namespace_}/pods?labelSelector={selector}")["items"]
    assert {p["spec"]["nodeName"] for p in pods} == {node_name}
    assert {c["image"] for p in pods for c in p["spec"]["containers"]} == {chart["image"]}
    lease = api.get(f"/apis/coordination.k8s.io/v1/namespaces/{namespace_}/leases/"
                    "localmodel-operator")
    assert lease["spec"]["holderIdentity"] in {p["metadata"]["name"] for p in pods}
    wait_for("the probe to label the real node", lambda: api.get(
        f"/api/v1/nodes/{node_name}")["metadata"]["labels"].get(
        "localmodel.dev/cpu-physical-cores", "").isdigit(), 60)
    print(f"chart installed and ready in {chart['seconds']:.1f} s")

    # A Guaranteed pod with `cpu: 1` runs; the kubelet set its CFS quota to one CPU.
    namespace = f"real-{secrets.token_hex(3)}"
    api.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
    wait_for("the default ServiceAccount",
             lambda: api.status_of(
                 "GET", f"/api/v1/namespaces/{namespace}/serviceaccounts/default") == 200, 30)
    resources = {"cpu": "1", "memory": "64Mi"}
    api.create(f"/api/v1/namespaces/{namespace}/pods", {
        "metadata": {"name": "quota"},
        "spec": {
            "nodeName": node_name,
            "automountServiceAccountToken": False,
            "containers": [{
                "name": "pause", "image": state["real_node"]["sandbox_image"],
                "imagePullPolicy": "Never",
                "resources": {"requests": resources, "limits": resources},
            }],
        },
    })
    started = time.monotonic()

    def running() -> dict[str, Any] | None:
        pod = api.get(f"/api/v1/namespaces/{namespace}/pods/quota")
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        return pod if statuses and statuses[0].get("ready") else None

    pod = wait_for("the pod to run on the real node", running, 60)
    print(f"pod Running and Ready {time.monotonic() - started:.1f} s after creation")
    assert pod["status"]["qosClass"] == "Guaranteed"
    container_id = pod["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
    assert cfs_quota(pod["metadata"]["uid"], container_id) == (100_000, 100_000)

    # The API server reaches the kubelet (its client certificate, the node's
    # InternalIP): the pod's logs answer (empty: pause writes nothing).
    status, _ = api.request("GET", f"/api/v1/namespaces/{namespace}/pods/quota/log")
    assert status == 200

    # down: nothing of the node is left on the machine.
    pids = {**state["pids"], **state["real_node"]["pids"]}
    executables = {**state["executables"], **state["real_node"]["executables"]}
    began = time.monotonic()
    down = harness(Path(state["state_path"]), "down")
    print(f"down: {time.monotonic() - began:.1f} s")
    assert down.returncode == 0, down.stderr
    assert [name for name, pid in pids.items() if pid_runs(pid, executables[name])] == []
    assert {k: v for k, v in realnode.leftovers(state["real_node"]).items() if v} == {}
    assert realnode.read_sysctls() == sysctls_before


def test_down_cleans_up_after_a_harness_that_was_killed_hard(tmp_path: Path) -> None:
    """SIGKILL the `up` supervisor: the kernel stops containerd, the kubelet and
    kube-proxy (parent-death signal), but the shims, containers, mounts, network
    and chains stay. `down` removes them, from the node's record."""
    state_path = tmp_path / "state.json"
    record: dict[str, Any] | None = None
    try:
        up = harness(state_path, "up", "--detach", "--real-node")
        assert up.returncode == 0, f"up --real-node failed:\n{up.stdout}\n{up.stderr}"
        state = json.loads(state_path.read_text())
        record = realnode.read_record()
        assert record is not None and record["owner_pid"] == state["supervisor_pid"]
        # SIGTERM and at once SIGKILL: the supervisor's SIGTERM handler only sets a
        # flag its loop reads every 0.5 s, so it dies without stopping anything.
        terminate_pid(state["supervisor_pid"], timeout=0)

        def orphaned() -> dict[str, Any] | None:
            left = realnode.leftovers(record)
            return left if realnode.running_owner() is None and left["processes"] else None

        left = wait_for("the real node to be left without its harness", orphaned, 30)
        assert left["mounts"] and left["links"] and left["chains"], left
    finally:
        down = harness(state_path, "down")
    assert down.returncode == 0, down.stderr
    assert "removed what the real node left behind" in down.stdout
    assert {k: v for k, v in realnode.leftovers(record).items() if v} == {}
    assert realnode.read_sysctls() == record["sysctls_before"]
