"""A real smoke Trainer on a small store, bound to fold 0 and registered in the real StateResetRegistry (the
tests that follow trainer state across a fold boundary share it). Test modules import it as `real_trainer`
(tests/ is on sys.path through its conftest.py)."""

from dataclasses import dataclass

from fox_numba.agent.fold_market import FoldMarket
from fox_numba.agent.trainer import Trainer
from fox_numba.config import FoxConfig, load_config
from fox_numba.market.select import select_market
from fox_numba.walkforward.driver import load_features
from fox_numba.walkforward.folds import Fold, make_folds
from fox_numba.walkforward.kill import KillCriteria
from fox_numba.walkforward.reset_registry import StateResetRegistry
from fox_numba.walkforward.run_folder import BestEpoch
from fox_numba.walkforward.trainer_state import register_trainer

SMALL = ["env.n_envs=4", "env.collect_steps=6", "learner.batch_size=4", "learner.buffer_size=64",
         "learner.steps_per_epoch=3", "network.hidden=8", "network.n_atoms=5", "network.head_init_scale=1.0"]
"""Overrides that keep a smoke trainer's epoch to seconds on the simulator. The heads start from their Xavier draw
(the default starts them at zero): in three steps an encoder under zero heads gets a gradient only from the second,
and the first epoch's value gaps are zero."""


@dataclass
class RealTrainer:
    cfg: FoxConfig
    trainer: Trainer
    kills: KillCriteria
    best: BestEpoch
    registry: StateResetRegistry
    folds: list[Fold]
    features: object


def real_trainer(store, overrides: list[str]) -> RealTrainer:
    """The smoke preset on `store` with `overrides`, fold 0 bound, every trainer entry registered."""
    cfg = load_config("smoke", overrides=[f'market.store="{store}"', *overrides])
    selection = select_market(cfg.market)
    folds = make_folds(cfg.folds, selection.days)
    features = load_features(cfg, selection)
    trainer, kills, best = Trainer(cfg), KillCriteria(), BestEpoch()
    trainer.bind_fold(FoldMarket.build(features, folds[0], cfg.features, cfg.env), 0)
    registry = StateResetRegistry()
    register_trainer(registry, trainer, kills, best)
    return RealTrainer(cfg, trainer, kills, best, registry, folds, features)
