"""The fold's baselines on a real FoldMarket: the probe fits the training rows only, and flat, buy-and-hold, the
probe and the oracle are scored on exactly the days the agent is scored on (the validation days of 2+ bars)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
from reference_env import random_feature_set

from fox_numba.agent.fold_market import FoldMarket
from fox_numba.features.forecast import forward_change
from fox_numba.config import EnvConfig, EvaluationConfig, FeatureConfig, FoldConfig, FoxConfig
from fox_numba.walkforward.driver import fold_baselines
from fox_numba.walkforward.folds import make_folds
from fox_numba.walkforward.metrics import OracleReference

DAY_BARS = [9, 12, 10, 11, 13, 8, 1, 7]
# Fold 1: days 1-4 train (day 4 held out for selection, purge 3 before it), days 5-7 validate (8, 1 and 7 bars).
# Fold-local day starts 0, 12, 22, 33, 46, 54, 55, 62: training rows 0-29, purged 30-32, selection 33-45.
H = 2
CFG = FoxConfig(
    folds=FoldConfig(n_folds=2, train_days=4, val_days=3, step_days=1, purge_bars=3, select_days=1),
    env=EnvConfig(episode_bars=6, max_position=4),
    evaluation=EvaluationConfig(probe_horizon_bars=H, probe_ridge=0.0),
)


@pytest.fixture(scope="module")
def fs():
    return random_feature_set(np.random.default_rng(20), DAY_BARS)


@pytest.fixture(scope="module")
def market(fs):
    fold = make_folds(CFG.folds, fs.days)[1]
    return FoldMarket.build(fs, fold, FeatureConfig(), CFG.env)


def with_column0(market: FoldMarket, col0: np.ndarray) -> FoldMarket:
    """The market with an observation of zeros but for column 0."""
    obs = np.zeros_like(market.market_obs)
    obs[:, 0] = col0
    return dataclasses.replace(market, market_obs=obs)


def test_the_probe_fits_the_training_rows_only(market):
    """Observation column 0 is the probe's target on the training and validation rows and -4x it on the purged
    tail and the selection day: fitted on the training rows (ridge 0) the probe forecasts the validation rows
    exactly (R^2 = 1), a fit that saw a held-out row would not. Moving column 0 on the first or the last
    training row moves the fit (both rows are fitted)."""
    assert (market.train_stop, market.val_start) == (30, 46)
    target = forward_change(market.mid, market.day_start, H)
    y = np.nan_to_num(target)
    held = slice(market.train_stop, market.val_start)
    col0 = y.copy()
    col0[held] *= -4.0
    assert np.count_nonzero(y[held]) >= 3  # held-out rows with a target: they would bend a fit that saw them
    assert fold_baselines(CFG, with_column0(market, col0), None, []).probe_r2 == pytest.approx(1.0, abs=1e-9)
    for r in (0, market.train_stop - 1):
        assert np.isfinite(target[r])
        moved = col0.copy()
        moved[r] += 4.0
        assert fold_baselines(CFG, with_column0(market, moved), None, []).probe_r2 < 0.999, f"row {r}"


def test_every_baseline_is_scored_on_the_agents_days(fs, market):
    """The agent trades market.val_windows: validation days 5 and 7 (8 and 7 bars; day 6 has one bar and no
    step). Flat, buy-and-hold, the probe and the oracle are scored on those two days, not on the one-bar day
    nor on the selection day before them."""
    np.testing.assert_array_equal(market.val_windows, [[46, 54], [55, 62]])
    daily = np.random.default_rng(5).normal(0.0, 1000.0, len(fs.days))
    oracle = OracleReference(Path("market.h5.oracle.json"), 0.0, daily, 252)
    b = fold_baselines(CFG, market, oracle, list(fs.days))
    np.testing.assert_array_equal(b.series["lengths"], [8, 7])
    for metrics in (b.flat, b.buy_and_hold, b.probe):
        assert (metrics.n_days, metrics.n_bars) == (2, 15)
    assert b.series["probe_pnl"].shape == b.series["buy_and_hold_pnl"].shape == (15,)
    np.testing.assert_array_equal(b.series["oracle_daily_pnl"], daily[[5, 7]])
    d = daily[[5, 7]]
    assert b.oracle_sharpe == pytest.approx(d.mean() / d.std(ddof=1) * math.sqrt(252), rel=1e-12)
    half = 0.5 * (market.ask_px[:, 0] - market.bid_px[:, 0])
    days = np.split(b.series["buy_and_hold_pnl"], [8])
    for pnl, (a, e) in zip(days, ((46, 53), (55, 61)), strict=True):  # one contract from the first close to the last
        want = (market.mid[e] - market.mid[a] - half[a] - half[e]) * market.point_value - 2 * CFG.env.commission
        assert pnl.sum() == pytest.approx(want, rel=1e-12)
