"""The evaluator's encoder cache (agent/evaluator.py, Network.encode / encoded): with a Mamba2 or a TLOB encoder, each
chunk encodes all its (step, day) rows in one encoder forward, and the backtest is bit for bit the one that encodes
every step's rows in the step's own forward.

The fold of tests/agent/test_evaluator.py: three validation days of 4, 6 and 3 bars (3, 5 and 2 steps), in chunks of
2 steps (chunks at steps 0, 2 and 4, the last padded with the days' frozen rows); windows of 3 bars, which clamp at
each day's first bar. The network (a small trunk, seeded initial weights) trades from its encoder's output.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from reference_env import Windows, env_config, random_feature_set

from fox_numba.agent.evaluator import Evaluator
from fox_numba.agent.fold_market import FoldMarket
from fox_numba.agent.network import Network, ParamLayout, init_params
from fox_numba.config import EvaluationConfig, NetworkConfig
from fox_numba.device.isv import IsvBus
from fox_numba.device.memory import device_zeros
from fox_numba.observation import OBS_DIM, obs_dim
from plain_learner import plain_network
from plain_learner import plain_config

DAY_BARS = [12, 10, 4, 6, 3]
WINDOWS = Windows(train_first=0, train_stop=2, val_first=2, val_stop=5, purge_bars=2)
DAY_STEPS = [3, 5, 2]
CHUNK_STEPS = [2, 2, 1]
T = 3
ENCODERS = {
    "mamba2": (plain_network(n_layers=1, hidden=8, n_atoms=5, mamba2_window=T, mamba2_heads=1, mamba2_head_dim=4,
                             mamba2_state=4, mamba2_out=4), "mamba2_last.mamba2_last_weights_kernel", 1),
    "tlob": (plain_network(n_layers=1, hidden=8, n_atoms=5, tlob_window=T, tlob_width=4, tlob_heads=1, tlob_out=4),
             "tlob.attention_fwd_kernel", 2),
}
"""Network config, a kernel of the encoder's own forward and its launches per encoder forward (the TLOB block attends
over time, then over features)."""
ENC_GAIN = 4.0
GATHER, JOIN = "windows.gather_windows_kernel", "windows.concat_columns_kernel"
pytestmark = pytest.mark.usefixtures("long_switch_interval")


class PerStepEvaluator(Evaluator):
    """The evaluator with each step's forward encoding the environments' rows itself (rows=env.row)."""

    def _forward(self, s: Any, k: int) -> None:
        self.net.forward(self.params, self.obs, None, stream=s, rows=self.env.row)


def backtests(stager, net_cfg: NetworkConfig) -> tuple[Evaluator, Evaluator]:
    """(cached, per step) evaluators of the fold with the same seeded weights, each run once."""
    cfg = plain_config(env=env_config(episode_bars=8), network=net_cfg, evaluation=EvaluationConfig(chunk_bars=2))
    fs = random_feature_set(np.random.default_rng(20), DAY_BARS)
    market = FoldMarket.build(fs, WINDOWS, cfg.features, cfg.env).upload(stager)
    width = obs_dim(cfg.features)
    layout = ParamLayout.build(width, cfg.network, features=cfg.features)
    flat = init_params(layout, 3)  # a draw whose policy trades on this fold (the test's last check)
    w = layout.unpack(flat)["trunk.0.weight"]  # [obs | enc] -> hidden: the policy reads the encoder's output alone
    w[:width] = 0.0
    w[width:] *= ENC_GAIN
    head = layout.entry("head.weight")
    flat[head.offset : head.stop] *= 8.0  # logits spread enough that the argmax moves with the windows
    params = stager.upload_new(flat)
    supports = stager.upload_new(np.tile(np.float32([-1.0, 1.0, 0.5]), (13, 1)))
    return tuple(kind(market, cfg, layout, params, supports, isv=IsvBus(stager).values, stager=stager,
                      use_graph=True) for kind in (Evaluator, PerStepEvaluator))  # fmt: skip


def kernels(graph) -> list[str]:
    """The kernels (module.kernel) of one replay of a chunk's graph, in order."""
    return [".".join(rec.kernel.split(".")[-2:]) for rec in graph.launches]


