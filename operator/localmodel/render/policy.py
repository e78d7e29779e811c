"""The NetworkPolicy of one model (opt-in: spec.gateway.networkPolicy, else the
operator's default): the port its Service targets admits only the namespaces
(and pods) the spec names, the model's own namespace when it names none; the
gateway's admin port (metrics, speed, ledger) admits only the operator's
namespace and the others it was told; when the operator is told where the
router runs (--router-namespace), the router's pods there are admitted to both
(it relays requests to the inference port and reads /speed on the admin port:
docs/router.md); everything else is refused. Pure.

Peers are chosen by the `kubernetes.io/metadata.name` label, which the API
server sets on every namespace (and nobody can change), so a tenant cannot
label their way in. Ports are named (the pods' `http`, `admin`, `engine`), so
the policy follows the pods' ports."""

from __future__ import annotations

from localmodel.api import LocalModel
from localmodel.contract import (
    LABEL_NAME,
    PORT_ADMIN,
    PORT_ENGINE,
    PORT_HTTP,
    ROUTER_POD_LABELS,
)
from localmodel.podspec import Manifest
from localmodel.render.names import Meta
from localmodel.render.plan import RenderOptions

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # set by the API server on every namespace


def wants_network_policy(lm: LocalModel, options: RenderOptions) -> bool:
    asked = lm.spec.gateway.network_policy.enabled
    return options.network_policy if asked is None else asked


def _namespace(name: str, pods: dict[str, str] | None = None) -> Manifest:
    peer: Manifest = {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: name}}}
    if pods:
        peer["podSelector"] = {"matchLabels": dict(pods)}
    return peer


def render_network_policy(
    lm: LocalModel, options: RenderOptions, meta: Meta | None = None
) -> Manifest:
    gw, name = lm.spec.gateway, lm.metadata.name
    callers = gw.network_policy.namespaces or [lm.metadata.namespace]
    pods = dict(gw.network_policy.pod_labels)
    # The router routes only to a model's gateway (it reads /speed there).
    router = ([_namespace(options.router_namespace, ROUTER_POD_LABELS)]
              if gw.enabled and options.router_namespace else [])
    ingress: list[Manifest] = [
        {
            "from": [*(_namespace(ns, pods) for ns in callers), *router],
            "ports": [{"port": PORT_HTTP if gw.enabled else PORT_ENGINE, "protocol": "TCP"}],
        }
    ]
    if router and options.router_namespace in options.admin_namespaces:
        router = []  # its whole namespace is admitted already
    if gw.enabled and (options.admin_namespaces or router):
        ingress.append(
            {
                "from": [*(_namespace(ns) for ns in options.admin_namespaces), *router],
                "ports": [{"port": PORT_ADMIN, "protocol": "TCP"}],
            }
        )
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": (meta or Meta(lm))(name),
        "spec": {
            "podSelector": {"matchLabels": {LABEL_NAME: name}},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }
