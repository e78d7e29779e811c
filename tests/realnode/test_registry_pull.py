"""The real node pulls every image from a real registry, and storage comes from a
real provisioner (issue 31).

- The node's containerd held no image before the chart was installed; every
  image it holds afterwards came from the test registry (the sandbox's too).
- A claim without a StorageClass binds through the cluster's default class, the
  local-path provisioner, with no volume made by hand.
- A registry that requires a login (htpasswd): a model whose engine image is
  there does not start without a pull secret (the kubelet's reason, the Events
  and the LocalModel's Ready condition name the image), and starts with one.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from localmodel.contract import LABEL_NAME
from tests.harness import localpath
from tests.harness.processes import wait_for
from tests.harness.registry import Registry, mirror_path
from tests.realnode.journey import Journey, condition

pytestmark = [pytest.mark.e2e, pytest.mark.realnode]

AUTH_NS = "pull-auth"
LOGIN = ("puller", "pull-secret-password")
PULL_FAILURES = ("ErrImagePull", "ImagePullBackOff")


def test_the_node_started_empty_and_pulled_every_image_from_the_registry(
        journey: Journey) -> None:
    node = journey.cluster.real_node
    registry = journey.cluster.registry
    assert node is not None and registry is not None
    assert node.images_at_start == [], node.images_at_start
    assert journey.images_before_chart == [], journey.images_before_chart
    assert node.images.sandbox == f"{registry.host}/pause:3.10"
    assert journey.operator_image.startswith(f"{registry.host}/localmodel/")
    names = [n for n in node.image_names() if not n.startswith("sha256:")]
    assert node.images.sandbox in names and journey.operator_image in names, names
    pushed = {_repository(r) for r in registry.pushed.values()}
    # Each image (by tag, or by digest: containerd lists both) is the registry's:
    # by its name there, or by an upstream name containerd resolved through the
    # registry (hosts.toml mirror).
    for name in names:
        repository = _repository(name)
        assert repository in pushed or (
            f"{registry.host}/{_repository(mirror_path(name))}" in pushed), (name, sorted(pushed))
    # The kubelet reported the pulls (Events `Pulled`) for the chart's pods.
    pulled = journey.get("/api/v1/namespaces/localmodel-system/events"
                         "?fieldSelector=reason%3DPulled")["items"]
    assert any(journey.operator_image in e.get("message", "") for e in pulled), pulled


def _repository(reference: str) -> str:
    """A reference without its tag or digest."""
    name = reference.split("@", 1)[0]
    head, sep, tag = name.rpartition(":")
    return head if sep and "/" not in tag else name


def test_a_claim_without_a_class_binds_through_the_local_path_provisioner(
        journey: Journey) -> None:
    api = journey.cluster.api()
    node = journey.cluster.real_node
    assert node is not None
    ns = "default"
    claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
             "metadata": {"name": "provisioned"},
             "spec": {"accessModes": ["ReadWriteOnce"],
                      "resources": {"requests": {"storage": "64Mi"}}}}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "writes-a-volume"},
           "spec": {"nodeSelector": {"kubernetes.io/hostname": journey.node},
                    "restartPolicy": "Never",
                    "containers": [{"name": "w", "image": node.images.helper,
                                    "command": ["sh", "-c", "echo kept > /data/file"],
                                    "volumeMounts": [{"name": "v", "mountPath": "/data"}]}],
                    "volumes": [{"name": "v",
                                 "persistentVolumeClaim": {"claimName": "provisioned"}}]}}
    api.create(f"/api/v1/namespaces/{ns}/persistentvolumeclaims", claim)
    api.create(f"/api/v1/namespaces/{ns}/pods", pod)
    try:
        wait_for("the pod writing to a provisioned volume to succeed", lambda: (
            api.get(f"/api/v1/namespaces/{ns}/pods/writes-a-volume")["status"].get("phase")
            == "Succeeded"), 300, interval=1)
        bound = api.get(f"/api/v1/namespaces/{ns}/persistentvolumeclaims/provisioned")
        assert bound["spec"]["storageClassName"] == localpath.STORAGE_CLASS
        assert bound["status"]["phase"] == "Bound"
        pv = api.get(f"/api/v1/persistentvolumes/{bound['spec']['volumeName']}")
        assert (pv["metadata"]["annotations"]["pv.kubernetes.io/provisioned-by"]
                == localpath.PROVISIONER)
        path = pv["spec"]["hostPath"]["path"] if "hostPath" in pv["spec"] else (
            pv["spec"]["local"]["path"])
        with open(f"{path}/file") as f:
            assert f.read() == "kept\n"
    finally:
        api.status_of("DELETE", f"/api/v1/namespaces/{ns}/pods/writes-a-volume")
        api.status_of("DELETE", f"/api/v1/namespaces/{ns}/persistentvolumeclaims/provisioned")


@pytest.fixture(scope="module")
def auth_registry(journey: Journey) -> Iterator[Registry]:
    """A second registry, requiring a login, holding the Ollama image; the node trusts it."""
    cluster = journey.cluster
    assert cluster.pki is not None and cluster.real_node is not None
    registry = Registry(cluster.workdir / "registry-auth", cluster.pki, login=LOGIN)
    registry.start()
    try:
        registry.push(("ollama",))
        print(f"auth registry: start {registry.start_seconds:.1f} s, "
              f"push {registry.push_seconds:.1f} s")
        cluster.real_node.trust(registry)
        api = cluster.api()
        api.create("/api/v1/namespaces", {"metadata": {"name": AUTH_NS}})
        wait_for(f"{AUTH_NS}'s default ServiceAccount", lambda: api.status_of(
            "GET", f"/api/v1/namespaces/{AUTH_NS}/serviceaccounts/default") == 200, 30)
        yield registry
    finally:
        registry.stop()


def _auth_model(journey: Journey, image: str) -> dict[str, Any]:
    model = journey.local_model("auth", "ollama")
    model["metadata"]["namespace"] = AUTH_NS
    model["spec"]["engine"]["image"] = image
    del model["spec"]["storage"]  # the default class: the local-path provisioner
    return model


def _pull_failure(journey: Journey, image: str) -> dict[str, Any] | None:
    pods = journey.get(f"/api/v1/namespaces/{AUTH_NS}/pods?labelSelector={LABEL_NAME}=auth")
    for pod in pods["items"]:
        status = pod.get("status") or {}
        for c in [*(status.get("initContainerStatuses") or []),
                  *(status.get("containerStatuses") or [])]:
            waiting = (c.get("state") or {}).get("waiting") or {}
            if c.get("image") == image and waiting.get("reason") in PULL_FAILURES:
                return dict(waiting)
    return None


def test_a_registry_login_pulls_with_the_pull_secret_and_fails_clearly_without(
        journey: Journey, auth_registry: Registry) -> None:
    api = journey.cluster.api()
    [image] = [pushed for upstream, pushed in auth_registry.pushed.items()
               if upstream.startswith("docker.io/ollama/ollama:")]
    path = f"/apis/localmodel.dev/v1alpha1/namespaces/{AUTH_NS}/localmodels"
    # Without a pull secret: the registry refuses, the kubelet says so, naming the image.
    api.create(path, _auth_model(journey, image))
    found: dict[str, Any] = {}

    def refused() -> bool:
        found.update(_pull_failure(journey, image) or {})
        return bool(found)

    wait_for(f"the pod to fail pulling {image}", refused, 180, interval=1)
    events = journey.get(f"/api/v1/namespaces/{AUTH_NS}/events")["items"]
    failed = [e["message"] for e in events if e.get("reason") == "Failed"
              and image in e.get("message", "")]
    assert failed, [e.get("message") for e in events]
    assert any("401" in m or "unauthorized" in m.lower() for m in failed), failed
    # The LocalModel says it too, naming the image (the operator's cluster gaps).
    said: dict[str, Any] = {}

    def reason() -> bool:
        for c in (journey.get(f"{path}/auth").get("status") or {}).get("conditions") or []:
            if c.get("type") == "Ready":
                said.update(c)
        return said.get("reason") == "ImagePullFailed"

    wait_for("the LocalModel's Ready=False ImagePullFailed", reason, 120, interval=1)
    assert said["status"] == "False" and image in said["message"], said
    api.request("DELETE", f"{path}/auth")
    wait_for("the refused pod to be gone", lambda: not journey.get(
        f"/api/v1/namespaces/{AUTH_NS}/pods?labelSelector={LABEL_NAME}=auth")["items"],
        120, interval=0.5)

    # With one (the namespace's default ServiceAccount carries it to every pod).
    auth = base64.b64encode(":".join(LOGIN).encode()).decode()
    api.create(f"/api/v1/namespaces/{AUTH_NS}/secrets", {
        "metadata": {"name": "registry-login"}, "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": base64.b64encode(json.dumps(
            {"auths": {auth_registry.host: {"auth": auth}}}).encode()).decode()}})
    journey.kubectl("patch", "serviceaccount", "default", "-n", AUTH_NS, "-p",
                    json.dumps({"imagePullSecrets": [{"name": "registry-login"}]}))
    began = time.monotonic()
    api.create(path, _auth_model(journey, image))
    try:
        wait_for("the model pulled with the secret to be Ready", lambda: condition(
            journey.get(f"{path}/auth"), "Ready") == "True", 600, interval=1)
        journey.timings.add("auth: created -> Ready (pulled with the pull secret)",
                            time.monotonic() - began)
        [pod] = journey.get(f"/api/v1/namespaces/{AUTH_NS}/pods?labelSelector="
                            f"{LABEL_NAME}=auth")["items"]
        assert pod["spec"]["imagePullSecrets"] == [{"name": "registry-login"}]
        images = {c["image"] for c in pod["spec"]["containers"]}
        assert image in images, images
    finally:
        api.request("DELETE", f"{path}/auth")
        wait_for("the auth model's pods to be gone", lambda: not journey.get(
            f"/api/v1/namespaces/{AUTH_NS}/pods?labelSelector={LABEL_NAME}=auth")["items"],
            180, interval=0.5)

