"""What the idle shell decides without I/O (idle/signals.py): which router
pods to poll from the router Service's slices (hostile entries left out), the
routers' held requests summed, the backoff, every way a gateway can answer a
close, and which closes to renew."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localmodel.gateway_contract.waiting_answer import MAX_HELD, Waiting, WaitingModel
from localmodel.idle.asks import CloseAsk, Closed, CloseResult
from localmodel.idle.signals import (
    BACKOFF_MAX_S,
    CLOSE_ANSWER_MAX_BYTES,
    MAX_HOLD_S,
    MAX_ROUTERS,
    RouterPod,
    closed_from_answer,
    merge_waiting,
    pod_key,
    renewals,
    retry_in,
    router_pods,
    yield_body,
)

pytestmark = pytest.mark.unit

SLEEP = CloseAsk("ai", "chat", "chat-0", "sleep", 1800, ip="10.0.0.5")
YIELD = CloseAsk("ai", "batch", "batch-0", "yield", 30, for_="ai/chat", ip="10.0.0.6")
REOPEN = CloseAsk("ai", "chat", "chat-1", "reopen", ip="10.0.0.7")


def endpoint(ip: Any, name: str = "", ready: Any = True) -> dict[str, Any]:
    out: dict[str, Any] = {"addresses": [ip], "conditions": {"ready": ready}}
    if name:
        out["targetRef"] = {"kind": "Pod", "name": name}
    return out


def slice_(*endpoints: Any, kind: str = "IPv4") -> dict[str, Any]:
    return {"addressType": kind, "endpoints": list(endpoints)}


def test_router_pods_are_the_ready_endpoints_once_each_and_the_rest_is_left_out() -> None:
    pods = router_pods([
        slice_(endpoint("10.0.0.2", "router-b"), endpoint("10.0.0.1", "router-a"),
               endpoint("10.0.0.3", "router-c", ready=False),
               endpoint("10.0.0.4", "router-d", ready=None)),  # unknown reads as ready
        slice_(endpoint("10.0.0.1", "router-a")),  # the same pod in a second slice
        slice_(endpoint("not-an-ip"), endpoint(7), "garbage", {"endpoints": "x"}),
        slice_(endpoint("fd00::1", "router-e"), kind="IPv6"),
        slice_(endpoint("10.0.0.9"), kind="FQDN"),
        None, 42,
    ])
    assert pods == (RouterPod("router-a", "10.0.0.1"), RouterPod("router-b", "10.0.0.2"),
                    RouterPod("router-d", "10.0.0.4"), RouterPod("router-e", "fd00::1"))
    assert pods[3].admin_url == "http://[fd00::1]:8090"
    assert router_pods([slice_(endpoint("10.0.0.8"))]) == (RouterPod("10.0.0.8", "10.0.0.8"),)


def test_router_pods_are_bounded() -> None:
    many = slice_(*(endpoint(f"10.1.{i // 250}.{i % 250}", f"r{i:04}") for i in range(1000)))
    assert len(router_pods([many])) == MAX_ROUTERS


def test_held_requests_are_summed_over_routers_and_the_oldest_kept() -> None:
    merged = merge_waiting({
        "router-a": Waiting(3, (WaitingModel("ai/chat", 2, 1, 4.0),
                                WaitingModel("ai/embed", 1, 0, 1.0))),
        "router-b": Waiting(9, (WaitingModel("ai/chat", 3, 3, 9.5),)),
    })
    assert list(merged) == ["ai/chat", "ai/embed"]
    assert merged["ai/chat"] == WaitingModel("ai/chat", 5, 4, 9.5)
    assert merged["ai/embed"] == WaitingModel("ai/embed", 1, 0, 1.0)
    assert merge_waiting({}) == {}


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.tuples(st.sampled_from(["a/x", "a/y", "b/x"]),
                                   st.integers(0, MAX_HELD)), max_size=3), max_size=5))
def test_a_merge_stays_inside_the_readers_bounds(routers: list[list[tuple[str, int]]]) -> None:
    answers = {f"r{i}": Waiting(i, tuple(WaitingModel(m, h, h, 1.0)
                                         for m, h in dict(entries).items()))
               for i, entries in enumerate(routers)}
    for m in merge_waiting(answers).values():
        assert 0 <= m.foreground <= m.held <= MAX_HELD


def test_a_failing_router_is_asked_again_later_each_time_up_to_a_bound() -> None:
    waits = [retry_in(n) for n in range(0, 12)]
    assert waits[:4] == [0.0, 1.0, 2.0, 4.0]
    assert waits == sorted(waits) and waits[-1] == BACKOFF_MAX_S
    assert retry_in(10**6) == BACKOFF_MAX_S


@pytest.mark.parametrize(("ask", "status", "body", "result", "counts"), [
    (SLEEP, 200, b'{"closed": true, "lease_seconds": 60.0}', CloseResult.CLOSED, (0, 0)),
    (YIELD, 200, b'{"closed": true, "lease_seconds": 60}', CloseResult.CLOSED, (0, 0)),
    (REOPEN, 200, b'{"closed": false}', CloseResult.OPENED, (0, 0)),
    (SLEEP, 409, b'{"in_flight": 2, "queued": 1, "idle_seconds": 0}', CloseResult.BUSY, (2, 1)),
    (SLEEP, 409, b"not json", CloseResult.BUSY, (0, 0)),  # 409 is busy, counts or not
    (SLEEP, 409, b'{"in_flight": -4, "queued": 1e300}', CloseResult.BUSY, (0, 0)),
    (SLEEP, 409, b'{"in_flight": 10000000000}', CloseResult.BUSY, (1_000_000, 0)),
    (SLEEP, 403, b"", CloseResult.FORBIDDEN, (0, 0)),
    (SLEEP, 200, b'{"closed": false}', CloseResult.BAD, (0, 0)),  # asked to close, opened
    (REOPEN, 200, b'{"closed": true, "lease_seconds": 60}', CloseResult.BAD, (0, 0)),
    (SLEEP, 200, b'{"closed": true}', CloseResult.BAD, (0, 0)),  # no lease
    (SLEEP, 200, b'{"closed": true, "lease_seconds": NaN}', CloseResult.BAD, (0, 0)),
    (SLEEP, 200, b'{"closed": true, "lease_seconds": 1e9}', CloseResult.BAD, (0, 0)),
    (SLEEP, 200, b'{"closed": "yes", "lease_seconds": 60}', CloseResult.BAD, (0, 0)),
    (SLEEP, 200, b"[true]", CloseResult.BAD, (0, 0)),
    (SLEEP, 200, b"\xff\xfe", CloseResult.BAD, (0, 0)),
    (SLEEP, 200, b'{"closed": true, "lease_seconds": 60, "pad": "'
     + b"x" * CLOSE_ANSWER_MAX_BYTES + b'"}', CloseResult.BAD, (0, 0)),
    (SLEEP, 500, b'{"closed": true, "lease_seconds": 60}', CloseResult.BAD, (0, 0)),
    (SLEEP, 302, b"", CloseResult.BAD, (0, 0)),
])
def test_every_answer_to_a_close_reads_as_one_result(
        ask: CloseAsk, status: int, body: bytes, result: CloseResult,
        counts: tuple[int, int]) -> None:
    closed = closed_from_answer(ask, status, body, 100.0)
    assert (closed.ask, closed.result, closed.at) == (ask, result, 100.0)
    assert (closed.in_flight, closed.queued) == counts
    assert closed.lease_seconds == (60.0 if result is CloseResult.CLOSED else 0.0)


def test_the_body_carries_the_reason_and_the_quiet_time() -> None:
    assert yield_body(SLEEP) == b'{"reason": "sleep", "idle_at_least": 1800}'
    assert pod_key(YIELD) == "ai/batch-0"


def test_a_close_is_renewed_after_a_third_of_its_lease_while_needed_and_not_forever() -> None:
    closed = Closed(SLEEP, CloseResult.CLOSED, 1000.0, lease_seconds=60.0)
    busy = Closed(YIELD, CloseResult.BUSY, 1000.0, in_flight=1)
    closes = {pod_key(SLEEP): closed, pod_key(YIELD): busy}
    first = {pod_key(SLEEP): 1000.0}
    assert renewals(closes, first, 1010.0) == []  # too soon
    assert renewals(closes, first, 1020.0) == [SLEEP]  # a third of 60 s: never the busy one
    assert renewals(closes, first, 1020.0, keep=frozenset()) == []  # the release is over
    assert renewals(closes, first, 1020.0, keep=frozenset({pod_key(SLEEP)})) == [SLEEP]
    assert renewals(closes, {pod_key(SLEEP): 1000.0 - MAX_HOLD_S}, 1020.0) == []  # lapses
