"""Trading days and sessions: which exchange-local trading day an event belongs to, and its hours.

Rule: trading day D runs from `day_roll` local time on the trading day before D (by the instrument's
exchange calendar) up to `day_roll` on D, in the instrument's time zone (DST-aware through zoneinfo).
For CME equity futures the day rolls at the Globex close, 17:00 New York time: the daily break
17:00-18:00 and its pre-open belong to the next trading day, and so does everything from Friday's close
(or a holiday eve's) to the next trading day's close: the Sunday or holiday evening reopen and its
pre-open. Rows in the regular hours of a closed date inside D (`closed_dates`: a holiday's abbreviated
Globex session, which CME books on the next trade date, or a session the calendar does not know) are
refused by validation: D would hold two sessions and the gap between; `--calendar weekdays` keeps such a
date a trading day of its own. A roll of "24:00" makes the trading day the local calendar date (equities).

Two sessions of trading day D (`SESSIONS`, chosen per run with `market.session`):
- "regular": `session_open` to `session_close` on D (ES: 09:30-16:00 New York);
- "full": `day_open` on the calendar day before D to `day_roll` on D (ES: the Globex day, 18:00-17:00
  New York; for equities, with day_open = day_roll = "24:00", the whole calendar date). After a holiday
  the full session starts at the last reopen.

Exchange calendars (`CALENDARS`): "us" is the NYSE holiday schedule, which CME equity futures follow for
their trade dates (New Year's Day, Martin Luther King Jr. Day, Washington's Birthday, Good Friday,
Memorial Day, Juneteenth from 2022, Independence Day, Labor Day, Thanksgiving, Christmas, with the NYSE's
Saturday/Sunday observance rules, and the full-day closures since 2001); early closes are not modelled.
"weekdays" is Monday to Friday without holidays, "all-days" every calendar date.
"""

from __future__ import annotations

import functools
from datetime import date, datetime, time, timedelta
from zoneinfo import ZoneInfo

import numpy as np

from fox_numba.config import CHOICES
from fox_numba.market.schema import NS_PER_MINUTE, Instrument

CALENDARS = ("us", "weekdays", "all-days")
"""Exchange calendars an instrument may name (`Instrument.calendar`)."""
SESSIONS = CHOICES["market.session"]
"""Sessions a run may use (`market.session`): regular hours, or the whole trading day."""

US_CLOSURES = {
    date(2001, 9, 11): "closed after the 11 September attacks",
    date(2001, 9, 12): "closed after the 11 September attacks",
    date(2001, 9, 13): "closed after the 11 September attacks",
    date(2001, 9, 14): "closed after the 11 September attacks",
    date(2004, 6, 11): "national day of mourning (Reagan)",
    date(2007, 1, 2): "national day of mourning (Ford)",
    date(2012, 10, 29): "closed for Hurricane Sandy",
    date(2012, 10, 30): "closed for Hurricane Sandy",
    date(2018, 12, 5): "national day of mourning (G. H. W. Bush)",
    date(2025, 1, 9): "national day of mourning (Carter)",
}
"""Full-day NYSE closures outside the holiday rules."""

_EPOCH = datetime(1970, 1, 1, tzinfo=ZoneInfo("UTC"))
_WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_HOLIDAY_RUN = 14
"""More calendar days than any run of non-trading days (the longest: 4 closed days and a weekend, 2001)."""


def parse_hhmm(text: str) -> int:
    """Minutes after local midnight of an "HH:MM" time; "24:00" is allowed (end of day)."""
    try:
        hh, mm = text.split(":")
        minutes = int(hh) * 60 + int(mm)
    except ValueError:
        raise ValueError(f"time {text!r} is not HH:MM") from None
    if not 0 <= int(mm) < 60 or not 0 <= minutes <= 24 * 60:
        raise ValueError(f"time {text!r} is not a time of day")
    return minutes


def local_ns(day: date, minutes: int, timezone: str) -> int:
    """UTC nanoseconds of local wall-clock time `minutes` after midnight on `day` (24:00 = next midnight)."""
    wall = datetime.combine(day, time(0)) + timedelta(minutes=minutes)
    delta = wall.replace(tzinfo=ZoneInfo(timezone)) - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1000


