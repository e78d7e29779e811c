"""Every metric the gateway exports (GET /metrics), fed by finished
`RequestRecord`s. Pure.

Names start with `METRIC_PREFIX` (localmodel.gateway_contract: doctor reads
them); docs/metrics.md's table is generated from `GatewayMetrics.all()`.
"""

from __future__ import annotations

from collections.abc import Callable

from localmodel.gateway.ledger import CallerLabels
from localmodel.gateway.record import CANCEL_REASONS, Outcome, RequestRecord
from localmodel.gateway.slots import SlotSnapshot
from localmodel.gateway.speed import SpeedRecord
from localmodel.gateway_contract import METRIC_PREFIX
from localmodel.gateway_contract.timing import EngineTiming
from localmodel.metrics import (
    LATENCY_BUCKETS,
    RATE_BUCKETS,
    Counter,
    Gauge,
    Histogram,
    Labels,
    Metric,
    render,
)


class GatewayMetrics:
    """Keeps every metric the gateway exports, fed by finished `RequestRecord`s
    (the engine's timing in `EngineMetrics`, the gauges read at render time in
    `GatewayGauges`)."""

    def __init__(
        self,
        slots: Callable[[], SlotSnapshot],
        in_flight: Callable[[], int],
        speed: SpeedRecord | None = None,
        clock: Callable[[], float] | None = None,
        closed: Callable[[], bool] | None = None,
    ) -> None:
        self.speed = speed if speed is not None else SpeedRecord()
        self._request_metrics()
        self._overflow_metrics()
        self.engine = EngineMetrics()
        self._caller_metrics()
        self.gauges = GatewayGauges(slots, in_flight, self.speed, clock, closed).all
        self.yields = Counter(
            METRIC_PREFIX + "yield_calls_total",
            "Calls of POST /yield (the operator's close) by reason (sleep, yield, reopen; "
            "unknown: a bad body) and result (accepted: closed or reopened; refused: busy or "
            "not idle long enough, 409; forbidden: no valid mark, 403; bad_request).",
            ("reason", "result"),
        )
        # Mean slot hold time, for Retry-After hints.
        self._held = 0
        self._held_seconds = 0.0

    def _request_metrics(self) -> None:
        """Requests: outcomes, cancellations, upstream failures, the options
        rewritten, slot time, waits and latencies."""
        p = METRIC_PREFIX
        self.requests = Counter(
            p + "requests_total",
            "Requests by route, priority and outcome.",
            ("route", "priority", "outcome"),
        )
        self.cancellations = Counter(
            p + "cancellations_total",
            "Requests cancelled, with the upstream connection closed, by reason.",
            ("reason",),
        )
        self.upstream_errors = Counter(
            p + "upstream_errors_total",
            "Upstream failures by kind (connect, status, stream).",
            ("kind",),
        )
        self.options_rewritten = Counter(
            p + "options_rewritten_total",
            "Engine load options and keep_alive callers set to other values than the pod's "
            "(forced or dropped: a different value would reload or unload the model), by option.",
            ("option",),
        )
        self.slot_busy = Counter(p + "slot_busy_seconds_total", "Seconds slots were held.")
        self.queue_wait = Histogram(
            p + "queue_wait_seconds",
            "Time from arrival to a slot, for requests given one.",
            LATENCY_BUCKETS,
            ("priority",),
        )
        self.ttft = Histogram(
            p + "time_to_first_token_seconds",
            "Time from arrival to the first upstream token.",
            LATENCY_BUCKETS,
            ("route",),
        )
        self.duration = Histogram(
            p + "request_duration_seconds",
            "Time from arrival to the end of the response.",
            LATENCY_BUCKETS,
            ("route",),
        )

    def _overflow_metrics(self) -> None:
        """The overflow endpoint: what it served, failed and was not sent."""
        p = METRIC_PREFIX
        self.overflow_requests = Counter(
            p + "overflow_requests_total",
            "Requests served by the overflow endpoint, by route and outcome.",
            ("route", "outcome"),
        )
        self.overflow_errors = Counter(
            p + "overflow_errors_total",
            "Overflow attempts that failed, by kind (connect, status, timeout); the "
            "request then waited locally.",
            ("kind",),
        )
        self.overflow_skipped = Counter(
            p + "overflow_skipped_total",
            "Foreground requests past --overflow-after that stayed local, by reason "
            "(cooling_down after a failure, untranslatable, route, not_allowed: the caller's key, "
            "budget: the caller's overflow budget spent).",
            ("reason",),
        )
        self.overflow_duration = Histogram(
            p + "overflow_request_duration_seconds",
            "Time from arrival to the end of the response, for overflowed requests.",
            LATENCY_BUCKETS,
            ("route",),
        )

    def _caller_metrics(self) -> None:
        """Per caller and per holder: the prompt cache, rewrites and re-reads, and whom the waits
        were behind."""
        p = METRIC_PREFIX
        # Per caller: at most MAX_CALLER_LABELS distinct values, the rest `other`.
        self.callers = CallerLabels()
        self.prompt_cached = Counter(
            p + "prompt_tokens_cached_total",
            "Prompt tokens the engine reused from its prompt cache, by caller (where the "
            "engine says).",
            ("caller",),
        )
        self.prompt_evaluated = Counter(
            p + "prompt_tokens_evaluated_total",
            "Prompt tokens the engine evaluated, by caller (where the engine says).",
            ("caller",),
        )
        self.rewrites = Counter(
            p + "prompt_rewrites_total",
            "Requests whose session's prompt did not extend its previous one (a compaction, "
            "a rewritten history): the engine's cache could not be reused, by caller.",
            ("caller",),
        )
        self.reread_seconds = Counter(
            p + "reread_seconds_total",
            "Prefill seconds spent on tokens their session had already read once, by caller.",
            ("caller",),
        )
        self.wait_behind = Counter(
            p + "queue_wait_behind_seconds_total",
            "Seconds requests waited for a slot, split among the requests holding the "
            "slots, by the priority of those holders.",
            ("ahead",),
        )

    def overflow_failed(self, rec: RequestRecord, kind: str, status: int | None = None) -> None:
        rec.overflow_error, rec.overflow_status = kind, status
        self.overflow_errors.inc(1, (kind,))

    def overflow_skip(self, rec: RequestRecord, reason: str) -> None:
        rec.overflow_skipped = reason
        self.overflow_skipped.inc(1, (reason,))

    @property
    def mean_slot_seconds(self) -> float:
        return self._held_seconds / self._held if self._held else 0.0

    def all(self) -> tuple[Metric, ...]:
        return (
            self.requests,
            *self.gauges,
            self.queue_wait,
            self.slot_busy,
            self.cancellations,
            self.upstream_errors,
            self.overflow_requests,
            self.overflow_errors,
            self.overflow_skipped,
            self.overflow_duration,
            self.options_rewritten,
            *self.engine.all(),
            self.ttft,
            self.duration,
            self.prompt_cached,
            self.prompt_evaluated,
            self.rewrites,
            self.reread_seconds,
            self.wait_behind,
            self.yields,
        )

    def render(self) -> str:
        return render(self.all())

    def record(self, rec: RequestRecord) -> None:
        outcome = rec.outcome or Outcome.INTERNAL_ERROR
        self.requests.inc(1, (rec.route, rec.priority, outcome.value))
        if outcome in CANCEL_REASONS:
            self.cancellations.inc(1, (CANCEL_REASONS[outcome],))
        if rec.upstream_error:
            # A broken stream from the overflow is the overflow's error, not the engine's.
            errors = self.overflow_errors if rec.served_by == "overflow" else self.upstream_errors
            errors.inc(1, (rec.upstream_error,))

        if rec.slot_at is not None:
            wait = rec.queue_wait
            if wait is not None:
                self.queue_wait.observe(wait, (rec.priority,))
        held = rec.slot_seconds
        if held is not None:
            self.slot_busy.inc(held)
            self._held += 1
            self._held_seconds += held
        if rec.ttft is not None:
            self.ttft.observe(rec.ttft, (rec.route,))
        if rec.duration is not None:
            self.duration.observe(rec.duration, (rec.route,))
        if rec.served_by == "overflow":
            self.overflow_requests.inc(1, (rec.route, outcome.value))
            if rec.duration is not None:
                self.overflow_duration.observe(rec.duration, (rec.route,))
        if rec.behind:
            for (_, ahead), owed in rec.behind.items():
                self.wait_behind.inc(owed, (ahead,))
        if rec.rewrite:
            caller = (self.callers.label(rec.caller),)
            self.rewrites.inc(1, caller)
            reread_seconds = rec.reread()[1]
            if reread_seconds is not None:
                self.reread_seconds.inc(max(0.0, reread_seconds), caller)
        timing = rec.timing
        if timing is None:
            return
        if rec.served_by != "overflow":
            self.speed.add(rec.end if rec.end is not None else rec.start, timing)
        if timing.prompt_cached is not None:
            self.prompt_cached.inc(max(0, timing.prompt_cached), (self.callers.label(rec.caller),))
        if timing.prompt_evaluated is not None:
            self.prompt_evaluated.inc(
                max(0, timing.prompt_evaluated), (self.callers.label(rec.caller),)
            )
        self.engine.record(timing)


