"""The chart's admin policy (`policy` values -> a ConfigMap the operator reads
with --policy) and its per-namespace binding (`namespaces`), with the real helm.
The binding's effect on a real API server is tests/e2e/test_tenant_policy.py's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from localmodel.controller.config import parse_config, read_policy
from localmodel.tenancy import LabelRule, TenantPolicy
from tests.harness import Tools
from tests.harness.chart import CHART_DIR, helm, of_kind, operator_objects, render_chart

Manifest = dict[str, Any]
POLICY_FLAG = "--policy=/etc/localmodel/policy/policy.yaml"


def rules(role: Manifest) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"]
            for r in rule["resources"] for v in rule["verbs"]}


def operator_role(rendered: list[Manifest]) -> Manifest:
    [role] = of_kind(operator_objects(rendered), "ClusterRole")
    return role


def model_roles(rendered: list[Manifest]) -> list[Manifest]:
    """The Roles that are not the leader-election Lease's."""
    return [r for r in of_kind(rendered, "Role") if not r["metadata"]["name"].endswith("-leader")]


def policy_of(rendered: list[Manifest], tmp_path: Path) -> TenantPolicy:
    """The policy the operator reads from the chart's ConfigMap, at the path its flag names."""
    [config_map] = [m for m in of_kind(rendered, "ConfigMap")
                    if m["metadata"]["name"].endswith("-policy")]
    [deployment] = of_kind(rendered, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert POLICY_FLAG in container["args"]
    [mount] = [m for m in container["volumeMounts"] if m["name"] == "policy"]
    [volume] = [v for v in pod["volumes"] if v["name"] == "policy"]
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    assert mount["mountPath"] == "/etc/localmodel/policy" and mount["readOnly"] is True
    path = tmp_path / "policy.yaml"
    path.write_text(config_map["data"]["policy.yaml"])
    return read_policy(str(path))


def test_the_default_policy_reaches_the_operator_and_is_its_default(
    tools: Tools, tmp_path: Path
) -> None:
    assert policy_of(render_chart(tools), tmp_path) == TenantPolicy()


def test_every_policy_value_reaches_the_operator(tools: Tools, tmp_path: Path) -> None:
    rendered = render_chart(tools, set_values=(
        "policy.imageRegistries={docker.io/ollama,registry.internal:5000}",
        "policy.overflowHosts={api.openai.com,*.corp.example}",
        "policy.secretLabel=localmodel.dev/overflow-key=true",
        "policy.allowControlPlane=true",
        "policy.controlPlaneTaints={example.com/infra}",
        "policy.exclusiveNamespaces={platform}",
    ))
    assert policy_of(rendered, tmp_path) == TenantPolicy(
        image_registries=("docker.io/ollama", "registry.internal:5000"),
        overflow_hosts=("api.openai.com", "*.corp.example"),
        secret_label=LabelRule("localmodel.dev/overflow-key", "true"),
        allow_control_plane=True,
        control_plane_taints=("example.com/infra",),
        exclusive_namespaces=("platform",),
    )


def test_a_new_policy_rolls_the_operator(tools: Tools) -> None:
    def checksum(*values: str) -> str:
        [deployment] = of_kind(render_chart(tools, set_values=values), "Deployment")
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        return str(annotations["localmodel.dev/policy-checksum"])

    assert checksum() == checksum("replicas=1")
    assert checksum() != checksum("policy.allowControlPlane=true")


def test_the_chart_flags_parse_with_the_policy_file(tools: Tools, tmp_path: Path) -> None:
    rendered = render_chart(tools, set_values=("policy.exclusiveNamespaces={platform}",))
    expected = policy_of(rendered, tmp_path)
    [deployment] = of_kind(rendered, "Deployment")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    flags = [f"--policy={tmp_path / 'policy.yaml'}" if f == POLICY_FLAG else f
             for f in container["args"][1:]]
    config = parse_config(flags, {})
    assert config.tenants == expected and config.tenants.exclusive_namespaces == ("platform",)


@pytest.mark.parametrize(("value", "message"), [
    ("policy.imageRegistries={https://ghcr.io}", "/policy/imageRegistries/0"),
    ("policy.overflowHosts={api.openai.com/v1}", "/policy/overflowHosts/0"),
    ("policy.allowControlPlane=maybe", "/policy/allowControlPlane"),
    ("policy.exclusiveNamespaces={Team_A}", "/policy/exclusiveNamespaces/0"),
    ("policy.allowHtp=true", "allowHtp"),
])
def test_a_bad_policy_value_fails_with_its_path(tools: Tools, value: str, message: str) -> None:
    with pytest.raises(RuntimeError) as failed:
        render_chart(tools, set_values=(value,))
    assert message in str(failed.value)


# ---- RBAC ------------------------------------------------------------------------


def test_without_namespaces_one_cluster_role_and_no_secrets(tools: Tools) -> None:
    rendered = render_chart(tools)
    assert model_roles(rendered) == []
    granted = rules(operator_role(rendered))
    assert ("", "pods", "create") in granted
    assert not any(r == "secrets" for _, r, _ in granted)


def test_with_namespaces_each_is_bound_and_the_cluster_role_only_reads_cluster_objects(
    tools: Tools,
) -> None:
    everywhere = rules(operator_role(render_chart(tools, release="lm", namespace="models")))
    rendered = render_chart(tools, release="lm", namespace="models",
                            set_values=("namespaces={ai,batch}",))
    cluster = rules(operator_role(rendered))
    # Nodes, PersistentVolumes and StorageClasses (whether a claim can bind:
    # localmodel/gaps.py) are cluster-scoped: read cluster-wide, never written.
    assert cluster == {(g, r, v) for g, r in (("", "nodes"), ("", "persistentvolumes"),
                                              ("storage.k8s.io", "storageclasses"))
                       for v in ("list", "watch")}
    roles = model_roles(rendered)
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["ai", "batch"]
    for role in roles:  # what moved out of the ClusterRole, no more
        assert rules(role) == everywhere - cluster
    bindings = [b for b in of_kind(rendered, "RoleBinding")
                if not b["metadata"]["name"].endswith("-leader")]
    [account] = of_kind(operator_objects(rendered), "ServiceAccount")
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["ai", "batch"]
    for b in bindings:
        assert b["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                "name": next(r["metadata"]["name"] for r in roles)}
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                  "namespace": "models"}]


