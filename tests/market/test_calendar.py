"""Trading-day assignment: the CME evening session belongs to the next day, across DST changes."""

from datetime import UTC, datetime

import numpy as np
import pytest

from fox_numba.market.calendar import assign_days, day_bounds, format_ns, parse_hhmm, session_bounds
from fox_numba.market.lobster import equity_instrument
from fox_numba.market.schema import Instrument

ES = Instrument()


def ns(text: str) -> int:
    """UTC nanoseconds of an ISO time written in UTC."""
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()) * 1_000_000_000


def test_es_evening_session_rolls_at_18_new_york_time_in_summer_and_winter():
    ts = np.array(
        [
            ns("2024-07-01T21:59:59"),  # 17:59:59 EDT -> Monday's day
            ns("2024-07-01T22:00:00"),  # 18:00 EDT -> Tuesday
            ns("2024-07-01T23:58:01"),  # the nautilus ESU4 sample -> Tuesday
            ns("2024-01-02T22:59:59"),  # 17:59:59 EST -> Tuesday 2 Jan
            ns("2024-01-02T23:00:00"),  # 18:00 EST -> Wednesday 3 Jan
        ],
        dtype=np.uint64,
    )
    days, idx = assign_days(ts, ES)
    assert days == ["2024-01-02", "2024-01-03", "2024-07-01", "2024-07-02"]
    assert [days[i] for i in idx] == ["2024-07-01", "2024-07-02", "2024-07-02", "2024-01-02", "2024-01-03"]


def test_day_and_session_bounds():
    assert day_bounds("2024-07-02", ES) == (ns("2024-07-01T22:00:00"), ns("2024-07-02T22:00:00"))
    # The day after the March DST change is 23 hours long.
    start, end = day_bounds("2024-03-11", ES)
    assert (start, end) == (ns("2024-03-10T22:00:00"), ns("2024-03-11T22:00:00"))
    assert day_bounds("2024-03-10", ES)[1] - day_bounds("2024-03-10", ES)[0] == 23 * 3600 * 10**9
    assert session_bounds("2024-01-02", ES) == (ns("2024-01-02T14:30:00"), ns("2024-01-02T21:00:00"))


def test_a_24_00_roll_makes_the_trading_day_the_calendar_date():
    aapl = equity_instrument("AAPL")
    assert day_bounds("2012-06-21", aapl) == (ns("2012-06-21T04:00:00"), ns("2012-06-22T04:00:00"))
    days, idx = assign_days(np.array([ns("2012-06-22T03:59:59")], dtype=np.uint64), aapl)
    assert days == ["2012-06-21"] and idx.tolist() == [0]


def test_times_and_formatting():
    assert parse_hhmm("09:30") == 570 and parse_hhmm("24:00") == 1440
    for bad in ("9.30", "24:01", "12:60"):
        with pytest.raises(ValueError):
            parse_hhmm(bad)
    assert format_ns(ns("2024-07-01T23:58:01") + 218_218_853, "America/New_York") == "2024-07-01 19:58:01.218218"
    assert assign_days(np.zeros(0, dtype=np.uint64), ES)[0] == []
