"""The operator's book of replica speeds (controller/speed.py `SpeedBook`): what
is read when, what a read changes, and what reaches status and the metric."""

from __future__ import annotations

import pytest

from localmodel.controller.speed import SpeedBook, SpeedTarget
from localmodel.gateway_contract.speed_answer import BadDocument, reading_from
from localmodel.speed import SOURCE_OWN, SOURCE_PEERS, SpeedPolicy
from tests.builders import PEER_KEY

pytestmark = pytest.mark.unit

KEY = PEER_KEY
POLICY = SpeedPolicy(interval=10, idle_max=80, slow_after=30, clear_after=20, publish_max=60)


def target(replica: int, uid: str, node: str = "n0", vouched: bool = True) -> SpeedTarget:
    return SpeedTarget("ai/chat", replica, node, f"chat-{replica}", uid, "10.0.0.1", KEY,
                       vouched=vouched)


def doc(calibration: float | None, requests: int, tokens: float, seconds: float
        ) -> dict[str, object]:
    return {
        "calibration": None if calibration is None else {
            "decode_tokens_per_second": calibration, "prefill_tokens_per_second": 200.0,
            "at": 1.0},
        "totals": {"requests": requests, "generated_tokens": tokens, "decode_seconds": seconds,
                   "prompt_tokens": 10 * requests, "prefill_seconds": 0.05 * requests},
    }


def test_a_new_ready_replica_is_read_at_once_and_its_calibration_published() -> None:
    book = SpeedBook(POLICY)
    assert book.retarget([target(0, "u0")]) is True
    assert [t.uid for t in book.due(0)] == ["u0"]
    assert book.record("u0", reading_from(doc(25.0, 0, 0, 0), 0, "u0"), 0) is True
    p = book.published_by_model()["ai/chat"][0]
    assert (p.calibration.decode, p.expected.decode, p.expected.source, p.slow) == (
        25.0, 25.0, SOURCE_OWN, False)
    assert book.due(5) == [] and book.next_due() == 80  # no traffic yet: idle_max
    assert book.retarget([target(0, "u0")]) is False  # nothing new to read


def test_idle_replicas_are_read_once_per_idle_max_and_failures_too() -> None:
    book = SpeedBook(POLICY)
    book.retarget([target(0, "u0"), target(1, "u1")])
    now = 0.0
    reads: dict[str, list[float]] = {"u0": [], "u1": []}
    while now <= 300:
        for t in book.due(now):
            reads[t.uid].append(now)
            # u0 answers with no traffic, u1 does not answer at all.
            book.record(t.uid, reading_from(doc(25.0, 0, 0, 0), now, t.uid)
                        if t.uid == "u0" else None, now)
        now += 1
    assert reads["u0"] == [0, 80, 160, 240]  # at readiness, then once per idle_max
    assert reads["u1"] == reads["u0"]


def test_slow_after_the_window_of_traffic_then_clear_and_the_ratio_metric() -> None:
    book = SpeedBook(POLICY)
    book.retarget([target(0, "u0")])
    book.record("u0", reading_from(doc(25.0, 0, 0, 0), 0, "u0"), 0)
    requests, tokens, seconds = 0, 0.0, 0.0
    slow = []
    for i in range(1, 13):
        rate = 8.0 if i <= 6 else 24.0  # a third of the calibration, then back
        requests, tokens, seconds = requests + 1, tokens + 80, seconds + 80 / rate
        book.record("u0", reading_from(doc(25.0, requests, tokens, seconds), 10 * i, "u0"),
                    10 * i)
        slow.append(book.published_by_model()["ai/chat"][0].slow)
    # 30 s of traffic below half: slow at the third read; clear after 20 s at 96%.
    assert slow == [False, False, True, True, True, True, True, False, False, False, False, False]
    assert book.ratios() == {("ai", "chat", "0", "n0"): 0.96}


def test_peers_set_the_expectation_and_a_gone_pod_is_forgotten() -> None:
    book = SpeedBook(POLICY)
    book.retarget([target(0, "u0"), target(1, "u1", "n1"), target(2, "u2", "n2")])
    for uid, cal in (("u0", 10.0), ("u1", 24.0), ("u2", 26.0)):
        book.record(uid, reading_from(doc(cal, 0, 0, 0), 0, uid), 0)
    assert book.expected("u0").decode == 25.0 and book.expected("u0").source == SOURCE_PEERS
    book.retarget([target(0, "u0")])  # the others' pods went away
    assert book.expected("u0").source == SOURCE_OWN
    assert list(book.published_by_model()["ai/chat"]) == [0]


def test_only_vouched_replicas_are_peers_and_an_outlier_among_them_is_dropped() -> None:
    book = SpeedBook(POLICY)
    # u3 and u6 run a tenant's own gateway (not vouched for): their plausible 30
    # tok/s would pull the median to 26 were they peers; u4 is vouched for but
    # an outlier.
    book.retarget([target(0, "u0"), target(1, "u1", "n1"), target(2, "u2", "n2"),
                   target(3, "u3", "n3", vouched=False), target(4, "u4", "n4"),
                   target(5, "u5", "n5"), target(6, "u6", "n6", vouched=False)])
    for uid, cal in (("u0", 10.0), ("u1", 24.0), ("u2", 26.0), ("u3", 30.0), ("u4", 900.0),
                     ("u5", 25.0), ("u6", 30.0)):
        book.record(uid, reading_from(doc(cal, 0, 0, 0), 0, uid), 0)
    got = book.expected("u0")
    assert (got.decode, got.source, got.peers) == (25.0, SOURCE_PEERS, 3)
    # The unvouched replica is judged against the vouched peers...
    assert book.expected("u3").decode == 25.0
    # ...and alone, against its own calibration: it sets only its own expectation.
    book.retarget([target(3, "u3", "n3", vouched=False), target(1, "u1", "n1")])
    assert (book.expected("u3").decode, book.expected("u3").source) == (24.0, SOURCE_PEERS)
    assert (book.expected("u1").decode, book.expected("u1").source) == (24.0, SOURCE_OWN)


def test_a_restarted_gateway_is_not_read_as_negative_traffic() -> None:
    book = SpeedBook(POLICY)
    book.retarget([target(0, "u0")])
    book.record("u0", reading_from(doc(25.0, 50, 4000, 160), 0, "u0"), 0)
    book.record("u0", reading_from(doc(25.0, 1, 10, 5), 10, "u0"), 10)
    assert book.by_uid["u0"].state.ratio is None


@pytest.mark.parametrize("bad", [None, [], {"calibration": {}}, "text"])
def test_what_is_not_a_speed_document_is_refused(bad: object) -> None:
    with pytest.raises(BadDocument):
        reading_from(bad, 0, "u0")


def test_a_replica_of_a_model_with_idle_is_read_every_read_every_when_quiet() -> None:
    book = SpeedBook(POLICY)
    book.retarget([SpeedTarget("ai/chat", 0, "n0", "chat-0", "u0", "10.0.0.1", KEY,
                               read_every=15.0), target(0, "u1")])
    now, reads = 0.0, {"u0": [], "u1": []}  # type: ignore[var-annotated]
    while now <= 80:
        for t in book.due(now):
            reads[t.uid].append(now)
            book.record(t.uid, reading_from(doc(25.0, 0, 0, 0), now, t.uid), now)
        now += 1
    assert reads["u0"] == [0, 15, 30, 45, 60, 75]
    assert reads["u1"] == [0, 80]  # without idle: idle_max, as before
    assert book.next_due() == 90  # u0 next, 15 s after its last read
