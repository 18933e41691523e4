"""The environment step kernel against the float64 reference (tests/reference_env.py) and hand-worked numbers.

Hand scenarios run one evaluation environment over a window of hand-made bars (tick 0.25, $50 per point,
max position 4 (targets 1, 2, 4), $2 commission per contract, risk unit $100, beyond-depth penalty 2
ticks, limit lifetimes 10 / 4 / 1 bars); every step is also compared with the reference in every state
field, output and accumulator (the `Run` helper). Random sequences then compare kernel and reference over
many steps of random actions on random books, in collect mode (auto-resets) and evaluation mode.
"""

from __future__ import annotations

import numpy as np
import pytest
from reference_env import Bar, Windows, env_config, hand_market, random_feature_set

from fox_numba.agent.fold_market import FoldMarket
from fox_numba.config import FeatureConfig
from fox_numba.kernels.env import (
    ACC_COMMISSION_USD,
    ACC_EP_RETURN,
    ACC_EPISODES,
    ACC_LIMIT_FILLED,
    ACC_LIMIT_PLACED,
    ACC_PNL_USD,
    ACC_STEPS,
    ACC_TRADED,
    COMP_NOVELTY,
    COMP_PERSIST,
    COMP_PNL,
    COMP_REGIME,
    COMP_STABLE,
    COMP_TIMING,
    N_ACC,
    SF_AVG,
    SF_CASH,
    SF_ORD_PRICE,
    SF_ORD_QUEUE,
    SI_FROZEN,
    SI_LAST,
    SI_ORD_LIFE,
    SI_ORD_SIDE,
    SI_ORD_SIZE,
    SI_POS,
    SI_ROW,
)
from fox_numba.observation import (
    PORT_BARS_IN_POS,
    PORT_BARS_LEFT,
    PORT_ORDER_DIST,
    PORT_ORDER_SIDE,
    PORT_POSITION,
    PORT_UPNL,
)

SHORT, HOLD, LONG, FLAT = range(4)
QUARTER, HALF, FULL = range(3)
MARKET, JOIN, IMPROVE = range(3)
PATIENT, NORMAL, URGENT = range(3)
HOLD_ACTION = (HOLD, 0, MARKET, PATIENT)
pytestmark = pytest.mark.usefixtures("long_switch_interval")


def deep(bid: float, trades=None, z_vol: float = 0.0) -> Bar:
    """A bar with a one-tick spread and 10 contracts at each of 10 levels."""
    return Bar(bid, (10,) * 10, bid + 0.25, (10,) * 10, trades, z_vol)


def test_reference_env_counts_every_accumulator():
    assert N_ACC == 20


def test_market_order_walks_the_book_and_beyond_its_depth(run_env):
    """Buy 4 into asks 1 @ 100.00, 2 @ 100.25 (nothing more shown): the 4th contract fills beyond the depth
    at 100.25 + 2 ticks = 100.75: cost 100 + 200.5 + 100.75 = 401.25, average 100.3125, cash -401.25 x 50
    - 4 x $2 = -20070.5; marked at mid 100.125: equity -45.5, reward -0.455. Flat at bar 1 sells 4 into
    bids 3 @ 100.00, 1 @ 99.75 = 399.75: realised (99.9375 - 100.3125) x 4 x 50 = -$75, cash -91, reward
    (-91 + 45.5) / 100 = -0.455 plus the timing term -min(0.75, ref 0.05) = -0.05. Bar 2 ends the window:
    done, then frozen."""
    bars = [Bar(99.75, (5, 5), 100.0, (1, 2)), Bar(100.0, (3, 5), 100.25, (5,)), Bar(100.0, (5,), 100.25, (5,))]
    run = run_env(hand_market(bars), env_config(w_timing=1.0), mode="eval")
    got = run.step([LONG, FULL, MARKET, PATIENT], "buy")
    assert got["si"][SI_POS, 0] == 4 and got["si"][SI_ROW, 0] == 1
    assert got["sf"][SF_AVG, 0] == 100.3125 and got["sf"][SF_CASH, 0] == -20070.5
    np.testing.assert_allclose(got["reward"], [-0.455], rtol=1e-6)
    np.testing.assert_allclose(
        got["port"][0, [PORT_POSITION, PORT_UPNL, PORT_BARS_IN_POS, PORT_ORDER_SIDE, PORT_BARS_LEFT]],
        [1.0, (100.125 - 100.3125) * 4 * 50 / 100, 0.1, 0.0, 0.1], rtol=1e-6,
    )  # fmt: skip
    got = run.step([FLAT, 0, MARKET, PATIENT], "flat")
    assert got["done"][0] == 1.0 and got["si"][SI_POS, 0] == 0 and got["si"][SI_FROZEN, 0] == 1
    assert got["sf"][SF_CASH, 0] == -91.0
    np.testing.assert_allclose(got["comps"][[COMP_PNL, COMP_TIMING], 0], [-0.455, -0.05], rtol=1e-6)
    np.testing.assert_allclose(got["reward"], [-0.505], rtol=1e-6)
    acc = got["acc"][:, 0]
    assert (acc[ACC_STEPS], acc[ACC_TRADED], acc[ACC_COMMISSION_USD], acc[ACC_PNL_USD]) == (2, 8, 16, -91)
    assert acc[ACC_EPISODES] == 1 and acc[ACC_EP_RETURN] == pytest.approx(-0.455 - 0.505, rel=1e-6)
    frozen = run.step([LONG, FULL, MARKET, PATIENT], "frozen")
    assert frozen["reward"][0] == 0 and frozen["done"][0] == 1 and frozen["next_row"][0] == 2
    np.testing.assert_array_equal(frozen["acc"], got["acc"])


