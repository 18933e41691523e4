"""Trainer.collect feeds the curriculum (env.curriculum_epochs) from the learner's per-fold step counter: the reach
widens with the fold's epochs, and the fold boundary's step-counter reset (walkforward/trainer_state.py
learner.fold_step) restarts it."""

import math

import numpy as np
import pytest

from fox_numba.agent.fold_market import FoldMarket
from fox_numba.agent.trainer import Trainer
from fox_numba.config import load_config
from fox_numba.market.select import select_market
from fox_numba.walkforward.driver import load_features
from fox_numba.walkforward.folds import make_folds


def test_collect_widens_the_reach_per_epoch_and_the_fold_reset_restarts_it(four_day_store):
    cfg = load_config("smoke", overrides=[f'market.store="{four_day_store}"', "env.n_envs=4", "env.collect_steps=1",
                                          "network.hidden=8", "learner.batch_size=4", "learner.buffer_size=64",
                                          "learner.steps_per_epoch=10", "env.curriculum_epochs=2",
                                          "env.curriculum_reach=0.3", "folds.n_folds=1", "folds.train_days=2",
                                          "folds.val_days=1"])  # fmt: skip
    selection = select_market(cfg.market)
    fold = make_folds(cfg.folds, selection.days)[0]
    market = FoldMarket.build(load_features(cfg, selection), fold, cfg.features, cfg.env)
    assert np.all(np.diff(market.start_difficulty) >= 0)
    trainer = Trainer(cfg)
    trainer.bind_fold(market, 0)
    learner, stager = trainer.learner, trainer.stager

    def collect_at(step: int | None) -> float:
        if step is not None:
            state = learner.read_optim_state().copy()
            state["step"] = step
            stager.upload(np.asarray([state]), learner.optim_state)
        trainer.collect()
        return float(stager.download(trainer.env.reach)[0])

    assert collect_at(None) == 0.3  # a fresh fold: step 0
    easy = market.train_starts[: math.ceil(0.3 * market.train_starts.size)]
    observed = stager.download(trainer.replay.row)[: cfg.env.n_envs]  # the one collect step's rows: the starts
    assert np.isin(observed, easy).all()
    assert collect_at(10) == pytest.approx(0.3 + 0.7 * 0.5, rel=1e-15)  # epoch 1 of 2
    assert collect_at(25) == 1.0
    learner.reset_step_counter()
    assert collect_at(None) == 0.3
