"""kubeconform schemas from the real API server's OpenAPI v2 document.

kubeconform validates offline against JSON schemas, one file per kind. Instead
of downloading a schema repository (no internet here), the e2e session asks
the API server it just started for `/openapi/v2` and writes one standalone,
strict schema per kind: every referenced definition inlined, unknown fields
rejected (additionalProperties: false), and the two Kubernetes string formats
that YAML writes as numbers (int-or-string, quantity) widened to allow both.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

JSON = dict[str, Any]

# kubeconform's `-schema-location` template for the layout written below:
# core kinds: v1/v1/<kind>.json, others: <group>/<version>/<kind>.json
LOCATION_TEMPLATE = "{{ .Group }}/{{ .ResourceAPIVersion }}/{{ .ResourceKind }}.json"

_STRING_OR_INTEGER = {"oneOf": [{"type": "string"}, {"type": "integer"}]}
_STRING_OR_NUMBER = {"oneOf": [{"type": "string"}, {"type": "number"}]}
_QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/definitions/"):
            yield ref.removeprefix("#/definitions/")
        for value in node.values():
            yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


def _strict(node: Any) -> Any:
    """Copy of a schema with closed objects and number-friendly string formats."""
    if isinstance(node, list):
        return [_strict(v) for v in node]
    if not isinstance(node, dict):
        return node
    if node.get("format") == "int-or-string":
        return dict(_STRING_OR_INTEGER)
    out = {k: _strict(v) for k, v in node.items()}
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def _closure(definitions: JSON, root: str) -> JSON:
    """The definitions `root` needs, transitively."""
    needed: dict[str, Any] = {}
    todo = [root]
    while todo:
        name = todo.pop()
        if name in needed or name not in definitions:
            continue
        needed[name] = definitions[name]
        todo.extend(_refs(definitions[name]))
    return needed


def schema_path(directory: Path, group: str, version: str, kind: str) -> Path:
    """Where kubeconform looks for a kind's schema, given LOCATION_TEMPLATE."""
    return directory / (group or version) / version / f"{kind.lower()}.json"


def api_version_kinds(manifests: list[JSON]) -> set[tuple[str, str]]:
    """The (apiVersion, kind) pairs of some manifests: what needs a schema."""
    return {(str(m["apiVersion"]), str(m["kind"])) for m in manifests}


def write_schemas(
    openapi_v2: JSON, directory: Path, only: set[tuple[str, str]] | None = None
) -> list[Path]:
    """One standalone strict schema per kind (or per `only` (apiVersion, kind)); returns them."""
    definitions: JSON = openapi_v2["definitions"]
    fixed = {name: _strict(schema) for name, schema in definitions.items()}
    if _QUANTITY in fixed:
        fixed[_QUANTITY] = dict(_STRING_OR_NUMBER)
    written: list[Path] = []
    for name, schema in definitions.items():
        for gvk in schema.get("x-kubernetes-group-version-kind", []):
            group, version, kind = gvk["group"], gvk["version"], gvk["kind"]
            api_version = f"{group}/{version}" if group else version
            if only is not None and (api_version, kind) not in only:
                continue
            path = schema_path(directory, group, version, kind)
            if path.exists():
                continue
            document = {
                "$schema": "http://json-schema.org/draft-04/schema#",
                "$ref": f"#/definitions/{name}",
                "definitions": _closure(fixed, name),
            }
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(document))
            written.append(path)
    return written


def kubeconform(binary: Path, schemas: Path, manifests: list[JSON]) -> str:
    """Run kubeconform, offline and strict, on `manifests` against the schemas
    written to `schemas`; returns its output, raises AssertionError if invalid."""
    result = subprocess.run(
        [str(binary), "-strict", "-summary", "-output", "text",
         "-schema-location", f"{schemas}/{LOCATION_TEMPLATE}", "-"],
        input=yaml.safe_dump_all(manifests), capture_output=True, text=True, timeout=60,
    )
    if result.returncode != 0:
        raise AssertionError(result.stdout + result.stderr)
    return result.stdout
