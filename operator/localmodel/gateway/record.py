"""One request's story: its outcome, the log line and the metrics it feeds. Pure.

The aiohttp glue fills a `RequestRecord` as the request moves (queued, given a
slot, first token, finished or cancelled) and hands it to `GatewayMetrics.record`
and `log_line` at the end. Times are plain floats from whatever clock the glue
uses, so tests can build records by hand.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from localmodel.gateway.ledger import (
    ANONYMOUS,
    MAX_ID,
    CallerLabels,
    Holder,
    behind_text,
    reread,
    top_behind,
)
from localmodel.gateway.slots import SlotSnapshot
from localmodel.gateway.speed import SpeedRecord
from localmodel.gateway.stream import EngineTiming
from localmodel.gateway_contract import METRIC_PREFIX, LedgerEntry
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


class Outcome(StrEnum):
    OK = "ok"
    BAD_REQUEST = "bad_request"  # 400
    TOO_LARGE = "too_large"  # 413
    BODY_TIMEOUT = "body_timeout"  # 408
    REJECTED_BUSY = "rejected_busy"  # 429, background and no slot free
    REJECTED_QUEUE_FULL = "rejected_queue_full"  # 503, foreground queue full
    CANCELLED_DISCONNECT = "cancelled_disconnect"  # the caller went away
    CANCELLED_DEADLINE = "cancelled_deadline"  # X-Request-Timeout or --deadline passed
    UPSTREAM_UNAVAILABLE = "upstream_unavailable"  # 502/503, engine unreachable
    UPSTREAM_STATUS = "upstream_status"  # engine answered non-2xx, relayed
    UPSTREAM_ERROR = "upstream_error"  # engine reported an error or broke its stream
    INTERNAL_ERROR = "internal_error"  # 500, a bug here
    SHUTDOWN = "shutdown"  # the gateway stopped while the request ran


CANCEL_REASONS = {
    Outcome.CANCELLED_DISCONNECT: "disconnect",
    Outcome.CANCELLED_DEADLINE: "deadline",
    Outcome.SHUTDOWN: "shutdown",
}


@dataclass
class RequestRecord:
    request_id: str
    route: str
    priority: str
    start: float
    model: str = ""
    caller_streams: bool = False
    status: int = 0
    outcome: Outcome | None = None
    detail: str = ""
    queued_at: float | None = None
    slot_at: float | None = None  # when a slot was granted
    slot_released_at: float | None = None
    first_token_at: float | None = None
    end: float | None = None
    timing: EngineTiming | None = None
    upstream_error: str | None = None  # connect, status, stream, timeout
    served_by: str = "local"  # or "overflow": the X-LocalModel-Served-By header
    # Logged here; counted by GatewayMetrics.overflow_failed / overflow_skip at
    # once, since the request may wait long after.
    overflow_error: str | None = None  # an overflow attempt failed: connect, status, timeout
    overflow_status: int | None = None  # the status it answered, for `status`
    overflow_skipped: str | None = None  # past --overflow-after but not sent: why
    # Who asked (localmodel.gateway.ledger.identify) and what the ledger adds.
    caller: str = ANONYMOUS
    session: str | None = None
    arrival: float = 0.0  # wall clock, for the ledger's `since`
    caller_gone_at: float | None = None  # when the gateway saw the caller leave
    behind: dict[Holder, float] | None = None  # whom it waited behind, seconds each
    rewrite: bool | None = None  # its session's prompt was rewritten (None: no session)
    previous_tokens: int | None = None  # the session's previous prompt, in tokens
    turn: int = 0  # its turn in the session (to tell the session its token count)

    def gone(self, now: float) -> None:
        """The caller left (the first sighting counts)."""
        if self.caller_gone_at is None:
            self.caller_gone_at = now

    def finish(self, outcome: Outcome, status: int, detail: str = "") -> None:
        """Record how the request ended; the first outcome recorded wins."""
        if self.outcome is None:
            self.outcome = outcome
            self.status = status
            self.detail = detail

    @property
    def queue_wait(self) -> float | None:
        if self.queued_at is None:
            return 0.0 if self.slot_at is not None else None
        end = self.slot_at if self.slot_at is not None else self.end
        return None if end is None else max(0.0, end - self.queued_at)

    @property
    def slot_seconds(self) -> float | None:
        if self.slot_at is None or self.slot_released_at is None:
            return None
        return max(0.0, self.slot_released_at - self.slot_at)

    @property
    def ttft(self) -> float | None:
        if self.first_token_at is None:
            return None
        return max(0.0, self.first_token_at - self.start)

    @property
    def duration(self) -> float | None:
        return None if self.end is None else max(0.0, self.end - self.start)

    @property
    def abandoned_seconds(self) -> float | None:
        """Slot time held after the caller had gone (cancellation latency)."""
        if self.caller_gone_at is None or self.slot_released_at is None or self.slot_at is None:
            return None
        return max(0.0, self.slot_released_at - max(self.caller_gone_at, self.slot_at))

    def reread(self) -> tuple[int | None, float | None]:
        t = self.timing or EngineTiming()
        return reread(
            self.rewrite,
            self.previous_tokens,
            t.prompt_total,
            t.prompt_cached,
            t.prompt_evaluated,
            t.prompt_seconds,
        )


def _after(rec: RequestRecord, at: float | None) -> float | None:
    return None if at is None else max(0.0, at - rec.start)


def ledger_entry(rec: RequestRecord) -> LedgerEntry:
    """The ledger's record of a finished request."""
    t = rec.timing or EngineTiming()
    reread_tokens, reread_seconds = rec.reread()
    return LedgerEntry(
        request_id=rec.request_id[:MAX_ID],
        caller=rec.caller,
        session=rec.session,
        priority=rec.priority,
        route=rec.route,
        model=rec.model[:MAX_ID],
        outcome=(rec.outcome or Outcome.INTERNAL_ERROR).value,
        status=rec.status,
        served_by=rec.served_by,
        arrival=rec.arrival,
        duration=rec.duration,
        queue_wait=rec.queue_wait,
        slot_start=_after(rec, rec.slot_at),
        slot_seconds=rec.slot_seconds,
        ttft=rec.ttft,
        caller_gone=_after(rec, rec.caller_gone_at),
        abandoned_seconds=rec.abandoned_seconds,
        behind=top_behind(rec.behind or {}),
        prompt_tokens=t.prompt_total,
        cached_tokens=t.prompt_cached,
        evaluated_tokens=t.prompt_evaluated,
        prefill_seconds=t.prompt_seconds,
        generated_tokens=t.generated_tokens,
        decode_seconds=t.decode_seconds,
        rewrite=rec.rewrite,
        reread_tokens=reread_tokens,
        reread_seconds=reread_seconds,
    )


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def log_fields(rec: RequestRecord) -> dict[str, Any]:
    timing = rec.timing or EngineTiming()
    fields: dict[str, Any] = {
        "msg": "request",
        "request_id": rec.request_id,
        "route": rec.route,
        "priority": rec.priority,
        "model": rec.model,
        "stream": rec.caller_streams,
        "status": rec.status,
        "outcome": rec.outcome.value if rec.outcome else None,
        "served_by": rec.served_by,
        "queue_wait_ms": _ms(rec.queue_wait),
        "ttft_ms": _ms(rec.ttft),
        "duration_ms": _ms(rec.duration),
        "prompt_tokens": timing.prompt_tokens,
        "prefill_tok_s": _round(timing.prefill_tokens_per_second),
        "generated_tokens": timing.generated_tokens,
        "decode_tok_s": _round(timing.decode_tokens_per_second),
        "done_reason": timing.done_reason,
    }
    fields["caller"] = rec.caller
    if rec.session is not None:
        fields["session"] = rec.session
    if timing.prompt_cached is not None:
        fields["cached_tokens"] = timing.prompt_cached
    if timing.prompt_evaluated is not None:
        fields["evaluated_tokens"] = timing.prompt_evaluated
    if rec.behind:
        fields["waited_behind"] = behind_text(top_behind(rec.behind))
    if rec.rewrite is not None:
        fields["rewrite"] = rec.rewrite
        if rec.rewrite:
            fields["reread_s"] = _round(rec.reread()[1])
    if rec.caller_gone_at is not None:
        fields["abandoned_ms"] = _ms(rec.abandoned_seconds)
    if rec.overflow_error:
        fields["overflow_error"] = rec.overflow_error
        if rec.overflow_status is not None:
            fields["overflow_status"] = rec.overflow_status
    if rec.overflow_skipped:
        fields["overflow_skipped"] = rec.overflow_skipped
    if rec.outcome in CANCEL_REASONS:
        fields["cancel_reason"] = CANCEL_REASONS[rec.outcome]
    if rec.detail:
        fields["detail"] = rec.detail
    return fields


