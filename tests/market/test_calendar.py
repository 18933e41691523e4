"""Trading days and sessions: the CME day rolls at the 17:00 close, holidays follow the exchange calendar."""

from dataclasses import replace
from datetime import UTC, date, datetime

import numpy as np
import pytest

from fox_numba.market.calendar import (
    assign_days,
    closed_dates,
    closed_reason,
    day_bounds,
    format_ns,
    open_ns_between,
    parse_hhmm,
    previous_trading_day,
    session_bounds,
    trading_days,
)
from fox_numba.market.lobster import equity_instrument
from fox_numba.market.schema import Instrument

ES = Instrument()
HOUR = 3600 * 10**9


def ns(text: str) -> int:
    """UTC nanoseconds of an ISO time written in UTC."""
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()) * 1_000_000_000


def test_es_day_rolls_at_the_17_00_close_in_summer_and_winter():
    ts = np.array(
        [
            ns("2024-07-01T20:59:59"),  # 16:59:59 EDT -> Monday's day
            ns("2024-07-01T21:00:00"),  # 17:00 EDT, the daily break -> Tuesday
            ns("2024-07-01T21:45:00"),  # 17:45 EDT, Tuesday's pre-open
            ns("2024-07-01T23:58:01"),  # the nautilus ESU4 sample -> Tuesday
            ns("2024-01-02T21:59:59"),  # 16:59:59 EST -> Tuesday 2 Jan
            ns("2024-01-02T22:00:00"),  # 17:00 EST -> Wednesday 3 Jan
        ],
        dtype=np.uint64,
    )
    days, idx = assign_days(ts, ES)
    assert days == ["2024-01-02", "2024-01-03", "2024-07-01", "2024-07-02"]
    assert [days[i] for i in idx] == ["2024-07-01", "2024-07-02", "2024-07-02", "2024-07-02", "2024-01-02", "2024-01-03"]


def test_day_and_session_bounds():
    assert day_bounds("2024-07-02", ES) == (ns("2024-07-01T21:00:00"), ns("2024-07-02T21:00:00"))
    # Monday's day starts at Friday's close; the Globex reopen on Sunday evening is its full session's open.
    assert day_bounds("2024-07-08", ES) == (ns("2024-07-05T21:00:00"), ns("2024-07-08T21:00:00"))
    assert session_bounds("2024-07-08", ES, "full") == (ns("2024-07-07T22:00:00"), ns("2024-07-08T21:00:00"))
    assert session_bounds("2024-01-02", ES) == (ns("2024-01-02T14:30:00"), ns("2024-01-02T21:00:00"))
    assert session_bounds("2024-01-02", ES, "regular") == session_bounds("2024-01-02", ES)
    # Across the March DST change (Sunday 02:00, while the market is closed) the day starts in EST, ends in EDT.
    assert day_bounds("2024-03-11", ES) == (ns("2024-03-08T22:00:00"), ns("2024-03-11T21:00:00"))
    start, end = session_bounds("2024-03-11", ES, "full")
    assert (start, end) == (ns("2024-03-10T22:00:00"), ns("2024-03-11T21:00:00")) and end - start == 23 * HOUR
    with pytest.raises(ValueError, match="session 'night' is not one of regular, full"):
        session_bounds("2024-01-02", ES, "night")


@pytest.mark.parametrize(
    "year, holidays",
    [
        # NYSE's published schedules (CME equity futures have no trade date on these days either).
        (2021, ["01-01", "01-18", "02-15", "04-02", "05-31", "07-05", "09-06", "11-25", "12-24"]),
        (2022, ["01-17", "02-21", "04-15", "05-30", "06-20", "07-04", "09-05", "11-24", "12-26"]),
        (2023, ["01-02", "01-16", "02-20", "04-07", "05-29", "06-19", "07-04", "09-04", "11-23", "12-25"]),
        (2024, ["01-01", "01-15", "02-19", "03-29", "05-27", "06-19", "07-04", "09-02", "11-28", "12-25"]),
        (2026, ["01-01", "01-19", "02-16", "04-03", "05-25", "06-19", "07-03", "09-07", "11-26", "12-25"]),
    ],
)
def test_us_holidays(year, holidays):
    weekdays = [date.fromordinal(k) for k in range(date(year, 1, 1).toordinal(), date(year + 1, 1, 1).toordinal())]
    closed = [d.strftime("%m-%d") for d in weekdays if d.weekday() < 5 and closed_reason(d, "us")]
    assert closed == holidays


