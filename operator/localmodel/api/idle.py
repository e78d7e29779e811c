"""`spec.idle`: when a model may sleep and give its node back, as pydantic models.

Pure data: the fields, their checks and their cross-field rules
(`rules.IDLE_RULES`, `rules.WINDOW_RULES`), and `unknown_time_zones`, the one
check the API server cannot make (it has no time zone database), reported as
the catalog's are (`rules.evaluate.shape_problems`: Valid=False InvalidSpec,
and `localmodel render` exits 2). `spec.py` uses it; README.md (The API) and
docs/validation.md say it.
"""

from __future__ import annotations

import re
import zoneinfo
from typing import Literal

from pydantic import Field, field_validator, model_validator

from localmodel.api.checks import (
    GO_DURATION_MAX_LENGTH,
    GO_DURATION_PATTERN,
    ApiModel,
    Integer,
    enforce,
    go_duration_ns,
)
from localmodel.api.rules import IDLE_RULES, WINDOW_RULES
from localmodel.errors import FieldError

# A wall-clock time of day, 00:00 to 23:59.
CLOCK_PATTERN = r"^([01][0-9]|2[0-3]):[0-5][0-9]$"
# An IANA time zone name's shape ("UTC", "Europe/Berlin", "Etc/GMT+5"): the API
# server checks the shape, the operator that the zone exists (`unknown_time_zones`).
TIME_ZONE_PATTERN = r"^[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+)*$"
TIME_ZONE_MAX_LENGTH = 64

Weekday = Literal["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
IdleRelease = Literal["OnDemand", "WhenAsleep"]

class AwakeWindow(ApiModel):
    """Hours the model is kept awake: woken at the start even with no request
    waiting, and never asked to yield its node inside them."""

    days: list[Weekday] | None = Field(
        None,
        description="Days the window starts on (Mon, Tue, Wed, Thu, Fri, Sat, Sun), each "
        "once; absent: every day.",
        max_length=7,
    )
    from_: str = Field(
        alias="from",
        description="Start, HH:MM (00:00 to 23:59) in timeZone.",
        pattern=CLOCK_PATTERN,
    )
    to: str = Field(
        description="End, HH:MM in timeZone; earlier than `from` means the window runs "
        "past midnight into the next day. Must differ from `from`.",
        pattern=CLOCK_PATTERN,
    )
    time_zone: str = Field(
        "UTC",
        description="IANA time zone of `from` and `to`, e.g. `Europe/Berlin` (daylight "
        "saving included).",
        pattern=TIME_ZONE_PATTERN,
        max_length=TIME_ZONE_MAX_LENGTH,
    )

    @field_validator("days")
    @classmethod
    def _each_day_once(cls, days: list[str] | None) -> list[str] | None:
        # The CRD's `x-kubernetes-list-type: set` refuses a repeated day too.
        if days is not None and len(set(days)) != len(days):
            raise ValueError("each day may appear once")
        return days

    @model_validator(mode="after")
    def _rules(self) -> AwakeWindow:
        return enforce(WINDOW_RULES, self)


class IdleSpec(ApiModel):
    """Sleep when idle: after `after` with no request, the model sleeps (its
    claims and weights stay) and gives its node back when another model needs it;
    a request through the router wakes it. A model serving a request is never
    asked to give its node back (README.md, The API)."""

    after: str = Field(
        description="How long without a request before the model sleeps: a Go duration "
        "from 1m to 168h (7 days), e.g. `30m` or `1h30m`.",
        pattern=GO_DURATION_PATTERN,
        max_length=GO_DURATION_MAX_LENGTH,
    )
    priority: Integer = Field(
        0,
        description="-100 to 100. A model waking for a request may take the node of an "
        "idle model whose priority is at most its own, never of one above it.",
        ge=-100,
        le=100,
    )
    release: IdleRelease = Field(
        "OnDemand",
        description="`OnDemand`: asleep, the model keeps its pod (a request is served at "
        "once) until another model needs the node. `WhenAsleep`: its pods are deleted as "
        "it falls asleep.",
    )
    hold_seconds: Integer = Field(
        120,
        description="Longest a request waits at the router for the model to wake (also "
        "bounded by the request's own deadline); past it, 503 with Retry-After.",
        ge=1,
        le=3600,
    )
    awake: list[AwakeWindow] = Field(
        default_factory=list,
        description="Windows the model is kept awake (woken at their start, never "
        "yielding inside them).",
        max_length=16,
    )

    @model_validator(mode="after")
    def _rules(self) -> IdleSpec:
        return enforce(IDLE_RULES, self)

    @property
    def after_seconds(self) -> float:
        """`after` in seconds, as the API server read it (60 to 604800: the rule)."""
        ns = go_duration_ns(self.after)
        if ns is None:  # (IDLE_RULES refuses any such spec)
            raise ValueError(f"idle.after {self.after!r} is not a Go duration")
        return ns / 1e9


def unknown_time_zones(idle: IdleSpec | None) -> list[FieldError]:
    """Each awake window whose time zone this operator's time zone database does
    not hold (the API server has none: Valid=False, as for an unknown model).
    Paths are rooted at the LocalModel."""
    if idle is None:
        return []
    found = []
    for i, window in enumerate(idle.awake):
        tz = window.time_zone
        if not _known_zone(tz):
            found.append(FieldError(
                f"spec.idle.awake[{i}].timeZone",
                f"{tz!r} is not a time zone this operator knows (an IANA name such as "
                "Europe/Berlin or UTC)"))
    return found


def _known_zone(name: str) -> bool:
    if name == "UTC":  # (the default: known without a database)
        return True
    if not re.fullmatch(TIME_ZONE_PATTERN, name) or len(name) > TIME_ZONE_MAX_LENGTH:
        return False
    try:
        zoneinfo.ZoneInfo(name)
    except Exception:  # not found, a directory, not a zone file: not a zone
        return False
    return True
