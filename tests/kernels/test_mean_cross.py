"""The fused mean-cross head (kernels/mean_cross.py) against float64 numpy on small seeded random inputs, every
output element: the forward m = [obs | q obs[:, :M]] @ W + b and the weight gradient's dw, db.

Tolerance: each float32 output is a sum of up to n = D + M + 1 = 137 products (the forward) or of a few hundred rows'
products (the gradient), each term of order one; float32 rounding then leaves at most n eps (about 2e-5 for n = 297)
of the sum of the terms' magnitudes, so |got - want| <= 3e-5 (1 + sum |terms|). A wrong column, a missing cross
term or a dropped row moves an output by a whole term, at least 0.09 (inputs are 0.3-1.5 in magnitude), more than
that bound's 3e-5 x ~300: caught. Two column tiles (D = 70 > 64), row counts that end mid-tile, two splits."""

import numpy as np
import pytest
from reference import position_cross64

from fox_numba.actions import N_DIRECTIONS
from fox_numba.device import registry
from fox_numba.kernels.mean_cross import SPLIT_ROWS, MeanCrossWeightGrad, mean_cross_forward

D, M, P = 70, 66, 68  # observation columns (two column tiles), crossed (market) columns, the position column


def nonzero(rng, shape):
    """Uniform magnitudes in [0.3, 1.5] of random sign: never 0, so every term counts."""
    return (rng.uniform(0.3, 1.5, shape) * rng.choice([-1.0, 1.0], shape)).astype(np.float32)


def test_kernels_are_registered():
    for name in ("mean_cross_forward_kernel", "mean_cross_wgrad_partials", "mean_cross_wgrad_reduce"):
        assert f"fox_numba.kernels.mean_cross.{name}" in registry.KERNELS


def within(got, want, scale):
    np.testing.assert_array_less(np.abs(got.astype(np.float64) - want), 3e-5 * (1.0 + scale))


@pytest.mark.parametrize("rows", [7, 130])
def test_forward_matches_float64(stream, stager, rng, rows):
    obs, w, b = nonzero(rng, (rows, D)), nonzero(rng, (D + M, N_DIRECTIONS)), nonzero(rng, N_DIRECTIONS)
    m = stager.upload_new(np.full((rows, N_DIRECTIONS), np.nan, np.float32))
    mean_cross_forward(stager.upload_new(obs), stager.upload_new(w), stager.upload_new(b), m, n_cross=M, pos_col=P,
                       stream=stream)
    x = position_cross64(obs, M, P)
    want = x @ w.astype(np.float64) + b
    within(stager.download(m), want, np.abs(x) @ np.abs(w.astype(np.float64)) + np.abs(b))


@pytest.mark.parametrize("rows", [5, SPLIT_ROWS + 41])  # one split; two, the second ending mid-tile
def test_weight_grad_matches_float64(stream, stager, rng, rows):
    obs, dm = nonzero(rng, (rows, D)), nonzero(rng, (rows, N_DIRECTIONS))
    grad = MeanCrossWeightGrad(rows, D, M)
    dw = stager.upload_new(np.full((D + M, N_DIRECTIONS), np.nan, np.float32))
    db = stager.upload_new(np.full(N_DIRECTIONS, np.nan, np.float32))
    grad(stager.upload_new(obs), stager.upload_new(dm), dw, db, pos_col=P, stream=stream)
    x, dm64 = position_cross64(obs, M, P), dm.astype(np.float64)
    within(stager.download(dw), x.T @ dm64, np.abs(x).T @ np.abs(dm64))
    within(stager.download(db), dm64.sum(0), np.abs(dm64).sum(0))


def test_refuses_bad_columns_and_shapes(stream, stager):
    obs = stager.upload_new(np.ones((3, D), np.float32))
    b = stager.upload_new(np.ones(N_DIRECTIONS, np.float32))
    m = stager.upload_new(np.ones((3, N_DIRECTIONS), np.float32))
    with pytest.raises(ValueError, match="pos_col"):
        mean_cross_forward(obs, stager.upload_new(np.ones((D + M, 4), np.float32)), b, m, n_cross=M, pos_col=D,
                           stream=stream)
    with pytest.raises(ValueError, match="w"):
        mean_cross_forward(obs, stager.upload_new(np.ones((D, 4), np.float32)), b, m, n_cross=M, pos_col=P,
                           stream=stream)
    with pytest.raises(ValueError, match="n_cross"):
        MeanCrossWeightGrad(3, D, D + 1)
