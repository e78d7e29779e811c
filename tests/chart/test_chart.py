"""The operator's Helm chart, checked with the real, pinned helm."""

from __future__ import annotations

from tests.harness import Tools
from tests.harness.chart import (
    CHART_DIR,
    helm,
    of_kind,
    operator_objects,
    probe_objects,
    render_chart,
    user_roles,
)


def test_chart_passes_helm_lint_strict(tools: Tools) -> None:
    result = helm(tools, "lint", "--strict", str(CHART_DIR))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout


def test_cluster_role_never_grants_secrets_or_wildcards(tools: Tools) -> None:
    roles = of_kind(render_chart(tools), "ClusterRole")
    assert len(roles) == 4  # the operator's, the node probe's, and edit and view for users
    for rule in (rule for role in roles for rule in role["rules"]):
        assert "secrets" not in rule["resources"]
        assert "*" not in rule["resources"] + rule["verbs"] + rule["apiGroups"]


def test_binding_subject_is_the_charts_service_account(tools: Tools) -> None:
    rendered = operator_objects(render_chart(tools, release="lm", namespace="models"))
    [account] = of_kind(rendered, "ServiceAccount")
    [binding] = of_kind(rendered, "ClusterRoleBinding")
    [role] = of_kind(rendered, "ClusterRole")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount",
                                    "name": account["metadata"]["name"],
                                    "namespace": "models"}]


def test_deployment_runs_the_operator_with_the_image_from_values(tools: Tools) -> None:
    rendered = render_chart(tools, set_values=("image.repository=registry.local/lm",
                                               "image.tag=1.2.3"))
    [deployment] = of_kind(rendered, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["image"] == "registry.local/lm:1.2.3"
    assert container["command"] == ["localmodel"]
    assert container["args"][0] == "run"
    [account] = of_kind(operator_objects(rendered), "ServiceAccount")
    assert pod["serviceAccountName"] == account["metadata"]["name"]


def test_probe_daemonset_runs_unprivileged_with_read_only_mounts_of_what_it_reads(
    tools: Tools,
) -> None:
    rendered = probe_objects(render_chart(tools, release="lm", namespace="models",
                                          set_values=("probe.intervalSeconds=60",)))
    [daemonset] = of_kind(rendered, "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["command"] == ["localmodel"]
    assert container["args"] == ["probe", "--node", "$(NODE_NAME)", "--root", "/host",
                                 "--interval", "60"]
    [env] = container["env"]
    assert env == {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
    security = container["securityContext"]
    assert security["privileged"] is False and security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert "hostNetwork" not in pod and "hostPID" not in pod
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert all(m["readOnly"] is True for m in mounts.values())
    host_paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    assert sorted(host_paths.values()) == ["/proc/cpuinfo", "/proc/meminfo",
                                           "/sys/devices/system/cpu", "/sys/devices/system/node"]
    for name, path in host_paths.items():  # each host file lands under --root at its own path
        assert mounts[name]["mountPath"] == "/host" + path
    assert pod["tolerations"] == [{"operator": "Exists"}]


def test_probe_identity_may_get_and_patch_nodes_and_nothing_else(tools: Tools) -> None:
    rendered = probe_objects(render_chart(tools, release="lm", namespace="models"))
    [account] = of_kind(rendered, "ServiceAccount")
    [role] = of_kind(rendered, "ClusterRole")
    [binding] = of_kind(rendered, "ClusterRoleBinding")
    [daemonset] = of_kind(rendered, "DaemonSet")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                    "namespace": "models"}]
    assert daemonset["spec"]["template"]["spec"]["serviceAccountName"] == (
        account["metadata"]["name"]
    )


def test_probe_is_optional(tools: Tools) -> None:
    assert probe_objects(render_chart(tools)) != []
    off = render_chart(tools, set_values=("probe.enabled=false",))
    assert probe_objects(off) == []
    assert of_kind(off, "DaemonSet") == []


def test_deployment_command_exists_and_accepts_the_charts_flags(tools: Tools) -> None:
    """The chart runs `localmodel run` with flags: the real CLI must know the command
    and parse every flag the chart passes (a missing command or flag fails here)."""
    from localmodel.cli import COMMANDS
    from localmodel.controller.config import parse_config

    rendered = render_chart(tools, set_values=("namespaces={ai,batch}", "logFormat=json"))
    [deployment] = of_kind(rendered, "Deployment")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["localmodel"]
    command, *flags = container["args"]
    assert command in COMMANDS
    # (the policy file is the ConfigMap's: tests/chart/test_policy_chart.py reads it)
    flags = [f for f in flags if not f.startswith("--policy=")]
    config = parse_config(flags, {"POD_NAMESPACE": "localmodel-system"})
    assert config.namespaces == ("ai", "batch")
    assert config.log_format == "json"
    assert config.health_listen == ("0.0.0.0", 8081)
    probes = {container["livenessProbe"]["httpGet"]["path"],
              container["readinessProbe"]["httpGet"]["path"]}
    assert probes == {"/healthz", "/readyz"}
    assert deployment["spec"]["replicas"] == 2


def test_downloads_allow_http_reaches_the_operator_off_by_default(tools: Tools) -> None:
    """`downloads.allowHttp` becomes --allow-http-downloads, which the real
    operator parses; off unless the admin sets it."""
    from localmodel.controller.config import parse_config

    for values, allowed in (((), False), (("downloads.allowHttp=true",), True)):
        [deployment] = of_kind(render_chart(tools, set_values=values), "Deployment")
        [container] = deployment["spec"]["template"]["spec"]["containers"]
        _, *flags = container["args"]
        # (the policy file is the ConfigMap's: tests/chart/test_policy_chart.py reads it)
        flags = [f for f in flags if not f.startswith("--policy=")]
        config = parse_config(flags, {"POD_NAMESPACE": "localmodel-system"})
        assert config.allow_http_downloads is allowed, flags


def test_leader_election_lease_is_granted_only_in_the_release_namespace(tools: Tools) -> None:
    rendered = render_chart(tools, release="lm", namespace="models")
    roles = of_kind(rendered, "Role")
    assert [r["metadata"]["namespace"] for r in roles] == ["models"]
    [rule] = roles[0]["rules"]
    assert rule["resources"] == ["leases"] and "delete" not in rule["verbs"]
    for role in of_kind(rendered, "ClusterRole"):
        assert all("leases" not in r["resources"] for r in role["rules"])


def test_users_with_edit_may_scale_localmodels_and_view_may_only_read(tools: Tools) -> None:
    """The roles aggregated into the cluster's admin, edit and view; their effect
    on a real cluster is tests/e2e/test_autoscaling.py's."""
    roles = {r["metadata"]["labels"].get("rbac.authorization.k8s.io/aggregate-to-view", "edit"):
             r for r in user_roles(render_chart(tools))}
    edit, view = roles["edit"], roles["true"]
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-admin"] == "true"
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"

    def grants(role: dict[str, object], resource: str) -> set[str]:
        rules = role["rules"]
        assert isinstance(rules, list)
        return {v for rule in rules if resource in rule["resources"] for v in rule["verbs"]}

    assert {"create", "patch", "delete"} <= grants(edit, "localmodels")
    assert {"get", "patch", "update"} <= grants(edit, "localmodels/scale")
    assert grants(edit, "localmodels/status") == {"get", "list", "watch"}  # the operator's
    for resource in ("localmodels", "localmodels/status", "localmodels/scale"):
        assert grants(view, resource) == {"get", "list", "watch"}
    off = render_chart(tools, set_values=("rbac.aggregateToDefaultRoles=false",))
    assert user_roles(off) == []
