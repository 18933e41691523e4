"""Normalisation: statistics from the training rows only, applied row by row, floored and clipped."""

from __future__ import annotations

import numpy as np
import pytest

from fox_numba.config import FeatureConfig
from fox_numba.errors import ConfigError
from fox_numba.features import apply_normaliser, build_features, fit_normaliser
from fox_numba.features.normalise import STD_FLOOR
from fox_numba.market.schema import Instrument


def sample(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.normal([1.0, -2.0, 0.0, 5.0], [0.5, 3.0, 1e-4, 0.0], size=(40, 4))


def test_stats_are_the_window_mean_and_floored_std():
    values = sample()
    stats = fit_normaliser(values, slice(5, 25))
    window = values[5:25]
    np.testing.assert_allclose(stats.mean, window.mean(axis=0), rtol=1e-15)
    np.testing.assert_allclose(stats.std[:3], window.std(axis=0)[:3], rtol=1e-15)
    assert stats.std[3] == STD_FLOOR  # the constant column
    assert stats.n_rows == 20 and stats.mean.dtype == stats.std.dtype == np.float64


def test_stats_depend_only_on_the_window_rows():
    values = sample()
    changed = values.copy()
    changed[:5] = 1e6
    changed[25:] = np.random.default_rng(1).normal(size=changed[25:].shape) * 100
    a, b = fit_normaliser(values, slice(5, 25)), fit_normaliser(changed, slice(5, 25))
    np.testing.assert_array_equal(a.mean, b.mean)
    np.testing.assert_array_equal(a.std, b.std)
    by_index = fit_normaliser(values, np.arange(5, 25))
    np.testing.assert_array_equal(by_index.mean, a.mean)


def test_apply_standardises_clips_and_casts():
    values = sample()
    stats = fit_normaliser(values, slice(0, 20))
    out = apply_normaliser(values, stats, 2.0)
    expected = np.clip((values - stats.mean) / stats.std, -2.0, 2.0).astype(np.float32)
    assert out.dtype == np.float32 and out.shape == values.shape
    np.testing.assert_array_equal(out, expected)
    assert np.abs(out).max() == 2.0
    unclipped = apply_normaliser(values, stats, 100.0)
    np.testing.assert_allclose(unclipped[:20, :3].mean(axis=0), 0.0, atol=1e-6)
    np.testing.assert_allclose(unclipped[:20, :3].std(axis=0), 1.0, rtol=1e-6)


def test_apply_is_row_by_row():
    values = sample()
    stats = fit_normaliser(values, slice(0, 20))
    changed = values.copy()
    changed[30] += 7.0
    diff = apply_normaliser(values, stats, 5.0) != apply_normaliser(changed, stats, 5.0)
    assert set(np.flatnonzero(diff.any(axis=1))) == {30}


def test_bad_windows_and_arguments_are_rejected():
    values = sample()
    with pytest.raises(ConfigError, match="no bars"):
        fit_normaliser(values, slice(10, 10))
    bad = values.copy()
    bad[12, 2] = np.nan
    with pytest.raises(ValueError, match="column 2 is not finite in row 2"):
        fit_normaliser(bad, slice(10, 20))
    stats = fit_normaliser(values, slice(0, 10))
    with pytest.raises(ConfigError, match="clip_sigma"):
        apply_normaliser(values, stats, 0.0)
    with pytest.raises(ValueError, match="3 features, the statistics 4"):
        apply_normaliser(values[:, :3], stats, 5.0)


def test_fold_rows_from_days(random_market):
    fs = build_features(random_market(5, n_days=3, n_bars=6), Instrument(), FeatureConfig())
    assert fs.day_rows(0, 3) == slice(0, 18)
    assert fs.day_rows(1, 2) == slice(6, 12)
    np.testing.assert_array_equal(fs.raw.day_index[fs.day_rows(2, 3)], 2)
    with pytest.raises(IndexError):
        fs.day_rows(2, 4)
