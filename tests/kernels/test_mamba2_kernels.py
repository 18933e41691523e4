"""Mamba2 kernels (kernels/mamba2.py) against float64 references (tests/reference_mamba2.py) on small seeded inputs,
every output element; the reference's chunked form against its recurrence, and its backward against float64 central
differences of every input element.

Shapes: S = 3 windows of T = 7 bars, H = 2 heads, (P, N) = (6, 5) (2 x 2 thread tiles, both partly out of range)
and (4, 8) (1 x 2 tiles, full). Inputs are float32; the references run in float64 on the same float32 values.
Tolerances: the forward sums <= 7 decayed float32 terms per state element and N products per output, a few
float32 roundings (measured <= 2e-7 of the largest output): 1e-5 relative plus 2e-6 of the largest element. The
backward adds the reverse adjoint, sums over P, N and the 2 heads and the running R_t over 7 bars (measured <= 1e-6
of each array's largest element): 1e-4 relative plus 1e-5 of the largest element, per array and per row of dheads
(elements near 0 come from cancelling sums, hence no relative-only bound). With fast decays d a_log is ~1e-10 and
measured within 5e-6 of its own largest element: 1e-4 of it.
The float64 reference against differences with h = 1e-6: truncation ~1e-12, rounding ~1e-10: rtol 1e-6, atol 1e-8.
"""

import numpy as np
import pytest
import reference_mamba2 as ref

from fox_numba.kernels.mamba2 import (
    N_HEAD_PARAMS,
    in_width,
    mamba2_dt_grad,
    mamba2_gate_backward,
    mamba2_gate_forward,
    mamba2_head_grad,
    mamba2_scan_backward,
    mamba2_scan_forward,
    scan_units,
)

S, T, H = 3, 7, 2
SHAPES = [(6, 5), (4, 8)]


def upload(stager, *arrays):
    return [stager.upload_new(np.ascontiguousarray(a, np.float32)) for a in arrays]


def inputs(rng, head_dim, state_dim, samples=S, seq_len=T, n_heads=H):
    """(zxbcdt [S T, W], heads [3, H]) float32: unit-normal z, x, B, C; dt_raw around -1 (dt ~ 0.3); A in [-4, -1],
    D in [0.5, 1.5], dt_bias in [-1, 0.5], so the decays a_t spread over (0.1, 0.9)."""
    width = in_width(n_heads, head_dim, state_dim)
    zx = rng.standard_normal((samples * seq_len, width))
    zx[:, -n_heads:] = rng.normal(-1.0, 1.0, (samples * seq_len, n_heads))
    heads = np.stack([np.log(rng.uniform(1.0, 4.0, n_heads)), rng.uniform(0.5, 1.5, n_heads),
                      rng.uniform(-1.0, 0.5, n_heads)])
    return zx.astype(np.float32), heads.astype(np.float32)


def close(got, want, rtol, frac, what=""):
    np.testing.assert_allclose(got, want, rtol=rtol, atol=frac * np.abs(want).max(), err_msg=what)


def test_chunked_form_equals_the_recurrence(rng):
    """The SSD chunked form (intra-chunk quadratic form, inter-chunk state passing) gives the sequential recurrence's
    output for chunks that divide T, that do not, of 1 bar and of the whole window."""
    zx, heads = inputs(rng, 5, 3, seq_len=11)
    _, x, b, c, dt_raw = ref.split64(zx, 11, H, 5, 3)
    y, _ = ref.scan64(x, b, c, dt_raw, heads.astype(np.float64))
    for chunk in (1, 3, 4, 11):
        np.testing.assert_allclose(ref.scan_chunked64(x, b, c, dt_raw, heads.astype(np.float64), chunk), y,
                                   rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("head_dim", "state_dim"), SHAPES)
def test_scan_forward_matches_float64(stream, stager, rng, head_dim, state_dim):
    zx, heads = inputs(rng, head_dim, state_dim)
    dzx, dheads, y = upload(stager, zx, heads, np.full((S * T, H * head_dim), np.nan))
    mamba2_scan_forward(dzx, dheads, y, seq_len=T, state_dim=state_dim, stream=stream)
    _, x, b, c, dt_raw = ref.split64(zx, T, H, head_dim, state_dim)
    want, _ = ref.scan64(x, b, c, dt_raw, heads.astype(np.float64))
    close(stager.download(y), want.reshape(S * T, -1), 1e-5, 2e-6)


