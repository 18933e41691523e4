"""Mamba2 read at the last bar (kernels/mamba2_last.py) against the scan's float64 references
(tests/reference_mamba2.py) on small seeded inputs, every output element: the forward's y and gated against the
recurrence's last bar, the backward against backpropagation through time with dL/dy zero at every other bar.

Shapes: S = 3 windows of T = 7 bars, H = 2 heads, (P, N) = (6, 5) and (4, 8); the backward also for the first
G = 2 of 3 windows. Inputs as tests/kernels/test_mamba2_kernels.py (decays spread over (0.1, 0.9)).
Tolerances: the forward sums T weights of N products each and T weighted inputs (a few float32 roundings per term,
measured <= 3e-7 of the largest output): 1e-5 relative plus 2e-6 of the largest element. The backward adds sums
over P, the heads and the bars (measured <= 1e-6 of each array's largest element): 1e-4 relative plus 1e-5 of the
largest element, per array and per row of dheads, as the scan's tests.
"""

import numpy as np
import pytest
import reference_mamba2 as ref
from test_mamba2_kernels import H, S, SHAPES, T, close, inputs, upload

from fox_numba.kernels.mamba2 import N_HEAD_PARAMS, mamba2_head_grad
from fox_numba.kernels import mamba2_last
from fox_numba.kernels.mamba2_last import mamba2_last_backward, mamba2_last_readout, mamba2_last_weights


def nan(*shape):
    return np.full(shape, np.nan)


def forward(stager, stream, zx, heads, head_dim, state_dim):
    """(device zxbcdt, heads, kappa, alpha, y, gated) after the forward."""
    hp = H * head_dim
    arrays = upload(stager, zx, heads, nan(S * T, H), nan(S * T, H), nan(S, hp), nan(S, hp))
    dzx, dh, kappa, alpha, y, gated = arrays
    mamba2_last_weights(dzx, dh, kappa, alpha, seq_len=T, state_dim=state_dim, stream=stream)
    mamba2_last_readout(dzx, dh, kappa, y, gated, seq_len=T, state_dim=state_dim, stream=stream)
    return arrays


@pytest.mark.parametrize(("head_dim", "state_dim"), SHAPES)
def test_forward_matches_the_scans_last_bar(stream, stager, rng, head_dim, state_dim):
    zx, heads = inputs(rng, head_dim, state_dim)
    *_, y, gated = forward(stager, stream, zx, heads, head_dim, state_dim)
    z, x, b, c, dt_raw = ref.split64(zx, T, H, head_dim, state_dim)
    want = ref.scan64(x, b, c, dt_raw, heads.astype(np.float64))[0][:, -1].reshape(S, -1)
    close(stager.download(y), want, 1e-5, 2e-6, "y")
    z_last = z[:, -1].reshape(S, -1)
    close(stager.download(gated), want * z_last * ref.sigmoid64(z_last), 1e-5, 2e-6, "gated")


@pytest.mark.parametrize(("head_dim", "state_dim", "grad", "dx_threads"),
                         [(*SHAPES[0], S, None), (*SHAPES[1], S, None), (*SHAPES[1], 2, None), (*SHAPES[0], S, 5)])
def test_backward_matches_backpropagation_through_time(stream, stager, rng, monkeypatch, head_dim, state_dim, grad,
                                                       dx_threads):
    """Every column of dzxbcdt (z and C zero before the last bar) and every element of dheads; with G < S the
    backward covers the first G windows of a forward over S; with dx_threads a block of the dx kernel has fewer
    threads than a row's 2 HP columns (5 of 24), so each walks several."""
    if dx_threads is not None:
        monkeypatch.setattr(mamba2_last, "DX_THREADS", dx_threads)
    zx, heads = inputs(rng, head_dim, state_dim)
    hp, n = H * head_dim, state_dim
    dzx, dh, kappa, alpha, y, _ = forward(stager, stream, zx, heads, head_dim, state_dim)
    dgated = rng.standard_normal((grad, hp)).astype(np.float32)
    ddg, dy, w, dc, got, part, dheads = upload(stager, dgated, nan(grad, hp), nan(grad * T, H), nan(grad * T),
                                               nan(grad * T, zx.shape[1]), nan(grad, N_HEAD_PARAMS * H),
                                               nan(N_HEAD_PARAMS, H))
    mamba2_last_backward(dzx, dh, kappa, alpha, y, ddg, dy, w, dc, got, part, seq_len=T, state_dim=n, stream=stream)
    mamba2_head_grad(part, dheads, stream=stream)
    z, x, b, c, dt_raw = (a[:grad] for a in ref.split64(zx, T, H, head_dim, state_dim))
    heads64 = heads.astype(np.float64)
    y_last = ref.scan64(x, b, c, dt_raw, heads64)[0][:, -1]
    z_last, g = z[:, -1], dgated.reshape(grad, H, head_dim).astype(np.float64)
    sg = ref.sigmoid64(z_last)
    dy_all = np.zeros_like(x)
    dy_all[:, -1] = g * z_last * sg
    close(stager.download(dy), dy_all[:, -1].reshape(grad, -1), 1e-5, 2e-6, "dy")
    dz = np.zeros_like(z)
    dz[:, -1] = g * y_last * sg * (1 + z_last * (1 - sg))
    dx, db, dcc, d_raw, want_heads = ref.scan_backward64(x, b, c, dt_raw, heads64, dy_all)
    got = stager.download(got)
    columns = {"dz": (0, hp, dz), "dx": (hp, 2 * hp, dx), "dB": (2 * hp, 2 * hp + n, db),
               "dC": (2 * hp + n, 2 * hp + 2 * n, dcc), "d dt_raw": (2 * hp + 2 * n, got.shape[1], d_raw)}
    for name, (begin, end, want) in columns.items():
        close(got[:, begin:end], want.reshape(grad * T, -1), 1e-4, 1e-5, name)
    for k, name in enumerate(("d a_log", "dD", "d dt_bias")):  # each row at its own scale
        close(stager.download(dheads)[k], want_heads[k], 1e-4, 1e-5, name)
    first = stager.download(part)
    mamba2_last_backward(dzx, dh, kappa, alpha, y, ddg, dy, w, dc, stager.upload_new(np.zeros(got.shape,
                         np.float32)), part, seq_len=T, state_dim=n, stream=stream)
    np.testing.assert_array_equal(stager.download(part), first)  # fixed-order sums: the same bits again


def test_wrappers_refuse_bad_shapes(stream, stager, rng):
    zx, heads = inputs(rng, 4, 8)
    dzx, dh, kappa, y = upload(stager, zx, heads, nan(S * T, H), nan(S, H * 4))
    with pytest.raises(ValueError, match="whole windows"):
        mamba2_last_weights(dzx, dh, kappa, kappa, seq_len=4, state_dim=8, stream=stream)
    with pytest.raises(ValueError, match="N = 7"):
        mamba2_last_weights(dzx, dh, kappa, kappa, seq_len=T, state_dim=7, stream=stream)
    with pytest.raises(ValueError, match="alpha"):
        mamba2_last_weights(dzx, dh, kappa, y, seq_len=T, state_dim=8, stream=stream)
    with pytest.raises(ValueError, match="gated"):
        mamba2_last_readout(dzx, dh, kappa, y, kappa, seq_len=T, state_dim=8, stream=stream)
    with pytest.raises(ValueError, match="4 windows, the forward 3"):
        mamba2_last_backward(dzx, dh, kappa, kappa, y, upload(stager, nan(4, H * 4))[0], y, kappa, kappa, dzx,
                             kappa, seq_len=T, state_dim=8, stream=stream)
