"""Processes that read a store's days side by side (market/day_workers.py): the automatic count, a broken pool
leaving the day to the caller, and `fox data inspect` giving the same summary with workers as without, its error for
a bad day being the calling process's own (the feature build's side: tests/features/test_feature_cache.py)."""

import os
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool

import h5py
import pytest

from fox_numba.errors import ConfigError, InputError
from fox_numba.market import day_workers
from fox_numba.market.inspect import summarize
from fox_numba.market.store import MarketStore, write_store


def test_the_automatic_count_is_one_per_core_at_most_eight_from_eight_days(monkeypatch):
    assert day_workers.read_workers(3, 2, "x") == 3 and day_workers.read_workers(1, 100, "x") == 1
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    assert day_workers.read_workers(0, day_workers.MIN_AUTO_DAYS, "x") == day_workers.MAX_READ_WORKERS == 8
    assert day_workers.read_workers(0, day_workers.MIN_AUTO_DAYS - 1, "x") == 1  # too few days to pay the start
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert day_workers.read_workers(0, 100, "x") == 2
    with pytest.raises(ConfigError, match="market.read_workers is -1"):
        day_workers.read_workers(-1, 100, "market.read_workers")
    assert day_workers.start_pool(1) is None


def test_a_broken_pool_leaves_the_day_to_the_caller():
    broken, done = Future(), Future()
    broken.set_exception(BrokenProcessPool("a worker died"))
    done.set_result("built")
    assert day_workers.outcome(broken, "failed") == "failed" and day_workers.outcome(done, "failed") == "built"


@pytest.fixture
def four_days(four_day_market, tmp_path):
    m = four_day_market
    return write_store(tmp_path / "four.h5", m.instrument, m.days)


def test_inspect_with_workers_gives_the_same_summary(four_days):
    alone = summarize(four_days, workers=1)
    assert len(alone["days"]) == 4 and summarize(four_days, workers=3) == alone


def test_inspect_with_workers_refuses_a_bad_day_with_its_own_error(four_days):
    days = MarketStore(four_days).days()
    with h5py.File(four_days, "r+") as f:
        ts = f["mbp10"][days[1]]["ts_event"]
        ts[100], ts[101] = ts[101], ts[100]
    with pytest.raises(InputError, match=f"group /mbp10/{days[1]}, field ts_event, row 101"):
        summarize(four_days, workers=2)