def closed_reason(d: date, calendar: str) -> str | None:
    """Why `d` is not a trading day of `calendar` ("a Saturday", "Christmas Day"), or None if it is one."""
    if calendar not in CALENDARS:
        raise ValueError(f"calendar {calendar!r} is not one of {', '.join(CALENDARS)}")
    if calendar == "all-days":
        return None
    if d.weekday() >= 5:
        return f"a {_WEEKDAYS[d.weekday()]}"
    return _us_holidays(d.year).get(d) if calendar == "us" else None


def is_trading_day(d: date, calendar: str) -> bool:
    return closed_reason(d, calendar) is None


def previous_trading_day(d: date, calendar: str) -> date:
    """The last trading day of `calendar` before `d`."""
    d -= timedelta(days=1)
    while not is_trading_day(d, calendar):
        d -= timedelta(days=1)
    return d


def trading_days(start: str, n: int, calendar: str) -> list[str]:
    """The first `n` trading days of `calendar` from `start` on (YYYY-MM-DD)."""
    out, d = [], date.fromisoformat(start)
    while len(out) < n:
        if is_trading_day(d, calendar):
            out.append(d.isoformat())
        d += timedelta(days=1)
    return out


def day_bounds(day: str, instrument: Instrument) -> tuple[int, int]:
    """[start, end) of trading day `day` (YYYY-MM-DD) in UTC nanoseconds: from the day roll on the trading
    day before it to the day roll on it."""
    d = date.fromisoformat(day)
    return _roll_ns(previous_trading_day(d, instrument.calendar), instrument), _roll_ns(d, instrument)


def session_bounds(day: str, instrument: Instrument, session: str = "regular") -> tuple[int, int]:
    """[open, close) of `session` ("regular" or "full", see the module docstring) of trading day `day`, UTC ns."""
    d = date.fromisoformat(day)
    tz = instrument.timezone
    if session == "regular":
        open_min, close_min = parse_hhmm(instrument.session_open), parse_hhmm(instrument.session_close)
        return local_ns(d, open_min, tz), local_ns(d, close_min, tz)
    if session == "full":
        return local_ns(d - timedelta(days=1), parse_hhmm(instrument.day_open), tz), _roll_ns(d, instrument)
    raise ValueError(f"session {session!r} is not one of {', '.join(SESSIONS)}")


def closed_dates(day: str, instrument: Instrument) -> list[tuple[date, str]]:
    """The calendar dates that trading day `day` spans but that are not trading days (a weekend, a holiday),
    each with the reason it is closed: rows in their regular hours are a session of their own, not `day`'s."""
    d = date.fromisoformat(day)
    before = previous_trading_day(d, instrument.calendar)
    spanned = (before + timedelta(days=k) for k in range(1, (d - before).days))
    return [(c, str(closed_reason(c, instrument.calendar))) for c in spanned]


def session_minutes(day: str, instrument: Instrument, session: str = "regular") -> np.ndarray:
    """Start times (uint64 UTC ns) of every minute of `session` of `day`."""
    start, end = session_bounds(day, instrument, session)
    return np.arange(start, end, NS_PER_MINUTE, dtype=np.uint64)


def bars_in_session(bar_ts: np.ndarray, day: str, instrument: Instrument, session: str) -> np.ndarray:
    """Indices of the 1-minute bars (minute starts, UTC ns) that start and end inside `session` of `day`."""
    open_ns, close_ns = session_bounds(day, instrument, session)
    ts = np.asarray(bar_ts).astype(np.int64)
    return np.flatnonzero((ts >= open_ns) & (ts + NS_PER_MINUTE <= close_ns))


def assign_days(ts_event: np.ndarray, instrument: Instrument) -> tuple[list[str], np.ndarray]:
    """The trading days touched by `ts_event` (sorted) and each row's index into that list."""
    ts = np.asarray(ts_event, dtype=np.uint64)
    if ts.size == 0:
        return [], np.zeros(0, dtype=np.int64)
    first = _utc_date(int(ts.min())) - timedelta(days=2)
    last = _utc_date(int(ts.max())) + timedelta(days=_HOLIDAY_RUN)
    candidates = [
        d for k in range((last - first).days + 1) if is_trading_day(d := first + timedelta(days=k), instrument.calendar)
    ]
    ends = np.array([_roll_ns(d, instrument) for d in candidates], dtype=np.int64)
    idx = np.searchsorted(ends, ts.astype(np.int64), side="right")
    used, inverse = np.unique(idx, return_inverse=True)
    return [candidates[i].isoformat() for i in used], inverse.astype(np.int64)


