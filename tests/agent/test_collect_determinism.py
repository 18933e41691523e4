"""20 collect steps of the real collect step (observe -> network forward -> Thompson action selection -> env
step -> replay writes -> rollout ISV), twice with the same seed: bit-identical replay buffers and ISV. On the
GPU (NUMBA_ENABLE_CUDASIM=0) the steps replay a captured graph; under the simulator they run eagerly, with
16-bar episodes (every environment auto-resets) and a 64-slot replay that the 80 transitions wrap."""

import numpy as np
import pytest

from fox_numba.agent.fold_market import FoldMarket
from fox_numba.agent.replay import STORED
from fox_numba.agent.trainer import Trainer
from fox_numba.config import load_config
from fox_numba.device.runtime import SIMULATOR
from fox_numba.market.select import select_market
from fox_numba.walkforward.driver import load_features
from fox_numba.walkforward.folds import make_folds

STEPS = 20


@pytest.fixture(scope="module")
def fold_market(four_day_store):
    store = four_day_store
    # 4 environments and a small network under the simulator (it pays per thread); the default sizes on a GPU
    small = ["env.n_envs=4", "env.episode_bars=16", "network.hidden=8", "network.n_atoms=5", "learner.batch_size=4",
             "learner.buffer_size=64"] if SIMULATOR else []
    cfg = load_config("smoke" if SIMULATOR else "default",
                      overrides=[f'market.store="{store}"', "run.graphs=true", *small,
                                 "folds.n_folds=1", "folds.train_days=2", "folds.val_days=1"])
    selection = select_market(cfg.market)
    fold = make_folds(cfg.folds, selection.days)[0]
    return cfg, FoldMarket.build(load_features(cfg, selection), fold, cfg.features, cfg.env)


def collect_run(cfg, market):
    trainer = Trainer(cfg)
    trainer.bind_fold(market, 0)
    trainer.learner.refresh_supports()
    trainer.env.reset(stream=trainer.stream)
    trainer.collector.collect(STEPS)
    replay = {name: trainer.stager.download(getattr(trainer.replay, name)) for name in (*STORED, "meta")}
    return replay, trainer.bus.read(), trainer.collector.graph.mode


def test_two_runs_of_the_same_seed_fill_identical_buffers(fold_market):
    cfg, market = fold_market
    (a, isv_a, mode), (b, isv_b, _) = collect_run(cfg, market), collect_run(cfg, market)
    assert mode == ("eager" if SIMULATOR else "graph")
    n = cfg.env.n_envs * STEPS
    assert a["meta"][1] == min(n, cfg.learner.buffer_size)
    for name in (*STORED, "meta"):
        assert a[name].tobytes() == b[name].tobytes(), name
    assert isv_a.tobytes() == isv_b.tobytes()
    assert len(np.unique(a["action"][:, 0])) > 1  # Thompson sampling explored more than one direction
