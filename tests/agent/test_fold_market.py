"""FoldMarket: the fold's tensors, normalised on the training rows only, with no look-ahead; episode starts
inside days and out of the purged tail; validation windows; risk unit; one upload to the device."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from reference_env import Windows, random_feature_set

from fox_numba.agent.fold_market import (
    AUX_CLIP_SIGMA,
    BOOK_ARRAYS,
    CHECKPOINT_ARRAYS,
    DEVICE_TENSORS,
    FORECAST_ARRAYS,
    FoldMarket,
    aux_forecast_target,
    book_stats_from_checkpoint,
    forecast_from_checkpoint,
)
from fox_numba.config import EnvConfig, FeatureConfig, FoldConfig
from fox_numba.errors import ConfigError
from fox_numba.features.book import BOOK_FEATURES
from fox_numba.features.feature_set import FeatureSet
from fox_numba.features.forecast import cross_fitted_column
from fox_numba.features.names import feature_names
from fox_numba.features.normalise import apply_normaliser, fit_normaliser
from fox_numba.observation import N_MARKET, market_part
from fox_numba.walkforward.folds import make_folds

FEATURES = FeatureConfig(tw_imbalance=False)  # the 32 features alone; TW adds the block
TW = FeatureConfig(tw_imbalance=True)
DAY_BARS = [9, 12, 4, 11, 10, 8, 7]
# days 1-4 train (purge 3), days 5-6 validate; day 0 is before the fold
WINDOWS = Windows(train_first=1, train_stop=5, val_first=5, val_stop=7, purge_bars=3)
ENV = EnvConfig(episode_bars=6, max_position=4)


@pytest.fixture
def fs(rng):
    return random_feature_set(rng, DAY_BARS, features=FEATURES)


def test_tensors_are_the_fold_rows_normalised_on_the_training_rows(fs):
    fm = FoldMarket.build(fs, WINDOWS, FEATURES, ENV)
    g0, g_val, g_end = 9, 9 + 12 + 4 + 11 + 10, sum(DAY_BARS)
    rows = slice(g0, g_end)
    assert (fm.row0, fm.n_rows, fm.val_start, fm.train_stop) == (g0, g_end - g0, g_val - g0, g_val - g0 - 3)
    assert fm.days == fs.days[1:7]
    stats = fit_normaliser(fs.values, slice(g0, g_val - 3))
    np.testing.assert_array_equal(fm.stats.mean, stats.mean)
    z = apply_normaliser(fs.values[rows], stats, FEATURES.clip_sigma)
    np.testing.assert_array_equal(fm.day_start, [0, 12, 16, 27, 37, 45, 52])
    np.testing.assert_array_equal(fm.day_first[[0, 11, 12, 15, 16, 51]], [0, 0, 12, 12, 16, 45])
    np.testing.assert_array_equal(fm.market_obs, market_part(z, fm.day_start, FEATURES.ema_start))
    assert fm.market_obs.shape == (52, N_MARKET) and fm.market_obs.dtype == np.float32
    other = "first" if FEATURES.ema_start == "zero" else "zero"
    changed = FoldMarket.build(fs, WINDOWS, dataclasses.replace(FEATURES, ema_start=other), ENV)
    np.testing.assert_array_equal(changed.market_obs, market_part(z, fm.day_start, other))
    assert not np.array_equal(changed.market_obs, fm.market_obs), "features.ema_start reaches the observation"
    raw = fs.raw
    for name in ("bid_px", "ask_px", "mid", "trade_lo", "trade_hi"):
        np.testing.assert_array_equal(getattr(fm, name), getattr(raw, name)[rows], err_msg=name)
        assert getattr(fm, name).dtype == np.float64
    for name in ("bid_sz", "ask_sz", "vol_lo", "vol_hi"):
        np.testing.assert_array_equal(getattr(fm, name), getattr(raw, name)[rows].astype(np.float32), err_msg=name)
        assert getattr(fm, name).dtype == np.float32
    np.testing.assert_array_equal(fm.val_windows, [[37, 45], [45, 52]])
    moves = [fm.mid[r + 1] - fm.mid[r] for r in range(fm.train_stop - 1) if r + 1 not in (12, 16, 27)]
    assert fm.risk_unit == pytest.approx(ENV.max_position * 50.0 * np.std(moves), rel=1e-12)


def test_episode_starts_stay_inside_days_and_out_of_the_purge(fs):
    """Row r may start an episode iff r + 6 bars fit in its day before the purge; the 4-bar day (shorter
    than an episode) starts only at its first row; the last training day stops at the purge start."""
    fm = FoldMarket.build(fs, WINDOWS, FEATURES, ENV)
    day_of = np.repeat(np.arange(6), np.diff(fm.day_start))
    expected_stop = np.array([fm.day_start[d + 1] for d in day_of])
    expected_stop[: fm.train_stop] = np.minimum(expected_stop[: fm.train_stop], fm.train_stop)
    np.testing.assert_array_equal(fm.row_stop, expected_stop)
    assert fm.row_stop[fm.train_stop - 1] == fm.train_stop == 34
    expected = [r for r in range(fm.train_stop) if r + 6 <= fm.row_stop[r]] + [12]
    np.testing.assert_array_equal(np.sort(fm.train_starts), sorted(expected))
    for s in fm.train_starts:
        last = min(s + 6, fm.row_stop[s]) - 1
        assert day_of[last] == day_of[s] and last < fm.train_stop


def test_no_look_ahead_from_the_purge_or_validation(fs, rng):
    """Changing every bar after row r (r from the training window's last kept row on, and the bars after
    the fold) changes no market_obs row <= r, no normalisation statistic and not the risk unit."""
    base = FoldMarket.build(fs, WINDOWS, FEATURES, ENV)
    for r in range(base.train_stop - 1, base.n_rows):
        g = base.row0 + r + 1
        values = fs.values.copy()
        values[g:] = rng.normal(size=values[g:].shape) * 3
        mid = fs.raw.mid.copy()
        mid[g:] += rng.integers(-5, 6, mid[g:].shape) * 0.25
        changed = FeatureSet(values, fs.names, fs.days, dataclasses.replace(fs.raw, mid=mid))
        fm = FoldMarket.build(changed, WINDOWS, FEATURES, ENV)
        np.testing.assert_array_equal(fm.market_obs[: r + 1], base.market_obs[: r + 1], err_msg=f"row {r}")
        np.testing.assert_array_equal(fm.stats.mean, base.stats.mean)
        np.testing.assert_array_equal(fm.stats.std, base.stats.std)
        assert fm.risk_unit == base.risk_unit
        if r + 1 < base.n_rows:
            assert not np.array_equal(fm.market_obs[r + 1 :], base.market_obs[r + 1 :])


def test_the_aux_target_is_the_scaled_forward_change_inside_training_days(fs):
    """y[r] = (mid[r + h] - mid[r]) / std over the labelled rows, clipped, where r + h is in r's day and before
    the purge start; NaN everywhere else (the purged tail and the validation days give no label)."""
    fm = FoldMarket.build(fs, WINDOWS, FEATURES, ENV)
    h = 3
    got = aux_forecast_target(fm, h)
    day_of = np.repeat(np.arange(6), np.diff(fm.day_start))
    raw = np.full(fm.n_rows, np.nan)
    for r in range(fm.n_rows - h):
        if day_of[r + h] == day_of[r] and r + h < fm.train_stop:
            raw[r] = fm.mid[r + h] - fm.mid[r]
    labelled = np.isfinite(raw)
    assert labelled.sum() >= 15 and not labelled[fm.train_stop - h :].any()
    np.testing.assert_array_equal(np.isfinite(got), labelled)
    want = np.clip(raw[labelled] / np.std(raw[labelled]), -AUX_CLIP_SIGMA, AUX_CLIP_SIGMA)
    np.testing.assert_allclose(got[labelled], want, rtol=1e-6)
    assert got.dtype == np.float32 and got.shape == (fm.n_rows,)
    with pytest.raises(ConfigError, match="aux_horizon_bars"):
        aux_forecast_target(fm, 0)
    with pytest.raises(ConfigError, match="varies"):
        aux_forecast_target(fm, 12)  # no training day holds 13 bars


def test_a_real_fold_builds_and_uploads(fs, stager):
    fold = make_folds(FoldConfig(n_folds=2, train_days=3, val_days=2, step_days=1, purge_bars=2), fs.days)[1]
    fm = FoldMarket.build(fs, fold, FEATURES, ENV)
    dev = fm.upload(stager)
    for name in DEVICE_TENSORS:
        host = getattr(fm, name)
        np.testing.assert_array_equal(stager.download(getattr(dev, name)), host, err_msg=name)
    assert dev.n_rows == fm.n_rows


def test_folds_that_cannot_hold_an_episode_are_refused(fs):
    with pytest.raises(ConfigError, match="leaves no training bars"):
        FoldMarket.build(fs, dataclasses.replace(WINDOWS, purge_bars=40), FEATURES, ENV)
    with pytest.raises(ConfigError, match="episode_bars is 1"):
        FoldMarket.build(fs, WINDOWS, FEATURES, EnvConfig(episode_bars=1))
    with pytest.raises(ConfigError, match="consecutive days"):
        FoldMarket.build(fs, dataclasses.replace(WINDOWS, val_first=6), FEATURES, ENV)


def test_selection_days_are_held_out_of_training(fs, stager):
    """With the last training day (day 4, rows 27-36) held out for selection: training stops 3 bars before it,
    the normaliser, the risk unit and the episode starts see nothing from it on, the selection window is that
    day, and the device view on it evaluates those rows and shares every other tensor."""
    held = dataclasses.replace(WINDOWS, select_days=1)
    fm = FoldMarket.build(fs, held, FEATURES, ENV)
    assert fm.train_stop == 27 - 3 and fm.val_start == 37
    np.testing.assert_array_equal(fm.select_windows, [[27, 37]])
    np.testing.assert_array_equal(fm.val_windows, [[37, 45], [45, 52]])
    stats = fit_normaliser(fs.values, slice(9, 9 + 24))
    np.testing.assert_array_equal(fm.stats.mean, stats.mean)
    np.testing.assert_array_equal(fm.stats.std, stats.std)
    assert fm.train_starts.max() + 6 <= fm.train_stop and fm.row_stop[26] == 27  # day 3 ends at the purge start
    assert (fm.row_stop[27:37] == 37).all()  # a selection day runs to its end
    assert FoldMarket.build(fs, WINDOWS, FEATURES, ENV).select_windows.shape == (0, 2)
    dev = fm.upload(stager)
    view = dev.on_selection_days(stager)
    np.testing.assert_array_equal(stager.download(view.val_windows), [[27, 37]])
    np.testing.assert_array_equal(view.host.val_windows, [[27, 37]])
    assert view.market_obs is dev.market_obs and view.host.train_stop == fm.train_stop
    with pytest.raises(ConfigError, match="no selection days"):
        FoldMarket.build(fs, WINDOWS, FEATURES, ENV).upload(stager).on_selection_days(stager)
    with pytest.raises(ConfigError, match="5 selection days"):
        FoldMarket.build(fs, dataclasses.replace(WINDOWS, select_days=5), FEATURES, ENV)


@pytest.mark.parametrize("select_days", [0, 1])
def test_real_folds_train_on_their_window_less_the_purge(rng, select_days):
    """Every fold of make_folds (rolling and anchored, days of unequal length): the training rows run from the
    window's first bar to purge_bars before its first held-out day (selection, else validation); the fold's rows
    end with the validation window's; the normaliser sees the training rows only."""
    fs = random_feature_set(rng, [int(n) for n in rng.integers(9, 15, size=8)], features=FEATURES)
    g = fs.raw.day_start
    for anchored in (False, True):
        cfg = FoldConfig(n_folds=3, train_days=4, val_days=2, step_days=1, purge_bars=3, select_days=select_days,
                         anchored=anchored)  # fmt: skip
        for fold in make_folds(cfg, fs.days):
            fm = FoldMarket.build(fs, fold, FEATURES, ENV)
            g0, g_trained = g[fold.train_first], g[fold.select_first] - 3
            assert (fm.row0, fm.train_stop) == (g0, g_trained - g0), fold
            assert (fm.val_start, fm.n_rows) == (g[fold.val_first] - g0, g[fold.val_stop] - g0)
            np.testing.assert_array_equal(fm.stats.mean, fit_normaliser(fs.values, slice(g0, g_trained)).mean)