def test_flip_realises_pnl_and_pays_commission_on_every_contract(run_env):
    """Long 2 at 100.25, then Short full at bar 1's bid 100.50: sells 6, realises (100.50 - 100.25) x 2 x 50
    = $25 (timing min(0.25, 0.05) = +0.05), the other 4 open short at 100.50, cash -10029 + 30150 - 12 =
    20109; Hold through an unchanged mid earns persist clip(0.75) = 0.75; Flat buys 4 at 100.25, realising
    $50 (timing +0.05)."""
    bars = [deep(100.0), deep(100.5), deep(100.0), deep(100.0), deep(100.0)]
    run = run_env(hand_market(bars), env_config(w_timing=1.0, w_persist=1.0), mode="eval")
    got = run.step([LONG, HALF, MARKET, NORMAL])
    assert got["sf"][SF_CASH, 0] == -10029.0
    np.testing.assert_allclose(got["reward"], [0.335], rtol=1e-6)
    got = run.step([SHORT, FULL, MARKET, NORMAL])
    assert got["si"][SI_POS, 0] == -4 and got["sf"][SF_AVG, 0] == 100.5 and got["sf"][SF_CASH, 0] == 20109.0
    np.testing.assert_allclose(got["comps"][[COMP_PNL, COMP_TIMING], 0], [0.505, 0.05], rtol=1e-6)
    assert got["port"][0, PORT_BARS_IN_POS] == np.float32(0.1), "a flip starts a new holding period"
    got = run.step(HOLD_ACTION)
    np.testing.assert_allclose(got["comps"][[COMP_PNL, COMP_PERSIST], 0], [0.0, 0.75], atol=1e-7)
    assert got["port"][0, PORT_BARS_IN_POS] == np.float32(0.2)
    got = run.step([FLAT, 0, MARKET, NORMAL])
    assert got["sf"][SF_CASH, 0] == 51.0 and got["si"][SI_POS, 0] == 0 and got["done"][0] == 1
    np.testing.assert_allclose(got["comps"][[COMP_PNL, COMP_TIMING], 0], [-0.33, 0.05], rtol=1e-6)
    assert got["acc"][ACC_COMMISSION_USD, 0] == 2.0 * (2 + 6 + 4)


