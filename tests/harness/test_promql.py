"""The PromQL helpers of tests/harness/promql.py."""

from __future__ import annotations

import pytest

from tests.harness.promql import dashboard_queries, metric_names, scraped_names

EXPRESSIONS = [
    ("up", {"up"}),
    ('rate(a_total{job="x", code=~"5.."}[5m])', {"a_total"}),
    ("histogram_quantile(0.9, sum by (model, le) (rate(b_bucket[5m])))", {"b_bucket"}),
    ("(sum(c) or vector(0)) < 1", {"c"}),
    ('max(d{condition="Ready"} and on (instance) e == 1) > 0', {"d", "e"}),
    ("f / ignoring(x) group_left(y) g offset 5m", {"f", "g"}),
    ('sum without (pod) (h{name="and"})', {"h"}),
    ("2 * 3", set()),
]


@pytest.mark.parametrize(("expr", "names"), EXPRESSIONS, ids=[e for e, _ in EXPRESSIONS])
def test_metric_names_of_an_expression(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_dashboard_queries_substitute_grafana_variables_and_read_label_values() -> None:
    board = {
        "panels": [{"title": "row", "type": "row", "panels": [
            {"title": "q", "targets": [{"refId": "A", "expr":
                'rate(x_total{model=~"$model"}[$__rate_interval])'}]}]}],
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus"},
            {"name": "model", "type": "query",
             "query": {"query": 'label_values(y{namespace=~"$namespace"}, model)'}},
        ]},
    }
    assert dashboard_queries(board) == [
        ("panel 'q' A", 'rate(x_total{model=~".*"}[5m])'),
        ("variable model", 'y{namespace=~".*"}'),
    ]


def test_scraped_names_include_declared_families_and_samples() -> None:
    text = ("# HELP h_seconds t\n# TYPE h_seconds histogram\n"
            "# TYPE c_total counter\nc_total{a=\"1\"} 3\ng 1\n")
    assert scraped_names(text) == {"h_seconds_bucket", "h_seconds_sum", "h_seconds_count",
                                   "c_total", "g"}
