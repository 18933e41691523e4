"""The observation layout: sizes and column names (with and without the time-weighted imbalance block), the
generated table is current, the mirror parity, and the market part (normalised features + per-day EMAs, of any
column count) against a plain float64 loop, with no look-ahead."""

from __future__ import annotations

import numpy as np
import pytest

from fox_numba import observation as ob
from fox_numba.config import FeatureConfig
from fox_numba.features.names import FEATURE_INDEX, FEATURE_NAMES, TW_IMBALANCE_COLUMNS

TW = FeatureConfig(tw_imbalance=True)
PLAIN = FeatureConfig(tw_imbalance=False)  # the 128 feature columns alone (the default before the block)


def test_layout_sizes_and_names():
    assert (ob.N_FEATURES, ob.N_MARKET, ob.N_PORTFOLIO, ob.OBS_DIM) == (32, 128, 6, 134)
    names = ob.column_names(PLAIN)
    assert len(names) == ob.OBS_DIM == len(set(names))
    assert names[0] == "z.ofi_l1" and names[32] == "ema3.ofi_l1" and names[127] == "ema30.session_frac"
    assert names[ob.N_MARKET + ob.PORT_POSITION] == "port.position"
    assert names[ob.N_MARKET + ob.PORT_BARS_LEFT] == "port.bars_left"
    assert names[ob.Z_REALISED_VOL] == "z.realised_vol_15"
    assert [ob.PORT_POSITION, ob.PORT_UPNL, ob.PORT_BARS_IN_POS, ob.PORT_ORDER_SIDE, ob.PORT_ORDER_DIST,
            ob.PORT_BARS_LEFT] == list(range(6))  # fmt: skip
    for value in (ob.N_MARKET, ob.N_PORTFOLIO, ob.OBS_DIM, ob.PORT_UPNL, ob.Z_REALISED_VOL):
        assert type(value) is int


def test_generated_table_is_current():
    assert ob.OBSERVATION_DOC_PATH.read_text(encoding="utf-8") == ob.observation_table_markdown(), (
        "OBSERVATION.md is stale: run python -m fox_numba.observation --write"
    )
    table = ob.observation_table_markdown()
    assert all(f"`{name}`" in table for name in FEATURE_NAMES + TW_IMBALANCE_COLUMNS)
    assert all(f"`port.{name}`" in table for name, _ in ob.PORTFOLIO)


def ema_reference(z, day_start, ema_start="first"):
    """Plain loops: per day, per half-life, per column; each day's EMA from its first bar's z, or from 0."""
    c = z.shape[1]
    out = np.zeros((z.shape[0], c * (1 + len(ob.EMA_HALF_LIVES))))
    out[:, :c] = z
    for k, h in enumerate(ob.EMA_HALF_LIVES):
        a = 1.0 - 0.5 ** (1.0 / h)
        for d in range(len(day_start) - 1):
            for col in range(c):
                e = 0.0
                for t in range(day_start[d], day_start[d + 1]):
                    x = float(z[t, col])
                    e = x if t == day_start[d] and ema_start == "first" else e + a * (x - e)
                    out[t, (k + 1) * c + col] = e
    return out


