"""Variable-selection gate of the observation (network.vsn; agent/vsn.py): softmax, gating, gradient, focus signals.

    vsn_softmax(g, stream=s)                                 g [R, K]: gate logits in, softmax weights out (in place)
    vsn_apply(x, w, ends, xg, stream=s)                      xg[r, c] = K * w[r, k(c)] * x[r, c]
    vsn_gate_grad(dxg, x, w, begins, ends, dg, stream=s)     dg [G, K] = dL/d(gate logits) from dxg = dL/dxg
    vsn_focus(w, isv, n_rows=G, stream=s)                    ISV[VSN_FOCUS_MAX_EMA], ISV[VSN_FOCUS_ENTROPY_EMA]

The K groups are contiguous column ranges [begins[k], ends[k]) that tile the observation's D columns in order
(begins[0] = 0, ends[k] = begins[k + 1], ends[K - 1] = D; agent/vsn.py checks it), so column c belongs to the first
group k with c < ends[k]. With the logits g = x W_g + b_g (a dense layer, agent/dense.py) and w = softmax(g) per row,
the gated input is xg_c = K w_k(c) x_c: uniform weights (w = 1 / K) give back x. Backward, from dxg = dL/dxg:

    dL/dw_k = K * sum_{c in group k} dxg_c x_c,    dL/dg_k = w_k (dL/dw_k - sum_j w_j dL/dw_j)

(the softmax Jacobian), and the dense weight gradient gives dL/dW_g = x^T dL/dg, dL/db_g = sum over rows. The
observation is data, so its own gradient (K w dxg + dL/dg W_g^T) is not computed.

Focus signals (the learner's online network, every step, over the s rows): m = the batch mean of max_k w_k and
h = the batch mean of the gate entropy -sum_k w_k ln w_k divided by ln K. m is clamped to [1/K, 1] (1/K: a uniform
gate; 1: every row reads one group) and h to [0, 1] (1: uniform; 0: one group), then each is folded into its ISV
slot as an EMA with alpha VSN_ALPHA; while ISV[VSN_FOCUS_MAX_EMA] is 0 (no observation yet: m >= 1/K > 0) the first
observation seeds both slots. A non-finite observation moves neither slot.

Launch shapes: vsn_softmax and vsn_gate_grad one thread per row (K and D are small: K <= MAX_GROUPS, D the
observation's ~130 columns); vsn_apply one thread per element; vsn_focus one block
(`launch_rows(.., 1, strided_threads(STATS_BLOCK))`): thread t sums the rows t, t + blockDim, ... in float64, in
order, then a shared-memory tree (deterministic, no atomics). float32 literals throughout.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import cuda, float32, float64, int32

from fox_numba.device.isv import ISV_TOTAL_DIM, Isv
from fox_numba.device.launch import check_array, i32, launch, launch_rows, strided_threads
from fox_numba.device.registry import register
from fox_numba.kernels.signals import STATS_BLOCK, finite, tree_sums

MAX_GROUPS = 16
"""Most gate groups a layout may have (the observation has 5, or 6 with forecast columns)."""
VSN_ALPHA = np.float32(0.01)
"""EMA weight of the focus signals."""

_FOCUS_MAX = int(Isv.VSN_FOCUS_MAX_EMA)
_FOCUS_ENTROPY = int(Isv.VSN_FOCUS_ENTROPY_EMA)
_F1 = float32[::1]
_F2 = float32[:, ::1]
_I1 = int32[::1]


@register((_F2,))
@cuda.jit
def vsn_softmax_kernel(g):
    """g[r, :] = softmax(g[r, :]) in place (max subtracted), one thread per row."""
    r = cuda.grid(1)
    if r < g.shape[0]:
        n = g.shape[1]
        top = g[r, 0]
        for k in range(1, n):
            top = max(top, g[r, k])
        total = float32(0.0)
        for k in range(n):
            e = math.exp(g[r, k] - top)
            g[r, k] = e
            total += e
        inv = float32(1.0) / total
        for k in range(n):
            g[r, k] *= inv


@register((_F2, _F2, _I1, _F2))
@cuda.jit
def vsn_apply_kernel(x, w, ends, xg):
    """xg[r, c] = K * w[r, k] * x[r, c], k the group of column c (the first with c < ends[k])."""
    i = cuda.grid(1)
    cols = x.shape[1]
    if i < x.shape[0] * cols:
        r = i // cols
        c = i - r * cols
        n = w.shape[1]
        k = 0
        while k < n - 1 and c >= ends[k]:
            k += 1
        xg[r, c] = (float32(n) * w[r, k]) * x[r, c]


@register((_F2, _F2, _F2, _I1, _I1, _F2))
@cuda.jit
def vsn_gate_grad_kernel(dxg, x, w, begins, ends, dg):
    """dg[r, k] = w_k (dw_k - sum_j w_j dw_j), dw_k = K sum_{c in group k} dxg[r, c] x[r, c]; one thread per row
    of dg (the backward's first rows of x and w)."""
    r = cuda.grid(1)
    if r < dg.shape[0]:
        n = dg.shape[1]
        dot = float32(0.0)
        for k in range(n):
            s = float32(0.0)
            for c in range(begins[k], ends[k]):
                s += dxg[r, c] * x[r, c]
            s *= float32(n)
            dg[r, k] = s
            dot += w[r, k] * s
        for k in range(n):
            dg[r, k] = w[r, k] * (dg[r, k] - dot)


@register((_F2, int32, _F1))
@cuda.jit
def vsn_focus_kernel(w, n_rows, isv):
    """The focus EMAs of the first n_rows rows of the gate weights w [rows, K] (module header); one block."""
    tid = cuda.threadIdx.x
    acc = cuda.shared.array((2, STATS_BLOCK), float64)
    acc[0, tid] = float64(0.0)
    acc[1, tid] = float64(0.0)
    n = w.shape[1]
    r = tid
    while r < n_rows:
        top = float64(0.0)
        h = float64(0.0)
        for k in range(n):
            p = float64(w[r, k])
            if math.isnan(p) or p > top:  # a NaN weight stays in top (max() would drop it) and skips the EMAs
                top = p
            if p > float64(0.0):
                h -= p * math.log(p)
        acc[0, tid] += top
        acc[1, tid] += h
        r += cuda.blockDim.x
    tree_sums(acc, 2, tid)
    if tid == 0:
        m = acc[0, 0] / float64(n_rows)
        h = acc[1, 0] / (float64(n_rows) * math.log(float64(n)))
        if finite(m) and finite(h):
            m32 = float32(min(max(m, float64(1.0) / float64(n)), float64(1.0)))
            h32 = float32(min(max(h, float64(0.0)), float64(1.0)))
            if isv[_FOCUS_MAX] == float32(0.0):
                isv[_FOCUS_MAX] = m32
                isv[_FOCUS_ENTROPY] = h32
            else:
                isv[_FOCUS_MAX] += VSN_ALPHA * (m32 - isv[_FOCUS_MAX])
                isv[_FOCUS_ENTROPY] += VSN_ALPHA * (h32 - isv[_FOCUS_ENTROPY])


def _check_groups(begins: Any, ends: Any, n_groups: int) -> None:
    check_array("begins", begins, "[K]", (n_groups,), np.int32)
    check_array("ends", ends, "[K]", (n_groups,), np.int32)


def _check_weights(w: Any, rows: int) -> int:
    check_array("w", w, "[rows, K]", None)
    n_groups = int(w.shape[1])
    if not 2 <= n_groups <= MAX_GROUPS or int(w.shape[0]) < rows:
        raise ValueError(f"gate weights of shape {tuple(w.shape)}: need 2 <= K <= {MAX_GROUPS} and >= {rows} rows")
    return n_groups


def vsn_softmax(g: Any, *, stream: Any) -> None:
    """g [R, K]: the gate logits become their per-row softmax weights."""
    _check_weights(g, 1)
    launch(vsn_softmax_kernel, int(g.shape[0]), g, stream=stream)


def vsn_apply(x: Any, w: Any, ends: Any, xg: Any, *, stream: Any) -> None:
    """xg [R, D] = the gated observation of x [R, D] under the weights w [R, K] of groups ending at ends [K]."""
    rows, cols = (int(d) for d in x.shape)
    check_array("x", x, "[R, D]", (rows, cols))
    check_array("xg", xg, "[R, D]", (rows, cols))
    n_groups = _check_weights(w, rows)
    check_array("ends", ends, "[K]", (n_groups,), np.int32)
    launch(vsn_apply_kernel, rows * cols, x, w, ends, xg, stream=stream)


def vsn_gate_grad(dxg: Any, x: Any, w: Any, begins: Any, ends: Any, dg: Any, *, stream: Any) -> None:
    """dg [G, K] = dL/d(gate logits) of the first G rows, from dxg [G, D] = dL/d(gated input); x [G, D] is the
    observation and w [G, K] the gate weights of those rows."""
    rows, cols = (int(d) for d in dxg.shape)
    check_array("dxg", dxg, "[G, D]", (rows, cols))
    check_array("x", x, "[G, D]", (rows, cols))
    n_groups = _check_weights(w, rows)
    check_array("w", w, "[G, K]", (rows, n_groups))
    check_array("dg", dg, "[G, K]", (rows, n_groups))
    _check_groups(begins, ends, n_groups)
    launch(vsn_gate_grad_kernel, rows, dxg, x, w, begins, ends, dg, stream=stream)


def vsn_focus(w: Any, isv: Any, *, n_rows: int, stream: Any) -> None:
    """Fold the focus of the first n_rows rows of the gate weights w [rows, K] into the ISV (module header)."""
    _check_weights(w, n_rows)
    check_array("isv", isv, "[ISV_TOTAL_DIM]", (ISV_TOTAL_DIM,))
    if n_rows < 1:
        raise ValueError(f"vsn_focus: n_rows must be >= 1, got {n_rows}")
    launch_rows(vsn_focus_kernel, 1, strided_threads(STATS_BLOCK), w, i32(n_rows), isv, stream=stream)
