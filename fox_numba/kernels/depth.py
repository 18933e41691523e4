"""Residual trunk blocks and stochastic depth (network.residual, network.stochastic_depth): forward and backward.

    depth_factors(d, state, seed, layer, rate, stream=s)     d [rows]: 0 or 1 / (1 - rate), per row (training)
    residual_add(x, h, d, y, stream=s)                        y = x + d[r] * h           (the block's output)
    residual_branch_grad(g, d, h, dz, stream=s)               dz = g * d[r] * (h > 0)    (the branch's input)
    residual_skip_grad(dx, g, x, mask, stream=s)              dx = (dx + g) * (x > 0 if mask else 1)

A residual block of trunk layer l is y = x + d_r * h, h = relu(x W + b) (the dense kernels write h), for each
row r. In training with stochastic depth d_r is a per-row Bernoulli keep factor: row r drops the branch (d_r = 0)
when u < rate, else d_r = 1 / (1 - rate), where u = the dropout hash (kernels/dropout.py `hash_uniform`) of
(seed, state[0].step, DEPTH_KEY + l, r): a function of the seed and the step counter read on the device, new at
every replay of a captured step, no random state. The inverted scaling keeps the branch's expected value, so
acting and the target network use d_r = 1 (no draw). Backward, with g = dL/dy: the branch's pre-activation
gradient is dz = g d_r (h > 0) (its weight gradient and input gradient dz W^T come from the dense kernels) and
dL/dx = g + dz W^T, masked by the block input's own ReLU (x > 0) when that input is a plain layer's output.

Launch shapes: one thread per element (`launch`); float32 literals.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import cuda, float32, from_dtype, int32, uint64

from fox_numba.device.launch import check_array, i32, launch
from fox_numba.device.registry import register
from fox_numba.kernels.dropout import hash_uniform, keep_scale
from fox_numba.kernels.optim import OPTIM_STATE_DTYPE, check_state

DEPTH_KEY = 1 << 20
"""Added to the layer index in the hash key, so the depth draws never share a key with dropout's (layers < 2**20)."""

_STATE = from_dtype(OPTIM_STATE_DTYPE)
_F1 = float32[::1]
_F2 = float32[:, ::1]


@register((_F1, _STATE[::1], uint64, int32, float32, float32))
@cuda.jit
def depth_factors_kernel(d, state, seed, layer, rate, keep):
    """d[r] = 0 where row r's u < rate, else keep = 1 / (1 - rate) (module header)."""
    r = cuda.grid(1)
    if r < d.shape[0]:
        u = hash_uniform(seed, state[0].step, layer + DEPTH_KEY, r)
        d[r] = float32(0.0) if u < rate else keep


@register((_F2, _F2, _F1, _F2))
@cuda.jit
def residual_add_kernel(x, h, d, y):
    """y[r, c] = x[r, c] + d[r] * h[r, c]."""
    i = cuda.grid(1)
    cols = x.shape[1]
    if i < x.shape[0] * cols:
        r, c = i // cols, i % cols
        y[r, c] = x[r, c] + d[r] * h[r, c]


@register((_F2, _F1, _F2, _F2))
@cuda.jit
def residual_branch_grad_kernel(g, d, h, dz):
    """dz[r, c] = g[r, c] * d[r] where h[r, c] > 0, else 0 (over dz's rows: the backward's first rows)."""
    i = cuda.grid(1)
    cols = dz.shape[1]
    if i < dz.shape[0] * cols:
        r, c = i // cols, i % cols
        dz[r, c] = g[r, c] * d[r] if h[r, c] > float32(0.0) else float32(0.0)


@register((_F2, _F2, _F2, int32))
@cuda.jit
def residual_skip_grad_kernel(dx, g, x, mask):
    """dx[r, c] = dx[r, c] + g[r, c], then 0 where mask != 0 and x[r, c] <= 0."""
    i = cuda.grid(1)
    cols = dx.shape[1]
    if i < dx.shape[0] * cols:
        r, c = i // cols, i % cols
        if mask != 0 and not x[r, c] > float32(0.0):
            dx[r, c] = float32(0.0)
        else:
            dx[r, c] += g[r, c]


def drop_rate(rate: float, layer: int, n_layers: int) -> float:
    """Drop probability of trunk layer `layer`'s block: rate * layer / (n_layers - 1), linear in depth with the
    last layer at `rate` (Huang et al. 2016); the blocks are layers 1 .. n_layers - 1."""
    if not 1 <= layer < n_layers:
        raise ValueError(f"trunk layer {layer} of {n_layers} is not a residual block (layers 1 .. n_layers - 1)")
    return rate * layer / (n_layers - 1)


def depth_factors(d: Any, state: Any, seed: int, layer: int, rate: float, *, stream: Any) -> None:
    """d [rows] = this step's keep factors of trunk layer `layer`'s block at drop probability `rate`."""
    check_array("d", d, "[rows]", None)
    check_state(state)
    launch(depth_factors_kernel, int(d.shape[0]), d, state, np.uint64(seed % 2**64), i32(layer), np.float32(rate),
           keep_scale(rate), stream=stream)


def _check_rows(names: tuple[str, ...], arrays: tuple[Any, ...], shape: tuple[int, int]) -> None:
    for name, arr in zip(names, arrays, strict=True):
        check_array(name, arr, "[rows, H]", shape)


def residual_add(x: Any, h: Any, d: Any, y: Any, *, stream: Any) -> None:
    """y [rows, H] = x + d[:, None] * h."""
    shape = tuple(int(n) for n in x.shape)
    _check_rows(("x", "h", "y"), (x, h, y), shape)
    check_array("d", d, "[rows]", (shape[0],))
    launch(residual_add_kernel, shape[0] * shape[1], x, h, d, y, stream=stream)


def residual_branch_grad(g: Any, d: Any, h: Any, dz: Any, *, stream: Any) -> None:
    """dz [G, H] = g * d[:G, None] * (h[:G] > 0); h and d may hold more rows than the backward's G."""
    shape = tuple(int(n) for n in dz.shape)
    _check_rows(("g", "dz"), (g, dz), shape)
    check_array("h", h, "[rows, H]", None)
    check_array("d", d, "[rows]", None)
    if int(h.shape[0]) < shape[0] or int(h.shape[1]) != shape[1] or int(d.shape[0]) < shape[0]:
        raise ValueError(f"residual_branch_grad: h {tuple(h.shape)} and d {tuple(d.shape)} must cover dz {shape}")
    launch(residual_branch_grad_kernel, shape[0] * shape[1], g, d, h, dz, stream=stream)


def residual_skip_grad(dx: Any, g: Any, x: Any, *, mask: bool, stream: Any) -> None:
    """dx [G, H] += g, then masked by x > 0 when the block's input x is a plain ReLU layer's output (`mask`)."""
    shape = tuple(int(n) for n in dx.shape)
    _check_rows(("dx", "g", "x"), (dx, g, x), shape)
    launch(residual_skip_grad_kernel, shape[0] * shape[1], dx, g, x, i32(int(mask)), stream=stream)