def test_gate_matches_float64(stream, stager, rng):
    head_dim, state_dim = SHAPES[0]
    zx, _ = inputs(rng, head_dim, state_dim)
    hp = H * head_dim
    y, dout = (rng.standard_normal((S * T, hp)).astype(np.float32) for _ in range(2))
    dzx, dy, ddout, out, dyo, dzxo = upload(stager, zx, y, dout, np.full((S * T, hp), np.nan),
                                            np.full((S * T, hp), np.nan), np.full(zx.shape, np.nan))
    mamba2_gate_forward(dzx, dy, out, stream=stream)
    mamba2_gate_backward(dzx, dy, ddout, dyo, dzxo, stream=stream)
    z = zx[:, :hp].astype(np.float64)
    sg = ref.sigmoid64(z)
    np.testing.assert_allclose(stager.download(out), y * z * sg, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(stager.download(dyo), dout * z * sg, rtol=1e-5, atol=1e-7)
    got = stager.download(dzxo)
    np.testing.assert_allclose(got[:, :hp], dout * y * sg * (1 + z * (1 - sg)), rtol=1e-5, atol=1e-7)
    assert np.isnan(got[:, hp:]).all()  # only the z columns are written


@pytest.mark.parametrize(("head_dim", "state_dim"), SHAPES)
def test_scan_backward_matches_float64(stream, stager, rng, head_dim, state_dim):
    """scan backward, dt_grad and head_grad against backpropagation through time: every element of the carried
    readout, of the x, B, C and dt_raw columns of dzxbcdt and of dheads; the z columns are left alone."""
    zx, heads = inputs(rng, head_dim, state_dim)
    hp = H * head_dim
    dy = rng.standard_normal((S * T, hp)).astype(np.float32)
    dzx, dh, ddy, carry, grad, part, dheads = upload(
        stager, zx, heads, dy, np.full((S * T, hp), np.nan), np.full(zx.shape, np.nan),
        np.full((S, N_HEAD_PARAMS * H), np.nan), np.full((N_HEAD_PARAMS, H), np.nan))
    mamba2_scan_backward(dzx, dh, ddy, carry, grad, seq_len=T, state_dim=state_dim, stream=stream)
    mamba2_dt_grad(dzx, dh, carry, ddy, grad, part, seq_len=T, state_dim=state_dim, stream=stream)
    mamba2_head_grad(part, dheads, stream=stream)
    _, x, b, c, dt_raw = ref.split64(zx, T, H, head_dim, state_dim)
    _, states = ref.scan64(x, b, c, dt_raw, heads.astype(np.float64))
    decay = np.exp(ref.softplus64(dt_raw + heads[2]) * -np.exp(heads[0].astype(np.float64)))
    prev = np.concatenate([np.zeros_like(states[:, :1]), states[:, :-1]], axis=1)
    want_carry = decay[..., None] * np.einsum("sthpn,stn->sthp", prev, c)
    close(stager.download(carry), want_carry.reshape(S * T, -1), 1e-4, 1e-5, "carry")
    dx, db, dc, d_raw, want_heads = ref.scan_backward64(x, b, c, dt_raw, heads.astype(np.float64),
                                                        dy.reshape(S, T, H, head_dim).astype(np.float64))
    got = stager.download(grad)
    assert np.isnan(got[:, :hp]).all()
    n = state_dim
    columns = {"dx": (hp, 2 * hp, dx), "dB": (2 * hp, 2 * hp + n, db), "dC": (2 * hp + n, 2 * hp + 2 * n, dc),
               "d dt_raw": (2 * hp + 2 * n, got.shape[1], d_raw)}
    for name, (begin, end, want) in columns.items():
        close(got[:, begin:end], want.reshape(S * T, -1), 1e-4, 1e-5, name)
    for k, name in enumerate(("d a_log", "dD", "d dt_bias")):  # each row at its own scale
        close(stager.download(dheads)[k], want_heads[k], 1e-4, 1e-5, name)


def test_decay_gradient_keeps_its_digits_when_heads_decay_fast(stream, stager, rng):
    """Heads with a_t ~ e^-20 .. e^-50 per bar: d a_log (of the order of a_t) within 1e-4 of its own largest element,
    which the cancelling form dy . (y - D x) - dt x^T g B misses by orders of magnitude (kernels/mamba2.py)."""
    head_dim, state_dim = SHAPES[1]
    zx, heads = inputs(rng, head_dim, state_dim)
    zx[:, -H:] = rng.uniform(1.0, 3.0, (S * T, H)).astype(np.float32)
    heads[0], heads[2] = np.log(16.0), 0.5
    hp = H * head_dim
    dy = rng.standard_normal((S * T, hp)).astype(np.float32)
    dzx, dh, ddy, carry, grad, part, dheads = upload(
        stager, zx, heads, dy, np.zeros((S * T, hp)), np.zeros(zx.shape), np.zeros((S, N_HEAD_PARAMS * H)),
        np.zeros((N_HEAD_PARAMS, H)))
    mamba2_scan_backward(dzx, dh, ddy, carry, grad, seq_len=T, state_dim=state_dim, stream=stream)
    mamba2_dt_grad(dzx, dh, carry, ddy, grad, part, seq_len=T, state_dim=state_dim, stream=stream)
    mamba2_head_grad(part, dheads, stream=stream)
    _, x, b, c, dt_raw = ref.split64(zx, T, H, head_dim, state_dim)
    want = ref.scan_backward64(x, b, c, dt_raw, heads.astype(np.float64),
                               dy.reshape(S, T, H, head_dim).astype(np.float64))[4]
    assert 0 < np.abs(want[0]).max() < 1e-6 * np.abs(want[1]).max()  # d a_log is tiny beside dD
    close(stager.download(dheads)[0], want[0], 1e-4, 1e-4, "d a_log")


def test_backward_reference_matches_finite_differences(rng):
    """scan_backward64 against central differences of L = sum(dy * y) in every element of x, B, C, dt_raw, heads."""
    head_dim, state_dim, samples, seq_len = 3, 2, 2, 5
    zx, heads32 = inputs(rng, head_dim, state_dim, samples=samples, seq_len=seq_len)
    _, x, b, c, dt_raw = (a.copy() for a in ref.split64(zx, seq_len, H, head_dim, state_dim))
    heads = heads32.astype(np.float64)
    dy = rng.standard_normal(x.shape)
    grads = ref.scan_backward64(x, b, c, dt_raw, heads, dy)
    arrays = (x, b, c, dt_raw, heads)

    def loss():
        return float(np.sum(dy * ref.scan64(x, b, c, dt_raw, heads)[0]))

    for arr, grad in zip(arrays, grads, strict=True):
        fd = np.zeros_like(arr)
        for idx in np.ndindex(arr.shape):
            keep = arr[idx]
            arr[idx] = keep + 1e-6
            up = loss()
            arr[idx] = keep - 1e-6
            down = loss()
            arr[idx] = keep
            fd[idx] = (up - down) / 2e-6
        np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-8)


