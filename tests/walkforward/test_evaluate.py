"""`fox evaluate`'s baselines: flat, buy-and-hold and the oracle are scored on the days the agent is scored on."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from reference_env import random_feature_set

from fox_numba.agent.fold_market import FoldMarket
from fox_numba.config import EnvConfig, FeatureConfig, FoxConfig
from fox_numba.features.normalise import fit_normaliser
from fox_numba.walkforward.evaluate import AllValidation, baseline_figures
from fox_numba.walkforward.metrics import OracleReference


def sharpe(daily: np.ndarray) -> float:
    return float(daily.mean() / daily.std(ddof=1) * math.sqrt(252))


def test_baselines_skip_the_days_the_agent_skips(rng):
    """Day 1 has one bar: no window, no step for the agent, so no day for the baselines either (the oracle's
    PnL of that day, and buy-and-hold's zero, would otherwise enter their Sharpe)."""
    fs = random_feature_set(rng, [9, 1, 12, 7])
    cfg = FoxConfig(env=EnvConfig(episode_bars=6))
    market = FoldMarket.build(fs, AllValidation(0, fs.n_days), FeatureConfig(), cfg.env,
                              stats=fit_normaliser(fs.values, slice(0, 29)), risk_unit=1.0)
    np.testing.assert_array_equal(market.val_windows, [[0, 9], [10, 22], [22, 29]])
    daily = np.array([300.0, 5000.0, -100.0, 800.0])
    oracle = OracleReference(Path("market.h5.oracle.json"), 0.0, daily, 252)
    out = baseline_figures(cfg, market, oracle, list(fs.days))
    assert out["oracle_sharpe_daily"] == pytest.approx(sharpe(daily[[0, 2, 3]]), rel=1e-12)
    half = 0.5 * (market.ask_px[:, 0] - market.bid_px[:, 0])
    bh = np.array([(market.mid[b - 1] - market.mid[a] - half[a] - half[b - 1]) * market.point_value
                   - 2 * cfg.env.commission for a, b in market.val_windows])  # fmt: skip
    assert out["buy_and_hold_sharpe_daily"] == pytest.approx(sharpe(bh), rel=1e-12)
    assert out["flat_sharpe_daily"] == 0.0
    assert "oracle_sharpe_daily" not in baseline_figures(cfg, market, None, [])
