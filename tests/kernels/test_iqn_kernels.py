"""IQN head kernels (kernels/iqn.py) against float64 references on small seeded inputs, every output element.

Sizes: the loss and the draws B = 3 samples, N = 4 levels, the 13 action heads; the fused head kernels E = 5
cosine features (and E = 64, EMBED_MAX, once) and W = 20 input columns (not a multiple of the 16-column tile),
with row counts that are no multiple of the simulator's forward block (4 threads), the backward's row group
(63 rows at N = 3, the last group partial) or the acting block's samples (42 at L = 3, 18 at L = 7).
Tolerances: the draws and the acting levels are bit-exact (the same xoroshiro arithmetic; midpoints exact in
float32); the loss sums N * N float32 terms of size ~1, 2e-6 relative plus 2e-6; the loss signal's float64 sum
1e-12 relative, its float32 EMA 1e-6. The fused head in float32 against float64: its cosines come from the
rotation recurrence (error <= 1.4e-5 at E = 64 over 200k levels, kernels/iqn.py's header; <= 1e-6 at E = 5),
then sums of E products (phi) and W products (z, dx) of size ~1 and, in the backward, sums over up to R = 75 rows
of such products (gradients up to ~40): 1e-5 relative plus 1e-5 at E = 5 (the float32 roundings of the sums;
seen: z 9e-7, gradients 6e-6, dx 1.5e-6), 2e-5 at E = 64 (the cosines' error, at most 1.4e-5, enters phi
weighted by W_e ~ 1/8 and z by W_q; seen 3e-6); every element of z, of the four gradients, of dx and of the
acting values is compared, and two launches give the same bits. The loss reference is itself checked against
central differences of its own loss (float64, step 1e-6, 1e-6 relative plus 1e-7), so a formula shared by kernel
and reference cannot hide a wrong derivative.
"""

import numpy as np
import pytest
import reference

from fox_numba.actions import DIR_OFFSET, N_BRANCHES, N_DIRECTIONS, N_HEADS
from fox_numba.device.isv import ISV_TOTAL_DIM, Isv
from fox_numba.device.rng import xoroshiro_states_host
from fox_numba.kernels.iqn import (
    EMBED_MAX,
    GROUP_ROWS,
    act_levels,
    act_values,
    backward_blocks,
    backward_groups,
    check_head,
    draw_taus,
    head_backward,
    head_forward,
    loss_signal,
    quantile_loss,
)
from fox_numba.kernels.learner import BranchRows
from fox_numba.kernels.signals import LOSS_ALPHA, N_EPOCH_STATS, EpochStat

B, N = 3, 4


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


# ---- the fused head ------------------------------------------------------------------------------------

HEAD_E, HEAD_W = 5, 20  # W: one full 16-column tile and a partial one
NAMES = ("iqn.embed.weight", "iqn.embed.bias", "iqn.head.weight", "iqn.head.bias")


def head_params(rng, embed=HEAD_E, width=HEAD_W):
    """Seeded parameters of size ~1 / sqrt(fan-in) (so z ~ 1), biases spread so some phi are 0 and some not."""
    shapes = ((embed, width), (width,), (width, N_HEADS), (N_HEADS,))
    scales = (1 / np.sqrt(embed), 0.5, 1 / np.sqrt(width), 0.5)
    return {n: (s * rng.standard_normal(shape)).astype(np.float32) for n, shape, s in zip(NAMES, shapes, scales)}


def up_params(stager, p):
    return [stager.upload_new(p[n]) for n in NAMES]


def run_forward(stream, stager, p, x, taus):
    z = stager.upload_new(np.full((taus.size, N_HEADS), np.nan, np.float32))
    head_forward(stager.upload_new(taus.reshape(-1)), stager.upload_new(x), *up_params(stager, p), z, stream=stream)
    return stager.download(z)


@pytest.mark.parametrize(("b", "n", "embed", "tol"), [(5, 3, HEAD_E, 1e-5), (2, 3, EMBED_MAX, 2e-5)])
def test_head_forward_every_output_and_deterministic(stream, stager, rng, b, n, embed, tol):
    """z of R = 15 (or 6) rows, E = 5 and E = 64; the levels include values near 0 and 1, where the recurrence's
    cos(pi tau) carries least; two launches give the same bits."""
    p = head_params(rng, embed)
    x = rng.standard_normal((b, HEAD_W)).astype(np.float32)
    taus = rng.random((b, n)).astype(np.float32)
    taus.flat[:2] = [1e-4, 0.9999]
    z = run_forward(stream, stager, p, x, taus)
    _, phi, _, want = reference.iqn_forward64(p, x, taus)
    np.testing.assert_allclose(z, want, rtol=tol, atol=tol)
    assert (phi == 0).mean() > 0.1 and (phi > 0).mean() > 0.3  # both sides of the ReLU
    np.testing.assert_array_equal(run_forward(stream, stager, p, x, taus), z)


