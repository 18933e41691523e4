"""Trading-day assignment: which exchange-local trading day an event belongs to.

Rule: trading day D runs from `day_roll` local time on D-1 up to `day_roll` on D (in the instrument's
time zone, DST-aware through zoneinfo). With the ES default roll of 18:00 New York time, the Globex
session that opens on Sunday or Monday evening belongs to the next day, as CME counts it. A roll of
"24:00" makes the trading day the local calendar date (equities). Session hours are read on the trading
day's own date.
"""

from __future__ import annotations

from datetime import date, datetime, time, timedelta
from zoneinfo import ZoneInfo

import numpy as np

from fox_numba.market.schema import NS_PER_MINUTE, Instrument

_EPOCH = datetime(1970, 1, 1, tzinfo=ZoneInfo("UTC"))


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


def day_bounds(day: str, instrument: Instrument) -> tuple[int, int]:
    """[start, end) of trading day `day` (YYYY-MM-DD) in UTC nanoseconds."""
    d = date.fromisoformat(day)
    return _day_start(d, instrument), _day_start(d + timedelta(days=1), instrument)


def session_bounds(day: str, instrument: Instrument) -> tuple[int, int]:
    """Regular-session [open, close) of trading day `day` in UTC nanoseconds."""
    d = date.fromisoformat(day)
    tz = instrument.timezone
    return local_ns(d, parse_hhmm(instrument.session_open), tz), local_ns(d, parse_hhmm(instrument.session_close), tz)


def session_minutes(day: str, instrument: Instrument) -> np.ndarray:
    """Start times (uint64 UTC ns) of every minute of the regular session of `day`."""
    start, end = session_bounds(day, instrument)
    return np.arange(start, end, NS_PER_MINUTE, dtype=np.uint64)


def assign_days(ts_event: np.ndarray, instrument: Instrument) -> tuple[list[str], np.ndarray]:
    """The trading days touched by `ts_event` (sorted) and each row's index into that list."""
    ts = np.asarray(ts_event, dtype=np.uint64)
    if ts.size == 0:
        return [], np.zeros(0, dtype=np.int64)
    first = _utc_date(int(ts.min())) - timedelta(days=1)
    last = _utc_date(int(ts.max())) + timedelta(days=2)
    candidates = [first + timedelta(days=k) for k in range((last - first).days + 1)]
    starts = np.array([_day_start(d, instrument) for d in candidates], dtype=np.int64)
    idx = np.searchsorted(starts, ts.astype(np.int64), side="right") - 1
    used, inverse = np.unique(idx, return_inverse=True)
    return [candidates[i].isoformat() for i in used], inverse.astype(np.int64)


def format_ns(ts: int, timezone: str) -> str:
    """A UTC-nanosecond timestamp as local "YYYY-MM-DD HH:MM:SS.ffffff" (for messages and summaries)."""
    moment = _EPOCH + timedelta(microseconds=int(ts) // 1000)
    return moment.astimezone(ZoneInfo(timezone)).strftime("%Y-%m-%d %H:%M:%S.%f")


def _day_start(d: date, instrument: Instrument) -> int:
    roll = parse_hhmm(instrument.day_roll)
    if roll == 24 * 60:
        return local_ns(d, 0, instrument.timezone)
    return local_ns(d - timedelta(days=1), roll, instrument.timezone)


def _utc_date(ts: int) -> date:
    return (_EPOCH + timedelta(microseconds=ts // 1000)).date()
