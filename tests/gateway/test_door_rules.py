"""The door's rules, pure (gateway/door.py, gateway_contract/marks.py): a close
only with nothing in flight or queued and idle long enough; a close is a
lease that lapses by itself; arrivals at a closed door are refused and
counted, and keep nothing awake; a yield body is parsed strictly; a yield
mark signs its body and is taken once; purposes never stand in for each other."""

from __future__ import annotations

import time

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from localmodel.gateway.door import (
    MAX_IDLE_AT_LEAST,
    BadYield,
    Door,
    Reason,
    SeenMarks,
    YieldCall,
    parse_yield,
)
from localmodel.gateway.owned import RouterMarks
from localmodel.gateway_contract.headers import (
    MAX_WOKE_MS,
    WOKE_HEADER,
    WOKE_MARK_HEADER,
    woke_ms,
)
from localmodel.gateway_contract.marks import (
    MARK_HEADER,
    OWNED,
    PURPOSES,
    SLOTS,
    WOKE,
    YIELD,
    sign,
    sign_woke,
    sign_yield,
    verify,
    woke_session,
    yield_session,
)
from tests.harness.clock import Clock

pytestmark = pytest.mark.unit

KEY = Ed25519PrivateKey.generate()
HERE = ("team-a", "chat-0")


def _door(queued: int = 0, lease: float = 60.0) -> tuple[Door, Clock]:
    clock = Clock()
    return Door(lease, lambda: queued, clock), clock


SLEEP_30 = YieldCall(Reason.SLEEP, 30)


def test_a_close_is_refused_while_a_request_is_in_flight_and_accepted_once_idle_enough() -> None:
    door, clock = _door()
    assert door.arrive()
    clock.now += 100
    verdict = door.decide(SLEEP_30)
    assert verdict.status == 409
    assert verdict.body == {"in_flight": 1, "queued": 0, "idle_seconds": 0.0}
    door.end()
    clock.now += 29
    assert door.decide(SLEEP_30).body == {"in_flight": 0, "queued": 0, "idle_seconds": 29.0}
    assert not door.closed
    clock.now += 1
    assert door.decide(SLEEP_30).body == {"closed": True, "lease_seconds": 60.0}
    assert door.closed


def test_a_queued_request_refuses_a_close() -> None:
    door, clock = _door(queued=1)
    clock.now += 10_000
    assert door.decide(YieldCall(Reason.YIELD, 0)).body["queued"] == 1
    assert not door.closed


def test_a_closed_door_refuses_arrivals_counts_them_and_they_keep_nothing_awake() -> None:
    door, clock = _door()
    clock.now += 40
    assert door.decide(SLEEP_30).status == 200
    clock.now += 5
    assert not door.arrive()
    assert (door.in_flight, door.arrived) == (0, 1)
    assert door.idle_seconds() == 45.0  # a refused arrival is no work
    # A renewal judged the same way still passes: nothing could arrive.
    assert door.decide(SLEEP_30).status == 200


def test_the_close_is_a_lease_that_lapses_unless_renewed() -> None:
    door, clock = _door(lease=60.0)
    clock.now += 40
    door.decide(SLEEP_30)
    clock.now += 59
    assert door.closed
    door.decide(SLEEP_30)  # renewed: another 60 s from now
    clock.now += 59
    assert door.closed
    clock.now += 1
    assert not door.closed and door.arrive()


def test_reopen_opens_at_once_and_on_an_open_door_changes_nothing() -> None:
    door, clock = _door()
    assert door.decide(YieldCall(Reason.REOPEN, 0)).body == {"closed": False}
    clock.now += 40
    door.decide(SLEEP_30)
    assert door.decide(YieldCall(Reason.REOPEN, 0)).body == {"closed": False}
    assert not door.closed and door.arrive()


def test_idle_seconds_run_from_the_later_of_the_last_arrival_and_the_last_end() -> None:
    door, clock = _door()
    door.arrive()
    clock.now += 5
    door.arrive()
    clock.now += 5
    door.end()
    assert door.idle_seconds() == 0.0  # one still in flight
    clock.now += 5
    door.end()
    clock.now += 7
    assert door.idle_seconds() == 7.0
    assert door.activity() == {"in_flight": 0, "queued": 0, "arrived": 2, "idle_seconds": 7.0,
                               "closed": False}


@pytest.mark.parametrize(("raw", "call"), [
    (b'{"reason":"sleep","idle_at_least":1800}', YieldCall(Reason.SLEEP, 1800)),
    (b'{"reason":"yield","idle_at_least":30.0}', YieldCall(Reason.YIELD, 30)),
    (b'{"reason":"reopen"}', YieldCall(Reason.REOPEN, 0)),
    (b'{"reason":"sleep","idle_at_least":0}', YieldCall(Reason.SLEEP, 0)),
])
def test_a_yield_body_is_read(raw: bytes, call: YieldCall) -> None:
    assert parse_yield(raw) == call


