"""The generated parts of docs/install.md and docs/metrics.md.

The chart's values table comes from charts/localmodel-operator/values.schema.json
(descriptions, types, ranges) and values.yaml (defaults); the metrics tables
from the operator's and the gateway's metric objects (their names, kinds,
labels and help); the alerts table from the PrometheusRule the chart renders.
Each lands between `<!-- generated:NAME -->` and `<!-- end:NAME -->` in its
page; tests/chart/test_reference_docs.py fails when a page drifted.

    python -m tests.harness.reference          # rewrite the pages' generated parts
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

from localmodel.metrics import Metric
from tests.harness.chart import ALL_OPTIONAL, CHART_DIR, render_chart
from tests.harness.promql import alert_rules, gateway_metrics, operator_metrics
from tests.harness.tools import REPO_ROOT, Tools, locate_tools

INSTALL_DOC = REPO_ROOT / "docs" / "install.md"
METRICS_DOC = REPO_ROOT / "docs" / "metrics.md"


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _type(node: dict[str, Any]) -> str:
    if "type" not in node and "anyOf" in node:
        kinds = {str(n.get("type")) for n in node["anyOf"]}
        if kinds == {"number", "string"}:
            return "number"  # a number, or a decimal string (what `helm --set` passes)
        return " or ".join(_type(n) for n in node["anyOf"])
    kind = str(node.get("type", "any"))
    if kind == "array":
        return f"list of {_type(node.get('items') or {})}"
    if kind == "object" and "properties" not in node:
        values = node.get("additionalProperties")
        return f"map of {_type(values)}" if isinstance(values, dict) else "object"
    return kind


def _limits(node: dict[str, Any]) -> str:
    out = []
    for part in [node, *node.get("anyOf", [])]:
        if "enum" in part:
            out.append("one of " + ", ".join(f"`{v}`" for v in part["enum"]))
        if "minimum" in part:
            out.append(f"≥ {part['minimum']}")
        if "exclusiveMinimum" in part:
            out.append(f"> {part['exclusiveMinimum']}")
        if "maximum" in part:
            out.append(f"≤ {part['maximum']}")
        if part.get("pattern") == r"^([0-9]+(ms|s|m|h|d|w|y))+$":
            out.append("a Prometheus duration")
    return "; ".join(dict.fromkeys(out))


def values_table(schema: dict[str, Any], values: dict[str, Any]) -> str:
    rows = ["| value | type | default | what |", "|---|---|---|---|"]

    def walk(node: dict[str, Any], default: Any, path: str) -> None:
        for name, sub in (node.get("properties") or {}).items():
            here = f"{path}.{name}" if path else name
            value = default.get(name) if isinstance(default, dict) else None
            if sub.get("type") == "object" and "properties" in sub and not (
                    set(sub["properties"]) <= {"cpu", "memory", "ephemeral-storage",
                                               "requests", "limits"}):
                walk(sub, value, here)
                continue
            shown = json.dumps(value, separators=(", ", ": ")) if value not in ("", None) else ""
            limits = _limits(sub)
            what = _cell(sub.get("description", "")) + (f" ({limits})" if limits else "")
            rows.append(f"| `{here}` | {_type(sub)} | {f'`{shown}`' if shown else '-'} | {what} |")

    walk(schema, values, "")
    return "\n".join(rows)


def metrics_table(metrics: list[Metric] | tuple[Metric, ...]) -> str:
    rows = ["| metric | type | labels | what |", "|---|---|---|---|"]
    for m in sorted(metrics, key=lambda m: m.name):
        labels = ", ".join(f"`{label}`" for label in m.labels)
        rows.append(f"| `{m.name}` | {m.kind} | {labels} | {_cell(m.help)} |")
    return "\n".join(rows)


def alerts_table(rules: list[dict[str, Any]]) -> str:
    rows = ["| # | alert | severity | fires when (for) | expression | what to do |",
            "|---|---|---|---|---|---|"]
    for n, r in enumerate(rules, 1):
        rows.append(f"| {n} | `{r['alert']}` | {r['labels']['severity']} | "
                    f"{_cell(r['annotations']['summary'])} ({r.get('for', '-')}) | "
                    f"`{_cell(r['expr'])}` | {_cell(r['annotations']['description'])} |")
    return "\n".join(rows)


def sections(tools: Tools) -> dict[Path, dict[str, str]]:
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    rules = alert_rules(render_chart(tools, set_values=ALL_OPTIONAL))
    return {
        INSTALL_DOC: {"values": values_table(schema, values)},
        METRICS_DOC: {
            "operator-metrics": metrics_table(operator_metrics()),
            "gateway-metrics": metrics_table(gateway_metrics()),
            "alerts": alerts_table(rules),
        },
    }


def _block(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- generated:{name} -->\n)(.*?)(<!-- end:{name} -->)", re.S)


def apply(text: str, parts: dict[str, str]) -> str:
    """`text` with each generated part replaced; raises if a marker is missing."""
    for name, body in parts.items():
        pattern = _block(name)
        if not pattern.search(text):
            raise ValueError(f"no <!-- generated:{name} --> ... <!-- end:{name} --> block")
        text = pattern.sub(lambda m, b=body: m.group(1) + b + "\n" + m.group(3), text)
    return text


def main() -> int:
    for page, parts in sections(locate_tools(("helm",))).items():
        page.write_text(apply(page.read_text(), parts))
        print(f"wrote {page.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
