"""The LocalModel CustomResourceDefinition, generated from the API models.

pydantic's JSON Schema is close to, but not, a Kubernetes structural schema: it
uses `$ref`, `anyOf [X, null]` for optional fields, `title`, and
`additionalProperties: false`. `structural()` rewrites it; `build_crd()` adds
CEL rules (from the same rule objects Python validates with, for the shipped
engines: `spec_rules(SHIPPED)`), the status and
scale subresources and printer columns. `crds/` holds the output; a test fails if the
two drift.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml

from localmodel import GROUP, KIND, PLURAL, VERSION
from localmodel.api.checks import rules_cel
from localmodel.api.localmodel import OBJECT_NAME
from localmodel.api.rules import (
    GATEWAY_RULES,
    GGUF_RULES,
    IDLE_RULES,
    TOLERATION_RULES,
    WINDOW_RULES,
    spec_rules,
)
from localmodel.api.spec import LocalModelSpec
from localmodel.api.status import LocalModelStatus
from localmodel.engines import NAMES, SHIPPED

Schema = dict[str, Any]

# Nested objects that get `default: {}` so the API server fills their defaults
# in: `kubectl get lm -o yaml` then shows the settings in force.
_DEFAULTED_OBJECTS = {"engine", "placement", "storage", "gateway"}

_DROP_KEYS = {"title", "$defs"}


def _resolve(node: Any, defs: dict[str, Schema]) -> Any:
    if isinstance(node, list):
        return [_resolve(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = copy.deepcopy(defs[node["$ref"].split("/")[-1]])
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _resolve(merged, defs)
    return {k: _resolve(v, defs) for k, v in node.items() if k not in _DROP_KEYS}


def _simplify(node: Schema) -> Schema:
    """Turn one resolved pydantic schema node into a structural one."""
    node = dict(node)
    if "anyOf" in node:
        options = [o for o in node.pop("anyOf") if o.get("type") != "null"]
        types = {o.get("type") for o in options}
        if len(options) == 1:
            node = {**options[0], **node}
        elif types == {"integer", "string"}:
            # int | Literal["node"]: Kubernetes' int-or-string, checked by CEL.
            node["x-kubernetes-int-or-string"] = True
        else:  # pragma: no cover - a model change this generator does not know yet
            raise ValueError(f"cannot express anyOf {options} structurally")
    if node.get("default", 0) is None:
        del node["default"]
    if "const" in node:
        node["enum"] = [node.pop("const")]
    if node.get("type") == "object":
        props = node.get("properties")
        if props is not None:
            node.pop("additionalProperties", None)
            node["properties"] = {k: _simplify(v) for k, v in props.items()}
            for name in _DEFAULTED_OBJECTS & props.keys():
                node["properties"][name].setdefault("default", {})
        elif isinstance(node.get("additionalProperties"), dict):
            node["additionalProperties"] = _simplify(node["additionalProperties"])
    if node.get("type") == "array" and "items" in node:
        node["items"] = _simplify(node["items"])
    return node


def _shipped_engines(node: Any) -> Any:
    """The schema with spec.engine.name's enum (every registered engine, the
    API's `EngineName`) cut to the shipped engines: an out-of-tree engine
    (`LOCALMODEL_ENGINE_PACKAGES`) never enters the CRD."""
    if isinstance(node, list):
        return [_shipped_engines(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _shipped_engines(v) for k, v in node.items()}
    if out.get("enum") == list(NAMES):
        out["enum"] = [f.NAME for f in SHIPPED]
    return out


def structural(model: type[Any]) -> Schema:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    simple: Schema = _shipped_engines(_simplify(_resolve(raw, raw.get("$defs", {}))))
    return simple


def spec_schema() -> Schema:
    schema = structural(LocalModelSpec)
    schema["x-kubernetes-validations"] = rules_cel(spec_rules(SHIPPED))
    schema["properties"]["gateway"]["x-kubernetes-validations"] = rules_cel(GATEWAY_RULES)
    schema["properties"]["gguf"]["x-kubernetes-validations"] = rules_cel(GGUF_RULES)
    tolerations = schema["properties"]["placement"]["properties"]["tolerations"]["items"]
    tolerations["x-kubernetes-validations"] = rules_cel(TOLERATION_RULES)
    idle = schema["properties"]["idle"]
    idle["x-kubernetes-validations"] = rules_cel(IDLE_RULES)
    window = idle["properties"]["awake"]["items"]
    window["x-kubernetes-validations"] = rules_cel(WINDOW_RULES)
    window["properties"]["days"]["x-kubernetes-list-type"] = "set"  # each day once
    return schema


def status_schema() -> Schema:
    schema = structural(LocalModelStatus)
    props = schema["properties"]
    props["conditions"]["x-kubernetes-list-type"] = "map"
    props["conditions"]["x-kubernetes-list-map-keys"] = ["type"]
    # A LocalModel the operator has not acted on yet reads with observedGeneration 0
    # (the API server defaults it on every read; the status subresource drops any
    # status given at create), so kstatus says InProgress, not Current, until the
    # operator's first status write (docs/gitops.md).
    schema["default"] = {"observedGeneration": 0}
    return schema


PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Model", "type": "string", "jsonPath": ".spec.model"},
    {"name": "Engine", "type": "string", "jsonPath": ".spec.engine.name"},
    {"name": "CPU", "type": "string", "jsonPath": ".spec.cpu"},
    {"name": "Context", "type": "integer", "jsonPath": ".spec.context"},
    {"name": "Ready", "type": "string", "jsonPath": ".status.ready"},
    {"name": "Nodes", "type": "string", "jsonPath": ".status.nodes"},
    {
        "name": "Status",
        "type": "string",
        "jsonPath": ".status.conditions[?(@.type=='Ready')].reason",
    },
    {
        "name": "Speed",
        "type": "string",
        "jsonPath": ".status.conditions[?(@.type=='SlowReplica')].reason",
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {
        "name": "Endpoint",
        "type": "string",
        "jsonPath": ".status.endpoint",
        "priority": 1,
    },
    # Awake, Asleep or Waking (spec.idle); empty for a model that never sleeps.
    {"name": "Idle", "type": "string", "jsonPath": ".status.idle.state", "priority": 1},
]


def openapi_schema() -> Schema:
    """The whole object's schema: metadata.name's rule, spec and status."""
    return {
        "type": "object",
        "description": "A local LLM served on CPU-only nodes, with engine "
        "settings tuned per node (threads from the CPU limit, memory from "
        "weights + KV cache, crash guards) and a slot gate in front.",
        "required": ["spec"],
        # CEL may read metadata.name: the same declaration as Python's.
        "x-kubernetes-validations": [
            {
                "rule": OBJECT_NAME.cel("self.metadata.name"),
                "message": f"metadata.name {OBJECT_NAME.message}",
            }
        ],
        "properties": {
            "apiVersion": {
                "type": "string",
                "description": "APIVersion of this object.",
            },
            "kind": {"type": "string", "description": "Kind of this object."},
            "metadata": {"type": "object"},
            "spec": spec_schema(),
            "status": status_schema(),
        },
    }


def build_crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": KIND.lower(),
                "shortNames": ["lm"],
                "categories": ["localmodel"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {
                        "status": {},
                        # `kubectl scale lm NAME --replicas N`, and HorizontalPodAutoscalers
                        # or KEDA driving spec.replicas (docs/autoscaling.md).
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                }
            ],
        },
    }


def crd_yaml() -> str:
    header = "# Generated by `localmodel crd` from operator/localmodel/api. Do not edit.\n"
    return header + yaml.safe_dump(build_crd(), sort_keys=False, width=100)
