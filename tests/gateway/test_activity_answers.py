"""The idle signal in a replica's /speed answer (`activity`), read at the edge
(gateway_contract/speed_answer.py): the gateway's own document reads back,
an older gateway's answer without it reads as None, and every hostile value
(negative, NaN, huge, a fraction, the wrong type, queued past in flight) is a
`BadDocument`, never an exception of another kind or a number past its bound."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localmodel.gateway.door import Door
from localmodel.gateway.speed import SpeedRecord, speed_document
from localmodel.gateway_contract.speed_answer import (
    MAX_ACTIVE,
    MAX_COUNT,
    MAX_IDLE_SECONDS,
    BadDocument,
    reading_from,
    reading_from_answer,
)
from localmodel.speed import Activity
from tests.fuzz import EXAMPLES

pytestmark = pytest.mark.unit

TOTALS = {"requests": 3, "generated_tokens": 240, "decode_seconds": 9.6}
ACTIVE = {"in_flight": 2, "queued": 1, "arrived": 40, "idle_seconds": 0.0, "closed": False}


def _with(key: str, raw: str) -> bytes:
    """An answer whose activity's `key` is the JSON text `raw` (NaN, 1e999, ...)."""
    doc = {"totals": TOTALS, "activity": {**ACTIVE, key: "@@"}}
    return json.dumps(doc).replace('"@@"', raw).encode()


def test_the_gateways_own_activity_reads_back() -> None:
    now = [100.0]
    door = Door(60.0, lambda: 0, lambda: now[0])
    assert door.arrive()
    now[0] = 130.0
    door.end()
    now[0] = 142.5
    doc = {**speed_document(SpeedRecord(), now[0], "ollama", "m", 2),
           "activity": door.activity()}
    reading = reading_from_answer(json.dumps(doc).encode(), 7.0, "u0")
    assert reading.activity == Activity(in_flight=0, queued=0, arrived=1, idle_seconds=12.5,
                                        closed=False)


@pytest.mark.parametrize("doc", [
    {"totals": TOTALS},  # a gateway older than the idle signal
    {"totals": TOTALS, "activity": None},
])
def test_an_answer_without_activity_is_an_older_gateway_not_an_error(doc: Any) -> None:
    reading = reading_from(doc, 0.0, "u0")
    assert reading.activity is None and reading.totals.requests == 3


def test_the_bounds_themselves_are_accepted() -> None:
    edge = {"in_flight": MAX_ACTIVE, "queued": MAX_ACTIVE, "arrived": MAX_COUNT,
            "idle_seconds": MAX_IDLE_SECONDS}
    activity = reading_from({"totals": {}, "activity": edge}, 0.0, "u0").activity
    assert activity == Activity(MAX_ACTIVE, MAX_ACTIVE, int(MAX_COUNT), MAX_IDLE_SECONDS, False)


HOSTILE = {
    "in-flight-negative": _with("in_flight", "-1"),
    "queued-negative": _with("queued", "-1"),
    "arrived-negative": _with("arrived", "-5"),
    "idle-negative": _with("idle_seconds", "-0.5"),
    "idle-NaN": _with("idle_seconds", "NaN"),
    "idle-Infinity": _with("idle_seconds", "Infinity"),
    "idle-1e999": _with("idle_seconds", "1e999"),
    "idle-past-ten-years": _with("idle_seconds", str(MAX_IDLE_SECONDS * 2)),
    "in-flight-NaN": _with("in_flight", "NaN"),
    "in-flight-huge": _with("in_flight", str(MAX_ACTIVE + 1)),
    "in-flight-5000-digits": _with("in_flight", "9" * 5000),
    "arrived-past-2^53": _with("arrived", str(2**53 + 2)),
    "in-flight-a-fraction": _with("in_flight", "1.5"),
    "in-flight-a-string": _with("in_flight", '"1"'),
    "in-flight-true": _with("in_flight", "true"),
    "in-flight-missing": _with("in_flight", "null"),
    "idle-missing": _with("idle_seconds", "null"),
    "idle-a-list": _with("idle_seconds", "[1]"),
    "closed-a-string": _with("closed", '"yes"'),
    "closed-a-number": _with("closed", "1"),
    "queued-past-in-flight": _with("queued", "3"),
    "activity-a-list": b'{"totals":{},"activity":[0,0,0,0]}',
    "activity-a-string": b'{"totals":{},"activity":"idle"}',
    "activity-a-number": b'{"totals":{},"activity":0}',
    "activity-nested-deep": b'{"totals":{},"activity":' + b'{"a":' * 60000 + b"1"
                            + b"}" * 60001,
}


@pytest.mark.parametrize("raw", HOSTILE.values(), ids=HOSTILE.keys())
def test_every_hostile_activity_is_a_bad_document_and_nothing_else(raw: bytes) -> None:
    with pytest.raises(BadDocument) as caught:
        reading_from_answer(raw, 0.0, "u0")
    assert len(str(caught.value)) < 200  # a bounded word for the log, not the tenant's bytes


_NUMBERS = st.one_of(
    st.integers(min_value=0, max_value=50),
    st.sampled_from([0, -0.0, 5e-324, 1.5, -1, 2**53 + 1, 10**400, 1e308, math.nan, math.inf,
                     -math.inf, MAX_ACTIVE + 1, MAX_IDLE_SECONDS]),
    st.floats(), st.integers(min_value=-(2**70), max_value=2**1100),
    st.booleans(), st.text(max_size=3), st.none(), st.just([1]), st.just({"a": 1}),
)
_ACTIVITY = st.one_of(
    st.fixed_dictionaries({}, optional={k: _NUMBERS for k in (
        "in_flight", "queued", "arrived", "idle_seconds", "closed")}),
    _NUMBERS,
)


@settings(max_examples=EXAMPLES, deadline=None)
@given(activity=_ACTIVITY)
def test_an_activity_is_a_bounded_value_or_a_bad_document(activity: Any) -> None:
    raw = json.dumps({"totals": {}, "activity": activity}, allow_nan=True).encode()
    try:
        reading = reading_from_answer(raw, 0.0, "u0")
    except BadDocument:
        return
    a = reading.activity
    if a is None:
        assert activity is None
        return
    assert 0 <= a.queued <= a.in_flight <= MAX_ACTIVE and 0 <= a.arrived <= MAX_COUNT
    assert math.isfinite(a.idle_seconds) and 0 <= a.idle_seconds <= MAX_IDLE_SECONDS
    assert isinstance(a.closed, bool)
    assert all(type(n) is int for n in (a.in_flight, a.queued, a.arrived))
