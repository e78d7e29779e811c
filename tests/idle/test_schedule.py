"""Awake windows: days, from/to, overnight, time zones, and daylight saving
time (a skipped start starts the window at the jump, a repeated hour neither
starts it twice nor ends it); tables, then properties over random windows and
instants against a minute-by-minute walk of the local clock."""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from localmodel.idle import DAYS, Window, is_awake_window, next_window_start, window_end

pytestmark = pytest.mark.unit

BERLIN = "Europe/Berlin"


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=UTC)


def at(zone: str, year: int, month: int, day: int, hour: int, minute: int,
       fold: int = 0) -> datetime:
    """A local wall-clock reading in ``zone``, as an instant in UTC (aware
    datetimes in two zones never compare equal at a repeated hour)."""
    local = datetime(year, month, day, hour, minute, tzinfo=ZoneInfo(zone), fold=fold)
    return local.astimezone(UTC)


OFFICE = Window.of("08:00", "18:00", BERLIN, ["Mon", "Tue", "Wed", "Thu", "Fri"])
NIGHT = Window.of("22:00", "06:00", "UTC", ["Fri"])  # overnight, starting on Fridays


@pytest.mark.parametrize(
    ("now", "awake"),
    [
        (at(BERLIN, 2026, 12, 7, 8, 0), True),  # Monday, the start itself
        (at(BERLIN, 2026, 12, 7, 7, 59), False),
        (at(BERLIN, 2026, 12, 7, 17, 59), True),
        (at(BERLIN, 2026, 12, 7, 18, 0), False),  # the end is not in it
        (at(BERLIN, 2026, 12, 12, 10, 0), False),  # Saturday
        (utc(2026, 12, 7, 7, 30), True),  # 08:30 in Berlin (CET, +1)
        (utc(2026, 7, 6, 6, 30), True),  # 08:30 in Berlin (CEST, +2)
        (utc(2026, 7, 6, 16, 30), False),  # 18:30 in Berlin in summer
    ],
)
def test_a_window_holds_from_its_start_to_its_end_on_its_days_in_its_zone(
    now: datetime, awake: bool
) -> None:
    assert is_awake_window([OFFICE], now) is awake


@pytest.mark.parametrize(
    ("now", "awake"),
    [
        (utc(2026, 12, 11, 21, 59), False),  # Friday before
        (utc(2026, 12, 11, 22, 0), True),
        (utc(2026, 12, 12, 3, 0), True),  # Saturday morning: started on Friday
        (utc(2026, 12, 12, 6, 0), False),
        (utc(2026, 12, 12, 23, 0), False),  # Saturday night: no window starts on Saturday
        (utc(2026, 12, 11, 3, 0), False),  # Friday morning: Thursday starts none
    ],
)
def test_an_overnight_window_runs_into_the_next_day_from_the_days_it_starts_on(
    now: datetime, awake: bool
) -> None:
    assert NIGHT.overnight and not OFFICE.overnight
    assert is_awake_window([NIGHT], now) is awake


def test_no_windows_is_never_awake_and_has_no_next_start() -> None:
    now = utc(2026, 12, 7, 12, 0)
    assert not is_awake_window([], now)
    assert next_window_start([], now) is None and window_end([], now) is None


def test_the_next_start_and_the_end() -> None:
    friday_evening = at(BERLIN, 2026, 12, 11, 19, 0)
    assert next_window_start([OFFICE], friday_evening) == at(BERLIN, 2026, 12, 14, 8, 0)
    assert window_end([OFFICE], friday_evening) is None
    monday = at(BERLIN, 2026, 12, 14, 9, 0)
    assert window_end([OFFICE], monday) == at(BERLIN, 2026, 12, 14, 18, 0)
    both = [OFFICE, Window.of("17:00", "20:00", BERLIN)]
    assert window_end(both, at(BERLIN, 2026, 12, 14, 17, 30)) == at(BERLIN, 2026, 12, 14, 20, 0)
    assert next_window_start(both, friday_evening) == at(BERLIN, 2026, 12, 12, 17, 0)


def test_a_start_the_clock_skips_starts_the_window_at_the_jump() -> None:
    """Berlin, 29 March 2026: 02:00 CET becomes 03:00 CEST at 01:00 UTC."""
    w = Window.of("02:30", "04:00", BERLIN)
    assert next_window_start([w], utc(2026, 3, 28, 12, 0)) == utc(2026, 3, 29, 1, 0)
    assert not is_awake_window([w], utc(2026, 3, 29, 0, 59))
    assert is_awake_window([w], utc(2026, 3, 29, 1, 0))  # 03:00 CEST
    assert not is_awake_window([w], utc(2026, 3, 29, 2, 0))  # 04:00 CEST
    # An end the clock skips ends it at the jump.
    early = Window.of("01:00", "02:30", BERLIN)
    assert window_end([early], utc(2026, 3, 29, 0, 30)) == utc(2026, 3, 29, 1, 0)


def test_a_repeated_hour_starts_the_window_once_and_does_not_end_it() -> None:
    """Berlin, 25 October 2026: 03:00 CEST becomes 02:00 CET at 01:00 UTC."""
    w = Window.of("02:30", "04:00", BERLIN)
    first = at(BERLIN, 2026, 10, 25, 2, 30, fold=0)  # 00:30 UTC
    assert next_window_start([w], utc(2026, 10, 24, 12, 0)) == first
    # 02:00 to 02:30 again (CET): still awake, though the wall clock reads before the start.
    assert is_awake_window([w], at(BERLIN, 2026, 10, 25, 2, 10, fold=1))
    assert window_end([w], first) == at(BERLIN, 2026, 10, 25, 4, 0)  # 03:00 UTC: 3.5 h


