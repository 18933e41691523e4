"""The Mamba2 block (agent/mamba2.py): its parameter layout and initialisation, and its forward and backward (the
dense projections of agent/dense.py around the kernels of kernels/mamba2.py) against the float64 block of
tests/reference_mamba2.py on every element; that reference's backward against central differences; the block read
at the last bar (Mamba2LastBlock, kernels/mamba2_last.py) against the same reference's last bar.

Shapes: S = 2 windows of T = 6 bars of F = 5 features, H = 2 heads of P = 6 with N = 5 (2 x 2 thread tiles, partly
out of range), E = 3 outputs. Tolerances: float32 through two projections of <= 34-term sums, the scan and the gate
(measured <= 3e-7 of each array's largest element): 1e-4 relative plus 1e-5 of the largest element, per array
and per row of the head parameters' gradient (d a_log, dD and d dt_bias differ in scale by up to 1e3).
"""

import math

import numpy as np
import pytest
import reference_mamba2 as ref

from fox_numba.agent.mamba2 import (
    A_RANGE,
    DT_RANGE,
    HEADS,
    IN_W,
    OUT_W,
    Mamba2Block,
    Mamba2LastBlock,
    Mamba2Dims,
    Mamba2Encoder,
    init_params,
    mamba2_entries,
)

DIMS = Mamba2Dims(seq_len=6, n_features=5, n_heads=2, head_dim=6, state_dim=5, d_out=3)
S = 2


def test_layout_and_initialisation():
    entries = mamba2_entries(DIMS)
    assert entries == [(IN_W, (5, 2 * 12 + 2 * 5 + 2), True), (HEADS, (3, 2), False), (OUT_W, (12, 3), True)]
    p, again, other = init_params(DIMS, 7), init_params(DIMS, 7), init_params(DIMS, 8)
    for name, shape, _ in entries:
        assert p[name].shape == shape and p[name].dtype == np.float32
        np.testing.assert_array_equal(p[name], again[name])
        assert not np.array_equal(p[name], other[name])
    for name in (IN_W, OUT_W):
        assert 0 < np.abs(p[name]).max() <= 1 / math.sqrt(p[name].shape[0])
    a_log, d_skip, dt_bias = p[HEADS].astype(np.float64)
    assert (A_RANGE[0] <= np.exp(a_log)).all() and (np.exp(a_log) <= A_RANGE[1]).all()
    np.testing.assert_array_equal(d_skip, 1.0)
    dt = ref.softplus64(dt_bias)
    assert (DT_RANGE[0] * 0.999 <= dt).all() and (dt <= DT_RANGE[1] * 1.001).all()


def test_dims_are_checked():
    with pytest.raises(ValueError, match="head_dim <= 64"):
        Mamba2Dims(seq_len=4, n_features=3, n_heads=1, head_dim=65, state_dim=4, d_out=2)
    with pytest.raises(ValueError, match=">= 1"):
        Mamba2Dims(seq_len=0, n_features=3, n_heads=1, head_dim=4, state_dim=4, d_out=2)


def test_block_reference_matches_finite_differences(rng):
    """block_backward64 against central differences of L = sum(dout * out) along one random direction per input
    (u, W_in, W_out, heads): each a full-array check of the composed reference's gradient."""
    d = DIMS
    p = {k: v.astype(np.float64) for k, v in init_params(d, 3).items()}
    p[HEADS][1] += rng.uniform(-0.5, 0.5, d.n_heads)  # D away from 1
    u = rng.standard_normal((S * d.seq_len, d.n_features))
    dout = rng.standard_normal((S * d.seq_len, d.d_out))
    args = (d.seq_len, d.n_heads, d.head_dim, d.state_dim)
    grads = ref.block_backward64(u, p[IN_W], p[OUT_W], p[HEADS], dout, *args)
    arrays = (u, p[IN_W], p[OUT_W], p[HEADS])

    def loss():
        return float(np.sum(dout * ref.block64(u, p[IN_W], p[OUT_W], p[HEADS], *args)[0]))

    for arr, grad in zip(arrays, grads, strict=True):
        direction = rng.standard_normal(arr.shape)
        arr += 1e-6 * direction
        up = loss()
        arr -= 2e-6 * direction
        down = loss()
        arr += 1e-6 * direction
        np.testing.assert_allclose((up - down) / 2e-6, np.sum(grad * direction), rtol=1e-6)


def decaying_params(d, rng):
    """init_params with D and dt_bias spread, and dt ~ 0.5 rather than the initial 1e-3 .. 1e-1: decays well
    below 1."""
    host = init_params(d, 11)
    host[HEADS][1:] += rng.uniform(-0.5, 0.5, (2, d.n_heads)).astype(np.float32)  # D away from 1
    host[HEADS][2] += 2.0
    return host