def test_a_real_fold_purged_of_every_training_bar_is_refused(fs):
    fold = make_folds(FoldConfig(n_folds=1, train_days=1, val_days=1, purge_bars=12), fs.days)[0]
    with pytest.raises(ConfigError, match="purging 12 bars leaves no training bars"):
        FoldMarket.build(fs, fold, FEATURES, ENV)


def test_forecast_columns_follow_the_feature_blocks_and_survive_a_checkpoint(fs):
    """With features.forecast_horizons = [2, 3]: two columns after the N_MARKET feature columns, each
    cross_fitted_column on the fold's training rows (before the purge) of the feature columns; the feature
    columns unchanged; the full fits round-trip through checkpoint_arrays, and a market built from a
    checkpoint's statistics and fits (fox evaluate's path) has the same rows after the training rows."""
    features = FeatureConfig(tw_imbalance=False, forecast_horizons=[2, 3], forecast_ridge=0.05, forecast_blocks=2)
    plain = FoldMarket.build(fs, WINDOWS, FEATURES, ENV)
    fm = FoldMarket.build(fs, WINDOWS, features, ENV)
    assert fm.market_obs.shape == (plain.n_rows, N_MARKET + 2) and fm.market_obs.dtype == np.float32
    np.testing.assert_array_equal(fm.market_obs[:, :N_MARKET], plain.market_obs)
    for k, h in enumerate([2, 3]):
        fit, col = cross_fitted_column(plain.market_obs, plain.mid, plain.day_start, plain.train_stop, horizon=h,
                                       ridge=0.05, blocks=2, clip=FEATURES.clip_sigma)
        np.testing.assert_array_equal(fm.market_obs[:, N_MARKET + k], col)
        np.testing.assert_array_equal(fm.forecast[k].weights, fit.weights)
    arrays = fm.checkpoint_arrays()
    assert set(arrays) == {*CHECKPOINT_ARRAYS, *FORECAST_ARRAYS, *BOOK_ARRAYS}
    assert arrays["market.forecast_weights"].shape == (2, N_MARKET)
    assert set(plain.checkpoint_arrays()) == {*CHECKPOINT_ARRAYS, *BOOK_ARRAYS}
    given = forecast_from_checkpoint(arrays)
    again = FoldMarket.build(fs, WINDOWS, features, ENV, stats=fm.stats, risk_unit=fm.risk_unit, forecast=given)
    ts = fm.train_stop
    np.testing.assert_array_equal(again.market_obs[ts:], fm.market_obs[ts:])
    np.testing.assert_array_equal(again.market_obs[:ts, :N_MARKET], fm.market_obs[:ts, :N_MARKET])
    with pytest.raises(ConfigError, match="2 forecast columns given"):
        FoldMarket.build(fs, WINDOWS, FeatureConfig(tw_imbalance=False, forecast_horizons=[2]), ENV, stats=fm.stats,
                         risk_unit=fm.risk_unit, forecast=given)
    for bad in ([0], [2, 2]):
        with pytest.raises(ConfigError, match="forecast_horizons must be distinct"):
            FoldMarket.build(fs, WINDOWS, FeatureConfig(tw_imbalance=False, forecast_horizons=bad), ENV)
    no_13_bar_day = FeatureConfig(tw_imbalance=False, forecast_horizons=[12], forecast_blocks=1)
    with pytest.raises(ConfigError, match=r"fold 0: forecast columns \(.*\): .*fewer than two"):
        FoldMarket.build(fs, WINDOWS, no_13_bar_day, ENV)
    with pytest.raises(ConfigError, match="5 cross-fitting blocks need as many training days; there are 4"):
        FoldMarket.build(fs, WINDOWS, FeatureConfig(tw_imbalance=False, forecast_horizons=[2]), ENV)


