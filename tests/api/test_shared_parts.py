"""Equal parts of parsed LocalModels are one object (issue 33: memory at 5 000
models), and sharing them changes nothing a parse returns or reports."""

from __future__ import annotations

import gc

import pytest

from localmodel.api import Gateway, LocalModel, parse_local_model
from localmodel.api.parse import CONDITIONS, DECISIONS
from localmodel.api.shared import Shared, frozen
from localmodel.controller.objects import parse_model
from localmodel.desired import desired_state, tuning_view
from localmodel.errors import InvalidObject
from localmodel.status import status_body
from tests.builders import MakeLocalModel, MakeNode

pytestmark = pytest.mark.unit

NOW = "2026-12-01T00:00:00Z"
MODEL = MakeLocalModel("m").uid("u1").generation(2).cpu(4)
NODES = [MakeNode("n0").cpu_flags(frozenset({"AVX2"})).facts()]


def _stored(builder: MakeLocalModel) -> dict[str, object]:
    """The object as the API server keeps it once the operator wrote its status."""
    lm = builder.obj()
    [result] = desired_state([lm], NODES, now=NOW, ready={lm.key: {}}).models
    return {**builder.manifest(), "status": status_body(result.status)}


def test_equal_spec_parts_of_two_models_are_one_object() -> None:
    gateway = {"maxQueue": 7, "networkPolicy": {"namespaces": ["web"]}}
    base = MODEL.spec(storage={"retain": False}, engine={"name": "ollama"})
    a = base.named("a").spec(gateway=gateway).obj()
    b = base.named("b").spec(gateway=dict(reversed(gateway.items()))).obj()  # key order
    c = base.named("c").spec(gateway={**gateway, "maxQueue": 8}).obj()
    assert a.spec.gateway is b.spec.gateway
    assert a.spec.storage is b.spec.storage and a.spec.engine is b.spec.engine
    assert c.spec.gateway is not a.spec.gateway and c.spec.gateway.max_queue == 8


def test_a_shared_parse_is_the_plain_parse() -> None:
    raw = MODEL.spec(gateway={"maxQueue": 3}, placement={"nodeSelector": {"z": "a"}}).manifest()
    MODEL.named("other").spec(gateway={"maxQueue": 3}).obj()  # the part made before
    assert parse_local_model(raw) == LocalModel.model_validate(raw)


def test_a_bad_part_is_reported_where_it_is_as_before() -> None:
    with pytest.raises(InvalidObject) as exc:
        MODEL.spec(gateway={"maxQueue": -1}, memory="lots").obj()
    paths = {e.field_path for e in exc.value.errors}
    assert {"spec.gateway.maxQueue", "spec.memory"} <= paths
    assert str(exc.value).startswith("LocalModel ai/m")  # the object's own name


def test_stored_statuses_share_decisions_and_conditions_with_the_computed_one() -> None:
    a, b = parse_model(_stored(MODEL.named("a"))), parse_model(_stored(MODEL.named("b")))
    assert a.status is not None and b.status is not None and a.model is not None
    [pa], [pb] = a.status.placements, b.status.placements
    assert pa.decisions and all(x is y for x, y in zip(pa.decisions, pb.decisions, strict=True))
    valid_a, valid_b = a.status.conditions[0], b.status.conditions[0]
    assert valid_a.type == "Valid" and valid_a is valid_b
    assert a.model.status is a.status  # the model holds the parsed status, not a copy
    # what the operator works out for a settled model holds the same objects
    [again] = desired_state([a.model], NODES, now=NOW, ready={a.model.key: {}}).models
    [p] = again.status.placements
    assert p is pa  # the stored placement itself, as it says the same
    assert all(x is y for x, y in zip(p.decisions, pa.decisions, strict=True))
    assert all(x is y for x, y in zip(again.status.conditions, a.status.conditions,
                                      strict=True))


def test_the_api_servers_key_order_shares_the_operators_part() -> None:
    lm = MODEL.obj()
    [result] = desired_state([lm], NODES, now=NOW, ready={lm.key: {}}).models
    body = status_body(result.status)
    decision, made = body["placements"][0]["decisions"][0], result.status.placements[0].decisions
    assert DECISIONS.part(dict(sorted(decision.items()))) is made[0]
    condition = body["conditions"][0]
    assert CONDITIONS.part(dict(sorted(condition.items()))) is result.status.conditions[0]


def test_tuning_view_decisions_are_the_shared_ones() -> None:
    lm = MODEL.obj()
    [result] = desired_state([lm], NODES, now=NOW, ready={lm.key: {}}).models
    [replica] = result.replicas
    _, decisions = tuning_view(replica.tuning)
    assert decisions == result.status.placements[0].decisions
    assert all(d is DECISIONS.of(d.model_dump(by_alias=True)) for d in decisions)


def test_a_part_no_object_holds_is_let_go() -> None:
    parts: Shared[Gateway] = Shared(Gateway)
    held = parts.part({"maxQueue": 5})
    assert isinstance(held, Gateway) and len(parts) == 1
    assert parts.part({"maxQueue": 5}) is held
    del held
    gc.collect()
    assert len(parts) == 0


def test_input_that_does_not_validate_alone_is_given_back() -> None:
    parts: Shared[Gateway] = Shared(Gateway)
    bad = {"maxQueue": "many"}
    assert parts.part(bad) is bad and parts.part("text") == "text" and len(parts) == 0
    with pytest.raises(ValueError):
        parts.of(bad)


def test_frozen_tells_json_scalars_apart_and_ignores_key_order() -> None:
    assert len({frozen(1), frozen(1.0), frozen(True), frozen("1")}) == 4
    assert frozen({"a": 1, "b": [1, {"c": None}]}) == frozen({"b": [1, {"c": None}], "a": 1})
    assert frozen([1, 2]) != frozen([2, 1])
    for bad in ({1: "int key"}, {"a": object()}, {"a": {"b": set()}}):
        with pytest.raises(ValueError):
            frozen(bad)


def test_parts_left_out_are_one_default_object() -> None:
    a, b = MODEL.named("a").obj(), MODEL.named("b").obj()  # no gateway, storage, ...
    assert a.spec.gateway is b.spec.gateway and a.spec.gateway == Gateway()
    assert a.spec.storage is b.spec.storage and a.spec.placement is b.spec.placement
    assert a.spec.engine is b.spec.engine
    written = MODEL.named("c").spec(gateway={"maxQueue": 3}).obj()
    assert written.spec.gateway.network_policy is a.spec.gateway.network_policy
    assert "gateway" not in a.spec.model_fields_set  # still a default, not written
