"""The chart on the real node: `helm install` from the locally built image gives
two operator replicas Running, one of them holding the leader Lease, and the
probe DaemonSet labels the real node with this machine's real CPU facts."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime

import pytest

from localmodel.facts.machine import read_machine
from localmodel.facts.node import (
    PROBE_BANDWIDTH_KEYS,
    PROBE_FACTS_ANNOTATION,
    bandwidth_from_labels,
)
from localmodel.probe.node import desired_metadata, is_probe_label
from tests.harness.chart import NAMESPACE, RELEASE
from tests.harness.processes import wait_for
from tests.realnode.journey import Journey, all_containers_ready

pytestmark = [pytest.mark.e2e, pytest.mark.realnode]


def test_operator_replicas_run_on_the_real_node_and_one_holds_the_lease(
    journey: Journey,
) -> None:
    # The Deployment's pods: the release's selector labels, without the probe's component.
    pods = journey.get(f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector="
                       f"app.kubernetes.io/instance={RELEASE},!app.kubernetes.io/component"
                       )["items"]
    assert len(pods) == 2, [p["metadata"]["name"] for p in pods]
    for pod in pods:
        assert pod["status"]["phase"] == "Running", pod["status"]
        assert all_containers_ready(pod), pod["status"]
        assert pod["spec"]["nodeName"] == journey.node
        [container] = pod["spec"]["containers"]
        assert container["image"] == journey.operator_image
    names = {p["metadata"]["name"] for p in pods}
    # Non-root on a read-only root filesystem, and kopf and the operator run so.
    for pod in pods:
        [container] = pod["spec"]["containers"]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    inside = journey.kubectl("exec", "-n", NAMESPACE, pods[0]["metadata"]["name"], "--",
                             "/bin/sh", "-c", "id -u; touch /probe-write 2>&1 || echo refused")
    uid, *rest = inside.split("\n", 1)
    assert uid.strip() == "65532", inside
    assert "Read-only file system" in inside and "refused" in "".join(rest), inside

    def lease() -> dict[str, object] | None:
        status, body = journey.cluster.api().request(
            "GET", f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{RELEASE}")
        holder = str(((body.get("spec") or {}) if status == 200 else {}).get("holderIdentity", ""))
        return body if any(holder.startswith(n) for n in names) else None

    held = wait_for("an operator replica to hold the Lease", lease, 60)
    spec = held["spec"]
    assert isinstance(spec, dict)
    renewed = datetime.fromisoformat(str(spec["renewTime"]).replace("Z", "+00:00"))
    age = (datetime.now(UTC) - renewed).total_seconds()
    assert age < float(spec["leaseDurationSeconds"]), spec
    print(f"Lease {RELEASE} held by {spec['holderIdentity']} (renewed {age:.1f} s ago)")


def test_the_probe_labels_the_real_node_with_this_machines_facts(journey: Journey) -> None:
    pods = journey.get(f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector="
                       f"app.kubernetes.io/component=node-probe&fieldSelector=spec.nodeName="
                       f"{journey.node}")["items"]
    assert len(pods) == 1 and pods[0]["status"]["phase"] == "Running", pods
    want, _ = desired_metadata(read_machine())
    assert want, "this machine has no facts to label"

    def labelled() -> dict[str, str] | None:
        node = journey.get(f"/api/v1/nodes/{journey.node}")
        labels = {k: v for k, v in node["metadata"]["labels"].items()
                  if is_probe_label(k) and k not in PROBE_BANDWIDTH_KEYS}
        return labels if labels == want else None

    labels = wait_for(f"the probe's labels on {journey.node}", labelled, 60)
    node = journey.get(f"/api/v1/nodes/{journey.node}")
    facts = json.loads(node["metadata"]["annotations"][PROBE_FACTS_ANNOTATION])
    assert facts["host_cpus"] == os.cpu_count()
    # The memory bandwidth, measured only on a quiet node: when there, it reads back whole.
    assert bandwidth_from_labels(node["metadata"]["labels"])[1] == ""
    print(f"{journey.node}: {labels}")
