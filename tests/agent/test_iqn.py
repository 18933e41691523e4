"""The IQN head beside C51 (network.iqn_quantiles > 0): its layout entries and initialisation, the head's forward and
backward against float64, and the learner's step with it: one step's IQN and trunk gradients against float64 from
the step's own draws, the C51 gradient unchanged at iqn_weight 0, the launches (none when off), seed determinism,
a checkpoint round trip that resumes bit for bit and refuses the IQN-less layout (the trainer:
tests/agent/test_iqn_trainer.py).

Tolerances: the head in float32 against float64, sums of at most E + W products of size ~1, 1e-5 relative plus
1e-5; the learner's gradients, whose inputs (the trunk's output, the levels, E[Q]) are read back from the step,
2e-5 relative plus 2e-5 (a few float32 roundings more).
"""

import math

import numpy as np
import pytest
import reference
from test_learner import (
    M,
    build,
    host_state,
    random_replay,
    resumes_through_a_checkpoint,
    steady_isv,
    steps_with_and_without,
    tiny_config,
)

from fox_numba.actions import N_HEADS
from fox_numba.agent.iqn import EMBED_B, EMBED_W, HEAD_B, HEAD_W, IqnHead
from fox_numba.agent.network import ParamLayout, init_params
from fox_numba.device.isv import Isv
from fox_numba.device.memory import device_zeros
from fox_numba.kernels.signals import LOSS_ALPHA
from plain_learner import plain_network

N_TAUS, EMBED = 3, 4
IQN_KERNELS = {"iqn_taus", "iqn_forward", "iqn_quantile_loss", "iqn_loss_ema", "iqn_backward", "iqn_grad_reduce"}


def iqn_config(n_layers=1, weight=1.0):
    cfg = tiny_config(n_layers=n_layers)
    cfg.network.iqn_quantiles, cfg.network.iqn_embed = N_TAUS, EMBED
    cfg.learner.iqn_weight = weight
    return cfg


def test_layout_appends_the_iqn_entries_and_initialises_them():
    off = ParamLayout.build(7, plain_network(hidden=4, n_layers=1, n_atoms=5, iqn_embed=EMBED))
    on = ParamLayout.build(7, plain_network(hidden=4, n_layers=1, n_atoms=5, iqn_quantiles=N_TAUS, iqn_embed=EMBED))
    assert off.fingerprint == ParamLayout.build(7, plain_network(hidden=4, n_layers=1, n_atoms=5)).fingerprint
    assert not off.iqn and on.iqn and on.fingerprint != off.fingerprint
    assert on.entries[: len(off.entries)] == off.entries  # off is the on layout's prefix
    added = [(e.name, e.shape, e.decay) for e in on.entries[len(off.entries):]]
    assert added == [(EMBED_W, (EMBED, 4), True), (EMBED_B, (4,), False), (HEAD_W, (4, N_HEADS), True),
                     (HEAD_B, (N_HEADS,), False)]
    flat = init_params(on, 5)
    np.testing.assert_array_equal(flat[: off.size], init_params(off, 5))  # the shared entries' draws are kept
    p = on.unpack(flat)
    assert 0 < np.abs(p[EMBED_W]).max() <= math.sqrt(6 / EMBED)  # Kaiming: a ReLU follows
    assert 0 < np.abs(p[HEAD_W]).max() <= math.sqrt(6 / (4 + N_HEADS))  # Xavier, as the C51 head
    assert not p[EMBED_B].any() and not p[HEAD_B].any()


def test_head_forward_and_backward_match_float64(stream, stager, rng):
    """B = 2 samples, W = 5 inputs (a ReLU's output: some zeros, masked in dx), random parameters: the fused
    kernels through the head's parameter and gradient views (each kernel: tests/kernels/test_iqn_kernels.py)."""
    b, width = 2, 5
    lay = ParamLayout.build(width, plain_network(n_atoms=5, iqn_quantiles=N_TAUS, iqn_embed=EMBED))
    flat = rng.standard_normal(lay.size).astype(np.float32)
    x = np.maximum(rng.standard_normal((b, width)), 0).astype(np.float32)
    taus = rng.random((b, N_TAUS)).astype(np.float32)
    dz = rng.standard_normal((b * N_TAUS, N_HEADS)).astype(np.float32)
    head = IqnHead(lay, b, N_TAUS, grad=True)
    grads = device_zeros(lay.size, np.float32, stream=stream)
    p, g = lay.views(stager.upload_new(flat)), lay.views(grads)
    head.forward(p, stager.upload_new(x), stager.upload_new(taus), stream=stream)
    head.backward(p, g, stager.upload_new(dz), mask_input=True, stream=stream)
    p64 = lay.unpack(flat)
    cos, phi, h, z = reference.iqn_forward64(p64, x, taus)
    want, dx = reference.iqn_backward64(p64, x, cos, phi, h, dz.astype(np.float64), mask=True)
    np.testing.assert_allclose(stager.download(head.z), z, rtol=1e-5, atol=1e-5)
    got = lay.unpack(stager.download(grads))
    for name, arr in want.items():
        np.testing.assert_allclose(got[name], arr, rtol=1e-5, atol=1e-5, err_msg=name)
    np.testing.assert_allclose(stager.download(head.dx), dx, rtol=1e-5, atol=1e-5)
    assert (x == 0).any() and (phi == 0).any()  # both masks have work to do


