"""The validation backtest (agent/evaluator.py) on validation days of unequal lengths, against the float64
reference environment (tests/reference_env.py) trading the same policy.

A fold of random days: two training days, then three validation days of 4, 6 and 3 bars (3, 5 and 2 steps:
one per bar but the last, where the day is closed), backtested in chunks of 2 steps (two chunks of 2 and
a remainder of 1 cover the longest day). The network is linear with hand-set weights (2 atoms on [-1, 1],
so E[Q] orders the heads by their atom-1 logit minus their atom-0 logit): Long Full at market when flat,
Flat at market when long, so every step trades and each day's record shows where it starts and ends.
"""

from __future__ import annotations

import numpy as np
import pytest
from reference_env import Params, ReferenceEnv, Windows, env_config, random_feature_set

from fox_numba.agent.evaluator import Evaluator
from fox_numba.agent.fold_market import FoldMarket
from fox_numba.agent.network import ParamLayout
from fox_numba.config import EvaluationConfig, FeatureConfig, FoxConfig
from fox_numba.device.isv import IsvBus
from fox_numba.device.rng import xoroshiro_states_host
from fox_numba.errors import ConfigError
from fox_numba.kernels.heads import advantage_stream_of
from fox_numba.observation import PORT_POSITION, market_columns, obs_dim
from plain_learner import plain_network
from plain_learner import plain_config

SHORT, HOLD, LONG, FLAT = range(4)
FULL = 2
MARKET = 0
PATIENT = 0
MAGNITUDE_FULL_HEAD, ORDER_MARKET_HEAD, URGENCY_PATIENT_HEAD = 6, 7, 10
DAY_BARS = [12, 10, 4, 6, 3]
WINDOWS = Windows(train_first=0, train_stop=2, val_first=2, val_stop=5, purge_bars=2)
DAY_STEPS = [3, 5, 2]
pytestmark = pytest.mark.usefixtures("long_switch_interval")

MARKET_COLS = market_columns(FeatureConfig())  # the default observation's market part and width
OBS_COLS = obs_dim(FeatureConfig())


def atom1(head: int) -> int:
    """Head output column of atom 1 of head `head`'s advantage stream (2 atoms per stream)."""
    return 2 * advantage_stream_of(head) + 1


def flat_long_params(layout: ParamLayout) -> np.ndarray:
    """Atom-1 advantages: Short -2, Hold -1, Long 2 - 3 x (position / max position), Flat 1; Full, Market and
    Patient 1 in their branches (others 0). Long wins when flat (2 > 1), Flat when long 4 of 4 (-1 < 1)."""
    flat = np.zeros(layout.size, np.float32)
    p = layout.unpack(flat)
    for head, a in ((SHORT, -2.0), (HOLD, -1.0), (LONG, 2.0), (FLAT, 1.0), (MAGNITUDE_FULL_HEAD, 1.0),
                    (ORDER_MARKET_HEAD, 1.0), (URGENCY_PATIENT_HEAD, 1.0)):  # fmt: skip
        p["head.bias"][atom1(head)] = a
    p["head.weight"][MARKET_COLS + PORT_POSITION, atom1(LONG)] = -3.0
    return flat


def reference_days(market: FoldMarket, cfg: FoxConfig, steps: int) -> list[tuple[list[float], list[int]]]:
    """Per validation day, (PnL dollars, position) of each step the reference takes before its day is done,
    with the policy of `flat_long_params`."""
    ref = ReferenceEnv(market, Params.of(market, cfg.env, cfg.features), "eval", xoroshiro_states_host(3, 0))
    ref.reset()
    days: list[tuple[list[float], list[int]]] = [([], []) for _ in ref.envs]
    for _ in range(steps):
        running = [not e.frozen for e in ref.envs]
        actions = np.array([[LONG, FULL, MARKET, PATIENT] if e.pos == 0 else [FLAT, 0, MARKET, PATIENT]
                            for e in ref.envs])  # fmt: skip
        usd = ref.acc[18].copy()  # the reference's dollar PnL sums (kernels/env.py ACC_PNL_USD)
        ref.step(actions, 0.05)
        for d, e in enumerate(ref.envs):
            if running[d]:
                days[d][0].append(ref.acc[18, d] - usd[d])
                days[d][1].append(e.pos)
    assert all(e.frozen for e in ref.envs)
    return days