def test_block_forward_and_backward_match_float64(stream, stager, rng):
    d = DIMS
    host = decaying_params(d, rng)
    u = rng.standard_normal((S * d.seq_len, d.n_features)).astype(np.float32)
    dout = rng.standard_normal((S * d.seq_len, d.d_out)).astype(np.float32)
    p = {k: stager.upload_new(v) for k, v in host.items()}
    g = {k: stager.upload_new(np.full(v.shape, np.nan, np.float32)) for k, v in host.items()}
    du_, dout_ = stager.upload_new(u), stager.upload_new(dout)
    block = Mamba2Block(d, S, stream=stream)
    out = block.forward(p, du_, stream=stream)
    du = block.backward(p, du_, dout_, g, stream=stream)
    h64 = {k: v.astype(np.float64) for k, v in host.items()}
    args = (d.seq_len, d.n_heads, d.head_dim, d.state_dim)
    want_out = ref.block64(u, h64[IN_W], h64[OUT_W], h64[HEADS], *args)[0]
    want = ref.block_backward64(u, h64[IN_W], h64[OUT_W], h64[HEADS], dout.astype(np.float64), *args)
    dheads = stager.download(g[HEADS])
    for name, got, w in (("out", stager.download(out), want_out), ("du", stager.download(du), want[0]),
                         (IN_W, stager.download(g[IN_W]), want[1]), (OUT_W, stager.download(g[OUT_W]), want[2]),
                         ("d a_log", dheads[0], want[3][0]), ("dD", dheads[1], want[3][1]),
                         ("d dt_bias", dheads[2], want[3][2])):
        np.testing.assert_allclose(got, w, rtol=1e-4, atol=1e-5 * np.abs(w).max(), err_msg=name)
    first = {k: stager.download(v) for k, v in g.items()}
    block.forward(p, du_, stream=stream)
    block.backward(p, du_, dout_, g, stream=stream)
    for k, v in g.items():  # no atomics: a second step gives the same bits
        np.testing.assert_array_equal(stager.download(v), first[k])


def test_last_bar_block_matches_the_blocks_last_bar_in_float64(stream, stager, rng):
    """Mamba2LastBlock's out [S, E] against block64's last bar, and its parameter gradients against
    block_backward64 with dL/d(out) zero at the other bars, for the first G = 2 of S = 3 windows (the learner's
    grad_rows); every element, the tolerance of the block's test above."""
    d, samples, grad = DIMS, 3, 2
    host = decaying_params(d, rng)
    u = rng.standard_normal((samples * d.seq_len, d.n_features)).astype(np.float32)
    dout = rng.standard_normal((grad, d.d_out)).astype(np.float32)
    p = {k: stager.upload_new(v) for k, v in host.items()}
    g = {k: stager.upload_new(np.full(v.shape, np.nan, np.float32)) for k, v in host.items()}
    du_ = stager.upload_new(u)
    block = Mamba2LastBlock(d, samples, grad, dense="auto", stream=stream)
    out = block.forward(p, du_, stream=stream)
    block.backward(p, du_, stager.upload_new(dout), g, stream=stream)
    h64 = {k: v.astype(np.float64) for k, v in host.items()}
    args = (d.seq_len, d.n_heads, d.head_dim, d.state_dim)
    want_out = ref.block64(u, h64[IN_W], h64[OUT_W], h64[HEADS], *args)[0][d.seq_len - 1 :: d.seq_len]
    dout_all = np.zeros((grad * d.seq_len, d.d_out))
    dout_all[d.seq_len - 1 :: d.seq_len] = dout
    want = ref.block_backward64(u[: grad * d.seq_len], h64[IN_W], h64[OUT_W], h64[HEADS], dout_all, *args)
    dheads = stager.download(g[HEADS])
    for name, got, w in (("out", stager.download(out), want_out), (IN_W, stager.download(g[IN_W]), want[1]),
                         (OUT_W, stager.download(g[OUT_W]), want[2]), ("d a_log", dheads[0], want[3][0]),
                         ("dD", dheads[1], want[3][1]), ("d dt_bias", dheads[2], want[3][2])):
        np.testing.assert_allclose(got, w, rtol=1e-4, atol=1e-5 * np.abs(w).max(), err_msg=name)
    with pytest.raises(ValueError, match="grad_samples"):
        Mamba2LastBlock(d, 2, 3, dense="auto", stream=stream)


def test_the_encoder_projects_the_folds_rows_once_when_its_windows_hold_more_bars(stream, stager, rng):
    """A fold of R = 30 rows over three days: an encoder of 6 windows of T = 6 bars (36 > 30) projects the fold's rows
    and gathers the projected windows; one of 4 windows (24 <= 30), or one over a market part wider than its F
    columns, projects its windows' bars. For the same first 4 rows both give out and every parameter gradient (from
    the first 3 windows) bit for bit: a row's projection is the same dense layer on the same row either way."""
    d, n_rows = DIMS, 30
    host = decaying_params(d, rng)
    market = rng.standard_normal((n_rows, d.n_features)).astype(np.float32)
    day_first = np.repeat([0, 9, 20], [9, 11, 10]).astype(np.int32)
    rows = rng.integers(0, n_rows, 6).astype(np.int32)
    dx = rng.standard_normal((3, d.d_out)).astype(np.float32)
    p = {k: stager.upload_new(v) for k, v in host.items()}

    def run(batch, market_part):
        enc = Mamba2Encoder(d, batch, 3, dense="auto", stream=stream)
        enc.bind_market(stager.upload_new(market_part), stager.upload_new(day_first))
        g = {k: stager.upload_new(np.full(v.shape, np.nan, np.float32)) for k, v in host.items()}
        out = stager.download(enc.encode(p, stager.upload_new(rows[:batch]), stream=stream))
        stager.upload(dx, enc.dx)
        enc.backward(p, g, stream=stream)
        return enc.projected, out[:4], {k: stager.download(v) for k, v in g.items()}

    wide = np.concatenate([market, rng.standard_normal((n_rows, 2)).astype(np.float32)], axis=1)
    runs = [run(6, market), run(4, market), run(6, wide)]
    assert [projected for projected, _, _ in runs] == [True, False, False]
    for _, out, grads in runs[1:]:
        np.testing.assert_array_equal(out, runs[0][1])
        for k, v in grads.items():
            np.testing.assert_array_equal(v, runs[0][2][k], err_msg=k)
    assert np.isfinite(runs[0][1]).all() and all(np.isfinite(v).all() for v in runs[0][2].values())
