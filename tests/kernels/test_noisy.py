"""NoisyNet head kernels (kernels/noisy.py) and the HEALTH_DIAG mean |sigma| per branch, against float64 references
on small seeded inputs, every output element.

Tolerances: the draw's float32 log, cos and sqrt against float64 on the same 24-bit uniforms, 2e-6 relative plus
1e-6; the effective weights and sigma gradients one float32 product and sum, 1e-6 relative plus 1e-7.
"""

import math

import numpy as np
import pytest
import reference

from fox_numba.actions import N_BRANCHES
from fox_numba.device.memory import Mapped, words
from fox_numba.diag.layout import N_WORDS, SNAPSHOT_DTYPE, W_NOISY_SIGMA
from fox_numba.kernels.dropout import GOLDEN, MIX_LAYER, MIX_STEP
from fox_numba.kernels.health_diag import reduce_noisy_sigma
from fox_numba.kernels.heads import N_STREAMS, head_width
from fox_numba.kernels.noisy import U1_FLOOR, draw_noise, noise_len, noisy_grads, noisy_weights, tick_noise

N_IN, Z = 3, 2
Q = head_width(Z)


def uniform64(seed, step, layer, i):
    mask = (1 << 64) - 1
    z = (seed * GOLDEN + step * MIX_STEP + layer * MIX_LAYER + i) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    z ^= z >> 31
    return (z >> 40) / float(1 << 24)


def draw64(seed, step, stream_id, n_in, n_atoms):
    """f(eps) [N_BRANCHES * n_in + q] in float64 (module header of kernels/noisy.py)."""
    n = noise_len(n_in, head_width(n_atoms))
    out = np.zeros(n)
    branch = reference.column_branches64(n_atoms)
    for t in range(n):
        if t >= N_BRANCHES * n_in and branch[t - N_BRANCHES * n_in] < 0:
            continue
        u1 = max(1.0 - uniform64(seed, step, stream_id, 2 * t), float(U1_FLOOR))
        u2 = uniform64(seed, step, stream_id, 2 * t + 1)
        e = math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)
        out[t] = math.copysign(math.sqrt(abs(e)), e)
    return out


def test_draw_matches_the_float64_draw_and_moves_with_the_counter(stream, stager):
    seed, stream_id = 987654321, 1
    counter = stager.upload_new(np.array([7], np.int64))
    f_eps = stager.upload_new(np.full(noise_len(N_IN, Q), np.nan, np.float32))
    draw_noise(f_eps, counter, seed, stream_id, N_IN, Q, stream=stream)
    got = stager.download(f_eps)
    want = draw64(seed, 7, stream_id, N_IN, Z)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)
    assert np.count_nonzero(got == 0) == Q - N_STREAMS * Z  # the auxiliary column's f(eps_out) only
    tick_noise(counter, stream=stream)
    assert stager.download(counter)[0] == 8
    draw_noise(f_eps, counter, seed, stream_id, N_IN, Q, stream=stream)
    np.testing.assert_allclose(stager.download(f_eps), draw64(seed, 8, stream_id, N_IN, Z), rtol=2e-6, atol=1e-6)
    draw_noise(f_eps, counter, seed, 0, N_IN, Q, stream=stream)  # another stream on the same counter
    assert not np.allclose(stager.download(f_eps)[: N_BRANCHES * N_IN], want[: N_BRANCHES * N_IN])


def random_head(rng):
    mu_w, sig_w = rng.standard_normal((N_IN, Q)), rng.uniform(0.1, 0.5, (N_IN, Q))
    mu_b, sig_b = rng.standard_normal(Q), rng.uniform(0.1, 0.5, Q)
    f_eps = rng.standard_normal(noise_len(N_IN, Q))
    return [a.astype(np.float32) for a in (mu_w, sig_w, mu_b, sig_b, f_eps)]


def test_noisy_weights_and_sigma_grads_match_float64(stream, stager, rng):
    mu_w, sig_w, mu_b, sig_b, f_eps = random_head(rng)
    dev = [stager.upload_new(a) for a in (mu_w, sig_w, mu_b, sig_b, f_eps)]
    w, b = stager.upload_new(np.full((N_IN, Q), np.nan, np.float32)), stager.upload_new(np.full(Q, np.nan, np.float32))
    noisy_weights(*dev, w, b, stream=stream)
    f_in, f_out = reference.noisy_factors64(f_eps, N_IN, Z)
    np.testing.assert_allclose(stager.download(w), mu_w + sig_w.astype(np.float64) * f_in * f_out, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(stager.download(b), mu_b + sig_b.astype(np.float64) * f_out, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(stager.download(w)[:, -1], mu_w[:, -1])  # the forecast column: mu alone

    g_w, g_b = rng.standard_normal((N_IN, Q)).astype(np.float32), rng.standard_normal(Q).astype(np.float32)
    gs_w = stager.upload_new(np.full((N_IN, Q), np.nan, np.float32))
    gs_b = stager.upload_new(np.full(Q, np.nan, np.float32))
    noisy_grads(stager.upload_new(g_w), stager.upload_new(g_b), dev[4], gs_w, gs_b, stream=stream)
    np.testing.assert_allclose(stager.download(gs_w), g_w * f_in * f_out, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(stager.download(gs_b), g_b * f_out, rtol=1e-6, atol=1e-7)


def test_shapes_are_checked(stream, stager):
    bad = stager.upload_new(np.zeros((N_IN, Q + 1), np.float32))
    with pytest.raises(ValueError, match="head_width"):
        noisy_grads(bad, bad[0], bad[0], bad, bad[0], stream=stream)


def test_mean_abs_sigma_per_branch(stream, stager, rng):
    sig_w, sig_b = rng.standard_normal((N_IN, Q)).astype(np.float32), rng.standard_normal(Q).astype(np.float32)
    snapshot = Mapped(1, SNAPSHOT_DTYPE)
    snapshot.host.view(np.uint32)[:] = 0xDEADBEEF  # every word the kernel does not write keeps this
    snap_f = words(snapshot.device).view(np.float32)
    reduce_noisy_sigma(stager.upload_new(sig_w), stager.upload_new(sig_b), snap_f, stream=stream)
    stream.synchronize()
    got = snapshot.host.view(np.float32).reshape(N_WORDS)
    branch = reference.column_branches64(Z)
    both = np.abs(np.vstack([sig_w, sig_b[None]]).astype(np.float64))
    want = [both[:, branch == b].mean() for b in range(N_BRANCHES)]
    np.testing.assert_allclose(got[W_NOISY_SIGMA : W_NOISY_SIGMA + N_BRANCHES], want, rtol=1e-6)
    others = np.setdiff1d(np.arange(N_WORDS), np.arange(W_NOISY_SIGMA, W_NOISY_SIGMA + N_BRANCHES))
    assert (snapshot.host.view(np.uint32).reshape(N_WORDS)[others] == 0xDEADBEEF).all()
