"""Pod Security `restricted`, enforced on the real node: a namespace labelled
`pod-security.kubernetes.io/enforce=restricted` refuses a root pod, and
admits a llama-server LocalModel's pod as the operator renders it, which
becomes Ready and answers; inside it every container runs as the non-root
user, the gateway and the engine on a read-only root filesystem, the engine
with the weights volume read-only (docs/operator.md, Pod Security). Ollama's
pods keep to `baseline` (tests/realnode/test_ollama.py says what
`restricted` refuses in them, and only that).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from localmodel.contract import CONTAINER_DOWNLOAD, CONTAINER_GATEWAY, LABEL_NAME
from localmodel.engines import llama_server
from localmodel.gateway_contract import GATEWAY_PORT
from localmodel.podspec import NONROOT_UID
from tests.harness.processes import wait_for
from tests.realnode.journey import (
    LLAMA_SERVER_CALLS,
    Journey,
    Manifest,
    clean_reply,
    condition,
    http_json,
)

# `llama`: no Ollama (hack/test.sh runs it while Ollama builds: tests/harness/prereqs.py)
pytestmark = [pytest.mark.e2e, pytest.mark.realnode, pytest.mark.llama]

NAMESPACE = "journey-restricted"
NAME = "gemma-restricted"
LM_PATH = f"/apis/localmodel.dev/v1alpha1/namespaces/{NAMESPACE}/localmodels"
PODS_PATH = f"/api/v1/namespaces/{NAMESPACE}/pods"


def _pods(journey: Journey) -> list[Manifest]:
    items: list[Manifest] = journey.get(f"{PODS_PATH}?labelSelector={LABEL_NAME}={NAME}")["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def _describe(journey: Journey) -> str:
    return "\n".join([
        journey.kubectl("get", "localmodel,pod,pvc,events", "-n", NAMESPACE, "-o", "wide",
                        check=False),
        journey.kubectl("logs", "-n", NAMESPACE, "-l", f"{LABEL_NAME}={NAME}",
                        "--all-containers", "--tail=30", check=False),
    ])


def _exec(journey: Journey, pod: str, container: str, script: str) -> str:
    return journey.kubectl("exec", "-n", NAMESPACE, pod, "-c", container, "--",
                           "/bin/sh", "-c", script)


@pytest.fixture(scope="module")
def restricted(journey: Journey) -> Iterator[Manifest]:
    """A llama-server model, Ready in a namespace enforcing `restricted`; its pod."""
    api = journey.cluster.api()
    api.create("/api/v1/namespaces", {"metadata": {"name": NAMESPACE, "labels": {
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "latest",
    }}})
    wait_for("the restricted namespace's default ServiceAccount", lambda: api.status_of(
        "GET", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/default") == 200, 30)
    manifest = journey.local_model(NAME, llama_server.NAME)
    manifest["metadata"]["namespace"] = NAMESPACE
    began = time.monotonic()
    api.create(LM_PATH, manifest)
    try:
        try:
            wait_for(f"{NAME} Ready in {NAMESPACE}", lambda: condition(
                journey.get(f"{LM_PATH}/{NAME}"), "Ready") == "True", 600, interval=1)
        except Exception as exc:
            raise AssertionError(f"{exc}\n{_describe(journey)}") from exc
        journey.timings.add(f"{NAME}: created -> Ready under restricted", time.monotonic() - began)
        [pod] = _pods(journey)
        yield pod
    finally:
        api.request("DELETE", f"{LM_PATH}/{NAME}")
        wait_for(f"{NAME}'s pods to be gone", lambda: not _pods(journey), 120, interval=0.5)
        api.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}")


def test_a_restricted_namespace_refuses_root_and_admits_the_llama_server_model(
    journey: Journey, restricted: Manifest
) -> None:
    # Enforced: a pod that runs as root is refused here...
    status, body = journey.cluster.api().request("POST", PODS_PATH, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "root"},
        "spec": {"containers": [{"name": "c", "image": journey.operator_image,
                                 "securityContext": {"runAsUser": 0}}]}})
    assert status == 403 and "violates PodSecurity \"restricted" in body.get("message", ""), body
    # ...while the model's pod was admitted, runs, and answers.
    pod = _pods(journey)[0]
    assert pod["status"]["phase"] == "Running"
    assert condition(pod, "Ready") == "True"
    status, answer = http_json(
        f"http://{pod['status']['podIP']}:{GATEWAY_PORT}{LLAMA_SERVER_CALLS.short_path}",
        LLAMA_SERVER_CALLS.short_body)
    assert status == 200, answer
    print(f"restricted llama-server answered: {clean_reply(LLAMA_SERVER_CALLS.answer(answer))!r}")
    download = journey.kubectl("logs", "-n", NAMESPACE, pod["metadata"]["name"],
                               "-c", CONTAINER_DOWNLOAD)
    assert "localmodel: downloaded" in download, download


def test_inside_the_restricted_pod_nothing_is_root_or_writable_but_the_volume(
    journey: Journey, restricted: Manifest
) -> None:
    pod = _pods(journey)[0]
    name = pod["metadata"]["name"]
    assert pod["spec"]["automountServiceAccountToken"] is False
    for container in (CONTAINER_GATEWAY, llama_server.NAME):
        out = _exec(journey, name, container,
                    "id -u; grep CapEff /proc/self/status; touch /probe 2>&1 || true; "
                    "ls /var/run/secrets/kubernetes.io 2>&1 || true")
        lines = out.splitlines()
        assert lines[0] == str(NONROOT_UID), out
        assert "CapEff:\t0000000000000000" in out, out  # no capability at all
        assert "Read-only file system" in out, out
        assert "No such file or directory" in out, out  # no ServiceAccount token
    engine = _exec(journey, name, llama_server.NAME,
                   f"touch {llama_server.MODELS_DIR}/probe 2>&1 || true; "
                   f"ls -ln {llama_server.MODELS_DIR}")
    assert "Read-only file system" in engine, engine
    print(engine)
