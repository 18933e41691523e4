"""No look-ahead: replacing everything after a bar's close (book rows, trades, later bars) with another
market changes no feature, raw column or normalised row at or before that bar."""

from __future__ import annotations

from dataclasses import fields

import numpy as np

from fox_numba.config import FeatureConfig
from fox_numba.features import apply_normaliser, build_features, fit_normaliser
from fox_numba.market.schema import NS_PER_MINUTE, Instrument

ES = Instrument()
CFG = FeatureConfig()


def raw_arrays(fs) -> dict[str, np.ndarray]:
    """The per-bar raw columns (day_start is per day; tick size and point value are scalars)."""
    per_day_or_scalar = ("day_start", "tick_size", "point_value")
    return {f.name: getattr(fs.raw, f.name) for f in fields(fs.raw) if f.name not in per_day_or_scalar}


def test_no_feature_sees_past_its_bar_close(random_market, splice):
    a = random_market(11, n_days=3, n_bars=8)
    b = random_market(12, n_days=3, n_bars=8)
    base = build_features(a, ES, CFG)
    second_day = int(base.raw.day_start[1])
    for k in range(base.n_bars):
        cut = int(base.raw.ts[k]) + NS_PER_MINUTE
        fs = build_features(splice(a, b, cut), ES, CFG)
        past = slice(0, k + 1)
        np.testing.assert_array_equal(fs.values[past], base.values[past], err_msg=f"bar {k}")
        for name, column in raw_arrays(fs).items():
            np.testing.assert_array_equal(column[past], raw_arrays(base)[name][past], err_msg=f"{name}, bar {k}")
        if k + 1 < base.n_bars:
            assert not np.array_equal(fs.values[k + 1 :], base.values[k + 1 :]), "the splice changed nothing"

        windows = [past] + ([slice(second_day, k + 1)] if k >= second_day else [])
        for window in windows:
            stats, base_stats = fit_normaliser(fs.values, window), fit_normaliser(base.values, window)
            np.testing.assert_array_equal(stats.mean, base_stats.mean)
            np.testing.assert_array_equal(stats.std, base_stats.std)
            normalised = apply_normaliser(fs.values, stats, CFG.clip_sigma)
            base_normalised = apply_normaliser(base.values, base_stats, CFG.clip_sigma)
            np.testing.assert_array_equal(normalised[past], base_normalised[past], err_msg=f"bar {k}")
