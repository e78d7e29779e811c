"""The status vocabulary: building, writing only on change, Events, foreign fields."""

from __future__ import annotations

import pytest

from localmodel.api import ConditionStatus, LocalModel, LocalModelStatus, parse_local_model
from localmodel.controller.objects import parse_model
from localmodel.desired import desired_state
from localmodel.errors import InvalidObject
from localmodel.events import EventReason, status_events
from localmodel.facts import NodeFacts
from localmodel.status import ConditionType, Reason, status_changed, with_progress
from tests.builders import MakeLocalModel, MakeNode

pytestmark = pytest.mark.unit

NOW = "2026-12-01T00:00:00Z"
LATER = "2026-12-01T01:00:00Z"
AVX2 = frozenset({"AVX2"})
AMX = frozenset({"AVX2", "AVX512F", "AMXTILE", "AMXINT8", "AMXBF16"})
MODEL = MakeLocalModel("m").uid("u1").generation(2).cpu(4)
ON_AVX2 = [MakeNode("n0").cpu_flags(AVX2).facts()]
ON_AMX = [MakeNode("n0").cpu_flags(AMX).facts()]


def status_for(lm: LocalModel, ns: list[NodeFacts], now: str = NOW,
               ready: dict[int, bool] | None = None) -> LocalModelStatus:
    [r] = desired_state([lm], ns, now=now, ready={lm.key: ready or {}}).models
    return r.status


def test_a_status_with_fields_others_wrote_is_read_and_the_spec_stays_strict() -> None:
    raw = MODEL.manifest()
    raw["status"] = {"kopf": {"progress": {}}, "readyReplicas": 1,
                     "conditions": [{"type": "Ready", "status": "True", "reason": "X",
                                     "lastTransitionTime": NOW, "someoneElse": 1}]}
    lm = parse_local_model(raw)
    assert lm.status is not None and lm.status.ready_replicas == 1
    assert lm.status.conditions[0].status == ConditionStatus.TRUE
    bad = MODEL.manifest()
    bad["spec"]["surprise"] = True
    with pytest.raises(InvalidObject) as exc:
        parse_local_model(bad)
    assert [e.field_path for e in exc.value.errors] == ["spec.surprise"]


def test_operator_reads_a_garbage_status_as_none_but_keeps_the_model() -> None:
    raw = MODEL.manifest()
    raw["status"] = {"conditions": "not a list"}
    mo = parse_model(raw)
    assert mo.model is not None and mo.status is None and not mo.error


def test_operator_marks_an_unparseable_object_with_the_field_and_reason() -> None:
    mo = parse_model(MODEL.spec(kvCache="q3_0").manifest())
    assert mo.model is None
    assert mo.error.startswith("spec.kvCache: ")


def test_identical_status_needs_no_write_and_transition_times_hold() -> None:
    lm = MODEL.obj()
    first = status_for(lm, ON_AVX2)
    again = status_for(lm.model_copy(update={"status": first}), ON_AVX2, now=LATER)
    assert not status_changed(first, again)
    assert status_changed(None, first)
    ready = status_for(lm.model_copy(update={"status": first}), ON_AVX2, now=LATER,
                       ready={0: True})
    assert status_changed(first, ready)
    times = {c.type: c.last_transition_time for c in ready.conditions}
    assert times["Ready"] == LATER and times["Valid"] == NOW


def test_first_placement_is_one_event_listing_its_rules() -> None:
    lm = MODEL.obj()
    new = status_for(lm, ON_AMX)
    events = status_events(None, new)
    assert [e.reason for e in events] == [EventReason.PLACED]
    assert "n0" in events[0].message and "threads=4" in events[0].message
    assert "rules:" in events[0].message


def test_moving_and_decisions_starting_and_stopping_are_events() -> None:
    lm = MODEL.obj()
    on_avx2 = status_for(lm, ON_AVX2)
    on_amx = status_for(lm, [MakeNode("n9").cpu_flags(AMX).facts()])
    events = status_events(on_avx2, on_amx)
    reasons = [e.reason for e in events]
    assert reasons[0] == EventReason.MOVED
    rules_avx2 = {d.rule for d in on_avx2.placements[0].decisions}
    rules_amx = {d.rule for d in on_amx.placements[0].decisions}
    assert (EventReason.DECISION_ON in reasons) == bool(rules_amx - rules_avx2)
    assert (EventReason.DECISION_OFF in reasons) == bool(rules_avx2 - rules_amx)
    assert status_events(on_amx, on_amx) == []


def test_unplaced_and_invalid_are_warnings_once() -> None:
    lm = MODEL.cpu(64).obj()
    unplaced = status_for(lm, ON_AVX2)
    events = status_events(None, unplaced)
    assert [(e.reason, e.warning) for e in events] == [(EventReason.UNPLACED, True)]
    assert status_events(unplaced, unplaced) == []


def test_progressing_condition_follows_the_roll() -> None:
    lm = MODEL.obj()
    base = status_for(lm, ON_AVX2)
    rolling = with_progress(base, "replica 0: starting", lm, NOW)
    done = with_progress(base, None, lm, NOW)
    get = {c.type: c for c in rolling.conditions}
    assert get[ConditionType.PROGRESSING.value].status == ConditionStatus.TRUE
    assert get[ConditionType.PROGRESSING.value].reason == Reason.ROLLING.value
    final = {c.type: c for c in done.conditions}[ConditionType.PROGRESSING.value]
    assert final.status == ConditionStatus.FALSE and final.reason == Reason.UP_TO_DATE.value


def test_a_kept_placement_keeps_the_reason_it_was_made_for() -> None:
    """Re-planning a stored placement says "kept: ..."; status keeps the original
    reason, so a second pass writes nothing."""
    lm = MODEL.obj()
    first = status_for(lm, ON_AVX2)
    assert not first.placements[0].reason.startswith("kept")
    stored = lm.model_copy(update={"status": first})
    [r] = desired_state([stored], ON_AVX2, now=LATER, ready={lm.key: {}},
                        current={lm.key: ["n0"]}).models
    assert r.replicas[0].reason.startswith("kept")
    assert r.status.placements[0].reason == first.placements[0].reason
    assert not status_changed(first, r.status)