def test_calendars():
    christmas = date(2023, 12, 25)
    assert closed_reason(christmas, "us") == "Christmas Day"
    assert closed_reason(date(2023, 12, 23), "us") == closed_reason(date(2023, 12, 23), "weekdays") == "a Saturday"
    assert closed_reason(christmas, "weekdays") is None and closed_reason(date(2023, 12, 23), "all-days") is None
    assert closed_reason(date(2018, 12, 5), "us") == "national day of mourning (G. H. W. Bush)"
    assert previous_trading_day(date(2023, 12, 26), "us") == date(2023, 12, 22)
    assert trading_days("2024-08-29", 4, "us") == ["2024-08-29", "2024-08-30", "2024-09-03", "2024-09-04"]
    assert trading_days("2024-08-29", 3, "weekdays") == ["2024-08-29", "2024-08-30", "2024-09-02"]
    with pytest.raises(ValueError, match="calendar 'lunar' is not one of us, weekdays, all-days"):
        closed_reason(christmas, "lunar")


def test_a_holiday_evening_reopen_belongs_to_the_next_trading_day():
    """CME reopened on Christmas Day 2023 at 18:00 New York for the 26th (pre-open from 17:00)."""
    evening = np.array([ns("2023-12-25T22:39:55"), ns("2023-12-25T23:00:00"), ns("2023-12-26T14:30:00")], dtype=np.uint64)
    days, idx = assign_days(evening, ES)
    assert days == ["2023-12-26"] and idx.tolist() == [0, 0, 0]
    assert day_bounds("2023-12-26", ES) == (ns("2023-12-22T22:00:00"), ns("2023-12-26T22:00:00"))
    # Without the holiday calendar and with an 18:00 roll the pre-open falls into the 25th, after its open.
    old = replace(ES, day_roll="18:00", calendar="weekdays")
    days, idx = assign_days(evening, old)
    assert days == ["2023-12-25", "2023-12-26"] and idx.tolist() == [0, 1, 1]
    # After a holiday Monday (MLK Day 2024) the full session starts at Monday's reopen.
    assert session_bounds("2024-01-16", ES, "full")[0] == ns("2024-01-15T23:00:00")


def test_closed_dates_are_the_weekend_and_holidays_a_trading_day_spans():
    assert closed_dates("2024-04-01", ES) == [
        (date(2024, 3, 29), "Good Friday"), (date(2024, 3, 30), "a Saturday"), (date(2024, 3, 31), "a Sunday"),
    ]  # fmt: skip
    assert closed_dates("2024-04-02", ES) == []
    assert [d for d, _ in closed_dates("2024-04-01", replace(ES, calendar="weekdays"))] == [date(2024, 3, 30), date(2024, 3, 31)]
    assert closed_dates("2024-03-30", replace(ES, calendar="all-days")) == []


def test_open_time_between_counts_only_full_sessions():
    friday_close = ns("2024-07-05T21:00:00")  # 17:00 EDT
    sunday_reopen = ns("2024-07-07T22:00:00")  # 18:00 EDT
    assert open_ns_between(friday_close - HOUR, sunday_reopen + HOUR, ES) == 2 * HOUR
    assert open_ns_between(friday_close, sunday_reopen, ES) == 0
    tuesday = ns("2024-07-09T12:00:00")
    assert open_ns_between(tuesday, tuesday + 12 * HOUR, ES) == 11 * HOUR  # the 17:00-18:00 break is out
    assert open_ns_between(tuesday, tuesday, ES) == 0


def test_a_24_00_roll_makes_the_trading_day_the_calendar_date():
    aapl = equity_instrument("AAPL")
    assert day_bounds("2012-06-21", aapl) == (ns("2012-06-21T04:00:00"), ns("2012-06-22T04:00:00"))
    assert session_bounds("2012-06-21", aapl, "full") == day_bounds("2012-06-21", aapl)
    days, idx = assign_days(np.array([ns("2012-06-22T03:59:59")], dtype=np.uint64), aapl)
    assert days == ["2012-06-21"] and idx.tolist() == [0]


def test_times_and_formatting():
    assert parse_hhmm("09:30") == 570 and parse_hhmm("24:00") == 1440
    for bad in ("9.30", "24:01", "12:60"):
        with pytest.raises(ValueError):
            parse_hhmm(bad)
    assert format_ns(ns("2024-07-01T23:58:01") + 218_218_853, "America/New_York") == "2024-07-01 19:58:01.218218"
    assert assign_days(np.zeros(0, dtype=np.uint64), ES)[0] == []
