"""The per-bar trade summary (lowest / highest trade price, contracts at exactly those prices) against a
plain-Python float64 reference, by hand and on random markets through `build_features`."""

from __future__ import annotations

import numpy as np

from fox_numba.config import FeatureConfig
from fox_numba.features import build_features
from fox_numba.features.trade_summary import trade_summary
from fox_numba.market.schema import NS_PER_MINUTE, PRICE_SCALE, Instrument

ES = Instrument()
TICK = ES.tick_fixed


def summary_reference(prices: list[int], sizes: list[int]) -> tuple[float, float, int, int]:
    """(lo, hi, contracts at lo, contracts at hi) of one bar's trades, NaN / 0 without trades."""
    if not prices:
        return float("nan"), float("nan"), 0, 0
    lo, hi = min(prices), max(prices)
    at_lo = sum(s for p, s in zip(prices, sizes, strict=True) if p == lo)
    at_hi = sum(s for p, s in zip(prices, sizes, strict=True) if p == hi)
    return lo * PRICE_SCALE, hi * PRICE_SCALE, at_lo, at_hi


def test_hand_bars():
    """Bar 0: 100.00 x3, 100.25 x2, 100.00 x4, 100.50 x1 -> lo 100.00 (7), hi 100.50 (1); bar 1 no trades;
    bar 2: one trade 99.75 x5 -> lo = hi = 99.75 (5 each); bar 3: 101.00 x2, 101.00 x6 -> 8 at both."""
    ticks = [400, 401, 400, 402, 399, 404, 404]
    sizes = [3, 2, 4, 1, 5, 2, 6]
    price = np.array(ticks, np.int64) * TICK
    out = trade_summary(price, np.array(sizes, np.uint32), np.array([0, 4, 4, 5]), np.array([4, 4, 5, 7]))
    np.testing.assert_array_equal(out["trade_lo"], [100.0, np.nan, 99.75, 101.0])
    np.testing.assert_array_equal(out["trade_hi"], [100.5, np.nan, 99.75, 101.0])
    np.testing.assert_array_equal(out["vol_lo"], [7, 0, 5, 8])
    np.testing.assert_array_equal(out["vol_hi"], [1, 0, 5, 8])
    assert out["vol_lo"].dtype == np.uint32 and out["trade_lo"].dtype == np.float64


def test_no_trades_at_all():
    out = trade_summary(np.zeros(0, np.int64), np.zeros(0, np.uint32), np.array([0, 0]), np.array([0, 0]))
    assert np.isnan(out["trade_lo"]).all() and np.isnan(out["trade_hi"]).all()
    assert (out["vol_lo"] == 0).all() and (out["vol_hi"] == 0).all()


def test_raw_market_summary_matches_reference_on_random_markets(random_market):
    """Random days (trades at 7 price levels, so ties at the extremes are common; some bars without trades):
    every bar's four columns equal the plain reference over the trades with start <= ts < start + 60 s."""
    days = random_market(5, n_days=2, n_bars=15, events=(0, 6))
    raw = build_features(days, ES, FeatureConfig()).raw
    expected = []
    for day in days:
        for t in (int(x) for x in day.bars.ts_event):
            inside = [k for k in range(day.trades.ts_event.size) if t <= int(day.trades.ts_event[k]) < t + NS_PER_MINUTE]
            expected.append(
                summary_reference([int(day.trades.price[k]) for k in inside], [int(day.trades.size[k]) for k in inside])
            )
    lo, hi, vol_lo, vol_hi = (np.array(c) for c in zip(*expected, strict=True))
    assert np.isnan(lo).any() and (vol_lo > 0).any(), "the market should have bars with and without trades"
    np.testing.assert_array_equal(raw.trade_lo, lo)
    np.testing.assert_array_equal(raw.trade_hi, hi)
    np.testing.assert_array_equal(raw.vol_lo, vol_lo)
    np.testing.assert_array_equal(raw.vol_hi, vol_hi)
    assert raw.vol_hi.dtype == np.uint32
