"""TLOB kernels (kernels/tlob.py) against float64 references (tests/reference_tlob.py) on small seeded inputs, every
output element; each reference backward against float64 central differences of its forward, and the whole
encoder's reference backward likewise (the reference the composed encoder is tested against in
tests/agent/test_tlob.py).

Tolerances, float32 kernels vs float64 on float32-rounded inputs:
- attention forward: dot products of <= 4 terms, one exp and a sum of <= 5 per probability: 2e-6 relative plus 2e-6
  absolute (outputs and lse are O(1)).
- attention backward: P recomputed through lse (one more rounding in the exponent) and the softmax Jacobian's
  cancellation dP - Delta: 1e-5 relative plus 1e-5 of the largest element.
- layer norm: sums of <= 7 terms and a rsqrt, the backward's m1, m2 cancel: 1e-5 relative plus 1e-6 (forward) or
  1e-5 of the largest element (backward and parameter gradients).
- transpose: exact.
Central differences (h = 1e-6, float64, smooth functions): exact to ~1e-8 relative; checked at 1e-6 relative plus
1e-7 of the largest gradient.
"""

import numpy as np
import pytest
import reference_tlob as ref

from fox_numba.device.launch import i32, launch_rows
from fox_numba.kernels.tlob import (
    LN_MAX_WIDTH,
    LN_ROWS,
    MAX_BLOCK,
    TILE,
    LayerNormParamGrad,
    add_layer_norm_backward,
    add_layer_norm_forward,
    attention_backward,
    attention_bwd_kernel,
    attention_forward,
    attention_fwd_kernel,
    attention_unit_threads,
    attention_units,
    batch_transpose,
)

N_SEQS = 2


def upload(stager, *arrays):
    return [stager.upload_new(np.ascontiguousarray(a, np.float32)) for a in arrays]


def nans(stager, *shapes):
    return [stager.upload_new(np.full(s, np.nan, np.float32)) for s in shapes]


def f32(a):
    """a rounded to float32, back in float64: the kernels' inputs."""
    return np.asarray(a, np.float32).astype(np.float64)


def central_differences(f, x, h=1e-6):
    """d f / d x of a scalar float64 function by central differences, every element."""
    fd = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        old = x[idx]
        x[idx] = old + h
        up = f(x)
        x[idx] = old - h
        down = f(x)
        x[idx] = old
        fd[idx] = (up - down) / (2 * h)
    return fd


def assert_matches_fd(analytic, fd):
    np.testing.assert_allclose(analytic, fd, rtol=1e-6, atol=1e-7 * np.abs(fd).max())


