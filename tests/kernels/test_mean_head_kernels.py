"""The direction mean head's loss kernel (kernels/mean_head.py) against float64: every gradient element, the epoch's
LOSS_MEAN and MEAN_GAP, ties in the next state's argmax, non-finite targets and the argument checks. The head's dense
layers and the learner's step with it: tests/agent/test_mean_head.py.

Tolerances: e = m - (r + discount m_tgt) in float32 against float64 from the same float32 inputs is within a few
ulps of |values| <= ~3, so 1e-6 relative plus 1e-6 on the gradient; the epoch sums add float64 squares of those
differences (2e-6 relative)."""

import numpy as np
import pytest

from fox_numba.actions import N_BRANCHES, N_DIRECTIONS
from fox_numba.device.memory import device_empty
from fox_numba.kernels.learner import BranchRows
from fox_numba.kernels.mean_head import mean_loss, mean_loss_partials_shape
from fox_numba.kernels.signals import N_EPOCH_STATS, EpochStat

B = 37  # more samples than the simulator's block has threads, so threads walk several


def loss_inputs(rng, b=B):
    """Random heads of a few units, random actions, branch rows whose non-direction rows hold decoys (read, the test
    fails); three samples' next-state heads tie exactly between two directions."""
    m = rng.standard_normal((2 * b, N_DIRECTIONS)).astype(np.float32)
    m[b + 3, [1, 3]] = m[b + 3].max() + 0.5  # a* ties 1 and 3: the lowest wins
    m[b + 8, [0, 2]] = m[b + 8].max() + 0.25
    m[b + 20, :] = 0.75  # all four tie: direction 0
    m_tgt = rng.standard_normal((b, N_DIRECTIONS)).astype(np.float32)
    actions = np.stack([rng.integers(0, 4, b)] + [rng.integers(0, 3, b) for _ in range(3)], 1).astype(np.int32)
    rewards = (0.5 * rng.standard_normal(N_BRANCHES * b)).astype(np.float32)
    discounts = rng.uniform(0, 0.95, N_BRANCHES * b).astype(np.float32)
    weights = rng.uniform(0.1, 1, N_BRANCHES * b).astype(np.float32) / b
    weights[N_BRANCHES * 5] = 0.0  # a direction row of weight 0: no gradient, no share of the loss
    return m, m_tgt, actions, rewards, discounts, weights


def mean_loss64(m, m_tgt, actions, rewards, discounts, weights, weight):
    """(dm [B, 4], weighted mean e**2 / 2, mean gap) of kernels/mean_head.py's header in float64."""
    m, m_tgt = m.astype(np.float64), m_tgt.astype(np.float64)
    b = m_tgt.shape[0]
    r = N_BRANCHES * np.arange(b)
    best = m[b:].argmax(1)  # numpy's argmax takes the first of tied maxima, as the kernel
    y = rewards[r].astype(np.float64) + discounts[r].astype(np.float64) * m_tgt[np.arange(b), best]
    taken = actions[:, 0]
    e = m[np.arange(b), taken] - y
    w = weights[r].astype(np.float64)
    dm = np.zeros((b, N_DIRECTIONS))
    dm[np.arange(b), taken] = float(np.float32(weight)) * w * e
    top2 = np.sort(m[:b], axis=1)[:, -2:]
    return dm, (w * e**2 / 2).sum() / w.sum(), (top2[:, 1] - top2[:, 0]).mean()


def run(stream, stager, inputs, weight, epoch0):
    m, m_tgt, actions, rewards, discounts, weights = inputs
    b = m_tgt.shape[0]
    rows = BranchRows(b, 2)
    for name, arr in (("rewards", rewards), ("discounts", discounts), ("weights", weights)):
        stager.upload(arr, getattr(rows, name))
    dm = stager.upload_new(np.full((b, N_DIRECTIONS), np.nan, np.float32))
    epoch = stager.upload_new(epoch0)
    up = stager.upload_new
    partials = device_empty(mean_loss_partials_shape(b), np.float64)
    mean_loss(up(m), up(m_tgt), up(actions), rows, weight, dm, partials, epoch, stream=stream)
    return stager.download(dm), stager.download(epoch)


