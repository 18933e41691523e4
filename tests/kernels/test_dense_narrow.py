"""The narrow dense kernels (kernels/dense_narrow.py) against float64 and bit-equal to the register-tiled fp32 kernels,
and kernels.nn's launchers taking them for narrow layers at every precision.

Tolerance as in test_dense_strided.py: each output is a chain of n float32 roundings, so |got - ref| <= gamma(n) *
(|X| @ |W| + |b|) elementwise (Higham 3.1). Outputs start as NaN, so an element no thread wrote fails. Shapes cross
every tile edge: rows past a block's ROWS, a reduction past KC (and the bias column at k = K in a second k block),
splits past RC rows with a shorter last one.
"""

import numpy as np
import pytest

from fox_numba.kernels.dense_narrow import COLS, KC, ROWS, narrow_forward, narrow_weight_grad_splits
from fox_numba.kernels.nn import LinearWeightGrad, linear_backward_input, linear_forward

U = 2.0**-24
B, K = ROWS + 5, KC + 7  # a second row block and a second reduction tile, both partial


def gamma(n):
    return (n + 1) * U / (1 - (n + 1) * U)


def nan(stager, *shape):
    return stager.upload_new(np.full(shape, np.nan, np.float32))


def within(got, ref, bound):
    err = np.abs(got.astype(np.float64) - ref)
    assert not (~(err <= bound)).any(), f"worst error {np.max(err - bound)} over the bound"


def bits(stager, arr):
    return stager.download(arr).view(np.uint32)


@pytest.mark.parametrize(("n", "relu"), [(4, True), (COLS, False)])
def test_forward_against_float64_and_the_tiled_kernel(stream, stager, rng, n, relu):
    x, w = rng.standard_normal((B, K)).astype(np.float32), rng.standard_normal((K, n)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    dev = [stager.upload_new(a) for a in (x, w, b)]
    y = nan(stager, B, n)
    narrow_forward(*dev, y, relu=relu, stream=stream)
    ref = x.astype(np.float64) @ w + b
    ref = np.maximum(ref, 0) if relu else ref
    within(stager.download(y), ref, gamma(K + 1) * (np.abs(x).astype(np.float64) @ np.abs(w) + np.abs(b)))
    tiled = nan(stager, B, n)
    linear_forward(*dev, tiled, relu=relu, stream=stream, config="64x4")
    np.testing.assert_array_equal(bits(stager, tiled), bits(stager, y))


def test_weight_grad_splits_against_float64_and_the_tiled_kernel(stream, stager, rng):
    """Each split's partial against float64 over its own rows, and equal to the tiled kernel's at the same plan."""
    b, n, chunk = 2 * 48 + 20, 4, 48  # splits of 48 rows (a full and a partial RC tile each), the last of 20
    x, dy = rng.standard_normal((b, K)).astype(np.float32), rng.standard_normal((b, n)).astype(np.float32)
    dev_x, dev_dy = stager.upload_new(x), stager.upload_new(dy)
    pw, pb = nan(stager, 3, K, n), nan(stager, 3, n)
    narrow_weight_grad_splits(dev_x, dev_dy, pw, pb, chunk, stream=stream)
    got_w, got_b = stager.download(pw), stager.download(pb)
    for s in range(3):
        x64, dy64 = x[s * chunk:(s + 1) * chunk].astype(np.float64), dy[s * chunk:(s + 1) * chunk].astype(np.float64)
        within(got_w[s], x64.T @ dy64, gamma(len(x64)) * (np.abs(x64).T @ np.abs(dy64)))
        within(got_b[s], dy64.sum(0), gamma(len(x64)) * np.abs(dy64).sum(0))
    tiled = LinearWeightGrad(b, K, n, config="64x4", chunk=chunk)
    assert tiled.splits == 3
    tiled(dev_x, dev_dy, nan(stager, K, n), nan(stager, n), stream=stream)
    np.testing.assert_array_equal(bits(stager, tiled.partial_w), got_w.view(np.uint32))
    np.testing.assert_array_equal(bits(stager, tiled.partial_b), got_b.view(np.uint32))
    with pytest.raises(ValueError, match="do not cover"):
        narrow_weight_grad_splits(dev_x, dev_dy, pw, pb, 32, stream=stream)


def test_layers_wider_than_cols_are_refused(stream, stager, rng):
    x = stager.upload_new(rng.standard_normal((B, K)).astype(np.float32))
    w = stager.upload_new(rng.standard_normal((K, COLS + 1)).astype(np.float32))
    b = stager.upload_new(rng.standard_normal(COLS + 1).astype(np.float32))
    with pytest.raises(ValueError, match=f"at most {COLS}"):
        narrow_forward(x, w, b, nan(stager, B, COLS + 1), relu=False, stream=stream)


def test_nn_takes_the_narrow_kernels_at_every_precision(stream, stager, rng):
    """Asked for tf32, kernels.nn runs a layer of at most COLS outputs (or a backward-input reducing over as few) on
    exact fp32 kernels at the fp32 split plan: the tiled fp32 bits (the tensor-core kernels cannot run here, so a
    launch that reached them would fail), the weight gradient over several splits."""
    b, n = 150, COLS
    x, w = rng.standard_normal((b, K)).astype(np.float32), rng.standard_normal((K, n)).astype(np.float32)
    bias, dy = rng.standard_normal(n).astype(np.float32), rng.standard_normal((b, n)).astype(np.float32)
    dev_x, dev_w, dev_b, dev_dy = (stager.upload_new(a) for a in (x, w, bias, dy))
    y, y_tiled = nan(stager, b, n), nan(stager, b, n)
    linear_forward(dev_x, dev_w, dev_b, y, relu=True, stream=stream, precision="tf32")
    linear_forward(dev_x, dev_w, dev_b, y_tiled, relu=True, stream=stream, config="64x4")
    np.testing.assert_array_equal(bits(stager, y), bits(stager, y_tiled))
    dx, dx_tiled = nan(stager, b, K), nan(stager, b, K)
    linear_backward_input(dev_dy, dev_w, dx, act=dev_x, stream=stream, precision="tf32")
    linear_backward_input(dev_dy, dev_w, dx_tiled, act=dev_x, stream=stream, config="64x4")
    np.testing.assert_array_equal(bits(stager, dx), bits(stager, dx_tiled))
    narrow = LinearWeightGrad(b, K, n, precision="tf32")
    assert narrow.narrow and narrow.splits > 1
    tiled = LinearWeightGrad(b, K, n, config=narrow.gemm.config.name, chunk=narrow.chunk)
    outs = [(nan(stager, K, n), nan(stager, n)) for _ in range(2)]
    for grads, (dw, db) in zip((narrow, tiled), outs, strict=True):
        grads(dev_x, dev_dy, dw, db, stream=stream)
    for a, t in zip(*outs, strict=True):
        np.testing.assert_array_equal(bits(stager, a), bits(stager, t))
