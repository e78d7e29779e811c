"""The CRD is generated from the API models, is structural, and explains itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from localmodel.api import MANAGED_ENV
from localmodel.api.rules import spec_rules
from localmodel.crd import build_crd, crd_yaml
from localmodel.engines import SHIPPED
from localmodel.rules.docs import rules_markdown

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "crds" / "localmodel.dev_localmodels.yaml"


def schema() -> dict[str, Any]:
    s: dict[str, Any] = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return s


def walk(node: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out = [(path, node)]
    for name, child in node.get("properties", {}).items():
        out += walk(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        out += walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        out += walk(node["additionalProperties"], f"{path}{{}}")
    return out


def test_crds_dir_matches_the_generator() -> None:
    assert CRD_FILE.read_text() == crd_yaml(), (
        "crds/ drifted from the API models: run `localmodel crd --write " + str(CRD_FILE) + "`"
    )


def test_chart_ships_the_same_crd() -> None:
    chart_crd = ROOT / "charts" / "localmodel-operator" / "crds" / CRD_FILE.name
    assert chart_crd.read_text() == crd_yaml(), (
        "the chart's CRD drifted: run `localmodel crd --write " + str(chart_crd) + "`"
    )


def test_rules_doc_matches_the_rules_data() -> None:
    assert (ROOT / "docs" / "rules.md").read_text() == rules_markdown(), (
        "docs/rules.md drifted: run `localmodel rules --write docs/rules.md`"
    )


def test_schema_is_structural() -> None:
    for path, node in walk(schema()):
        for banned in ("$ref", "anyOf", "title", "$defs"):
            assert banned not in node, f"{path} has {banned}"
        assert node.get("additionalProperties") is not False, path
        assert "type" in node or node.get("x-kubernetes-int-or-string"), f"{path} has no type"
        if "default" in node:
            assert node["default"] is not None, path


def test_every_spec_and_status_field_has_a_description() -> None:
    missing = [
        p
        for p, n in walk(schema())
        if p.startswith((".spec", ".status"))
        and not p.endswith(("[]", "{}"))
        and not n.get("description")
    ]
    assert missing == []


def test_cel_rules_are_the_python_rules() -> None:
    spec = schema()["properties"]["spec"]
    rules = {v["rule"]: v["message"] for v in spec["x-kubernetes-validations"]}
    assert rules == {r.cel: r.message for r in spec_rules(SHIPPED)}  # no test-only engine's
    assert all(name in next(iter(r for r in rules if "env.all(e" in r)) for name in MANAGED_ENV)


def test_names_columns_and_status_and_scale_subresources() -> None:
    crd = build_crd()
    assert crd["metadata"]["name"] == "localmodels.localmodel.dev"
    names = crd["spec"]["names"]
    assert (names["kind"], names["plural"], names["shortNames"]) == (
        "LocalModel",
        "localmodels",
        ["lm"],
    )
    assert crd["spec"]["scope"] == "Namespaced"
    version = crd["spec"]["versions"][0]
    assert version["subresources"] == {
        "status": {},
        "scale": {
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        },
    }
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert status["replicas"]["type"] == "integer"
    assert status["selector"]["type"] == "string"
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    for wanted in ("Model", "Engine", "CPU", "Context", "Ready", "Nodes", "Age"):
        assert wanted in columns


def test_cpu_is_int_or_string_and_nested_defaults_are_filled() -> None:
    props = schema()["properties"]["spec"]["properties"]
    assert props["cpu"]["x-kubernetes-int-or-string"] is True
    assert props["cpu"]["default"] == 4
    for obj in ("engine", "placement", "storage", "gateway"):
        assert props[obj]["default"] == {}
    assert props["context"]["minimum"] == 512


def test_crd_file_is_valid_yaml_with_one_document() -> None:
    docs = list(yaml.safe_load_all(CRD_FILE.read_text()))
    assert len(docs) == 1 and docs[0]["kind"] == "CustomResourceDefinition"
