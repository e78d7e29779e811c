"""The operator's one spelling of a moment: RFC 3339 in whole seconds, UTC, as
the API's `metav1.Time` carries it (`rfc3339`), and back (`epoch`). Pure."""

from __future__ import annotations

import datetime as dt

_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def rfc3339(now: float) -> str:
    return dt.datetime.fromtimestamp(now, dt.UTC).strftime(_FORMAT)


def epoch(text: str) -> float | None:
    """Seconds since the epoch of an RFC 3339 time in whole seconds, UTC (None: not one)."""
    try:
        return dt.datetime.strptime(text, _FORMAT).replace(tzinfo=dt.UTC).timestamp()
    except ValueError:
        return None