def test_limit_join_fills_partly_after_its_queue(run_env):
    """Buy 4 joining the bid 100.00 behind 5 contracts. Bar 1 trades 3 at 100.00: no fill, queue 2. Bar 2
    trades 4: fills 2, queue 0. Re-sending the same order keeps its place. Bar 3 trades 1: fills 1. Bar 4
    trades through (99.75): the last contract fills. The window's last bar closes the 4 at market."""
    bars = [
        Bar(100.0, (5, 10), 100.25, (10, 10)),
        deep(100.0, (100.0, 3, 100.25, 2)),
        deep(100.0, (100.0, 4, 100.25, 2)),
        deep(100.0, (100.0, 1, 100.25, 2)),
        deep(100.0, (99.75, 2, 100.25, 2)),
        deep(100.0),
    ]
    run = run_env(hand_market(bars), env_config(), mode="eval")
    got = run.step([LONG, FULL, JOIN, PATIENT])
    assert (got["si"][SI_POS, 0], got["si"][SI_ORD_SIDE, 0], got["si"][SI_ORD_SIZE, 0]) == (0, 1, 4)
    assert got["sf"][SF_ORD_PRICE, 0] == 100.0 and got["sf"][SF_ORD_QUEUE, 0] == 2.0
    assert got["si"][SI_ORD_LIFE, 0] == 9
    np.testing.assert_allclose(got["port"][0, [PORT_ORDER_SIDE, PORT_ORDER_DIST]], [1.0, -0.05], rtol=1e-6)
    got = run.step(HOLD_ACTION)
    assert (got["si"][SI_POS, 0], got["si"][SI_ORD_SIZE, 0], got["sf"][SF_ORD_QUEUE, 0]) == (2, 2, 0.0)
    assert got["sf"][SF_CASH, 0] == -2 * 100.0 * 50 - 2 * 2.0
    got = run.step([LONG, FULL, JOIN, PATIENT], "same order again")
    assert (got["si"][SI_POS, 0], got["si"][SI_ORD_SIZE, 0], got["si"][SI_ORD_LIFE, 0]) == (3, 1, 9)
    got = run.step(HOLD_ACTION)
    assert got["si"][SI_POS, 0] == 4 and got["si"][SI_ORD_SIDE, 0] == 0
    got = run.step(HOLD_ACTION)
    assert got["done"][0] == 1 and got["si"][SI_POS, 0] == 0
    assert (got["acc"][ACC_LIMIT_PLACED, 0], got["acc"][ACC_LIMIT_FILLED, 0]) == (4, 4)
    assert got["acc"][ACC_TRADED, 0] == 8


def test_a_new_price_replaces_the_order_and_its_queue(run_env):
    """The bid rises to 100.25 (6 shown): the same target re-sent rests at the new price behind 6."""
    bars = [deep(100.0), Bar(100.25, (6, 1), 100.5, (1,)), deep(100.0), deep(100.0)]
    run = run_env(hand_market(bars), env_config(), mode="eval")
    got = run.step([LONG, HALF, JOIN, NORMAL])
    assert (got["sf"][SF_ORD_PRICE, 0], got["sf"][SF_ORD_QUEUE, 0]) == (100.0, 10.0)
    got = run.step([LONG, HALF, JOIN, NORMAL])
    assert (got["sf"][SF_ORD_PRICE, 0], got["sf"][SF_ORD_QUEUE, 0], got["si"][SI_ORD_LIFE, 0]) == (100.25, 6.0, 3)
    assert got["acc"][ACC_LIMIT_PLACED, 0] == 4


def test_improve_fills_partly_then_expires_and_a_one_tick_spread_joins(run_env):
    """Spread 2 ticks: Short half improving rests at 100.25 with no queue; bar 1 trades 1 contract at 100.25:
    fills 1, and the urgent order (1 bar) cancels the rest. Then the spread is one tick: Long quarter
    improving joins the bid at 100.00 behind 3 (target 1 from -1: buy 2), normal lifetime 4 bars: no trades,
    trades above, 3 at the price (eaten by the queue), no trades: cancelled after 4 bars unfilled."""
    bars = [
        Bar(100.0, (3,), 100.5, (3,)),
        Bar(100.0, (3,), 100.25, (3,), (100.0, 5, 100.25, 1)),
        deep(100.0),
        deep(100.0, (100.25, 4, 100.5, 4)),
        deep(100.0, (100.0, 3, 100.25, 1)),
        deep(100.0),
        deep(100.0),
    ]
    run = run_env(hand_market(bars), env_config(), mode="eval")
    got = run.step([SHORT, HALF, IMPROVE, URGENT])
    assert got["si"][SI_POS, 0] == -1 and got["si"][SI_ORD_SIDE, 0] == 0, "urgent: one bar, then cancelled"
    assert got["sf"][SF_AVG, 0] == 100.25
    got = run.step([LONG, QUARTER, IMPROVE, NORMAL])
    assert (got["si"][SI_ORD_SIDE, 0], got["si"][SI_ORD_SIZE, 0], got["sf"][SF_ORD_PRICE, 0]) == (1, 2, 100.0)
    assert got["sf"][SF_ORD_QUEUE, 0] == 3.0, "joined behind the 3 shown at bar 1's bid"
    lives = [got["si"][SI_ORD_LIFE, 0]]
    for _ in range(3):
        got = run.step(HOLD_ACTION)
        lives.append(got["si"][SI_ORD_LIFE, 0])
    assert lives == [3, 2, 1, 0] and got["si"][SI_ORD_SIDE, 0] == 0 and got["si"][SI_POS, 0] == -1
    got = run.step(HOLD_ACTION)
    assert got["done"][0] == 1 and got["si"][SI_POS, 0] == 0
    assert (got["acc"][ACC_LIMIT_PLACED, 0], got["acc"][ACC_LIMIT_FILLED, 0]) == (4, 1)


