"""A model with spec.idle asleep, waking or awake: Ready, Placed and Awake as
`idle_status.with_idle` writes them over the plain path's status, and nothing
changed for a model without idle."""

from __future__ import annotations

import pytest

from localmodel.api import (
    ConditionStatus,
    IdleHome,
    IdleStatus,
    IdleWake,
    LocalModel,
    LocalModelStatus,
)
from localmodel.desired import desired_state
from localmodel.gaps import Gap, with_gap
from localmodel.idle_status import IdleReport, with_idle
from localmodel.status import Reason, status_changed, with_progress
from tests.builders import MakeLocalModel, MakeNode

pytestmark = pytest.mark.unit

NOW = "2026-12-01T21:00:00Z"
LATER = "2026-12-01T22:00:00Z"
NODE = MakeNode("small-0").cpu_flags({"AVX2"}).facts()
IDLE = {"after": "30m"}
SLEEPER = MakeLocalModel("qwen3").uid("u1").generation(4).cpu(4).spec(idle=IDLE)
HOME = IdleHome(replica=0, node="small-0", claim="qwen3-weights-0")
ASLEEP = IdleStatus(state="Asleep", since=NOW, resident=False, homes=[HOME])
WAKING = IdleStatus(state="Waking", since=LATER, resident=False, homes=[HOME],
                    wake=IdleWake(wanted_at=LATER, held=2, node="small-0"))


def plain(lm: LocalModel, ready: dict[int, bool], placed: bool = True, now: str = NOW,
          gap: Gap | None = None) -> LocalModelStatus:
    """The plain path's status: placed on small-0 (or on no node), its roll, a gap."""
    [r] = desired_state([lm], [NODE] if placed else [], now=now,
                        ready={lm.key: ready}).models
    status = with_progress(r.status, None, lm, now)
    return with_gap(status, gap, lm, now)


def conditions(s: LocalModelStatus) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status.value, c.reason) for c in s.conditions}


def message(s: LocalModelStatus, type_: str) -> str:
    return next(c.message for c in s.conditions if c.type == type_)


def test_a_model_without_idle_or_without_a_report_keeps_its_status() -> None:
    never = MakeLocalModel("embed").uid("u2").cpu(4).obj()
    status = plain(never, {0: True})
    assert with_idle(status, IdleReport(ASLEEP, Reason.ASLEEP), never, NOW) is status
    sleeper = SLEEPER.obj()
    status = plain(sleeper, {0: True})
    assert with_idle(status, None, sleeper, NOW) is status


def test_released_asleep_reads_ready_and_placed_and_never_stalled() -> None:
    lm = SLEEPER.obj()
    got = with_idle(plain(lm, {}, placed=False), IdleReport(ASLEEP, Reason.ASLEEP), lm, NOW)
    assert conditions(got) == {
        "Valid": ("True", "SpecValid"), "Placed": ("True", "Asleep"),
        "Ready": ("True", "Asleep"), "Progressing": ("False", "UpToDate"),
        "Awake": ("False", "Asleep")}
    assert message(got, "Ready") == (
        f"asleep since {NOW} (no request for 30m); a request through the router wakes it")
    assert message(got, "Placed") == "replica 0 asleep; its claim qwen3-weights-0 is on small-0"
    assert got.idle == ASLEEP


def test_resident_asleep_is_still_placed_and_says_its_pod_serves() -> None:
    lm = SLEEPER.obj()
    resident = ASLEEP.model_copy(update={"resident": True})
    got = with_idle(plain(lm, {0: True}), IdleReport(resident, Reason.ASLEEP), lm, NOW)
    assert conditions(got)["Placed"] == ("True", "AllReplicasPlaced")
    assert conditions(got)["Ready"] == ("True", "Asleep")
    assert "still serve at once" in message(got, "Ready")


def test_waking_reads_ready_while_its_pods_start_and_its_time_holds_from_asleep() -> None:
    lm = SLEEPER.obj()
    asleep = with_idle(plain(lm, {}, placed=False), IdleReport(ASLEEP, Reason.ASLEEP), lm, NOW)
    lm = lm.model_copy(update={"status": asleep})
    got = with_idle(plain(lm, {0: False}, now=LATER), IdleReport(WAKING, Reason.WAKING), lm,
                    LATER)
    assert conditions(got)["Ready"] == ("True", "Waking")
    assert conditions(got)["Placed"] == ("True", "AllReplicasPlaced")
    assert "Reconciling" not in conditions(got) and "Stalled" not in conditions(got)
    assert message(got, "Ready") == f"waking on small-0 for 2 held requests since {LATER}"
    ready = next(c for c in got.conditions if c.type == "Ready")
    assert ready.last_transition_time == NOW  # True all along: Current throughout