def test_the_time_weighted_imbalance_block_follows_the_features_and_feeds_the_forecast(fs, rng):
    """With features.tw_imbalance the FeatureSet's 12 further columns (random here, seeded, never zero) become the 48
    columns after N_MARKET: normalised with their own training-row statistics (float64 mean and population std,
    clipped) and their per-day EMAs, every element against a float64 loop; the forecast columns follow and read all
    176 feature columns; a feature set without the 12 columns is refused."""
    extra = rng.normal(0.3, 2.0, (fs.n_bars, 12)) + 0.01
    extra[50, 3] = 40.0  # a validation bar, clipped at +clip_sigma
    wide = dataclasses.replace(fs, values=np.column_stack([fs.values, extra]), names=feature_names(TW))
    fm = FoldMarket.build(wide, WINDOWS, TW, ENV)
    plain = FoldMarket.build(fs, WINDOWS, FEATURES, ENV)
    np.testing.assert_array_equal(fm.market_obs[:, :N_MARKET], plain.market_obs)
    assert fm.market_obs.shape == (plain.n_rows, N_MARKET + 48)
    g0, ts = fm.row0, fm.train_stop
    train = extra[g0 : g0 + ts]
    z = np.clip((extra[g0 : g0 + fm.n_rows] - train.mean(axis=0)) / train.std(axis=0), -5.0, 5.0)
    assert (z == 5.0).any()
    want = np.zeros((fm.n_rows, 48))
    for d in range(len(fm.day_start) - 1):
        e = np.zeros((3, 12))  # features.ema_start 'zero'
        for t in range(fm.day_start[d], fm.day_start[d + 1]):
            e += np.array([[1.0 - 0.5 ** (1.0 / h)] for h in (3, 10, 30)]) * (z[t] - e)
            want[t] = np.concatenate([z[t], *e])
    np.testing.assert_allclose(fm.market_obs[:, N_MARKET:], want, rtol=1e-6, atol=2e-6)
    np.testing.assert_array_equal(fm.stats.mean[:32], plain.stats.mean)
    assert fm.checkpoint_arrays()["market.norm_std"].shape == (44,)
    both = dataclasses.replace(TW, forecast_horizons=[2], forecast_blocks=2)
    fc = FoldMarket.build(wide, WINDOWS, both, ENV)
    np.testing.assert_array_equal(fc.market_obs[:, :176], fm.market_obs)
    _, col = cross_fitted_column(fm.market_obs, fm.mid, fm.day_start, ts, horizon=2, ridge=both.forecast_ridge,
                                 blocks=2, clip=both.clip_sigma)
    np.testing.assert_array_equal(fc.market_obs[:, 176], col)
    assert fc.checkpoint_arrays()["market.forecast_weights"].shape == (1, 176)
    with pytest.raises(ConfigError, match="the feature set holds 32 columns per bar, features .* needs 44"):
        FoldMarket.build(fs, WINDOWS, TW, ENV)
    with pytest.raises(ConfigError, match="the feature set holds 44 columns per bar"):
        FoldMarket.build(wide, WINDOWS, FEATURES, ENV)


