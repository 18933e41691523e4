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
- attention_forward / attention_backward: a unit of work is one (sequence, head), `attention_threads(S)` threads (S
  rounded up to a warp on the GPU, S under the simulator); thread t of a unit handles its query rows (forward,
  backward pass 1) or key rows (backward pass 2) t, t + per, ... A block packs K units (`attention_units`: as many as
  fit in MAX_BLOCK threads and in the SHARED_SLOTS floats of each shared tile, at most the units there are), each with
  its own slice of the tiles: K and V (the backward's second pass: Q pre-scaled and dO), S * E floats each, and in the
  backward two S-vectors (lse, Delta) in MAX_BLOCK floats. The tiles are 16 KB each, sized for S = E = 64 (32 KB /
  33 KB a block, under the 48 KB of static shared memory); at the default S = 32, E = 8 one unit per block would use
  2 KB of them and cap an SM at 7 blocks of 32 threads, a ninth of its resident threads. A unit computes the same
  sums in the same order whatever K is, so the packing changes no bit; the threads of a last block's missing units
  load unit 0's tiles into their own slices, pass the barriers and write nothing else. Q and the scores do not fit
  in shared memory as well (64 KB in all at S = E = 64), so each thread keeps its own query / key row, probability row
  and accumulators in local arrays (at most MAX_SEQ + 4 MAX_HEAD floats). In the inner loops every thread of a unit
  reads the same tile element (a broadcast, no bank conflict). Softmax subtracts the row max; every sum is one
  thread's chain in index order: no atomics, the same bits on every run and for any block size.
- add_layer_norm_forward / _backward: a block per LN_ROWS rows, staged in shared memory (x + a, and dy in the
  backward) and written back through it, coalesced; one thread per row sums it (W <= 64 columns, two passes in
  float32, in column order).
- LayerNormParamGrad: one block per chunk of LN_CHUNK rows (`launch_tiles`), thread c sums column c over the chunk
  in order into partial [chunk, 1, W] / [chunk, W]; then gemm.wgrad_reduce (the dense weight gradient's split
  reducer, reused) adds the chunks in order.
- batch_transpose: one thread per output element (`launch`).
Constraints: S <= MAX_SEQ, E <= MAX_HEAD, float32 C-contiguous arrays; float32 literals throughout (a bare 0.0 is
float64 on the GPU), one `cuda.shared.array` per source line (two on a line alias in the simulator). Indices and
loop counters are uint32 (`u32`, kernels/head_rows.py's header): numba's int64 indices cost a negative-index wrap and
64-bit arithmetic per access (the attention kernels' PTX held 1,478 and 2,849 64-bit operations, 307 and 577 now;
the sums are unchanged, the same bits on the simulator).
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
SHARED_SLOTS = MAX_SEQ * MAX_HEAD
"""Floats of each shared tile of an attention block, split between its units."""
MAX_BLOCK = 256
"""Most threads of an attention block."""
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
_LN_ROWS = np.uint32(LN_ROWS)
_LN_TILE = LN_ROWS * (LN_MAX_WIDTH + 1)  # a row's stride is W or W + 1, odd

_F1 = float32[::1]
_F2 = float32[:, ::1]
_F3 = float32[:, :, ::1]


@cuda.jit(device=True)
def _unit(per, n_units):
    """(k, tid, unit, active) of this thread: its unit's place k in the block, its place tid in the unit, the unit's
    index (0 for a missing unit of a last block, which loads unit 0's tiles into its own slice and writes nothing
    else) and whether the unit exists."""
    k = cuda.threadIdx.x // per
    unit = cuda.blockIdx.x * (cuda.blockDim.x // per) + k
    active = unit < n_units
    return k, cuda.threadIdx.x - k * per, unit if active else 0, active


@cuda.jit(device=True)
def _stage_pair(a, col_a, scale_a, b, col_b, ta, tb, off, base, seq, e_dim, tid, per):
    """A unit's tiles from `seq` rows at `base`: ta[off + j E + e] = a[base + j, col_a + e] * scale_a and tb likewise
    from b at col_b (unscaled); the unit's `per` threads share the elements, thread `tid` every per-th."""
    n, dim, step = u32(u32(seq) * u32(e_dim)), u32(e_dim), u32(per)
    idx = u32(tid)
    while idx < n:
        j = u32(idx // dim)
        e = u32(idx - j * dim)
        ta[u32(off + idx)] = a[u32(base + j), u32(col_a + e)] * scale_a
        tb[u32(off + idx)] = b[u32(base + j), u32(col_b + e)]
        idx = u32(idx + step)


@register((_F2, _F2, _F2, int32, int32, float32))
@cuda.jit
def attention_fwd_kernel(qkv, out, lse, seq, per, scale):
    """out and lse of each unit (sequence, head) = divmod(unit, H) of the block, `per` threads a unit (module
    header); thread t of a unit: query rows t, t + per, ..."""
    width = u32(out.shape[1])
    n_heads = u32(lse.shape[1])
    e_dim = u32(width // n_heads)
    k, tid, unit, active = _unit(per, (out.shape[0] // seq) * n_heads)
    n_seq, n_per = u32(seq), u32(per)
    n = u32(u32(unit) // n_heads)
    h = u32(u32(unit) - n * n_heads)
    q0 = u32(h * e_dim)
    base = u32(n * n_seq)
    off = u32(u32(k) * n_seq * e_dim)  # the unit's slice of the tiles
    ks = cuda.shared.array(SHARED_SLOTS, float32)
    vs = cuda.shared.array(SHARED_SLOTS, float32)
    q = cuda.local.array(MAX_HEAD, float32)
    p = cuda.local.array(MAX_SEQ, float32)
    _stage_pair(qkv, width + q0, float32(1.0), qkv, 2 * width + q0, ks, vs, off, base, seq, e_dim, tid, per)
    cuda.syncthreads()
    i = u32(tid)
    while active and i < n_seq:
        row = u32(base + i)
        e = u32(0)
        while e < e_dim:
            q[e] = qkv[row, u32(q0 + e)] * scale
            e = u32(e + _ONE)
        j = u32(0)
        while j < n_seq:
            kb = u32(off + j * e_dim)
            sc = float32(0.0)
            e = u32(0)
            while e < e_dim:
                sc += q[e] * ks[u32(kb + e)]
                e = u32(e + _ONE)
            p[j] = sc
            j = u32(j + _ONE)
        top = p[0]
        j = _ONE
        while j < n_seq:
            top = max(top, p[j])
            j = u32(j + _ONE)
        total = float32(0.0)
        j = u32(0)
        while j < n_seq:
            p[j] = math.exp(p[j] - top)
            total += p[j]
            j = u32(j + _ONE)
        inv = float32(1.0) / total
        e = u32(0)
        while e < e_dim:
            acc = float32(0.0)
            j = u32(0)
            while j < n_seq:
                acc += p[j] * vs[u32(off + j * e_dim + e)]
                j = u32(j + _ONE)
            out[row, u32(q0 + e)] = acc * inv
            e = u32(e + _ONE)
        lse[row, h] = top + math.log(total)
        i = u32(i + n_per)


@register((_F2, _F2, _F2, _F2, _F2, int32, int32, float32))
@cuda.jit
def attention_bwd_kernel(qkv, out, dout, lse, dqkv, seq, per, scale):
    """dQ, dK, dV of each unit (sequence, head) of the block into dqkv (module header): pass 1 a thread per query
    row (dQ, Delta), pass 2 a thread per key row (dK, dV), both recomputing P from lse."""
    width = u32(out.shape[1])
    n_heads = u32(lse.shape[1])
    e_dim = u32(width // n_heads)
    k, tid, unit, active = _unit(per, (out.shape[0] // seq) * n_heads)
    n_seq, n_per = u32(seq), u32(per)
    n = u32(u32(unit) // n_heads)
    h = u32(u32(unit) - n * n_heads)
    q0 = u32(h * e_dim)
    base = u32(n * n_seq)
    off = u32(u32(k) * n_seq * e_dim)  # the unit's slices of the tiles and of the row vectors
    roff = u32(u32(k) * n_seq)
    ta = cuda.shared.array(SHARED_SLOTS, float32)  # pass 1: K; pass 2: Q * scale
    tb = cuda.shared.array(SHARED_SLOTS, float32)  # pass 1: V; pass 2: dO
    lse_s = cuda.shared.array(MAX_BLOCK, float32)
    delta_s = cuda.shared.array(MAX_BLOCK, float32)
    ra = cuda.local.array(MAX_HEAD, float32)  # pass 1: q * scale; pass 2: k
    rb = cuda.local.array(MAX_HEAD, float32)  # pass 1: dO; pass 2: v
    ga = cuda.local.array(MAX_HEAD, float32)  # pass 1: dQ; pass 2: dK
    gb = cuda.local.array(MAX_HEAD, float32)  # pass 2: dV
    _stage_pair(qkv, width + q0, float32(1.0), qkv, 2 * width + q0, ta, tb, off, base, seq, e_dim, tid, per)
    cuda.syncthreads()
    i = u32(tid)
    while active and i < n_seq:
        row = u32(base + i)
        delta = float32(0.0)
        e = u32(0)
        while e < e_dim:
            ra[e] = qkv[row, u32(q0 + e)] * scale
            rb[e] = dout[row, u32(q0 + e)]
            ga[e] = float32(0.0)
            delta += rb[e] * out[row, u32(q0 + e)]
            e = u32(e + _ONE)
        m = lse[row, h]
        lse_s[u32(roff + i)] = m
        delta_s[u32(roff + i)] = delta
        j = u32(0)
        while j < n_seq:
            kb = u32(off + j * e_dim)
            sc = float32(0.0)
            dp = float32(0.0)
            e = u32(0)
            while e < e_dim:
                sc += ra[e] * ta[u32(kb + e)]
                dp += rb[e] * tb[u32(kb + e)]
                e = u32(e + _ONE)
            ds = math.exp(sc - m) * (dp - delta)
            e = u32(0)
            while e < e_dim:
                ga[e] += ds * ta[u32(kb + e)]
                e = u32(e + _ONE)
            j = u32(j + _ONE)
        e = u32(0)
        while e < e_dim:
            dqkv[row, u32(q0 + e)] = ga[e] * scale
            e = u32(e + _ONE)
        i = u32(i + n_per)
    cuda.syncthreads()  # every thread is done with K, V before Q, dO replace them
    _stage_pair(qkv, q0, scale, dout, q0, ta, tb, off, base, seq, e_dim, tid, per)
    cuda.syncthreads()
    j = u32(tid)
    while active and j < n_seq:
        row = u32(base + j)
        e = u32(0)
        while e < e_dim:
            ra[e] = qkv[row, u32(width + q0 + e)]
            rb[e] = qkv[row, u32(2 * width + q0 + e)]
            ga[e] = float32(0.0)
            gb[e] = float32(0.0)
            e = u32(e + _ONE)
        r = u32(0)
        while r < n_seq:
            rbase = u32(off + r * e_dim)
            sc = float32(0.0)
            dp = float32(0.0)
            e = u32(0)
            while e < e_dim:
                sc += ta[u32(rbase + e)] * ra[e]
                dp += tb[u32(rbase + e)] * rb[e]
                e = u32(e + _ONE)
            pr = math.exp(sc - lse_s[u32(roff + r)])
            ds = pr * (dp - delta_s[u32(roff + r)])
            e = u32(0)
            while e < e_dim:
                gb[e] += pr * tb[u32(rbase + e)]
                ga[e] += ds * ta[u32(rbase + e)]
                e = u32(e + _ONE)
            r = u32(r + _ONE)
        e = u32(0)
        while e < e_dim:
            dqkv[row, u32(width + q0 + e)] = ga[e]
            dqkv[row, u32(2 * width + q0 + e)] = gb[e]
            e = u32(e + _ONE)
        j = u32(j + n_per)


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
    """Threads of a block that loops over n rows or columns: n rounded up to a warp on the GPU, n under the
    simulator (which pays per thread)."""
    return n if SIMULATOR else -(-n // WARP) * WARP


def attention_threads(seq: int) -> int:
    """Threads per unit (sequence, head) of the attention kernels."""
    return _round_threads(seq)


def attention_units(seq: int, head_dim: int, units: int) -> int:
    """K, the units (sequence, head) an attention block packs (module header): within MAX_BLOCK threads and the
    SHARED_SLOTS floats of each tile, and no more than `units`."""
    fit = min(MAX_BLOCK // attention_threads(seq), SHARED_SLOTS // (seq * head_dim))
    return max(1, min(fit, units))


def _launch_attention(kernel: Any, n_units: int, seq: int, head_dim: int, *args: Any, stream: Any) -> None:
    per = attention_threads(seq)
    k = attention_units(seq, head_dim, n_units)
    launch_rows(kernel, -(-n_units // k), k * per, *args[:-1], i32(seq), i32(per), args[-1], stream=stream)


def _attention_shape(qkv: Any, out: Any, lse: Any, seq: int) -> tuple[int, int]:
    """(sequences N, heads H) of a checked qkv [N*S, 3W], out [N*S, W], lse [N*S, H]."""
    rows, width = (int(d) for d in out.shape)
    n_heads = int(lse.shape[1]) if len(lse.shape) == 2 else 0
    if not 1 <= seq <= MAX_SEQ or rows % seq or n_heads < 1 or width % n_heads or width // n_heads > MAX_HEAD:
        raise ValueError(f"attention: out {tuple(out.shape)}, lse {tuple(lse.shape)}, seq {seq}: need rows = N * seq, "
                         f"seq <= {MAX_SEQ}, width = heads * E with E <= {MAX_HEAD}")
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
