"""Variable-selection gate kernels (kernels/vsn.py) against float64 references on small seeded inputs, every output
element; the gate gradient formula itself against float64 central differences.

Tolerances: the softmax and the gating are a few float32 roundings: 1e-6 relative plus 1e-7; the gate gradient sums
<= 4 float32 products per group and cancels in the softmax Jacobian: 1e-5 relative plus 1e-6 of the largest.
"""

import math

import numpy as np
import pytest
import reference

from fox_numba.device.isv import ISV_TOTAL_DIM, Isv
from fox_numba.kernels.vsn import VSN_ALPHA, vsn_apply, vsn_focus, vsn_gate_grad, vsn_softmax

ROWS, GRAD_ROWS = 6, 4
GROUPS = ((0, 2), (2, 3), (3, 7), (7, 9))
D, K = GROUPS[-1][1], len(GROUPS)


def upload(stager, *arrays, dtype=np.float32):
    return [stager.upload_new(np.ascontiguousarray(a, dtype)) for a in arrays]


def bounds(stager):
    return upload(stager, [b for b, _ in GROUPS], [e for _, e in GROUPS], dtype=np.int32)


def test_softmax_and_gating_match_float64(stream, stager, rng):
    logits = (2.0 * rng.standard_normal((ROWS, K))).astype(np.float32)
    x = rng.standard_normal((ROWS, D)).astype(np.float32)
    g, dx, xg = upload(stager, logits, x, np.full((ROWS, D), np.nan))
    _, ends = bounds(stager)
    vsn_softmax(g, stream=stream)
    vsn_apply(dx, g, ends, xg, stream=stream)
    w = reference.softmax64(logits)
    np.testing.assert_allclose(stager.download(g), w, rtol=1e-6, atol=1e-7)
    want = K * w[:, [k for k, (b, e) in enumerate(GROUPS) for _ in range(b, e)]] * x
    np.testing.assert_allclose(stager.download(xg), want, rtol=1e-6, atol=1e-7)


def test_uniform_weights_give_back_the_observation(stream, stager, rng):
    x = rng.standard_normal((ROWS, D)).astype(np.float32)
    g, dx, xg = upload(stager, np.zeros((ROWS, K)), x, np.full((ROWS, D), np.nan))
    _, ends = bounds(stager)
    vsn_softmax(g, stream=stream)
    vsn_apply(dx, g, ends, xg, stream=stream)
    np.testing.assert_array_equal(stager.download(g), np.full((ROWS, K), 0.25, np.float32))
    np.testing.assert_array_equal(stager.download(xg), x)  # K * (1 / K) is exactly 1 for K = 4


def test_gate_gradient_matches_float64_and_finite_differences(stream, stager, rng):
    """The kernel on the first GRAD_ROWS of ROWS rows against the formula, and the formula against central
    differences of J = sum(dxg * x'(g)) with respect to the logits g."""
    logits = rng.standard_normal((ROWS, K))
    w = reference.softmax64(logits)
    x = rng.standard_normal((ROWS, D)).astype(np.float32)
    dxg = rng.standard_normal((GRAD_ROWS, D)).astype(np.float32)
    ddxg, dobs, dw, dg = upload(stager, dxg, x[:GRAD_ROWS], w[:GRAD_ROWS].astype(np.float32),
                                np.full((GRAD_ROWS, K), np.nan))
    begins, ends = bounds(stager)
    vsn_gate_grad(ddxg, dobs, dw, begins, ends, dg, stream=stream)
    want = reference.vsn_gate_grad64(dxg, x[:GRAD_ROWS], w[:GRAD_ROWS].astype(np.float32), GROUPS)
    got = stager.download(dg)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())

    group_of = [k for k, (b, e) in enumerate(GROUPS) for _ in range(b, e)]

    def objective(g):
        return float(np.sum(dxg * K * reference.softmax64(g)[:, group_of] * x[:GRAD_ROWS]))

    fd = np.zeros((GRAD_ROWS, K))
    for r in range(GRAD_ROWS):
        for k in range(K):
            up, down = logits[:GRAD_ROWS].copy(), logits[:GRAD_ROWS].copy()
            up[r, k] += 1e-6
            down[r, k] -= 1e-6
            fd[r, k] = (objective(up) - objective(down)) / 2e-6
    np.testing.assert_allclose(reference.vsn_gate_grad64(dxg, x[:GRAD_ROWS], w[:GRAD_ROWS], GROUPS), fd, rtol=1e-6,
                               atol=1e-8)


