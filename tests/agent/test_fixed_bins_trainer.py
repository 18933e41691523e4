"""env.fixed_bins reaches the collect policy through the Trainer: every transition the replay holds takes the fixed
magnitude, order type and urgency (magnitude 0 under Hold and Flat), and the direction stays the policy's. Binding a
later fold sets the learner's learning-rate factor (learner.refit_lr_scale)."""

import numpy as np
from plain_learner import PLAIN_OVERRIDES

from fox_numba.actions import Direction
from fox_numba.agent.fold_market import FoldMarket
from fox_numba.agent.trainer import Trainer
from fox_numba.config import load_config
from fox_numba.market.select import select_market
from fox_numba.walkforward.driver import load_features
from fox_numba.walkforward.folds import make_folds


def test_collect_takes_the_fixed_bins(four_day_store):
    cfg = load_config("smoke", overrides=[f'market.store="{four_day_store}"', "env.n_envs=16", "env.collect_steps=2",
                                          "network.hidden=8", "learner.batch_size=4", "learner.buffer_size=64",
                                          "env.fixed_bins=[1, 2, 0]", "folds.n_folds=1", "folds.train_days=2",
                                          "folds.val_days=1", "learner.refit_lr_scale=0.3",
                                          *PLAIN_OVERRIDES])  # fmt: skip
    selection = select_market(cfg.market)
    fold = make_folds(cfg.folds, selection.days)[0]
    trainer = Trainer(cfg)
    market = FoldMarket.build(load_features(cfg, selection), fold, cfg.features, cfg.env)
    trainer.bind_fold(market, 0)
    assert trainer.learner.lr_scale == 1.0
    trainer.collect()
    n = cfg.env.n_envs * cfg.env.collect_steps
    action = trainer.stager.download(trainer.replay.action)[:n]
    opens = np.isin(action[:, 0], (Direction.SHORT, Direction.LONG))
    assert 0 < opens.sum() < n  # Thompson sampling over a fresh network plays opening and non-opening directions
    np.testing.assert_array_equal(action[:, 1], np.where(opens, 1, 0))
    assert np.all(action[:, 2] == 2) and np.all(action[:, 3] == 0)
    trainer.bind_fold(market, 1)  # the same days bound as a later fold: the learner re-pointed, its rate scaled
    assert trainer.learner.lr_scale == 0.3
    trainer.bind_fold(market, 0)
    assert trainer.learner.lr_scale == 1.0
