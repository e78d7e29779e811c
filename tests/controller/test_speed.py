"""Speed where it is served (localmodel/speed.py and status.with_speed), as tables:
what a replica is expected to decode (peers, or its own calibration), when it
counts as slow and when it stops (hysteresis: no flapping around the
threshold), when a gateway is read, and what reaches status and Events."""

from __future__ import annotations

from itertools import accumulate

import pytest

from localmodel.api import ConditionStatus, LocalModel, LocalModelStatus, PlacementStatus
from localmodel.events import EventReason, status_events
from localmodel.speed import (
    IDLE_READ_MAX_SECONDS,
    SOURCE_OWN,
    SOURCE_PEERS,
    Expected,
    PeerKey,
    Published,
    Rates,
    Reading,
    ReadLog,
    SlowState,
    SpeedPolicy,
    Totals,
    after_read,
    expected_speed,
    idle_read_every,
    next_read,
    publish,
    step,
    traffic,
    worth_publishing,
)
from localmodel.status import ConditionType, Reason, with_speed
from tests.builders import MakeLocalModel

pytestmark = pytest.mark.unit

XEON = ("GenuineIntel", "6", "143")
EPYC = ("AuthenticAMD", "25", "1")
KEY = PeerKey("gemma3:270m", "engine-image-a", 1, XEON)


def cal(decode: float | None, prefill: float | None = None) -> Rates:
    return Rates(decode, prefill)


# ---- what to expect ----------------------------------------------------------------

EXPECTED = [
    # (case, calibrations: replica -> (key, rates), expected decode, prefill, source, peers)
    ("no peers: its own calibration",
     {"a": (KEY, cal(25.0, 180.0))}, 25.0, 180.0, SOURCE_OWN, 0),
    ("peers: their median, not its own (it calibrated slow)",
     {"a": (KEY, cal(9.0)), "b": (KEY, cal(24.0, 100.0)), "c": (KEY, cal(26.0, 140.0)),
      "d": (KEY, cal(30.0, 150.0))}, 26.0, 140.0, SOURCE_PEERS, 3),
    ("peers on a different CPU model are not peers",
     {"a": (KEY, cal(25.0)), "b": (PeerKey(KEY.model, KEY.engine_image, 1, EPYC), cal(60.0))},
     25.0, None, SOURCE_OWN, 0),
    ("other thread counts, models or engine images are not peers",
     {"a": (KEY, cal(25.0)),
      "b": (PeerKey(KEY.model, KEY.engine_image, 2, XEON), cal(40.0)),
      "c": (PeerKey("qwen3:0.6b", KEY.engine_image, 1, XEON), cal(15.0)),
      "d": (PeerKey(KEY.model, "engine-image-b", 1, XEON), cal(10.0))},
     25.0, None, SOURCE_OWN, 0),
    ("peers not calibrated yet do not count",
     {"a": (KEY, cal(25.0)), "b": (KEY, cal(None))}, 25.0, None, SOURCE_OWN, 0),
    ("not calibrated and no peers: nothing expected",
     {"a": (KEY, cal(None))}, None, None, "", 0),
    ("not calibrated itself, peers known: theirs",
     {"b": (KEY, cal(20.0)), "c": (KEY, cal(22.0))}, 21.0, None, SOURCE_PEERS, 2),
]


@pytest.mark.parametrize(("case", "calibrations", "decode", "prefill", "source", "peers"),
                         EXPECTED, ids=[e[0] for e in EXPECTED])
def test_expected_speed(case: str, calibrations: dict[str, tuple[PeerKey, Rates]],
                        decode: float | None, prefill: float | None, source: str,
                        peers: int) -> None:
    got = expected_speed("a", KEY, calibrations)
    assert (got.decode, got.prefill, got.source, got.peers) == (decode, prefill, source, peers)


def test_a_node_whose_cpu_model_is_unknown_has_no_peers() -> None:
    unknown = PeerKey(KEY.model, KEY.engine_image, 1, None)
    got = expected_speed("a", unknown, {"a": (unknown, cal(25.0)), "b": (unknown, cal(50.0))})
    assert (got.decode, got.source) == (25.0, SOURCE_OWN)


