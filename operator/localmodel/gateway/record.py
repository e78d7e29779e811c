"""One request's story: its outcome, the log line, its ledger record. Pure.

The aiohttp glue fills a `RequestRecord` as the request moves (queued, given a
slot, first token, finished or cancelled) and hands it to `GatewayMetrics.record`
(gateway/metrics.py), `log_line` and the ledger (`ledger_entry`) at the end.
Times are plain floats from whatever clock the glue uses, so tests can build
records by hand.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from localmodel.gateway.keys import KeyEntry
from localmodel.gateway.ledger import (
    ANONYMOUS,
    MAX_ID,
    Holder,
    behind_text,
    reread,
    top_behind,
)
from localmodel.gateway_contract import LedgerEntry
from localmodel.gateway_contract.timing import EngineTiming
from localmodel.printable import printable

MAX_DETAIL = 512  # characters of a request's detail (an error's message) in its log line


class Outcome(StrEnum):
    """How a request ended: the log's and the metrics' one word for it."""

    OK = "ok"
    BAD_REQUEST = "bad_request"  # 400
    UNAUTHORIZED = "unauthorized"  # 401: keys on, no valid key
    CALLER_LIMIT = "caller_limit"  # 429: the key's concurrency is in use
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
    ASLEEP = "asleep"  # 503, the gateway is closed (POST /yield): the model sleeps


CANCEL_REASONS = {
    Outcome.CANCELLED_DISCONNECT: "disconnect",
    Outcome.CANCELLED_DEADLINE: "deadline",
    Outcome.SHUTDOWN: "shutdown",
}


@dataclass
class RequestRecord:
    """Keeps one request's account as it goes: route, priority, outcome, the time of each step."""

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
    key: KeyEntry | None = None  # the API key it came with (keys on)
    session: str | None = None
    owned: str | None = None  # a router's owned-session key (gateway/owned.py)
    routed: str | None = None  # the router's decision for it (gateway_contract.ROUTE_HEADER)
    wake_wait: float | None = None  # seconds the router held it for a wake (signed)
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
        request_id=printable(rec.request_id, MAX_ID),
        caller=rec.caller,
        session=rec.session,
        priority=rec.priority,
        route=rec.route,
        model=printable(rec.model, MAX_ID),
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
        routed=rec.routed,
        wake_wait_s=rec.wake_wait,
    )


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def log_fields(rec: RequestRecord) -> dict[str, Any]:
    timing = rec.timing or EngineTiming()
    fields: dict[str, Any] = {
        "msg": "request",
        # What the caller sent, bounded and cleaned (localmodel.printable).
        "request_id": printable(rec.request_id, MAX_ID),
        "route": rec.route,
        "priority": rec.priority,
        "model": printable(rec.model, MAX_ID),
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
    if rec.routed is not None:
        fields["routed"] = rec.routed
    if rec.wake_wait is not None:
        fields["wake_wait_ms"] = _ms(rec.wake_wait)
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
        fields["detail"] = printable(rec.detail, MAX_DETAIL)
    return fields


def log_line(rec: RequestRecord, ts: str) -> str:
    return json.dumps({"ts": ts, **log_fields(rec)}, separators=(",", ":"))