def test_focus_seeds_then_follows_an_ema(stream, stager, rng):
    """The first call (slot 0) seeds both slots with the first GRAD_ROWS rows' focus; the second folds a new batch in
    with alpha VSN_ALPHA; no other slot moves."""
    isv0 = rng.uniform(0.1, 0.9, ISV_TOTAL_DIM).astype(np.float32)
    isv0[Isv.VSN_FOCUS_MAX_EMA] = 0.0
    w1 = reference.softmax64(2.0 * rng.standard_normal((ROWS, K))).astype(np.float32)
    w2 = reference.softmax64(rng.standard_normal((ROWS, K))).astype(np.float32)
    isv, d1, d2 = upload(stager, isv0, w1, w2)
    vsn_focus(d1, isv, n_rows=GRAD_ROWS, stream=stream)
    first = stager.download(isv)
    m1, h1 = reference.vsn_focus64(w1[:GRAD_ROWS])
    assert 1 / K < m1 < 1 and 0 < h1 < 1
    np.testing.assert_allclose(first[[Isv.VSN_FOCUS_MAX_EMA, Isv.VSN_FOCUS_ENTROPY_EMA]], [m1, h1], rtol=1e-6)
    vsn_focus(d2, isv, n_rows=ROWS, stream=stream)
    second = stager.download(isv)
    m2, h2 = reference.vsn_focus64(w2)
    a = float(VSN_ALPHA)
    np.testing.assert_allclose(second[[Isv.VSN_FOCUS_MAX_EMA, Isv.VSN_FOCUS_ENTROPY_EMA]],
                               [m1 + a * (m2 - m1), h1 + a * (h2 - h1)], rtol=1e-6)
    others = np.setdiff1d(np.arange(ISV_TOTAL_DIM), [Isv.VSN_FOCUS_MAX_EMA, Isv.VSN_FOCUS_ENTROPY_EMA])
    np.testing.assert_array_equal(second[others], isv0[others])


def test_focus_bounds_and_non_finite_weights(stream, stager):
    """A uniform gate reads (1/K, 1), a one-hot gate (1, 0); a NaN weight moves neither slot."""
    isv0 = np.zeros(ISV_TOTAL_DIM, np.float32)
    uniform = np.full((2, K), 1.0 / K, np.float32)
    one_hot = np.eye(K, dtype=np.float32)[:2]
    bad = uniform.copy()
    bad[1, 2] = np.nan
    isv, du, dh, db = upload(stager, isv0, uniform, one_hot, bad)
    vsn_focus(du, isv, n_rows=2, stream=stream)
    got = stager.download(isv)[[Isv.VSN_FOCUS_MAX_EMA, Isv.VSN_FOCUS_ENTROPY_EMA]]
    np.testing.assert_allclose(got, [1 / K, 1.0], rtol=1e-6)
    vsn_focus(dh, isv, n_rows=2, stream=stream)
    a = float(VSN_ALPHA)
    after = stager.download(isv)[[Isv.VSN_FOCUS_MAX_EMA, Isv.VSN_FOCUS_ENTROPY_EMA]]
    np.testing.assert_allclose(after, [1 / K + a * (1 - 1 / K), 1.0 - a], rtol=1e-6)
    vsn_focus(db, isv, n_rows=2, stream=stream)
    np.testing.assert_array_equal(stager.download(isv)[[Isv.VSN_FOCUS_MAX_EMA, Isv.VSN_FOCUS_ENTROPY_EMA]], after)
    assert math.isclose(reference.vsn_focus64(one_hot)[1], 0.0, abs_tol=1e-12)


def test_wrappers_refuse_bad_shapes(stream, stager):
    g1, g17 = upload(stager, np.zeros((3, 1)), np.zeros((3, 17)))
    with pytest.raises(ValueError, match="2 <= K <= 16"):
        vsn_softmax(g1, stream=stream)
    with pytest.raises(ValueError, match="2 <= K <= 16"):
        vsn_softmax(g17, stream=stream)
    x, w, xg = upload(stager, np.zeros((3, D)), np.zeros((3, K)), np.zeros((3, D)))
    with pytest.raises(ValueError, match="ends"):
        vsn_apply(x, w, stager.upload_new(np.zeros(K + 1, np.int32)), xg, stream=stream)