@pytest.mark.parametrize("raw", [
    b"", b"[]", b"null", b'"sleep"', b"\xff\xfe", b"[" * 5000,
    b'{"reason":"sleep"}',  # idle_at_least is required to close
    b'{"reason":"nap","idle_at_least":1}',
    b'{"reason":1,"idle_at_least":1}',
    b'{"reason":"sleep","idle_at_least":-1}',
    b'{"reason":"sleep","idle_at_least":1.5}',
    b'{"reason":"sleep","idle_at_least":NaN}',
    b'{"reason":"sleep","idle_at_least":1e999}',
    b'{"reason":"sleep","idle_at_least":true}',
    b'{"reason":"sleep","idle_at_least":"30"}',
    b'{"reason":"sleep","idle_at_least":' + str(MAX_IDLE_AT_LEAST + 1).encode() + b"}",
    b'{"reason":"sleep","idle_at_least":1,"force":true}',
    b'{"reason":"sleep","idle_at_least":1}' + b" " * 300,
])
def test_a_bad_yield_body_is_refused(raw: bytes) -> None:
    with pytest.raises(BadYield):
        parse_yield(raw)


def test_a_yield_mark_is_taken_once_within_its_window() -> None:
    seen = SeenMarks(window=60)
    assert seen.take("100.sig", 100.0)
    assert not seen.take("100.sig", 130.0)
    assert seen.take("101.sig", 130.0)
    assert seen.take("100.sig", 100.0 + 121)  # forgotten once it could no longer verify


def test_the_replay_memory_is_bounded() -> None:
    seen = SeenMarks(window=60, limit=4)
    for i in range(10):
        assert seen.take(f"{i}.sig", 100.0)
    assert len(seen._seen) <= 4


def test_a_yield_mark_signs_its_body_and_its_pod() -> None:
    now = time.time()
    mark = sign_yield(KEY, *HERE, "sleep", 1800, now)
    marks = RouterMarks(KEY.public_key(), *HERE)
    taken = marks.yielding({MARK_HEADER: mark}, "sleep", 1800)
    assert taken is not None
    # Another text of the same mark is the same authorisation: taken once, whatever its text.
    assert marks.yielding({MARK_HEADER: "0" + mark}, "sleep", 1800) == taken
    assert marks.yielding({MARK_HEADER: mark}, "sleep", 1) is None  # another body
    assert marks.yielding({MARK_HEADER: mark}, "yield", 1800) is None
    assert RouterMarks(KEY.public_key(), "team-b", "chat-0").yielding(
        {MARK_HEADER: mark}, "sleep", 1800) is None
    assert RouterMarks(KEY.public_key(), "team-a", "chat-1").yielding(
        {MARK_HEADER: mark}, "sleep", 1800) is None
    stale = sign_yield(KEY, *HERE, "sleep", 1800, now - 3600)
    assert marks.yielding({MARK_HEADER: stale}, "sleep", 1800) is None
    assert marks.yielding({}, "sleep", 1800) is None


def test_no_purpose_stands_in_for_another() -> None:
    assert {YIELD, WOKE} <= set(PURPOSES) and len(set(PURPOSES)) == len(PURPOSES)
    now = time.time()
    session = yield_session("sleep", 30)
    for made in PURPOSES:
        mark = sign(KEY, made, *HERE, session, now)
        for checked in PURPOSES:
            assert verify(KEY.public_key(), mark, checked, *HERE, session, now) == (
                made == checked)
    # The marks the router already makes never close a gateway.
    for purpose in (OWNED, SLOTS):
        mark = sign(KEY, purpose, *HERE, "", now)
        assert RouterMarks(KEY.public_key(), *HERE).yielding(
            {MARK_HEADER: mark}, "sleep", 30) is None


def test_a_woke_wait_is_kept_only_with_its_signed_mark() -> None:
    now = time.time()
    marks = RouterMarks(KEY.public_key(), *HERE)
    signed = {"X-Request-Id": "r-1", WOKE_HEADER: "4200",
              WOKE_MARK_HEADER: sign_woke(KEY, *HERE, "r-1", 4200, now)}
    assert marks.woke(signed) == 4.2
    assert marks.woke({**signed, WOKE_HEADER: "9000"}) is None  # the wait is signed
    assert marks.woke({**signed, "X-Request-Id": "r-2"}) is None  # so is the request
    assert marks.woke({WOKE_HEADER: "4200", "X-Request-Id": "r-1"}) is None  # unsigned
    other = Ed25519PrivateKey.generate()
    assert marks.woke({**signed, WOKE_MARK_HEADER: sign_woke(other, *HERE, "r-1", 4200, now)}) \
        is None
    assert marks.woke({**signed, WOKE_MARK_HEADER: sign(KEY, OWNED, *HERE,
                                                         woke_session("r-1", 4200), now)}) is None
    assert RouterMarks(None, *HERE).woke(signed) is None  # no router key: none believed


@pytest.mark.parametrize(("value", "ms"), [
    ("0", 0), ("4200", 4200), (str(MAX_WOKE_MS), MAX_WOKE_MS), (str(MAX_WOKE_MS + 1), None),
    ("-1", None), ("1.5", None), ("", None), ("1e3", None), ("٣", None), (None, None),
    ("9" * 400, None),
])
def test_a_woke_header_is_whole_milliseconds_up_to_an_hour(value: str | None,
                                                           ms: int | None) -> None:
    assert woke_ms(value) == ms
