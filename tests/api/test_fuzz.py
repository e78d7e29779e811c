"""Fuzzing the reader, the API models, the planner and the renderer (hypothesis).

Nothing may escape but the project's own validation errors: `ManifestError`
from the reader, `InvalidObject` from `parse_local_model`, `NodeFactsError` from
the node reader. Every accepted manifest must go through `desired_state` (the
planner, the rules, the renderer) and produce objects Kubernetes accepts: valid
names, labels and quantities, Guaranteed resources, JSON-clean values, a
LocalModel that reads back. `tests/e2e/test_hostile_api.py` sends a sample of
the same to a real API server.

Budget: `LOCALMODEL_FUZZ_EXAMPLES` examples per test (default in tests/fuzz.py).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localmodel.api import parse_local_model
from localmodel.api.checks import (
    DNS1035_LABEL,
    DNS1123_LABEL,
    DNS1123_SUBDOMAIN,
    LABEL_VALUE,
    QUALIFIED_NAME,
)
from localmodel.commands import _dump
from localmodel.desired import desired_state
from localmodel.errors import FieldError, InvalidObject
from localmodel.facts import NodeFacts
from localmodel.facts.node import NodeFactsError, from_node
from localmodel.facts.quantity import parse_bytes, parse_cpu_milli
from localmodel.manifest import ManifestError, load_all
from tests.builders import MakeNode
from tests.fuzz import EXAMPLES, json_values, manifests, node_objects, yaml_texts

pytestmark = pytest.mark.unit

FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
NOW = "2026-12-01T00:00:00Z"
DEFAULT_NODES = [MakeNode("n1").facts(), MakeNode("n2").cpus(8).memory_gib(32).facts()]


def parse(obj: object) -> Any:
    """parse_local_model, asserting the error contract when it refuses."""
    try:
        return parse_local_model(obj)
    except InvalidObject as e:
        assert e.errors and all(isinstance(f, FieldError) for f in e.errors)
        assert all(f.reason for f in e.errors)
        assert e.kind == "LocalModel" and e.name
        return None


def nodes_of(objs: list[dict[str, Any]]) -> list[NodeFacts]:
    out: dict[str, NodeFacts] = {}
    for obj in objs:
        try:
            facts = from_node(obj)
        except NodeFactsError:
            continue
        out.setdefault(facts.name, facts)
    return list(out.values()) or DEFAULT_NODES


def check_object(obj: dict[str, Any]) -> None:
    """What the API server would check first on a rendered object."""
    text = json.dumps(obj, allow_nan=False)  # JSON-clean: no NaN, bytes, datetimes
    assert load_all(yaml.safe_dump(obj).encode(), "rendered") == [json.loads(text)]
    meta = obj["metadata"]
    name_format = DNS1035_LABEL if obj["kind"] == "Service" else DNS1123_LABEL
    assert name_format.valid(meta["name"]), (obj["kind"], meta["name"])
    assert DNS1123_LABEL.valid(meta["namespace"])
    for key, value in (meta.get("labels") or {}).items():
        assert QUALIFIED_NAME.valid(key) and LABEL_VALUE.valid(value), (key, value)
    for key in meta.get("annotations") or {}:
        assert QUALIFIED_NAME.valid(key), key
    if obj["kind"] == "PersistentVolumeClaim":
        assert parse_bytes(obj["spec"]["resources"]["requests"]["storage"]) > 0
        sc = obj["spec"].get("storageClassName")
        assert sc is None or DNS1123_SUBDOMAIN.valid(sc)
    if obj["kind"] == "Pod":
        spec = obj["spec"]
        for key, value in (spec.get("nodeSelector") or {}).items():
            assert QUALIFIED_NAME.valid(key) and LABEL_VALUE.valid(value)
        for tol in spec.get("tolerations") or []:
            if "tolerationSeconds" in tol:
                assert tol.get("effect") == "NoExecute", tol
        for c in spec.get("initContainers", []) + spec["containers"]:
            res = c["resources"]
            assert res["requests"] == res["limits"], c["name"]  # Guaranteed QoS
            assert parse_cpu_milli(res["limits"]["cpu"]) > 0
            assert parse_bytes(res["limits"]["memory"]) > 0
            for env in c.get("env", []):
                assert isinstance(env["value"], str), env


@FUZZ
@given(st.binary(max_size=400))
def test_reader_on_arbitrary_bytes(data: bytes) -> None:
    try:
        docs = load_all(data, "fuzz.yaml")
    except ManifestError as e:
        assert e.where == "fuzz.yaml" and e.reason
        return
    json.dumps(docs, allow_nan=False)  # only JSON values come out


@FUZZ
@given(yaml_texts)
def test_reader_on_yaml_like_text(text: str) -> None:
    try:
        docs = load_all(text.encode(), "fuzz.yaml")
    except ManifestError as e:
        assert str(e).startswith("fuzz.yaml: ")
        return
    json.dumps(docs, allow_nan=False)


@FUZZ
@given(json_values)
def test_api_models_on_any_json(value: Any) -> None:
    assert parse(value) is None or isinstance(value, dict)


@FUZZ
@given(manifests, st.lists(node_objects, max_size=4))
def test_accepted_manifests_plan_and_render_what_kubernetes_accepts(
    body: dict[str, Any], node_dicts: list[dict[str, Any]]
) -> None:
    model = parse(body)
    nodes = nodes_of(node_dicts)
    if model is None:
        return
    result = desired_state([model], nodes, now=NOW).models[0]
    again = parse_local_model(json.loads(json.dumps(_dump(result.with_status))))
    assert again.spec == model.spec  # what render prints reads back, status included
    for obj in result.objects:
        check_object(obj)
    if not result.problems:
        assert {c.type: c.status.value for c in result.status.conditions}["Valid"] == "True"


@FUZZ
@given(st.lists(manifests, min_size=2, max_size=4), st.lists(node_objects, max_size=6))
def test_many_models_share_nodes_without_escaping_errors(
    bodies: list[dict[str, Any]], node_dicts: list[dict[str, Any]]
) -> None:
    models = {m.key: m for m in (parse(b) for b in bodies) if m is not None}
    state = desired_state(list(models.values()), nodes_of(node_dicts), now=NOW)
    for result in state.models:
        for obj in result.objects:
            check_object(obj)


@FUZZ
@given(json_values)
def test_reader_reads_back_any_json_and_yaml_it_is_given(value: Any) -> None:
    as_json = json.dumps(value).encode()
    assert load_all(as_json, "v.json") == [value]
    assert load_all(yaml.safe_dump(value).encode(), "v.yaml") == [value]
