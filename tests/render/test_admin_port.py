"""Who is asking, as rendered (render/gateway.py, render/policy.py): the admin
port the Service does not expose, the API keys' Secret mounted so kubelet can
update it in place, the overflow budget, and the opt-in NetworkPolicy.
Tables over the renderer's output; the gateway parses what the renderer sets."""

from __future__ import annotations

from typing import Any

import pytest

from localmodel import engines
from localmodel.api import LocalModel
from localmodel.contract import PORT_ADMIN, PORT_HTTP
from localmodel.desired import desired_state
from localmodel.gateway.config import parse_config
from localmodel.gateway_contract import ADMIN_PORT, GATEWAY_PORT
from localmodel.render import RenderOptions
from localmodel.render.policy import NAMESPACE_NAME_LABEL
from tests.builders import MakeLocalModel, MakeNode, by_kind_name

pytestmark = pytest.mark.unit

NOW = "2026-11-29T00:00:00Z"
QWEN = MakeLocalModel("qwen3").generation(3)
NODE = MakeNode("n1").cpu_flags(frozenset({"AVX2"}))
KEYS = {"keysSecretRef": {"name": "team-keys", "key": "keys"}}


def objects(model: LocalModel, options: RenderOptions | None = None) -> dict[str, Any]:
    state = desired_state([model], [NODE.facts()], now=NOW, options=options)
    return by_kind_name(state.models[0].objects)


def gateway(objs: dict[str, Any]) -> dict[str, Any]:
    pod = objs["Pod/qwen3-0"]
    return next(c for c in pod["spec"]["containers"] if c["name"] == "gateway")


def env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


def test_the_admin_port_is_the_pods_and_not_the_services() -> None:
    assert ADMIN_PORT != GATEWAY_PORT
    assert ADMIN_PORT not in {facts.PORT for facts in engines.FACTS}
    objs = objects(QWEN.obj())
    ports = {p["name"]: p["containerPort"] for p in gateway(objs)["ports"]}
    assert ports == {PORT_HTTP: GATEWAY_PORT, PORT_ADMIN: ADMIN_PORT}
    config = parse_config([], env(gateway(objs)))
    assert config.admin_address == ("0.0.0.0", ADMIN_PORT)
    assert config.listen_port == GATEWAY_PORT
    [service_port] = objs["Service/qwen3"]["spec"]["ports"]
    assert service_port["targetPort"] == PORT_HTTP  # the one port it exposes


def test_api_keys_are_mounted_whole_and_the_gateway_reads_them_there() -> None:
    objs = objects(QWEN.spec(gateway={"auth": KEYS}).obj())
    pod = objs["Pod/qwen3-0"]
    [volume] = [v for v in pod["spec"]["volumes"] if "secret" in v]
    assert volume["secret"]["secretName"] == "team-keys"
    assert volume["secret"]["items"] == [{"key": "keys", "path": "keys.json"}]
    [mount] = gateway(objs)["volumeMounts"]
    assert mount["name"] == volume["name"] and mount["readOnly"] is True
    assert "subPath" not in mount  # a subPath mount is never updated by kubelet
    config = parse_config([], env(gateway(objs)))
    assert config.keys_file == mount["mountPath"] + "/keys.json"
    # Only the gateway mounts it; the engine never sees the keys.
    for c in pod["spec"]["containers"] + pod["spec"]["initContainers"]:
        if c["name"] != "gateway":
            assert all(m["name"] != volume["name"] for m in c.get("volumeMounts", []))
    assert "volumeMounts" not in gateway(objects(QWEN.obj()))


def test_the_overflow_budget_reaches_the_gateway() -> None:
    overflow = {"url": "https://far/v1", "model": "big",
                "budget": {"requests": 50, "windowSeconds": 600}}
    config = parse_config([], env(gateway(objects(QWEN.spec(
        gateway={"overflow": overflow}).obj()))))
    assert config.overflow_budget == (50, 600.0)
    plain = parse_config([], env(gateway(objects(QWEN.spec(
        gateway={"overflow": {"url": "https://far/v1", "model": "big"}}).obj()))))
    assert plain.overflow_budget is None


ON = RenderOptions(network_policy=True, admin_namespaces=("lm-system", "monitoring"))


@pytest.mark.parametrize(
    ("spec_enabled", "options", "wanted"),
    [
        (None, RenderOptions(), False),  # the default: off
        (None, ON, True),  # the operator's default on
        (False, ON, False),  # the spec says no
        (True, RenderOptions(), True),  # the spec says yes
    ],
)
def test_a_network_policy_when_the_spec_or_else_the_operator_says(
    spec_enabled: bool | None, options: RenderOptions, wanted: bool
) -> None:
    policy = {} if spec_enabled is None else {"enabled": spec_enabled}
    objs = objects(QWEN.spec(gateway={"networkPolicy": policy}).obj(), options)
    assert ("NetworkPolicy/qwen3" in objs) is wanted


