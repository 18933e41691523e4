"""IQN head kernels (kernels/iqn.py) against float64 references on small seeded inputs, every output element.

Sizes: B = 3 samples, N = 4 levels, E = 5 cosine features, W = 6 input columns, the 13 action heads.
Tolerances: the draws and the acting levels are bit-exact (the same xoroshiro arithmetic; midpoints exact in
float32), so is picking each direction's sampled quantile; E_IQN, a float32 mean of N values ~1, 1e-6 relative;
the modulation is one float32 product, so exact; cos of a float32 argument pi j tau (|.| < 4 pi) within 2e-6;
the loss sums N * N float32 terms of size ~1, 2e-6 relative plus 2e-6; the backward's sums of N products, 1e-6
relative plus 1e-6; the loss signal's float64 sum 1e-12 relative, its float32 EMA 1e-6. The loss reference is
itself checked against central differences of its own loss (float64, step 1e-6, 1e-6 relative plus 1e-7), so a
formula shared by kernel and reference cannot hide a wrong derivative.
"""

import numpy as np
import pytest
import reference

from fox_numba.actions import N_BRANCHES, N_HEADS
from fox_numba.device.isv import ISV_TOTAL_DIM, Isv
from fox_numba.device.rng import xoroshiro_states_host
from fox_numba.actions import N_DIRECTIONS
from fox_numba.kernels.iqn import (
    act_levels,
    cos_embed,
    direction_values,
    draw_taus,
    loss_signal,
    modulate,
    modulate_backward,
    quantile_loss,
)
from fox_numba.kernels.learner import BranchRows
from fox_numba.kernels.signals import LOSS_ALPHA, N_EPOCH_STATS, EpochStat

B, N, E, W = 3, 4, 5, 6


def uniform32_64(states, i):
    """numba's xoroshiro128p_uniform_float32 on host states, as float64."""
    return float(np.float32((reference.xoroshiro_next64(states, i) >> 11) * 2.0**-53))


def test_draw_taus_replays_the_generators_online_then_target(stream, stager):
    host = xoroshiro_states_host(B, 11)
    states = stager.upload_new(host.copy())
    taus = stager.upload_new(np.full((2, B, N), np.nan, np.float32))
    draw_taus(states, taus, stream=stream)
    want = np.zeros((2, B, N))
    for i in range(B):
        for net in range(2):
            for k in range(N):
                want[net, i, k] = uniform32_64(host, i)
    np.testing.assert_array_equal(stager.download(taus), want)
    np.testing.assert_array_equal(stager.download(states).view(np.uint64), host.view(np.uint64))  # 2N draws each


def test_cos_embed(stream, stager, rng):
    taus = rng.random(B * N).astype(np.float32)
    cos = stager.upload_new(np.full((B * N, E), np.nan, np.float32))
    cos_embed(stager.upload_new(taus), cos, stream=stream)
    want = np.cos(np.pi * np.arange(E)[None, :] * taus.astype(np.float64)[:, None])
    np.testing.assert_allclose(stager.download(cos), want, rtol=0, atol=2e-6)


def test_modulate_repeats_each_sample_over_its_levels(stream, stager, rng):
    x = rng.standard_normal((B, W)).astype(np.float32)
    phi = np.maximum(rng.standard_normal((B * N, W)), 0).astype(np.float32)
    h = stager.upload_new(np.full((B * N, W), np.nan, np.float32))
    modulate(stager.upload_new(x), stager.upload_new(phi), h, stream=stream)
    want = (np.repeat(x.astype(np.float64), N, axis=0) * phi).astype(np.float32)  # one rounding: exact
    np.testing.assert_array_equal(stager.download(h), want)


def loss_inputs(rng):
    """Quantiles spread so that |u| falls on both sides of kappa = 1; a quarter of the row weights 0."""
    z = (1.5 * rng.standard_normal((B * N, N_HEADS))).astype(np.float32)
    z_tgt = (1.5 * rng.standard_normal((B * N, N_HEADS))).astype(np.float32)
    taus = rng.random((B, N)).astype(np.float32)
    q = rng.standard_normal((2 * B, N_HEADS)).astype(np.float32)
    actions = np.stack([rng.integers(0, 4, B)] + [rng.integers(0, 3, B) for _ in range(3)], 1).astype(np.int32)
    rewards = (0.5 * rng.standard_normal(N_BRANCHES * B)).astype(np.float32)
    discounts = rng.uniform(0, 0.95, N_BRANCHES * B).astype(np.float32)
    weights = (rng.uniform(0.1, 1, N_BRANCHES * B) * (rng.random(N_BRANCHES * B) > 0.25)).astype(np.float32)
    return z, z_tgt, taus, q, actions, rewards, discounts, weights