def test_shaping_terms_are_capped_by_the_isv_reference(run_env):
    """A 100-point jump makes the PnL reward ~200 units; every unbounded factor is capped by
    ISV[Q_DIR_ABS_REF] = 0.05. Step 0 (Long full at 100.25, z_vol 5 = clip_sigma): pnl 199.67, regime
    -2 x 1 x 1 x min(199.67, 0.05) = -0.1, novelty 0.5 x (1 - 0.25), stable -0.25 x 4/4. Step 1 (Hold, z_vol
    2.5): persist clip(199.75 units) = 1; the window's end sells 4 at 200.00: realised 199.5 units -> timing
    +min(199.5, 0.05); pnl -0.33 -> regime -2 x 1 x 0.5 x 0.05; novelty 0.5 x (1 - 0.2375)."""
    bars = [deep(100.0, z_vol=5.0), deep(200.0, z_vol=2.5), deep(200.0)]
    env = env_config(w_timing=1.0, w_persist=1.0, w_regime=2.0, w_novelty=0.5, w_stable=0.25)
    run = run_env(hand_market(bars), env, mode="eval", q_dir_abs_ref=0.05)
    got = run.step([LONG, FULL, MARKET, PATIENT])
    comps = got["comps"][:, 0]
    np.testing.assert_allclose(comps[[COMP_PNL, COMP_REGIME, COMP_NOVELTY, COMP_STABLE]], [199.67, -0.1, 0.375, -0.25],
                               rtol=1e-6)  # fmt: skip
    assert comps[COMP_PERSIST] == 0 and comps[COMP_TIMING] == 0
    got = run.step(HOLD_ACTION)
    comps = got["comps"][:, 0]
    np.testing.assert_allclose(
        comps[[COMP_PNL, COMP_PERSIST, COMP_TIMING, COMP_REGIME, COMP_NOVELTY, COMP_STABLE]],
        [-0.33, 1.0, 0.05, -0.05, 0.5 * (1 - 0.2375), 0.0], rtol=1e-6, atol=1e-7,
    )  # fmt: skip
    np.testing.assert_allclose(got["reward"], [comps.astype(np.float64).sum()], rtol=1e-6)


def test_the_cap_follows_the_isv_reference_and_its_floor(run_env):
    """With ISV[Q_DIR_ABS_REF] = 0 the cap is the floor 1e-3; with 10 the regime term is no longer capped."""
    bars = [deep(100.0, z_vol=5.0), deep(100.5), deep(100.5)]
    env = env_config(w_regime=1.0)
    for ref, expected in ((0.0, -1e-3), (10.0, -((100.625 - 100.25) * 4 * 50 - 8) / 100)):
        run = run_env(hand_market(bars), env, mode="eval", q_dir_abs_ref=ref)
        got = run.step([LONG, FULL, MARKET, PATIENT])
        np.testing.assert_allclose(got["comps"][COMP_REGIME, 0], expected, rtol=1e-6)