@pytest.mark.parametrize(("seq", "heads", "e_dim"), [(5, 2, 3), (4, 1, 4), (3, 3, 2), (3, 2, 11)])
def test_attention_forward_matches_float64(stream, stager, rng, seq, heads, e_dim):
    width = heads * e_dim
    qkv = f32(1.5 * rng.standard_normal((N_SEQS * seq, 3 * width)))
    (dqkv,) = upload(stager, qkv)
    out, lse = nans(stager, (N_SEQS * seq, width), (N_SEQS * seq, heads))
    attention_forward(dqkv, out, lse, seq, stream=stream)
    want_out, want_lse = ref.attention64(qkv, seq, heads)
    np.testing.assert_allclose(stager.download(out), want_out, rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(stager.download(lse), want_lse, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize(("seq", "heads", "e_dim"), [(5, 2, 3), (3, 3, 2), (3, 2, 11)])
def test_attention_backward_matches_float64_and_finite_differences(stream, stager, rng, seq, heads, e_dim):
    width = heads * e_dim
    qkv = f32(1.5 * rng.standard_normal((N_SEQS * seq, 3 * width)))
    dout = f32(rng.standard_normal((N_SEQS * seq, width)))
    dqkv_in, ddout = upload(stager, qkv, dout)
    out, lse, dqkv = nans(stager, (N_SEQS * seq, width), (N_SEQS * seq, heads), qkv.shape)
    attention_forward(dqkv_in, out, lse, seq, stream=stream)
    attention_backward(dqkv_in, out, ddout, lse, dqkv, seq, stream=stream)
    want = ref.attention_bwd64(qkv, dout, seq, heads)
    np.testing.assert_allclose(stager.download(dqkv), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    fd = central_differences(lambda a: float(np.sum(dout * ref.attention64(a, seq, heads)[0])), qkv.copy())
    assert_matches_fd(want, fd)


@pytest.mark.parametrize("packed", [1, 3])
def test_attention_block_shape_does_not_change_the_bits(stream, stager, rng, packed):
    """One unit (sequence, head) per block or three (4 units of 2 column chunks each: the second block has two empty
    slots, whose threads pass the barriers and write nothing), with threads to spare, give the bits of the wrapper's
    packing of all four in one block: each output is one thread's chain in its own unit's tiles whatever the block.
    Every output is written (NaN-filled before)."""
    seq, heads, width = 5, 2, 20
    units = N_SEQS * heads
    assert attention_units(seq, width // heads, units) == units  # the wrapper packs the four in one block
    qkv = f32(rng.standard_normal((N_SEQS * seq, 3 * width)))
    dout = f32(rng.standard_normal((N_SEQS * seq, width)))
    dq, ddout = upload(stager, qkv, dout)
    out, lse, dqkv = nans(stager, (N_SEQS * seq, width), (N_SEQS * seq, heads), qkv.shape)
    out2, lse2, dqkv2 = nans(stager, (N_SEQS * seq, width), (N_SEQS * seq, heads), qkv.shape)
    attention_forward(dq, out, lse, seq, stream=stream)
    attention_backward(dq, out, ddout, lse, dqkv, seq, stream=stream)
    scale = np.float32(1.0 / np.sqrt(width // heads))
    blocks, block = -(-units // packed), packed * attention_unit_threads(seq, width // heads) + 3
    launch_rows(attention_fwd_kernel, blocks, block, dq, out2, lse2, i32(seq), i32(packed), scale, stream=stream)
    launch_rows(attention_bwd_kernel, blocks, block, dq, out2, ddout, lse2, dqkv2, i32(seq), i32(packed), scale,
                stream=stream)
    for a, b in ((out, out2), (lse, lse2), (dqkv, dqkv2)):
        assert np.isfinite(stager.download(a)).all()
        np.testing.assert_array_equal(stager.download(a), stager.download(b))


def test_attention_units_fit_the_block_and_the_tiles():
    """The default time view (S = 32, E = 8: one chunk) packs TILE // 256 units; a unit of S * E = TILE fills a tile
    alone; the threads of S = 64, E = 32 (four chunks) fill MAX_BLOCK / 2; never more units than there are."""
    assert attention_unit_threads(32, 8) == 32 and attention_unit_threads(16, 16) == 32
    assert attention_units(32, 8, 10**6) == min(MAX_BLOCK // 32, TILE // 256)
    assert attention_units(64, 32, 10**6) == 1 and attention_unit_threads(64, 32) == 256
    assert attention_units(32, 8, 3) == 3


def norm_inputs(rng, rows, width):
    x = f32(rng.standard_normal((rows, width)))
    a = f32(rng.standard_normal((rows, width)) + 0.5)
    gamma = f32(1.0 + 0.3 * rng.standard_normal(width))
    beta = f32(0.3 * rng.standard_normal(width))
    return x, a, gamma, beta


@pytest.mark.parametrize(("rows", "width"), [(6, 7), (2 * LN_ROWS + 22, 16)])  # one short block; three, even width
def test_layer_norm_forward_matches_float64(stream, stager, rng, rows, width):
    x, a, gamma, beta = norm_inputs(rng, rows, width)
    dx, da, dgam, dbeta = upload(stager, x, a, gamma, beta)
    y, stats = nans(stager, (rows, width), (rows, 2))
    add_layer_norm_forward(dx, da, dgam, dbeta, y, stats, stream=stream)
    want_y, want_stats = ref.add_layer_norm64(x, a, gamma, beta)
    np.testing.assert_allclose(stager.download(y), want_y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(stager.download(stats), want_stats, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("chunk", [3, 256])
def test_layer_norm_backward_matches_float64_and_finite_differences(stream, stager, rng, chunk):
    """dz and the parameter gradients; chunk 3 over 7 rows: three chunk partials, the last one short."""
    rows, width = 7, 5
    x, a, gamma, beta = norm_inputs(rng, rows, width)
    dy = f32(rng.standard_normal((rows, width)))
    dx, da, dgam, dbeta, ddy = upload(stager, x, a, gamma, beta, dy)
    y, stats, dz, ggam, gbeta = nans(stager, (rows, width), (rows, 2), (rows, width), width, width)
    add_layer_norm_forward(dx, da, dgam, dbeta, y, stats, stream=stream)
    add_layer_norm_backward(ddy, dx, da, dgam, stats, dz, stream=stream)
    LayerNormParamGrad(rows, width, chunk=chunk)(ddy, dx, da, stats, ggam, gbeta, stream=stream)
    want_dz, want_dgam, want_dbeta = ref.add_layer_norm_bwd64(dy, x, a, gamma)
    for got, want in ((dz, want_dz), (ggam, want_dgam), (gbeta, want_dbeta)):
        np.testing.assert_allclose(stager.download(got), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())

    def loss(x_, a_=a, g_=gamma, b_=beta):
        return float(np.sum(dy * ref.add_layer_norm64(x_, a_, g_, b_)[0]))

    assert_matches_fd(want_dz, central_differences(loss, x.copy()))
    assert_matches_fd(want_dz, central_differences(lambda a_: loss(x, a_), a.copy()))
    assert_matches_fd(want_dgam, central_differences(lambda g_: loss(x, a, g_), gamma.copy()))
    assert_matches_fd(want_dbeta, central_differences(lambda b_: loss(x, a, gamma, b_), beta.copy()))


def test_batch_transpose_both_ways(stream, stager, rng):
    """[B*T, D] -> [B*D, T] -> [B*T, D], exact."""
    batch, t, d = 3, 4, 5
    x = rng.standard_normal((batch * t, d)).astype(np.float32)
    (dx,) = upload(stager, x)
    y, back = nans(stager, (batch * d, t), (batch * t, d))
    batch_transpose(dx, y, t, stream=stream)
    batch_transpose(y, back, d, stream=stream)
    want = x.reshape(batch, t, d).transpose(0, 2, 1).reshape(batch * d, t)
    np.testing.assert_array_equal(stager.download(y), want)
    np.testing.assert_array_equal(stager.download(back), x)


def random_encoder(rng, t, f, d, n_blocks, n_out):
    """Reference parameters: weights ~0.5 N(0, 1), gamma 1 + 0.3 N, biases and beta 0.3 N (none zero)."""
    p = {"tlob.embed.weight": 0.5 * rng.standard_normal((f, d)), "tlob.embed.bias": 0.3 * rng.standard_normal(d),
         "tlob.head.weight": 0.3 * rng.standard_normal((d * t, n_out)),
         "tlob.head.bias": rng.standard_normal(n_out)}
    for block in range(n_blocks):
        for view, w in (("time", d), ("feature", t)):
            n = ref.sublayer_names(block, view)
            p[n["qkv.weight"]] = 0.5 * rng.standard_normal((w, 3 * w))
            p[n["qkv.bias"]] = 0.3 * rng.standard_normal(3 * w)
            p[n["out.weight"]] = 0.5 * rng.standard_normal((w, w))
            p[n["out.bias"]] = 0.3 * rng.standard_normal(w)
            p[n["norm.gamma"]] = 1.0 + 0.3 * rng.standard_normal(w)
            p[n["norm.beta"]] = 0.3 * rng.standard_normal(w)
    return p


def test_encoder_reference_backward_matches_finite_differences(rng):
    """The float64 encoder's hand-written backward (2 blocks, 2 heads per view) against central differences of
    L = sum(dout * out) in every parameter element."""
    batch, t, f, d, n_blocks, n_out = 2, 4, 3, 6, 2, 3
    p = random_encoder(rng, t, f, d, n_blocks, n_out)
    x = rng.standard_normal((batch, t * f))
    dout = rng.standard_normal((batch, n_out))
    _, cache = ref.encoder64(p, x, t, d, n_blocks, 2, 2)
    grads = ref.encoder_bwd64(p, x, cache, dout, t, d)
    assert sorted(grads) == sorted(p)
    for name, value in p.items():

        def loss(v, name=name):
            return float(np.sum(dout * ref.encoder64({**p, name: v}, x, t, d, n_blocks, 2, 2)[0]))

        assert_matches_fd(grads[name], central_differences(loss, value.copy()))


def test_layer_norm_backward_over_several_blocks(stream, stager, rng):
    """dz over three blocks of LN_ROWS rows, the last one short, at an even width (a padded shared-memory row)."""
    rows, width = 2 * LN_ROWS + 22, 16
    x, a, gamma, beta = norm_inputs(rng, rows, width)
    dy = f32(rng.standard_normal((rows, width)))
    dx, da, dgam, dbeta, ddy = upload(stager, x, a, gamma, beta, dy)
    y, stats, dz = nans(stager, (rows, width), (rows, 2), (rows, width))
    add_layer_norm_forward(dx, da, dgam, dbeta, y, stats, stream=stream)
    add_layer_norm_backward(ddy, dx, da, dgam, stats, dz, stream=stream)
    want_dz = ref.add_layer_norm_bwd64(dy, x, a, gamma)[0]
    np.testing.assert_allclose(stager.download(dz), want_dz, rtol=1e-5, atol=1e-5 * np.abs(want_dz).max())


def test_checks(stream, stager):
    qkv, out, lse = nans(stager, (6, 9), (6, 3), (6, 1))
    with pytest.raises(ValueError, match="rows = N"):
        attention_forward(qkv, out, lse, 4, stream=stream)
    with pytest.raises(ValueError, match="seq <= 64"):
        attention_forward(qkv, out, lse, 65, stream=stream)
    wide, wlse = nans(stager, (6, 3), (6, 2))
    with pytest.raises(ValueError, match="heads"):
        attention_forward(qkv, wide, wlse, 3, stream=stream)
    long_qkv, long_out, long_lse = nans(stager, (64, 3 * 33), (64, 33), (64, 1))
    with pytest.raises(ValueError, match="seq \\* E <= 2048"):
        attention_forward(long_qkv, long_out, long_lse, 64, stream=stream)
    with pytest.raises(ValueError, match="qkv must be"):
        attention_forward(out, out, lse, 3, stream=stream)
    with pytest.raises(ValueError, match="rows=4"):
        batch_transpose(out, out, 4, stream=stream)
    x, stats = nans(stager, (6, 3), (6, 1))
    with pytest.raises(ValueError, match="stats must be"):
        add_layer_norm_forward(x, x, x[0], x[0], x, stats, stream=stream)
    wide, wide_stats = nans(stager, (2, LN_MAX_WIDTH + 1), (2, 2))
    with pytest.raises(ValueError, match="W = 65 must be in 1 .. 64"):
        add_layer_norm_forward(wide, wide, wide[0], wide[0], wide, wide_stats, stream=stream)