def test_wrappers_refuse_bad_shapes(stream, stager, rng):
    zx, heads = inputs(rng, 4, 8)
    dzx, dh, y = upload(stager, zx, heads, np.zeros((S * T, 2 * 4)))
    with pytest.raises(ValueError, match="whole windows"):
        mamba2_scan_forward(dzx, dh, y, seq_len=4, state_dim=8, stream=stream)
    with pytest.raises(ValueError, match="zxbcdt"):
        mamba2_scan_forward(dzx, dh, y, seq_len=T, state_dim=7, stream=stream)
    with pytest.raises(ValueError, match="N = 65"):
        mamba2_scan_forward(dzx, dh, y, seq_len=T, state_dim=65, stream=stream)
    with pytest.raises(ValueError, match=r"heads must be \[3, H\]"):
        mamba2_scan_forward(dzx, upload(stager, heads[:2])[0], y, seq_len=T, state_dim=8, stream=stream)
    with pytest.raises(ValueError, match="part"):
        mamba2_dt_grad(dzx, dh, y, y, dzx, upload(stager, np.zeros((S, 3)))[0], seq_len=T, state_dim=8,
                       stream=stream)


def test_packed_blocks_change_no_bit_and_leave_missing_units_idle(stream, stager, rng):
    """At P = N = 16 a block packs 16 units (scan_units): 17 windows of 2 heads make forward blocks of 16, 16 and 2
    units (sample, head) and backward blocks of 16 and 1 (sample), so the last blocks run threads with no unit. Every
    output against float64 as above, and the first 5 windows bit for bit those of a run on those 5 alone (other
    packings: one block of 10 units forward, of 5 backward): a unit's sums do not depend on its block."""
    p, n, t, samples = 16, 16, 3, 17
    assert scan_units(p, n, 10**6) == 16 and scan_units(p, n, 5) == 5
    zx, heads = inputs(rng, p, n, samples=samples, seq_len=t)
    hp = H * p
    dy = rng.standard_normal((samples * t, hp)).astype(np.float32)

    def run(k):
        rows = k * t
        dzx, dh, ddy, y, carry, grad = upload(stager, zx[:rows], heads, dy[:rows], np.full((rows, hp), np.nan),
                                              np.full((rows, hp), np.nan), np.full((rows, zx.shape[1]), np.nan))
        mamba2_scan_forward(dzx, dh, y, seq_len=t, state_dim=n, stream=stream)
        mamba2_scan_backward(dzx, dh, ddy, carry, grad, seq_len=t, state_dim=n, stream=stream)
        return stager.download(y), stager.download(carry), stager.download(grad)[:, hp:]

    y, carry, grad = run(samples)
    _, x, b, c, dt_raw = ref.split64(zx, t, H, p, n)
    want, _ = ref.scan64(x, b, c, dt_raw, heads.astype(np.float64))
    close(y, want.reshape(samples * t, -1), 1e-5, 2e-6)
    _, db, dc, _, _ = ref.scan_backward64(x, b, c, dt_raw, heads.astype(np.float64),
                                          dy.reshape(samples, t, H, p).astype(np.float64))
    close(grad[:, hp : hp + n], db.reshape(samples * t, -1), 1e-4, 1e-5, "dB")  # x, B, C columns after hp
    close(grad[:, hp + n : hp + 2 * n], dc.reshape(samples * t, -1), 1e-4, 1e-5, "dC")
    assert np.isfinite(carry).all() and np.isfinite(grad[:, : hp + 2 * n]).all()  # every unit wrote its rows
    for got, alone in zip((y, carry, grad), run(5), strict=True):
        np.testing.assert_array_equal(got[: 5 * t], alone)
