"""Prometheus exposition, the per-request record, the log line and /slots."""

from __future__ import annotations

import json
import re

import pytest

from localmodel.gateway.metrics import GatewayMetrics
from localmodel.gateway.record import Outcome, RequestRecord, log_fields, log_line
from localmodel.gateway.slots import SlotSnapshot, slots_document
from localmodel.gateway_contract.timing import EngineTiming
from localmodel.metrics import Counter, Gauge, Histogram, render

pytestmark = pytest.mark.unit

SAMPLE = re.compile(
    r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*",?)*\})? '
    r"[-+0-9.eInfNa]+$"
)


def assert_valid_exposition(text: str) -> None:
    assert text.endswith("\n")
    for line in text.splitlines():
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            continue
        assert SAMPLE.match(line), line


def test_counter_gauge_histogram_render() -> None:
    c = Counter("x_total", "X.", ("route",))
    c.inc(2, ('/a"b',))
    g = Gauge("y", "Y.", lambda: {(): 3.0})
    h = Histogram("z_seconds", "Z.", (0.1, 1.0))
    for v in (0.05, 0.5, 5.0):
        h.observe(v)
    text = render([c, g, h])
    assert_valid_exposition(text)
    assert 'x_total{route="/a\\"b"} 2' in text
    assert "# TYPE z_seconds histogram" in text
    assert 'z_seconds_bucket{le="0.1"} 1' in text
    assert 'z_seconds_bucket{le="1"} 2' in text
    assert 'z_seconds_bucket{le="+Inf"} 3' in text
    assert "z_seconds_count 3" in text
    assert "z_seconds_sum 5.55" in text


def test_counters_only_go_up() -> None:
    with pytest.raises(ValueError):
        Counter("a_total", "A.").inc(-1)


def record(**kw: object) -> RequestRecord:
    rec = RequestRecord(request_id="r1", route="/api/chat", priority="foreground", start=10.0)
    for key, value in kw.items():
        setattr(rec, key, value)
    return rec


def test_record_times() -> None:
    rec = record(queued_at=10.0, slot_at=12.0, first_token_at=12.5, slot_released_at=15.0, end=15.0)
    assert rec.queue_wait == 2.0
    assert rec.ttft == 2.5
    assert rec.slot_seconds == 3.0
    assert rec.duration == 5.0


def test_first_outcome_wins() -> None:
    rec = record()
    rec.finish(Outcome.CANCELLED_DEADLINE, 504)
    rec.finish(Outcome.CANCELLED_DISCONNECT, 499)
    assert (rec.outcome, rec.status) == (Outcome.CANCELLED_DEADLINE, 504)


def test_metrics_from_records() -> None:
    snap = SlotSnapshot(total=2, busy=1, queued_foreground=3, queued_background=0, queue_limit=8)
    metrics = GatewayMetrics(lambda: snap, lambda: 4)
    ok = record(
        slot_at=10.0,
        first_token_at=10.2,
        slot_released_at=12.0,
        end=12.0,
        timing=EngineTiming(100, 0.5, 40, 2.0, None, "stop"),
    )
    ok.finish(Outcome.OK, 200)
    gone = record(slot_at=10.0, slot_released_at=11.0, end=11.0)
    gone.finish(Outcome.CANCELLED_DISCONNECT, 499)
    for rec in (ok, gone):
        metrics.record(rec)
    text = metrics.render()
    assert_valid_exposition(text)
    expect = [
        'localmodel_gateway_requests_total{route="/api/chat",priority="foreground",outcome="ok"} 1',
        'localmodel_gateway_cancellations_total{reason="disconnect"} 1',
        "localmodel_gateway_slot_busy_seconds_total 3",
        "localmodel_gateway_prompt_tokens_total 100",
        "localmodel_gateway_prefill_seconds_total 0.5",
        "localmodel_gateway_generated_tokens_total 40",
        "localmodel_gateway_decode_seconds_total 2",
        "localmodel_gateway_slots 2",
        "localmodel_gateway_slots_busy 1",
        "localmodel_gateway_slot_occupancy 0.5",
        'localmodel_gateway_queued{priority="foreground"} 3',
        "localmodel_gateway_in_flight 4",
        'localmodel_gateway_decode_tokens_per_second_bucket{le="20"} 1',
        'localmodel_gateway_time_to_first_token_seconds_count{route="/api/chat"} 1',
    ]
    for line in expect:
        assert line in text, line
    assert metrics.mean_slot_seconds == 1.5