@pytest.mark.parametrize("n_layers", [0, 1])
def test_one_step_gradients_match_float64_from_the_steps_draws(stream, stager, rng, n_layers):
    """From the state before one step and what the step read back (the levels, the batch's observations and rows,
    the online E[Q]), the gradient's IQN entries and, with a trunk, its trunk entries (C51's + IQN's input
    gradient) are float64's, and ISV[IQN_LOSS_EMA] moved by 0.01 of the step's weighted loss."""
    cfg = iqn_config(n_layers=n_layers)
    replay, market, isv0 = random_replay(rng), rng.standard_normal((12, M)).astype(np.float32), steady_isv(rng)
    isv0[Isv.IQN_LOSS_EMA] = 0.3
    learner, isv = build(stager, stream, cfg, replay, market, isv0, seed=4)
    before = host_state(learner)
    learner.train_epoch(1)
    lay, b = learner.layout, cfg.learner.batch_size
    down = stager.download
    p, pt = lay.unpack(before["params"]), lay.unpack(before["target_params"])
    obs = down(learner.obs).astype(np.float64)
    acts, _ = reference.net_head64(p, lay.n_layers, obs[:b])
    acts_t, _ = reference.net_head64(pt, lay.n_layers, obs[b:])
    taus = down(learner.iqn.taus)
    rows = learner.rows
    weights = down(rows.weights).astype(np.float64)
    x, x_next = (acts[-1], acts_t[-1]) if n_layers else (obs[:b], obs[b:])
    cos, phi, h, z = reference.iqn_forward64(p, x, taus[0])
    z_tgt = reference.iqn_forward64(pt, x_next, taus[1])[3]
    loss, dz = reference.iqn_loss64(z, z_tgt, taus[0], down(learner.q), down(learner.batch.actions),
                                    down(rows.rewards).astype(np.float64), down(rows.discounts).astype(np.float64),
                                    weights, cfg.learner.iqn_weight)
    want, dx = reference.iqn_backward64(p, x, cos, phi, h, dz, mask=n_layers > 0)
    trunk = reference.net_backward64(p, lay.n_layers, obs[:b], acts, down(learner.online.dhead), dinput=dx)
    got = lay.unpack(down(learner.grads))
    for name, arr in {**want, **trunk}.items():
        np.testing.assert_allclose(got[name], arr, rtol=2e-5, atol=2e-5, err_msg=name)
    assert np.abs(dx).max() > 1e-3  # the IQN head does reach a trunk (n_layers = 0: the trunk-free C51 head)
    np.testing.assert_allclose(down(learner.iqn.loss), loss, rtol=2e-5, atol=2e-5)
    want_ema = 0.3 + float(LOSS_ALPHA) * ((weights * loss).sum() - 0.3)
    np.testing.assert_allclose(down(isv)[Isv.IQN_LOSS_EMA], want_ema, rtol=1e-5)


def test_at_weight_zero_the_c51_gradient_is_the_iqn_less_steps(stream, stager, rng):
    """The first step samples before the IQN draws, so at learner.iqn_weight = 0 its gradient on the shared entries
    is the IQN-less learner's, bit for bit, and the IQN entries get 0; off, no IQN kernel is launched."""
    (on, off), names = steps_with_and_without(stager, stream, rng, (iqn_config(weight=0.0), tiny_config(n_layers=1)))
    np.testing.assert_array_equal(on[: off.size], off)
    assert not on[off.size:].any()
    assert not IQN_KERNELS & set(names[1])
    step = names[0]
    iqn = ["iqn_taus", "iqn_forward", "iqn_forward", "iqn_quantile_loss", "iqn_loss_ema", "iqn_backward",
           "iqn_grad_reduce"]
    first = step.index("iqn_taus")
    backward = first + len(iqn)
    assert step[first:backward] == iqn
    rest = step[:first] + step[backward:]
    rest.remove("axpy_f32")  # the IQN input gradient added into the trunk's
    assert rest == names[1]  # otherwise the IQN-less step's launches, in order


def test_a_saved_iqn_learner_resumes_bit_for_bit(stream, stager, rng, tmp_path):
    """A learner saved mid-run through a checkpoint file and loaded into a fresh learner of the seed continues as
    the uninterrupted one, bit for bit (the levels come from the checkpointed generators, so the steps are a
    function of the saved state); the IQN-less layout's fingerprint is refused."""
    cfg = iqn_config()
    a = resumes_through_a_checkpoint(stager, stream, rng, cfg, tmp_path / "ck.h5", tiny_config(n_layers=1))
    head = a.layout.unpack(host_state(a)["params"])[HEAD_W]
    assert not np.array_equal(head, a.layout.unpack(init_params(a.layout, 2))[HEAD_W])  # the head learned
