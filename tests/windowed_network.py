"""The device side of the windowed-network tests: one forward on the sample rows and one backward of a Network with
an encoder over past bars, with the power iteration's vectors a float64 reference must hold constant under spectral
normalisation (tests/agent/test_mamba2_network.py, test_tlob_network.py); and the stages of a real trainer with such
an encoder, each checked to read the windows of the rows it acts on (test_mamba2_trainer.py, test_tlob_trainer.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import reference
from real_trainer import SMALL, real_trainer

from fox_numba.actions import N_HEADS
from fox_numba.agent.evaluator import eval_network
from fox_numba.agent.network import Network, ParamLayout, init_params
from fox_numba.agent.spectral import SpectralKey, init_vectors, vector_views
from fox_numba.device.memory import device_zeros


def run_windowed(stager: Any, stream: Any, lay: ParamLayout, p0: np.ndarray, obs: np.ndarray, dl: np.ndarray,
                 rows: np.ndarray, bound: tuple[Any, ...], dense: str) -> tuple[np.ndarray, np.ndarray, list | None]:
    """(logits [len(obs), 13, Z], gradient [layout size], the spectral (u, v) per trunk layer or None) of the network
    bound to `bound` (bind_market's arguments) at parameters p0, forward on obs with `rows`, backward of dl (its first
    len(dl) samples); one power iteration in the forward, so the reference gets the vectors after it."""
    vectors = init_vectors(lay, 11) if lay.spectral_norm else None
    spectral = SpectralKey(stager.upload_new(vectors), 1) if vectors is not None else None
    net = Network(lay, len(obs), stream=stream, grad_rows=len(dl), dense=dense, spectral=spectral)
    net.bind_market(*bound)
    params = stager.upload_new(p0)
    logits = stager.upload_new(np.full((len(obs), N_HEADS, lay.n_atoms), np.nan, np.float32))
    grads = device_zeros(lay.size, np.float32, stream=stream)
    net.forward(params, stager.upload_new(obs), logits, stream=stream, rows=stager.upload_new(rows))
    net.backward(params, stager.upload_new(dl), grads, stream=stream)
    uv = None
    if lay.spectral_norm:
        p = lay.unpack(p0)
        uv = [reference.spectral_power64(p[f"trunk.{k}.weight"], u, v, 1)[:2]
              for k, (u, v) in enumerate(vector_views(lay, vectors))]
    return stager.download(logits), stager.download(grads), uv


MEAN_CROSS = ["network.mean_head=true", "network.mean_cross=true", "network.n_layers=0"]
"""Overrides that put the crossed mean head (network.mean_cross; mirror off, as the smoke preset has it) beside a
trainer's encoder on a linear network."""


def encoder_trainer(store: Any, sizes: list[str], mean_cross: bool) -> Any:
    """tests/real_trainer.py's `rt` of the smoke preset with an encoder (`sizes`), one collect step pair and one
    learner step an epoch, with or without the crossed mean head."""
    rt = real_trainer(store, [*SMALL, "env.collect_steps=2", "learner.steps_per_epoch=1", *sizes,
                              *(MEAN_CROSS if mean_cross else [])])
    assert rt.trainer.layout.mean_cross == mean_cross
    return rt


def collect_train_evaluate(rt: Any, windows: Any, prefix: str) -> tuple[Any, Any]:
    """Through a real trainer with an encoder (tests/real_trainer.py's `rt`): one collect, whose last step's encoder
    input must be `windows(host market, rows)` of the rows it acted on; one train, whose last step's online and target
    encoder inputs must be those of its s and s' rows, and which must move every parameter whose name starts with
    `prefix`; one evaluation with finite PnL. Returns the (parameters, supports) evaluation trades with, on the device."""
    trainer, cfg = rt.trainer, rt.cfg
    host, dl = trainer.market.host, trainer.stager.download
    trainer.collect()
    n = cfg.env.n_envs
    last_rows = dl(trainer.replay.row)[n : 2 * n]  # the second (last) collect step's rows
    np.testing.assert_array_equal(dl(trainer.collector.net.encoder.u), windows(host, last_rows))
    before = dl(trainer.learner.params)
    trainer.train(lambda: None)
    after = dl(trainer.learner.params)
    learner, b = trainer.learner, cfg.learner.batch_size
    rows = dl(learner.batch.rows)  # the last step's s rows, then its s' rows
    np.testing.assert_array_equal(dl(learner.online.encoder.u), windows(host, rows))
    np.testing.assert_array_equal(dl(learner.target_net.encoder.u), windows(host, rows[b:]))
    assert np.isfinite(after).all()
    for e in trainer.layout.entries:
        if e.name.startswith(prefix):
            assert not np.array_equal(after[e.offset : e.stop], before[e.offset : e.stop]), e.name
    days = trainer.evaluate()[0]
    assert len(days) > 0 and all(np.isfinite(pnl).all() for pnl, _ in days)
    state = learner.state_arrays()
    return tuple(state[name] for name in eval_network(cfg.evaluation.network))


ENCODER_CONFLICTS = [
    ({"vsn": True}, "network.vsn"),
    ({"moe_experts": 2}, "network.moe_experts"),
    ({"iqn_quantiles": 4}, "network.iqn_quantiles"),
    ({"noisy_sigma0": 0.5}, "network.noisy_sigma0"),
]
"""(NetworkConfig change, ConfigError message) of the parts no encoder over past bars is combined with."""


def unbound_network(stream: Any, stager: Any, lay: ParamLayout, rows: np.ndarray) -> Network:
    """A network with an encoder, checked to refuse a forward without rows= and one before bind_market."""
    net = Network(lay, len(rows), stream=stream, dense="strided")
    params = stager.upload_new(init_params(lay, 1))
    obs = stager.upload_new(np.zeros((len(rows), lay.obs_dim), np.float32))
    logits = device_zeros((len(rows), N_HEADS, lay.n_atoms), np.float32, stream=stream)
    with pytest.raises(ValueError, match="needs rows="):
        net.forward(params, obs, logits, stream=stream)
    with pytest.raises(RuntimeError, match="bind_market"):
        net.forward(params, obs, logits, stream=stream, rows=stager.upload_new(rows))
    return net