def test_each_day_records_its_own_steps_exactly(stager):
    """Each day's record holds exactly its own steps (3, 5, 2), with the reference's positions and dollars: a
    step too many or too few on any day changes a length or the closing step's record."""
    cfg = plain_config(env=env_config(episode_bars=8, fixed_bins=[-1, -1, -1]),  # the network's Full, as the reference
                       network=plain_network(n_layers=0, n_atoms=2),
                       evaluation=EvaluationConfig(chunk_bars=2))  # fmt: skip
    fs = random_feature_set(np.random.default_rng(20), DAY_BARS)
    market = FoldMarket.build(fs, WINDOWS, cfg.features, cfg.env)
    layout = ParamLayout.build(OBS_COLS, cfg.network)
    params = stager.upload_new(flat_long_params(layout))
    supports = stager.upload_new(np.tile(np.float32([-1.0, 1.0, 2.0]), (13, 1)))
    ev = Evaluator(market.upload(stager), cfg, layout, params, supports, isv=IsvBus(stager).values, stager=stager,
                   use_graph=True)  # fmt: skip
    assert ev.steps == 5
    days = ev.run()
    expected = reference_days(market, cfg, 6)
    assert [len(pnl) for pnl, _ in expected] == DAY_STEPS
    assert [len(pnl) for pnl, _ in days] == DAY_STEPS and [len(pos) for _, pos in days] == DAY_STEPS
    for d, ((pnl, pos), (ref_pnl, ref_pos)) in enumerate(zip(days, expected, strict=True)):
        assert pnl.dtype == np.float64 and pos.dtype == np.int32
        np.testing.assert_array_equal(pos, ref_pos, err_msg=f"day {d}: positions")
        np.testing.assert_allclose(pnl, ref_pnl, rtol=2e-6, atol=1e-4, err_msg=f"day {d}: dollars")
        assert pos[-1] == 0, f"day {d} ends flat"
    np.testing.assert_array_equal(days[1][1], [4, 0, 4, 0, 0])  # Long, Flat, Long, Flat, Long closed at the end


def test_a_hold_margin_wider_than_any_value_gap_never_trades(stager):
    """evaluation.hold_margin reaches the backtest: the policy above trades at every step, but with a margin of 2 (the
    widest gap two E[Q] on [-1, 1] can have) no change of position beats Hold, so every day stays flat; a negative
    margin is refused."""
    fs = random_feature_set(np.random.default_rng(20), DAY_BARS)
    net = plain_network(n_layers=0, n_atoms=2)
    layout = ParamLayout.build(OBS_COLS, net)
    params = stager.upload_new(flat_long_params(layout))
    supports = stager.upload_new(np.tile(np.float32([-1.0, 1.0, 2.0]), (13, 1)))
    for margin in (2.0, -0.5):
        cfg = plain_config(env=env_config(episode_bars=8, fixed_bins=[-1, -1, -1]), network=net,
                           evaluation=EvaluationConfig(chunk_bars=2, hold_margin=margin))  # fmt: skip
        market = FoldMarket.build(fs, WINDOWS, cfg.features, cfg.env).upload(stager)
        if margin < 0:
            with pytest.raises(ValueError, match="hold_margin"):
                Evaluator(market, cfg, layout, params, supports, isv=IsvBus(stager).values, stager=stager,
                          use_graph=False)  # fmt: skip
            continue
        days = Evaluator(market, cfg, layout, params, supports, isv=IsvBus(stager).values, stager=stager,
                         use_graph=False).run()  # fmt: skip
        assert [len(pos) for _, pos in days] == DAY_STEPS
        assert all(not pos.any() and not pnl.any() for pnl, pos in days)


def test_fixed_bins_override_the_network_in_the_backtest(stager):
    """env.fixed_bins = [2, 0, 0] (Full, Market, Patient) over a network whose magnitude branch prefers Half: the
    backtest trades the reference's Full positions, where the free policy holds 2 of 4; a bin outside a branch is
    refused naming the key."""
    fs = random_feature_set(np.random.default_rng(20), DAY_BARS)
    net = plain_network(n_layers=0, n_atoms=2)
    layout = ParamLayout.build(OBS_COLS, net)
    flat = flat_long_params(layout)
    layout.unpack(flat)["head.bias"][atom1(MAGNITUDE_FULL_HEAD - 1)] = 2.0  # Half over Full
    params = stager.upload_new(flat)
    supports = stager.upload_new(np.tile(np.float32([-1.0, 1.0, 2.0]), (13, 1)))
    runs = {}
    for fixed in ([-1, -1, -1], [FULL, MARKET, PATIENT]):
        cfg = plain_config(env=env_config(episode_bars=8, fixed_bins=fixed), network=net,
                           evaluation=EvaluationConfig(chunk_bars=2))  # fmt: skip
        market = FoldMarket.build(fs, WINDOWS, cfg.features, cfg.env)
        runs[tuple(fixed)] = Evaluator(market.upload(stager), cfg, layout, params, supports, isv=IsvBus(stager).values,
                                       stager=stager, use_graph=False).run()  # fmt: skip
    expected = reference_days(market, cfg, 6)
    for (_, pos), (_, ref_pos) in zip(runs[(FULL, MARKET, PATIENT)], expected, strict=True):
        np.testing.assert_array_equal(pos, ref_pos)
    assert set(np.concatenate([pos for _, pos in runs[(-1, -1, -1)]])) == {0, 2}
    bad = plain_config(env=env_config(episode_bars=8, fixed_bins=[3, 0, 0]), network=net)
    with pytest.raises(ConfigError, match="env.fixed_bins"):
        Evaluator(FoldMarket.build(fs, WINDOWS, bad.features, bad.env).upload(stager), bad, layout, params, supports,
                  isv=IsvBus(stager).values, stager=stager, use_graph=False)  # fmt: skip
