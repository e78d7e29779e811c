"""Pod shape, for every engine: the engine's container on its port with its
pinned image, the gateway beside it pointed at that port and told the engine,
readiness (the gateway's, or the engine's own without it), every mount backed
by a volume of the pod (the weights claim; the ConfigMap entry when the
engine has one), requests = limits = the rules' decision for the engine and
each of its init steps, and the pod's security context the adapter's."""

from __future__ import annotations

from typing import Any

import pytest

from localmodel.contract import CONTAINER_GATEWAY, VOLUME_WEIGHTS
from localmodel.facts.quantity import format_bytes
from localmodel.gateway_contract import env_name
from tests.conformance.subjects import (
    NAMES,
    adapter,
    base_model,
    engine_facts,
    render,
)

pytestmark = pytest.mark.unit

Manifest = dict[str, Any]


def _engine_container(name: str, pod: Manifest) -> Manifest:
    port = adapter(name).pod.port
    engines: list[Manifest] = [c for c in pod["spec"]["containers"]
                               if any(p["containerPort"] == port for p in c.get("ports", []))]
    [engine] = engines
    return engine


def _env(container: Manifest) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


@pytest.mark.parametrize("name", NAMES)
def test_the_engine_runs_its_image_on_its_port_beside_the_gateway(name: str) -> None:
    rendered = render(base_model(name))
    pod = rendered.pod
    engine = _engine_container(name, pod)
    assert engine["image"] == engine_facts(name).IMAGE
    assert adapter(name).pod.port == engine_facts(name).PORT
    [gateway] = [c for c in pod["spec"]["containers"] if c["name"] == CONTAINER_GATEWAY]
    env = _env(gateway)
    assert env[env_name("engine")] == name
    assert env[env_name("upstream")] == f"http://127.0.0.1:{adapter(name).pod.port}"
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert [c["name"] for c in pod["spec"]["containers"]] == [engine["name"], CONTAINER_GATEWAY]


@pytest.mark.parametrize("name", NAMES)
def test_without_the_gateway_the_engine_is_the_pods_readiness(name: str) -> None:
    pod = render(base_model(name).spec(gateway={"enabled": False})).pod
    [engine] = pod["spec"]["containers"]
    assert engine is _engine_container(name, pod)
    assert "readinessProbe" in engine


@pytest.mark.parametrize("name", NAMES)
def test_every_mount_is_a_volume_of_the_pod_and_the_weights_claim_is_one(name: str) -> None:
    rendered = render(base_model(name))
    spec = rendered.pod["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    [claim] = rendered.objects("PersistentVolumeClaim")
    assert volumes[VOLUME_WEIGHTS]["persistentVolumeClaim"]["claimName"] == (
        claim["metadata"]["name"])
    for container in spec.get("initContainers", []) + spec["containers"]:
        for mount in container.get("volumeMounts", []):
            assert mount["name"] in volumes, f"{container['name']} mounts {mount['name']}"
    engine = _engine_container(name, rendered.pod)
    assert any(m["name"] == VOLUME_WEIGHTS for m in engine["volumeMounts"])


@pytest.mark.parametrize("name", NAMES)
def test_the_configmap_holds_each_replicas_entry_when_the_engine_has_one(name: str) -> None:
    rendered = render(base_model(name))
    pod_adapter = adapter(name).pod
    configmaps = rendered.objects("ConfigMap")
    if not pod_adapter.has_config:
        assert configmaps == []
        return
    [configmap] = configmaps
    key = pod_adapter.config_key(0)
    assert key in configmap["data"]
    mounted = [v for v in rendered.pod["spec"]["volumes"] if "configMap" in v]
    assert mounted == pod_adapter.config_volumes(configmap["metadata"]["name"], key)


@pytest.mark.parametrize("name", NAMES)
def test_the_engine_and_its_init_steps_get_the_decided_cpu_and_memory(name: str) -> None:
    for spec in ({}, {"memory": "3Gi"}, {"cpu": 3}):
        rendered = render(base_model(name).spec(**spec))
        [placement] = rendered.status["placements"]
        want = {"cpu": str(placement["cpu"]), "memory": placement["memory"]}
        if "memory" in spec:
            assert placement["memory"] == format_bytes(3 * 1024**3)
        pod = rendered.pod["spec"]
        for container in [*pod.get("initContainers", []), _engine_container(name, rendered.pod)]:
            assert container["resources"] == {"requests": want, "limits": want}, (
                f"{name}: {container['name']}")


@pytest.mark.parametrize("name", NAMES)
def test_the_pods_security_context_is_the_adapters(name: str) -> None:
    pod = render(base_model(name)).pod
    assert pod["spec"]["securityContext"] == adapter(name).pod.pod_security
    for container in pod["spec"].get("initContainers", []) + pod["spec"]["containers"]:
        context = container["securityContext"]
        assert context["allowPrivilegeEscalation"] is False
        assert context["capabilities"] == {"drop": ["ALL"]}
