"""Every metric name the chart's dashboard and alerts use appears in a real
scrape on the real node: the operator's replicas' /metrics and the gateway of a
model pod that answered a request, both through the API server's pod proxy (as
Prometheus's pod-based discovery reaches them). A name the code stopped
exporting, or a typo in a panel or an alert, fails here."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest

from localmodel.controller.config import OperatorConfig
from localmodel.engines import llama_server
from localmodel.gateway_contract import ADMIN_PORT
from tests.harness.chart import ALL_OPTIONAL, DASHBOARD_FILE, NAMESPACE, render_chart
from tests.harness.promql import alert_rules, dashboard_queries, metric_names, scraped_names
from tests.realnode.journey import MODEL_NAMESPACE, Deployed, Journey, module_model

# `llama`: no Ollama (hack/test.sh runs it while Ollama builds: tests/harness/prereqs.py)
pytestmark = [pytest.mark.e2e, pytest.mark.realnode, pytest.mark.llama]

NAME = "gemma-chart"  # test_chart_upgrade.py's model too: the same retained weights
OPERATOR_METRICS_PORT = OperatorConfig.metrics_listen[1]


model = module_model(NAME, llama_server.NAME)


def used_names(journey: Journey) -> dict[str, set[str]]:
    """Metric name -> where the dashboard and alerts use it."""
    assert journey.cluster.tools is not None
    used: dict[str, set[str]] = {}
    board = json.loads(DASHBOARD_FILE.read_text())
    for where, query in dashboard_queries(board):
        for name in metric_names(query):
            used.setdefault(name, set()).add(f"dashboard {where}")
    for rule in alert_rules(render_chart(journey.cluster.tools, set_values=ALL_OPTIONAL)):
        for name in metric_names(rule["expr"]):
            used.setdefault(name, set()).add(f"alert {rule['alert']}")
    return used


def test_every_metric_of_the_dashboard_and_alerts_is_in_a_real_scrape(
    journey: Journey, model: Deployed
) -> None:
    with journey.port_forward(f"svc/{NAME}") as url:
        body = json.dumps({"model": "gemma3:270m", "max_tokens": 4,
                           "messages": [{"role": "user", "content": "Hi"}]}).encode()
        request = urllib.request.Request(f"{url}/v1/chat/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            assert response.status == 200
    pod = journey.pod_of(NAME)["metadata"]["name"]
    gateway = journey.scrape(MODEL_NAMESPACE, pod, ADMIN_PORT)
    operators = [journey.scrape(NAMESPACE, p["metadata"]["name"], OPERATOR_METRICS_PORT)
                 for p in journey.operator_pods()]
    assert len(operators) == 2
    scraped = scraped_names(gateway).union(*(scraped_names(text) for text in operators))
    # The scrape is real and current: the request just made was counted.
    assert any(line.startswith("localmodel_gateway_requests_total{") and
               'outcome="ok"' in line for line in gateway.splitlines()), gateway[:2000]
    assert any(line == "localmodel_operator_leader 1"
               for text in operators for line in text.splitlines())

    used = used_names(journey)
    assert len(used) >= 15
    missing = {name: sorted(where) for name, where in used.items() if name not in scraped}
    assert not missing, f"used but not in a real scrape: {missing}"
    print(f"{len(used)} metric names of the dashboard and alerts, all in the scrapes of "
          f"{pod} and the operator's {len(operators)} replicas ({time.strftime('%H:%M:%S')})")