def run_loss(stream, stager, inputs, weight, bootstrap):
    z, z_tgt, taus, q, actions, rewards, discounts, weights = inputs
    rows = BranchRows(B, 2)
    for name, arr in (("rewards", rewards), ("discounts", discounts), ("weights", weights)):
        stager.upload(arr, getattr(rows, name))
    loss = stager.upload_new(np.full(N_BRANCHES * B, np.nan, np.float32))
    dz = stager.upload_new(np.full((B * N, N_HEADS), np.nan, np.float32))
    up = stager.upload_new
    quantile_loss(up(z), up(z_tgt), up(taus), up(q), up(actions), rows, weight, loss, dz, bootstrap=bootstrap,
                  stream=stream)
    return stager.download(loss), stager.download(dz)


@pytest.mark.parametrize("bootstrap", ["direction", "branch"])
def test_quantile_loss_every_row_and_gradient(stream, stager, rng, bootstrap):
    inputs = loss_inputs(rng)
    z, z_tgt, taus, q, actions, rewards, discounts, weights = inputs
    loss, dz = run_loss(stream, stager, inputs, 0.75, bootstrap)
    want_loss, want_dz = reference.iqn_loss64(z, z_tgt, taus, q, actions, rewards, discounts, weights, 0.75,
                                              shared=bootstrap == "direction")
    np.testing.assert_allclose(loss, want_loss, rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(dz, want_dz, rtol=2e-6, atol=2e-6)
    u = [rewards[i * 4 + br] + discounts[i * 4 + br] * z_tgt[j] - z[k]  # every (j, k) pair, all heads
         for i in range(B) for br in range(N_BRANCHES)
         for j in range(i * N, i * N + N) for k in range(i * N, i * N + N)]
    assert (np.abs(u) > 1).mean() > 0.2 and (np.abs(u) < 1).mean() > 0.2  # both Huber pieces are reached
    assert np.count_nonzero(dz) <= B * N * N_BRANCHES  # one taken head per branch and level


def test_quantile_loss_reference_is_the_derivative_of_its_loss(rng):
    """d(weight * sum_r weights_r loss_r) / dz by central differences equals the reference's dz."""
    z, z_tgt, taus, q, actions, rewards, discounts, weights = loss_inputs(rng)
    args = (z_tgt, taus, q, actions, rewards, discounts, weights, 0.75)
    _, dz = reference.iqn_loss64(z.astype(np.float64), *args)
    numeric = np.zeros_like(dz)
    for idx in zip(*np.nonzero(dz), strict=True):
        plus, minus = z.astype(np.float64), z.astype(np.float64)
        plus[idx] += 1e-6
        minus[idx] -= 1e-6
        lp, lm = reference.iqn_loss64(plus, *args)[0], reference.iqn_loss64(minus, *args)[0]
        numeric[idx] = 0.75 * (weights * (lp - lm)).sum() / 2e-6
    np.testing.assert_allclose(numeric, dz, rtol=1e-6, atol=1e-7)


def test_a_non_finite_target_makes_its_rows_loss_and_gradient_nan(stream, stager, rng):
    """Sample 1's reward NaN, sample 2's infinite: their rows' losses are non-finite and their gradients NaN (the
    step's non-finite guard then skips it), sample 0's rows are the reference's."""
    inputs = loss_inputs(rng)
    inputs[5][:] = 0.5  # every row weighted, so no gradient is 0 by its weight
    inputs[6][:] = 0.5
    inputs[7][:] = 1.0
    rewards = inputs[5]
    rewards[4:8], rewards[8:12] = np.nan, np.inf
    loss, dz = run_loss(stream, stager, inputs, 1.0, "direction")
    assert not np.isfinite(loss[4:]).any() and np.isfinite(loss[:4]).all()
    taken = dz[N:] != 0
    assert np.isnan(dz[N:][taken]).all() and taken.sum(1).tolist() == [N_BRANCHES] * (2 * N)
    want_loss, want_dz = reference.iqn_loss64(*inputs[:5], rewards, *inputs[6:], 1.0)
    np.testing.assert_allclose(loss[:4], want_loss[:4], rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(dz[:N], want_dz[:N], rtol=2e-6, atol=2e-6)


def test_loss_signal_folds_the_weighted_loss_into_the_ema_and_the_epoch(stream, stager, rng):
    loss = rng.uniform(0, 2, N_BRANCHES * B).astype(np.float32)
    weights = rng.uniform(0, 0.3, N_BRANCHES * B).astype(np.float32)
    isv0 = rng.uniform(0, 1, ISV_TOTAL_DIM).astype(np.float32)
    epoch0 = rng.uniform(0, 1, N_EPOCH_STATS)
    isv, epoch = stager.upload_new(isv0), stager.upload_new(epoch0)
    loss_signal(stager.upload_new(loss), stager.upload_new(weights), isv, epoch, stream=stream)
    total = (weights.astype(np.float64) * loss).sum()
    want_isv, want_epoch = isv0.astype(np.float64), epoch0.copy()
    want_isv[Isv.IQN_LOSS_EMA] += float(LOSS_ALPHA) * (total - want_isv[Isv.IQN_LOSS_EMA])
    want_epoch[EpochStat.LOSS_IQN] += total
    np.testing.assert_allclose(stager.download(isv), want_isv, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(stager.download(epoch), want_epoch, rtol=1e-12)
    loss[3] = np.nan  # a non-finite loss moves neither
    before_isv, before_epoch = stager.download(isv), stager.download(epoch)
    loss_signal(stager.upload_new(loss), stager.upload_new(weights), isv, epoch, stream=stream)
    np.testing.assert_array_equal(stager.download(isv), before_isv)
    np.testing.assert_array_equal(stager.download(epoch), before_epoch)


@pytest.mark.parametrize("mask", [False, True])
def test_modulate_backward(stream, stager, rng, mask):
    x = rng.standard_normal((B, W)).astype(np.float32)  # negatives: the mask has work to do
    phi = np.maximum(rng.standard_normal((B * N, W)), 0).astype(np.float32)  # zeros: the ReLU's
    dh = rng.standard_normal((B * N, W)).astype(np.float32)
    dphi = stager.upload_new(np.full((B * N, W), np.nan, np.float32))
    dx = stager.upload_new(np.full((B, W), np.nan, np.float32))
    up = stager.upload_new
    modulate_backward(up(dh), up(x), up(phi), dphi, dx, mask=mask, stream=stream)
    x64 = x.astype(np.float64)
    want_dphi = dh * np.repeat(x64, N, axis=0) * (phi > 0)
    want_dx = (dh.astype(np.float64) * phi).reshape(B, N, W).sum(1) * ((x > 0) if mask else 1.0)
    np.testing.assert_allclose(stager.download(dphi), want_dphi, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(stager.download(dx), want_dx, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("explore", [False, True])
def test_act_levels_midpoints_then_one_draw_per_direction(stream, stager, explore):
    levels = N + (N_DIRECTIONS if explore else 0)
    host = xoroshiro_states_host(B, 5)
    states = stager.upload_new(host.copy())
    taus = stager.upload_new(np.full((B, levels), np.nan, np.float32))
    act_levels(states, taus, N, explore=explore, stream=stream)
    want = np.zeros((B, levels))
    want[:, :N] = (np.arange(N) + 0.5) / N  # exact in float32 for N = 4
    for i in range(B):
        for d in range(N_DIRECTIONS if explore else 0):
            want[i, N + d] = uniform32_64(host, i)
    np.testing.assert_array_equal(stager.download(taus), want)
    np.testing.assert_array_equal(stager.download(states).view(np.uint64), host.view(np.uint64))  # 4 or 0 draws


@pytest.mark.parametrize("explore", [False, True])
def test_direction_values_mean_the_midpoints_and_pick_each_directions_sample(stream, stager, rng, explore):
    levels = N + (N_DIRECTIONS if explore else 0)
    z = rng.standard_normal((B * levels, N_HEADS)).astype(np.float32)
    values = stager.upload_new(np.full((B, 2, N_DIRECTIONS), np.nan, np.float32))
    direction_values(stager.upload_new(z), values, N, stream=stream)
    per = z.astype(np.float64).reshape(B, levels, N_HEADS)
    mean = per[:, :N, :N_DIRECTIONS].mean(1)
    got = stager.download(values)
    np.testing.assert_allclose(got[:, 0], mean, rtol=1e-6, atol=1e-7)
    if explore:
        np.testing.assert_array_equal(got[:, 1], per[:, N:, :N_DIRECTIONS][:, np.arange(4), np.arange(4)])
    else:
        np.testing.assert_array_equal(got[:, 1], got[:, 0])