@pytest.mark.parametrize("encoder", sorted(ENCODERS))
def test_cached_encoder_backtest_is_bit_for_bit_the_per_step_one(stager, encoder):
    net_cfg, core, per_encode = ENCODERS[encoder]
    cached, per_step = backtests(stager, net_cfg)
    assert cached.steps == 5 and [g.name for g, _ in cached.chunks] == ["evaluate.chunk0", "evaluate.chunk1",
                                                                         "evaluate.chunk2"]
    days, ref = cached.run(), per_step.run()
    assert [len(pnl) for pnl, _ in days] == DAY_STEPS
    for d, ((pnl, pos), (ref_pnl, ref_pos)) in enumerate(zip(days, ref, strict=True)):
        np.testing.assert_array_equal(pos, ref_pos, err_msg=f"day {d}: positions")
        np.testing.assert_array_equal(pnl, ref_pnl, err_msg=f"day {d}: dollars")
    positions = np.concatenate([pos for _, pos in days])
    assert len(set(positions.tolist())) > 1, "the policy trades"
    dl = stager.download
    np.testing.assert_array_equal(dl(cached.net.head_out), dl(per_step.net.head_out))  # the last step's, every bit
    # The chunk's encoder runs once, before its steps, over all its (step, day) rows; the steps only join its output.
    for (graph, replays), steps in zip(cached.chunks, CHUNK_STEPS, strict=True):
        names = kernels(graph)
        assert replays == 1 and graph.replays == 1
        assert names.count(GATHER) == 1 and names.count(core) == per_encode, graph.name
        assert len(names) - 1 - names[::-1].index(core) < names.index(JOIN) and names.count(JOIN) == steps
    for (graph, _), steps in zip(per_step.chunks, CHUNK_STEPS, strict=True):  # its chunks encode, then every step
        names = kernels(graph)
        assert names.count(GATHER) == 1 + steps and names.count(core) == per_encode * (1 + steps), graph.name
    # Each chunk's rows, step-major: day d's row at step k is its first bar + k until its last bar (the last chunk's
    # second step, 5, is padding: every day frozen at its last bar).
    windows = cached.env.market.host.val_windows
    first, last = windows[:, 0], windows[:, 1] - 1
    want = [[min(first[d] + k, last[d]) for d in range(3)] for k in range(6)]
    np.testing.assert_array_equal(dl(cached.chunk_rows), np.reshape(want, (3, 6)))


def test_the_encoder_cache_is_refused_where_it_cannot_serve(stager, stream):
    """cache_samples needs an encoder; encoded= and rows= are exclusive; the backward needs a forward with rows=."""
    plain = ParamLayout.build(OBS_DIM, plain_network(n_layers=0, n_atoms=5))
    with pytest.raises(ValueError, match="cache_samples"):
        Network(plain, 3, stream=stream, cache_samples=6)
    layout = ParamLayout.build(OBS_DIM, ENCODERS["mamba2"][0])
    net = Network(layout, 3, stream=stream, cache_samples=6)
    with pytest.raises(ValueError, match="outside the cache"):
        net.encoded(2)
    params = stager.upload_new(init_params(layout, 0))
    obs = device_zeros((3, OBS_DIM), np.float32, stream=stream)
    logits = device_zeros((3, 13, 5), np.float32, stream=stream)
    rows = device_zeros(3, np.int32, stream=stream)
    for kwargs in ({}, {"rows": rows, "encoded": net.encoded(0)}):
        with pytest.raises(ValueError, match="one of them"):
            net.forward(params, obs, logits, stream=stream, **kwargs)
    net.forward(params, obs, logits, stream=stream, encoded=net.encoded(1))
    grads = device_zeros(layout.size, np.float32, stream=stream)
    with pytest.raises(RuntimeError, match="with rows="):
        net.backward(params, logits, grads, stream=stream)