# ---- when it is slow (hysteresis) --------------------------------------------------

FAST = SpeedPolicy(slow_after=60, clear_after=20)


def run(ratios: list[float | None], seconds: float = 10.0) -> list[bool]:
    """The slow flag after each read of `seconds` of traffic at each ratio
    (None: a read without traffic)."""
    states = accumulate(ratios, lambda s, r: step(s, r, 0 if r is None else seconds, FAST),
                        initial=SlowState())
    return [s.slow for s in list(states)[1:]]


HYSTERESIS = [
    ("steady at the expected speed: never slow", [1.0] * 10, [False] * 10),
    ("below half for 60 s of traffic: slow at the sixth read",
     [0.3] * 7, [False] * 5 + [True] * 2),
    ("hovering around 50% never turns slow (each read above resets the count)",
     [0.49, 0.51] * 8, [False] * 16),
    ("once slow, hovering around 50% never clears (clear needs 70%)",
     [0.3] * 6 + [0.49, 0.51, 0.6, 0.69] * 3, [False] * 5 + [True] * 13),
    ("clears after 20 s of traffic at or above 70%",
     [0.3] * 6 + [0.8, 0.8, 0.8], [False] * 5 + [True, True, False, False]),
    ("a dip below 70% restarts the clearing count",
     [0.3] * 6 + [0.8, 0.6, 0.8, 0.8], [False] * 5 + [True] * 4 + [False]),
    ("reads without traffic change nothing (an idle model keeps its state)",
     [0.3] * 3 + [None] * 20 + [0.3] * 3, [False] * 25 + [True]),
    ("a model with no traffic at all is never slow", [None] * 30, [False] * 30),
]


@pytest.mark.parametrize(("case", "ratios", "slow"), HYSTERESIS, ids=[h[0] for h in HYSTERESIS])
def test_slow_condition_hysteresis(case: str, ratios: list[float | None],
                                   slow: list[bool]) -> None:
    assert run(ratios) == slow


def test_no_expectation_changes_nothing() -> None:
    assert step(SlowState(True, 0, 5, 0.3), None, 30, FAST) == SlowState(True, 0, 5, 0.3)


def test_thresholds_must_leave_a_band() -> None:
    with pytest.raises(ValueError, match="slow ratio < clear ratio"):
        SpeedPolicy(slow_ratio=0.7, clear_ratio=0.5)


# ---- traffic between reads ------------------------------------------------------------


def reading(at: float, requests: int, tokens: float, seconds: float, uid: str = "u1") -> Reading:
    return Reading(at=at, calibration=cal(25.0), pod_uid=uid,
                   totals=Totals(requests, tokens, seconds, tokens * 2, seconds / 10))


TRAFFIC = [
    ("first read: no interval", None, reading(30, 5, 100, 4), None),
    ("counters moved: the interval's own rates", reading(0, 5, 100, 4),
     reading(30, 7, 160, 6), (30.0, 2, 30.0, pytest.approx(600.0))),
    ("no requests: no rates", reading(0, 5, 100, 4), reading(30, 5, 100, 4), (30.0, 0, None, None)),
    ("a restarted gateway (counters back) is no interval", reading(0, 5, 100, 4),
     reading(30, 1, 20, 1), None),
    ("another pod is no interval", reading(0, 5, 100, 4), reading(30, 9, 200, 8, uid="u2"), None),
]


@pytest.mark.parametrize(("case", "before", "after", "want"), TRAFFIC, ids=[t[0] for t in TRAFFIC])
def test_traffic_between_reads(case: str, before: Reading | None, after: Reading,
                               want: tuple[float, int, float | None, float | None] | None) -> None:
    got = traffic(before, after)
    if want is None:
        assert got is None
        return
    assert got is not None
    assert (got.seconds, got.requests, got.rates.decode, got.rates.prefill) == want


