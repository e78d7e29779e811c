"""What the chart's dashboard and alerts ask Prometheus, and what the code exports.

Pure helpers for tests/chart and tests/realnode: the PromQL of every dashboard
panel and template variable (Grafana's variables replaced by values Prometheus
parses), the alert rules of the rendered PrometheusRule, the metric names an
expression reads, the series names the operator's and the gateway's metrics
declare, and the names a scrape's text exposes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any

from localmodel.controller.operator_metrics import OperatorMetrics
from localmodel.gateway.metrics import GatewayMetrics
from localmodel.metrics import Metric

# Grafana's variables in the dashboard's queries, as promtool can parse them.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h",
                     "$namespace": ".*", "$model": ".*", "${datasource}": ""}
LABEL_VALUES = re.compile(r"^label_values\((?:(?P<selector>.+),\s*)?(?P<label>\w+)\)$")

# PromQL words that look like names but are not metrics.
_KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left",
             "group_right", "bool", "offset", "atan2", "inf", "nan", "start", "end"}
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_NAME = re.compile(r"(?<![\w:.])([a-zA-Z_:][\w:]*)(\s*\()?")


def substitute(text: str) -> str:
    for name, value in GRAFANA_VARIABLES.items():
        text = text.replace(name, value)
    return text


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects (not functions, labels, keywords)."""
    text = _STRING.sub('""', expr)
    text = _GROUPING.sub(" ", text)
    text = _MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    names = set()
    for m in _NAME.finditer(text):
        name, call = m.group(1), m.group(2)
        if call or name.lower() in _KEYWORDS or re.fullmatch(r"\d.*", name):
            continue
        names.add(name)
    return names


def dashboard_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and query variable, variables
    substituted; a `label_values(SELECTOR, LABEL)` variable gives its selector."""
    out: list[tuple[str, str]] = []

    def panels(items: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for p in items:
            yield p
            yield from panels(p.get("panels") or [])

    for panel in panels(dashboard.get("panels") or []):
        for target in panel.get("targets") or []:
            out.append((f"panel {panel['title']!r} {target['refId']}", substitute(target["expr"])))
    for var in (dashboard.get("templating") or {}).get("list") or []:
        if var.get("type") != "query":
            continue
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        m = LABEL_VALUES.match(query.strip())
        assert m, f"variable {var['name']}: not a label_values() query: {query!r}"
        if m.group("selector"):
            out.append((f"variable {var['name']}", substitute(m.group("selector"))))
    return out


def alert_rules(rendered: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rules of the rendered PrometheusRule, in order."""
    [rule] = [m for m in rendered if m["kind"] == "PrometheusRule"]
    return [r for group in rule["spec"]["groups"] for r in group["rules"]]


def rules_file(rendered: list[dict[str, Any]]) -> dict[str, Any]:
    """The PrometheusRule's spec as a Prometheus rules file (what promtool reads)."""
    [rule] = [m for m in rendered if m["kind"] == "PrometheusRule"]
    return {"groups": rule["spec"]["groups"]}


def series_names(metric: Metric) -> set[str]:
    if metric.kind == "histogram":
        return {metric.name + s for s in ("_bucket", "_sum", "_count")}
    return {metric.name}


def gateway_metrics() -> tuple[Metric, ...]:
    """Every metric a gateway exports (read from the class, not a running one)."""
    return GatewayMetrics(slots=_unused, in_flight=_unused).all()


def operator_metrics() -> list[Metric]:
    return OperatorMetrics().all()


def _unused() -> Any:
    raise AssertionError("not called: only the metrics' names and kinds are read")


def declared_names() -> set[str]:
    """Every series name the code declares (histograms as _bucket, _sum, _count)."""
    return {n for m in (*gateway_metrics(), *operator_metrics()) for n in series_names(m)}


def scraped_names(text: str) -> set[str]:
    """Every series name a scrape's text exposes: its samples' names and the
    families its # TYPE lines declare (a histogram as _bucket, _sum and _count)."""
    names: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(maxsplit=3)
            names |= ({name + s for s in ("_bucket", "_sum", "_count")}
                      if kind.strip() == "histogram" else {name})
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{\s]", line, maxsplit=1)[0])
    return names