def _names(peers: list[dict[str, Any]]) -> list[str]:
    return [p["namespaceSelector"]["matchLabels"][NAMESPACE_NAME_LABEL] for p in peers]


def test_the_policy_admits_the_named_callers_to_inference_and_the_operator_to_admin() -> None:
    model = QWEN.uid("u-1").spec(gateway={"networkPolicy": {
        "namespaces": ["apps", "web"], "podLabels": {"role": "client"}}}).obj()
    policy = objects(model, ON)["NetworkPolicy/qwen3"]
    spec = policy["spec"]
    assert spec["podSelector"] == {"matchLabels": {"localmodel.dev/name": "qwen3"}}
    assert spec["policyTypes"] == ["Ingress"]
    inference, admin = spec["ingress"]
    assert _names(inference["from"]) == ["apps", "web"]
    assert all(p["podSelector"] == {"matchLabels": {"role": "client"}} for p in inference["from"])
    assert inference["ports"] == [{"port": PORT_HTTP, "protocol": "TCP"}]
    assert _names(admin["from"]) == ["lm-system", "monitoring"]
    assert all("podSelector" not in p for p in admin["from"])
    assert admin["ports"] == [{"port": PORT_ADMIN, "protocol": "TCP"}]
    refs = policy["metadata"]["ownerReferences"]
    assert [(r["kind"], r["uid"]) for r in refs] == [("LocalModel", "u-1")]
    assert refs[0]["controller"] is True  # garbage-collected with the model


def test_the_policy_defaults_to_the_models_namespace_and_follows_the_service() -> None:
    own = objects(QWEN.spec(gateway={"networkPolicy": {"enabled": True}}).obj())
    inference, _ = own["NetworkPolicy/qwen3"]["spec"]["ingress"]
    assert _names(inference["from"]) == [QWEN.obj().metadata.namespace]
    assert "podSelector" not in inference["from"][0]
    bare = objects(QWEN.spec(gateway={"enabled": False, "networkPolicy": {"enabled": True}})
                   .obj())
    [only] = bare["NetworkPolicy/qwen3"]["spec"]["ingress"]  # no gateway: no admin port
    target = bare["Service/qwen3"]["spec"]["ports"][0]["targetPort"]
    assert only["ports"] == [{"port": target, "protocol": "TCP"}]


def _peers(rule: dict[str, Any]) -> list[tuple[str, dict[str, str] | None]]:
    return [(p["namespaceSelector"]["matchLabels"][NAMESPACE_NAME_LABEL],
             (p.get("podSelector") or {}).get("matchLabels")) for p in rule["from"]]


ROUTER = {"app.kubernetes.io/component": "router"}


@pytest.mark.parametrize(
    ("admin", "router_ns", "inference_peers", "admin_peers"),
    [
        # no router: the callers and the admin namespaces only (what it was before)
        (("lm-system",), "", [("ai", None)], [("lm-system", None)]),
        # the router in the operator's namespace: its pods to inference; admin has the namespace
        (("lm-system",), "lm-system", [("ai", None), ("lm-system", ROUTER)],
         [("lm-system", None)]),
        # the router elsewhere: its pods to both ports
        (("lm-system",), "routing", [("ai", None), ("routing", ROUTER)],
         [("lm-system", None), ("routing", ROUTER)]),
        # no admin namespaces at all: the router still reads /speed
        ((), "routing", [("ai", None), ("routing", ROUTER)], [("routing", ROUTER)]),
    ],
)
def test_the_policy_admits_the_router_pods_to_both_ports(
    admin: tuple[str, ...], router_ns: str,
    inference_peers: list[tuple[str, dict[str, str] | None]],
    admin_peers: list[tuple[str, dict[str, str] | None]],
) -> None:
    options = RenderOptions(network_policy=True, admin_namespaces=admin,
                            router_namespace=router_ns)
    rules = objects(QWEN.namespace("ai").obj(), options)["NetworkPolicy/qwen3"]["spec"]["ingress"]
    assert _peers(rules[0]) == inference_peers
    assert rules[0]["ports"] == [{"port": PORT_HTTP, "protocol": "TCP"}]
    if admin_peers:
        assert _peers(rules[1]) == admin_peers
        assert rules[1]["ports"] == [{"port": "admin", "protocol": "TCP"}]
    else:
        assert len(rules) == 1


def test_a_model_without_its_gateway_does_not_admit_the_router() -> None:
    """No gateway: the router does not route there (router/cluster.py), so its
    pods get no way to the engine's port."""
    options = RenderOptions(network_policy=True, router_namespace="routing")
    model = QWEN.namespace("ai").spec(gateway={"enabled": False}).obj()
    [rule] = objects(model, options)["NetworkPolicy/qwen3"]["spec"]["ingress"]
    assert _peers(rule) == [("ai", None)]
