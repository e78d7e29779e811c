"""A replica's /slots and /speed answers, parsed at the edge. Pure.

The gateway answering is the tenant's image, so an answer may be anything.
Both documents go through the operator's /speed reader's decoder
(gateway_contract/speed_answer.py: bounded size, strict UTF-8 JSON, no NaN or
Infinity, any decoder failure one `BadDocument`), and every number the router
keeps is checked here against a named bound; nothing else is read. A bad
answer leaves that replica's state unknown, which keeps sessions on their
owner (router/decide.py); it never raises past the reader.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from localmodel.gateway_contract.headers import owned_key
from localmodel.gateway_contract.speed_answer import (
    MAX_COUNT,
    BadDocument,
    decode,
    reading_from,
)

MAX_OWNED = 1024  # owned_sessions entries: a gateway lists 512; more is a bad answer

MAX_SLOTS = 4096  # a gateway's --slots: far past any CPU's
TRAFFIC_TOKENS = 256  # prompt tokens read before traffic's prefill rate replaces the calibration's
__all__ = ["MAX_OWNED", "MAX_SLOTS", "BadDocument", "Slots", "Speed", "slots_from",
           "speed_from"]


@dataclass(frozen=True)
class Slots:
    """What a replica's /slots said: total, occupied, and the sessions it owns."""

    total: int
    occupied: int  # busy + queued (both priorities)
    # The sessions routers sent here as their owner (gateway/owned.py); a
    # gateway from before the list answers without it: none.
    owned: frozenset[str] = field(default_factory=frozenset)


@dataclass(frozen=True)
class Speed:
    """What a replica's /speed said: prefill speed and mean request seconds."""

    prefill_tps: float | None
    mean_request_s: float | None  # engine seconds per request, all so far


def _whole(value: Any, where: str, low: int, high: float) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        shown = value if isinstance(value, int) and abs(value) < 10**18 else type(value).__name__
        raise BadDocument(f"{where} is {shown}, not a whole number from {low} to {high:g}")
    return value


def slots_from(raw: bytes) -> Slots:
    """GET /slots (the gateway's slots_document) as `Slots`; BadDocument otherwise."""
    doc = decode(raw)
    if not isinstance(doc, Mapping):
        raise BadDocument("not a /slots document")
    queued = doc.get("queued")
    if not isinstance(queued, Mapping):
        raise BadDocument("queued is not an object")
    total = _whole(doc.get("total"), "total", 1, MAX_SLOTS)
    busy = _whole(doc.get("busy"), "busy", 0, MAX_SLOTS)
    waiting = sum(_whole(queued.get(k), f"queued.{k}", 0, MAX_COUNT)
                  for k in ("foreground", "background"))
    return Slots(total=total, occupied=busy + waiting, owned=_owned(doc.get("owned_sessions")))


def _owned(value: Any) -> frozenset[str]:
    if value is None:
        return frozenset()
    if not isinstance(value, list) or len(value) > MAX_OWNED:
        raise BadDocument(f"owned_sessions is not a list of at most {MAX_OWNED} session keys")
    for key in value:
        if not isinstance(key, str) or owned_key(key) is None:
            raise BadDocument("owned_sessions holds something that is not a session key")
    return frozenset(value)


def speed_from(raw: bytes, at: float) -> Speed:
    """GET /speed as `Speed`: prefill rate (all traffic's once it read
    TRAFFIC_TOKENS, else the calibration's),
    mean engine seconds per request; BadDocument otherwise."""
    reading = reading_from(decode(raw), at, "")
    t = reading.totals
    # Real traffic's rate once it has read enough (long prompts read slower
    # per token than the calibration's short one), else the calibration's.
    prefill = reading.calibration.prefill
    if t.prefill_seconds > 0 and (t.prompt_tokens >= TRAFFIC_TOKENS
                                  or (prefill is None and t.prompt_tokens > 0)):
        prefill = t.prompt_tokens / t.prefill_seconds
    if prefill is not None and not 0 < prefill < 1e9:
        prefill = None
    mean = (t.decode_seconds + t.prefill_seconds) / t.requests if t.requests else None
    return Speed(prefill_tps=prefill, mean_request_s=mean)
