"""The doorman's pod as rendered (render/doorman.py): the whole manifest of one
released model, written out; which models get one; what the keys, the router
and the last wake change; that the Service selects it and nothing takes it
for a replica; that it passes Pod Security `restricted` whole; that the real
gateway parses its environment into the doorman's settings; and that the
renders of every model without one stay as they were."""

from __future__ import annotations

from typing import Any

import pytest

from localmodel.contract import LABEL_NAME, LABEL_REPLICA, LABEL_ROLE, ROLE_DOORMAN
from localmodel.desired import desired_state
from localmodel.gateway.config import parse_config
from localmodel.podspec import NONROOT_UID
from localmodel.render import RenderOptions
from localmodel.render.applied import render_service
from localmodel.render.doorman import doorman_objects
from localmodel.render.names import Meta
from tests.builders import MakeLocalModel, MakeNode
from tests.render.test_render_pod_security import restricted_violations

pytestmark = pytest.mark.unit

UID = "0c8a1b9e-6a0e-4a57-9a58-5a4b1f0e7d21"
IDLE = {"after": "30m"}
ROUTER = "http://localmodel-router.localmodel:8080"
QWEN = MakeLocalModel("qwen3").uid(UID).spec(model="qwen3:4b", cpu=4, idle=IDLE)
OPTIONS = RenderOptions(operator_image="ghcr.io/localmodel/localmodel-operator:9.9.9")
E = "LOCALMODEL_GATEWAY_"

WANT: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "name": "qwen3-doorman",
        "namespace": "ai",
        "labels": {
            "app.kubernetes.io/name": "localmodel",
            "app.kubernetes.io/instance": "qwen3",
            "app.kubernetes.io/managed-by": "localmodel-operator",
            "localmodel.dev/name": "qwen3",
            "localmodel.dev/role": "doorman",
        },
        "ownerReferences": [{"apiVersion": "localmodel.dev/v1alpha1", "kind": "LocalModel",
                             "name": "qwen3", "uid": UID, "controller": True,
                             "blockOwnerDeletion": True}],
    },
    "spec": {
        "containers": [{
            "name": "gateway",
            "image": "ghcr.io/localmodel/localmodel-operator:9.9.9",
            "imagePullPolicy": "IfNotPresent",
            "command": ["localmodel", "gateway", "--doorman"],
            "env": [
                {"name": E + "ENGINE", "value": "ollama"},
                {"name": E + "MODEL", "value": "qwen3:4b"},
                {"name": E + "LISTEN", "value": "0.0.0.0:8080"},
                {"name": E + "ADMIN_LISTEN", "value": "0.0.0.0:8090"},
                {"name": E + "ROUTER_URL", "value": ROUTER},
                {"name": E + "WAKE_SECONDS", "value": "15"},
                {"name": E + "POD_NAMESPACE",
                 "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                {"name": E + "POD_NAME",
                 "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            ],
            "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"},
                      {"name": "admin", "containerPort": 8090, "protocol": "TCP"}],
            "readinessProbe": {"httpGet": {"path": "/readyz", "port": "http"},
                               "periodSeconds": 5},
            "livenessProbe": {"httpGet": {"path": "/healthz", "port": "http"},
                              "periodSeconds": 10, "failureThreshold": 6},
            "resources": {"requests": {"cpu": "50m", "memory": "64Mi"},
                          "limits": {"cpu": "50m", "memory": "64Mi"}},
            "securityContext": {"allowPrivilegeEscalation": False,
                                "capabilities": {"drop": ["ALL"]},
                                "readOnlyRootFilesystem": True, "runAsNonRoot": True,
                                "runAsUser": NONROOT_UID, "runAsGroup": NONROOT_UID},
        }],
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
    },
}


def _env(pod: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in
            pod["spec"]["containers"][0]["env"]}


def test_a_released_models_doorman_is_this_pod() -> None:
    assert doorman_objects(QWEN.obj(), OPTIONS, router_url=ROUTER, wake_seconds=14.2) == [WANT]


@pytest.mark.parametrize(("why", "make"), [
    ("never sleeps: no spec.idle", MakeLocalModel("a").spec(model="qwen3:4b")),
    ("off: replicas 0 beats sleep", QWEN.spec(replicas=0)),
])
def test_a_model_that_cannot_be_released_has_no_doorman(why: str, make: MakeLocalModel) -> None:
    assert doorman_objects(make.obj(), OPTIONS, router_url=ROUTER) == [], why


@pytest.mark.parametrize(("wake", "told"), [
    (None, None), (14.2, "15"), (3.0, "3"), (0.0, None), (-5.0, None), (float("nan"), None),
    (float("inf"), None), (86_400.0, "3600")])
def test_the_retry_after_is_the_last_wake_rounded_up_and_bounded(
        wake: float | None, told: str | None) -> None:
    [pod] = doorman_objects(QWEN.obj(), OPTIONS, wake_seconds=wake)
    assert _env(pod).get(E + "WAKE_SECONDS") == told


