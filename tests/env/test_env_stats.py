"""The rollout ISV reduction and the epoch metrics reduction against float64 numpy sums."""

from __future__ import annotations

import numpy as np
import pytest

from fox_numba.device.isv import Isv, IsvBus
from fox_numba.device.memory import Mapped
from fox_numba.kernels.env import (
    ACC_COMMISSION_USD,
    ACC_COMP_0,
    ACC_DIR_0,
    ACC_EP_RETURN,
    ACC_EPISODES,
    ACC_LIMIT_FILLED,
    ACC_LIMIT_PLACED,
    ACC_PNL_USD,
    ACC_POS_ABS,
    ACC_REWARD,
    ACC_STEPS,
    ACC_TRADED,
    COMP_NAMES,
    N_ACC,
    N_COMPS,
    N_STATS,
    ST_EP_DONE,
    ST_EP_RETURN,
    ST_POS_ABS,
    ST_TRADED,
)
from fox_numba.kernels.env_stats import (
    METRIC_NAMES,
    METRICS_DTYPE,
    N_METRICS,
    ROLLOUT_EMA_ALPHA,
    epoch_metrics,
    rollout_isv,
    stats_threads,
)

ALPHA = float(ROLLOUT_EMA_ALPHA)
SLOTS = {
    "dirs": [Isv.ACT_SHORT_FRAC_EMA, Isv.ACT_HOLD_FRAC_EMA, Isv.ACT_LONG_FRAC_EMA, Isv.ACT_FLAT_FRAC_EMA],
    "comps": [Isv[f"REWARD_{c.upper()}_EMA"] for c in COMP_NAMES],
}


def test_stats_threads():
    assert [stats_threads(n) for n in (1, 2, 3, 37, 256, 257, 16384)] == [1, 2, 4, 64, 256, 256, 256]
    assert stats_threads(16384, 512) == 512 and stats_threads(300, 512) == 512


def rollout_inputs(rng, n, any_done=True):
    actions = np.stack([rng.integers(0, 4, n), rng.integers(0, 3, n), rng.integers(0, 3, n),
                        rng.integers(0, 3, n)], axis=1).astype(np.int32)  # fmt: skip
    reward = rng.normal(0, 1, n).astype(np.float32)
    comps = rng.normal(0, 1, (N_COMPS, n)).astype(np.float32)
    stats = np.zeros((N_STATS, n), np.float32)
    stats[ST_TRADED] = rng.integers(0, 9, n)
    stats[ST_POS_ABS] = rng.choice([0, 0.25, 0.5, 1.0], n)
    done = (rng.random(n) < 0.3) if any_done else np.zeros(n, bool)
    stats[ST_EP_DONE] = done
    stats[ST_EP_RETURN] = np.where(done, rng.normal(0, 3, n), 0)
    return actions, reward, comps, stats


@pytest.mark.parametrize("n", [1, 37, 300])
def test_rollout_isv_emas_match_numpy(stream, stager, rng, n):
    """Two steps from a bus with random rollout slots: every rollout slot moves by alpha 0.05 toward this
    step's float64 numpy mean (tolerance 1e-5 relative: float32 sums); other slots stay untouched; the
    episode-return slot moves only on a step where an episode ended."""
    bus = IsvBus(stager)
    isv0 = rng.uniform(0, 1, bus.values.shape[0]).astype(np.float32)
    stager.upload(isv0, bus.values)
    expected = isv0.astype(np.float64)
    for any_done in (True, False):
        actions, reward, comps, stats = rollout_inputs(rng, n, any_done)
        dev = [stager.upload_new(a) for a in (actions, reward, comps, stats)]
        rollout_isv(*dev, bus.values, stream=stream)
        means = {int(s): np.mean(actions[:, 0] == d) for d, s in enumerate(SLOTS["dirs"])}
        means[int(Isv.POSITION_ABS_EMA)] = stats[ST_POS_ABS].astype(np.float64).mean()
        means[int(Isv.TURNOVER_EMA)] = stats[ST_TRADED].astype(np.float64).mean()
        means[int(Isv.REWARD_ABS_EMA)] = np.abs(reward.astype(np.float64)).mean()
        for c, s in enumerate(SLOTS["comps"]):
            means[int(s)] = np.abs(comps[c].astype(np.float64)).mean()
        if stats[ST_EP_DONE].any():
            done = stats[ST_EP_DONE] > 0
            means[int(Isv.EPISODE_RETURN_EMA)] = stats[ST_EP_RETURN, done].astype(np.float64).mean()
        for slot, mean in means.items():
            expected[slot] += ALPHA * (mean - expected[slot])
        np.testing.assert_allclose(stager.download(bus.values), expected, rtol=1e-5, atol=1e-6)


def test_epoch_metrics_match_numpy(stream, stager, rng):
    """300 environments of random accumulators (over one block of 256 threads): every metric equals its
    float64 numpy definition (rtol 1e-12); with no limit orders and no episodes the ratios are 0."""
    n = 300
    acc = rng.uniform(0, 10, (N_ACC, n))
    acc[ACC_STEPS] = rng.integers(1, 50, n)
    acc[[ACC_REWARD, ACC_PNL_USD, *range(ACC_COMP_0, ACC_COMP_0 + N_COMPS)]] -= 5
    out = Mapped(N_METRICS, np.float64)
    epoch_metrics(stager.upload_new(acc), out.device, stream=stream)
    stream.synchronize()
    got = out.host.copy().view(METRICS_DTYPE)[0]
    s = acc.sum(axis=1)
    steps = s[ACC_STEPS]
    expected = {
        "steps": steps, "episodes": s[ACC_EPISODES], "reward_mean": s[ACC_REWARD] / steps,
        **{f"{c}_mean": s[ACC_COMP_0 + k] / steps for k, c in enumerate(COMP_NAMES)},
        **{f"{d}_frac": s[ACC_DIR_0 + k] / steps for k, d in enumerate(("short", "hold", "long", "flat"))},
        "active_frac": (s[ACC_DIR_0] + s[ACC_DIR_0 + 2]) / steps, "turnover": s[ACC_TRADED] / steps,
        "limit_placed": s[ACC_LIMIT_PLACED], "limit_filled": s[ACC_LIMIT_FILLED],
        "fill_rate": s[ACC_LIMIT_FILLED] / s[ACC_LIMIT_PLACED], "position_abs_mean": s[ACC_POS_ABS] / steps,
        "episode_return_mean": s[ACC_EP_RETURN] / s[ACC_EPISODES], "pnl_usd": s[ACC_PNL_USD],
        "commission_usd": s[ACC_COMMISSION_USD],
    }  # fmt: skip
    assert set(expected) == set(METRIC_NAMES)
    for name in METRIC_NAMES:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-12, err_msg=name)

    acc[[ACC_LIMIT_PLACED, ACC_LIMIT_FILLED, ACC_EPISODES, ACC_EP_RETURN]] = 0
    epoch_metrics(stager.upload_new(acc[:, :5].copy()), out.device, stream=stream)
    stream.synchronize()
    got = out.host.copy().view(METRICS_DTYPE)[0]
    assert got["fill_rate"] == 0 and got["episode_return_mean"] == 0 and got["steps"] == acc[ACC_STEPS, :5].sum()
