"""TLOB dual-attention encoder (Berti & Kasneci 2025; agent/tlob.py): attention, residual layer norm, transposes.

    attention_forward(qkv, out, lse, seq, stream=s)              out = softmax(Q K^T / sqrt(E)) V per (sample, head)
    attention_backward(qkv, out, dout, lse, dqkv, seq, stream=s) dqkv = dL/d(Q, K, V) from dout = dL/dout
    add_layer_norm_forward(x, a, gamma, beta, y, stats, stream=s)  y = LN(x + a) over the last axis
    add_layer_norm_backward(dy, x, a, gamma, stats, dz, stream=s)  dz = dL/d(x + a)
    LayerNormParamGrad(rows, width)(dy, x, a, stats, dgamma, dbeta, stream=s)   column sums, deterministic
    batch_transpose(x, y, rows, stream=s)                        y[b*C + c, r] = x[b*R + r, c]   (R = rows)

Attention layout: a batch of N sequences of S = seq tokens of width W = H * E (H heads of E columns). qkv [N*S, 3W]
is the fused projection x @ W_qkv + b (a dense layer, agent/dense.py): row n*S + i is token i of sequence n, columns
[0, W) Q, [W, 2W) K, [2W, 3W) V, head h at columns h*E .. h*E + E - 1 of each. out [N*S, W] has Q's column layout;
lse [N*S, H] keeps each query row's log-sum-exp, m + ln(sum_j exp(s_j - m)), so the backward recomputes the
probabilities P_ij = exp(s_ij - lse_i) (s = q k / sqrt(E)) instead of storing N*H*S*S of them (1 GiB at N = 16384,
H = 4, S = 64). Backward (Dao et al., FlashAttention), with Delta_i = dO_i . O_i = sum_j P_ij dP_ij:

    dV_j = sum_i P_ij dO_i,   dP_ij = dO_i . V_j,   dS_ij = P_ij (dP_ij - Delta_i),
    dQ_i = sum_j dS_ij K_j / sqrt(E),   dK_j = sum_i dS_ij Q_i / sqrt(E)

Layer norm over the last axis of z = x + a (the residual sum): y = (z - mu) rstd gamma + beta, rstd = 1 / sqrt(var
+ LN_EPS) (biased variance), stats [R, 2] = (mu, rstd) per row. Backward with g = dy gamma and xh = (z - mu) rstd:
dz = rstd (g - mean(g) - xh mean(g xh)) (one array: dL/dx = dL/da = dz); dgamma = sum_rows dy xh, dbeta = sum_rows dy.

Launch shapes and memory:
- attention_forward / attention_backward: a unit of work is one (sequence, head), S * ceil(E / CHUNK) threads
  (`attention_unit_threads`): thread (i, c) handles token i's columns c CHUNK .. c CHUNK + CHUNK - 1 of the output
  (the forward's query row i; the backward's dQ row i in pass 1, dK and dV rows i in pass 2), accumulating them in a
  CHUNK-float array the compiler keeps in registers (constant indices after unrolling). A block packs K units
  (`attention_units`: as many as fit in MAX_BLOCK threads and in the TILE floats of each shared tile, at most the
  units there are; the kernels take K), each with its own S * E slice of every tile: the forward stages Q (pre-scaled),
  K and V, the backward Q, dO, K and V in each pass, plus two S-vectors (lse, Delta) in MAX_BLOCK floats (three
  tiles, 24 KB; four and the vectors, 36 KB; under the 48 KB of static shared memory). A tile the thread reads its own
  row of is stored by column (element e of row i at e S + i: a unit's threads read consecutive words), one whose row
  every thread of the unit reads at once by row (a broadcast). Nothing else is per thread: the scores are recomputed
  (the forward's two passes, max then exp-sum, each recompute the dot products) instead of kept in a local array,
  which at 2,048 threads an SM spilled out of the L1 (0.41 ms forward, 1.05 ms backward a launch at 16,384 windows on
  an H100, tools/results/bench_learner_u32_tlob32_tf32_h100.md). Softmax subtracts the row max; every sum is one
  thread's chain in index order, the same sums in the same order as before the chunking: no atomics, the same bits on
  every run and for any packing. Threads past the block's units stage nothing, pass the barriers and write nothing.
- add_layer_norm_forward / _backward: a block per LN_ROWS rows, staged in shared memory (x + a, and dy in the
  backward) and written back through it, coalesced; one thread per row sums it (W <= 64 columns, two passes in
  float32, in column order).
- LayerNormParamGrad: one block per chunk of LN_CHUNK rows (`launch_tiles`), thread c sums column c over the chunk
  in order into partial [chunk, 1, W] / [chunk, W]; then gemm.wgrad_reduce (the dense weight gradient's split
  reducer, reused) adds the chunks in order.
- batch_transpose: one thread per output element (`launch`).
Constraints: S <= MAX_SEQ, E <= MAX_HEAD, S * E <= TILE, float32 C-contiguous arrays; float32 literals throughout (a
bare 0.0 is float64 on the GPU), one `cuda.shared.array` per source line (two on a line alias in the simulator).
Indices and loop counters are uint32 (`u32`, kernels/head_rows.py's header): numba's int64 indices cost a
negative-index wrap and 64-bit arithmetic per access (the attention kernels' PTX held 1,478 and 2,849 64-bit
operations before the uint32 walks, 307 and 577 after; the sums are unchanged, the same bits on the simulator).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import cuda, float32, int32

from fox_numba.device.launch import check_array, i32, launch, launch_rows, launch_tiles
from fox_numba.device.memory import device_empty
from fox_numba.device.registry import register
from fox_numba.device.runtime import SIMULATOR, u32
from fox_numba.kernels.gemm import wgrad_reduce

MAX_SEQ = 64
"""Most tokens per sequence (T snapshots in the time view, D features in the feature view)."""
MAX_HEAD = 64
"""Most columns per head."""
TILE = 2048
"""Floats of each shared tile of an attention block; a unit (sequence, head) takes S * E of them, so S * E <= TILE."""
CHUNK = 8
"""Output columns of a head per attention thread (held in registers: a constant-length, unrolled array)."""
MAX_BLOCK = 512
"""Most threads of an attention block (a unit's S * ceil(E / CHUNK) <= 512 whenever S * E <= TILE)."""
LN_EPS = np.float32(1e-5)
"""Added to the variance before the square root (PyTorch's LayerNorm default)."""
LN_ROWS = 64
"""Rows of a layer-norm block, staged in shared memory (x + a, and dy in the backward)."""
LN_MAX_WIDTH = 64
"""Most columns a layer norm takes (its rows' shared-memory tile)."""
LN_CHUNK = 256
"""Rows per block of the layer-norm parameter gradient (16384 * 64 rows: 4096 chunks)."""
WARP = 32
_ONE = np.uint32(1)
_CHUNK = np.uint32(CHUNK)
_LN_ROWS = np.uint32(LN_ROWS)
_LN_TILE = LN_ROWS * (LN_MAX_WIDTH + 1)  # a row's stride is W or W + 1, odd

_F1 = float32[::1]
_F2 = float32[:, ::1]
_F3 = float32[:, :, ::1]


@cuda.jit(device=True)
def _place(seq, unit_threads, packed, n_units):
    """(k, i, c, unit, active) of this thread: its unit's place k in the block, its token i and column chunk c in the
    unit (thread r of a unit: c = r // S, i = r - c S), the unit's index (0 for a slot past the block's `packed` units
    or past the last unit, which stages and writes nothing) and whether the unit exists."""
    t = u32(cuda.threadIdx.x)
    k = u32(t // unit_threads)
    r = u32(t - k * unit_threads)
    c = u32(r // seq)
    unit = u32(u32(cuda.blockIdx.x) * u32(packed) + k)
    active = k < u32(packed) and unit < u32(n_units)
    return k, u32(r - c * seq), c, unit if active else u32(0), active


@cuda.jit(device=True)
def _stage(src, col, scale, tile, off, base, seq, e_dim, tid, unit_threads, by_column):
    """A unit's tile of `seq` rows of `e_dim` columns: tile[off + j E + e] (by row) or tile[off + e S + j] (by column,
    so that the unit's threads each reading their own row walk consecutive words) = src[base + j, col + e] * scale;
    the unit's threads share the elements, thread `tid` every unit_threads-th."""
    n = u32(seq * e_dim)
    idx = u32(tid)
    while idx < n:
        j = u32(idx // e_dim)
        e = u32(idx - j * e_dim)
        dst = u32(off + e * seq + j) if by_column else u32(off + idx)
        tile[dst] = src[u32(base + j), u32(col + e)] * scale
        idx = u32(idx + unit_threads)


@cuda.jit(device=True)
def _dot(col_tile, col_at, seq, row_tile, row_at, e_dim):
    """sum_e col_tile[col_at + e S] row_tile[row_at + e], in e order: a thread's own row of a by-column tile (every
    thread of a unit its own, consecutive words) against a row of a by-row tile (the same for the unit: a broadcast)."""
    s = float32(0.0)
    e = u32(0)
    while e < e_dim:
        s += col_tile[u32(col_at + e * seq)] * row_tile[u32(row_at + e)]
        e = u32(e + _ONE)
    return s


@cuda.jit(device=True)
def _stage_backward(qkv, dout, scale, ta, tb, tc, td, off, base, seq, e_dim, q0, tid, unit_threads, pass_one):
    """The backward's tiles of a pass: ta = Q * scale, tb = dO, tc = K, td = V of the unit (head columns q0 ..);
    pass 1 stores Q and dO by column (each thread's own query row) and K, V by row, pass 2 the other way round."""
    width = u32(dout.shape[1])
    _stage(qkv, q0, scale, ta, off, base, seq, e_dim, tid, unit_threads, pass_one)
    _stage(dout, q0, float32(1.0), tb, off, base, seq, e_dim, tid, unit_threads, pass_one)
    _stage(qkv, width + q0, float32(1.0), tc, off, base, seq, e_dim, tid, unit_threads, not pass_one)
    _stage(qkv, 2 * width + q0, float32(1.0), td, off, base, seq, e_dim, tid, unit_threads, not pass_one)


@cuda.jit(device=True)
def _score_and_grad(own_s, own_d, col_at, seq, row_s, row_d, row_at, e_dim):
    """(s, dP) of one (query, key) pair: the dot of the own row of by-column tile own_s with the row at row_at of
    by-row tile row_s (the score), and the same of own_d with row_d (dO . V)."""
    return (_dot(own_s, col_at, seq, row_s, row_at, e_dim), _dot(own_d, col_at, seq, row_d, row_at, e_dim))


@register((_F2, _F2, _F2, int32, int32, float32))
@cuda.jit
def attention_fwd_kernel(qkv, out, lse, seq, packed, scale):
    """out and lse of the block's `packed` units (sequence, head) = divmod(unit, H); thread (i, c) of a unit: query
    row i's output columns c CHUNK .. c CHUNK + CHUNK - 1 (module header)."""
    width = u32(out.shape[1])
    n_heads = u32(lse.shape[1])
    e_dim = u32(width // n_heads)
    n_seq = u32(seq)
    per = u32(n_seq * u32((e_dim + _CHUNK - _ONE) // _CHUNK))
    k, i, c, unit, active = _place(n_seq, per, packed, u32(out.shape[0] // seq) * n_heads)
    n = u32(unit // n_heads)
    h = u32(unit - n * n_heads)
    q0 = u32(h * e_dim)
    base = u32(n * n_seq)
    off = u32(k * n_seq * e_dim)  # the unit's slice of the tiles
    r = u32(c * n_seq + i)  # its place among the unit's threads
    qt = cuda.shared.array(TILE, float32)
    ks = cuda.shared.array(TILE, float32)
    vs = cuda.shared.array(TILE, float32)
    acc = cuda.local.array(CHUNK, float32)
    if active:
        _stage(qkv, q0, scale, qt, off, base, n_seq, e_dim, r, per, True)
        _stage(qkv, width + q0, float32(1.0), ks, off, base, n_seq, e_dim, r, per, False)
        _stage(qkv, 2 * width + q0, float32(1.0), vs, off, base, n_seq, e_dim, r, per, False)
    cuda.syncthreads()
    if active:
        top = _dot(qt, u32(off + i), n_seq, ks, off, e_dim)
        j = _ONE
        while j < n_seq:
            top = max(top, _dot(qt, u32(off + i), n_seq, ks, u32(off + j * e_dim), e_dim))
            j = u32(j + _ONE)
        for cc in range(CHUNK):
            acc[cc] = float32(0.0)
        total = float32(0.0)
        c0 = u32(c * _CHUNK)
        j = u32(0)
        while j < n_seq:
            kb = u32(off + j * e_dim)
            pj = math.exp(_dot(qt, u32(off + i), n_seq, ks, kb, e_dim) - top)
            total += pj
            for cc in range(CHUNK):
                if c0 + cc < e_dim:
                    acc[cc] += pj * vs[u32(kb + c0 + cc)]
            j = u32(j + _ONE)
        inv = float32(1.0) / total
        row = u32(base + i)
        for cc in range(CHUNK):
            if c0 + cc < e_dim:
                out[row, u32(q0 + c0 + cc)] = acc[cc] * inv
        if c == 0:
            lse[row, h] = top + math.log(total)


@register((_F2, _F2, _F2, _F2, _F2, int32, int32, float32))
@cuda.jit
def attention_bwd_kernel(qkv, out, dout, lse, dqkv, seq, packed, scale):
    """dQ, dK, dV of the block's `packed` units into dqkv (module header): pass 1 thread (i, c) query row i's dQ
    columns (and Delta_i), pass 2 thread (j, c) key row j's dK and dV columns, both recomputing P from lse."""
    width = u32(out.shape[1])
    n_heads = u32(lse.shape[1])
    e_dim = u32(width // n_heads)
    n_seq = u32(seq)
    per = u32(n_seq * u32((e_dim + _CHUNK - _ONE) // _CHUNK))
    k, i, c, unit, active = _place(n_seq, per, packed, u32(out.shape[0] // seq) * n_heads)
    n = u32(unit // n_heads)
    h = u32(unit - n * n_heads)
    q0 = u32(h * e_dim)
    base = u32(n * n_seq)
    off = u32(k * n_seq * e_dim)
    roff = u32(k * n_seq)  # the unit's slice of the row vectors
    r = u32(c * n_seq + i)
    c0 = u32(c * _CHUNK)
    row = u32(base + i)
    ta = cuda.shared.array(TILE, float32)  # pass 1: Q * scale by column; pass 2: Q * scale by row
    tb = cuda.shared.array(TILE, float32)  # pass 1: dO by column; pass 2: dO by row
    tc = cuda.shared.array(TILE, float32)  # pass 1: K by row; pass 2: K by column
    td = cuda.shared.array(TILE, float32)  # pass 1: V by row; pass 2: V by column
    lse_s = cuda.shared.array(MAX_BLOCK, float32)
    delta_s = cuda.shared.array(MAX_BLOCK, float32)
    ga = cuda.local.array(CHUNK, float32)  # pass 1: dQ; pass 2: dK
    gb = cuda.local.array(CHUNK, float32)  # pass 2: dV
    if active:
        _stage_backward(qkv, dout, scale, ta, tb, tc, td, off, base, n_seq, e_dim, q0, r, per, True)
    cuda.syncthreads()
    if active:
        delta = float32(0.0)
        e = u32(0)
        while e < e_dim:
            delta += tb[u32(off + e * n_seq + i)] * out[row, u32(q0 + e)]
            e = u32(e + _ONE)
        m = lse[row, h]
        if c == 0:
            lse_s[u32(roff + i)] = m
            delta_s[u32(roff + i)] = delta
        for cc in range(CHUNK):
            ga[cc] = float32(0.0)
        j = u32(0)
        while j < n_seq:
            kb = u32(off + j * e_dim)
            sc, dp = _score_and_grad(ta, tb, u32(off + i), n_seq, tc, td, kb, e_dim)
            ds = math.exp(sc - m) * (dp - delta)
            for cc in range(CHUNK):
                if c0 + cc < e_dim:
                    ga[cc] += ds * tc[u32(kb + c0 + cc)]
            j = u32(j + _ONE)
        for cc in range(CHUNK):
            if c0 + cc < e_dim:
                dqkv[row, u32(q0 + c0 + cc)] = ga[cc] * scale
    cuda.syncthreads()  # every thread is done with pass 1's tiles before pass 2's replace them
    if active:
        _stage_backward(qkv, dout, scale, ta, tb, tc, td, off, base, n_seq, e_dim, q0, r, per, False)
    cuda.syncthreads()
    if active:
        for cc in range(CHUNK):
            ga[cc] = float32(0.0)
            gb[cc] = float32(0.0)
        q = u32(0)
        while q < n_seq:
            qb = u32(off + q * e_dim)
            sc, dp = _score_and_grad(tc, td, u32(off + i), n_seq, ta, tb, qb, e_dim)
            pr = math.exp(sc - lse_s[u32(roff + q)])
            ds = pr * (dp - delta_s[u32(roff + q)])
            for cc in range(CHUNK):
                if c0 + cc < e_dim:
                    gb[cc] += pr * tb[u32(qb + c0 + cc)]
                    ga[cc] += ds * ta[u32(qb + c0 + cc)]
            q = u32(q + _ONE)
        for cc in range(CHUNK):
            if c0 + cc < e_dim:
                dqkv[row, u32(width + q0 + c0 + cc)] = ga[cc]
                dqkv[row, u32(2 * width + q0 + c0 + cc)] = gb[cc]


@cuda.jit(device=True)
def _stage_sum(tile, x, a, r0, n_rows, w, stride, tid):
    """tile[rr * stride + c] = x[r0 + rr, c] + a[r0 + rr, c] for the block's n_rows rows, coalesced over (row,
    column); the block's LN_ROWS threads share the elements."""
    e = tid
    n = u32(n_rows * w)
    while e < n:
        rr = u32(e // w)
        c = u32(e - rr * w)
        tile[u32(rr * stride + c)] = x[u32(r0 + rr), c] + a[u32(r0 + rr), c]
        e = u32(e + _LN_ROWS)


@cuda.jit(device=True)
def _write_tile(tile, y, r0, n_rows, w, stride, tid):
    """y[r0 + rr, c] = tile[rr * stride + c] for the block's rows, coalesced."""
    e = tid
    n = u32(n_rows * w)
    while e < n:
        rr = u32(e // w)
        c = u32(e - rr * w)
        y[u32(r0 + rr), c] = tile[u32(rr * stride + c)]
        e = u32(e + _LN_ROWS)


@register((_F2, _F2, _F1, _F1, _F2, _F2))
@cuda.jit
def add_layer_norm_fwd_kernel(x, a, gamma, beta, y, stats):
    """y[r] = LN(x[r] + a[r]) gamma + beta, stats[r] = (mu, rstd); a block of LN_ROWS rows staged in shared memory,
    one thread per row."""
    tile = cuda.shared.array(_LN_TILE, float32)
    tid = u32(cuda.threadIdx.x)
    r0 = u32(cuda.blockIdx.x * LN_ROWS)
    n_rows = min(u32(u32(x.shape[0]) - r0), _LN_ROWS)
    w = u32(x.shape[1])
    stride = u32(w | _ONE)  # odd: the threads' rows fall in different banks
    _stage_sum(tile, x, a, r0, n_rows, w, stride, tid)
    cuda.syncthreads()
    if tid < n_rows:
        base = u32(tid * stride)
        s = float32(0.0)
        c = u32(0)
        while c < w:
            s += tile[u32(base + c)]
            c = u32(c + _ONE)
        mu = s / float32(w)
        v = float32(0.0)
        c = u32(0)
        while c < w:
            d = tile[u32(base + c)] - mu
            v += d * d
            c = u32(c + _ONE)
        rstd = float32(1.0) / math.sqrt(v / float32(w) + LN_EPS)
        c = u32(0)
        while c < w:
            tile[u32(base + c)] = (tile[u32(base + c)] - mu) * rstd * gamma[c] + beta[c]
            c = u32(c + _ONE)
        stats[u32(r0 + tid), 0] = mu
        stats[u32(r0 + tid), 1] = rstd
    cuda.syncthreads()
    _write_tile(tile, y, r0, n_rows, w, stride, tid)


@register((_F2, _F2, _F2, _F1, _F2, _F2))
@cuda.jit
def add_layer_norm_bwd_kernel(dy, x, a, gamma, stats, dz):
    """dz[r] = rstd (g - mean(g) - xh mean(g xh)), g = dy gamma, xh the normalised x + a; a block of LN_ROWS rows
    (x + a and dy) staged in shared memory, one thread per row."""
    tile = cuda.shared.array(_LN_TILE, float32)
    dy_t = cuda.shared.array(_LN_TILE, float32)
    tid = u32(cuda.threadIdx.x)
    r0 = u32(cuda.blockIdx.x * LN_ROWS)
    n_rows = min(u32(u32(x.shape[0]) - r0), _LN_ROWS)
    w = u32(x.shape[1])
    stride = u32(w | _ONE)
    _stage_sum(tile, x, a, r0, n_rows, w, stride, tid)
    e = tid
    while e < u32(n_rows * w):
        rr = u32(e // w)
        c = u32(e - rr * w)
        dy_t[u32(rr * stride + c)] = dy[u32(r0 + rr), c]
        e = u32(e + _LN_ROWS)
    cuda.syncthreads()
    if tid < n_rows:
        base = u32(tid * stride)
        mu = stats[u32(r0 + tid), 0]
        rstd = stats[u32(r0 + tid), 1]
        m1 = float32(0.0)
        m2 = float32(0.0)
        c = u32(0)
        while c < w:
            g = dy_t[u32(base + c)] * gamma[c]
            m1 += g
            m2 += g * ((tile[u32(base + c)] - mu) * rstd)
            c = u32(c + _ONE)
        m1 /= float32(w)
        m2 /= float32(w)
        c = u32(0)
        while c < w:
            xh = (tile[u32(base + c)] - mu) * rstd
            tile[u32(base + c)] = rstd * (dy_t[u32(base + c)] * gamma[c] - m1 - xh * m2)
            c = u32(c + _ONE)
    cuda.syncthreads()
    _write_tile(tile, dz, r0, n_rows, w, stride, tid)


@register((_F2, _F2, _F2, _F2, _F3, _F2, int32))
@cuda.jit
def layer_norm_param_partials_kernel(dy, x, a, stats, pg, pb, chunk):
    """pg[k, 0, c] = sum dy xh and pb[k, c] = sum dy over the rows of chunk k = blockIdx.x, in order; thread c."""
    k = u32(cuda.blockIdx.x)
    r0 = u32(k * u32(chunk))
    r1 = min(u32(r0 + u32(chunk)), u32(x.shape[0]))
    c = u32(cuda.threadIdx.x)
    while c < u32(x.shape[1]):
        sg = float32(0.0)
        sb = float32(0.0)
        r = r0
        while r < r1:
            xh = ((x[r, c] + a[r, c]) - stats[r, 0]) * stats[r, 1]
            sg += dy[r, c] * xh
            sb += dy[r, c]
            r = u32(r + _ONE)
        pg[k, 0, c] = sg
        pb[k, c] = sb
        c = u32(c + u32(cuda.blockDim.x))


@register((_F2, _F2, int32))
@cuda.jit
def batch_transpose_kernel(x, y, rows):
    """y[b*C + c, r] = x[b*R + r, c] for x [B*R, C] (R = rows), one thread per element of y."""
    i = u32(cuda.grid(1))
    n_r = u32(rows)
    if i < u32(y.shape[0] * rows):
        out_row = u32(i // n_r)
        r = u32(i - out_row * n_r)
        cols = u32(x.shape[1])
        b = u32(out_row // cols)
        c = u32(out_row - b * cols)
        y[out_row, r] = x[u32(b * n_r + r), c]


def _round_threads(n: int) -> int:
    """Threads of a block of n working threads: n rounded up to a warp on the GPU, n under the simulator (which
    pays per thread)."""
    return n if SIMULATOR else -(-n // WARP) * WARP


def attention_unit_threads(seq: int, head_dim: int) -> int:
    """Threads of a unit (sequence, head) of the attention kernels: one per token and chunk of CHUNK columns."""
    return seq * -(-head_dim // CHUNK)


def attention_units(seq: int, head_dim: int, units: int) -> int:
    """K, the units (sequence, head) an attention block packs (module header): within MAX_BLOCK threads and the TILE
    floats of each tile, and no more than `units`."""
    fit = min(MAX_BLOCK // attention_unit_threads(seq, head_dim), TILE // (seq * head_dim))
    return max(1, min(fit, units))


def _launch_attention(kernel: Any, n_units: int, seq: int, head_dim: int, *args: Any, stream: Any) -> None:
    k = attention_units(seq, head_dim, n_units)
    launch_rows(kernel, -(-n_units // k), _round_threads(k * attention_unit_threads(seq, head_dim)), *args[:-1],
                i32(seq), i32(k), args[-1], stream=stream)


def _attention_shape(qkv: Any, out: Any, lse: Any, seq: int) -> tuple[int, int]:
    """(sequences N, heads H) of a checked qkv [N*S, 3W], out [N*S, W], lse [N*S, H]."""
    rows, width = (int(d) for d in out.shape)
    n_heads = int(lse.shape[1]) if len(lse.shape) == 2 else 0
    if (not 1 <= seq <= MAX_SEQ or rows % seq or n_heads < 1 or width % n_heads or width // n_heads > MAX_HEAD
            or seq * (width // n_heads) > TILE):
        raise ValueError(f"attention: out {tuple(out.shape)}, lse {tuple(lse.shape)}, seq {seq}: need rows = N * seq, "
                         f"seq <= {MAX_SEQ}, width = heads * E with E <= {MAX_HEAD} and seq * E <= {TILE}")
    check_array("qkv", qkv, "[N*S, 3W]", (rows, 3 * width))
    check_array("out", out, "[N*S, W]", (rows, width))
    check_array("lse", lse, "[N*S, H]", (rows, n_heads))
    return rows // seq, n_heads


def _scale(width: int, n_heads: int) -> np.float32:
    return np.float32(1.0 / math.sqrt(width // n_heads))


def attention_forward(qkv: Any, out: Any, lse: Any, seq: int, *, stream: Any) -> None:
    """out [N*S, W] = softmax(Q K^T / sqrt(E)) V per sequence and head, lse [N*S, H] its log-sum-exps."""
    n_seqs, n_heads = _attention_shape(qkv, out, lse, seq)
    width = int(out.shape[1])
    _launch_attention(attention_fwd_kernel, n_seqs * n_heads, seq, width // n_heads, qkv, out, lse,
                      _scale(width, n_heads), stream=stream)


def attention_backward(qkv: Any, out: Any, dout: Any, lse: Any, dqkv: Any, seq: int, *, stream: Any) -> None:
    """dqkv [N*S, 3W] = dL/d(Q, K, V) from dout [N*S, W] = dL/dout and the forward's qkv, out and lse."""
    n_seqs, n_heads = _attention_shape(qkv, out, lse, seq)
    check_array("dout", dout, "[N*S, W]", tuple(int(d) for d in out.shape))
    check_array("dqkv", dqkv, "[N*S, 3W]", tuple(int(d) for d in qkv.shape))
    width = int(out.shape[1])
    _launch_attention(attention_bwd_kernel, n_seqs * n_heads, seq, width // n_heads, qkv, out, dout, lse, dqkv,
                      _scale(width, n_heads), stream=stream)


def _check_norm(x: Any, a: Any, stats: Any, gamma: Any) -> tuple[int, int]:
    rows, width = (int(d) for d in x.shape)
    check_array("x", x, "[R, W]", (rows, width))
    check_array("a", a, "[R, W]", (rows, width))
    check_array("stats", stats, "[R, 2]", (rows, 2))
    check_array("gamma", gamma, "[W]", (width,))
    if not 1 <= width <= LN_MAX_WIDTH:
        raise ValueError(f"add_layer_norm: the rows' width W = {width} must be in 1 .. {LN_MAX_WIDTH}")
    return rows, width


def add_layer_norm_forward(x: Any, a: Any, gamma: Any, beta: Any, y: Any, stats: Any, *, stream: Any) -> None:
    """y [R, W] = LN(x + a) gamma + beta over the last axis; stats [R, 2] = (mean, 1 / std) per row."""
    rows, width = _check_norm(x, a, stats, gamma)
    check_array("beta", beta, "[W]", (width,))
    check_array("y", y, "[R, W]", (rows, width))
    launch_tiles(add_layer_norm_fwd_kernel, (-(-rows // LN_ROWS),), LN_ROWS, x, a, gamma, beta, y, stats,
                 stream=stream)


def add_layer_norm_backward(dy: Any, x: Any, a: Any, gamma: Any, stats: Any, dz: Any, *, stream: Any) -> None:
    """dz [R, W] = dL/d(x + a) from dy = dL/dy and the forward's x, a, gamma, stats."""
    rows, width = _check_norm(x, a, stats, gamma)
    check_array("dy", dy, "[R, W]", (rows, width))
    check_array("dz", dz, "[R, W]", (rows, width))
    launch_tiles(add_layer_norm_bwd_kernel, (-(-rows // LN_ROWS),), LN_ROWS, dy, x, a, gamma, stats, dz,
                 stream=stream)


class LayerNormParamGrad:
    """dgamma = sum_rows dy xh and dbeta = sum_rows dy for a fixed (rows, width), deterministically; the chunk
    partials are allocated here, once, so calls can be captured."""

    def __init__(self, rows: int, width: int, *, chunk: int = LN_CHUNK) -> None:
        if min(rows, width, chunk) < 1:
            raise ValueError(f"LayerNormParamGrad: rows={rows}, width={width}, chunk={chunk} must be positive")
        self.rows, self.width, self.chunk = rows, width, chunk
        self.splits = -(-rows // chunk)
        self.partial_g = device_empty((self.splits, 1, width), np.float32)
        self.partial_b = device_empty((self.splits, width), np.float32)

    def __call__(self, dy: Any, x: Any, a: Any, stats: Any, dgamma: Any, dbeta: Any, *, stream: Any) -> None:
        """dgamma [W], dbeta [W] of the layer norm of x + a, from dy = dL/dy."""
        rows, width = self.rows, self.width
        check_array("dy", dy, "[R, W]", (rows, width))
        check_array("x", x, "[R, W]", (rows, width))
        check_array("a", a, "[R, W]", (rows, width))
        check_array("stats", stats, "[R, 2]", (rows, 2))
        check_array("dgamma", dgamma, "[W]", (width,))
        check_array("dbeta", dbeta, "[W]", (width,))
        launch_tiles(layer_norm_param_partials_kernel, (self.splits,), _round_threads(width), dy, x, a, stats,
                     self.partial_g, self.partial_b, i32(self.chunk), stream=stream)
        launch(wgrad_reduce, 2 * width, self.partial_g, self.partial_b, dgamma.reshape((1, width)), dbeta,
               i32(self.splits), i32(width), stream=stream)


def batch_transpose(x: Any, y: Any, rows: int, *, stream: Any) -> None:
    """y [B*C, R] = the per-sample transpose of x [B*R, C] (R = rows): the time view [B*T, D] to the feature view
    [B*D, T] with rows = T, back with rows = D, and each backward likewise."""
    n_rows, cols = (int(d) for d in x.shape)
    if rows < 1 or n_rows % rows:
        raise ValueError(f"batch_transpose: x has {n_rows} rows, not a multiple of rows={rows}")
    check_array("x", x, "[B*R, C]", (n_rows, cols))
    check_array("y", y, "[B*C, R]", (n_rows // rows * cols, rows))
    launch(batch_transpose_kernel, n_rows * cols, x, y, i32(rows), stream=stream)
