"""features/book_features.py time_weighted_imbalance: every bar and column against a float64 loop; and the feature
build's columns of it (features.tw_imbalance), built only when on."""

from __future__ import annotations

import numpy as np

from fox_numba.config import FeatureConfig
from fox_numba.features import build as build_module
from fox_numba.features.book_features import TW_IMBALANCE_COLUMNS, time_weighted_imbalance
from fox_numba.features.build import build_features
from fox_numba.features.names import FEATURE_NAMES
from fox_numba.market.schema import UNDEF_PRICE, Instrument

MINUTE = 60_000_000_000


def tw_reference(book_ts: np.ndarray, bid: np.ndarray, ask: np.ndarray, bar_ts: np.ndarray) -> np.ndarray:
    """float64 [n_bars, 12], a loop over each bar's book states: a state weighs the time it rests inside the bar (from
    its timestamp, or the bar's start for the one entering it, to the next state or the bar's end); the per-level,
    levels 1-5 and 1-10 imbalances (bid - ask) / (bid + ask), 0 where both sides are empty."""
    out = np.zeros((len(bar_ts), 12))
    for b, t0 in enumerate(bar_ts):
        t1 = t0 + MINUTE
        inside = [r for r in range(len(book_ts)) if t0 <= book_ts[r] < t1]
        before = [r for r in range(len(book_ts)) if book_ts[r] < t0]
        states = ([before[-1]] if before else []) + inside
        want, total = np.zeros(12), 0.0
        for i, r in enumerate(states):
            start = max(book_ts[r], t0)
            end = book_ts[states[i + 1]] if i + 1 < len(states) else t1
            b_q = [*bid[r], bid[r, :5].sum(), bid[r].sum()]
            a_q = [*ask[r], ask[r, :5].sum(), ask[r].sum()]
            imb = [(x - y) / (x + y) if x + y > 0 else 0.0 for x, y in zip(b_q, a_q, strict=True)]
            want += (end - start) * np.array(imb)
            total += end - start
        out[b] = want / total
    return out


def test_time_weighted_imbalance_against_a_loop(rng):
    """Every bar and column against the loop: random sizes with empty levels, several states a bar at random times,
    and a bar whose only state entered before it."""
    n_rows, n_bars = 60, 5
    bar_ts = np.arange(n_bars, dtype=np.int64) * MINUTE + 7 * MINUTE
    book_ts = np.sort(rng.integers(bar_ts[0] - MINUTE // 2, bar_ts[-2] + MINUTE, n_rows))  # the last bar: none
    bid = rng.integers(1, 50, (n_rows, 10)).astype(np.float64) * (rng.random((n_rows, 10)) > 0.2)
    ask = rng.integers(1, 50, (n_rows, 10)).astype(np.float64) * (rng.random((n_rows, 10)) > 0.2)
    bid[3, 4] = ask[3, 4] = 0.0  # a level empty on both sides
    got = time_weighted_imbalance(book_ts, bid, ask, bar_ts)
    assert got.shape == (n_bars, len(TW_IMBALANCE_COLUMNS)) == (n_bars, 12)
    np.testing.assert_allclose(got, tw_reference(book_ts, bid, ask, bar_ts), rtol=1e-12, atol=1e-15)
    assert np.abs(got).max() > 0.05 and (got[:, :10] != got[:, 10:11]).any()


def test_the_feature_build_appends_the_columns_only_when_on(random_market, monkeypatch):
    """With features.tw_imbalance the values gain the 12 columns after the features, each day's the loop's over its
    every MBP-10 row (empty levels size 0), the features unchanged bit for bit; off, the build never computes them."""
    days = random_market(5, n_days=2, n_bars=12)
    on = build_features(days, Instrument(), FeatureConfig(tw_imbalance=True))
    assert on.names == FEATURE_NAMES + TW_IMBALANCE_COLUMNS and on.values.shape == (24, 44)
    for d, day in enumerate(days):
        book = day.mbp10
        bid = np.where(book.bid_px == UNDEF_PRICE, 0.0, book.bid_sz.astype(np.float64))
        ask = np.where(book.ask_px == UNDEF_PRICE, 0.0, book.ask_sz.astype(np.float64))
        assert (bid == 0).any() and (ask == 0).any()  # the random book has empty levels
        rows = slice(int(on.raw.day_start[d]), int(on.raw.day_start[d + 1]))
        want = tw_reference(book.ts_event.astype(np.int64), bid, ask, on.raw.ts[rows].astype(np.int64))
        np.testing.assert_allclose(on.values[rows, 32:], want, rtol=1e-12, atol=1e-15)

    def not_called(*args, **kwargs):
        raise AssertionError("time_weighted_imbalance computed with features.tw_imbalance off")

    monkeypatch.setattr(build_module, "time_weighted_imbalance", not_called)
    off = build_features(days, Instrument(), FeatureConfig(tw_imbalance=False))
    assert off.names == FEATURE_NAMES and off.values.shape == (24, 32)
    np.testing.assert_array_equal(on.values[:, :32], off.values)