def test_overflowed_records_count_as_overflow_not_as_engine_work() -> None:
    snap = SlotSnapshot(total=1, busy=1, queued_foreground=0, queued_background=0, queue_limit=8)
    metrics = GatewayMetrics(lambda: snap, lambda: 1)
    far = record(queued_at=10.0, end=11.5, served_by="overflow")
    far.finish(Outcome.OK, 200)
    broke = record(queued_at=10.0, end=11.0, served_by="overflow", upstream_error="stream")
    broke.finish(Outcome.UPSTREAM_ERROR, 502)
    near = record(slot_at=10.0, slot_released_at=10.5, end=10.5)
    near.finish(Outcome.OK, 200)
    for rec in (far, broke, near):
        metrics.record(rec)
    text = metrics.render()
    assert_valid_exposition(text)
    for line in (
        'localmodel_gateway_overflow_requests_total{route="/api/chat",outcome="ok"} 1',
        'localmodel_gateway_overflow_requests_total{route="/api/chat",outcome="upstream_error"} 1',
        'localmodel_gateway_overflow_errors_total{kind="stream"} 1',
        'localmodel_gateway_overflow_request_duration_seconds_count{route="/api/chat"} 2',
        'localmodel_gateway_overflow_request_duration_seconds_sum{route="/api/chat"} 2.5',
    ):
        assert line in text, line
    assert "localmodel_gateway_upstream_errors_total{" not in text  # not the engine's
    assert metrics.queue_wait.series == {
        ("foreground",): metrics.queue_wait.series[("foreground",)]
    }
    assert metrics.queue_wait.series[("foreground",)].count == 1  # only the local one
    assert log_fields(far)["served_by"] == "overflow"
    assert log_fields(near)["served_by"] == "local"


def test_log_line_is_one_json_object_with_rates() -> None:
    rec = record(
        slot_at=10.5,
        queued_at=10.0,
        first_token_at=11.0,
        end=13.0,
        timing=EngineTiming(100, 0.5, 40, 2.0, None, "length"),
    )
    rec.finish(Outcome.OK, 200)
    line = log_line(rec, "2026-01-01T00:00:00Z")
    assert "\n" not in line
    doc = json.loads(line)
    assert doc["outcome"] == "ok"
    assert doc["queue_wait_ms"] == 500.0
    assert doc["prefill_tok_s"] == 200.0
    assert doc["decode_tok_s"] == 20.0
    assert doc["done_reason"] == "length"


def test_cancelled_log_line_names_the_reason() -> None:
    rec = record(end=11.0)
    rec.finish(Outcome.CANCELLED_DEADLINE, 504, "deadline of 1s passed")
    fields = log_fields(rec)
    assert fields["cancel_reason"] == "deadline"
    assert fields["detail"] == "deadline of 1s passed"


def test_slots_document() -> None:
    snap = SlotSnapshot(total=2, busy=2, queued_foreground=1, queued_background=0, queue_limit=4)
    doc = slots_document(snap, "m", "ollama", 4, 8192)
    assert doc == {
        "model": "m",
        "engine": "ollama",
        "total": 2,
        "busy": 2,
        "free": 0,
        "queued": {"foreground": 1, "background": 0},
        "queue_limit": 4,
        "threads": 4,
        "context": 8192,
        "owned_sessions": [],
    }
