"""The TF32 tensor-core GEMMs (kernels/gemm_tf32.py) against float64 numpy references, every element checked.

GPU only (but the last tests): the simulator cannot run mma.sync (kernels/tensor_core.py); CI compiles these
kernels for sm_90, and the simulator runs the exact fp32 kernels wherever run.precision asks for tf32.
Two references per output:
- exact inputs: |got - x @ w| <= (2^-10 + gamma(n)) * (|x| @ |w|) (+ |b|): each operand is rounded to TF32 within a
  relative 2^-11, so a product within (1 + 2^-11)^2 - 1 < 2^-10 + 2^-22 of the exact one; the fp32 accumulation
  over n terms adds gamma(n) (Higham 3.1; the mma's internal order is unspecified, gamma covers any order).
- TF32-rounded inputs (tests/reference.py tf32_round, the twin of cvt.rna): |got - round(x) @ round(w)| <=
  gamma(n) * (|round(x)| @ |round(w)|): only the accumulation remains, so this checks the rounding mode too
  (a truncating conversion misses it by up to 2^-11 of a product, ~100 times this bound at these sizes).
A wrong fragment index, tile edge or split moves an element by a whole product term, ~1/n of its magnitude and
hundreds of times the bounds here. Outputs start as NaN, so an element no lane wrote fails.
"""

import numpy as np
import pytest

from fox_numba.agent.dense import dense_kind, precision_dense
from fox_numba.device.runtime import SIMULATOR
from fox_numba.kernels.gemm_tf32 import TILE
from fox_numba.kernels.nn import LinearWeightGrad, linear_backward_input, linear_forward
from reference import tf32_round

U = 2.0**-24
TF32_PRODUCT = 2.0**-10 + 2.0**-22  # relative error of a product of two TF32-rounded float32 operands

gpu_only = pytest.mark.gpu_only("mma.sync runs on tensor cores; the simulator has none")

# (B, K, N): below one tile; several tiles with ragged edges and a reduction ending mid-tile; a head-sized one
SHAPES = [(37, 19, 23), (300, 141, 263), (2 * TILE + 5, 134, 868)]


def gamma(n: int) -> float:
    return (n + 1) * U / (1 - (n + 1) * U)


def normal(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def within(got, ref, bound):
    err = np.abs(got.astype(np.float64) - ref)
    bad = ~(err <= bound)
    assert not bad.any(), f"{bad.sum()} of {bad.size} out of tolerance, worst {np.max(err - bound)}"


def check(got, a, b, n, extra=0.0, post=lambda v: v):
    """got against a @ b (float64) from exact and from TF32-rounded operands (module docstring)."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    ar, br = tf32_round(a).astype(np.float64), tf32_round(b).astype(np.float64)
    g = gamma(n + 1)
    within(got, post(a64 @ b64 + extra), (TF32_PRODUCT + g) * (np.abs(a64) @ np.abs(b64) + np.abs(extra)))
    within(got, post(ar @ br + extra), g * (np.abs(ar) @ np.abs(br) + np.abs(extra)))


@gpu_only
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("relu", [True, False], ids=["relu", "identity"])
def test_forward(stream, stager, rng, shape, relu):
    b_, k, n = shape
    x, w, b = normal(rng, b_, k), normal(rng, k, n), normal(rng, n)
    y = stager.upload_new(np.full((b_, n), np.nan, np.float32))
    linear_forward(*(stager.upload_new(a) for a in (x, w, b)), y, relu=relu, stream=stream, precision="tf32")
    got = stager.download(y)
    check(got, x, w, k, extra=b.astype(np.float64), post=(lambda v: np.maximum(v, 0)) if relu else (lambda v: v))
    assert (got < 0).any() != relu


@gpu_only
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("masked", [True, False], ids=["masked", "unmasked"])
def test_backward_input(stream, stager, rng, shape, masked):
    b_, k, n = shape
    dy, w = normal(rng, b_, n), normal(rng, k, n)
    act = normal(rng, b_, k)
    act[rng.random(act.shape) < 0.2] = 0.0
    dx = stager.upload_new(np.full((b_, k), np.nan, np.float32))
    linear_backward_input(stager.upload_new(dy), stager.upload_new(w), dx, act=stager.upload_new(act) if masked
                          else None, stream=stream, precision="tf32")
    mask = (act > 0) if masked else np.ones_like(act, bool)
    check(stager.download(dx), dy, w.T, n, post=lambda v: v * mask)


@gpu_only
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_weight_grad_in_splits(stream, stager, rng, shape):
    b_, k, n = shape
    x, dy = normal(rng, b_, k), normal(rng, b_, n)
    grads = LinearWeightGrad(b_, k, n, precision="tf32", chunk=24)  # splits of 24 rows: reductions end mid-tile
    assert grads.gemm.config.name == "tf32" and grads.splits == -(-b_ // 24)
    dw = stager.upload_new(np.full((k, n), np.nan, np.float32))
    db = stager.upload_new(np.full(n, np.nan, np.float32))
    grads(stager.upload_new(x), stager.upload_new(dy), dw, db, stream=stream)
    check(stager.download(dw), x.T, dy, b_ + grads.splits)
    dy64 = dy.astype(np.float64)
    within(stager.download(db), dy64.sum(axis=0), gamma(b_ + grads.splits) * np.abs(dy64).sum(axis=0))


@gpu_only
def test_same_bits_twice_and_chosen_by_precision(stream, stager, rng):
    b_, k, n = SHAPES[1]
    x, w, b = normal(rng, b_, k), normal(rng, k, n), normal(rng, n)
    args = [stager.upload_new(a) for a in (x, w, b)]
    outs = []
    for precision in ("tf32", "tf32", "fp32"):
        y = stager.upload_new(np.full((b_, n), np.nan, np.float32))
        linear_forward(*args, y, relu=False, stream=stream, precision=precision)
        outs.append(stager.download(y).view(np.uint32))
    np.testing.assert_array_equal(outs[0], outs[1])
    assert (outs[0] != outs[2]).mean() > 0.5  # the fp32 kernels are not what precision="tf32" ran


def test_precision_picks_the_kernels(stream):
    """precision 'tf32' means the TF32 kernels on the GPU and the exact fp32 ones under the simulator; anything else
    is refused with the options named."""
    assert LinearWeightGrad(300, 134, 868, precision="tf32").gemm.config.name == "tf32"
    assert LinearWeightGrad(300, 134, 868).gemm.config.name != "tf32"
    assert precision_dense("fp32") == "auto" and precision_dense("tf32") == "tf32"
    assert dense_kind("tf32", "test") == ("strided" if SIMULATOR else "tf32")
    with pytest.raises(ValueError, match="fp32"):
        precision_dense("bf16")
    with pytest.raises(ValueError, match="precision"):
        LinearWeightGrad(8, 4, 4, precision="fp16")
