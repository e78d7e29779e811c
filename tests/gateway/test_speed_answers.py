"""A replica's /speed answer is the tenant's (gateway_contract/speed_answer.py): every
hostile answer is a `BadDocument`, never another exception, and whatever the
parser accepts cannot make the speed verdicts or the status fail (issue 30)."""

from __future__ import annotations

import gzip
import json
import math
from dataclasses import dataclass, replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localmodel.api.status import SpeedStatus
from localmodel.controller.speed import SpeedBook, SpeedTarget
from localmodel.gateway.speed import Calibration, SpeedRecord, speed_document
from localmodel.gateway_contract.speed_answer import (
    MAX_COUNT,
    READ_MAX_BYTES,
    BadDocument,
    reading_from,
    reading_from_answer,
)
from localmodel.speed import MAX_RATE, Rates, Reading, SpeedPolicy, Totals
from localmodel.status import speed_status
from tests.builders import PEER_KEY
from tests.fuzz import EXAMPLES

pytestmark = pytest.mark.unit

KEY = PEER_KEY
GOOD = {"calibration": {"decode_tokens_per_second": 25.0, "prefill_tokens_per_second": 180.0,
                        "at": 1764626400.0},
        "totals": {"requests": 3, "generated_tokens": 240, "decode_seconds": 9.6,
                   "prompt_tokens": 30, "prefill_seconds": 0.2}}


def good_with(section: str, key: str, raw_value: str) -> bytes:
    """GOOD with one field's JSON text replaced by `raw_value` (NaN, 1e999, ...)."""
    doc = json.loads(json.dumps(GOOD))
    doc[section][key] = "@@"
    return json.dumps(doc).replace('"@@"', raw_value).encode()


@dataclass(frozen=True)
class Hostile:
    id: str
    body: bytes


HOSTILE = [
    # what stopped the operator (issue 30): OverflowError, RecursionError
    Hostile("requests-1e999", b'{"totals":{"requests":1e999}}'),
    Hostile("open-brackets", b"[" * 60000),
    Hostile("nested-objects", b'{"a":' * 60000 + b"1" + b"}" * 60000),
    Hostile("nested-under-totals", b'{"totals":{"requests":' + b'{"a":' * 200 + b"1"
            + b"}" * 202),
    # what made every pass fail: a calibration that is not finite
    Hostile("calibration-NaN", good_with("calibration", "decode_tokens_per_second", "NaN")),
    Hostile("calibration-Infinity",
            good_with("calibration", "decode_tokens_per_second", "Infinity")),
    Hostile("calibration--Infinity",
            good_with("calibration", "prefill_tokens_per_second", "-Infinity")),
    Hostile("calibration-1e999", good_with("calibration", "decode_tokens_per_second", "1e999")),
    Hostile("calibration-at-NaN", good_with("calibration", "at", "NaN")),
    Hostile("totals-NaN", good_with("totals", "decode_seconds", "NaN")),
    # non-object JSON
    Hostile("list", b"[]"),
    Hostile("string", b'"totals"'),
    Hostile("number", b"3"),
    Hostile("null", b"null"),
    Hostile("true", b"true"),
    Hostile("no-totals", b'{"calibration":{}}'),
    Hostile("totals-a-list", b'{"totals":[1,2,3]}'),
    Hostile("calibration-a-string", b'{"calibration":"fast","totals":{"requests":1}}'),
    # strings and other types where numbers go
    Hostile("requests-a-string", good_with("totals", "requests", '"5"')),
    Hostile("rate-a-string", good_with("calibration", "decode_tokens_per_second", '"25"')),
    Hostile("requests-true", good_with("totals", "requests", "true")),
    Hostile("tokens-a-list", good_with("totals", "generated_tokens", "[240]")),
    Hostile("seconds-an-object", good_with("totals", "decode_seconds", '{"s":1}')),
    # negative numbers
    Hostile("requests-negative", good_with("totals", "requests", "-1")),
    Hostile("seconds-negative", good_with("totals", "decode_seconds", "-9.6")),
    Hostile("rate-negative", good_with("calibration", "decode_tokens_per_second", "-25")),
    Hostile("at-negative", good_with("calibration", "at", "-1")),
    # out of range and huge
    Hostile("requests-fraction", good_with("totals", "requests", "1.5")),
    Hostile("requests-over-2^53", good_with("totals", "requests", str(2**53 + 2))),
    Hostile("requests-400-digits", good_with("totals", "requests", "9" * 400)),
    Hostile("requests-5000-digits", good_with("totals", "requests", "9" * 5000)),
    Hostile("tokens-1e300", good_with("totals", "generated_tokens", "1e300")),
    Hostile("rate-over-max", good_with("calibration", "decode_tokens_per_second", "2e6")),
    # not UTF-8 JSON
    Hostile("invalid-utf8", b'{"totals":{"requests":1},"model":"\xff\xfe"}'),
    Hostile("utf16", json.dumps(GOOD).encode("utf-16")),
    Hostile("gzip", gzip.compress(json.dumps(GOOD).encode())),
    Hostile("empty", b""),
    Hostile("truncated", json.dumps(GOOD).encode()[:-3]),
    Hostile("over-the-bound", json.dumps(GOOD).encode() + b" " * READ_MAX_BYTES),
]