def test_a_windows_words_are_checked() -> None:
    assert Window.of("23:59", "00:00", days=["Sun"]).days == frozenset({6})
    for bad in ("8:00", "24:00", "08:60", "0800", "ab:cd"):
        with pytest.raises(ValueError):
            Window.of(bad, "09:00")
    with pytest.raises(ValueError):
        Window.of("08:00", "08:00")
    with pytest.raises(ValueError):
        Window.of("08:00", "09:00", days=["Someday"])


# ---------------------------------------------------------------- properties

ZONES = ["UTC", BERLIN, "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata",
         "America/Santiago", "Pacific/Chatham"]


def transitions(zone: str) -> list[datetime]:
    """The instants (UTC, whole minutes) in 2026 and 2027 when ``zone``'s
    offset changes, found hour by hour then minute by minute."""
    tz, found = ZoneInfo(zone), []
    t = datetime(2026, 1, 1, tzinfo=UTC)
    while t.year < 2028:
        nxt = t + timedelta(hours=1)
        if t.astimezone(tz).utcoffset() != nxt.astimezone(tz).utcoffset():
            m = t
            while m.astimezone(tz).utcoffset() == t.astimezone(tz).utcoffset():
                m += timedelta(minutes=1)
            found.append(m)
        t = nxt
    return found


TRANSITIONS = {zone: transitions(zone) for zone in ZONES}


@st.composite
def cases(draw: st.DrawFn) -> tuple[Window, datetime]:
    """A window on quarter hours and an instant on a whole minute; half of
    them at one of the zone's offset changes: the window's start or end within
    an hour and a half of its local time, the instant within three hours."""
    zone = draw(st.sampled_from(ZONES))
    quarters = st.integers(0, 24 * 4 - 1)
    start, end = draw(quarters), draw(quarters)
    instant = draw(st.datetimes(datetime(2026, 1, 1), datetime(2027, 12, 31))).replace(
        second=0, microsecond=0, tzinfo=UTC)
    at_a_change = draw(st.booleans())
    if at_a_change and TRANSITIONS[zone]:
        change = draw(st.sampled_from(TRANSITIONS[zone]))
        local = (change + timedelta(minutes=draw(st.integers(-90, 90)))).astimezone(ZoneInfo(zone))
        near = local.hour * 4 + local.minute // 15
        start, end = (near, end) if draw(st.booleans()) else (start, near)
        instant = change + timedelta(minutes=draw(st.integers(-180, 180)))
    if start == end:
        end = (end + 1) % 96
    days = draw(st.lists(st.sampled_from(DAYS), max_size=7, unique=True))
    w = Window.of(f"{start // 4:02d}:{start % 4 * 15:02d}", f"{end // 4:02d}:{end % 4 * 15:02d}",
                  zone, days)
    return w, instant


def walked(w: Window, now: datetime) -> bool:
    """Awake by walking the local clock minute by minute back from ``now``
    (up to two days): the window holds when the clock showed a start on one
    of its days since it last showed the end (a showing again in a repeated
    hour is neither).
    Within one minute (a jump), the mark the clock reached later is the
    later event."""
    zone = ZoneInfo(w.zone)
    t = now
    for _ in range(2 * 24 * 60 + 120):
        local = t.astimezone(zone)
        before = (t - timedelta(minutes=1)).astimezone(zone)
        ended = None if _repeat(t, zone, w.end) else _reached(before, local, w.end)
        started = _reached(before, local, w.start)
        if started is not None and (
            (w.days and started.weekday() not in w.days) or _repeat(t, zone, w.start)
        ):
            started = None
        if ended is not None and (started is None or ended > started):
            return False
        if started is not None:
            return True
        t -= timedelta(minutes=1)
    return False


def _reached(before: datetime, local: datetime, mark: time) -> datetime | None:
    """The local reading of ``mark`` the clock reached in the minute from
    ``before`` to ``local`` (it showed it, or jumped over it), if any."""
    b, a = before.replace(tzinfo=None), local.replace(tzinfo=None)
    if a < b:  # the clock went back: only reaching it again forwards counts
        return None
    for day in sorted({b.date(), a.date()}):
        m = datetime.combine(day, mark)
        if b < m <= a:
            return m
    return None


def _repeat(t: datetime, zone: ZoneInfo, mark: time) -> bool:
    """Whether the clock showed ``mark`` at ``t`` for the second time that day."""
    local = t.astimezone(zone)
    return local.fold == 1 and local.replace(tzinfo=None).time() == mark


@settings(max_examples=400, deadline=None)
@given(cases())
def test_awake_agrees_with_a_minute_by_minute_walk_of_the_local_clock(
    case: tuple[Window, datetime],
) -> None:
    w, now = case
    assert is_awake_window([w], now) == walked(w, now)


@settings(max_examples=400, deadline=None)
@given(cases())
@example(  # found by hypothesis: a window inside the hour the clock skips
    (Window.of("02:00", "03:00", "Europe/Berlin"), datetime(2026, 3, 29, 0, 59, tzinfo=UTC)))
def test_the_next_start_is_the_first_instant_the_window_holds_again(
    case: tuple[Window, datetime],
) -> None:
    w, now = case
    start = next_window_start([w], now)
    assert start is not None and start > now and start - now <= timedelta(days=8)
    assert is_awake_window([w], start)
    # Nothing between: the window did not start earlier (an awake stretch
    # before it is the current window, which ends before it).
    end = window_end([w], now)
    just_before = start - timedelta(minutes=1)
    assert just_before <= now or not is_awake_window([w], just_before) or (
        end is not None and just_before < end)
    step = now + timedelta(minutes=1)
    while step < start:
        assert is_awake_window([w], step) == (end is not None and step < end)
        step += timedelta(minutes=15)
