"""Selecting the market a stage runs on: the store, the day range, the mandatory schemas of those days."""

import dataclasses
import subprocess
import sys

import h5py
import numpy as np
import pytest

from fox_numba.config import MarketConfig
from fox_numba.errors import ConfigError, InputError, MissingDataError
from fox_numba.market import default
from fox_numba.market.inspect import summarize
from fox_numba.market.schema import MarketDay
from fox_numba.market.select import select_market
from fox_numba.market.store import write_store
from fox_numba.market.synthetic import generate
from fox_numba.market.synthetic_definition import load_definition


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Three synthetic days; the last one has no trades."""
    market = generate(load_definition(default.default_definition_path()).with_overrides(days=3))
    days = [*market.days[:2], dataclasses.replace(market.days[2], trades=None)]
    path = write_store(tmp_path_factory.mktemp("select") / "es.h5", market.instrument, days)
    return path, [d.day for d in market.days]


def test_day_range_selects_inclusive_and_checks_only_the_selected_days(store):
    path, days = store
    sel = select_market(MarketConfig(store=str(path), first_day=days[0], last_day=days[1]))
    assert sel.path == path and sel.days == tuple(days[:2])
    sel = select_market(MarketConfig(store=str(path), last_day=days[0]))
    assert sel.days == (days[0],)


def test_a_selected_day_without_trades_is_refused(store):
    path, days = store
    with pytest.raises(MissingDataError, match=f"no trades data on 1 of 1 days \\(first {days[2]}\\)"):
        select_market(MarketConfig(store=str(path), first_day=days[2]))
    with pytest.raises(MissingDataError, match="fox data import"):
        select_market(MarketConfig(store=str(path)))


@pytest.mark.parametrize(
    "first, last, message",
    [
        ("2024-13-01", "", "market.first_day: '2024-13-01' is not a date"),
        ("", "July 9", "market.last_day: 'July 9' is not a date"),
        ("2024-07-10", "2024-07-09", "market.first_day 2024-07-10 is after market.last_day 2024-07-09"),
        ("2030-01-01", "", "no trading day between 2030-01-01 and the end"),
    ],
)
def test_bad_day_ranges(store, first, last, message):
    with pytest.raises(ConfigError, match=message):
        select_market(MarketConfig(store=str(store[0]), first_day=first, last_day=last))


def test_missing_store(tmp_path):
    with pytest.raises(InputError, match="market store not found"):
        select_market(MarketConfig(store=str(tmp_path / "none.h5")))


def test_a_selected_day_that_fails_validation_is_refused_as_inspect_refuses_it(tmp_path):
    market = generate(load_definition(default.default_definition_path()).with_overrides(days=2))
    path = write_store(tmp_path / "es.h5", market.instrument, market.days)
    with h5py.File(path, "r+") as f:
        ts = f["mbp10/2024-07-09/ts_event"]
        ts[100], ts[101] = ts[101], ts[100]
    with pytest.raises(InputError) as stage:
        select_market(MarketConfig(store=str(path)))
    with pytest.raises(InputError) as inspect:
        summarize(path)
    assert str(stage.value) == str(inspect.value)
    assert str(stage.value).startswith(f"{path}, group /mbp10/2024-07-09, field ts_event, row 101: ts_event decreases")
    assert select_market(MarketConfig(store=str(path), last_day="2024-07-08")).days == ("2024-07-08",)
    runs = [run_fox(*args) for args in (["train", "--store", str(path)], ["data", "inspect", str(path)])]
    assert [p.returncode for p in runs] == [1, 1] and runs[0].stderr == runs[1].stderr
    assert runs[0].stderr.count("\n") == 1 and "Traceback" not in runs[0].stderr


def run_fox(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fox_numba", *args], capture_output=True, text=True, timeout=300, check=False)


def shifted(day: MarketDay, ns: int) -> MarketDay:
    """The day with every timestamp moved by `ns` (same book, trades and bars)."""
    moved = {}
    for schema in ("bars", "mbp10", "trades"):
        record = getattr(day, schema)
        moved[schema] = dataclasses.replace(record, ts_event=(record.ts_event.astype(np.int64) + ns).astype(np.uint64))
    return dataclasses.replace(day, **moved)


def test_the_session_choice_keeps_the_days_with_a_bar_in_it(tmp_path):
    market = generate(load_definition(default.default_definition_path()).with_overrides(days=3))
    overnight = shifted(market.days[2], -14 * 3600 * 10**9)  # 09:30-16:00 moved to 19:30-02:00 the evening before
    path = write_store(tmp_path / "es.h5", market.instrument, [*market.days[:2], overnight])
    regular = select_market(MarketConfig(store=str(path)))
    assert regular.days == ("2024-07-08", "2024-07-09") and regular.session == "regular"
    assert regular.notes == ("2024-07-10 skipped: no bar in its regular session (market.session)",)
    full = select_market(MarketConfig(store=str(path), session="full"))
    assert full.days == ("2024-07-08", "2024-07-09", "2024-07-10") and full.notes == ()
    with pytest.raises(ConfigError, match=r"none of the 1 selected trading days has a bar in the regular session"):
        select_market(MarketConfig(store=str(path), first_day="2024-07-10"))
    with pytest.raises(ConfigError, match="market.session: 'globex' is not one of regular, full"):
        select_market(MarketConfig(store=str(path), session="globex"))
    proc = run_fox("train", "--preset", "smoke", "--store", str(path))
    assert proc.stderr.splitlines()[0] == "fox: note: 2024-07-10 skipped: no bar in its regular session (market.session)"
