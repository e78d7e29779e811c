"""The Events the operator posts about a LocalModel. Pure.

One home for their reasons, and for the Events that tell the story of a status
change (`status_events`): one per change, never repeated, so re-planning at
rest is silent. The operator adds the object reference and posts them; nothing
here reads a clock, the environment or the cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from localmodel.api import (
    Condition,
    ConditionStatus,
    DecisionStatus,
    IdleStatus,
    LocalModelStatus,
    PlacementStatus,
)
from localmodel.idle.asks import Closed, CloseResult
from localmodel.status import ConditionType, Reason


class EventReason(StrEnum):
    """Reasons of the Events the operator posts (one per change, never repeated)."""

    PLACED = "Placed"
    MOVED = "Moved"
    UNPLACED = "Unplaced"
    DECISION_ON = "DecisionApplied"
    DECISION_OFF = "DecisionRemoved"
    REPLACING = "ReplacingPod"
    CREATED_CLAIM = "CreatedClaim"
    INVALID = "InvalidSpec"
    REFUSED_BY_POLICY = "RefusedByPolicy"  # Valid=False by the admin's policy (tenancy)
    VALID = "SpecValid"
    SCALED_DOWN = "ScaledDown"
    UNSCHEDULABLE = "Unschedulable"
    FAILED = "ApplyFailed"
    SLOW_REPLICA = "SlowReplica"
    SPEED_RECOVERED = "SpeedRecovered"
    RECONCILE_FAILED = "ReconcileFailed"  # computing or writing this model raised
    CONTAINER_FAILING = "ContainerFailing"  # Ready=False: a container keeps failing (gaps.py)
    # spec.idle (docs/idle.md): its state's changes, and the closes asked of its gateways.
    ASLEEP = "Asleep"
    WAKING = "Waking"
    WOKE = "Woke"
    WOKE_ELSEWHERE = "WokeElsewhere"  # Warning: not where its weights are, with the cost
    WAITING_FOR_NODE = "WaitingForNode"  # Warning: no node it may take now
    YIELDED = "Yielded"  # its gateway closed: its node goes to another model
    YIELD_REFUSED = "YieldRefused"  # its gateway was busy: it keeps its node


@dataclass(frozen=True)
class EventSpec:
    """An Event to post about a LocalModel (the operator adds the object reference)."""

    reason: EventReason
    message: str
    warning: bool = False


def _decisions(p: PlacementStatus) -> dict[str, DecisionStatus]:
    return {d.rule: d for d in p.decisions}


def status_events(old: LocalModelStatus | None, new: LocalModelStatus) -> list[EventSpec]:
    """The Events that tell what changed between two statuses: placements made,
    moved or lost, decisions that start or stop firing, validity flips. Empty when
    nothing a person would care about changed, so re-planning is silent."""
    events: list[EventSpec] = []
    old_valid = _condition_of(old, ConditionType.VALID)
    new_valid = _condition_of(new, ConditionType.VALID)
    if new_valid and new_valid.status == ConditionStatus.FALSE:
        if old_valid is None or old_valid.status != ConditionStatus.FALSE or (
            old_valid.message != new_valid.message
        ):
            reason = (EventReason.REFUSED_BY_POLICY
                      if new_valid.reason == EventReason.REFUSED_BY_POLICY.value
                      else EventReason.INVALID)
            events.append(EventSpec(reason, new_valid.message, warning=True))
        return events
    if old_valid and old_valid.status == ConditionStatus.FALSE and new_valid:
        events.append(EventSpec(EventReason.VALID, "the spec is valid again"))
    events += _placement_events(old, new)
    events += _speed_events(old, new)
    events += _failing_events(old, new)
    events += idle_events(old, new)
    old_placed = _condition_of(old, ConditionType.PLACED)
    new_placed = _condition_of(new, ConditionType.PLACED)
    if new_placed and new_placed.status == ConditionStatus.FALSE and (
        old_placed is None or old_placed.status != ConditionStatus.FALSE
        or old_placed.message != new_placed.message
    ):
        events.append(EventSpec(EventReason.UNPLACED, new_placed.message, warning=True))
    return events


def _placement_events(old: LocalModelStatus | None, new: LocalModelStatus) -> list[EventSpec]:
    """Replicas placed or moved, and decisions that start or stop firing."""
    events: list[EventSpec] = []
    before = {p.replica: p for p in (old.placements if old else [])}
    after = {p.replica: p for p in new.placements}
    for replica, p in sorted(after.items()):
        was = before.get(replica)
        if was is None:
            # A first placement starts every decision at once: one Event lists them.
            rules = ", ".join(d.rule for d in p.decisions) or "none"
            events.append(EventSpec(
                EventReason.PLACED,
                f"replica {replica} placed on node {p.node}: threads={p.threads} cpu={p.cpu} "
                f"memory={p.memory}; rules: {rules}" + (f" ({p.reason})" if p.reason else ""),
            ))
            continue
        if was.node != p.node:
            events.append(EventSpec(
                EventReason.MOVED,
                f"replica {replica} moved from node {was.node} to {p.node}"
                + (f" ({p.reason})" if p.reason else ""),
            ))
        old_d = _decisions(was)
        new_d = _decisions(p)
        for rule in sorted(new_d.keys() - old_d.keys()):
            d = new_d[rule]
            events.append(EventSpec(
                EventReason.DECISION_ON,
                f"replica {replica} on {p.node}: {d.rule}: {d.effect} ({d.reason})",
            ))
        for rule in sorted(old_d.keys() - new_d.keys()):
            events.append(EventSpec(
                EventReason.DECISION_OFF,
                f"replica {replica} on {p.node}: rule {rule} no longer applies",
            ))
    return events


def _speed_events(old: LocalModelStatus | None, new: LocalModelStatus) -> list[EventSpec]:
    """SlowReplica turning true, and turning false again."""
    events: list[EventSpec] = []
    old_slow = _condition_of(old, ConditionType.SLOW_REPLICA)
    new_slow = _condition_of(new, ConditionType.SLOW_REPLICA)
    was_slow = old_slow is not None and old_slow.status == ConditionStatus.TRUE
    if new_slow is not None and new_slow.status == ConditionStatus.TRUE and not was_slow:
        events.append(EventSpec(EventReason.SLOW_REPLICA, new_slow.message, warning=True))
    if was_slow and new_slow is not None and new_slow.status == ConditionStatus.FALSE:
        events.append(EventSpec(EventReason.SPEED_RECOVERED,
                                "every replica decodes at its expected speed again"))
    return events


def _failing_events(old: LocalModelStatus | None, new: LocalModelStatus) -> list[EventSpec]:
    """A container that keeps failing, once per thing said: its Ready message
    changes only when the container, its reason, its restart bucket or its last
    message does (localmodel/gaps.py)."""
    failing = Reason.CONTAINER_FAILING.value
    was, now = _condition_of(old, ConditionType.READY), _condition_of(new, ConditionType.READY)
    if now is None or now.reason != failing or (
            was is not None and was.reason == failing and was.message == now.message):
        return []
    return [EventSpec(EventReason.CONTAINER_FAILING, now.message, warning=True)]


def _condition_of(status: LocalModelStatus | None, type_: ConditionType) -> Condition | None:
    if status is None:
        return None
    for c in status.conditions:
        if c.type == type_.value:
            return c
    return None


# ---- spec.idle -----------------------------------------------------------------------


@dataclass(frozen=True)
class FinishedWake:
    """A wake that ended between two statuses: on which node, whether that
    was home (its weights there) or elsewhere, and how long it took."""

    node: str
    where: Literal["home", "elsewhere"]
    seconds: float | None


def _idle(status: LocalModelStatus | None) -> IdleStatus | None:
    return status.idle if status is not None else None


def finished_wake(old: LocalModelStatus | None, new: LocalModelStatus) -> FinishedWake | None:
    """The wake that ended: asleep or waking before, awake now."""
    was, now = _idle(old), _idle(new)
    if was is None or now is None or was.state == "Awake" or now.state != "Awake":
        return None
    last = now.last_wake
    if last is None:
        return FinishedWake("", "home", None)
    return FinishedWake(last.node, "elsewhere" if last.warm_cache is False else "home",
                        last.seconds)


def fell_asleep(old: LocalModelStatus | None, new: LocalModelStatus) -> bool:
    """Awake before (or no idle status yet), asleep now."""
    was, now = _idle(old), _idle(new)
    return now is not None and now.state == "Asleep" and (was is None or was.state == "Awake")


def idle_events(old: LocalModelStatus | None, new: LocalModelStatus) -> list[EventSpec]:
    """Asleep, Waking, Woke (and WokeElsewhere, a Warning with the cost) as
    `status.idle.state` changes; WaitingForNode (a Warning) as the Awake
    condition turns to it."""
    was, now = _idle(old), _idle(new)
    if now is None:
        return []
    before = was.state if was is not None else "Awake"
    events: list[EventSpec] = []
    if fell_asleep(old, new):
        events.append(EventSpec(EventReason.ASLEEP, "asleep: " + (
            "its pods keep running until another model needs the node" if now.resident
            else "its node is given back; its claims and weights are kept")))
    if now.state == "Waking" and before != "Waking":
        wake = now.wake
        node = wake.node if wake is not None and wake.node else "a node still to be chosen"
        held = wake.held if wake is not None else 0
        events.append(EventSpec(EventReason.WAKING,
                                f"waking on {node} for {held} held request(s)"))
    if (done := finished_wake(old, new)) is not None:
        took = f" in {done.seconds:.1f} s" if done.seconds is not None else ""
        cache = {"home": ", warm cache", "elsewhere": ", cold cache"}[done.where]
        events.append(EventSpec(EventReason.WOKE, f"woke on {done.node or 'its node'}{took}"
                                + (cache if done.node else "")))
        if done.where == "elsewhere":
            cost = was.wake.cost if was is not None and was.wake is not None else ""
            events.append(EventSpec(EventReason.WOKE_ELSEWHERE,
                                    f"woke on {done.node}, not where its weights are: "
                                    f"{cost or 'a new claim and a download'}", warning=True))
    awake_was = _condition_of(old, ConditionType.AWAKE)
    awake_now = _condition_of(new, ConditionType.AWAKE)
    waiting = Reason.WAITING_FOR_NODE.value
    if awake_now is not None and awake_now.reason == waiting and (
            awake_was is None or awake_was.reason != waiting):
        events.append(EventSpec(EventReason.WAITING_FOR_NODE,
                                awake_now.message or "no node it may take now", warning=True))
    return events


def close_event(closed: Closed) -> EventSpec | None:
    """Yielded when a gateway closed to give its node to another model;
    YieldRefused when a gateway asked to sleep or yield was busy."""
    ask = closed.ask
    for_ = f" to {ask.for_}" if ask.for_ else ""
    if closed.result is CloseResult.CLOSED and ask.reason == "yield":
        return EventSpec(EventReason.YIELDED, f"pod {ask.pod} closed to give its node{for_} "
                         f"(idle at least {ask.idle_at_least} s)")
    if closed.result is CloseResult.BUSY and ask.reason != "reopen":
        return EventSpec(EventReason.YIELD_REFUSED,
                         f"pod {ask.pod} is busy ({closed.in_flight} in flight, {closed.queued} "
                         f"queued): it keeps its node" + (f", {ask.for_} waits" if for_ else ""))
    return None
