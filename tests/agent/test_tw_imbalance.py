"""features.tw_imbalance end to end on a small synthetic store: the fold's time-weighted imbalance block against a
float64 computation from the store's book, normalised on the training rows only (a change to the validation day's
book leaves the training rows' statistics and columns as they were) and reproduced from a checkpoint's statistics;
the probe reads it; a trainer collects, trains (the mirror negating the block) and evaluates over it; a checkpoint
refuses a run across the flag."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from real_trainer import SMALL, real_trainer

from fox_numba.agent.fold_market import FoldMarket
from fox_numba.agent.learner import live_branches, run_layout
from fox_numba.agent.network import ParamLayout
from fox_numba.agent.mean_head import MEAN_W, mean_head_parity
from fox_numba.checkpoint import load_checkpoint, save_checkpoint
from fox_numba.config import load_config, write_config
from fox_numba.errors import ConfigError, LayoutMismatchError
from fox_numba.features.book_features import time_weighted_imbalance
from fox_numba.features.normalise import NormStats
from fox_numba.market.schema import UNDEF_PRICE
from fox_numba.market.select import select_market
from fox_numba.market.store import MarketStore, write_store
from fox_numba.observation import EMA_HALF_LIVES, N_MARKET, OBS_DIM
from fox_numba.walkforward.driver import fold_baselines, half_spread, load_features, scored_days
from fox_numba.walkforward.evaluate import evaluate_checkpoint
from fox_numba.walkforward.folds import make_folds
from fox_numba.walkforward.probe import probe_baseline

TW = ["features.tw_imbalance=true"]
PLAIN = ["features.tw_imbalance=false"]
BLOCK = slice(N_MARKET, N_MARKET + 48)


def fold_market(store, overrides=()):
    """(config, feature set, fold 0's market) of the smoke preset on `store` (no cache) with `overrides`."""
    cfg = load_config("smoke", overrides=[f'market.store="{store}"', 'market.cache="off"', *overrides])
    selection = select_market(cfg.market)
    fs = load_features(cfg, selection)
    return cfg, fs, FoldMarket.build(fs, make_folds(cfg.folds, selection.days)[0], cfg.features, cfg.env)


def block_reference(store, fs, fm, clip: float, ema_start: str) -> tuple[np.ndarray, np.ndarray]:
    """float64 (raw [n, 12], block [n, 48]) of the fold: each day's columns from the store's every MBP-10 row (sizes of
    empty levels 0), normalised by their mean and population std over the fold's training rows, clipped, then the
    per-day EMAs of each half-life by a plain loop."""
    raw = []
    with MarketStore(store) as st:
        for d, day in enumerate(fm.days):
            book = st.read_day(day, ("mbp10",)).mbp10
            bid = np.where(book.bid_px == UNDEF_PRICE, 0.0, book.bid_sz.astype(np.float64))
            ask = np.where(book.ask_px == UNDEF_PRICE, 0.0, book.ask_sz.astype(np.float64))
            bars = fs.raw.ts[fm.row0 + fm.day_start[d] : fm.row0 + fm.day_start[d + 1]].astype(np.int64)
            raw.append(time_weighted_imbalance(book.ts_event.astype(np.int64), bid, ask, bars))
    raw = np.concatenate(raw)
    train = raw[: fm.train_stop]
    z = np.clip((raw - train.mean(axis=0)) / train.std(axis=0), -clip, clip)
    out = np.zeros((len(raw), 48))
    out[:, :12] = z
    for k, h in enumerate(EMA_HALF_LIVES):
        a = 1.0 - 0.5 ** (1.0 / h)
        for d in range(len(fm.day_start) - 1):
            e = np.zeros(12)
            for t in range(fm.day_start[d], fm.day_start[d + 1]):
                e = z[t] if t == fm.day_start[d] and ema_start == "first" else e + a * (z[t] - e)
                out[t, 12 * (k + 1) : 12 * (k + 2)] = e
    return raw, out


def test_the_block_is_the_stores_book_normalised_on_the_training_rows(half_hour_store):
    """Every element of the block against the float64 computation; the other market columns and their statistics
    those of the run without it, bit for bit; the checkpoint's statistics (44 per array) rebuild the same market."""
    cfg, fs, fm = fold_market(half_hour_store, TW)
    assert fm.market_obs.shape == (fm.n_rows, 176) and fm.train_stop > 0
    raw, want = block_reference(half_hour_store, fs, fm, cfg.features.clip_sigma, cfg.features.ema_start)
    np.testing.assert_array_equal(fs.values[fm.row0 : fm.row0 + fm.n_rows, 32:], raw)
    np.testing.assert_allclose(fm.market_obs[:, BLOCK], want, rtol=1e-6, atol=2e-6)
    assert np.abs(want[:, :12]).max() > 1.0 and np.abs(want[:, 12:]).min() < np.abs(want[:, 12:]).max()
    np.testing.assert_allclose(fm.stats.mean[32:], raw[: fm.train_stop].mean(axis=0), rtol=1e-12)
    _, plain_fs, plain = fold_market(half_hour_store, PLAIN)
    np.testing.assert_array_equal(fm.market_obs[:, :N_MARKET], plain.market_obs)
    np.testing.assert_array_equal(fm.stats.mean[:32], plain.stats.mean)
    arrays = fm.checkpoint_arrays()
    assert arrays["market.norm_mean"].shape == arrays["market.norm_std"].shape == (44,)
    stats = NormStats(arrays["market.norm_mean"], arrays["market.norm_std"], 0)
    fold = make_folds(cfg.folds, fs.days)[0]
    again = FoldMarket.build(fs, fold, cfg.features, cfg.env, stats=stats, risk_unit=fm.risk_unit)
    np.testing.assert_array_equal(again.market_obs, fm.market_obs)  # as `fox evaluate` builds it
    with pytest.raises(ConfigError, match="the feature set holds 32 columns per bar"):
        FoldMarket.build(plain_fs, fold, cfg.features, cfg.env)


def test_a_changed_validation_book_leaves_the_training_rows_alone(four_day_market, half_hour_store, tmp_path, rng):
    """The validation day's book sizes redrawn: the fold's statistics and every training-day row are unchanged, the
    validation rows' block is not (no look-ahead)."""
    m = four_day_market
    instrument = dataclasses.replace(m.instrument, session_close="10:00")  # as half_hour_store is written
    book = m.days[2].mbp10
    bid_sz = np.where(book.bid_px == UNDEF_PRICE, book.bid_sz, book.bid_sz * rng.integers(1, 4, book.bid_sz.shape))
    changed = [*m.days[:2], dataclasses.replace(m.days[2], mbp10=dataclasses.replace(book, bid_sz=bid_sz.astype(
        book.bid_sz.dtype))), *m.days[3:]]  # fmt: skip
    store = write_store(tmp_path / "changed.h5", instrument, changed)
    _, _, a = fold_market(half_hour_store, TW)
    _, _, b = fold_market(store, TW)
    assert a.days == b.days and a.days[2] == m.days[2].day and a.val_start == b.val_start == a.day_start[2]
    np.testing.assert_array_equal(a.stats.mean, b.stats.mean)
    np.testing.assert_array_equal(a.stats.std, b.stats.std)
    np.testing.assert_array_equal(a.market_obs[: a.val_start], b.market_obs[: b.val_start])
    assert (a.market_obs[a.val_start :, BLOCK] != b.market_obs[b.val_start :, BLOCK]).mean() > 0.5


def test_the_probe_reads_the_block(half_hour_store):
    """The fold's probe (driver.fold_baselines) is fitted on the 176 feature columns the agent sees."""
    cfg, _, fm = fold_market(half_hour_store, TW)
    ev = cfg.evaluation
    got = fold_baselines(cfg, fm, None, [])

    def probe(columns: int):
        return probe_baseline(fm.market_obs[:, :columns], fm.mid, half_spread(fm), fm.day_start,
                              slice(0, fm.train_stop), scored_days(fm), horizon=ev.probe_horizon_bars,
                              ridge=ev.probe_ridge, tick_size=fm.tick_size, point_value=fm.point_value,
                              commission=cfg.env.commission, annualisation_days=ev.annualisation_days)  # fmt: skip

    wide, narrow = probe(176), probe(N_MARKET)
    assert wide.probe.weights.shape == (176,)
    assert got.probe_r2 == wide.val_r2 != narrow.val_r2
    assert got.probe == wide.metrics


@pytest.mark.parametrize("network", [[], ["network.mirror=false", "network.mamba2_window=8"],
                                     ["network.mirror=false", "network.mean_cross=false", "network.vsn=true",
                                      "network.n_layers=1"]], ids=["linear", "mamba2", "vsn"])
def test_the_run_layout_takes_the_block_into_every_part(network):
    """run_layout: with the block the observation has 182 columns, the position x market columns, a Mamba2 encoder's
    inputs and a VSN group (`tw_imbalance`) take in its 48, and the fingerprint changes; without it the layout is the
    one ParamLayout.build gives the observation without it (the fingerprint of runs before the flag)."""
    off, on = (run_layout(load_config("default", overrides=[*network, f"features.tw_imbalance={flag}"]))
               for flag in ("false", "true"))
    cfg = load_config("default", overrides=[*network, *PLAIN])
    assert off.fingerprint == ParamLayout.build(OBS_DIM, cfg.network, features=cfg.features,
                                                live_branches=live_branches(cfg)).fingerprint
    assert (off.obs_dim, on.obs_dim) == (134, 182) and on.fingerprint != off.fingerprint
    if on.cross:
        assert (off.cross, on.cross) == (128, 176)
    if on.mamba2 is not None:
        assert (off.mamba2.n_features, on.mamba2.n_features) == (128, 176)
    if on.vsn:
        assert on.vsn_groups == (*off.vsn_groups[:4], (128, 176), (176, 182))
    assert on.cross or on.mamba2 is not None or on.vsn


def test_a_trainer_over_the_block_and_its_checkpoint_across_the_flag(half_hour_store, tmp_path):
    """A trainer with the block (a linear mean head under the exact mirror) collects from the 176 market columns,
    trains the mean head symmetric with the block's parity -1, and evaluates; its checkpoint refuses a run without the
    block, a checkpoint without it refuses a run with it (the params fingerprint), and `fox evaluate` refuses a --set
    that would change the observation."""
    rt = real_trainer(half_hour_store, [*SMALL, "env.collect_steps=2", "learner.steps_per_epoch=1",
                                        "network.mean_head=true", "network.mean_cross=true", "network.n_layers=0",
                                        "network.mirror=true", "network.mirror_strength=1", *TW])
    trainer, lay = rt.trainer, rt.trainer.layout
    market = trainer.market.host
    assert lay.obs_dim == 182 and market.market_obs.shape[1] == 176
    parity = mean_head_parity(rt.cfg, lay)
    np.testing.assert_array_equal(parity[BLOCK], -np.ones(48, np.float32))
    trainer.collect()
    stats = trainer.train(lambda: None)
    assert np.isfinite(stats["loss"])
    learner = trainer.learner
    obs = trainer.stager.download(learner.obs)
    rows = {r.tobytes() for r in market.market_obs}
    assert all(o[:176].tobytes() in rows for o in obs)  # every s and s' row reads a whole market row
    w = lay.unpack(trainer.stager.download(learner.params))[MEAN_W]
    np.testing.assert_array_equal(w, parity[:, None] * w[:, [2, 1, 0, 3]])
    assert np.abs(w[BLOCK]).max() > 0
    days = trainer.evaluate()[0]
    assert len(days) > 0 and all(np.isfinite(pnl).all() for pnl, _ in days)

    arrays = trainer.download_state() | market.checkpoint_arrays()
    on = save_checkpoint(tmp_path / "on" / "fold_00" / "best.h5", arrays, {"fold": 0, "epoch": 0},
                         fingerprints={"params": lay.fingerprint})
    cfg_off = dataclasses.replace(rt.cfg, features=dataclasses.replace(rt.cfg.features, tw_imbalance=False))
    off = run_layout(cfg_off)
    assert off.obs_dim == 134 and off.fingerprint != lay.fingerprint
    with pytest.raises(LayoutMismatchError, match="params layout fingerprint"):
        load_checkpoint(on, expected_fingerprints={"params": off.fingerprint})
    plain = save_checkpoint(tmp_path / "off.h5", {"learner.params": np.zeros(off.size, np.float32)},
                            fingerprints={"params": off.fingerprint})
    with pytest.raises(LayoutMismatchError, match="params layout fingerprint"):
        load_checkpoint(plain, expected_fingerprints={"params": lay.fingerprint})
    write_config(rt.cfg, tmp_path / "on" / "config.toml")
    with pytest.raises(ConfigError, match="a --set of features.tw_imbalance"):
        evaluate_checkpoint(on, store=None, overrides=["features.tw_imbalance=false"], log=lambda _: None)
    write_config(cfg_off, tmp_path / "on" / "config.toml")  # a run without the block holding this checkpoint
    with pytest.raises(LayoutMismatchError, match="params layout fingerprint"):
        evaluate_checkpoint(on, store=None, overrides=[], log=lambda _: None)