def test_without_the_router_the_doorman_names_none() -> None:
    [pod] = doorman_objects(QWEN.obj(), OPTIONS)
    assert E + "ROUTER_URL" not in _env(pod)


def test_keys_are_mounted_as_the_gateways_and_the_overflow_key_never() -> None:
    keyed = QWEN.spec(gateway={
        "auth": {"keysSecretRef": {"name": "keys", "key": "keys.json"}},
        "overflow": {"url": "https://api.example.com/v1", "model": "gpt-x",
                     "apiKeySecretRef": {"name": "openai", "key": "key"}}}).obj()
    [pod] = doorman_objects(keyed, OPTIONS)
    [gateway_pod] = [o for o in desired_state(
        [keyed], [MakeNode("n").cpus(8).memory_gib(32).facts()], now="t",
        options=OPTIONS).models[0].objects if o["kind"] == "Pod"]
    [gateway] = [c for c in gateway_pod["spec"]["containers"] if c["name"] == "gateway"]
    container = pod["spec"]["containers"][0]
    assert container["volumeMounts"] == gateway["volumeMounts"]
    keys_volume = [v for v in gateway_pod["spec"]["volumes"] if v["name"] == "api-keys"]
    assert pod["spec"]["volumes"] == keys_volume
    env = _env(pod)
    assert env[E + "KEYS_FILE"] == _env({"spec": {"containers": [gateway]}})[E + "KEYS_FILE"]
    assert not [name for name in env if "OVERFLOW" in name]  # it never proxies
    assert container["securityContext"] == gateway["securityContext"]


def test_the_service_selects_it_and_nothing_takes_it_for_a_replica() -> None:
    lm = QWEN.obj()
    [pod] = doorman_objects(lm, OPTIONS)
    labels = pod["metadata"]["labels"]
    selector = render_service(lm, Meta(lm))["spec"]["selector"]
    assert selector.items() <= labels.items()
    assert LABEL_REPLICA not in labels and labels[LABEL_ROLE] == ROLE_DOORMAN
    assert labels[LABEL_NAME] == "qwen3"
    spec = pod["spec"]
    # kube-scheduler places it: the planner chose no node, no claim is mounted.
    assert "nodeName" not in spec and "affinity" not in spec
    assert not [v for v in spec.get("volumes", []) if "persistentVolumeClaim" in v]


def test_it_goes_where_the_models_pods_may_and_pulls_as_they_do() -> None:
    placed = QWEN.spec(placement={
        "nodeSelector": {"pool": "cpu"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ai",
                         "effect": "NoSchedule"}]}).obj()
    [pod] = doorman_objects(placed, RenderOptions(image_pull_secrets=("regcred",),
                                                  image_registry="registry.corp:5000"))
    spec = pod["spec"]
    assert spec["nodeSelector"] == {"pool": "cpu"}
    assert spec["tolerations"] == [{"key": "dedicated", "operator": "Equal", "value": "ai",
                                    "effect": "NoSchedule"}]
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert spec["containers"][0]["image"].startswith("registry.corp:5000/")


@pytest.mark.parametrize("engine", ["ollama", "llama-server"])
def test_the_doorman_passes_pod_security_restricted_whole(engine: str) -> None:
    make = QWEN.spec(engine={"name": engine}, gateway={
        "auth": {"keysSecretRef": {"name": "keys", "key": "keys.json"}}})
    if engine == "llama-server":
        make = make.gguf("https://models.example.org/q.gguf", "a" * 64)
    [pod] = doorman_objects(make.obj(), OPTIONS)
    assert restricted_violations(pod) == {}
    assert pod["spec"]["automountServiceAccountToken"] is False


def test_the_gateway_reads_its_environment_as_the_doormans_settings() -> None:
    [pod] = doorman_objects(QWEN.obj(), OPTIONS, router_url=ROUTER, wake_seconds=40)
    literal = {k: v for k, v in _env(pod).items() if isinstance(v, str)}
    config = parse_config([], literal | {E + "POD_NAMESPACE": "ai"})
    assert (config.model, config.router_url, config.wake_seconds) == ("qwen3:4b", ROUTER, 40)
    assert (config.listen_host, config.listen_port, config.admin_address) == (
        "0.0.0.0", 8080, ("0.0.0.0", 8090))
    assert config.pod_namespace == "ai"


def test_no_render_of_a_model_carries_a_doorman() -> None:
    """The doorman is the operator's to create (at release): a model's own
    render, idle or not, has none (the golden renders stay as they were)."""
    node = MakeNode("n").cpus(8).memory_gib(32).facts()
    state = desired_state([QWEN.obj()], [node], now="t", options=OPTIONS)
    names = [o["metadata"]["name"] for o in state.models[0].objects]
    assert "qwen3-doorman" not in names and "qwen3-0" in names
