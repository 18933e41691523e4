"""learner.counterfactual through a real Trainer: the replay keeps each state's entry price, the step expands its B / 4
drawn transitions into four direction rows each (kernels/counterfactual.py, checked against the reference environment
in tests/kernels/test_counterfactual.py), and only the direction heads get gradients, every one of them on every
drawn transition. The config checks name the key that breaks a requirement."""

import numpy as np
import pytest
from real_trainer import SMALL, real_trainer

from fox_numba.actions import N_BRANCHES, N_DIRECTIONS, N_HEADS
from fox_numba.agent.learner import check_counterfactual
from fox_numba.config import load_config
from fox_numba.errors import ConfigError
from fox_numba.observation import PORT_POSITION, PORT_UPNL, UPNL_CLIP

ON = ["learner.counterfactual=true", "env.fixed_bins=[2, 0, 0]"]


@pytest.mark.parametrize(("override", "message"), [
    ("env.fixed_bins=[-1, 0, 0]", "fix the magnitude"),
    ("env.fixed_bins=[2, 1, 0]", "order type to Market"),
    ("learner.n_step=3", "learner.n_step must be 1"),
    ("env.w_persist=0.5", "shaping weight"),
    ("learner.priority_alpha=0.5", "priority_alpha"),
    ("env.hindsight_fraction=0.25", "hindsight_fraction"),
    ("network.iqn_quantiles=8", "iqn_quantiles"),
    ("learner.batch_size=10", "multiple of 4"),
])  # fmt: skip
def test_each_requirement_is_checked_by_name(override, message):
    check_counterfactual(load_config("smoke", overrides=ON))
    with pytest.raises(ConfigError, match=f"learner.counterfactual: .*{message}"):
        check_counterfactual(load_config("smoke", overrides=[*ON, override]))


def test_held_positions_need_counterfactual_targets():
    with pytest.raises(ConfigError, match="learner.counterfactual_held needs learner.counterfactual"):
        check_counterfactual(load_config("smoke", overrides=["learner.counterfactual=false"]))  # held: the default
    check_counterfactual(load_config("smoke", overrides=[*ON, "learner.counterfactual_held=true"]))


def test_held_histories_need_held_positions_and_a_length():
    held = [*ON, "learner.counterfactual_held=true"]
    check_counterfactual(load_config("smoke", overrides=[*held, "learner.counterfactual_history=60"]))
    with pytest.raises(ConfigError, match="learner.counterfactual_history needs learner.counterfactual_held"):
        check_counterfactual(load_config("smoke", overrides=[*ON, "learner.counterfactual_held=false",
                                                             "learner.counterfactual_history=60"]))
    with pytest.raises(ConfigError, match="learner.counterfactual_history must be >= 0"):
        check_counterfactual(load_config("smoke", overrides=[*held, "learner.counterfactual_history=-1"]))


def test_held_targets_need_counterfactual_targets_and_a_length():
    check_counterfactual(load_config("smoke", overrides=[*ON, "learner.counterfactual_hold_bars=15"]))
    with pytest.raises(ConfigError, match="learner.counterfactual_hold_bars must be >= 1"):
        check_counterfactual(load_config("smoke", overrides=[*ON, "learner.counterfactual_hold_bars=0"]))
    with pytest.raises(ConfigError, match="learner.counterfactual_hold_bars above 1 needs learner.counterfactual"):
        check_counterfactual(load_config("smoke", overrides=["learner.counterfactual=false",
                                                             "learner.counterfactual_held=false",
                                                             "learner.counterfactual_hold_bars=15"]))