class EngineMetrics:
    """Keeps the engine's own timing: tokens and seconds of prefill and decode,
    and their rates per request."""

    def __init__(self) -> None:
        p = METRIC_PREFIX
        self.prompt_tokens = Counter(
            p + "prompt_tokens_total", "Prompt tokens the engine evaluated (engine timing)."
        )
        self.prefill_seconds = Counter(
            p + "prefill_seconds_total", "Seconds the engine spent on prompt evaluation."
        )
        self.generated_tokens = Counter(
            p + "generated_tokens_total", "Tokens the engine generated (engine timing)."
        )
        self.decode_seconds = Counter(
            p + "decode_seconds_total", "Seconds the engine spent generating tokens."
        )
        self.prefill_rate = Histogram(
            p + "prefill_tokens_per_second",
            "Prompt evaluation speed per request (engine timing).",
            RATE_BUCKETS,
        )
        self.decode_rate = Histogram(
            p + "decode_tokens_per_second",
            "Generation speed per request (engine timing).",
            RATE_BUCKETS,
        )

    def all(self) -> tuple[Metric, ...]:
        return (
            self.prompt_tokens,
            self.prefill_seconds,
            self.generated_tokens,
            self.decode_seconds,
            self.prefill_rate,
            self.decode_rate,
        )

    def record(self, timing: EngineTiming) -> None:
        """One request's timing, as the engine gave it."""
        if timing.prompt_tokens is not None:
            self.prompt_tokens.inc(max(0, timing.prompt_tokens))
        if timing.prompt_seconds is not None:
            self.prefill_seconds.inc(max(0.0, timing.prompt_seconds))
        if timing.generated_tokens is not None:
            self.generated_tokens.inc(max(0, timing.generated_tokens))
        if timing.decode_seconds is not None:
            self.decode_seconds.inc(max(0.0, timing.decode_seconds))
        if timing.prefill_tokens_per_second is not None:
            self.prefill_rate.observe(timing.prefill_tokens_per_second)
        if timing.decode_tokens_per_second is not None:
            self.decode_rate.observe(timing.decode_tokens_per_second)