@pytest.mark.parametrize("case", HOSTILE, ids=[c.id for c in HOSTILE])
def test_every_hostile_answer_is_a_bad_document_and_nothing_else(case: Hostile) -> None:
    with pytest.raises(BadDocument) as caught:
        reading_from_answer(case.body, 0.0, "u0")
    assert len(str(caught.value)) < 200  # a bounded word for the log, not the tenant's bytes


def test_the_gateways_own_document_is_read() -> None:
    record = SpeedRecord(Calibration(25.3, 180.0, 32, 12, 1.5, True, 1764626400.5),
                         requests=3, generated_tokens=240, decode_seconds=9.6,
                         prompt_tokens=30, prefill_seconds=0.2)
    raw = json.dumps(speed_document(record, 1764626500.0, "ollama", "gemma3:270m", 1)).encode()
    reading = reading_from_answer(raw, 7.0, "u0")
    assert (reading.calibration.decode, reading.calibration.prefill) == (25.3, 180.0)
    assert reading.calibrated_at == 1764626400.5 and reading.at == 7.0
    assert (reading.totals.requests, reading.totals.generated_tokens) == (3, 240.0)
    uncalibrated = json.dumps(speed_document(SpeedRecord(), 0.0, "ollama", "m", None)).encode()
    assert reading_from_answer(uncalibrated, 0.0, "u0").calibration.decode is None


def test_the_bounds_themselves_are_accepted() -> None:
    edge = {"calibration": {"decode_tokens_per_second": MAX_RATE, "prefill_tokens_per_second": 0,
                            "at": MAX_COUNT},
            "totals": {"requests": 2**53, "generated_tokens": 0, "decode_seconds": MAX_COUNT,
                       "prompt_tokens": None}}
    reading = reading_from(edge, 0.0, "u0")
    assert reading.calibration.decode == MAX_RATE and reading.totals.requests == 2**53
    padded = json.dumps(GOOD).encode()
    padded += b" " * (READ_MAX_BYTES - len(padded))
    assert reading_from_answer(padded, 0.0, "u0").totals.requests == 3


# ---- whatever the parser accepts, the speed verdicts and the status hold -----------------

# Mostly numbers the parser accepts (the edges among them: a denormal, the bounds),
# so most documents are read and reach the verdicts; then everything else.
_FINE = st.one_of(st.floats(min_value=0, max_value=1e4), st.integers(min_value=0, max_value=10**6),
                  st.sampled_from([0, -0.0, 5e-324, 1e-300, 1e-9, MAX_RATE, MAX_COUNT, 2**53]),
                  st.none())
_HOSTILE = st.one_of(
    st.sampled_from([MAX_RATE * 2, 2**53 + 1, 1e308, 10**400, -1, math.inf, -math.inf,
                     math.nan]),
    st.floats(), st.integers(min_value=-(2**70), max_value=2**1100),
    st.booleans(), st.text(max_size=4), st.just([1]), st.just({"a": 1}),
)
_VALUES = st.integers(0, 9).flatmap(lambda i: _HOSTILE if i == 0 else _FINE)
_TOTALS = st.fixed_dictionaries({}, optional={k: _VALUES for k in (
    "requests", "generated_tokens", "decode_seconds", "prompt_tokens", "prefill_seconds")})
_CALIBRATION = st.fixed_dictionaries({}, optional={k: _VALUES for k in (
    "decode_tokens_per_second", "prefill_tokens_per_second", "at")})
_SHAPED = st.fixed_dictionaries(
    {"totals": _TOTALS},
    optional={"calibration": st.integers(0, 9).flatmap(
        lambda i: _HOSTILE if i == 0 else st.none() if i == 1 else _CALIBRATION)})
_ODD = st.one_of(st.fixed_dictionaries({}, optional={"totals": _VALUES, "calibration": _VALUES}),
                 _VALUES)
DOCUMENTS = st.integers(0, 9).flatmap(lambda i: _ODD if i == 0 else _SHAPED)


def _answer(doc: Any) -> bytes:
    return json.dumps(doc, allow_nan=True).encode()  # NaN and Infinity as the tokens


def _accepted(raw: bytes, at: float, uid: str) -> Reading | None:
    try:
        return reading_from_answer(raw, at, uid)
    except BadDocument:
        return None


