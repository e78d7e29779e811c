"""docs/install.md's values table and docs/metrics.md's metrics and alerts
tables are what tests/harness/reference.py generates from the chart's schema,
the code's metric objects and the rendered PrometheusRule."""

from __future__ import annotations

import pytest

from tests.harness import Tools
from tests.harness.reference import apply, sections


def test_generated_doc_parts_have_not_drifted(tools: Tools) -> None:
    for page, parts in sections(tools).items():
        text = page.read_text()
        assert apply(text, parts) == text, (
            f"{page.name} drifted from the code: run `python -m tests.harness.reference`")


def test_every_value_and_metric_is_in_the_pages(tools: Tools) -> None:
    from tests.harness.promql import gateway_metrics, operator_metrics
    from tests.harness.reference import INSTALL_DOC, METRICS_DOC

    install, metrics = INSTALL_DOC.read_text(), METRICS_DOC.read_text()
    for path in ("`image.tag`", "`serviceMonitor.interval`", "`prometheusRule.notReadyFor`",
                 "`probe.tolerations`", "`dashboard.labels`"):
        assert path in install, path
    for m in (*gateway_metrics(), *operator_metrics()):
        assert f"`{m.name}`" in metrics, m.name


def test_a_changed_description_is_drift() -> None:
    text = "a\n<!-- generated:x -->\nold\n<!-- end:x -->\nb\n"
    assert apply(text, {"x": "new"}) == "a\n<!-- generated:x -->\nnew\n<!-- end:x -->\nb\n"
    with pytest.raises(ValueError, match="generated:y"):
        apply(text, {"y": "new"})