def test_market_part_matches_the_reference_and_restarts_each_day(rng):
    z = rng.normal(size=(23, ob.N_FEATURES)).astype(np.float32)
    day_start = np.array([0, 9, 10, 23])
    got = ob.market_part(z, day_start, "first")
    assert got.dtype == np.float32 and got.shape == (23, ob.N_MARKET)
    np.testing.assert_allclose(got, ema_reference(z, day_start), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(got[[0, 9, 10], 32:64], z[[0, 9, 10]], err_msg="the EMAs restart at a day's first bar")
    assert ob.ema_alpha(10) == pytest.approx(1 - 0.5**0.1)


def test_market_part_zero_start_matches_the_reference(rng):
    """features.ema_start = 'zero': each day's EMAs start from 0, so a day's first bar holds alpha z, and every
    later bar the reference's recursion from there; the z block is unchanged."""
    z = rng.normal(size=(23, ob.N_FEATURES)).astype(np.float32)
    day_start = np.array([0, 9, 10, 23])
    got = ob.market_part(z, day_start, "zero")
    np.testing.assert_allclose(got, ema_reference(z, day_start, "zero"), rtol=1e-6, atol=1e-6)
    for k, h in enumerate(ob.EMA_HALF_LIVES):
        block = slice((k + 1) * ob.N_FEATURES, (k + 2) * ob.N_FEATURES)
        np.testing.assert_allclose(got[[0, 9, 10], block], ob.ema_alpha(h) * z[[0, 9, 10]].astype(np.float64),
                                   rtol=1e-6)
    np.testing.assert_array_equal(got[:, : ob.N_FEATURES], z)
    assert not np.allclose(got[1:9, 32:], ob.market_part(z, day_start, "first")[1:9, 32:]), "the two starts must differ"


@pytest.mark.parametrize("ema_start", ["first", "zero"])
@pytest.mark.parametrize("width", [ob.N_FEATURES, len(TW_IMBALANCE_COLUMNS)])
def test_market_part_is_the_reference_bit_for_bit(rng, ema_start, width):
    """The compiled EMA loop does the reference's float64 operations in its order (no fused multiply-add), so the
    float32 output is the reference's rounded, exactly: runs started before it compiled keep their numbers."""
    z = rng.normal(size=(300, width)).astype(np.float32)
    day_start = np.array([0, 1, 57, 58, 190, 300])
    expected = ema_reference(z, day_start, ema_start).astype(np.float32)
    np.testing.assert_array_equal(ob.market_part(z, day_start, ema_start), expected)


def test_market_part_has_no_look_ahead(rng):
    """Changing every row after r changes no market row at or before r."""
    z = rng.normal(size=(15, ob.N_FEATURES)).astype(np.float32)
    day_start = np.array([0, 6, 15])
    base = ob.market_part(z, day_start, "first")
    for r in range(14):
        changed = z.copy()
        changed[r + 1 :] = rng.normal(size=changed[r + 1 :].shape)
        got = ob.market_part(changed, day_start, "first")
        np.testing.assert_array_equal(got[: r + 1], base[: r + 1])
        assert not np.array_equal(got[r + 1 :], base[r + 1 :])


def test_market_part_rejects_bad_input():
    z = np.zeros((5, ob.N_FEATURES), np.float32)
    for bad in (z[:, :0], z[:, 0]):
        with pytest.raises(ValueError, match="z must be"):
            ob.market_part(bad, np.array([0, 5]), "first")
    with pytest.raises(ValueError, match=r"z must be \[n, 32\] or \[n, 44\]"):
        ob.feature_part(z[:, :3], np.array([0, 5]), "first")
    with pytest.raises(ValueError, match="day_start must run"):
        ob.market_part(z, np.array([0, 4]), "first")
    with pytest.raises(ValueError, match="strictly increasing"):
        ob.market_part(z, np.array([0, 2, 2, 5]), "first")
    with pytest.raises(ValueError, match="ema_start"):
        ob.market_part(z, np.array([0, 5]), "last")


def test_the_time_weighted_imbalance_block_widens_the_market_part_and_is_the_default():
    """features.tw_imbalance: 48 columns (the 12 columns in the four blocks, z then ema3, ema10, ema30) after the 128
    feature columns and before the forecast columns; on by default, OBS_DIM columns without it."""
    assert ob.N_TW_IMBALANCE == 48 == 4 * len(TW_IMBALANCE_COLUMNS)
    assert ob.column_names() == ob.column_names(FeatureConfig()) == ob.column_names(TW)
    assert len(ob.column_names()) == ob.OBS_DIM + ob.N_TW_IMBALANCE == 182
    assert (ob.feature_columns(PLAIN), ob.market_columns(PLAIN), ob.obs_dim(PLAIN)) == (128, 128, ob.OBS_DIM)
    both = FeatureConfig(tw_imbalance=True, forecast_horizons=[5, 15])
    assert (ob.feature_columns(TW), ob.market_columns(TW), ob.obs_dim(TW)) == (176, 176, 182)
    assert (ob.feature_columns(both), ob.market_columns(both), ob.obs_dim(both)) == (176, 178, 184)
    names = ob.column_names(both)
    assert len(names) == ob.obs_dim(both) == len(set(names))
    assert names[:128] == ob.column_names(PLAIN)[:128]
    assert names[128:176] == tuple(f"{b}.{c}" for b in ("z", "ema3", "ema10", "ema30") for c in TW_IMBALANCE_COLUMNS)
    assert (names[128], names[139], names[140], names[175]) == (
        "z.tw_imbalance_l1", "z.tw_imbalance_l1_10", "ema3.tw_imbalance_l1", "ema30.tw_imbalance_l1_10")
    assert names[176:178] == ("forecast.h5", "forecast.h15") and names[178:] == ob.column_names(PLAIN)[128:]


def test_mirror_parity_negates_the_time_weighted_imbalance():
    """Every time-weighted imbalance column is an imbalance of bid over ask: the mirror negates it (parity -1);
    every other column keeps its default parity."""
    plain, tw = ob.mirror_parity(PLAIN), ob.mirror_parity(TW)
    assert tw.shape == (182,) and tw.dtype == np.float32
    np.testing.assert_array_equal(tw[:128], plain[:128])
    np.testing.assert_array_equal(tw[128:176], -np.ones(48, np.float32))
    np.testing.assert_array_equal(tw[176:], plain[128:])
    assert plain[FEATURE_INDEX["depth_imbalance_l1"]] == -1 and plain[FEATURE_INDEX["log_depth"]] == 1


def test_market_part_of_any_width_and_feature_part_match_the_reference(rng):
    """market_part of 12 columns is the reference's four blocks of them; feature_part of z [n, 44] is market_part of
    the 32 features, then of the 12 time-weighted columns (column_names' order); of z [n, 32] the features' alone."""
    day_start = np.array([0, 7, 8, 19])
    z = rng.normal(size=(19, ob.N_FEATURES + len(TW_IMBALANCE_COLUMNS))).astype(np.float32)
    for start in ("first", "zero"):
        tw = ob.market_part(z[:, 32:], day_start, start)
        assert tw.shape == (19, 48) and tw.dtype == np.float32
        np.testing.assert_allclose(tw, ema_reference(z[:, 32:], day_start, start), rtol=1e-6, atol=1e-6)
        got = ob.feature_part(z, day_start, start)
        assert got.shape == (19, 176) and got.dtype == np.float32
        want = np.concatenate([ema_reference(z[:, :32], day_start, start), ema_reference(z[:, 32:], day_start, start)],
                              axis=1)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(got[:, :128], ob.market_part(z[:, :32], day_start, start))
        np.testing.assert_array_equal(ob.feature_part(z[:, :32], day_start, start), got[:, :128])
