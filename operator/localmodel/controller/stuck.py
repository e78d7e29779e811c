"""Which nodes a model avoids: a node the scheduler left a model's pod
Unschedulable on for a while is avoided for that model, so the replica moves
on; a pod no node could take is reported once and keeps its placement. Pure;
tests/controller/test_policy.py holds it as a table.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from localmodel.events import EventReason, EventSpec

# A node the scheduler could not run a model's pod on is avoided this long.
AVOID_SECONDS = 600.0
# A stuck pod is looked at again this long after it matures.
RECHECK_MARGIN_SECONDS = 0.5


# Scheduler messages that say the pod cannot run on *any* node (its claim has
# no class and nothing binds it, ...): moving it to another node cannot help.
_NOT_THE_NODE = ("unbound immediate PersistentVolumeClaims", "persistentvolumeclaim \"")


@dataclass(frozen=True)
class StuckPod:
    """One of our pods the scheduler left Unschedulable, and since when."""

    model: str
    replica: int
    pod: str
    node: str  # the node the pod was placed on (its node affinity)
    since: float  # seconds since the epoch
    message: str = ""

    @property
    def node_specific(self) -> bool:
        """Whether another node could help (else: report, do not move)."""
        return not any(m in self.message for m in _NOT_THE_NODE)


Avoid = Mapping[str, Mapping[str, float]]  # model -> node -> avoided until


@dataclass(frozen=True)
class StuckVerdict:
    """The nodes each model avoids, and what to tell and when to look again."""

    avoid: dict[str, dict[str, float]]
    reported: dict[str, str]  # pod -> the message already reported
    events: dict[str, list[EventSpec]]  # model -> Events to post
    recheck_in: float | None = None  # look again then: a young stuck pod matures
    moved: tuple[tuple[StuckPod, float], ...] = ()  # (pod, age) newly avoided, for the log


def avoid_stuck(stuck: Iterable[StuckPod], avoid: Avoid, reported: Mapping[str, str],
                now: float, threshold: float) -> StuckVerdict:
    """Nodes whose pods the scheduler left Unschedulable for `threshold` seconds
    are rejected for that model (for AVOID_SECONDS), so the replica moves on to
    the next eligible node; younger stuck pods are looked at again when they
    mature, without waiting for a watch event."""
    kept = {model: {node: until for node, until in nodes.items() if until > now}
            for model, nodes in avoid.items()}
    avoided = {model: nodes for model, nodes in kept.items() if nodes}
    told = dict(reported)
    events: dict[str, list[EventSpec]] = {}
    recheck: list[float] = []
    moved: list[tuple[StuckPod, float]] = []
    for pod in stuck:
        age = now - pod.since
        if age < threshold:
            recheck.append(threshold - age + RECHECK_MARGIN_SECONDS)
            continue
        if not pod.node_specific:
            # Another node would not help (e.g. a claim with no StorageClass
            # and no default): say so once, keep the placement.
            if told.get(pod.pod) != pod.message:
                told[pod.pod] = pod.message
                events.setdefault(pod.model, []).append(EventSpec(
                    EventReason.UNSCHEDULABLE,
                    f"replica {pod.replica}: pod {pod.pod} cannot be scheduled on "
                    f"any node: {pod.message[:400]}", warning=True))
            continue
        nodes = avoided.setdefault(pod.model, {})
        if pod.node not in nodes:
            events.setdefault(pod.model, []).append(EventSpec(
                EventReason.UNSCHEDULABLE,
                f"replica {pod.replica}: the scheduler left pod {pod.pod} "
                f"Unschedulable on node {pod.node} for {age:.0f} s; placing the "
                "replica on another eligible node", warning=True))
            moved.append((pod, age))
        nodes[pod.node] = now + AVOID_SECONDS
    return StuckVerdict(avoided, told, events, min(recheck) if recheck else None, tuple(moved))
