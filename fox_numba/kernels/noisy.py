"""NoisyNet heads (network.noisy_sigma0 > 0): factorised Gaussian noise on the head GEMM, per branch.

    draw_noise(f_eps, counter, seed, stream_id, n_in, stream=s)        f_eps = f(eps) of this draw
    noisy_weights(mu_w, sig_w, mu_b, sig_b, f_eps, w, b, stream=s)     the effective head weights
    noisy_grads(g_w, g_b, f_eps, g_sig_w, g_sig_b, stream=s)           sigma's gradients from W's
    tick_noise(counter, stream=s)                                      counter[0] += 1 (a new draw)

Factorised Gaussian noise (Fortunato et al. 2018), f(x) = sign(x) sqrt(|x|), for the head GEMM of p = n_in
inputs and q = head_width(Z) outputs, with the noise of the input side drawn per branch: column o of stream
s (a branch's value stream or one of its advantage streams: kernels/heads.py's layout) belongs to branch
b(o) (`column_branch`), and

    W[i, o] = mu_W[i, o] + sigma_W[i, o] * f(eps_in[b(o), i]) * f(eps_out[o])
    b[o]    = mu_b[o]    + sigma_b[o]    * f(eps_out[o])
    dL/dmu = dL/dW (the head's weight gradient as it is),  dL/dsigma_W[i, o] = dL/dW[i, o] f_in f_out,
    dL/dsigma_b[o] = dL/db[o] f(eps_out[o])

so each branch is its own noisy layer over the shared input (its value and advantage columns share its
input noise), as the seed's per-branch heads. The auxiliary forecast column gets no noise: its f(eps_out)
is 0 (its sigma is 0 from the initialisation and its gradient 0). f_eps [N_BRANCHES * p + q] holds the
f(eps_in) of branch 0, ..., branch 3, then the f(eps_out) of every column.

The draw needs no random state: eps_t of draw `counter[0]` is Box-Muller on two counter-based uniforms,
u1 = hash_uniform(seed, counter, stream_id, 2t), u2 = hash_uniform(seed, counter, stream_id, 2t + 1)
(kernels/dropout.py: splitmix64 of the key), eps_t = sqrt(-2 log max(1 - u1, 2**-25)) cos(2 pi u2). The counter
lives on the device (a captured graph draws a new noise each replay after `tick_noise`); (seed, stream_id)
tells apart the streams that share a counter (the learner's online and target networks).

Launch shapes: grid-stride over the elements (`launch_strided`); the tick is one thread. float32 literals.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import cuda, float32, int32, int64, uint64

from fox_numba.actions import N_BRANCHES
from fox_numba.device.launch import check_array, i32, launch_rows, launch_strided
from fox_numba.device.registry import register
from fox_numba.kernels.dropout import hash_uniform
from fox_numba.kernels.heads import N_AUX, N_STREAMS, column_branch
from fox_numba.kernels.learner import U1_FLOOR

_TWO_PI = np.float32(2.0 * math.pi)
_F1 = float32[::1]
_F2 = float32[:, ::1]


def noise_len(n_in: int, n_out: int) -> int:
    """Length of f_eps for a head of n_in inputs and n_out output columns."""
    return N_BRANCHES * n_in + n_out


def n_atoms_of(n_out: int) -> int:
    """Z of a head of n_out = head_width(Z) columns."""
    return (n_out - N_AUX) // N_STREAMS


@cuda.jit(device=True)
def noise_factors(f_eps, i, o, n_in, n_atoms):
    """(f(eps_in) of column o's branch at input i, f(eps_out[o])); (0, 0) on an auxiliary column."""
    b = column_branch(o, n_atoms)
    if b == N_BRANCHES:
        return float32(0.0), float32(0.0)
    return f_eps[b * n_in + i], f_eps[N_BRANCHES * n_in + o]


@register((_F1, int64[::1], uint64, int32, int32, int32))
@cuda.jit
def noise_draw(f_eps, counter, seed, stream_id, n_in, n_atoms):
    """f_eps[t] = f(eps_t) of draw counter[0] (module header); 0 for the auxiliary columns' outputs."""
    t = cuda.grid(1)
    step = counter[0]
    while t < f_eps.shape[0]:
        o = t - N_BRANCHES * n_in
        if o >= 0 and o // n_atoms >= N_STREAMS:
            f_eps[t] = float32(0.0)
        else:
            u1 = max(float32(1.0) - hash_uniform(seed, step, stream_id, uint64(2 * t)), U1_FLOOR)
            u2 = hash_uniform(seed, step, stream_id, uint64(2 * t + 1))
            e = math.sqrt(float32(-2.0) * math.log(u1)) * math.cos(_TWO_PI * u2)
            root = math.sqrt(abs(e))
            f_eps[t] = root if e >= float32(0.0) else -root
        t += cuda.gridsize(1)


@register((_F2, _F2, _F1, _F1, _F1, _F2, _F1, int32))
@cuda.jit
def noisy_weights_kernel(mu_w, sig_w, mu_b, sig_b, f_eps, w, b, n_atoms):
    """w = mu_w + sig_w * f_in f_out, b = mu_b + sig_b * f_out (module header); t < n_in * q: w, then b."""
    n_in, q = w.shape[0], w.shape[1]
    t = cuda.grid(1)
    while t < (n_in + 1) * q:
        i = t // q
        o = t - i * q
        if i < n_in:
            fi, fo = noise_factors(f_eps, i, o, n_in, n_atoms)
            w[i, o] = mu_w[i, o] + sig_w[i, o] * (fi * fo)
        else:
            _, fo = noise_factors(f_eps, 0, o, n_in, n_atoms)
            b[o] = mu_b[o] + sig_b[o] * fo
        t += cuda.gridsize(1)


@register((_F2, _F1, _F1, _F2, _F1, int32))
@cuda.jit
def noisy_grads_kernel(g_w, g_b, f_eps, g_sig_w, g_sig_b, n_atoms):
    """g_sig_w = g_w * f_in f_out, g_sig_b = g_b * f_out (module header); t < n_in * q: weights, then bias."""
    n_in, q = g_w.shape[0], g_w.shape[1]
    t = cuda.grid(1)
    while t < (n_in + 1) * q:
        i = t // q
        o = t - i * q
        if i < n_in:
            fi, fo = noise_factors(f_eps, i, o, n_in, n_atoms)
            g_sig_w[i, o] = g_w[i, o] * (fi * fo)
        else:
            _, fo = noise_factors(f_eps, 0, o, n_in, n_atoms)
            g_sig_b[o] = g_b[o] * fo
        t += cuda.gridsize(1)


@register((int64[::1],))
@cuda.jit
def noise_tick(counter):
    """counter[0] += 1 (one thread): the next draw."""
    if cuda.grid(1) == 0:
        counter[0] += 1


def _head_shape(w: Any) -> tuple[int, int, int]:
    n_in, q = (int(d) for d in w.shape)
    z = n_atoms_of(q)
    if z < 1 or N_STREAMS * z + N_AUX != q:
        raise ValueError(f"a noisy head needs head_width(Z) = {N_STREAMS} * Z + {N_AUX} columns, got {q}")
    return n_in, q, z


def _check_counter(counter: Any) -> None:
    check_array("counter", counter, "[1]", (1,), np.int64)


def draw_noise(f_eps: Any, counter: Any, seed: int, stream_id: int, n_in: int, n_out: int, *, stream: Any) -> None:
    """f_eps [noise_len(n_in, n_out)] = the f(eps) of draw counter[0] of stream (seed, stream_id)."""
    _check_counter(counter)
    n = noise_len(n_in, n_out)
    check_array("f_eps", f_eps, "[N_BRANCHES * n_in + n_out]", (n,))
    launch_strided(noise_draw, n, f_eps, counter, np.uint64(seed % 2**64), i32(stream_id), i32(n_in),
                   i32(n_atoms_of(n_out)), stream=stream)


def noisy_weights(mu_w: Any, sig_w: Any, mu_b: Any, sig_b: Any, f_eps: Any, w: Any, b: Any, *, stream: Any) -> None:
    """The effective head weights w [p, q] and bias b [q] of one draw f_eps (module header)."""
    n_in, q, z = _head_shape(mu_w)
    for name, arr in (("sig_w", sig_w), ("w", w)):
        check_array(name, arr, "[p, q]", (n_in, q))
    for name, arr in (("mu_b", mu_b), ("sig_b", sig_b), ("b", b)):
        check_array(name, arr, "[q]", (q,))
    check_array("f_eps", f_eps, "[N_BRANCHES * p + q]", (noise_len(n_in, q),))
    launch_strided(noisy_weights_kernel, (n_in + 1) * q, mu_w, sig_w, mu_b, sig_b, f_eps, w, b, i32(z), stream=stream)


def noisy_grads(g_w: Any, g_b: Any, f_eps: Any, g_sig_w: Any, g_sig_b: Any, *, stream: Any) -> None:
    """sigma's gradients g_sig_w [p, q], g_sig_b [q] from the effective weights' g_w, g_b (module header)."""
    n_in, q, z = _head_shape(g_w)
    check_array("g_sig_w", g_sig_w, "[p, q]", (n_in, q))
    for name, arr in (("g_b", g_b), ("g_sig_b", g_sig_b)):
        check_array(name, arr, "[q]", (q,))
    check_array("f_eps", f_eps, "[N_BRANCHES * p + q]", (noise_len(n_in, q),))
    launch_strided(noisy_grads_kernel, (n_in + 1) * q, g_w, g_b, f_eps, g_sig_w, g_sig_b, i32(z), stream=stream)


def tick_noise(counter: Any, *, stream: Any) -> None:
    """counter[0] += 1: the draws after this launch are a new noise."""
    _check_counter(counter)
    launch_rows(noise_tick, 1, 1, counter, stream=stream)