# ---- when to read ------------------------------------------------------------------------

POLICY = SpeedPolicy(interval=30, idle_max=600)

READS = [
    ("a Ready pod never read: now (its calibration)", None, 0.0),
    ("traffic last time: one interval later", ReadLog(100, 0), 130.0),
    ("no traffic (or failed) last time: idle_max later", ReadLog(100, 1), 700.0),
    ("quiet for long: still idle_max", ReadLog(100, 40), 700.0),
]


@pytest.mark.parametrize(("case", "last", "due"), READS, ids=[r[0] for r in READS])
def test_next_read(case: str, last: ReadLog | None, due: float) -> None:
    assert next_read(last, POLICY) == due


def test_an_idle_replica_is_read_at_readiness_then_once_per_idle_max() -> None:
    log: ReadLog | None = None
    at = 0.0
    times = []
    for _ in range(4):
        at = max(at, next_read(log, POLICY))
        times.append(at)
        log = after_read(log, at, busy=False)
    assert times == [0, 600, 1200, 1800]
    # Traffic found: every interval, while it lasts.
    log = after_read(log, 1830, busy=True)
    assert next_read(log, POLICY) == 1860
    log = after_read(log, 1860, busy=False)
    assert next_read(log, POLICY) == 2460


# ---- what reaches status ---------------------------------------------------------------


def pub(recent: float | None, at: float, slow: bool = False, expected: float = 25.0,
        source: str = SOURCE_OWN) -> Published:
    return Published(cal(25.0, 180.0), cal(recent, 150.0), Expected(expected, 180.0, source),
                     slow, at)


PUBLISH = [
    ("first numbers", None, pub(24.0, 0), True),
    ("within 10% and young: not written", pub(24.0, 0), pub(25.0, 30), False),
    ("moved more than 10%", pub(24.0, 0), pub(20.0, 30), True),
    ("older than publish_max", pub(24.0, 0), pub(24.0, 300), True),
    ("turned slow", pub(24.0, 0), pub(24.0, 30, slow=True), True),
    ("expectation's source changed", pub(24.0, 0), pub(24.0, 30, source=SOURCE_PEERS), True),
    ("traffic stopped: recent rate unknown", pub(24.0, 0), pub(None, 30), True),
]


@pytest.mark.parametrize(("case", "old", "new", "write"), PUBLISH, ids=[p[0] for p in PUBLISH])
def test_worth_publishing(case: str, old: Published | None, new: Published, write: bool) -> None:
    assert worth_publishing(old, new, POLICY) is write
    assert publish(old, new, POLICY) == (new if write else old)


def chat_with(status: LocalModelStatus | None = None) -> LocalModel:
    """The model `chat` carrying `status` (as the operator last wrote it)."""
    return CHAT.obj().model_copy(update={"status": status})


CHAT = MakeLocalModel("chat").generation(1).spec(model="gemma3:270m", cpu=1, replicas=2)
PLACED = LocalModelStatus(placements=[
    PlacementStatus(replica=0, node="n0", pod="chat-0", threads=1, cpu=1, memory="1Gi"),
    PlacementStatus(replica=1, node="n1", pod="chat-1", threads=1, cpu=1, memory="1Gi"),
])
NOW = "2026-12-01T22:00:00Z"


def slow_condition(status: LocalModelStatus) -> tuple[str, str, str] | None:
    for c in status.conditions:
        if c.type == ConditionType.SLOW_REPLICA.value:
            return c.status.value, c.reason, c.message
    return None


def test_no_replica_read_yet_adds_nothing() -> None:
    assert with_speed(PLACED, {}, FAST, chat_with(), NOW) == PLACED


