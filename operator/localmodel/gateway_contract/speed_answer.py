"""A replica's GET /speed answer, parsed at the edge: untrusted bytes in, a
bounded `Reading` out, or `BadDocument`.

The gateway that answers is the tenant's image (`spec.gateway.image`), so the
answer may be anything: not UTF-8, not JSON, nested past the recursion limit,
`NaN`, `1e999`, a 4,000-digit integer, a string where a number goes. Every one
of them is one exception here, `BadDocument`, which the reader counts as that
replica's bad answer; nothing behind this module sees raw JSON, and every
number it lets through is finite, non-negative and inside a named bound, so the
speed verdicts and the status built from them (localmodel/speed.py,
localmodel/status.py) cannot overflow, divide into NaN or fail validation.

A field that is absent or null reads as not measured (as the gateway writes a
replica that has not calibrated yet); a field that is there must be right.
`activity` (the idle signal: slot requests in flight, queued, arrived, idle
seconds, closed) absent or null is a gateway older than it: `Reading.activity`
None, never an error; present, every part of it must be right.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, NoReturn

from localmodel.speed import MAX_RATE, Activity, Rates, Reading, Totals

# The longest answer read (the reader stops there and calls it a bad answer; a
# longer one is never parsed cut short): a /speed document is about 500 bytes.
READ_MAX_BYTES = 64 * 1024
# Counters (requests, tokens, seconds of engine time) and the calibration's epoch
# time: past 2^53 a float no longer holds every whole unit, and a gateway counting a
# million requests a second would need 285 years to get there.
MAX_COUNT = 2.0**53
# Requests in flight or queued at one gateway at once: its slots, queue and
# bodies being read are far fewer (a million would be a gateway lying).
MAX_ACTIVE = 1_000_000
# Seconds a gateway can have been idle: ten years of uptime.
MAX_IDLE_SECONDS = 10 * 365 * 86400.0


class BadDocument(ValueError):
    """A /speed answer that is not the gateway's document."""


def _no_constant(name: str) -> NoReturn:
    raise BadDocument(f"{name} is not a number")


def decode(raw: bytes) -> Any:
    """JSON from a replica's bytes: strict UTF-8, no NaN or Infinity; BadDocument
    for anything else (deep nesting's RecursionError and a long integer's
    ValueError among them)."""
    if len(raw) > READ_MAX_BYTES:
        raise BadDocument(f"longer than {READ_MAX_BYTES} bytes")
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except BadDocument:
        raise
    except Exception as exc:  # whatever the decoder trips on is the answer's fault
        raise BadDocument(f"not JSON ({type(exc).__name__})") from exc


_KINDS = {str: "a string", bool: "a boolean", list: "a list", dict: "an object",
          type(None): "null"}


def _shown(value: Any) -> str:
    """A bounded word for a refused value (log lines carry it; the value is the tenant's)."""
    if isinstance(value, float) or (type(value) is int and abs(value) < 10**18):
        return f"{value:.6g}"
    return _KINDS.get(type(value), "a huge integer" if type(value) is int else "not JSON")


def _number(value: Any, where: str, top: float) -> float | None:
    """None when absent; a float from 0 to `top`; BadDocument for anything else
    (NaN fails both comparisons, an integer past a float's range compares exactly)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= top:
        raise BadDocument(f"{where} is {_shown(value)}, not a number from 0 to {top:g}")
    return float(value)


def _count(value: Any, where: str) -> int:
    number = _number(value, where, MAX_COUNT)
    if number is None:
        return 0
    if not number.is_integer():
        raise BadDocument(f"{where} is {_shown(value)}, not a whole number")
    return int(number)


def _whole(value: Any, where: str, top: float) -> int:
    """A whole number from 0 to `top`; BadDocument for anything else, absent included."""
    if value is None:
        raise BadDocument(f"{where} is missing")
    number = _number(value, where, top)
    assert number is not None
    if not number.is_integer():
        raise BadDocument(f"{where} is {_shown(value)}, not a whole number")
    return int(number)


def activity_from(doc: Mapping[str, Any]) -> Activity | None:
    """The document's `activity` (None: absent or null, an older gateway);
    BadDocument when it is there and not right, each part required."""
    value = doc.get("activity")
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise BadDocument(f"activity is {_shown(value)}, not an object")
    idle = value.get("idle_seconds")
    if idle is None:
        raise BadDocument("activity.idle_seconds is missing")
    closed = value.get("closed", False)
    if not isinstance(closed, bool):
        raise BadDocument(f"activity.closed is {_shown(closed)}, not a boolean")
    in_flight = _whole(value.get("in_flight"), "activity.in_flight", MAX_ACTIVE)
    queued = _whole(value.get("queued"), "activity.queued", MAX_ACTIVE)
    if queued > in_flight:
        raise BadDocument(f"activity.queued ({queued}) is more than in_flight ({in_flight})")
    return Activity(
        in_flight=in_flight,
        queued=queued,
        arrived=_whole(value.get("arrived"), "activity.arrived", MAX_COUNT),
        idle_seconds=_number(idle, "activity.idle_seconds", MAX_IDLE_SECONDS) or 0.0,
        closed=closed,
    )


def _mapping(doc: Mapping[str, Any], key: str, required: bool) -> Mapping[str, Any]:
    value = doc.get(key)
    if value is None and not required:
        return {}
    if not isinstance(value, Mapping):
        raise BadDocument(f"{key} is {_shown(value)}, not an object")
    return value


def reading_from(doc: Any, at: float, uid: str) -> Reading:
    """A gateway's /speed document (decoded JSON) as a `Reading`; BadDocument when
    it is not one."""
    if not isinstance(doc, Mapping):
        raise BadDocument(f"not a /speed document ({_shown(doc)})")
    totals = _mapping(doc, "totals", required=True)
    cal = _mapping(doc, "calibration", required=False)

    def amount(key: str) -> float:
        return _number(totals.get(key), f"totals.{key}", MAX_COUNT) or 0.0

    return Reading(
        at=at,
        calibration=Rates(
            _number(cal.get("decode_tokens_per_second"),
                    "calibration.decode_tokens_per_second", MAX_RATE),
            _number(cal.get("prefill_tokens_per_second"),
                    "calibration.prefill_tokens_per_second", MAX_RATE)),
        calibrated_at=_number(cal.get("at"), "calibration.at", MAX_COUNT),
        totals=Totals(
            requests=_count(totals.get("requests"), "totals.requests"),
            generated_tokens=amount("generated_tokens"),
            decode_seconds=amount("decode_seconds"),
            prompt_tokens=amount("prompt_tokens"),
            prefill_seconds=amount("prefill_seconds"),
        ),
        pod_uid=uid,
        activity=activity_from(doc),
    )


def reading_from_answer(raw: bytes, at: float, uid: str) -> Reading:
    """A replica's answer, as read, as a `Reading`; BadDocument when it is not one."""
    return reading_from(decode(raw), at, uid)
