"""The cluster's own gaps said up front (issue 31), against a real control plane
(etcd, kube-apiserver, controller-manager with its PV binder, scheduler, kwok):
a model whose image cannot be pulled, one whose claim names a StorageClass
that does not exist, and one whose claim names none on a cluster without a
default class are each `Ready=False` with that reason, naming what to change,
in the LocalModel's status within seconds.

kwok has no kubelet, so nothing pulls images here: the image case writes the
pod's status as the kubelet writes it for an image it cannot pull (the engine
container waiting with reason ErrImagePull and the runtime's message), through
the pod's status subresource. Its phase stays Running (kwok's `pod-ready`
stage would turn a Pending pod Ready again); the kubelet would leave it
Pending, which the operator does not read for this. The StorageClass cases are
real: the claims, the classes, the binder and the scheduler are the cluster's.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from localmodel.contract import LABEL_NAME
from tests.builders import MakeLocalModel
from tests.harness import TestCluster
from tests.harness.fixtures import operator_cluster, operator_running, tools_or_fail
from tests.harness.operator import OperatorProcess
from tests.harness.processes import wait_until

pytestmark = pytest.mark.e2e

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "operator-nodes.yaml"
LM = "/apis/localmodel.dev/v1alpha1"
DEFAULT = "storageclass.kubernetes.io/is-default-class"
MODEL = MakeLocalModel("m").spec(model="qwen3:0.6b", cpu=1, context=4096,
                                 placement={"exclusive": False},
                                 storage={"retain": False, "size": "5Gi"})
PULL_MESSAGE = ('failed to pull and unpack image "registry.corp:5000/ollama/ollama:0.0.1": '
                "failed to resolve reference: unexpected status from HEAD request: "
                "401 Unauthorized")


@pytest.fixture(scope="module")
def cluster() -> Iterator[TestCluster]:
    with operator_cluster(tools_or_fail(), FIXTURE) as c:
        yield c


@pytest.fixture(scope="module")
def operator(cluster: TestCluster) -> Iterator[OperatorProcess]:
    args = ("--image-registry", "registry.corp:5000", "--image-pull-secrets", "regcred")
    with operator_running(cluster, "operator-gaps", extra_args=args) as op:
        yield op


@pytest.fixture
def ns(cluster: TestCluster) -> Iterator[str]:
    with cluster.fresh_namespace("gap") as name:
        yield name


def apply(cluster: TestCluster, obj: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(obj))


def ready(cluster: TestCluster, ns: str, name: str) -> dict[str, Any]:
    lm = cluster.api().get(f"{LM}/namespaces/{ns}/localmodels/{name}")
    conditions = (lm.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "Ready"), {})


def wait_for(what: str, check: Any, timeout: float, describe: Any) -> None:
    try:
        wait_until(what, check, timeout=timeout)
    except Exception as exc:  # said with what was seen and the operator's log
        raise AssertionError(f"{exc}\n{describe()}") from None


def wait_reason(cluster: TestCluster, op: OperatorProcess, ns: str, name: str, reason: str,
                timeout: float = 60) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    def there() -> bool:
        seen.update(ready(cluster, ns, name))
        return seen.get("status") == "False" and seen.get("reason") == reason

    wait_for(f"Ready=False {reason} on {ns}/{name}", there, timeout,
             lambda: f"{seen}\n{op.log_tail()}")
    return dict(seen)


def test_an_image_that_cannot_be_pulled(cluster: TestCluster, operator: OperatorProcess,
                                        ns: str) -> None:
    """The pinned image under --image-registry, pulled with --image-pull-secrets:
    the kubelet's ErrImagePull on the pod reaches the LocalModel's Ready
    condition, naming the image, the message and the Secret to check."""
    apply(cluster, MODEL.named("pull", ns).manifest())
    api = cluster.api()
    pods_path = f"/api/v1/namespaces/{ns}/pods"
    found: list[dict[str, Any]] = []

    def made() -> bool:
        selector = urllib.parse.quote(f"{LABEL_NAME}=pull")
        found[:] = [p for p in api.get(f"{pods_path}?labelSelector={selector}")["items"]
                    if (p.get("status") or {}).get("podIP")]
        return bool(found)

    wait_for("the model's pod, run by kwok", made, 90, operator.log_tail)
    pod = found[0]
    assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    engine = pod["spec"]["containers"][0]
    assert engine["image"].startswith("registry.corp:5000/")
    # What the kubelet writes for an image it cannot pull (see the module's docstring).
    status = {"phase": "Running", "podIP": pod["status"]["podIP"], "conditions": [
        {"type": "Ready", "status": "False", "reason": "ContainersNotReady"},
        {"type": "PodScheduled", "status": "True"}],
        "containerStatuses": [{
            "name": engine["name"], "image": engine["image"], "imageID": "", "ready": False,
            "restartCount": 0,
            "state": {"waiting": {"reason": "ErrImagePull", "message": PULL_MESSAGE}}}]}
    api.merge_patch(f"{pods_path}/{pod['metadata']['name']}/status", {"status": status})
    cond = wait_reason(cluster, operator, ns, "pull", "ImagePullFailed", timeout=30)
    for words in (engine["image"], "ErrImagePull", "401 Unauthorized", "regcred",
                  f"namespace {ns}", "--image-registry"):
        assert words in cond["message"], (words, cond["message"])


def test_a_claim_naming_a_class_that_does_not_exist(
        cluster: TestCluster, operator: OperatorProcess, ns: str) -> None:
    apply(cluster, MODEL.named("nocls", ns).spec(
        storage={"retain": False, "size": "5Gi", "storageClassName": "fast-ssd"}).manifest())
    cond = wait_reason(cluster, operator, ns, "nocls", "StorageClassNotFound")
    assert "fast-ssd" in cond["message"] and "does not exist" in cond["message"]
    assert "local-disk" in cond["message"]  # the classes there are
    assert "spec.storage.storageClassName" in cond["message"]


def test_no_default_class_then_one(cluster: TestCluster, operator: OperatorProcess,
                                   ns: str) -> None:
    """Without a default StorageClass (as on a kubeadm cluster) a claim naming
    none says so; once the admin marks a class default, the claim is given it
    (retroactive default assignment) and the model becomes Ready."""
    cluster.kubectl("annotate", "storageclass", "local-disk", f"{DEFAULT}-")
    try:
        apply(cluster, MODEL.named("nodef", ns).manifest())
        cond = wait_reason(cluster, operator, ns, "nodef", "NoDefaultStorageClass")
        assert "names no StorageClass" in cond["message"]
        assert "local-disk" in cond["message"] and DEFAULT in cond["message"]
    finally:
        cluster.kubectl("annotate", "--overwrite", "storageclass", "local-disk",
                        f"{DEFAULT}=true")
    seen: dict[str, Any] = {}

    def fixed() -> bool:
        seen.update(ready(cluster, ns, "nodef"))
        return seen.get("status") == "True"

    wait_for("Ready once a default class exists", fixed, 180,
             lambda: f"{seen}\n{operator.log_tail()}")