class GatewayGauges:
    """Reads the gateway's state for its gauges each time the metrics are
    rendered: the slots, the queue, the requests in flight, the speed record."""

    def __init__(
        self,
        slots: Callable[[], SlotSnapshot],
        in_flight: Callable[[], int],
        speed: SpeedRecord,
        clock: Callable[[], float] | None,
        closed: Callable[[], bool] | None = None,
    ) -> None:
        self.speed = speed
        self._clock = clock
        self._slots = slots
        self._in_flight_now = in_flight
        self._closed_now = closed

    @property
    def all(self) -> tuple[Gauge, ...]:
        p = METRIC_PREFIX
        return (
            Gauge(
                p + "slots", "Slots (concurrent generations) this gateway allows.",
                self._slots_total,
            ),
            Gauge(p + "slots_busy", "Slots held by a request now.", self._slots_busy),
            Gauge(
                p + "slot_occupancy",
                "Busy slots over slots, 0 to 1 (an autoscaling signal, with queued).",
                self._occupancy,
            ),
            Gauge(
                p + "queued", "Requests waiting for a slot, by priority.", self._queued,
                ("priority",),
            ),
            Gauge(p + "in_flight", "Requests being handled now (any route).", self._in_flight),
            Gauge(
                p + "closed",
                "1 while the gateway is closed (POST /yield: its model sleeps or gives its "
                "node back) and refuses slot requests with 503, else 0.", self._closed,
            ),
            Gauge(
                p + "calibration_tokens_per_second",
                "This replica's speed measured at readiness (a fixed 32-token decode), by "
                "phase (decode, prefill).", self._calibration, ("phase",),
            ),
            Gauge(
                p + "recent_tokens_per_second",
                "Speed of the requests served in the last 5 minutes (engine timing), by phase.",
                self._recent, ("phase",),
            ),
        )

    def _slots_total(self) -> dict[Labels, float]:
        return {(): float(self._slots().total)}

    def _slots_busy(self) -> dict[Labels, float]:
        return {(): float(self._slots().busy)}

    def _occupancy(self) -> dict[Labels, float]:
        snap = self._slots()
        return {(): snap.busy / snap.total}

    def _queued(self) -> dict[Labels, float]:
        snap = self._slots()
        return {
            ("foreground",): float(snap.queued_foreground),
            ("background",): float(snap.queued_background),
        }

    def _in_flight(self) -> dict[Labels, float]:
        return {(): float(self._in_flight_now())}

    def _closed(self) -> dict[Labels, float]:
        return {(): float(self._closed_now is not None and self._closed_now())}

    def _calibration(self) -> dict[Labels, float]:
        c = self.speed.calibration
        if c is None:
            return {}
        rates = (("decode", c.decode), ("prefill", c.prefill))
        return {(phase,): rate for phase, rate in rates if rate is not None}

    def _recent(self) -> dict[Labels, float]:
        if self._clock is None:
            return {}
        _, decode, prefill = self.speed.recent(self._clock())
        rates = (("decode", decode), ("prefill", prefill))
        return {(phase,): rate for phase, rate in rates if rate is not None}
