"""Grid-stride dense layers against float64 references, and bit-equal to the register-tiled kernels.

Tolerance as in test_nn_kernels.py: each output is a chain of n float32 roundings, so
|got - ref| <= gamma(n) * (|X| @ |W| + |b|) elementwise (Higham 3.1). Outputs start as NaN, so an element
no thread wrote fails. The tiled kernels compute every output as the same chain (forward, backward-input,
and the weight gradient when the batch is one split), so the two paths agree to the bit.
"""

import numpy as np
import pytest

from fox_numba.kernels.dense_strided import (
    strided_linear_backward_input,
    strided_linear_forward,
    strided_linear_weight_grad,
)
from fox_numba.kernels.nn import LinearWeightGrad, linear_backward_input, linear_forward

U = 2.0**-24
B, K, N = 9, 6, 11


def gamma(n):
    return (n + 1) * U / (1 - (n + 1) * U)


def nan(stager, *shape):
    return stager.upload_new(np.full(shape, np.nan, np.float32))


def within(got, ref, bound):
    err = np.abs(got.astype(np.float64) - ref)
    assert not (~(err <= bound)).any(), f"worst error {np.max(err - bound)} over the bound"


@pytest.fixture()
def data(rng):
    x = rng.standard_normal((B, K)).astype(np.float32)
    x[rng.random((B, K)) < 0.25] = 0.0  # a ReLU output: zeros mask the backward
    return {
        "x": x,
        "w": rng.standard_normal((K, N)).astype(np.float32),
        "b": rng.standard_normal(N).astype(np.float32),
        "dy": rng.standard_normal((B, N)).astype(np.float32),
    }


@pytest.mark.parametrize("relu", [True, False])
def test_forward(stream, stager, data, relu):
    x, w, b = data["x"], data["w"], data["b"]
    dev = [stager.upload_new(a) for a in (x, w, b)]
    y = nan(stager, B, N)
    strided_linear_forward(*dev, y, relu=relu, stream=stream)
    ref = x.astype(np.float64) @ w + b
    ref = np.maximum(ref, 0) if relu else ref
    got = stager.download(y)
    within(got, ref, gamma(K + 1) * (np.abs(x).astype(np.float64) @ np.abs(w) + np.abs(b)))
    tiled = nan(stager, B, N)
    linear_forward(*dev, tiled, relu=relu, stream=stream, config="64x4")
    np.testing.assert_array_equal(stager.download(tiled).view(np.uint32), got.view(np.uint32))


@pytest.mark.parametrize("masked", [True, False])
def test_backward_input(stream, stager, data, masked):
    x, w, dy = data["x"], data["w"], data["dy"]
    dev_dy, dev_w, dev_x = stager.upload_new(dy), stager.upload_new(w), stager.upload_new(x)
    dx = nan(stager, B, K)
    act = dev_x if masked else None
    strided_linear_backward_input(dev_dy, dev_w, dx, act=act, stream=stream)
    ref = dy.astype(np.float64) @ w.T
    if masked:
        ref = ref * (x > 0)
    got = stager.download(dx)
    within(got, ref, gamma(N) * (np.abs(dy).astype(np.float64) @ np.abs(w).T))
    tiled = nan(stager, B, K)
    linear_backward_input(dev_dy, dev_w, tiled, act=act, stream=stream, config="64x4")
    np.testing.assert_array_equal(stager.download(tiled).view(np.uint32), got.view(np.uint32))


def test_weight_grad(stream, stager, data):
    x, dy = data["x"], data["dy"]
    dev_x, dev_dy = stager.upload_new(x), stager.upload_new(dy)
    dw, db = nan(stager, K, N), nan(stager, N)
    strided_linear_weight_grad(dev_x, dev_dy, dw, db, stream=stream)
    x64, dy64 = x.astype(np.float64), dy.astype(np.float64)
    got_w, got_b = stager.download(dw), stager.download(db)
    within(got_w, x64.T @ dy64, gamma(B) * (np.abs(x64).T @ np.abs(dy64)))
    within(got_b, dy64.sum(0), gamma(B) * np.abs(dy64).sum(0))
    grads = LinearWeightGrad(B, K, N, config="64x4")
    assert grads.splits == 1
    tw, tb = nan(stager, K, N), nan(stager, N)
    grads(dev_x, dev_dy, tw, tb, stream=stream)
    np.testing.assert_array_equal(stager.download(tw).view(np.uint32), got_w.view(np.uint32))
    np.testing.assert_array_equal(stager.download(tb).view(np.uint32), got_b.view(np.uint32))


def test_shapes_are_checked(stream, stager, data):
    x, w = stager.upload_new(data["x"]), stager.upload_new(data["w"])
    with pytest.raises(ValueError, match="do not fit"):
        strided_linear_forward(x, w, stager.upload_new(data["b"][:3]), nan(stager, B, N), relu=True, stream=stream)
    with pytest.raises(TypeError):
        strided_linear_weight_grad(data["x"], w, w, w, stream=stream)
