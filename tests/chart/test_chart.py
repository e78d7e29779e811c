"""The operator's Helm chart, checked with the real, pinned helm."""

from __future__ import annotations

import pytest

from tests.harness import Tools, ToolsMissingError, locate_tools
from tests.harness.chart import CHART_DIR, helm, of_kind, render_chart


@pytest.fixture(scope="module")
def tools() -> Tools:
    problem = ""
    try:
        return locate_tools(("helm",))
    except ToolsMissingError as exc:
        problem = str(exc)
    pytest.fail(problem, pytrace=False)


def test_chart_passes_helm_lint_strict(tools: Tools) -> None:
    result = helm(tools, "lint", "--strict", str(CHART_DIR))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout


def test_cluster_role_never_grants_secrets_or_wildcards(tools: Tools) -> None:
    [role] = of_kind(render_chart(tools), "ClusterRole")
    for rule in role["rules"]:
        assert "secrets" not in rule["resources"]
        assert "*" not in rule["resources"] + rule["verbs"] + rule["apiGroups"]


def test_binding_subject_is_the_charts_service_account(tools: Tools) -> None:
    rendered = render_chart(tools, release="lm", namespace="models")
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
    assert pod["serviceAccountName"] == of_kind(rendered, "ServiceAccount")[0]["metadata"]["name"]