def run_act(stream, stager, p, x, taus, n_mid):
    values = stager.upload_new(np.full((x.shape[0], 2, N_DIRECTIONS), np.nan, np.float32))
    act_values(stager.upload_new(taus), stager.upload_new(x), *up_params(stager, p), values, n_mid, stream=stream)
    return stager.download(values)


@pytest.mark.parametrize("explore", [False, True])
def test_act_values_mean_the_midpoints_and_pick_each_directions_sample(stream, stager, rng, explore):
    """B = 45 samples of L = 3 (+ 4) levels (42 or 18 samples a block: more (sample, direction) pairs than threads
    at L = 3, a partial last group): E_IQN the mean of the direction heads over the midpoints, and each direction's
    own drawn level's quantile (E_IQN again without draws), from the float64 head; deterministic."""
    b, n_mid = 45, 3
    levels = n_mid + (N_DIRECTIONS if explore else 0)
    p = head_params(rng)
    x = rng.standard_normal((b, HEAD_W)).astype(np.float32)
    taus = np.tile((np.arange(n_mid, dtype=np.float32) + 0.5) / n_mid, (b, 1))
    if explore:
        taus = np.concatenate([taus, rng.random((b, N_DIRECTIONS)).astype(np.float32)], 1)
    got = run_act(stream, stager, p, x, taus, n_mid)
    z = reference.iqn_forward64(p, x, taus)[3].reshape(b, levels, N_HEADS)[:, :, DIR_OFFSET:DIR_OFFSET + 4]
    np.testing.assert_allclose(got[:, 0], z[:, :n_mid].mean(1), rtol=1e-5, atol=1e-5)
    want_sampled = z[:, n_mid:][:, np.arange(4), np.arange(4)] if explore else z[:, :n_mid].mean(1)
    np.testing.assert_allclose(got[:, 1], want_sampled, rtol=1e-5, atol=1e-5)
    if not explore:
        np.testing.assert_array_equal(got[:, 1], got[:, 0])
    np.testing.assert_array_equal(run_act(stream, stager, p, x, taus, n_mid), got)


def run_backward(stream, stager, p, x, taus, dz, mask, blocks):
    b, w = x.shape
    e = p[NAMES[0]].shape[0]
    grads = [stager.upload_new(np.full(p[n].shape, np.nan, np.float32)) for n in NAMES]
    part = stager.upload_new(np.full((blocks, e * w + w + w * N_HEADS + N_HEADS), np.nan, np.float32))
    dx = stager.upload_new(np.full((b, w), np.nan, np.float32))
    we, be, wq, _ = up_params(stager, p)
    head_backward(stager.upload_new(taus.reshape(-1)), stager.upload_new(x), we, be, wq, stager.upload_new(dz), part,
                  dx, tuple(grads), mask=mask, stream=stream)
    return {n: stager.download(g) for n, g in zip(NAMES, grads)}, stager.download(dx)


@pytest.mark.parametrize(("mask", "blocks"), [(False, 2), (True, 1)])
def test_head_backward_every_gradient_and_dx(stream, stager, rng, mask, blocks):
    """B = 25 samples x N = 3 levels = 75 rows in two row groups (63 + 12), on 2 blocks (one group each, then the
    partial sums reduced in order) or 1 (both groups in one block); x with negatives (the mask's work) and phi
    with zeros (the ReLU's); two launches give the same bits."""
    b, n = 25, 3
    assert backward_groups(b, n) == 2 and GROUP_ROWS // n * n == 63 and backward_blocks(b, n) == 2
    p = head_params(rng)
    x = rng.standard_normal((b, HEAD_W)).astype(np.float32)
    taus = rng.random((b, n)).astype(np.float32)
    dz = rng.standard_normal((b * n, N_HEADS)).astype(np.float32)
    grads, dx = run_backward(stream, stager, p, x, taus, dz, mask, blocks)
    cos, phi, h, _ = reference.iqn_forward64(p, x, taus)
    want, want_dx = reference.iqn_backward64(p, x, cos, phi, h, dz.astype(np.float64), mask=mask)
    for name in NAMES:
        np.testing.assert_allclose(grads[name], want[name], rtol=1e-5, atol=1e-5, err_msg=name)
    np.testing.assert_allclose(dx, want_dx, rtol=1e-5, atol=1e-5)
    assert (x < 0).any() and (phi == 0).any() and (phi > 0).any()
    again, dx_again = run_backward(stream, stager, p, x, taus, dz, mask, blocks)
    for name in NAMES:
        np.testing.assert_array_equal(again[name], grads[name], err_msg=name)
    np.testing.assert_array_equal(dx_again, dx)


def test_sizes_the_fused_kernels_cannot_hold_are_refused():
    check_head(EMBED_MAX, GROUP_ROWS, 128)
    with pytest.raises(ValueError, match="network.iqn_embed"):
        check_head(EMBED_MAX + 1, 8)
    with pytest.raises(ValueError, match="network.iqn_quantiles"):
        check_head(8, GROUP_ROWS + 1)
    with pytest.raises(ValueError, match="acting levels"):
        check_head(8, 8, 129)