def test_speed_in_placements_and_the_condition_names_replica_node_and_both_rates() -> None:
    speeds = {0: (pub(24.0, 0), NOW), 1: (pub(8.04, 0, slow=True), NOW)}
    got = with_speed(PLACED, speeds, FAST, chat_with(), NOW)
    s0, s1 = (p.speed for p in got.placements)
    assert s0 is not None and s1 is not None
    assert (s0.calibration_decode, s0.recent_decode, s0.expected_decode, s0.ratio, s0.slow) == (
        25.0, 24.0, 25.0, 0.96, False)
    assert (s1.recent_decode, s1.ratio, s1.slow, s1.expected_source, s1.measured_at) == (
        8.04, 0.32, True, SOURCE_OWN, NOW)
    status, reason, message = slow_condition(got) or ("", "", "")
    assert (status, reason) == ("True", Reason.BELOW_EXPECTED_SPEED.value)
    for part in ("replica 1", "node n1", "8.04 tok/s", "expected 25 tok/s", "ratio 0.32",
                 "below 0.5 for 60 s of traffic"):
        assert part in message, message
    assert "replica 0" not in message


def test_events_when_slow_starts_and_when_it_clears_and_none_in_between() -> None:
    fine = with_speed(PLACED, {0: (pub(24.0, 0), NOW)}, FAST, chat_with(), NOW)
    slow = with_speed(PLACED, {0: (pub(8.0, 0, slow=True), NOW)}, FAST, chat_with(fine), NOW)
    again = with_speed(PLACED, {0: (pub(7.0, 0, slow=True), NOW)}, FAST, chat_with(slow), NOW)
    clear = with_speed(PLACED, {0: (pub(24.0, 0), NOW)}, FAST, chat_with(again), NOW)
    assert [e.reason for e in status_events(fine, slow)] == [EventReason.SLOW_REPLICA]
    assert status_events(fine, slow)[0].warning
    assert "8 tok/s" in status_events(fine, slow)[0].message
    assert status_events(slow, again) == []
    assert [e.reason for e in status_events(again, clear)] == [EventReason.SPEED_RECOVERED]
    assert slow_condition(clear) is not None and slow_condition(clear)[0] == "False"  # type: ignore[index]


def test_an_operator_that_read_nothing_yet_keeps_what_status_says() -> None:
    read = with_speed(PLACED, {0: (pub(8.0, 0, slow=True), NOW)}, FAST, chat_with(), NOW)
    restarted = with_speed(PLACED, {}, FAST, chat_with(read), NOW)
    assert restarted.placements == read.placements
    assert slow_condition(restarted) == slow_condition(read)
    # ... but not for a replica that moved to another pod or node.
    moved = LocalModelStatus(placements=[PLACED.placements[0].model_copy(update={"node": "n9"})])
    assert with_speed(moved, {}, FAST, chat_with(read), NOW) == moved
    assert ConditionStatus.TRUE.value == slow_condition(read)[0]  # type: ignore[index]


# A model with spec.idle is read at least every min(after / 4, 60 s), whatever
# its traffic; a model without keeps the cadence above.
IDLE_READS = [
    ("never read: now", None, 1800.0, 0.0),
    ("quiet, after 30m: 60 s, not idle_max", ReadLog(100, 3), 1800.0, 160.0),
    ("quiet, after 2m: a quarter of it", ReadLog(100, 3), 120.0, 130.0),
    ("traffic, after 1m: 15 s, sooner than the interval", ReadLog(100, 0), 60.0, 115.0),
    ("traffic, after 7d: the interval, already sooner than 60 s", ReadLog(100, 0), 604800.0,
     130.0),
]


@pytest.mark.parametrize(("case", "last", "after", "due"), IDLE_READS,
                         ids=[r[0] for r in IDLE_READS])
def test_a_model_with_idle_is_read_at_least_every_quarter_of_after_up_to_a_minute(
        case: str, last: ReadLog | None, after: float, due: float) -> None:
    assert next_read(last, POLICY, idle_read_every(after)) == due


def test_idle_read_every_is_a_quarter_of_after_and_never_over_a_minute() -> None:
    assert [idle_read_every(s) for s in (60, 120, 240, 1800, 604800)] == [15, 30, 60, 60, 60]
    assert IDLE_READ_MAX_SECONDS == 60
