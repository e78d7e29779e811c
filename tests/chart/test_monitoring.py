"""The chart's dashboard and alerts, checked with real tools: every query and
alert expression parsed by Prometheus's own promtool, the alerts' unit tests
run by `promtool test rules`, the dashboard validated by Grafana's dashboard
schema types (hack/dashboard-check, grafana-foundation-sdk), and every metric
they name declared by the operator's or the gateway's code (the real scrape is
tests/realnode/test_metrics_scrape.py's)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.harness import Tools
from tests.harness.chart import (
    ALL_OPTIONAL,
    DASHBOARD_FILE,
    optional_config_maps,
    render_chart,
)
from tests.harness.fixtures import tools_or_fail
from tests.harness.promql import (
    alert_rules,
    dashboard_queries,
    declared_names,
    metric_names,
    rules_file,
)

ALERT_TESTS = Path(__file__).with_name("alerts.test.yaml")
DASHBOARD = json.loads(DASHBOARD_FILE.read_text())


@pytest.fixture(scope="module")
def tools() -> Tools:
    return tools_or_fail(("helm", "promtool", "dashboard-check"))


@pytest.fixture(scope="module")
def rendered(tools: Tools) -> list[dict[str, Any]]:
    return render_chart(tools, set_values=ALL_OPTIONAL)


def run(tool: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(tool), *args], capture_output=True, text=True, timeout=120,
                          check=False, cwd=cwd)


def check_expressions(tools: Tools, tmp_path: Path, exprs: list[tuple[str, str]]) -> str:
    """promtool's parser on each expression (as recording rules: `promtool check
    rules` parses every one); returns its output, raises naming what failed."""
    rules = {"groups": [{"name": "queries", "rules": [
        {"record": f"query:{i}", "expr": expr} for i, (_, expr) in enumerate(exprs)]}]}
    path = tmp_path / "queries.yaml"
    path.write_text(yaml.safe_dump(rules))
    result = run(tools["promtool"], "check", "rules", "--lint=none", str(path))
    if result.returncode != 0:
        raise AssertionError(f"promtool: {result.stdout}{result.stderr}\n"
                             + "\n".join(f"query:{i} = {w}" for i, (w, _) in enumerate(exprs)))
    return result.stdout


def test_promtool_parses_every_dashboard_query(tools: Tools, tmp_path: Path) -> None:
    queries = dashboard_queries(DASHBOARD)
    assert len(queries) >= 15
    out = check_expressions(tools, tmp_path, queries)
    assert f"SUCCESS: {len(queries)} rules found" in out


def test_promtool_refuses_a_broken_query(tools: Tools, tmp_path: Path) -> None:
    """The check above would catch a broken panel."""
    with pytest.raises(AssertionError, match="query:1"):
        check_expressions(tools, tmp_path, [("good", "up"), ("bad", "sum by (le (x)")])


def test_promtool_checks_the_rendered_alert_rules(
    tools: Tools, rendered: list[dict[str, Any]], tmp_path: Path
) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(rules_file(rendered)))
    result = run(tools["promtool"], "check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alert_rules(rendered))} rules found" in result.stdout


def test_promtool_unit_tests_of_the_alerts_pass(
    tools: Tools, rendered: list[dict[str, Any]], tmp_path: Path
) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules_file(rendered)))
    shutil.copy(ALERT_TESTS, tmp_path / ALERT_TESTS.name)
    result = run(tools["promtool"], "test", "rules", ALERT_TESTS.name, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr
    # Every alert has a test that expects it to fire.
    tests = yaml.safe_load(ALERT_TESTS.read_text())["tests"]
    fired = {t["alertname"] for case in tests for t in case["alert_rule_test"] if t["exp_alerts"]}
    assert fired == {r["alert"] for r in alert_rules(rendered)}


def test_the_alert_unit_tests_fail_when_a_threshold_changes(tools: Tools, tmp_path: Path) -> None:
    """The unit tests bite: the same tests against rules rendered with another
    threshold fail."""
    other = render_chart(tools, set_values=("prometheusRule.enabled=true",
                                            "prometheusRule.notReadyFor=30m"))
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules_file(other)))
    shutil.copy(ALERT_TESTS, tmp_path / ALERT_TESTS.name)
    result = run(tools["promtool"], "test", "rules", ALERT_TESTS.name, cwd=tmp_path)
    assert result.returncode != 0
    assert "LocalModelNotReady" in result.stdout + result.stderr


def test_alerts_come_in_the_fields_debugging_order(rendered: list[dict[str, Any]]) -> None:
    assert [r["alert"] for r in alert_rules(rendered)] == [
        "LocalModelOperatorNoLeader",
        "LocalModelOperatorPassesFailing",
        "LocalModelNotReady",
        "LocalModelForegroundQueueing",
        "LocalModelReplicaSlow",
        "LocalModelOverflowFailing",
    ]
    for rule in alert_rules(rendered):
        assert rule["labels"]["severity"] in ("critical", "warning")
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]


def test_every_metric_the_dashboard_and_alerts_name_is_declared_by_the_code(
    rendered: list[dict[str, Any]],
) -> None:
    used = {n for _, q in dashboard_queries(DASHBOARD) for n in metric_names(q)}
    used |= {n for r in alert_rules(rendered) for n in metric_names(r["expr"])}
    assert used, "no metric names found"
    assert used - declared_names() == set()


def test_the_dashboard_shows_what_the_issue_asks_for() -> None:
    used = {n for _, q in dashboard_queries(DASHBOARD) for n in metric_names(q)}
    for family in ("queued", "slots_busy", "queue_wait_seconds_bucket",
                   "time_to_first_token_seconds_bucket", "prompt_tokens_total",
                   "prefill_seconds_total", "generated_tokens_total", "decode_seconds_total",
                   "cancellations_total", "overflow_requests_total", "options_rewritten_total"):
        assert f"localmodel_gateway_{family}" in used, family
    for family in ("pass_duration_seconds_bucket", "api_writes_total"):
        assert f"localmodel_operator_{family}" in used, family
    gateway_queries = [q for w, q in dashboard_queries(DASHBOARD)
                       if "localmodel_gateway_" in q and w.startswith("panel")]
    # Per model and replica: every gateway panel keeps the model label.
    assert all("model" in q for q in gateway_queries)


def test_grafana_schema_validates_the_dashboard(tools: Tools, tmp_path: Path) -> None:
    result = run(tools["dashboard-check"], str(DASHBOARD_FILE))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == f"{DASHBOARD_FILE}: ok"
    # It refuses what Grafana's schema does not know.
    broken = json.loads(DASHBOARD_FILE.read_text())
    broken["panels"][1]["options"]["legend"]["placment"] = "bottom"
    broken["panels"][2]["targets"][0]["exp"] = broken["panels"][2]["targets"][0].pop("expr")
    broken["refresh"] = 30
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(broken))
    result = run(tools["dashboard-check"], str(path))
    assert result.returncode == 1
    for problem in ("panels[1].options.legend", "'placment'", "panels[2].targets[0]", "'exp'",
                    "refresh"):
        assert problem in result.stdout, result.stdout


def test_the_dashboard_configmap_carries_the_file_and_the_sidecar_label(tools: Tools) -> None:
    rendered = render_chart(tools, namespace="models", set_values=(
        "dashboard.enabled=true", "dashboard.namespace=monitoring",
        "dashboard.annotations.grafana_folder=LLMs"))
    [cm] = optional_config_maps(rendered)
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "LLMs"}
    assert json.loads(cm["data"]["localmodel.json"]) == DASHBOARD
