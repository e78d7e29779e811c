"""Awake windows (`spec.idle.awake`): the hours a model is kept awake, with
`now` passed in.

A window is a span of instants, not of wall-clock readings: it starts the
first time the clock of its time zone shows `start` on one of its days, and
ends the first time that clock next shows `end` (the next day when `end` is
earlier than `start`: overnight). Daylight saving time is where the two
differ. A `start` the clock skips (spring forward) starts the window when the
clock jumps past it (and a skipped `end` ends it there); a time the clock
shows twice (fall back) counts at its first showing: the repeated hour neither
starts nor ends a window a second time. `days` name the days
a window *starts* on (an overnight window that starts on Friday ends on
Saturday); none means every day.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")  # date.weekday() order


@dataclass(frozen=True)
class Window:
    """One awake window: from `start` to `end` local time in time zone `zone`
    (an IANA name, checked where the spec is parsed), starting on `days`
    (`DAYS` indices; empty: every day)."""

    start: time
    end: time
    zone: str = "UTC"
    days: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        if self.start == self.end:
            raise ValueError(f"an awake window starts and ends at {self.start:%H:%M}")
        if not self.days <= frozenset(range(7)):
            raise ValueError(f"days are 0 (Mon) to 6 (Sun), not {sorted(self.days)}")

    @classmethod
    def of(cls, start: str, end: str, zone: str = "UTC", days: Iterable[str] = ()) -> Window:
        """From the spec's words: "HH:MM" times and day names (`DAYS`)."""
        return cls(_clock(start), _clock(end), zone, frozenset(DAYS.index(d) for d in days))

    @property
    def overnight(self) -> bool:
        return self.end < self.start

    def spans(self, near: datetime, ahead: int = 0) -> Iterator[tuple[datetime, datetime]]:
        """This window's spans (start, end) as UTC instants that start on the
        local days from the day before ``near`` to ``ahead`` days after it."""
        zone = ZoneInfo(self.zone)
        today = near.astimezone(zone).date()
        for offset in range(-1, ahead + 1):
            day = today + timedelta(days=offset)
            if self.days and day.weekday() not in self.days:
                continue
            end_day = day + timedelta(days=1) if self.overnight else day
            yield first_shown(day, self.start, zone), first_shown(end_day, self.end, zone)


def _clock(text: str) -> time:
    """"HH:MM" (00:00 to 23:59) as a time."""
    hours, sep, minutes = text.partition(":")
    if not (sep and len(hours) == 2 and len(minutes) == 2 and (hours + minutes).isdigit()):
        raise ValueError(f"{text!r} is not HH:MM")
    return time(int(hours), int(minutes))


def first_shown(day: date, at: time, zone: ZoneInfo) -> datetime:
    """The first instant (UTC) the clock in ``zone`` shows ``at`` on ``day``,
    or, when the clock skips it, the instant it jumps past it."""
    earlier = datetime.combine(day, at, zone)  # fold=0: the offset before a change
    later = earlier.replace(fold=1)  # the offset after it
    candidates = [u for u in (earlier, later) if _shows(u, day, at, zone)]
    if candidates:
        return min(u.astimezone(UTC) for u in candidates)
    # Skipped: the clock jumps past it between the two readings (before the
    # jump it reads earlier, after it later); find the jump, to the second.
    wanted = datetime.combine(day, at)
    lo, hi = sorted((int(later.timestamp()), int(earlier.timestamp())))
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _local(datetime.fromtimestamp(mid, UTC), zone) < wanted:
            lo = mid
        else:
            hi = mid
    return datetime.fromtimestamp(hi, UTC)


def _local(instant: datetime, zone: ZoneInfo) -> datetime:
    """The wall-clock reading of ``instant`` in ``zone`` (naive)."""
    return instant.astimezone(zone).replace(tzinfo=None)


def _shows(instant: datetime, day: date, at: time, zone: ZoneInfo) -> bool:
    return _local(instant.astimezone(UTC), zone) == datetime.combine(day, at)


def is_awake_window(windows: Sequence[Window], now: datetime) -> bool:
    """Whether ``now`` (an aware datetime) lies in one of ``windows``."""
    return any(start <= now < end for w in windows for start, end in w.spans(now))


def next_window_start(windows: Sequence[Window], now: datetime) -> datetime | None:
    """The first window start after ``now`` (UTC), or None without windows. A
    start is a wanted wake, even with no request held. A window the clock
    skips whole (02:00 to 03:00 on the night it jumps from 02:00 to 03:00)
    does not happen that day: its span is empty, and it has no start."""
    starts = [start for w in windows for start, end in w.spans(now, ahead=8)
              if now < start < end]
    return min(starts, default=None)


def window_end(windows: Sequence[Window], now: datetime) -> datetime | None:
    """When the window ``now`` lies in ends (the latest end among those that
    hold ``now``), or None outside every window."""
    ends = [end for w in windows for start, end in w.spans(now) if start <= now < end]
    return max(ends, default=None)
