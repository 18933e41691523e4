"""Spectral normalisation of the trunk's dense layers (network.spectral_norm): power iteration, scale, gradient.

    spectral_power(w, u, v, sigma, layer, n_iters, stream=s)    n_iters power iterations on u, v; sigma[layer]
    spectral_scale(w, sigma, layer, w_sn, stream=s)              w_sn = w / sigma[layer]
    spectral_grad(g, w_sn, u, v, sigma, layer, stream=s)         g: dL/dW_sn in, dL/dW out (in place)
    spectral_epoch_stat(sigma, epoch, stream=s)                  epoch[SPECTRAL_SIGMA] += mean of sigma

W is stored [in, out] (y = x @ W + b), u is [out] and v [in]. One power iteration is v = normalise(W u), then
u = normalise(W^T v), with normalise(x) = x / max(|x|, SN_EPS). After n_iters of them (0: u and v are read, not
written) sigma = max(v^T W u, SN_EPS) and the layer reads W_sn = W / sigma (Miyato et al. 2018). Holding u and
v constant, d sigma / dW = v u^T, so with G = dL/dW_sn:

    dL/dW = (G - <G, W_sn> v u^T) / sigma,    <G, W_sn> = sum_ij G_ij W_sn_ij

The bias is not normalised.

Launch shapes: spectral_power and spectral_grad are one block (`launch_rows(.., 1, strided_threads(STATS_BLOCK))`)
each: a whole-matrix reduction, summed in float64 through a shared-memory tree in a fixed order (no atomics, so
the same bits on every run). In spectral_power thread t computes the rows t, t + blockDim, ... of W u and the
columns t, ... of W^T v (the latter coalesced); a trunk matrix (<= 256 x 256 here) costs a few microseconds.
spectral_scale is grid-stride over the elements; spectral_epoch_stat one thread. float32 literals throughout.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import cuda, float32, float64, int32

from fox_numba.device.launch import check_array, i32, launch_rows, launch_strided, strided_threads
from fox_numba.device.registry import register
from fox_numba.kernels.signals import STATS_BLOCK, EpochStat, check_epoch, tree_sums

SN_EPS = np.float32(1e-12)
"""Floor of a vector norm in normalise() and of sigma (an all-zero W divides by it, not by 0)."""

_F1 = float32[::1]
_F2 = float32[:, ::1]
_SIGMA = int(EpochStat.SPECTRAL_SIGMA)


@cuda.jit(device=True)
def _normalise(x, n, acc, tid):
    """x[0:n] /= max(|x|, SN_EPS), |x| from the per-thread squares in acc[0, tid]; every thread calls it."""
    tree_sums(acc, 1, tid)
    scale = float32(1.0) / max(float32(math.sqrt(acc[0, 0])), SN_EPS)
    cuda.syncthreads()  # every thread has read the norm before acc is written again
    k = tid
    while k < n:
        x[k] *= scale
        k += cuda.blockDim.x
    cuda.syncthreads()  # x is whole before any thread reads it


@register((_F2, _F1, _F1, _F1, int32, int32))
@cuda.jit
def spectral_power_kernel(w, u, v, sigma, layer, n_iters):
    """n_iters power iterations on (u, v), then sigma[layer] = max(v^T W u, SN_EPS) (module header); one block."""
    tid = cuda.threadIdx.x
    n_in, n_out = w.shape[0], w.shape[1]
    acc = cuda.shared.array((1, STATS_BLOCK), float64)
    for _ in range(n_iters):
        acc[0, tid] = float64(0.0)
        i = tid
        while i < n_in:  # v = W u
            t = float32(0.0)
            for j in range(n_out):
                t += w[i, j] * u[j]
            v[i] = t
            acc[0, tid] += float64(t) * float64(t)
            i += cuda.blockDim.x
        _normalise(v, n_in, acc, tid)
        acc[0, tid] = float64(0.0)
        j = tid
        while j < n_out:  # u = W^T v
            t = float32(0.0)
            for i in range(n_in):
                t += w[i, j] * v[i]
            u[j] = t
            acc[0, tid] += float64(t) * float64(t)
            j += cuda.blockDim.x
        _normalise(u, n_out, acc, tid)
    acc[0, tid] = float64(0.0)
    i = tid
    while i < n_in:  # sigma = v^T (W u)
        t = float32(0.0)
        for j in range(n_out):
            t += w[i, j] * u[j]
        acc[0, tid] += float64(v[i]) * float64(t)
        i += cuda.blockDim.x
    tree_sums(acc, 1, tid)
    if tid == 0:
        sigma[layer] = max(float32(acc[0, 0]), SN_EPS)


@register((_F2, _F1, int32, _F2))
@cuda.jit
def spectral_scale_kernel(w, sigma, layer, w_sn):
    """w_sn = w / sigma[layer], grid-stride over the elements."""
    n_out = w.shape[1]
    inv = float32(1.0) / sigma[layer]
    k = cuda.grid(1)
    while k < w.shape[0] * n_out:
        i = k // n_out
        j = k - i * n_out
        w_sn[i, j] = w[i, j] * inv
        k += cuda.gridsize(1)


@register((_F2, _F2, _F1, _F1, _F1, int32))
@cuda.jit
def spectral_grad_kernel(g, w_sn, u, v, sigma, layer):
    """g = (g - <g, w_sn> v u^T) / sigma[layer] in place (module header); one block."""
    tid = cuda.threadIdx.x
    n_out = g.shape[1]
    n = g.shape[0] * n_out
    acc = cuda.shared.array((1, STATS_BLOCK), float64)
    acc[0, tid] = float64(0.0)
    k = tid
    while k < n:
        i = k // n_out
        j = k - i * n_out
        acc[0, tid] += float64(g[i, j]) * float64(w_sn[i, j])
        k += cuda.blockDim.x
    tree_sums(acc, 1, tid)
    dot = float32(acc[0, 0])
    inv = float32(1.0) / sigma[layer]
    k = tid
    while k < n:
        i = k // n_out
        j = k - i * n_out
        g[i, j] = (g[i, j] - dot * (v[i] * u[j])) * inv
        k += cuda.blockDim.x


@register((_F1, float64[::1]))
@cuda.jit
def spectral_epoch_stat_kernel(sigma, epoch):
    """epoch[SPECTRAL_SIGMA] += the mean of sigma over the trunk layers (one thread)."""
    if cuda.grid(1) == 0:
        s = float64(0.0)
        for k in range(sigma.shape[0]):
            s += float64(sigma[k])
        epoch[_SIGMA] += s / float64(sigma.shape[0])


def _check_layer(w: Any, u: Any, v: Any, sigma: Any, layer: int) -> tuple[int, int]:
    n_in, n_out = (int(d) for d in w.shape)
    check_array("w", w, "[in, out]", (n_in, n_out))
    check_array("u", u, "[out]", (n_out,))
    check_array("v", v, "[in]", (n_in,))
    check_array("sigma", sigma, "[n_layers]", None)
    if not 0 <= layer < int(sigma.shape[0]):
        raise ValueError(f"layer {layer} is outside sigma's {int(sigma.shape[0])} layers")
    return n_in, n_out


def spectral_power(w: Any, u: Any, v: Any, sigma: Any, layer: int, n_iters: int, *, stream: Any) -> None:
    """`n_iters` power iterations on u [out], v [in] of w [in, out] (0: read only), then sigma[layer]."""
    _check_layer(w, u, v, sigma, layer)
    if n_iters < 0:
        raise ValueError(f"spectral_power: n_iters must be >= 0, got {n_iters}")
    launch_rows(spectral_power_kernel, 1, strided_threads(STATS_BLOCK), w, u, v, sigma, i32(layer), i32(n_iters),
                stream=stream)


def spectral_scale(w: Any, sigma: Any, layer: int, w_sn: Any, *, stream: Any) -> None:
    """w_sn [in, out] = w / sigma[layer]."""
    n_in, n_out = (int(d) for d in w.shape)
    check_array("w", w, "[in, out]", (n_in, n_out))
    check_array("w_sn", w_sn, "[in, out]", (n_in, n_out))
    check_array("sigma", sigma, "[n_layers]", None)
    launch_strided(spectral_scale_kernel, n_in * n_out, w, sigma, i32(layer), w_sn, stream=stream)


def spectral_grad(g: Any, w_sn: Any, u: Any, v: Any, sigma: Any, layer: int, *, stream: Any) -> None:
    """g [in, out]: dL/dW_sn in, dL/dW out, with the u, v and sigma[layer] of the forward (module header)."""
    n_in, n_out = _check_layer(g, u, v, sigma, layer)
    check_array("w_sn", w_sn, "[in, out]", (n_in, n_out))
    launch_rows(spectral_grad_kernel, 1, strided_threads(STATS_BLOCK), g, w_sn, u, v, sigma, i32(layer),
                stream=stream)


def spectral_epoch_stat(sigma: Any, epoch: Any, *, stream: Any) -> None:
    """epoch[SPECTRAL_SIGMA] += mean(sigma) (the learner's online sigma, once per step)."""
    check_array("sigma", sigma, "[n_layers]", None)
    check_epoch(epoch)
    launch_rows(spectral_epoch_stat_kernel, 1, 1, sigma, epoch, stream=stream)