def log_line(rec: RequestRecord, ts: str) -> str:
    return json.dumps({"ts": ts, **log_fields(rec)}, separators=(",", ":"))


class GatewayMetrics:
    """Every metric the gateway exports, fed by finished `RequestRecord`s."""

    def __init__(
        self,
        slots: Callable[[], SlotSnapshot],
        in_flight: Callable[[], int],
        speed: SpeedRecord | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        p = METRIC_PREFIX
        self.speed = speed if speed is not None else SpeedRecord()
        self._clock = clock
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
            "(cooling_down after a failure, untranslatable, route).",
            ("reason",),
        )
        self.overflow_duration = Histogram(
            p + "overflow_request_duration_seconds",
            "Time from arrival to the end of the response, for overflowed requests.",
            LATENCY_BUCKETS,
            ("route",),
        )
        self.options_rewritten = Counter(
            p + "options_rewritten_total",
            "Engine load options callers set to other values than the pod's (forced or "
            "dropped: a different value would reload the model), by option.",
            ("option",),
        )
        self.slot_busy = Counter(p + "slot_busy_seconds_total", "Seconds slots were held.")
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
        self._slots = slots

        def _slots_total() -> dict[Labels, float]:
            return {(): float(slots().total)}

        def _slots_busy() -> dict[Labels, float]:
            return {(): float(slots().busy)}

        def _occupancy() -> dict[Labels, float]:
            snap = slots()
            return {(): snap.busy / snap.total}

        def _queued() -> dict[Labels, float]:
            snap = slots()
            return {
                ("foreground",): float(snap.queued_foreground),
                ("background",): float(snap.queued_background),
            }

        def _in_flight() -> dict[Labels, float]:
            return {(): float(in_flight())}

        def _calibration() -> dict[Labels, float]:
            c = self.speed.calibration
            if c is None:
                return {}
            rates = (("decode", c.decode), ("prefill", c.prefill))
            return {(phase,): rate for phase, rate in rates if rate is not None}

        def _recent() -> dict[Labels, float]:
            if self._clock is None:
                return {}
            _, decode, prefill = self.speed.recent(self._clock())
            rates = (("decode", decode), ("prefill", prefill))
            return {(phase,): rate for phase, rate in rates if rate is not None}

        self.gauges = (
            Gauge(p + "slots", "Slots (concurrent generations) this gateway allows.", _slots_total),
            Gauge(p + "slots_busy", "Slots held by a request now.", _slots_busy),
            Gauge(
                p + "slot_occupancy",
                "Busy slots over slots, 0 to 1 (an autoscaling signal, with queued).",
                _occupancy,
            ),
            Gauge(
                p + "queued", "Requests waiting for a slot, by priority.", _queued, ("priority",)
            ),
            Gauge(p + "in_flight", "Requests being handled now (any route).", _in_flight),
            Gauge(
                p + "calibration_tokens_per_second",
                "This replica's speed measured at readiness (a fixed 32-token decode), by "
                "phase (decode, prefill).", _calibration, ("phase",),
            ),
            Gauge(
                p + "recent_tokens_per_second",
                "Speed of the requests served in the last 5 minutes (engine timing), by phase.",
                _recent, ("phase",),
            ),
        )
        # Mean slot hold time, for Retry-After hints.
        self._held = 0
        self._held_seconds = 0.0

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
            self.prompt_tokens,
            self.prefill_seconds,
            self.generated_tokens,
            self.decode_seconds,
            self.prefill_rate,
            self.decode_rate,
            self.ttft,
            self.duration,
            self.prompt_cached,
            self.prompt_evaluated,
            self.rewrites,
            self.reread_seconds,
            self.wait_behind,
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


def slots_document(
    snap: SlotSnapshot, model: str, engine: str, threads: int | None, context: int | None
) -> dict[str, Any]:
    """The body of GET /slots."""
    return {
        "model": model,
        "engine": engine,
        "total": snap.total,
        "busy": snap.busy,
        "free": snap.free,
        "queued": {
            "foreground": snap.queued_foreground,
            "background": snap.queued_background,
        },
        "queue_limit": snap.queue_limit,
        "threads": threads,
        "context": context,
    }
