"""The chart's router (`router:` values, docs/router.md) with the real helm: off
by default; when on, a hardened Deployment running `localmodel router` with the
flags its own parser accepts, a Service on its pods, read-only RBAC (per
namespace when it serves some), and the operator told where the router runs,
so a model's NetworkPolicy admits exactly the router's pods. What the RBAC
lets it read on a real API server is tests/e2e/test_router_source.py's."""

from __future__ import annotations

from typing import Any

import pytest

from localmodel.controller.config import parse_config
from localmodel.controller.reconcile import render_options
from localmodel.render import RenderOptions
from localmodel.render.policy import render_network_policy
from localmodel.router.source import add_cluster_flags
from tests.builders import MakeLocalModel
from tests.harness import Tools
from tests.harness.chart import (
    CHART_DIR,
    NAMESPACE,
    helm,
    of_kind,
    operator_objects,
    render_chart,
    router_objects,
)

Manifest = dict[str, Any]
ON = ("router.enabled=true",)
READ_ONLY = {("localmodel.dev", "localmodels", "list"), ("localmodel.dev", "localmodels", "watch"),
             ("discovery.k8s.io", "endpointslices", "list"),
             ("discovery.k8s.io", "endpointslices", "watch")}


def rules(role: Manifest) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"]
            for r in rule["resources"] for v in rule["verbs"]}


def operator_args(rendered: list[Manifest]) -> list[str]:
    [deployment] = of_kind(operator_objects(rendered), "Deployment")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return list(container["args"])


def router_deployment(rendered: list[Manifest]) -> Manifest:
    [deployment] = of_kind(router_objects(rendered), "Deployment")
    return deployment


def router_args(rendered: list[Manifest]) -> list[str]:
    [container] = router_deployment(rendered)["spec"]["template"]["spec"]["containers"]
    return list(container["args"])


def test_off_by_default(tools: Tools) -> None:
    rendered = render_chart(tools)
    assert router_objects(rendered) == []
    assert not [a for a in operator_args(rendered) if a.startswith("--router-namespace")]


def test_the_router_runs_hardened_behind_its_service(tools: Tools) -> None:
    rendered = render_chart(tools, set_values=ON)
    deployment = router_deployment(rendered)
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"] == labels
    # Its own selector: the operator's Deployment does not select its pods, nor it theirs.
    [operator] = of_kind(operator_objects(rendered), "Deployment")
    op_selector = operator["spec"]["selector"]["matchLabels"].items()
    assert not op_selector <= labels.items()
    assert not labels.items() <= operator["spec"]["template"]["metadata"]["labels"].items()
    # Hardened like the operator's pods; it keeps its token (it watches the API server).
    assert pod["securityContext"] == operator["spec"]["template"]["spec"]["securityContext"]
    [container] = pod["containers"]
    [op_container] = operator["spec"]["template"]["spec"]["containers"]
    assert container["securityContext"] == op_container["securityContext"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["automountServiceAccountToken"] is True
    assert container["command"] == ["localmodel"] and container["args"][0] == "router"
    assert container["image"] == op_container["image"]
    assert container["resources"]["limits"]["memory"]
    assert container["readinessProbe"]["httpGet"]["port"] == "http"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 8080, "admin": 8090}
    # The Service selects exactly its pods, on the port it listens on.
    [service] = of_kind(router_objects(rendered), "Service")
    assert service["spec"]["selector"] == labels
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}]
    [account] = of_kind(router_objects(rendered), "ServiceAccount")
    assert pod["serviceAccountName"] == account["metadata"]["name"]


def test_the_router_flags_parse(tools: Tools) -> None:
    """The chart's arguments are ones `localmodel router` accepts (its parser,
    with the cluster source's flags)."""
    from localmodel.router.config import config_from, parser

    rendered = render_chart(tools, set_values=(*ON, "namespaces={ai,web}"))
    p = parser()
    add_cluster_flags(p)
    args = p.parse_args(router_args(rendered)[1:])
    config = config_from(args)
    assert (config.listen_port, config.admin_port) == (8080, 8090)
    assert args.namespaces == ("ai", "web")


def test_read_only_rbac_everywhere_by_default(tools: Tools) -> None:
    rendered = render_chart(tools, set_values=ON)
    objects = router_objects(rendered)
    [role] = of_kind(objects, "ClusterRole")
    assert rules(role) == READ_ONLY
    [binding] = of_kind(objects, "ClusterRoleBinding")
    [account] = of_kind(objects, "ServiceAccount")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                    "namespace": NAMESPACE}]
    assert of_kind(objects, "Role") == [] and of_kind(objects, "RoleBinding") == []
    assert not [a for a in router_args(rendered) if a.startswith("--namespaces")]