def book_snapshot64(fs, rows, tick):
    """float64 [n, BOOK_FEATURES] written from features/book.py's header, level by level (NaN: missing)."""
    raw = fs.raw
    out = np.full((rows.stop - rows.start, BOOK_FEATURES), np.nan)
    for i, r in enumerate(range(rows.start, rows.stop)):
        for side, (px, sz) in enumerate(((raw.bid_px, raw.bid_sz), (raw.ask_px, raw.ask_sz))):
            for k in range(10):
                if np.isfinite(px[r, k]) and sz[r, k] > 0:
                    out[i, side * 10 + k] = (px[r, k] - raw.mid[r]) / tick
                    out[i, 20 + side * 10 + k] = np.log1p(float(sz[r, k]))
    return out


def test_the_book_snapshot_is_normalised_on_the_training_rows_only(fs):
    """book_obs: prices in ticks from the close mid and log1p sizes, each column's mean and std over the present
    values of the training rows before the purge, clipped; missing levels (the random books have 1..10 levels) 0
    and every value finite; changing the book after the purge start changes no statistic and no earlier row."""
    fm = FoldMarket.build(fs, WINDOWS, FEATURES, ENV)
    rows, ts = slice(fm.row0, fm.row0 + fm.n_rows), fm.train_stop
    raw = book_snapshot64(fs, rows, fs.raw.tick_size)
    missing = ~np.isfinite(raw)
    assert missing.any() and (~missing).any(axis=0).all()  # missing levels, and every column present somewhere
    train = raw[:ts]
    mean = np.array([c[np.isfinite(c)].mean() for c in train.T])
    std = np.maximum(np.array([c[np.isfinite(c)].std() for c in train.T]), 1e-8)
    np.testing.assert_allclose(fm.book_stats.mean, mean, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(fm.book_stats.std, std, rtol=1e-12, atol=1e-12)
    want = np.where(missing, 0.0, np.clip((raw - mean) / std, -FEATURES.clip_sigma, FEATURES.clip_sigma))
    assert fm.book_obs.shape == (fm.n_rows, BOOK_FEATURES) and fm.book_obs.dtype == np.float32
    np.testing.assert_allclose(fm.book_obs, want, rtol=1e-6, atol=1e-6)
    assert np.isfinite(fm.book_obs).all() and (fm.book_obs[missing] == 0).all()

    raw_changed = dataclasses.replace(fs.raw, bid_px=fs.raw.bid_px.copy(), bid_sz=fs.raw.bid_sz.copy())
    later = slice(fm.row0 + ts, None)  # the purged tail and the validation days
    raw_changed.bid_px[later] -= 7 * fs.raw.tick_size
    raw_changed.bid_sz[later] = 0  # every later bid level missing
    changed = FoldMarket.build(dataclasses.replace(fs, raw=raw_changed), WINDOWS, FEATURES, ENV)
    np.testing.assert_array_equal(changed.book_stats.mean, fm.book_stats.mean)
    np.testing.assert_array_equal(changed.book_obs[:ts], fm.book_obs[:ts])
    assert (changed.book_obs[ts:, :10] == 0).all() and (changed.book_obs[ts:, 20:30] == 0).all()


def test_a_book_with_empty_levels_and_columns_stays_finite(fs):
    """A level never present in the training rows (its column normalises with mean 0, std 1) and a bar whose whole
    book is empty give finite inputs; the book statistics survive a checkpoint, and a market built from them with
    no training rows (fox evaluate's path) has the same book rows; without them its book is zeros."""
    raw = dataclasses.replace(fs.raw, bid_px=fs.raw.bid_px.copy(), bid_sz=fs.raw.bid_sz.copy(),
                              ask_px=fs.raw.ask_px.copy(), ask_sz=fs.raw.ask_sz.copy())
    raw.bid_px[:, 9] = np.nan  # the tenth bid level never shows
    raw.bid_sz[:, 9] = 0
    bar = 9 + 20  # a training bar with an empty book
    raw.bid_px[bar], raw.ask_px[bar], raw.bid_sz[bar], raw.ask_sz[bar] = np.nan, np.nan, 0, 0
    changed = dataclasses.replace(fs, raw=raw)
    fm = FoldMarket.build(changed, WINDOWS, FEATURES, ENV)
    assert np.isfinite(fm.book_obs).all()
    assert (fm.book_obs[:, [9, 29]] == 0).all() and (fm.book_obs[bar - 9] == 0).all()
    np.testing.assert_array_equal(fm.book_stats.mean[[9, 29]], [0, 0])
    np.testing.assert_array_equal(fm.book_stats.std[[9, 29]], [1, 1])
    arrays = fm.checkpoint_arrays()
    given = book_stats_from_checkpoint(arrays)
    np.testing.assert_array_equal(given.mean, fm.book_stats.mean)
    assert book_stats_from_checkpoint({k: v for k, v in arrays.items() if k not in BOOK_ARRAYS}) is None
    days = fs.n_days
    all_val = Windows(train_first=0, train_stop=0, val_first=0, val_stop=days, purge_bars=0)
    evaluated = FoldMarket.build(changed, all_val, FEATURES, ENV, stats=fm.stats, risk_unit=fm.risk_unit,
                                 book_stats=given)
    np.testing.assert_array_equal(evaluated.book_obs[9 : 9 + fm.n_rows], fm.book_obs)
    bare = FoldMarket.build(changed, all_val, FEATURES, ENV, stats=fm.stats, risk_unit=fm.risk_unit)
    assert bare.book_stats is None and not bare.book_obs.any() and not set(BOOK_ARRAYS) & set(bare.checkpoint_arrays())