def test_episodes_end_at_the_day_and_restart_in_collect_mode(run_env):
    """Two 4-bar days, episodes of 10 bars: an episode runs at most to its day's last bar (never across the
    day start), closes its position at market there (crossing the spread and paying commission), and the
    environment restarts at once at a drawn start; the transition written out is the terminal one. After
    the staggered first episodes, every episode runs from its day's first bar to its last."""
    bars = [deep(100.0 + 0.25 * k) for k in range(8)]
    market = hand_market(bars, day_start=[0, 4, 8], starts=[0, 4])
    run = run_env(market, env_config(episode_bars=10), mode="collect", n_envs=6, seed=3)
    si = run.env.download_state()["si"]
    assert set(si[SI_ROW]) <= {0, 4} and np.all(si[SI_LAST] - si[SI_ROW] <= 3) and np.all(si[SI_LAST] % 4 != 0)
    ended = np.zeros(6, bool)
    for step in range(10):
        before = run.env.download_state()["si"]
        got = run.step(np.tile([LONG, FULL, MARKET, PATIENT], (6, 1)), f"step {step}")
        end = got["next_row"] == before[SI_LAST]
        np.testing.assert_array_equal(got["done"], end.astype(np.float32))
        assert np.all(got["next_row"] == before[SI_ROW] + 1) and np.all(got["next_row"] // 4 == before[SI_ROW] // 4)
        np.testing.assert_array_equal(got["stats"][2], end.astype(np.float32))
        if end.any():
            assert np.all(got["next_port"][end, PORT_POSITION] == 0) and np.all(got["next_port"][end, PORT_BARS_LEFT] == 0)
            assert set(got["si"][SI_ROW, end]) <= {0, 4} and np.all(got["si"][SI_POS, end] == 0)
            assert np.all(got["si"][SI_LAST, end] == got["si"][SI_ROW, end] + 3), "whole episodes after the first"
        ended |= end
    assert ended.all()


@pytest.mark.parametrize(
    ("seed", "overrides"),
    [
        (1, {"w_timing": 0.5, "w_persist": 0.3, "w_regime": 0.7, "w_novelty": 0.2, "w_stable": 0.4}),
        (2, {"beyond_depth_ticks": 0, "commission": 0.0, "limit_life_patient": 3, "w_novelty": 1.0}),
        (3, {"position_history": False}),
    ],
)
def test_random_collect_sequences_match_the_reference(run_env, seed, overrides):
    """16 environments, 30 steps of random actions on random books (1-10 shown levels of 1-4 contracts, so
    market orders walk levels and beyond the depth; trades at, through and away from resting orders),
    episodes of 5 bars over days of 12, 9, 3 (shorter than an episode), 10 and 8 bars with 2 bars purged:
    every state field, output, accumulator and RNG state equals the reference after every step. Every
    transition stays inside one day and out of the purged tail; every reset lands on a training start."""
    rng = np.random.default_rng(seed)
    fs = random_feature_set(rng, [12, 9, 3, 10, 8])
    env = env_config(episode_bars=5, **overrides)
    market = FoldMarket.build(fs, Windows(0, 4, 4, 5, 2), FeatureConfig(), env)
    run = run_env(market, env, mode="collect", n_envs=16, seed=seed, q_dir_abs_ref=0.2)
    day_of = np.repeat(np.arange(5), [12, 9, 3, 10, 8])
    for step in range(30):
        before = run.env.download_state()["si"][SI_ROW]
        actions = np.stack([rng.integers(0, 4, 16), rng.integers(0, 3, 16), rng.integers(0, 3, 16),
                            rng.integers(0, 3, 16)], axis=1)  # fmt: skip
        got = run.step(actions, f"seed {seed} step {step}")
        assert np.all(day_of[got["next_row"]] == day_of[before]) and np.all(got["next_row"] < market.train_stop)
        assert np.isin(got["si"][SI_ROW, got["done"] == 1], market.train_starts).all()
    acc = got["acc"]
    assert acc[ACC_EPISODES].sum() > 16 and acc[ACC_LIMIT_FILLED].sum() > 0 and acc[ACC_TRADED].sum() > 0
    held = got["next_port"][:, PORT_POSITION] != 0
    history = got["next_port"][held][:, [PORT_UPNL, PORT_BARS_IN_POS]]
    assert held.any() and (history != 0).any() == env.position_history  # env.position_history hides both columns


def test_random_eval_sequences_match_the_reference_and_freeze(run_env):
    """Evaluation: one environment per validation day (days of 7, 3 and 6 bars), random actions for
    eval_steps + 3 steps: equal to the reference throughout; each environment is done once its day ends and
    stays frozen (reward 0, done 1, accumulators unchanged)."""
    rng = np.random.default_rng(9)
    fs = random_feature_set(rng, [10, 8, 7, 3, 6])
    env = env_config(episode_bars=4, w_persist=0.5, w_stable=0.5)
    market = FoldMarket.build(fs, Windows(0, 2, 2, 5, 0), FeatureConfig(), env)
    run = run_env(market, env, mode="eval")
    assert run.env.n == 3 and run.env.eval_steps == 6
    np.testing.assert_array_equal(run.env.download_state()["si"][SI_ROW], market.val_windows[:, 0])
    for step in range(run.env.eval_steps + 3):
        actions = np.stack([rng.integers(0, 4, 3), rng.integers(0, 3, 3), rng.integers(0, 3, 3),
                            rng.integers(0, 3, 3)], axis=1)  # fmt: skip
        got = run.step(actions, f"step {step}")
        lengths = market.val_windows[:, 1] - market.val_windows[:, 0]
        finished = step + 2 >= lengths
        np.testing.assert_array_equal(got["done"], finished.astype(np.float32))
        np.testing.assert_array_equal(got["si"][SI_FROZEN], finished.astype(np.int32))
    assert np.all(got["acc"][ACC_STEPS] == lengths - 1) and np.all(got["reward"] == 0)
