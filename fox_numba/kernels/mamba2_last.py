"""Mamba2 (SSD) read at one bar: the block's output at each window's last bar only (agent/mamba2.py's encoder, whose
network reads nothing else), forward and backward, without the [P, N] state.

    mamba2_last_weights(zxbcdt, heads, kappa, alpha, seq_len=T, state_dim=N, stream=s)   kappa, alpha [S T, H]
    mamba2_last_readout(zxbcdt, heads, kappa, y, gated, seq_len=T, state_dim=N, stream=s)  y, gated [S, HP]
    mamba2_last_backward(zxbcdt, heads, kappa, alpha, y, dgated, dy, w, dc, dzxbcdt, part, seq_len=T,
                         state_dim=N, stream=s)     dy [G, HP]; every column of dzxbcdt [G T, W]; part [G, 3H]

The model and the column layout of zxbcdt are kernels/mamba2.py's (z | x | B | C | dt_raw, heads = a_log, D, dt_bias,
A = -exp(a_log), dt_t = softplus(dt_raw_t + dt_bias)). Read at the last bar L = T - 1 only, C is the one vector C_L, so
the recurrence h_t = a_t h_{t-1} + dt_t x_t B_t^T unrolls, per head, into a weighted sum of the window's inputs:

    y_L = sum_t kappa_t x_t + D x_L,   kappa_t = dt_t alpha_t c_t,   alpha_t = exp(A sum_{u>t} dt_u),  c_t = B_t . C_L
    gated = y_L silu(z_L)

which costs T (N + P) multiply-adds per (window, head) against the scan's 3 T P N, keeps no state, and needs no
barrier. Backward, from dy = dL/dy_L = dL/d(gated) silu(z_L) (and dz_L = dL/d(gated) y_L silu'(z_L)), per window:

    w_t = dy . x_t (per head)          dx_t = kappa_t dy, plus D dy at t = L
    dc_t = sum_h w_t dt_t alpha_t      dB_t = dc_t C_L,   dC_L = sum_t dc_t B_t
    d dt_t = w_t alpha_t c_t + A sum_{s<t} w_s kappa_s       (alpha_s holds dt_t for every s < t)
    d a_log = A sum_t w_t kappa_t sum_{u>t} dt_u = A sum_u dt_u sum_{t<u} w_t kappa_t
    dD = dy . x_L,   d dt_raw = d dt sigmoid(dt_raw + dt_bias),   d dt_bias = sum_t d dt_raw_t

and z and C take no gradient at the other bars (those columns of dzxbcdt are written 0). The scan's equality with this
form is checked in float64 (tests/kernels/test_mamba2_last.py reads kernels/mamba2.py's references at the last bar).

Launch shapes: mamba2_last_weights and the backward's dt pass, one thread per (window, head), in time (suffix sums
backwards, prefix sums forwards); the readout and the gate's backward, one thread per element of [S, HP] (coalesced
over the columns); the inputs' backward, one block per row (window, bar) for dx and z's zeros (a thread per column,
coalesced) and one thread per row for w, dc and dB, heads in order so dc_t sums them without atomics; dC, one
thread per (window, n). Every sum runs in a fixed order: the same bits on every run. The part [G, 3H] is reduced by
kernels/mamba2.py's mamba2_head_grad. The weights, readout and inputs-backward kernels index
in uint32 (`u32`, kernels/head_rows.py's header: no negative-index wrap, no 64-bit arithmetic; the inputs backward's
PTX held 632 64-bit operations, 285 now), the same sums in the same order.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import cuda, float32, int32

from fox_numba.device.launch import check_array, i32, launch, launch_rows
from fox_numba.device.registry import register
from fox_numba.device.runtime import u32
from fox_numba.kernels.mamba2 import A_LOG, D_SKIP, DT_BIAS, N_HEAD_PARAMS, in_width, sigmoid, softplus

_ONE = np.uint32(1)
DX_THREADS = 256
"""Most threads of mamba2_last_dx_kernel's block (one row's 2 HP columns; more columns loop)."""
_F1 = float32[::1]
_F2 = float32[:, ::1]


@register((_F2, _F2, _F2, _F2, int32, int32))
@cuda.jit
def mamba2_last_weights_kernel(zxbcdt, heads, kappa, alpha, seq_len, state_dim):
    """kappa[r, h] and alpha[r, h] of every bar r of window b = i // H, head h = i % H (module header)."""
    i = u32(cuda.grid(1))
    n_heads = u32(heads.shape[1])
    t_len, n_state = u32(seq_len), u32(state_dim)
    if i < u32(u32(kappa.shape[0]) // t_len * n_heads):
        b = u32(i // n_heads)
        hd = u32(i - b * n_heads)
        b_col = u32(u32(zxbcdt.shape[1]) - n_state - n_state - n_heads)
        c_col = u32(b_col + n_state)
        dt_col = u32(c_col + n_state + hd)
        a = -math.exp(heads[A_LOG, hd])
        dt_bias = heads[DT_BIAS, hd]
        last = u32(b * t_len + t_len - _ONE)
        after = float32(0.0)  # sum of dt over the later bars
        k_rev = u32(0)
        while k_rev < t_len:
            row = u32(last - k_rev)
            dt = softplus(zxbcdt[row, dt_col] + dt_bias)
            c = float32(0.0)
            n = u32(0)
            while n < n_state:
                c += zxbcdt[row, u32(b_col + n)] * zxbcdt[last, u32(c_col + n)]
                n = u32(n + _ONE)
            decay = math.exp(a * after)
            alpha[row, hd] = decay
            kappa[row, hd] = dt * decay * c
            after += dt
            k_rev = u32(k_rev + _ONE)


@register((_F2, _F2, _F2, _F2, _F2, int32))
@cuda.jit
def mamba2_last_readout_kernel(zxbcdt, heads, kappa, y, gated, seq_len):
    """y[b, j] = sum_t kappa[(b, t), h] x_t[j] + D_h x_L[j] and gated = y silu(z_L[j]), h = j // P; one thread per
    element of y [S, HP]."""
    i = u32(cuda.grid(1))
    hp = u32(y.shape[1])
    t_len = u32(seq_len)
    if i < u32(u32(y.shape[0]) * hp):
        b = u32(i // hp)
        j = u32(i - b * hp)
        hd = u32(j // u32(hp // u32(heads.shape[1])))
        acc = float32(0.0)
        row = u32(b * t_len)
        last = u32(row + t_len - _ONE)
        while row <= last:
            acc += kappa[row, hd] * zxbcdt[row, u32(hp + j)]
            row = u32(row + _ONE)
        v = acc + heads[D_SKIP, hd] * zxbcdt[last, hp + j]
        z = zxbcdt[last, j]
        y[b, j] = v
        gated[b, j] = v * (z * sigmoid(z))


@register((_F2, _F2, _F2, _F2, _F2, int32))
@cuda.jit
def mamba2_last_gate_bwd_kernel(zxbcdt, y, dgated, dy, dzxbcdt, seq_len):
    """dy = dgated silu(z_L), and dz_L = dgated y silu'(z_L) into the last bar's z columns of dzxbcdt; one thread per
    element of dgated [G, HP]."""
    i = cuda.grid(1)
    hp = dgated.shape[1]
    if i < dgated.shape[0] * hp:
        b = i // hp
        j = i - b * hp
        last = b * seq_len + seq_len - 1
        z = zxbcdt[last, j]
        sg = sigmoid(z)
        g = dgated[b, j]
        dy[b, j] = g * (z * sg)
        dzxbcdt[last, j] = g * y[b, j] * (sg * (float32(1.0) + z * (float32(1.0) - sg)))


@register((_F2, _F2, _F2, _F2, _F2, int32))
@cuda.jit
def mamba2_last_dx_kernel(zxbcdt, heads, kappa, dy, dzxbcdt, seq_len):
    """The z and x columns c < 2 HP of dzxbcdt at row r = blockIdx.x = (window b, bar t), a thread per column: dx_t[j]
    = (kappa[r, h] + D_h at the last bar) dy[b, j] (c = HP + j, h = j // P), and 0 into z at the bars before the
    last."""
    r = u32(cuda.blockIdx.x)
    hp = u32(dy.shape[1])
    head_dim = u32(hp // u32(heads.shape[1]))
    t_len = u32(seq_len)
    b = u32(r // t_len)
    is_last = r == u32(b * t_len + t_len - _ONE)
    c = u32(cuda.threadIdx.x)
    while c < u32(hp + hp):
        if c < hp:
            if not is_last:
                dzxbcdt[r, c] = float32(0.0)
        else:
            j = u32(c - hp)
            hd = u32(j // head_dim)
            scale = kappa[r, hd] + (heads[D_SKIP, hd] if is_last else float32(0.0))
            dzxbcdt[r, c] = scale * dy[b, j]
        c = u32(c + u32(cuda.blockDim.x))


@register((_F2, _F2, _F2, _F2, _F2, _F2, _F2, _F1, int32, int32))
@cuda.jit
def mamba2_last_inputs_bwd_kernel(zxbcdt, heads, kappa, alpha, dy, dzxbcdt, w, dc, seq_len, state_dim):
    """For row r = (window b, bar t): w[r, h] = dy_h . x_t, dc[r] (heads in order), dB_t; 0 into C at the bars
    before the last (x and z: mamba2_last_dx_kernel). One thread per row."""
    r = u32(cuda.grid(1))
    if r < u32(w.shape[0]):
        n_heads = u32(heads.shape[1])
        hp = u32(dy.shape[1])
        head_dim = u32(hp // n_heads)
        t_len, n_state = u32(seq_len), u32(state_dim)
        b = u32(r // t_len)
        last = u32(b * t_len + t_len - _ONE)
        b_col = u32(hp + hp)
        c_col = u32(b_col + n_state)
        dt_col = u32(c_col + n_state)
        dcs = float32(0.0)
        hd = u32(0)
        while hd < n_heads:
            dt = softplus(zxbcdt[r, u32(dt_col + hd)] + heads[DT_BIAS, hd])
            ww = float32(0.0)
            j = u32(hd * head_dim)
            end = u32(j + head_dim)
            while j < end:
                ww += dy[b, j] * zxbcdt[r, u32(hp + j)]
                j = u32(j + _ONE)
            w[r, hd] = ww
            dcs += ww * dt * alpha[r, hd]
            hd = u32(hd + _ONE)
        dc[r] = dcs
        n = u32(0)
        while n < n_state:
            dzxbcdt[r, u32(b_col + n)] = dcs * zxbcdt[last, u32(c_col + n)]
            n = u32(n + _ONE)
        if r != last:
            n = u32(0)
            while n < n_state:
                dzxbcdt[r, u32(c_col + n)] = float32(0.0)
                n = u32(n + _ONE)


@register((_F2, _F2, _F2, _F2, _F2, _F2, _F2, _F2, int32, int32))
@cuda.jit
def mamba2_last_dt_bwd_kernel(zxbcdt, heads, kappa, alpha, dy, w, dzxbcdt, part, seq_len, state_dim):
    """For window b = i // H, head h = i % H, in time: d dt_raw into dzxbcdt's dt column, and the window's shares
    part[b, k H + h] of d a_log (k = 0), dD (1) and d dt_bias (2)."""
    i = cuda.grid(1)
    n_heads = heads.shape[1]
    if i < part.shape[0] * n_heads:
        b = i // n_heads
        hd = i - b * n_heads
        hp = dy.shape[1]
        head_dim = hp // n_heads
        b_col = 2 * hp
        c_col = b_col + state_dim
        dt_col = c_col + state_dim + hd
        a = -math.exp(heads[A_LOG, hd])
        dt_bias = heads[DT_BIAS, hd]
        last = b * seq_len + seq_len - 1
        before = float32(0.0)  # sum over the earlier bars of w kappa
        d_a = float32(0.0)
        dbias = float32(0.0)
        for t in range(seq_len):
            row = b * seq_len + t
            v = zxbcdt[row, dt_col] + dt_bias
            dt = softplus(v)
            c = float32(0.0)
            for n in range(state_dim):
                c += zxbcdt[row, b_col + n] * zxbcdt[last, c_col + n]
            ww = w[row, hd]
            d_raw = (ww * alpha[row, hd] * c + a * before) * sigmoid(v)
            dzxbcdt[row, dt_col] = d_raw
            dbias += d_raw
            d_a += dt * before
            before += ww * kappa[row, hd]
        dd = float32(0.0)
        for p in range(head_dim):
            j = hd * head_dim + p
            dd += dy[b, j] * zxbcdt[last, hp + j]
        part[b, A_LOG * n_heads + hd] = a * d_a
        part[b, D_SKIP * n_heads + hd] = dd
        part[b, DT_BIAS * n_heads + hd] = dbias


@register((_F2, _F2, _F1, _F2, int32, int32))
@cuda.jit
def mamba2_last_dc_kernel(zxbcdt, heads, dc, dzxbcdt, seq_len, state_dim):
    """dC_L[n] = sum_t dc[(b, t)] B_t[n] into the last bar's C columns; one thread per (window b, n)."""
    i = cuda.grid(1)
    if i < dc.shape[0] // seq_len * state_dim:
        b = i // state_dim
        n = i - b * state_dim
        b_col = zxbcdt.shape[1] - 2 * state_dim - heads.shape[1]
        acc = float32(0.0)
        for t in range(seq_len):
            row = b * seq_len + t
            acc += dc[row] * zxbcdt[row, b_col + n]
        dzxbcdt[b * seq_len + seq_len - 1, b_col + state_dim + n] = acc


def _dims(zxbcdt: Any, heads: Any, seq_len: int, state_dim: int) -> tuple[int, int, int]:
    """(windows, heads, HP) of zxbcdt [S T, 2HP + 2N + H] and heads [3, H], checked."""
    check_array("heads", heads, "[3, H]", None)
    check_array("zxbcdt", zxbcdt, "[S T, 2HP + 2N + H]", None)
    shape = tuple(int(d) for d in heads.shape)
    n_heads = shape[1] if len(shape) == 2 else 0
    rows, width = (int(d) for d in zxbcdt.shape)
    hp = (width - 2 * state_dim - n_heads) // 2
    if (shape[0] != N_HEAD_PARAMS or n_heads < 1 or hp < n_heads or hp % n_heads or seq_len < 1 or state_dim < 1
            or rows % seq_len or width != in_width(n_heads, hp // n_heads, state_dim)):
        raise ValueError(f"mamba2_last: need heads [3, H] and zxbcdt [S T, 2HP + 2N + H] of whole windows of "
                         f"T = {seq_len} bars with N = {state_dim} and H dividing HP; got heads "
                         f"{tuple(heads.shape)}, zxbcdt {(rows, width)}")
    return rows // seq_len, n_heads, hp


def mamba2_last_weights(zxbcdt: Any, heads: Any, kappa: Any, alpha: Any, *, seq_len: int, state_dim: int,
                        stream: Any) -> None:
    """kappa, alpha [S T, H]: each bar's weight in the last bar's output and its decay to the last bar."""
    windows, n_heads, _ = _dims(zxbcdt, heads, seq_len, state_dim)
    for name, arr in (("kappa", kappa), ("alpha", alpha)):
        check_array(name, arr, "[S T, H]", (windows * seq_len, n_heads))
    launch(mamba2_last_weights_kernel, windows * n_heads, zxbcdt, heads, kappa, alpha, i32(seq_len), i32(state_dim),
           stream=stream)


def mamba2_last_readout(zxbcdt: Any, heads: Any, kappa: Any, y: Any, gated: Any, *, seq_len: int, state_dim: int,
                        stream: Any) -> None:
    """y [S, HP] = the last bar's SSM output and gated = y silu(z_L), from mamba2_last_weights' kappa."""
    windows, n_heads, hp = _dims(zxbcdt, heads, seq_len, state_dim)
    check_array("kappa", kappa, "[S T, H]", (windows * seq_len, n_heads))
    check_array("y", y, "[S, HP]", (windows, hp))
    check_array("gated", gated, "[S, HP]", (windows, hp))
    launch(mamba2_last_readout_kernel, windows * hp, zxbcdt, heads, kappa, y, gated, i32(seq_len), stream=stream)


def mamba2_last_backward(zxbcdt: Any, heads: Any, kappa: Any, alpha: Any, y: Any, dgated: Any, dy: Any, w: Any,
                         dc: Any, dzxbcdt: Any, part: Any, *, seq_len: int, state_dim: int, stream: Any) -> None:
    """From dgated [G, HP] = dL/d(gated) of the first G windows (after the forward over zxbcdt's windows, whose
    rows, kappa, alpha and y may hold more): dy [G, HP], every column of dzxbcdt [G T, W] and the per-window head
    gradients part [G, 3H] (mamba2_head_grad sums them); w [G T, H] and dc [G T] are scratch."""
    windows, n_heads, hp = _dims(zxbcdt, heads, seq_len, state_dim)
    check_array("dgated", dgated, "[G, HP]", None)
    grad = int(dgated.shape[0])
    if not 1 <= grad <= windows:
        raise ValueError(f"mamba2_last_backward: dgated has {grad} windows, the forward {windows}")
    rows = grad * seq_len
    for name, arr in (("kappa", kappa), ("alpha", alpha)):
        check_array(name, arr, "[S T, H]", (windows * seq_len, n_heads))
    for name, arr in (("y", y), ("dgated", dgated), ("dy", dy)):
        check_array(name, arr, "[S, HP]", (windows if name == "y" else grad, hp))
    check_array("w", w, "[G T, H]", (rows, n_heads))
    check_array("dc", dc, "[G T]", (rows,))
    check_array("dzxbcdt", dzxbcdt, "[G T, W]", (rows, int(zxbcdt.shape[1])))
    check_array("part", part, "[G, 3H]", (grad, N_HEAD_PARAMS * n_heads))
    zx = zxbcdt if grad == windows else zxbcdt[:rows]
    t, n = i32(seq_len), i32(state_dim)
    launch(mamba2_last_gate_bwd_kernel, grad * hp, zx, y, dgated, dy, dzxbcdt, t, stream=stream)
    launch_rows(mamba2_last_dx_kernel, rows, min(2 * hp, DX_THREADS), zx, heads, kappa, dy, dzxbcdt, t, stream=stream)
    launch(mamba2_last_inputs_bwd_kernel, rows, zx, heads, kappa, alpha, dy, dzxbcdt, w, dc, t, n, stream=stream)
    launch(mamba2_last_dt_bwd_kernel, grad * n_heads, zx, heads, kappa, alpha, dy, w, dzxbcdt, part, t, n,
           stream=stream)
    launch(mamba2_last_dc_kernel, grad * state_dim, zx, heads, dc, dzxbcdt, t, n, stream=stream)
