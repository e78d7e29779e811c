"""kubeconform schemas written from an OpenAPI v2 document."""

from __future__ import annotations

import json
from pathlib import Path

from tests.harness.schemas import api_version_kinds, schema_path, write_schemas

INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
OPENAPI = {
    "definitions": {
        "io.k8s.api.apps.v1.Deployment": {
            "type": "object",
            "properties": {"spec": {"$ref": "#/definitions/io.k8s.api.apps.v1.DeploymentSpec"}},
            "x-kubernetes-group-version-kind": [
                {"group": "apps", "version": "v1", "kind": "Deployment"}
            ],
        },
        "io.k8s.api.apps.v1.DeploymentSpec": {
            "type": "object",
            "properties": {
                "maxSurge": {"$ref": f"#/definitions/{INT_OR_STRING}"},
                "memory": {"$ref": f"#/definitions/{QUANTITY}"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
        INT_OR_STRING: {"type": "string", "format": "int-or-string"},
        QUANTITY: {"type": "string"},
        "io.k8s.api.core.v1.ConfigMap": {
            "type": "object",
            "properties": {"data": {"type": "object"}},
            "x-kubernetes-group-version-kind": [
                {"group": "", "version": "v1", "kind": "ConfigMap"}
            ],
        },
        "io.k8s.api.core.v1.Unused": {"type": "object"},
    }
}


def test_one_standalone_strict_schema_per_requested_kind(tmp_path: Path) -> None:
    wanted = api_version_kinds([{"apiVersion": "apps/v1", "kind": "Deployment"}])
    [written] = write_schemas(OPENAPI, tmp_path, wanted)
    assert written == schema_path(tmp_path, "apps", "v1", "Deployment")
    assert written == tmp_path / "apps" / "v1" / "deployment.json"
    schema = json.loads(written.read_text())
    assert schema["$ref"] == "#/definitions/io.k8s.api.apps.v1.Deployment"
    definitions = schema["definitions"]
    assert "io.k8s.api.core.v1.Unused" not in definitions  # only what Deployment refers to
    spec = definitions["io.k8s.api.apps.v1.DeploymentSpec"]
    assert spec["additionalProperties"] is False  # unknown fields fail
    assert spec["properties"]["labels"]["additionalProperties"] == {"type": "string"}  # maps stay
    int_or_string = definitions[INT_OR_STRING]
    assert {t["type"] for t in int_or_string["oneOf"]} == {"string", "integer"}
    quantity = definitions[QUANTITY]
    assert {t["type"] for t in quantity["oneOf"]} == {"string", "number"}


def test_core_kinds_live_under_v1_v1(tmp_path: Path) -> None:
    written = write_schemas(OPENAPI, tmp_path)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in written) == [
        "apps/v1/deployment.json",
        "v1/v1/configmap.json",
    ]
