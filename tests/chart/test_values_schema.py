"""The chart's values.schema.json, checked with the real, pinned helm: it covers
every value of values.yaml with a type, a typo or a wrong type fails with the
value's path, and every optional piece renders and lints."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.harness import Tools
from tests.harness.chart import (
    ALL_OPTIONAL,
    CHART_DIR,
    helm,
    of_kind,
    optional_config_maps,
    render_chart,
)

SCHEMA = json.loads((CHART_DIR / "values.schema.json").read_text())
VALUES = yaml.safe_load((CHART_DIR / "values.yaml").read_text())


def leaves(value: object, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], object]]:
    """Every value of values.yaml by its path; a map or list is a leaf when empty
    or free-form (then the schema's node stands for it)."""
    if isinstance(value, dict) and value:
        for k, v in value.items():
            yield from leaves(v, (*path, k))
    else:
        yield path, value


def schema_node(path: tuple[str, ...]) -> dict[str, Any] | None:
    node: dict[str, Any] = SCHEMA
    for part in path:
        props = node.get("properties")
        if props is None:  # a free-form map (labels, nodeSelector, affinity)
            return node
        if part not in props:
            return None
        node = props[part]
    return node


def test_every_value_has_a_schema_with_a_type_and_a_description() -> None:
    missing = []
    for path, _ in leaves(VALUES):
        node = schema_node(path)
        if node is None or ("type" not in node and "anyOf" not in node):
            missing.append(".".join(path))
        elif not node.get("description"):
            missing.append(".".join(path) + " (no description)")
    assert not missing, missing


def test_every_schema_property_has_a_default_in_values_yaml() -> None:
    """The other way round: nothing in the schema that values.yaml does not set
    (docs/install.md lists each with its default)."""

    def walk(node: dict[str, Any], path: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
        for name, sub in (node.get("properties") or {}).items():
            yield (*path, name)
            if sub.get("type") == "object":
                yield from walk(sub, (*path, name))

    def has(path: tuple[str, ...]) -> bool:
        value: Any = VALUES
        for part in path:
            if not isinstance(value, dict) or part not in value:
                return False
            value = value[part]
        return True

    resource_keys = {"cpu", "memory", "ephemeral-storage"}  # optional inside requests/limits
    unset = [".".join(p) for p in walk(SCHEMA, ()) if not has(p) and p[-1] not in resource_keys]
    assert not unset, unset


def test_every_object_in_the_schema_refuses_unknown_keys() -> None:
    """additionalProperties: false on every object with named properties, so a
    typo anywhere fails instead of being ignored. But `global`: Helm hands a
    parent chart's globals (any keys) to every subchart, so it must take keys
    this chart does not know."""

    def open_objects(node: dict[str, Any], path: str) -> Iterator[str]:
        if (node.get("properties") is not None and node.get("additionalProperties") is not False
                and path != "global"):
            yield path or "(root)"
        for name, sub in (node.get("properties") or {}).items():
            yield from open_objects(sub, f"{path}.{name}".lstrip("."))
        if isinstance(node.get("items"), dict):
            yield from open_objects(node["items"], path + "[]")

    assert list(open_objects(SCHEMA, "")) == []
    assert SCHEMA["properties"]["global"].get("additionalProperties") is not False


def test_chart_with_every_optional_piece_passes_helm_lint_strict(tools: Tools) -> None:
    args = [a for v in ALL_OPTIONAL for a in ("--set", v)]
    result = helm(tools, "lint", "--strict", str(CHART_DIR), *args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout


def test_optional_pieces_are_off_by_default_and_each_renders_when_on(tools: Tools) -> None:
    off = render_chart(tools)
    assert not [m for m in off if m["apiVersion"].startswith("monitoring.coreos.com/")]
    assert of_kind(off, "Service") == [] and optional_config_maps(off) == []
    on = render_chart(tools, set_values=ALL_OPTIONAL)
    kinds = {m["kind"] for m in on if m["apiVersion"] == "monitoring.coreos.com/v1"}
    assert kinds == {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
    assert len(optional_config_maps(on)) == 1 and len(of_kind(on, "Service")) == 1


# --set VALUE, then a piece of helm's message naming the value's path.
BAD_VALUES = [
    ("replicas=two", "at '/replicas': got string, want integer"),
    ("replicas=-1", "at '/replicas'"),
    ("image.pullPolicy=Sometimes", "at '/image/pullPolicy'"),
    ("imag.tag=1.0", "additional properties 'imag' not allowed"),
    ("image.tga=1.0", "at '/image': additional properties 'tga' not allowed"),
    ("logFormat=xml", "at '/logFormat'"),
    ("leaderElection.leaseSeconds=0", "at '/leaderElection/leaseSeconds'"),
    ("namespaces={Bad_NS}", "at '/namespaces/0'"),
    ("probe.intervalSeconds=1", "at '/probe/intervalSeconds'"),
    ("probe.tolerations[0].operater=Exists", "at '/probe/tolerations/0'"),
    ("resources.limits.memory=lots", "at '/resources/limits/memory'"),
    ("serviceMonitor.enabled=yes please", "at '/serviceMonitor/enabled'"),
    ("serviceMonitor.interval=30", "at '/serviceMonitor/interval'"),
    ("podMonitor.scrapeTimeout=ten", "at '/podMonitor/scrapeTimeout'"),
    ("dashboard.labels.grafana_dashboard=1", "at '/dashboard/labels/grafana_dashboard'"),
    ("prometheusRule.foregroundQueueSeconds=0", "at '/prometheusRule/foregroundQueueSeconds'"),
    ("prometheusRule.notReadyFor=15 minutes", "at '/prometheusRule/notReadyFor'"),
    ("prometheusRule.slowReplicaRatio=2", "at '/prometheusRule/slowReplicaRatio'"),
]


@pytest.mark.parametrize(("value", "message"), BAD_VALUES, ids=[v for v, _ in BAD_VALUES])
def test_a_typo_or_wrong_type_fails_with_the_values_path(
    tools: Tools, value: str, message: str
) -> None:
    with pytest.raises(RuntimeError) as failed:
        render_chart(tools, set_values=(value,))
    assert "values don't meet the specifications of the schema" in str(failed.value)
    assert message in str(failed.value)


def test_the_defaults_and_good_values_pass(tools: Tools) -> None:
    render_chart(tools, set_values=(
        "replicas=1", "leaderElection.leaseSeconds=7.5", "namespaces={ai,batch}",
        "resources.limits.cpu=500m", "resources.requests.memory=1Gi",
        "serviceMonitor.enabled=true", "serviceMonitor.interval=1m30s",
        "prometheusRule.enabled=true", "prometheusRule.foregroundQueueSeconds=2.5",
        "dashboard.enabled=true", "dashboard.namespace=monitoring",
    ))
