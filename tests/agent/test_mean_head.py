"""The direction mean head (network.mean_head): its layout entries and initialisation, the learner's step with it
(the head's values, its gradient entries and, with a trunk, the trunk's against float64 from the step's own batch;
the epoch's loss_mean and mean_gap), the C51 gradient unchanged at mean_weight 0 with the launches it adds, the
refusal beside an IQN head, and a checkpoint round trip that resumes bit for bit and refuses the mean-less layout.
The loss kernel: tests/kernels/test_mean_head_kernels.py; acting: tests/kernels/test_action_select.py; a real trainer:
tests/agent/test_mean_head_trainer.py.

Tolerances: the learner's values and gradients, whose inputs (the batch's observations, actions and rows) are read
back from the step, 2e-5 relative plus 2e-5 (a few float32 roundings of sums of at most W + 4 products of size ~1).
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

from fox_numba.actions import N_BRANCHES, N_DIRECTIONS
from fox_numba.agent.mean_head import MEAN_B, MEAN_W, MeanStep
from fox_numba.agent.network import Network, ParamLayout, init_params
from fox_numba.errors import ConfigError
from fox_numba.kernels.learner import BranchRows
from fox_numba.kernels.signals import N_EPOCH_STATS
from plain_learner import plain_network

MEAN_KERNELS = {"mean_loss_partials", "mean_loss_finish"}


def mean_config(n_layers=1, weight=1.0):
    cfg = tiny_config(n_layers=n_layers)
    cfg.network.mean_head = True
    cfg.learner.mean_weight = weight
    return cfg


def test_layout_appends_the_mean_entries_and_initialises_them():
    off = ParamLayout.build(7, plain_network(hidden=4, n_layers=1, n_atoms=5))
    on = ParamLayout.build(7, plain_network(hidden=4, n_layers=1, n_atoms=5, mean_head=True))
    assert not off.mean_head and on.mean_head and on.fingerprint != off.fingerprint
    assert on.entries[: len(off.entries)] == off.entries  # off is the on layout's prefix
    added = [(e.name, e.shape, e.decay) for e in on.entries[len(off.entries):]]
    assert added == [(MEAN_W, (4, N_DIRECTIONS), True), (MEAN_B, (N_DIRECTIONS,), False)]
    flat = init_params(on, 5)
    np.testing.assert_array_equal(flat[: off.size], init_params(off, 5))  # the shared entries' draws are kept
    p = on.unpack(flat)
    assert 0 < np.abs(p[MEAN_W]).max() <= math.sqrt(6 / (4 + N_DIRECTIONS))  # Xavier, as the C51 head
    assert not p[MEAN_B].any()
    with pytest.raises(ConfigError, match="mean_head does not combine with an IQN head"):
        ParamLayout.build(7, plain_network(n_atoms=5, mean_head=True, iqn_quantiles=2))


def test_mean_cross_widens_the_mean_head_alone():
    """network.mean_cross: the mean head's weight gains the position x market columns (obs_dim - 6 portfolio
    columns), the C51 head keeps the observation's; the fingerprint tells it from position_cross; it is refused
    without the mean head, with a trunk and beside position_cross."""
    obs_dim = 16
    mean = ParamLayout.build(obs_dim, plain_network(n_atoms=5, mean_head=True))
    heads = ParamLayout.build(obs_dim, plain_network(n_atoms=5, mean_head=True, position_cross=True))
    alone = ParamLayout.build(obs_dim, plain_network(n_atoms=5, mean_head=True, mean_cross=True))
    cross = obs_dim - 6
    assert alone.cross == heads.cross == cross and alone.mean_cross and not heads.mean_cross
    assert alone.entry("head.weight").shape == mean.entry("head.weight").shape == (obs_dim, mean.entry(
        "head.weight").shape[1])
    assert alone.entry(MEAN_W).shape == heads.entry(MEAN_W).shape == (obs_dim + cross, N_DIRECTIONS)
    assert (alone.in_dim, alone.head_in, alone.mean_in) == (obs_dim, obs_dim, obs_dim + cross)
    assert len({alone.fingerprint, heads.fingerprint, mean.fingerprint}) == 3
    for bad in (dict(mean_cross=True), dict(mean_head=True, mean_cross=True, n_layers=1),
                dict(mean_head=True, mean_cross=True, position_cross=True)):
        with pytest.raises(ConfigError, match="mean_cross needs network.mean_head and a linear network"):
            ParamLayout.build(obs_dim, plain_network(n_atoms=5, **bad))


@pytest.mark.parametrize("part", ["position_cross", "mean_cross"])
def test_the_mean_head_reads_the_crossed_columns(stream, stager, rng, part):
    """With position_cross the mean head's input (Network.mean_input) is layer 0's [obs | q obs[:, :M]] (each
    product one float32 rounding: equal to float64's rounded), which the C51 heads read too; with mean_cross it is
    the observation, whose crossed columns the mean head's kernels form (kernels/mean_cross.py), and the C51 heads
    read obs. Either way the head's weight has a row per column of [obs | q obs[:, :M]]."""
    obs_dim, rows = 10, 3
    lay = ParamLayout.build(obs_dim, plain_network(n_atoms=5, mean_head=True, **{part: True}))
    net = Network(lay, rows, stream=stream)
    obs = rng.standard_normal((rows, obs_dim)).astype(np.float32)
    net.forward(stager.upload_new(init_params(lay, 1)), stager.upload_new(obs), None, stream=stream)
    crossed = reference.position_cross64(obs, lay.cross, lay.position_col).astype(np.float32)
    heads = obs if part == "mean_cross" else crossed
    np.testing.assert_array_equal(stager.download(net.mean_input(rows)), heads)
    np.testing.assert_array_equal(stager.download(net.head_input(rows)), heads)
    assert lay.entry(MEAN_W).shape == (obs_dim + lay.cross, N_DIRECTIONS) and lay.cross == obs_dim - 6


@pytest.mark.parametrize("n_layers", [0, 1])
def test_one_step_values_and_gradients_match_float64(stream, stager, rng, n_layers):
    """From the state before one step and what the step read back (the batch's observations, actions and C51 rows),
    the head's online values on s and s', the target's on s', its gradient dm, the gradient's mean entries and,
    with a trunk, its trunk entries (C51's + the mean head's input gradient) are float64's; the epoch's loss_mean
    and mean_gap are the step's (network.mean_cross's step: tests/agent/test_mean_head_trainer.py)."""
    cfg = mean_config(n_layers=n_layers, weight=0.7)
    replay, market, isv0 = random_replay(rng), rng.standard_normal((12, M)).astype(np.float32), steady_isv(rng)
    learner, _ = build(stager, stream, cfg, replay, market, isv0, seed=4)
    before = host_state(learner)
    learner.train_epoch(1)
    lay, b = learner.layout, cfg.learner.batch_size
    down = stager.download
    p, pt = lay.unpack(before["params"]), lay.unpack(before["target_params"])
    obs = down(learner.obs).astype(np.float64)
    acts, _ = reference.net_head64(p, lay.n_layers, obs)
    acts_t, _ = reference.net_head64(pt, lay.n_layers, obs[b:])
    x, x_next = (acts[-1], acts_t[-1]) if n_layers else (obs, obs[b:])
    m = x @ p[MEAN_W].astype(np.float64) + p[MEAN_B]
    m_tgt = x_next @ pt[MEAN_W].astype(np.float64) + pt[MEAN_B]
    np.testing.assert_allclose(down(learner.mean.m), m, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(down(learner.mean.m_tgt), m_tgt, rtol=2e-5, atol=2e-5)
    rows, taken = N_BRANCHES * np.arange(b), down(learner.batch.actions)[:, 0]
    rewards, discounts = down(learner.rows.rewards)[rows], down(learner.rows.discounts)[rows]
    weights = down(learner.rows.weights)[rows].astype(np.float64)
    y = rewards + discounts * m_tgt[np.arange(b), m[b:].argmax(1)]
    e = m[np.arange(b), taken] - y
    dm = np.zeros((b, N_DIRECTIONS))
    dm[np.arange(b), taken] = float(np.float32(0.7)) * weights * e
    np.testing.assert_allclose(down(learner.mean.dm), dm, rtol=2e-5, atol=2e-5)
    x_s = x[:b]
    dx = dm @ p[MEAN_W].astype(np.float64).T * (x_s > 0) if n_layers else None
    want = {MEAN_W: x_s.T @ dm, MEAN_B: dm.sum(0)}
    trunk = reference.net_backward64(p, lay.n_layers, obs[:b], [a[:b] for a in acts], down(learner.online.dhead),
                                     dinput=dx)
    got = lay.unpack(down(learner.grads))
    for name, arr in {**want, **trunk}.items():
        np.testing.assert_allclose(got[name], arr, rtol=2e-5, atol=2e-5, err_msg=name)
    assert np.abs(want[MEAN_W]).max() > 1e-3
    if n_layers:
        assert np.abs(dx).max() > 1e-3  # the head does reach the trunk
    stats = learner.epoch_stats()
    np.testing.assert_allclose(stats["loss_mean"], (weights * e**2 / 2).sum() / weights.sum(), rtol=2e-5)
    top2 = np.sort(m[:b], axis=1)[:, -2:]
    np.testing.assert_allclose(stats["mean_gap"], (top2[:, 1] - top2[:, 0]).mean(), rtol=2e-5, atol=1e-7)


def test_at_weight_zero_the_c51_gradient_is_the_mean_less_steps(stream, stager, rng):
    """The head draws nothing, so at learner.mean_weight = 0 the step's gradient on the shared entries is the
    mean-less learner's, bit for bit, and the mean entries get 0; off, none of its kernels is launched; on, its
    launches sit between the C51 loss's consumers and the backward."""
    (on, off), names = steps_with_and_without(stager, stream, rng, (mean_config(weight=0.0), tiny_config(n_layers=1)))
    np.testing.assert_array_equal(on[: off.size], off)
    assert not on[off.size:].any()
    assert not MEAN_KERNELS & set(names[1])
    step = names[0]
    first = next(k for k, (a, b) in enumerate(zip(step, names[1])) if a != b)
    backward = first + len(step) - len(names[1]) - 1  # the head's launches, less the trunk's axpy
    mean = step[first:backward]  # the dense kernels' names depend on the path (simulator or GPU, tiled or TF32)
    assert all("fwd" in n for n in mean[:2]) and mean[2:4] == ["mean_loss_partials", "mean_loss_finish"], mean
    assert all("wgrad" in n for n in mean[4:-1]) and "bwd_in" in mean[-1], mean
    rest = step[:first] + step[backward:]
    rest.remove("axpy_f32")  # the head's input gradient added into the trunk's
    assert rest == names[1]  # otherwise the mean-less step's launches, in order


def test_a_saved_mean_head_learner_resumes_bit_for_bit(stream, stager, rng, tmp_path):
    """A learner saved mid-run through a checkpoint file and loaded into a fresh learner of the seed continues as
    the uninterrupted one, bit for bit; the mean-less layout's fingerprint is refused; the head learned."""
    cfg = mean_config()
    a = resumes_through_a_checkpoint(stager, stream, rng, cfg, tmp_path / "ck.h5", tiny_config(n_layers=1))
    head = a.layout.unpack(host_state(a)["params"])[MEAN_W]
    assert not np.array_equal(head, a.layout.unpack(init_params(a.layout, 2))[MEAN_W])  # the head learned


def test_mirror_settings_are_refused_where_they_cannot_act():
    """network.mirror needs the crossed mean head, and says how to turn it off; network.mirror_strength lies in
    (0, 1]."""
    base = dict(n_atoms=5, mean_head=True, mean_cross=True)
    ParamLayout.build(16, plain_network(**base, mirror=True, mirror_strength=0.01))
    with pytest.raises(ConfigError, match="set network.mirror=false beside network.mean_cross=false"):
        ParamLayout.build(16, plain_network(n_atoms=5, mean_head=True, mirror=True))
    for strength in (0.0, 1.5, -0.1):
        with pytest.raises(ConfigError, match="mirror_strength must be in"):
            ParamLayout.build(16, plain_network(**base, mirror=True, mirror_strength=strength))
    ParamLayout.build(16, plain_network(**base, mirror_strength=0.5))  # unused without the mirror, not refused


def test_beside_an_encoder_the_crossed_head_sends_the_encoder_its_gradient(stream, stager, rng):
    """network.mean_cross beside a TLOB encoder: MeanStep on random [obs | enc] inputs gives float64's values on s,
    s' and the target's s', its weight gradient over [obs | enc | q obs[:, :M]] and, as dx, the loss's gradient
    with respect to the encoder's columns, dm W[enc rows]^T, which Network.backward adds to the C51 head's
    (tests/agent/test_tlob_network.py)."""
    sizes = dict(tlob_window=4, tlob_width=4, tlob_blocks=1, tlob_heads=2, tlob_out=3)
    lay = ParamLayout.build(9, plain_network(n_atoms=3, mean_head=True, mean_cross=True, **sizes))
    b, d, enc = 5, lay.in_dim, slice(lay.encoder_col, lay.in_dim)
    p0, t0 = init_params(lay, 1), init_params(lay, 2)
    p0[lay.entry(MEAN_B).offset : lay.entry(MEAN_B).stop] = rng.uniform(-0.5, 0.5, N_DIRECTIONS)
    grads = stager.upload_new(np.zeros(lay.size, np.float32))
    step = MeanStep(lay, b, 0.7, params=stager.upload_new(p0), target=stager.upload_new(t0), grads=grads,
                    dense="strided")
    x = rng.standard_normal((2 * b, d)).astype(np.float32)
    actions = np.stack([rng.integers(0, 4, b)] + [rng.integers(0, 3, b) for _ in range(3)], 1).astype(np.int32)
    rows = BranchRows(b, lay.n_atoms)
    reward, discount, weight = (rng.uniform(0.1, 1, N_BRANCHES * b).astype(np.float32) for _ in range(3))
    for name, arr in (("rewards", reward), ("discounts", discount), ("weights", weight)):
        stager.upload(arr, getattr(rows, name))
    epoch = stager.upload_new(np.zeros(N_EPOCH_STATS, np.float64))
    up = stager.upload_new
    step.run(up(x), up(x[b:]), up(actions), rows, epoch, stream=stream)
    p, t = lay.unpack(p0), lay.unpack(t0)
    crossed = reference.position_cross64(x, lay.cross, lay.position_col)
    m = crossed @ p[MEAN_W].astype(np.float64) + p[MEAN_B]
    m_tgt = crossed[b:] @ t[MEAN_W].astype(np.float64) + t[MEAN_B]
    np.testing.assert_allclose(stager.download(step.m), m, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(stager.download(step.m_tgt), m_tgt, rtol=2e-5, atol=2e-5)
    r = N_BRANCHES * np.arange(b)
    e = m[np.arange(b), actions[:, 0]] - reward[r] - discount[r] * m_tgt[np.arange(b), m[b:].argmax(1)]
    dm = np.zeros((b, N_DIRECTIONS))
    dm[np.arange(b), actions[:, 0]] = float(np.float32(0.7)) * weight[r] * e
    got = lay.unpack(stager.download(grads))
    np.testing.assert_allclose(got[MEAN_W], crossed[:b].T @ dm, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(got[MEAN_B], dm.sum(0), rtol=2e-5, atol=2e-5)
    dx = dm @ p[MEAN_W][enc].astype(np.float64).T
    assert step.dx.shape == (b, lay.in_dim - lay.encoder_col) and np.abs(dx).max() > 1e-3
    np.testing.assert_allclose(stager.download(step.dx), dx, rtol=2e-5, atol=2e-5)
