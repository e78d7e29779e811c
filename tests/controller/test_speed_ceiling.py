"""SlowReplica against the ceiling as well as peers and own calibration (speed.py `with_ceiling`,
the book): the expected decode rate is the higher of the calibrations' and CEILING_SHARE of
the node's ceiling, and status says which and what the ceiling is."""

from __future__ import annotations

import pytest

from localmodel.controller.speed import SpeedBook, SpeedTarget
from localmodel.gateway_contract.speed_answer import reading_from
from localmodel.speed import (
    CEILING_SHARE,
    SOURCE_CEILING,
    SOURCE_OWN,
    SOURCE_PEERS,
    Ceiling,
    Expected,
    SpeedPolicy,
    with_ceiling,
)
from localmodel.status import speed_status
from tests.builders import PEER_KEY
from tests.controller.test_speed_book import doc

pytestmark = pytest.mark.unit

POLICY = SpeedPolicy(interval=10, idle_max=80, slow_after=30, clear_after=20, publish_max=60)
CEILING = Ceiling(40.0, "predicted: 20 GB/s / 0.5 GB per token")


@pytest.mark.parametrize(("calibrated", "ceiling", "decode", "source"), [
    (Expected(25.0, 200.0, SOURCE_PEERS, 3), CEILING, 25.0, SOURCE_PEERS),  # peers above 20
    (Expected(10.0, 200.0, SOURCE_OWN), CEILING, 20.0, SOURCE_CEILING),  # own, under 0.5 x 40
    (Expected(None, None, ""), CEILING, 20.0, SOURCE_CEILING),  # not calibrated yet
    (Expected(10.0, 200.0, SOURCE_OWN), None, 10.0, SOURCE_OWN),  # the node never measured
])
def test_the_expected_decode_is_the_higher_of_calibration_and_the_ceilings_share(
        calibrated: Expected, ceiling: Ceiling | None, decode: float, source: str) -> None:
    got = with_ceiling(calibrated, ceiling)
    assert (got.decode, got.source, got.ceiling) == (decode, source, ceiling)
    assert got.prefill == calibrated.prefill  # prefill is not bandwidth-bound: untouched
    assert CEILING_SHARE == 0.5


def test_expected_source_names_what_won_and_the_ceiling() -> None:
    peers = with_ceiling(Expected(25.0, 200.0, SOURCE_PEERS, 3), CEILING)
    assert peers.describe == ("median calibration of 3 peer replicas; ceiling 40 tok/s "
                              "(predicted: 20 GB/s / 0.5 GB per token)")
    ceiling = with_ceiling(Expected(10.0, 200.0, SOURCE_OWN), CEILING)
    assert ceiling.describe.startswith("0.5 of the ceiling; ceiling 40 tok/s (predicted: ")
    assert Expected(10.0, 200.0, SOURCE_OWN).describe == "own calibration"


def target(ceiling: Ceiling | None) -> SpeedTarget:
    return SpeedTarget("ai/chat", 0, "n0", "chat-0", "u0", "10.0.0.1", PEER_KEY, vouched=True,
                       ceiling=ceiling)


def run_traffic(book: SpeedBook, rate: float, seconds: int) -> None:
    """Readiness at 0 (calibration 10 tok/s), then a read every 10 s of traffic at `rate`."""
    book.record("u0", reading_from(doc(10.0, 0, 0, 0), 0, "u0"), 0)
    for k in range(1, seconds // 10 + 1):
        book.record("u0", reading_from(doc(10.0, k, rate * 10 * k, 10.0 * k), 10 * k, "u0"),
                    10 * k)


def test_a_replica_as_slow_as_its_own_calibration_is_slow_against_its_nodes_ceiling() -> None:
    # Calibrated at 10 tok/s on a node whose memory allows 40: decoding at 7 is 0.7 of its own
    # calibration (not slow), and 0.35 of 0.5 x 40 (slow).
    alone = SpeedBook(POLICY)
    alone.retarget([target(None)])
    run_traffic(alone, 7.0, 60)
    assert alone.published_by_model()["ai/chat"][0].slow is False
    judged = SpeedBook(POLICY)
    judged.retarget([target(CEILING)])
    run_traffic(judged, 7.0, 60)
    published = judged.published_by_model()["ai/chat"][0]
    assert published.slow is True
    status = speed_status(published, "2026-12-07T04:00:00Z")
    assert status.expected_decode == 20.0 and status.ratio == pytest.approx(0.35)
    assert "ceiling 40 tok/s" in status.expected_source


def test_a_replica_near_its_ceiling_is_not_slow() -> None:
    book = SpeedBook(POLICY)
    book.retarget([target(CEILING)])
    run_traffic(book, 22.0, 60)  # 0.55 of the ceiling: llama-server's own range here
    assert book.published_by_model()["ai/chat"][0].slow is False


def test_a_ceiling_learnt_after_the_calibration_is_published_at_the_next_read() -> None:
    # The node probe measures the bandwidth only on a quiet node: often after a replica's
    # calibration. The expected rate stays the calibration's (above 0.5 of this ceiling), and
    # status must still come to name the ceiling at the next read, not at the next traffic.
    book = SpeedBook(POLICY)
    book.retarget([target(None)])
    book.record("u0", reading_from(doc(30.0, 0, 0, 0), 0, "u0"), 0)
    first = book.published_by_model()["ai/chat"][0]
    assert first.expected.ceiling is None and first.expected.decode == 30.0
    book.retarget([target(CEILING)])
    assert book.record("u0", reading_from(doc(30.0, 0, 0, 0), 10, "u0"), 10) is True
    now = book.published_by_model()["ai/chat"][0]
    assert now.expected.decode == 30.0 and now.expected.source == SOURCE_OWN
    assert "ceiling 40 tok/s" in speed_status(now, "2026-12-07T04:00:00Z").expected_source
    # Unchanged since: nothing new to write.
    assert book.record("u0", reading_from(doc(30.0, 0, 0, 0), 20, "u0"), 20) is False
