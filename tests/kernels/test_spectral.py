"""Spectral-norm kernels (kernels/spectral.py) against float64 references on small seeded inputs, every output
element; the gradient formula itself against float64 central differences.

Tolerances: the power iteration is a few float32 dot products of <= 7 terms and a float64 norm, compared after
up to 3 iterations: 1e-5 relative plus 1e-6; the scale and the gradient one or two float32 roundings: 1e-6 relative
(plus 1e-7 of the largest element for the gradient, whose <G, W_sn> sum cancels).
"""

import numpy as np
import pytest
import reference

from fox_numba.kernels.signals import N_EPOCH_STATS, EpochStat
from fox_numba.kernels.spectral import spectral_epoch_stat, spectral_grad, spectral_power, spectral_scale

N_IN, N_OUT = 5, 7


def unit(rng, n):
    x = rng.standard_normal(n)
    return (x / np.linalg.norm(x)).astype(np.float32)


def upload(stager, *arrays):
    return [stager.upload_new(np.ascontiguousarray(a, np.float32)) for a in arrays]


@pytest.mark.parametrize("n_iters", [0, 1, 3])
def test_power_iteration_matches_float64(stream, stager, rng, n_iters):
    w = rng.standard_normal((N_IN, N_OUT)).astype(np.float32)
    u0, v0 = unit(rng, N_OUT), unit(rng, N_IN)
    dw, du, dv, sigma = upload(stager, w, u0, v0, np.full(2, np.nan))
    spectral_power(dw, du, dv, sigma, 1, n_iters, stream=stream)
    u, v, s = reference.spectral_power64(w, u0, v0, n_iters)
    got_u, got_v, got_sigma = (stager.download(a) for a in (du, dv, sigma))
    if n_iters == 0:  # read only: the vectors keep their bits
        np.testing.assert_array_equal(got_u, u0)
        np.testing.assert_array_equal(got_v, v0)
    np.testing.assert_allclose(got_u, u, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_v, v, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_sigma[1], s, rtol=1e-5)
    assert np.isnan(got_sigma[0])  # only its layer's sigma is written


def test_power_iteration_converges_to_the_largest_singular_value(stream, stager, rng):
    w = rng.standard_normal((N_IN, N_OUT)).astype(np.float32)
    dw, du, dv, sigma = upload(stager, w, unit(rng, N_OUT), unit(rng, N_IN), np.zeros(1))
    spectral_power(dw, du, dv, sigma, 0, 60, stream=stream)
    top = np.linalg.svd(w.astype(np.float64), compute_uv=False)[0]
    np.testing.assert_allclose(stager.download(sigma)[0], top, rtol=1e-5)


def test_scale_divides_every_element(stream, stager, rng):
    w = rng.standard_normal((N_IN, N_OUT)).astype(np.float32)
    sig = np.array([3.0, 1.7], np.float32)
    dw, dsig, out = upload(stager, w, sig, np.full((N_IN, N_OUT), np.nan))
    spectral_scale(dw, dsig, 1, out, stream=stream)
    np.testing.assert_allclose(stager.download(out), w / np.float64(sig[1]), rtol=1e-6)


def test_gradient_matches_float64_and_finite_differences(stream, stager, rng):
    """dL/dW of L(W) = sum(G0 * W / sigma(W)), sigma = v^T W u with u, v constant: the kernel against the float64
    formula on every element, and the formula against central differences of L (h = 1e-6, exact to ~1e-9)."""
    w = rng.standard_normal((N_IN, N_OUT))
    u0, v0 = unit(rng, N_OUT), unit(rng, N_IN)
    u, v, s = reference.spectral_power64(w.astype(np.float32), u0, v0, 2)
    g0 = rng.standard_normal((N_IN, N_OUT))
    want = reference.spectral_grad64(g0, w.astype(np.float32), u, v, s)

    def loss(wk):
        return float(np.sum(g0 * wk / (v @ wk @ u)))

    fd = np.zeros_like(w)
    base = w.astype(np.float32).astype(np.float64)
    for i in range(N_IN):
        for j in range(N_OUT):
            up, down = base.copy(), base.copy()
            up[i, j] += 1e-6
            down[i, j] -= 1e-6
            fd[i, j] = (loss(up) - loss(down)) / 2e-6
    np.testing.assert_allclose(want, fd, rtol=1e-6, atol=1e-8)

    w_sn = (w.astype(np.float32) / np.float32(s)).astype(np.float32)
    dg, dwsn, du, dv, dsig = upload(stager, g0, w_sn, u, v, np.array([s]))
    spectral_grad(dg, dwsn, du, dv, dsig, 0, stream=stream)
    g32, u32, v32 = (a.astype(np.float32).astype(np.float64) for a in (g0, u, v))  # the kernel's inputs
    want32 = (g32 - np.sum(g32 * w_sn) * np.outer(v32, u32)) / np.float32(s)
    np.testing.assert_allclose(stager.download(dg), want32, rtol=1e-6, atol=1e-7 * np.abs(want32).max())
    np.testing.assert_allclose(stager.download(dg), want, rtol=1e-5, atol=1e-6 * np.abs(want).max())


def test_epoch_stat_adds_the_mean_sigma(stream, stager, rng):
    epoch0 = rng.uniform(0, 1, N_EPOCH_STATS)
    sigma = np.array([1.5, 2.25, 4.0], np.float32)
    epoch = stager.upload_new(epoch0)
    spectral_epoch_stat(stager.upload_new(sigma), epoch, stream=stream)
    want = epoch0.copy()
    want[EpochStat.SPECTRAL_SIGMA] += sigma.astype(np.float64).mean()
    np.testing.assert_array_equal(stager.download(epoch), want)


def test_checks(stream, stager):
    w, u, v, sigma = upload(stager, np.ones((2, 3)), np.ones(3), np.ones(2), np.ones(1))
    with pytest.raises(ValueError, match="u must be"):
        spectral_power(w, v, v, sigma, 0, 1, stream=stream)
    with pytest.raises(ValueError, match="layer 1 is outside"):
        spectral_power(w, u, v, sigma, 1, 1, stream=stream)
    with pytest.raises(ValueError, match="n_iters"):
        spectral_power(w, u, v, sigma, 0, -1, stream=stream)
