"""Hindsight relabelling in the real collect step (env.hindsight_fraction, kernels/hindsight.py), through the
Trainer's wiring on a seeded random fold: at fraction f the first round(f x N) environments' stored directions are
the hindsight ones wherever their row has a label (the first step element for element against the float64
reference applied to the same step at f = 0), the other environments' transitions are those of f = 0 bit for bit,
the relabel runs between action selection and the replay in the step, and the same seed fills the same buffers.
"""

import numpy as np
import pytest
from reference import hindsight_labels64, hindsight_relabel64
from reference_env import Windows, random_feature_set

from fox_numba.agent.collector import relabel_count
from fox_numba.agent.fold_market import FoldMarket
from fox_numba.agent.replay import FIELDS
from fox_numba.agent.trainer import Trainer
from fox_numba.config import FoxConfig
from fox_numba.device.registry import kernel_name
from fox_numba.errors import ConfigError
from fox_numba.kernels.action_select import heads_kernel
from fox_numba.market.synthetic_oracle import oracle_threshold
from fox_numba.observation import PORT_POSITION
from plain_learner import plain_config

N_ENVS, STEPS, HORIZON = 8, 6, 4
FRACTION = 0.3125  # 2.5 environments: 3, halves up


def config(fraction):
    cfg = plain_config()
    cfg.network.hidden, cfg.network.n_layers, cfg.network.n_atoms = 4, 1, 5
    cfg.env.n_envs, cfg.env.episode_bars, cfg.env.hindsight_fraction = N_ENVS, 10, fraction
    cfg.evaluation.probe_horizon_bars = HORIZON
    cfg.learner.batch_size, cfg.learner.buffer_size = 4, N_ENVS * STEPS
    cfg.run.graphs = True
    return cfg


@pytest.fixture(scope="module")
def market():
    fs = random_feature_set(np.random.default_rng(2311), [30, 24, 30, 20])
    return FoldMarket.build(fs, Windows(0, 3, 3, 4, 2), config(0.0).features, config(0.0).env)


def collect(market, fraction):
    """The replay buffer (host) after STEPS collect steps at `fraction`, and the trainer."""
    trainer = Trainer(config(fraction))
    trainer.bind_fold(market, 0)
    trainer.learner.refresh_supports()
    trainer.env.reset(stream=trainer.stream)
    trainer.collector.collect(STEPS)
    return trainer.replay.download(trainer.stager), trainer


@pytest.fixture(scope="module")
def runs(market):
    """(replay, trainer) at fraction 0 and at FRACTION, same seed."""
    return collect(market, 0.0), collect(market, FRACTION)


def labels_of(market):
    threshold = oracle_threshold(market.tick_size, market.point_value, FoxConfig().env.commission)
    return hindsight_labels64(market.mid, market.day_start, market.train_stop, HORIZON, threshold)


def test_relabelled_envs_take_the_hindsight_direction_and_the_others_are_unchanged(market, runs):
    (off, off_trainer), (on, trainer) = runs
    k = trainer.collector.n_relabel
    assert k == 3 and off_trainer.collector.labels is None
    labels = labels_of(market)
    np.testing.assert_array_equal(trainer.stager.download(trainer.collector.labels), labels)
    slot = np.arange(STEPS)[:, None] * N_ENVS + np.arange(N_ENVS)[None, :]  # [step, env]: no wrap
    for name in FIELDS:
        np.testing.assert_array_equal(on[name][slot[:, k:]], off[name][slot[:, k:]], err_msg=name)
    # step 0: the same observations and draws, so the relabel of f = 0's actions, element for element
    first = slot[0]
    want = hindsight_relabel64(labels, off["row"][first], off["port"][first, PORT_POSITION], off["action"][first], k)
    np.testing.assert_array_equal(on["action"][first], want)
    # every step: a relabelled environment on a labelled row played the rule
    mine = slot[:, :k].ravel()
    rows, acts, pos = on["row"][mine], on["action"][mine], on["port"][mine, PORT_POSITION]
    has = labels[rows] >= 0
    rule = hindsight_relabel64(labels, rows, pos, acts, rows.size)
    np.testing.assert_array_equal(acts[has], rule[has])
    assert has.sum() >= 10 and len(np.unique(acts[has, 0])) >= 2
    assert not np.array_equal(on["action"][slot[:, :k]], off["action"][slot[:, :k]])


def test_same_seed_same_buffers_and_the_relabel_sits_in_the_step(market, runs):
    (_, off), (a, trainer) = runs
    b, _ = collect(market, FRACTION)
    for name in (*FIELDS, "meta"):
        assert a[name].tobytes() == b[name].tobytes(), name

    def kernels(t):
        return [launch.kernel.rsplit(".", 1)[-1] for launch in t.collector.graph.launches]

    names = kernels(trainer)
    at = names.index("hindsight_relabel_kernel")
    select = kernel_name(heads_kernel(trainer.cfg.env.fixed_bins)).rsplit(".", 1)[1]
    assert names[at - 1] == select and names[at + 1] == "replay_put_obs_kernel"
    assert kernels(off) == names[:at] + names[at + 1 :]


def test_the_fraction_is_checked_and_rounded():
    assert [relabel_count(f, 8) for f in (0.0, 0.0625, 0.3125, 1.0)] == [0, 1, 3, 8]
    with pytest.raises(ConfigError, match="env.hindsight_fraction"):
        relabel_count(1.5, 8)