def open_ns_between(start: int, end: int, instrument: Instrument) -> int:
    """Nanoseconds of [start, end) inside the full session of some trading day (when the market is open)."""
    total = 0
    d, last = _utc_date(start) - timedelta(days=1), _utc_date(max(start, end)) + timedelta(days=2)
    while d <= last:
        if is_trading_day(d, instrument.calendar):
            lo, hi = session_bounds(d.isoformat(), instrument, "full")
            total += max(0, min(hi, end) - max(lo, start))
        d += timedelta(days=1)
    return total


def format_ns(ts: int, timezone: str) -> str:
    """A UTC-nanosecond timestamp as local "YYYY-MM-DD HH:MM:SS.ffffff" (for messages and summaries)."""
    moment = _EPOCH + timedelta(microseconds=int(ts) // 1000)
    return moment.astimezone(ZoneInfo(timezone)).strftime("%Y-%m-%d %H:%M:%S.%f")


def _roll_ns(d: date, instrument: Instrument) -> int:
    """The day roll on calendar day `d` (the end of trading day `d`), UTC ns."""
    return local_ns(d, parse_hhmm(instrument.day_roll), instrument.timezone)


def _utc_date(ts: int) -> date:
    return (_EPOCH + timedelta(microseconds=ts // 1000)).date()


def _nth_weekday(year: int, month: int, weekday: int, n: int) -> date:
    """The n-th (1-based; -1: the last) `weekday` (0 = Monday) of a month."""
    if n > 0:
        first = date(year, month, 1)
        return first + timedelta(days=(weekday - first.weekday()) % 7 + 7 * (n - 1))
    last = date(year + month // 12, month % 12 + 1, 1) - timedelta(days=1)
    return last - timedelta(days=(last.weekday() - weekday) % 7)


def _easter(year: int) -> date:
    """Western Easter Sunday (the anonymous Gregorian algorithm)."""
    a, b, c = year % 19, year // 100, year % 100
    d, e = b // 4, b % 4
    g = (8 * b + 13) // 25
    h = (19 * a + b - d - g + 15) % 30
    i, k = c // 4, c % 4
    weekday = (32 + 2 * e + 2 * i - h - k) % 7
    m = (a + 11 * h + 19 * weekday) // 433
    month = (h + weekday - 7 * m + 90) // 25
    return date(year, month, (h + weekday - 7 * m + 33 * month + 19) % 32)


def _observed(d: date) -> date:
    """NYSE observance: a Saturday holiday is taken on the Friday before, a Sunday one on the Monday after."""
    return d - timedelta(days=1) if d.weekday() == 5 else d + timedelta(days=1) if d.weekday() == 6 else d


@functools.cache
def _us_holidays(year: int) -> dict[date, str]:
    """NYSE full-day holidays and closures of one year."""
    out: dict[date, str] = {}
    new_year = date(year, 1, 1)
    if new_year.weekday() != 5:  # a Saturday New Year's Day is not made up on the Friday before
        out[_observed(new_year)] = "New Year's Day"
    if year >= 1998:
        out[_nth_weekday(year, 1, 0, 3)] = "Martin Luther King Jr. Day"
    out[_nth_weekday(year, 2, 0, 3)] = "Washington's Birthday"
    out[_easter(year) - timedelta(days=2)] = "Good Friday"
    out[_nth_weekday(year, 5, 0, -1)] = "Memorial Day"
    if year >= 2022:
        out[_observed(date(year, 6, 19))] = "Juneteenth"
    out[_observed(date(year, 7, 4))] = "Independence Day"
    out[_nth_weekday(year, 9, 0, 1)] = "Labor Day"
    out[_nth_weekday(year, 11, 3, 4)] = "Thanksgiving Day"
    out[_observed(date(year, 12, 25))] = "Christmas Day"
    out.update({d: why for d, why in US_CLOSURES.items() if d.year == year})
    return out