def test_a_trainer_with_held_targets_steps_its_priced_rows_k_bars_on(four_day_store):
    """learner.counterfactual_hold_bars reaches the kernel: the priced rows' s' lies 1..k bars on with discount
    gamma^steps (0 at the episode's end), the taken rows keep their stored one-step transition, and the trainer
    trains on them."""
    k = 4
    rt = real_trainer(four_day_store, [*SMALL, "learner.batch_size=64", *ON, f"learner.counterfactual_hold_bars={k}"])
    trainer, stager = rt.trainer, rt.trainer.stager
    learner = trainer.learner
    trainer.collect()
    stats = trainer.train(lambda: None)
    assert stats["applied_steps"] == rt.cfg.learner.steps_per_epoch and np.isfinite(stats["loss"])
    draw = {k: stager.download(getattr(learner.draw, k)) for k in ("rows", "actions", "discounts")}
    batch = {k: stager.download(getattr(learner.batch, k)) for k in ("rows", "actions", "discounts")}
    n, b = 16, 64
    i = np.repeat(np.arange(n), 4)
    stored = (batch["actions"][:, 0] == draw["actions"][i, 0]) & (i % 4 == 0)  # held: rows 1-3 mod 4 re-held
    steps = batch["rows"][b:] - batch["rows"][:b]
    np.testing.assert_array_equal(steps[stored], draw["rows"][n:][i][stored] - draw["rows"][:n][i][stored])
    np.testing.assert_array_equal(batch["discounts"][stored], draw["discounts"][i][stored])
    priced = ~stored
    assert (steps[priced] >= 1).all() and (steps[priced] <= k).all() and (steps[priced] == k).any()
    gamma = np.float32(rt.cfg.learner.gamma)
    live = batch["discounts"][priced] > 0
    np.testing.assert_allclose(batch["discounts"][priced][live], gamma ** steps[priced][live].astype(np.float64),
                               rtol=1e-6)  # fmt: skip


def test_a_counterfactual_trainer_trains_every_direction_head_on_every_draw(four_day_store):
    rt = real_trainer(four_day_store, [*SMALL, "learner.batch_size=8", *ON, "learner.counterfactual_held=false",
                                       "network.mean_head=false", "env.position_history=true"])  # C51's targets alone
    trainer, stager = rt.trainer, rt.trainer.stager
    learner = trainer.learner
    assert learner.draw.size == 2 and learner.batch.size == 8
    trainer.collect()
    ring = trainer.replay.download(stager)
    n = rt.cfg.env.n_envs * rt.cfg.env.collect_steps
    host = trainer.market.host
    pos = np.round(ring["port"][:n, PORT_POSITION] * rt.cfg.env.max_position)
    upnl = ring["port"][:n, PORT_UPNL]
    held = (pos != 0) & (np.abs(upnl) < UPNL_CLIP)
    assert held.any() and (ring["entry"][:n][pos == 0] == 0).all()
    mid = host.mid[ring["row"][:n]]
    np.testing.assert_allclose(upnl[held], (mid[held] - ring["entry"][:n][held]) * pos[held] * host.point_value
                               / host.risk_unit, rtol=1e-5, atol=1e-5)  # fmt: skip

    stats = trainer.train(lambda: None)
    assert stats["applied_steps"] == rt.cfg.learner.steps_per_epoch and np.isfinite(stats["loss"])
    assert stats["loss_direction"] > 0
    assert stats["loss_magnitude"] == stats["loss_order"] == stats["loss_urgency"] == 0
    draw = {k: stager.download(getattr(learner.draw, k)) for k in ("rows", "actions", "rewards", "discounts")}
    batch = {k: stager.download(getattr(learner.batch, k)) for k in ("rows", "actions", "rewards", "discounts")}
    i = np.repeat(np.arange(2), 4)
    np.testing.assert_array_equal(batch["rows"], np.concatenate([draw["rows"][:2][i], draw["rows"][2:][i]]))
    np.testing.assert_array_equal(batch["actions"][:, 0], np.tile(np.arange(4), 2))
    np.testing.assert_array_equal(batch["discounts"], draw["discounts"][i])
    taken = batch["actions"][:, 0] == draw["actions"][i, 0]
    np.testing.assert_array_equal(batch["rewards"][taken], draw["rewards"])
    assert np.isfinite(batch["rewards"]).all()
    z = rt.cfg.network.n_atoms  # the last step's head gradient: row j trains direction head j % 4 alone
    streams = stager.download(learner.online.dhead)[:, : (N_BRANCHES + N_HEADS) * z].reshape(8, -1, z)
    assert np.all(streams[:, 1 + N_DIRECTIONS :] == 0)  # the other branches (streams branch by branch: kernels/heads)
    adv = streams[:, 1 : 1 + N_DIRECTIONS]  # the direction heads: g - g / 4 at the taken, - g / 4 elsewhere
    g = streams[:, 0]
    assert np.abs(g).sum(axis=1).min() > 0
    taken = np.arange(8) % 4
    np.testing.assert_array_equal(adv[np.arange(8), taken], g - g / np.float32(4))
    others = np.ones((8, 4), bool)
    others[np.arange(8), taken] = False
    np.testing.assert_array_equal(adv[others], np.repeat(-g / np.float32(4), 3, axis=0))
    days, metrics = trainer.evaluate()
    assert len(days) > 0 and np.isfinite(metrics["steps"])