def test_a_wake_that_waits_for_a_node_is_ready_and_placed_asleep_not_stalled() -> None:
    lm = SLEEPER.obj()
    waiting = WAKING.model_copy(update={"wake": IdleWake(
        wanted_at=LATER, held=1, message="small-0 is held by ai/embed, which never sleeps")})
    got = with_idle(plain(lm, {}, placed=False, now=LATER),
                    IdleReport(waiting, Reason.WAITING_FOR_NODE), lm, LATER)
    assert conditions(got) == {
        "Valid": ("True", "SpecValid"), "Placed": ("True", "Asleep"),
        "Ready": ("True", "Waking"), "Progressing": ("False", "UpToDate"),
        "Awake": ("False", "WaitingForNode")}
    assert message(got, "Awake") == (
        "waiting for a node: small-0 is held by ai/embed, which never sleeps")
    assert "(no node yet) for 1 held request since" in message(got, "Ready")


def test_a_wake_that_hits_a_gap_stays_not_ready_with_the_gap() -> None:
    lm = SLEEPER.obj()
    gap = Gap(Reason.CONTAINER_FAILING, "replica 0: pod qwen3-0, container engine: CrashLoop")
    got = with_idle(plain(lm, {0: False}, gap=gap), IdleReport(WAKING, Reason.WAKING), lm, NOW)
    assert conditions(got)["Ready"] == ("False", "ContainerFailing")
    assert conditions(got)["Reconciling"] == ("True", "ContainerFailing")
    assert conditions(got)["Awake"] == ("False", "Waking")


def test_a_waking_pod_the_scheduler_cannot_place_yet_is_the_wake_waiting_not_a_gap() -> None:
    # On the real node the waker's pod was created while the yielding model's
    # pod was still terminating: Unschedulable for a moment, part of the wake.
    lm = SLEEPER.obj()
    gap = Gap(Reason.UNSCHEDULABLE, "replica 0: the scheduler left pod qwen3-0 Unschedulable: "
              "0/1 nodes are available: 1 Insufficient memory")
    got = with_idle(plain(lm, {0: False}, gap=gap), IdleReport(WAKING, Reason.WAKING), lm, NOW)
    assert conditions(got)["Ready"] == ("True", "Waking")
    assert "Reconciling" not in conditions(got) and "Stalled" not in conditions(got)
    # Asleep, the same gap is a gap (it has no pod to wait for a node).
    asleep = with_idle(plain(lm, {0: False}, gap=gap), IdleReport(ASLEEP, Reason.ASLEEP), lm, NOW)
    assert conditions(asleep)["Ready"] == ("False", "Unschedulable")


@pytest.mark.parametrize(("reason", "ok", "words"), [
    (Reason.SERVING, "True", "it sleeps after 30m without a request"),
    (Reason.IDLE, "True", f"no request since {NOW}; it sleeps after 30m"),
    (Reason.ROUTER_OFF, "True", "nothing would hold a request while it wakes"),
    (Reason.SLEEP_PREVENTED, "True", "its gateway could not be reached"),
])
def test_an_awake_model_keeps_its_plain_status_and_says_why_it_is_awake(
        reason: Reason, ok: str, words: str) -> None:
    lm = SLEEPER.obj()
    status = plain(lm, {0: True})
    awake = IdleStatus(state="Awake", since=NOW, last_request_at=NOW)
    got = with_idle(status, IdleReport(awake, reason), lm, NOW)
    assert got.conditions[:-1] == status.conditions  # Ready, Placed, ... as they were
    assert conditions(got)["Awake"] == (ok, reason.value)
    assert words in message(got, "Awake")


def test_an_invalid_spec_keeps_its_invalid_status() -> None:
    lm = SLEEPER.spec(model="nosuch/model:7b").obj()
    status = plain(lm, {})
    assert conditions(status)["Valid"] == ("False", "InvalidSpec")
    assert with_idle(status, IdleReport(ASLEEP, Reason.ASLEEP), lm, NOW) is status


def test_a_state_with_a_reason_it_cannot_carry_is_refused() -> None:
    with pytest.raises(ValueError, match="state Asleep cannot be Awake reason Serving"):
        IdleReport(ASLEEP, Reason.SERVING)


def test_the_same_sleep_again_later_needs_no_status_write() -> None:
    lm = SLEEPER.obj()
    first = with_idle(plain(lm, {}, placed=False), IdleReport(ASLEEP, Reason.ASLEEP), lm, NOW)
    lm = lm.model_copy(update={"status": first})
    again = with_idle(plain(lm, {}, placed=False, now=LATER),
                      IdleReport(ASLEEP, Reason.ASLEEP), lm, LATER)
    assert not status_changed(first, again)
    assert all(c.status != ConditionStatus.UNKNOWN for c in again.conditions)