@pytest.mark.parametrize("namespaces", [(), ("ai", "batch")])
@pytest.mark.parametrize("setting", ["secretLabel", "overflowKeySecretLabel"])
def test_the_secret_label_policy_adds_get_secrets_and_nothing_more(
    tools: Tools, namespaces: tuple[str, ...], setting: str
) -> None:
    extra = (f"namespaces={{{','.join(namespaces)}}}",) if namespaces else ()
    before = render_chart(tools, set_values=extra)
    after = render_chart(tools, set_values=(
        *extra, f"policy.{setting}=localmodel.dev/overflow-key"))
    holders: list[tuple[Manifest, Manifest]] = (
        list(zip(model_roles(before), model_roles(after), strict=True)) if namespaces
        else [(operator_role(before), operator_role(after))])
    for old, new in holders:
        assert rules(new) - rules(old) == {("", "secrets", "get")}
    if namespaces:
        assert not any(r == "secrets" for _, r, _ in rules(operator_role(after)))


def test_helm_lint_strict_with_namespaces_and_a_policy(tools: Tools) -> None:
    result = helm(tools, "lint", "--strict", str(CHART_DIR), "--set", "namespaces={ai,batch}",
                  "--set", "policy.secretLabel=localmodel.dev/overflow-key=true",
                  "--set", "policy.imageRegistries={ghcr.io}")
    assert result.returncode == 0, result.stdout + result.stderr