@pytest.mark.parametrize(
    ("values", "served"),
    [
        (("namespaces={ai,web}",), ["ai", "web"]),  # the operator's namespaces
        (("router.namespaces={ai}",), ["ai"]),  # its own
        (("namespaces={ai,web}", "router.namespaces={web}"), ["web"]),  # its own win
    ],
)
def test_per_namespace_roles_when_it_serves_some(
    tools: Tools, values: tuple[str, ...], served: list[str]
) -> None:
    rendered = render_chart(tools, set_values=(*ON, *values))
    objects = router_objects(rendered)
    assert of_kind(objects, "ClusterRole") == [] and of_kind(objects, "ClusterRoleBinding") == []
    roles = of_kind(objects, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == served
    assert all(rules(r) == READ_ONLY for r in roles)
    bindings = of_kind(objects, "RoleBinding")
    assert sorted(b["metadata"]["namespace"] for b in bindings) == served
    assert f"--namespaces={','.join(served)}" in router_args(rendered)


def test_the_models_policies_admit_the_router_pods(tools: Tools) -> None:
    """The operator learns the router's namespace from the chart, and the policy
    it then renders selects the router's pods by labels its pods carry."""
    rendered = render_chart(tools, set_values=(*ON, "networkPolicy.enabled=true"))
    # (the policy file is the ConfigMap's: tests/chart/test_policy_chart.py reads it)
    flags = [f for f in operator_args(rendered)[1:] if not f.startswith("--policy=")]
    config = parse_config(flags, {"POD_NAMESPACE": NAMESPACE})
    assert config.router_namespace == NAMESPACE
    labels = router_deployment(rendered)["spec"]["template"]["metadata"]["labels"]
    options = RenderOptions(network_policy=True, router_namespace=config.router_namespace)
    policy = render_network_policy(MakeLocalModel("m", "ai").obj(), options)
    [*_, router_peer] = policy["spec"]["ingress"][0]["from"]
    assert router_peer["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": NAMESPACE}
    assert router_peer["podSelector"]["matchLabels"].items() <= labels.items()


@pytest.mark.parametrize(
    ("value", "path"),
    [("router.replicas=0", "router/replicas"), ("router.colour=red", "router"),
     ("router.service.type=External", "router/service/type")],
)
def test_bad_router_values_fail_naming_the_value(tools: Tools, value: str, path: str) -> None:
    result = helm(tools, "template", "r", str(CHART_DIR), "--set", value)
    assert result.returncode != 0
    assert path in result.stderr


def test_the_chart_lints_with_the_router(tools: Tools) -> None:
    result = helm(tools, "lint", "--strict", str(CHART_DIR), "--set", "router.enabled=true",
                  "--set", "namespaces={ai}")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_router_mounts_the_signing_secret_the_operator_keeps(tools: Tools) -> None:
    """The router reads its signing key from the Secret the operator is told
    to ensure (same name, same namespace), read-only, as `--signing-key`."""
    from localmodel.router.config import parser

    rendered = render_chart(tools, set_values=ON)
    pod = router_deployment(rendered)["spec"]["template"]["spec"]
    [volume] = pod["volumes"]
    [container] = pod["containers"]
    [mount] = container["volumeMounts"]
    assert mount == {"name": volume["name"], "mountPath": "/etc/localmodel/router",
                     "readOnly": True}
    secret = volume["secret"]
    [item] = secret["items"]
    p = parser()
    add_cluster_flags(p)
    args = p.parse_args(router_args(rendered)[1:])
    assert args.signing_key == f"{mount['mountPath']}/{item['path']}"
    assert secret["defaultMode"] == 0o444  # readable by the router's uid without an fsGroup
    flags = [f for f in operator_args(rendered)[1:] if not f.startswith("--policy=")]
    config = parse_config(flags, {"POD_NAMESPACE": NAMESPACE})
    assert config.router_namespace == NAMESPACE
    assert config.router_signing_secret == secret["secretName"]
    from localmodel.controller.signing import KEY_FIELD
    assert item["key"] == KEY_FIELD
    # The name a value gives, in both places.
    named = render_chart(tools, set_values=(*ON, "router.signingSecret=my-key"))
    [volume] = router_deployment(named)["spec"]["template"]["spec"]["volumes"]
    assert volume["secret"]["secretName"] == "my-key"
    assert "--router-signing-secret=my-key" in operator_args(named)


def test_the_operator_may_get_only_the_signing_secret_and_create_secrets_only_here(
        tools: Tools) -> None:
    rendered = render_chart(tools, set_values=ON)
    [account] = of_kind(operator_objects(rendered), "ServiceAccount")
    secret_rules = [(r["metadata"]["namespace"], rule) for r in of_kind(rendered, "Role")
                    for rule in r["rules"] if "secrets" in rule["resources"]]
    name = next(a.split("=", 1)[1] for a in operator_args(rendered)
                if a.startswith("--router-signing-secret="))
    assert sorted((ns, tuple(rule["verbs"]), tuple(rule.get("resourceNames", ())))
                  for ns, rule in secret_rules) == [
        (NAMESPACE, ("create",), ()), (NAMESPACE, ("get",), (name,))]
    [binding] = [b for b in of_kind(rendered, "RoleBinding")
                 if b["metadata"]["name"].endswith("-router-signing")]
    assert binding["subjects"] == [{"kind": "ServiceAccount",
                                    "name": account["metadata"]["name"],
                                    "namespace": NAMESPACE}]
    # No Secret anywhere else, and none at all without the router.
    for role in of_kind(rendered, "ClusterRole"):
        assert all("secrets" not in r["resources"] or set(r["verbs"]) <= {"get", "list",
                                                                          "watch"}
                   for r in role["rules"])
    off = render_chart(tools)
    assert not [r for r in of_kind(off, "Role") if r["metadata"]["name"].endswith(
        "-router-signing")]
    assert not [a for a in operator_args(off) if a.startswith("--router-signing-secret")]


def test_the_operator_lists_the_routers_endpoints_and_may_reach_their_admin_port(
        tools: Tools) -> None:
    """spec.idle's wakes: the operator lists the router Service's EndpointSlices
    in the release namespace (nothing more) and long-polls each pod's admin
    port, which the router's NetworkPolicy admits from the operator's pods only
    (and the admin namespaces), the inference port from anyone."""
    rendered = render_chart(tools, set_values=(*ON, "networkPolicy.enabled=true",
                                               "networkPolicy.adminNamespaces={monitoring}"))
    [role] = [r for r in of_kind(rendered, "Role")
              if r["metadata"]["name"].endswith("-router-endpoints")]
    assert role["metadata"]["namespace"] == NAMESPACE
    assert rules(role) == {("discovery.k8s.io", "endpointslices", "list")}
    [policy] = of_kind(rendered, "NetworkPolicy")
    [deployment] = of_kind(operator_objects(rendered), "Deployment")
    operator_labels = deployment["spec"]["selector"]["matchLabels"]
    assert policy["spec"]["podSelector"]["matchLabels"] == router_deployment(
        rendered)["spec"]["selector"]["matchLabels"]
    inference, admin = policy["spec"]["ingress"]
    assert inference == {"ports": [{"port": "http", "protocol": "TCP"}]}
    assert admin["ports"] == [{"port": "admin", "protocol": "TCP"}]
    assert admin["from"] == [
        {"podSelector": {"matchLabels": operator_labels}},
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    # Without the models' NetworkPolicies the router gets none; without the router, nothing.
    assert of_kind(render_chart(tools, set_values=ON), "NetworkPolicy") == []
    off = render_chart(tools, set_values=("networkPolicy.enabled=true",))
    assert of_kind(off, "NetworkPolicy") == []
    assert not [r for r in of_kind(off, "Role") if "router" in r["metadata"]["name"]]


def test_the_doorman_names_the_routers_own_service_only_with_the_router(tools: Tools) -> None:
    """With the router on, the operator's `--router-url` is the router's
    Service (its name, the release namespace, its port), which a released
    model's doorman names to its callers; off, no address is named."""
    for port in ("80", "8080"):
        rendered = render_chart(tools, set_values=(*ON, f"router.service.port={port}"))
        [service] = of_kind(router_objects(rendered), "Service")
        flags = [f for f in operator_args(rendered)[1:] if not f.startswith("--policy=")]
        config = parse_config(flags, {"POD_NAMESPACE": NAMESPACE})
        meta = service["metadata"]
        assert config.router_url == (
            f"http://{meta['name']}.{meta['namespace']}:{service['spec']['ports'][0]['port']}")
        assert config.router_url.endswith(f":{port}")
        assert render_options(config).router_url == config.router_url
    off = render_chart(tools)
    assert not [a for a in operator_args(off) if a.startswith("--router-url")]
    flags = [f for f in operator_args(off)[1:] if not f.startswith("--policy=")]
    assert parse_config(flags, {"POD_NAMESPACE": NAMESPACE}).router_url == ""


@pytest.mark.parametrize(("values", "grace", "reserve"), [
    ((), 30.0, 120.0), (("idle.yieldGraceSeconds=45", "idle.reserveSeconds=7.5"), 45.0, 7.5)])
def test_the_idle_values_reach_the_operators_idle_settings(
        tools: Tools, values: tuple[str, ...], grace: float, reserve: float) -> None:
    rendered = render_chart(tools, set_values=values)
    flags = [f for f in operator_args(rendered)[1:] if not f.startswith("--policy=")]
    settings = parse_config(flags, {"POD_NAMESPACE": NAMESPACE}).idle_settings
    assert (settings.grace_s, settings.reserve_s, settings.router) == (grace, reserve, False)


@pytest.mark.parametrize("value", ["idle.yieldGraceSeconds=0", "idle.reserveSeconds=-1",
                                   "idle.reserveSeconds=soon"])
def test_bad_idle_values_fail_naming_the_value(tools: Tools, value: str) -> None:
    result = helm(tools, "template", "r", str(CHART_DIR), "--set", value)
    assert result.returncode != 0
    assert value.split("=")[0].replace(".", "/") in result.stderr
