"""Curriculum episode starts (env.curriculum_epochs): the difficulty ranking FoldMarket builds, the reach kernel,
the draw against the float64 reference, and the draw's distribution early and late in a fold's schedule."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from reference_env import Bar, Windows, env_config, hand_market, random_feature_set

from fox_numba.agent.environment import VecEnv
from fox_numba.agent.fold_market import FoldMarket, episode_volatility
from fox_numba.config import FeatureConfig
from fox_numba.device.isv import IsvBus
from fox_numba.kernels.env import SI_ROW, curriculum_reach
from fox_numba.kernels.optim import OPTIM_STATE_DTYPE

pytestmark = pytest.mark.usefixtures("long_switch_interval")
DAYS = [12, 9, 3, 10, 8]
WINDOWS = Windows(0, 4, 4, 5, 2)  # days 0-3 train (2 bars purged), day 4 validates


def optim_state(stager, step: int):
    state = np.zeros(1, OPTIM_STATE_DTYPE)
    state["step"] = step
    return stager.upload_new(state)


def reference_volatility(mid: np.ndarray, starts: np.ndarray, row_stop: np.ndarray, episode_bars: int) -> np.ndarray:
    out = []
    for s in starts:
        last = min(int(s) + episode_bars, int(row_stop[s])) - 1
        total = 0.0
        for r in range(int(s), last):
            total += (mid[r + 1] - mid[r]) ** 2
        out.append(math.sqrt(total / (last - s)))
    return np.array(out)


def test_starts_are_ranked_easiest_first_by_their_episode_volatility(rng):
    """On: train_starts is the off order's permutation, sorted by start_difficulty (ties in row order), which
    equals a plain float64 loop over each episode's bars exactly; off: row order, same difficulties."""
    fs = random_feature_set(rng, DAYS)
    env = env_config(episode_bars=5)
    off = FoldMarket.build(fs, WINDOWS, FeatureConfig(), env)
    on = FoldMarket.build(fs, WINDOWS, FeatureConfig(), dataclasses.replace(env, curriculum_epochs=2))
    assert np.all(np.diff(off.train_starts) > 0)
    np.testing.assert_array_equal(off.start_difficulty,
                                  reference_volatility(off.mid, off.train_starts, off.row_stop, 5))  # fmt: skip
    order = np.lexsort((off.train_starts, off.start_difficulty))
    np.testing.assert_array_equal(on.train_starts, off.train_starts[order])
    np.testing.assert_array_equal(on.start_difficulty, off.start_difficulty[order])
    assert np.unique(on.start_difficulty).size > on.train_starts.size // 2  # a ranking, not a tie


def test_the_difficulty_reads_no_bar_at_or_after_the_purge_start(rng):
    """Every bar from the purge start on poisoned (mid, books, features): the ranking is unchanged, while the
    same poison one row earlier (inside a training episode) changes it."""
    fs = random_feature_set(rng, DAYS)
    env = env_config(episode_bars=5, curriculum_epochs=2)
    base = FoldMarket.build(fs, WINDOWS, FeatureConfig(), env)

    def poisoned(first: int) -> FoldMarket:
        g = base.row0 + first
        raw = fs.raw
        mid = raw.mid.copy()
        mid[g:] = rng.uniform(100.0, 900.0, mid[g:].shape)
        values = fs.values.copy()
        values[g:] = rng.normal(size=values[g:].shape) * 5
        books = {name: getattr(raw, name).copy() for name in ("bid_px", "ask_px")}
        for a in books.values():
            a[g:] += 7.0
        changed = dataclasses.replace(raw, mid=mid, **books)
        return FoldMarket.build(dataclasses.replace(fs, values=values, raw=changed), WINDOWS, FeatureConfig(), env)

    after = poisoned(base.train_stop)
    np.testing.assert_array_equal(after.train_starts, base.train_starts)
    np.testing.assert_array_equal(after.start_difficulty, base.start_difficulty)
    assert not np.array_equal(after.mid, base.mid)
    assert not np.array_equal(poisoned(base.train_stop - 1).start_difficulty, base.start_difficulty)


def test_the_reach_kernel_matches_its_reference(stager):
    """reach = reach0 + (1 - reach0) min(step / horizon, 1) (1 at horizon 0), float64, on seeded random
    (step, reach0, horizon), steps before, at and past the horizon."""
    rng = np.random.default_rng(5)
    reach = stager.upload_new(np.zeros(1, np.float64))
    for horizon in (0, 1, 3000, 12345):
        for step in (*rng.integers(0, max(horizon, 1) * 2, 3), horizon):
            reach0 = float(rng.uniform(0.05, 1.0))
            curriculum_reach(optim_state(stager, int(step)), reach0, horizon, reach, stream=stager.stream)
            progress = 1.0 if horizon == 0 else min(float(step) / horizon, 1.0)
            expected = reach0 + (1.0 - reach0) * progress  # to 1e-15: a GPU may fuse the multiply-add
            assert stager.download(reach)[0] == pytest.approx(expected, rel=1e-15), (step, horizon, reach0)
    with pytest.raises(ValueError, match="reach0"):
        curriculum_reach(optim_state(stager, 0), 0.0, 10, reach, stream=stager.stream)


