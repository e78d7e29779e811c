"""The operator's own metrics (served on its /metrics by `controller/main.py`),
and the LocalModels counted by condition, kept up to date with what changed
(`ConditionTally`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from localmodel.api import LocalModelStatus
from localmodel.controller.closer import yields_counter
from localmodel.controller.leader import leases_lost_counter
from localmodel.controller.speed import ReadCounters
from localmodel.events import fell_asleep, finished_wake
from localmodel.metrics import LATENCY_BUCKETS, Counter, Gauge, Histogram, Metric

# A wake is a pod's start (a recreated pod was Ready in 12 to 28 s on the loaded
# real node, docs/test-cluster.md) or nothing at all (resident): seconds to minutes.
WAKE_BUCKETS = (1, 2.5, 5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 300, 600)


@dataclass
class IdleCounters:
    """Keeps the counters of spec.idle: sleeps, wakes (where, how long) and
    the closes asked of gateways, counted as the statuses written change."""

    wakes: Counter = field(default_factory=lambda: Counter(
        "localmodel_operator_wakes_total",
        "Wakes of models with spec.idle, by where: home (where its weights are) or elsewhere "
        "(a new claim).", ("namespace", "localmodel", "where")))
    wake_seconds: Histogram = field(default_factory=lambda: Histogram(
        "localmodel_operator_wake_seconds",
        "Seconds from a wake wanted to its first Ready replica.", WAKE_BUCKETS))
    sleeps: Counter = field(default_factory=lambda: Counter(
        "localmodel_operator_sleeps_total", "Times a model with spec.idle fell asleep."))
    yields: Counter = field(default_factory=yields_counter)

    def transition(self, key: str, old: LocalModelStatus | None,
                   new: LocalModelStatus) -> None:
        """Count what changed between a model's stored status and the new one."""
        if fell_asleep(old, new):
            self.sleeps.inc()
        if (wake := finished_wake(old, new)) is not None:
            namespace, _, name = key.partition("/")
            self.wakes.inc(labels=(namespace, name, wake.where))
            if wake.seconds is not None:
                self.wake_seconds.observe(wake.seconds)


@dataclass
class OperatorMetrics:
    """Every metric the operator serves, one field each."""

    passes: Counter = field(default_factory=lambda: Counter(
        "localmodel_operator_passes_total", "Reconcile passes by result.", ("result",)))
    pass_seconds: Histogram = field(default_factory=lambda: Histogram(
        "localmodel_operator_pass_duration_seconds", "Time one reconcile pass took.",
        LATENCY_BUCKETS))
    writes: Counter = field(default_factory=lambda: Counter(
        "localmodel_operator_api_writes_total",
        "API write requests by verb, kind and HTTP status code.", ("verb", "kind", "code")))
    leader: float = 0.0
    leases_lost: Counter = field(default_factory=leases_lost_counter)
    models_by_condition: dict[tuple[str, ...], float] = field(default_factory=dict)
    model_failures: Counter = field(default_factory=lambda: Counter(
        "localmodel_operator_model_failures_total",
        "Models a pass failed on (an exception computing or writing that model; the "
        "pass went on for the others), by stage.", ("stage",)))
    task_restarts: Counter = field(default_factory=lambda: Counter(
        "localmodel_operator_task_restarts_total",
        "Background tasks of the operator restarted after they failed, by task.", ("task",)))
    speed_reads: ReadCounters = field(default_factory=ReadCounters)
    speed_ratios: Callable[[], dict[tuple[str, ...], float]] = dict
    idle: IdleCounters = field(default_factory=IdleCounters)

    def all(self) -> list[Metric]:
        return [
            self.passes,
            self.pass_seconds,
            self.writes,
            self.model_failures,
            self.task_restarts,
            self.leases_lost,
            self.speed_reads.reads,
            self.speed_reads.read_bytes,
            self.idle.wakes,
            self.idle.wake_seconds,
            self.idle.sleeps,
            self.idle.yields,
            Gauge("localmodel_operator_replica_decode_speed_ratio",
                  "Each replica's decode rate between the operator's last two reads with "
                  "traffic over its expected rate (below 0.5 for --slow-replica-after: "
                  "SlowReplica).", lambda: self.speed_ratios(),
                  ("namespace", "localmodel", "replica", "node")),
            Gauge("localmodel_operator_models", "LocalModels by condition and status.",
                  lambda: dict(self.models_by_condition), ("condition", "status")),
            Gauge("localmodel_operator_leader", "Whether this replica holds the Lease (1 or 0).",
                  lambda: {(): self.leader}),
        ]

    def on_write(self, verb: str, kind: str, code: int) -> None:
        self.writes.inc(labels=(verb, kind, str(code)))


@dataclass
class ConditionTally:
    """LocalModels by condition and status (the operator's gauge), kept up to
    date with what changed: a status is counted again only when it is another
    object than the one counted for its model."""

    counted: dict[str, tuple[Any, tuple[tuple[str, str], ...]]] = field(default_factory=dict)
    totals: dict[tuple[str, ...], float] = field(default_factory=dict)

    def count(self, statuses: Mapping[str, Any]) -> dict[tuple[str, ...], float]:
        """The tally for `statuses` (model -> LocalModelStatus), as a new dict."""
        before, now = self.counted, {}
        for key, status in statuses.items():
            kept = before.pop(key, None)
            if kept is None or kept[0] is not status:
                if kept is not None:
                    self._add(kept[1], -1)
                kept = (status, tuple((c.type, c.status.value) for c in status.conditions))
                self._add(kept[1], 1)
            now[key] = kept
        for _, pairs in before.values():  # models gone
            self._add(pairs, -1)
        self.counted = now
        return {k: v for k, v in self.totals.items() if v}

    def recount(self, statuses: Mapping[str, Any]) -> dict[tuple[str, ...], float]:
        """The tally after the statuses of these models changed (no model gone)."""
        counted = self.counted
        for key, status in statuses.items():
            kept = counted.get(key)
            if kept is None or kept[0] is not status:
                if kept is not None:
                    self._add(kept[1], -1)
                kept = counted[key] = (
                    status, tuple((c.type, c.status.value) for c in status.conditions))
                self._add(kept[1], 1)
        return {k: v for k, v in self.totals.items() if v}

    def _add(self, pairs: tuple[tuple[str, str], ...], n: int) -> None:
        for pair in pairs:
            self.totals[pair] = self.totals.get(pair, 0) + n
