"""The chart's ServiceMonitor and PodMonitor point at what the operator and
its renderer really make: the PodMonitor selects the model pods
operator/localmodel/render/ renders (and no operator or probe pod), on the
gateway's port, and turns the contract's name and replica labels into `model`
and `replica`; the ServiceMonitor's Service selects the operator's pods (not
the probe's) on the port the operator serves /metrics on."""

from __future__ import annotations

import re
from typing import Any

from localmodel import contract
from localmodel.controller.config import parse_config
from localmodel.desired import desired_state
from localmodel.gateway_contract import ADMIN_PORT, METRICS_PATH
from tests.builders import MakeLocalModel, MakeNode
from tests.harness import Tools
from tests.harness.chart import ALL_OPTIONAL, of_kind, render_chart

Manifest = dict[str, Any]


def model_pods() -> list[Manifest]:
    lm = MakeLocalModel("chat").generation(1).replicas(2).cpu(2).obj()
    nodes = [MakeNode(f"n{i}").cpu_flags({"AVX2"}).facts() for i in (1, 2)]
    state = desired_state([lm], nodes, now="2026-12-01T00:00:00Z")
    pods = [o for o in state.models[0].objects if o["kind"] == "Pod"]
    assert len(pods) == 2
    return pods


def selects(selector: Manifest, labels: dict[str, str]) -> bool:
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        present = expr["key"] in labels
        if expr["operator"] == "Exists" and not present:
            return False
        if expr["operator"] == "DoesNotExist" and present:
            return False
        if expr["operator"] == "In" and labels.get(expr["key"]) not in expr["values"]:
            return False
    return True


def pod_labels(workload: Manifest) -> dict[str, str]:
    labels: dict[str, str] = workload["spec"]["template"]["metadata"]["labels"]
    return labels


def meta_label(key: str) -> str:
    """The Prometheus Operator's (Prometheus's) name for a pod label in relabeling."""
    return "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)


def test_podmonitor_selects_the_rendered_model_pods_on_the_gateway_admin_port(tools: Tools) -> None:
    rendered = render_chart(tools, set_values=ALL_OPTIONAL)
    [monitor] = of_kind(rendered, "PodMonitor")
    selector = monitor["spec"]["selector"]
    for pod in model_pods():
        assert selects(selector, pod["metadata"]["labels"]), pod["metadata"]["labels"]
        containers = pod["spec"]["containers"]
        [gateway] = [c for c in containers if c["name"] == contract.CONTAINER_GATEWAY]
        [endpoint] = monitor["spec"]["podMetricsEndpoints"]
        [port] = [p for p in gateway["ports"] if p["name"] == endpoint["port"]]
        assert port["containerPort"] == ADMIN_PORT and endpoint["path"] == METRICS_PATH
    # Neither the operator's nor the probe's pods.
    for workload in of_kind(rendered, "Deployment") + of_kind(rendered, "DaemonSet"):
        assert not selects(selector, pod_labels(workload))


def test_podmonitor_labels_series_with_the_model_and_replica(tools: Tools) -> None:
    [monitor] = of_kind(render_chart(tools, set_values=ALL_OPTIONAL), "PodMonitor")
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    relabel = {r["targetLabel"]: r["sourceLabels"] for r in endpoint["relabelings"]}
    assert relabel == {"model": [meta_label(contract.LABEL_NAME)],
                       "replica": [meta_label(contract.LABEL_REPLICA)]}
    for pod in model_pods():  # the labels are on every model pod
        assert {contract.LABEL_NAME, contract.LABEL_REPLICA} <= set(pod["metadata"]["labels"])


def test_podmonitor_namespaces_follow_the_watched_namespaces(tools: Tools) -> None:
    def namespaces(*values: str) -> Manifest:
        [m] = of_kind(render_chart(tools, set_values=("podMonitor.enabled=true", *values)),
                      "PodMonitor")
        selector: Manifest = m["spec"]["namespaceSelector"]
        return selector

    assert namespaces() == {"any": True}
    assert namespaces("namespaces={ai,batch}") == {"matchNames": ["ai", "batch"]}
    assert namespaces("namespaces={ai}", "podMonitor.namespaces={other}") == {
        "matchNames": ["other"]}


def test_servicemonitor_scrapes_the_operators_metrics_port_and_not_the_probe(
    tools: Tools,
) -> None:
    rendered = render_chart(tools, namespace="models", set_values=(
        "serviceMonitor.enabled=true", "serviceMonitor.labels.release=prom"))
    [service] = of_kind(rendered, "Service")
    [monitor] = of_kind(rendered, "ServiceMonitor")
    [deployment] = of_kind(rendered, "Deployment")
    [daemonset] = of_kind(rendered, "DaemonSet")
    assert selects(monitor["spec"]["selector"], service["metadata"]["labels"])
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["models"]}
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert selects({"matchLabels": service["spec"]["selector"]}, pod_labels(deployment))
    assert not selects({"matchLabels": service["spec"]["selector"]}, pod_labels(daemonset))
    [endpoint] = monitor["spec"]["endpoints"]
    [port] = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    [target] = [p for p in container["ports"] if p["name"] == port["targetPort"]]
    # The port the operator serves /metrics on, as the chart's flags configure it.
    flags = [f for f in container["args"][1:] if not f.startswith("--policy=")]  # (a file)
    config = parse_config(flags, {"POD_NAMESPACE": "models"})
    assert config.metrics_listen == ("0.0.0.0", target["containerPort"])
    assert endpoint["path"] == "/metrics"


def test_the_operators_selector_does_not_match_the_probes_pods(tools: Tools) -> None:
    """Chart 0.1.0's Deployment selector (name, instance) matched the probe's
    pods too; selectors are immutable, so the probe's pods changed instead."""
    rendered = render_chart(tools)
    [deployment] = of_kind(rendered, "Deployment")
    [daemonset] = of_kind(rendered, "DaemonSet")
    assert selects(deployment["spec"]["selector"], pod_labels(deployment))
    assert selects(daemonset["spec"]["selector"], pod_labels(daemonset))
    assert not selects(deployment["spec"]["selector"], pod_labels(daemonset))
    assert not selects(daemonset["spec"]["selector"], pod_labels(deployment))