@pytest.mark.parametrize("b", [B, 600])  # 600: three blocks' partials on the GPU (one under the simulator)
def test_mean_loss_every_gradient_element_and_the_epoch_sums(stream, stager, rng, b):
    inputs = loss_inputs(rng, b)
    epoch0 = rng.uniform(0, 1, N_EPOCH_STATS)
    dm, epoch = run(stream, stager, inputs, 0.8, epoch0)
    want_dm, want_loss, want_gap = mean_loss64(*inputs, 0.8)
    np.testing.assert_allclose(dm, want_dm, rtol=1e-6, atol=1e-6)
    assert (dm != 0).sum() == b - 1  # one taken column per sample, but the weight-0 row
    want = epoch0.copy()
    want[EpochStat.LOSS_MEAN] += want_loss
    want[EpochStat.MEAN_GAP] += want_gap
    np.testing.assert_allclose(epoch, want, rtol=2e-6, atol=0)
    # the ties: the lowest tied direction is a*, so moving m_tgt at the higher one changes nothing, at the lower
    # one the gradient
    m, m_tgt = inputs[0], inputs[1].copy()
    m_tgt[3, 3] += 5.0
    m_tgt[8, 2] += 5.0
    m_tgt[20, 1:] += 5.0
    same, _ = run(stream, stager, (m, m_tgt, *inputs[2:]), 0.8, epoch0)
    np.testing.assert_array_equal(same, dm)
    m_tgt[3, 1] += 5.0
    moved, _ = run(stream, stager, (m, m_tgt, *inputs[2:]), 0.8, epoch0)
    assert moved[3, inputs[2][3, 0]] != dm[3, inputs[2][3, 0]]


def test_a_non_finite_target_gives_a_non_finite_gradient_and_leaves_the_loss_sum(stream, stager, rng):
    """Sample 4's reward NaN, sample 9's next value infinite: their taken gradients are not finite (the step's
    non-finite guard then skips it) and LOSS_MEAN keeps its value; MEAN_GAP, which reads the s rows alone, still
    moves."""
    inputs = loss_inputs(rng)
    inputs[3][N_BRANCHES * 4] = np.nan
    inputs[1][9, inputs[0][B + 9].argmax()] = np.inf
    epoch0 = rng.uniform(0, 1, N_EPOCH_STATS)
    dm, epoch = run(stream, stager, inputs, 1.0, epoch0)
    taken = inputs[2][:, 0]
    assert not np.isfinite(dm[4, taken[4]]) and not np.isfinite(dm[9, taken[9]])
    want_dm, _, want_gap = mean_loss64(*inputs, 1.0)
    ok = np.isfinite(want_dm).all(1)
    np.testing.assert_allclose(dm[ok], want_dm[ok], rtol=1e-6, atol=1e-6)
    assert epoch[EpochStat.LOSS_MEAN] == epoch0[EpochStat.LOSS_MEAN]
    np.testing.assert_allclose(epoch[EpochStat.MEAN_GAP], epoch0[EpochStat.MEAN_GAP] + want_gap, rtol=2e-6)


def test_mean_loss_checks_its_arguments(stream, stager):
    rows = BranchRows(B, 2)
    m, m_tgt = device_empty((2 * B, N_DIRECTIONS), np.float32), device_empty((B, N_DIRECTIONS), np.float32)
    actions, dm = device_empty((B, N_BRANCHES), np.int32), device_empty((B, N_DIRECTIONS), np.float32)
    epoch = device_empty(N_EPOCH_STATS, np.float64)
    part = device_empty(mean_loss_partials_shape(B), np.float64)
    with pytest.raises(ValueError, match="mean_weight"):
        mean_loss(m, m_tgt, actions, rows, -0.5, dm, part, epoch, stream=stream)
    with pytest.raises(ValueError, match="m_tgt"):
        mean_loss(m, m, actions, rows, 1.0, dm, part, epoch, stream=stream)
    with pytest.raises(ValueError, match="actions"):
        mean_loss(m, m_tgt, device_empty((B, N_BRANCHES), np.float32), rows, 1.0, dm, part, epoch, stream=stream)
    with pytest.raises(ValueError, match="partials"):
        mean_loss(m, m_tgt, actions, rows, 1.0, dm, device_empty((1, 2), np.float64), epoch, stream=stream)