@pytest.mark.parametrize("reach", [0.4, 1.0])
def test_curriculum_collect_sequences_match_the_reference(run_env, reach):
    """Ranked starts, reach 0.4 and 1: the reset's and every auto-reset's draw equal the reference's
    (starts[floor(u x reach x n)]) in every state field, output and RNG state over 12 steps of random
    actions; at 0.4 every start drawn is one of the easiest 40%."""
    rng = np.random.default_rng(11)
    fs = random_feature_set(rng, DAYS)
    env = env_config(episode_bars=4, curriculum_epochs=3, curriculum_reach=0.3, w_persist=0.3)
    market = FoldMarket.build(fs, WINDOWS, FeatureConfig(), env)
    run = run_env(market, env, mode="collect", n_envs=12, seed=4, q_dir_abs_ref=0.2, reach=reach)
    easy = market.train_starts[: math.ceil(reach * market.train_starts.size)]
    assert np.isin(run.env.download_state()["si"][SI_ROW], easy).all()
    resets = 0
    for step in range(12):
        actions = np.stack([rng.integers(0, 4, 12), rng.integers(0, 3, 12), rng.integers(0, 3, 12),
                            rng.integers(0, 3, 12)], axis=1)  # fmt: skip
        got = run.step(actions, f"reach {reach} step {step}")
        assert np.isin(got["si"][SI_ROW, got["done"] == 1], easy).all()
        resets += int(got["done"].sum())
    assert resets >= 12


def chi2_uniform(counts: np.ndarray) -> float:
    expected = counts.sum() / counts.size
    return float(((counts - expected) ** 2 / expected).sum())


CHI2_999 = {3: 16.27, 7: 24.32}  # chi-square quantiles at 0.999 by degrees of freedom


def test_early_draws_take_the_easiest_starts_and_late_draws_are_uniform(stager):
    """512 environments reset over 64 ranked starts (start row = rank), reach from a learner step counter
    through VecEnv.follow_curriculum (curriculum 4 epochs of 100 steps, curriculum_reach 0.25):

    - epoch 0 (step 0): every draw is one of the 16 easiest starts, spread evenly over them (4 bins of 4
      ranks: chi-square < 16.27, its 0.999 quantile at 3 degrees of freedom). A uniform draw would put all
      512 there with probability 0.25**512;
    - epoch 2 (step 200, reach 0.625): every draw within the easiest 40 ranks, over a quarter beyond the
      first 16 (60% expected);
    - epoch 4 (step 400, the schedule's end): the 64 ranks in 8 bins of 8 are uniform (chi-square < 24.32,
      the 0.999 quantile at 7 degrees of freedom). Any reach short of 7/8 leaves the last bin empty, which
      alone adds 64 to the statistic, so a schedule that never reaches the uniform draw cannot pass.
    Seeds are fixed, so the outcome is deterministic; the quantiles say how unlikely a failure of a correct
    draw is on other seeds."""
    n_starts, n = 64, 512
    bars = [Bar(100.0 + 0.25 * (k % 3), (5,), 100.25 + 0.25 * (k % 3), (5,)) for k in range(n_starts + 4)]
    market = hand_market(bars, starts=list(range(n_starts)), episode_bars=4)
    env = env_config(episode_bars=4, curriculum_epochs=4, curriculum_reach=0.25)
    vec = VecEnv(market.upload(stager), env, FeatureConfig(), IsvBus(stager).values, stager=stager, n_envs=n,
                 seed=21)  # fmt: skip

    def ranks(step: int) -> np.ndarray:
        vec.follow_curriculum(optim_state(stager, step), 100, stream=stager.stream)
        vec.reset(stream=stager.stream)
        return vec.download_state()["si"][SI_ROW]

    early = ranks(0)
    assert early.max() < 16 and chi2_uniform(np.bincount(early // 4, minlength=4)) < CHI2_999[3]
    middle = ranks(200)
    assert middle.max() < 40 and (middle >= 16).sum() > n // 4
    late = ranks(400)
    assert chi2_uniform(np.bincount(late // 8, minlength=8)) < CHI2_999[7]


def test_off_leaves_the_reach_at_one_and_the_starts_in_row_order(stager, rng):
    """env.curriculum_epochs = 0: follow_curriculum launches nothing (reach stays exactly 1, the plain
    uniform draw, bit for bit) and FoldMarket keeps the row order."""
    fs = random_feature_set(rng, DAYS)
    env = env_config(episode_bars=5)
    market = FoldMarket.build(fs, WINDOWS, FeatureConfig(), env)
    vec = VecEnv(market.upload(stager), env, FeatureConfig(), IsvBus(stager).values, stager=stager, n_envs=2)
    vec.follow_curriculum(optim_state(stager, 0), 100, stream=stager.stream)
    assert stager.download(vec.reach)[0] == 1.0 and np.all(np.diff(market.train_starts) > 0)
    np.testing.assert_array_equal(episode_volatility(market.mid, market.train_starts, market.row_stop, 5),
                                  market.start_difficulty)  # fmt: skip