def _assert_bounded(reading: Reading) -> None:
    for rate in (reading.calibration.decode, reading.calibration.prefill):
        assert rate is None or 0 <= rate <= MAX_RATE
    t = reading.totals
    for number in (reading.calibrated_at, t.requests, t.generated_tokens, t.decode_seconds,
                   t.prompt_tokens, t.prefill_seconds):
        assert number is None or 0 <= number <= MAX_COUNT


@settings(max_examples=EXAMPLES, deadline=None)
@given(doc=DOCUMENTS)
def test_an_answer_is_a_bounded_reading_or_a_bad_document(doc: Any) -> None:
    reading = _accepted(_answer(doc), 0.0, "u0")  # any other exception fails here
    if reading is not None:
        _assert_bounded(reading)


def _book_through(answers: list[tuple[str, Reading | None, float]]) -> None:
    """Two peer replicas read in turn (`answers`: uid, reading or a failed read, the
    time since the last read): the book records each, and every published number
    becomes a valid, finite status."""
    book = SpeedBook(SpeedPolicy(interval=1, idle_max=2, slow_after=1, clear_after=1))
    book.retarget([SpeedTarget("ai/chat", i, f"n{i}", f"chat-{i}", f"u{i}", "10.0.0.1", KEY)
                   for i in (0, 1)])
    now = 0.0
    for uid, reading, step in answers:
        now += step
        book.record(uid, None if reading is None else replace(reading, at=now), now)
        for replicas in book.published_by_model().values():
            for published in replicas.values():
                status = speed_status(published, "2025-12-01T22:00:00Z")
                SpeedStatus.model_validate(status.model_dump())
                json.dumps(status.model_dump(mode="json", by_alias=True), allow_nan=False)
        assert all(math.isfinite(r) for r in book.ratios().values())


_UIDS = st.sampled_from(["u0", "u1"])
_STEPS = st.floats(min_value=1e-9, max_value=1e5)


@settings(max_examples=EXAMPLES, deadline=None)
@given(answers=st.lists(st.tuples(_UIDS, DOCUMENTS, _STEPS), min_size=1, max_size=8))
def test_no_accepted_answer_makes_the_verdicts_or_the_status_fail(
    answers: list[tuple[str, Any, float]],
) -> None:
    _book_through([(uid, _accepted(_answer(doc), 0.0, uid), step)
                   for uid, doc, step in answers])


# Every Reading the parser can accept, the edges of its bounds drawn often.
_RATES = st.one_of(st.none(), st.sampled_from([0.0, 5e-324, 1e-300, 1.0, MAX_RATE]),
                   st.floats(min_value=0, max_value=MAX_RATE))
_AMOUNTS = st.one_of(st.sampled_from([0.0, 5e-324, 1e-300, 1e-6, 1.0, MAX_COUNT]),
                     st.floats(min_value=0, max_value=MAX_COUNT))
READINGS = st.builds(
    Reading, at=st.just(0.0), calibration=st.builds(Rates, _RATES, _RATES),
    totals=st.builds(Totals, st.integers(min_value=0, max_value=2**53), _AMOUNTS, _AMOUNTS,
                     _AMOUNTS, _AMOUNTS),
    calibrated_at=st.one_of(st.none(), _AMOUNTS), pod_uid=st.just(""))


@settings(max_examples=EXAMPLES, deadline=None)
@given(answers=st.lists(st.tuples(_UIDS, st.one_of(st.none(), READINGS), _STEPS),
                        min_size=1, max_size=8))
def test_no_reading_in_the_parsers_bounds_makes_the_verdicts_or_the_status_fail(
    answers: list[tuple[str, Reading | None, float]],
) -> None:
    _book_through([(uid, None if r is None else replace(r, pod_uid=uid), step)
                   for uid, r, step in answers])


@pytest.mark.parametrize(("tokens", "seconds"), [(1e4, 5e-324), (1.0, 1e-6)],
                         ids=["infinite-rate", "rate-over-a-denormal-expectation"])
def test_rates_past_any_cpu_do_not_reach_status_as_infinities(tokens: float, seconds: float
                                                               ) -> None:
    """Accepted numbers whose quotients are not: tokens over a denormal interval
    (an infinite rate), or a fast rate over a denormal calibration (an infinite
    ratio). Neither is measured, and the status is still written."""
    book = SpeedBook(SpeedPolicy())
    book.retarget([SpeedTarget("ai/chat", 0, "n0", "chat-0", "u0", "10.0.0.1", KEY)])
    calibration = {"decode_tokens_per_second": 5e-324}
    book.record("u0", reading_from({"calibration": calibration, "totals": {}}, 0.0, "u0"), 0.0)
    after = {"requests": 1, "generated_tokens": tokens, "decode_seconds": seconds}
    book.record("u0", reading_from({"calibration": calibration, "totals": after}, 30.0, "u0"),
                30.0)
    status = speed_status(book.published_by_model()["ai/chat"][0], "2025-12-01T22:00:00Z")
    assert status.ratio is None and status.slow is False
    assert status.recent_decode in (None, MAX_RATE)
