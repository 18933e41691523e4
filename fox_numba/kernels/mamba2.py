"""Mamba2 (SSD) selective state-space scan over a window of T bars (agent/mamba2.py): forward, backward, gate.

    mamba2_scan_forward(zxbcdt, heads, y, seq_len=T, state_dim=N, stream=s)         y [R, HP] = SSM output (+ D x)
    mamba2_gate_forward(zxbcdt, y, out, stream=s)                                   out = y * silu(z)
    mamba2_gate_backward(zxbcdt, y, dout, dy, dzxbcdt, stream=s)                    dy; the z columns of dzxbcdt
    mamba2_scan_backward(zxbcdt, heads, dy, carry, dzxbcdt, seq_len=T, state_dim=N, ...)  B, C columns; carry
    mamba2_dt_grad(zxbcdt, heads, carry, dy, dzxbcdt, part, seq_len=T, state_dim=N, ...)  x, dt columns; part
    mamba2_head_grad(part, dheads, stream=s)                                        dheads [3, H] = part summed

The model (Dao & Gu 2024, "Transformers are SSMs", one group: B and C are shared by the H heads). Rows are
r = b T + t (sample b, bar t). The in-projection's output zxbcdt [R, 2HP + 2N + H] holds, by columns,
z [HP] | x [HP] | B [N] | C [N] | dt_raw [H] (head h owns the P columns h P .. h P + P - 1 of z and x);
heads [3, H] holds a_log, D and dt_bias per head. With A_h = -exp(a_log_h) < 0 and per head h:

    dt_t = softplus(dt_raw_t + dt_bias),  a_t = exp(dt_t A),  h_t = a_t h_{t-1} + dt_t x_t B_t^T   (h [P, N], h_-1 = 0)
    y_t = h_t C_t + D x_t,                out_t = y_t * silu(z_t)

Backward, from dy (= dout silu(z): the gate backward), with the adjoint g_t = dL/dh_t = dy_t C_t^T + a_{t+1} g_{t+1}:

    dC_t = sum_h h_t^T dy_t            dB_t = sum_h dt_t g_t^T x_t           dx_t = D dy_t + dt_t g_t B_t
    R_t = dL/d(log a_t) = <g_t, a_t h_{t-1}> = R_{t+1} + dy_t . (a_t h_{t-1} C_t) - dt_t x_t^T (a_{t+1} g_{t+1}) B_t
    d dt_t = x_t^T g_t B_t + A R_t,  d dt_raw_t = d dt_t sigmoid(dt_raw_t + dt_bias),  d a_log = A sum_t dt_t R_t
    dD = sum_t dy_t . x_t,  d dt_bias = sum_t d dt_raw_t

R_t's recursion: split g_t = dy_t C_t^T + a_{t+1} g_{t+1} and write a_t h_{t-1} = h_t - dt_t x_t B_t^T in the second
part. So the decay's gradient needs no stored state: the scan's forward pass (h_t recomputed) gives dC and the
carried readout a_t h_{t-1} C_t, its reverse pass (g_t) gives dB and a_{t+1} g_{t+1} B_t, and mamba2_dt_grad runs
R_t as a sum of per-bar scalars. Both increments leave out the bar's own term dt_t (dy_t . x_t)(B_t . C_t): written
with it (dy . (y - D x) - dt x^T g B) they cancel to the order of a_t, and R, d dt and d a_log lose their digits
where a head decays fast; without it each term is of the order of the result.

Why a sequential scan per (sample, head) rather than the chunked SSD form, at T <= 128, P, N <= 64, H <= 8 and a
batch up to 16384: the chunked form exists to parallelise over time and to turn the scan into matrix products for
tensor cores. Here the batch gives the parallelism (batch x H blocks of up to 256 threads: 8192 x 4 x 256 threads
are ~30 waves of an H200), numba's fp32 path has no tensor-core matmul to feed, and the operation counts are close:
3 P N multiply-adds per bar and head here, 2 P N + L (P + N / H) / 2 for chunks of L (at P = N = 64, H = 8, L = 64
the chunked form does 15% fewer; at P = N = 16, H = 4 it does 1.5x as many). What decides it is memory: this scan
keeps the [P, N] state in registers for its whole life, reads each input once and, in the backward, recomputes the
forward and stores nothing, while the chunked form writes a [P, N] state per chunk to global memory and reads it
back (batch 16384, H 8, P = N = 64, L = 32: 8.6 GB per pass); a fused chunked kernel that kept them on chip would
step through its chunks in sequence per (sample, head), as this one steps through bars. The sequential critical
path, T bars of one barrier each, is hidden by the other resident blocks. The chunked form's equality with this
recurrence is checked in float64 (tests/reference_mamba2.py), should long-window, small-batch shapes ever want it.

Launch shapes. Thread tile: each thread owns a TILE x TILE block of the state (rows p0 .. p0+3, columns n0 .. n0+3
of h or g, in registers: constant-trip loops over local arrays, which NVVM unrolls and keeps out of local memory); a
unit of work has ceil(P / TILE) x ceil(N / TILE) threads (at most 256), thread (pi, ni) = tid // n_tiles, tid %
n_tiles. The sums over n (y, the carried readout, a g B) and over p (dC, dB) go through shared memory,
double-buffered by step parity: one barrier per bar. A unit is one (sample, head) in mamba2_scan_forward and one
sample in mamba2_scan_backward (the heads in turn, so the heads' shares of dB and dC, shared columns, are added in
head order by the same thread: no atomics, the same bits on every run). A block packs K units (`scan_units`: as many
as fit in MAX_BLOCK threads and in the SHARED_SLOTS floats of each shared buffer, at most the units there are), each
with its own slice of the shared partials. At the default P = N = 16 a unit is 16 threads: one unit per block would
cap an SM at 32 blocks of 16 threads, a quarter of its 2,048 resident threads, with half of every warp idle. A unit
computes the same sums in the same order whatever K is, so the packing changes no bit; the threads of a last
block's missing units run the bars' barriers on unit 0's inputs and write nothing outside their shared slices.
mamba2_dt_grad: one thread per (sample, head), reverse in time. mamba2_head_grad: one block per element of dheads, a
float64 shared-memory tree over the samples. The gate kernels: one thread per element of [R, HP]. float32 literals
throughout; out-of-range tile rows and columns read 0.
"""

from __future__ import annotations

import math
from typing import Any

from numba import cuda, float32, float64, int32

from fox_numba.device.launch import check_array, i32, launch, launch_rows, strided_threads
from fox_numba.device.registry import register
from fox_numba.kernels.signals import STATS_BLOCK, tree_sums

TILE = 4
"""State rows and columns per thread (a TILE x TILE register tile)."""
MAX_HEAD_DIM = 64
"""Largest head width P (the shared-memory partials are sized for it)."""
MAX_STATE_DIM = 64
"""Largest state width N."""
_MAX_TILES = 16  # MAX_HEAD_DIM // TILE == MAX_STATE_DIM // TILE
SHARED_SLOTS = MAX_HEAD_DIM * _MAX_TILES
"""Floats per buffer of a scan block's shared partials, split between its units."""
MAX_BLOCK = 256
"""Most threads of a scan block."""
N_HEAD_PARAMS = 3
"""Rows of the per-head parameter block heads [3, H]: a_log, D, dt_bias."""
A_LOG, D_SKIP, DT_BIAS = 0, 1, 2

_F2 = float32[:, ::1]


def in_width(n_heads: int, head_dim: int, state_dim: int) -> int:
    """Columns of the in-projection output: z [HP] | x [HP] | B [N] | C [N] | dt_raw [H]."""
    return 2 * n_heads * head_dim + 2 * state_dim + n_heads


def tiles(head_dim: int, state_dim: int) -> tuple[int, int]:
    """(p tiles, n tiles) of a scan unit: its threads are their product."""
    return -(-head_dim // TILE), -(-state_dim // TILE)


def scan_units(head_dim: int, state_dim: int, units: int) -> int:
    """K, the scan units a block packs (module header): within MAX_BLOCK threads and SHARED_SLOTS floats of the
    partials over n [P, n tiles] and over p [p tiles, N] per unit, and no more than `units`."""
    p_tiles, n_tiles = tiles(head_dim, state_dim)
    fit = min(MAX_BLOCK // (p_tiles * n_tiles), SHARED_SLOTS // (head_dim * n_tiles),
              SHARED_SLOTS // (p_tiles * state_dim))
    return max(1, min(fit, units))


@cuda.jit(device=True)
def softplus(v):
    """log(1 + e^v) without overflow."""
    return max(v, float32(0.0)) + math.log1p(math.exp(-abs(v)))


@cuda.jit(device=True)
def sigmoid(v):
    """1 / (1 + e^-v) without overflow."""
    if v >= float32(0.0):
        return float32(1.0) / (float32(1.0) + math.exp(-v))
    e = math.exp(v)
    return e / (float32(1.0) + e)


@register((_F2, _F2, _F2, int32, int32))
@cuda.jit
def mamba2_scan_fwd_kernel(zxbcdt, heads, y, seq_len, state_dim):
    """y[r, hP + p] = (h_t C_t)[p] + D x_t[p] for each unit (sample, head) = divmod(unit, H) (module header)."""
    n_heads = heads.shape[1]
    hp = y.shape[1]
    head_dim = hp // n_heads
    n_tiles = (state_dim + TILE - 1) // TILE
    per = ((head_dim + TILE - 1) // TILE) * n_tiles  # threads per unit
    k = cuda.threadIdx.x // per  # the unit's place in the block
    tid = cuda.threadIdx.x - k * per
    unit = cuda.blockIdx.x * (cuda.blockDim.x // per) + k
    active = unit < (y.shape[0] // seq_len) * n_heads
    if not active:
        unit = 0  # a missing unit: runs the barriers on unit 0's inputs, writes nothing outside its shared slice
    b = unit // n_heads
    hd = unit - b * n_heads
    base = k * head_dim * n_tiles  # the unit's slice of the partials over n
    pt = tid // n_tiles
    nt = tid - pt * n_tiles
    p0 = pt * TILE
    n0 = nt * TILE
    y_col = hd * head_dim
    x_col = hp + y_col
    b_col = 2 * hp
    c_col = b_col + state_dim
    dt_col = c_col + state_dim + hd
    a = -math.exp(heads[A_LOG, hd])
    d_skip = heads[D_SKIP, hd]
    dt_bias = heads[DT_BIAS, hd]
    over_n = cuda.shared.array((2, SHARED_SLOTS), float32)
    st = cuda.local.array((TILE, TILE), float32)
    xv = cuda.local.array(TILE, float32)
    bv = cuda.local.array(TILE, float32)
    cv = cuda.local.array(TILE, float32)
    for i in range(TILE):
        for j in range(TILE):
            st[i, j] = float32(0.0)
    for t in range(seq_len):
        row = b * seq_len + t
        dt = softplus(zxbcdt[row, dt_col] + dt_bias)
        decay = math.exp(dt * a)
        for i in range(TILE):
            xv[i] = dt * zxbcdt[row, x_col + p0 + i] if p0 + i < head_dim else float32(0.0)
        for j in range(TILE):
            bv[j] = zxbcdt[row, b_col + n0 + j] if n0 + j < state_dim else float32(0.0)
            cv[j] = zxbcdt[row, c_col + n0 + j] if n0 + j < state_dim else float32(0.0)
        buf = t & 1
        for i in range(TILE):
            acc = float32(0.0)
            for j in range(TILE):
                st[i, j] = decay * st[i, j] + xv[i] * bv[j]
                acc += cv[j] * st[i, j]
            if p0 + i < head_dim:
                over_n[buf, base + (p0 + i) * n_tiles + nt] = acc
        cuda.syncthreads()  # one barrier per bar: the next bar writes the other buffer
        p = tid
        while active and p < head_dim:
            s = float32(0.0)
            for kk in range(n_tiles):
                s += over_n[buf, base + p * n_tiles + kk]
            y[row, y_col + p] = s + d_skip * zxbcdt[row, x_col + p]
            p += per


@register((_F2, _F2, _F2, _F2, _F2, int32, int32))
@cuda.jit
def mamba2_scan_bwd_kernel(zxbcdt, heads, dy, carry, dzxbcdt, seq_len, state_dim):
    """For the block's sample, head by head: dC into dzxbcdt's C columns and the carried readout a_t h_{t-1} C_t into
    carry (forward pass, h_t recomputed); dB into the B columns and a_{t+1} g_{t+1} B_t into the x columns (reverse
    pass, the adjoint g_t), which mamba2_dt_grad finishes to dx."""
    n_heads = heads.shape[1]
    hp = dy.shape[1]
    head_dim = hp // n_heads
    p_tiles = (head_dim + TILE - 1) // TILE
    n_tiles = (state_dim + TILE - 1) // TILE
    per = p_tiles * n_tiles  # threads per unit (one sample)
    k = cuda.threadIdx.x // per
    tid = cuda.threadIdx.x - k * per
    b = cuda.blockIdx.x * (cuda.blockDim.x // per) + k
    active = b < dy.shape[0] // seq_len
    if not active:
        b = 0  # a missing unit: runs the barriers on sample 0's inputs, writes nothing outside its shared slices
    base_n = k * head_dim * n_tiles  # the unit's slices of the partials over n and over p
    base_p = k * p_tiles * state_dim
    pt = tid // n_tiles
    nt = tid - pt * n_tiles
    p0 = pt * TILE
    n0 = nt * TILE
    b_col = 2 * hp
    c_col = b_col + state_dim
    over_n = cuda.shared.array((2, SHARED_SLOTS), float32)
    over_p = cuda.shared.array((2, SHARED_SLOTS), float32)
    st = cuda.local.array((TILE, TILE), float32)
    xv = cuda.local.array(TILE, float32)
    dyv = cuda.local.array(TILE, float32)
    bv = cuda.local.array(TILE, float32)
    cv = cuda.local.array(TILE, float32)
    step = 0  # bars done by the block: its parity picks the shared buffer (one barrier per bar)
    for hd in range(n_heads):
        y_col = hd * head_dim
        x_col = hp + y_col
        dt_col = c_col + state_dim + hd
        a = -math.exp(heads[A_LOG, hd])
        dt_bias = heads[DT_BIAS, hd]
        for i in range(TILE):
            for j in range(TILE):
                st[i, j] = float32(0.0)
        for t in range(seq_len):  # forward: h_t, dC_t = h_t^T dy_t
            row = b * seq_len + t
            dt = softplus(zxbcdt[row, dt_col] + dt_bias)
            decay = math.exp(dt * a)
            for i in range(TILE):
                xv[i] = dt * zxbcdt[row, x_col + p0 + i] if p0 + i < head_dim else float32(0.0)
                dyv[i] = dy[row, y_col + p0 + i] if p0 + i < head_dim else float32(0.0)
            for j in range(TILE):
                bv[j] = zxbcdt[row, b_col + n0 + j] if n0 + j < state_dim else float32(0.0)
                cv[j] = zxbcdt[row, c_col + n0 + j] if n0 + j < state_dim else float32(0.0)
            buf = step & 1
            for i in range(TILE):  # the carried readout (a_t h_{t-1} C_t)[p], from the state before the update
                acc = float32(0.0)
                for j in range(TILE):
                    acc += st[i, j] * cv[j]
                if p0 + i < head_dim:
                    over_n[buf, base_n + (p0 + i) * n_tiles + nt] = decay * acc
            for j in range(TILE):
                acc = float32(0.0)
                for i in range(TILE):
                    st[i, j] = decay * st[i, j] + xv[i] * bv[j]
                    acc += dyv[i] * st[i, j]
                if n0 + j < state_dim:
                    over_p[buf, base_p + pt * state_dim + n0 + j] = acc
            cuda.syncthreads()
            p = tid
            while active and p < head_dim:
                s = float32(0.0)
                for kk in range(n_tiles):
                    s += over_n[buf, base_n + p * n_tiles + kk]
                carry[row, y_col + p] = s
                p += per
            n = tid
            while active and n < state_dim:
                s = float32(0.0)
                for kk in range(p_tiles):
                    s += over_p[buf, base_p + kk * state_dim + n]
                if hd == 0:
                    dzxbcdt[row, c_col + n] = s
                else:
                    dzxbcdt[row, c_col + n] += s
                n += per
            step += 1
        for i in range(TILE):
            for j in range(TILE):
                st[i, j] = float32(0.0)
        decay_next = float32(0.0)  # a_{t+1}; g_T = 0
        for k_rev in range(seq_len):  # reverse: g_t = dy_t C_t^T + a_{t+1} g_{t+1}
            t = seq_len - 1 - k_rev
            row = b * seq_len + t
            dt = softplus(zxbcdt[row, dt_col] + dt_bias)
            for i in range(TILE):
                xv[i] = zxbcdt[row, x_col + p0 + i] if p0 + i < head_dim else float32(0.0)
                dyv[i] = dy[row, y_col + p0 + i] if p0 + i < head_dim else float32(0.0)
            for j in range(TILE):
                bv[j] = zxbcdt[row, b_col + n0 + j] if n0 + j < state_dim else float32(0.0)
                cv[j] = zxbcdt[row, c_col + n0 + j] if n0 + j < state_dim else float32(0.0)
            buf = step & 1
            for i in range(TILE):  # the future part a_{t+1} g_{t+1} of g_t, read through B_t
                acc = float32(0.0)
                for j in range(TILE):
                    st[i, j] = decay_next * st[i, j]
                    acc += st[i, j] * bv[j]
                if p0 + i < head_dim:
                    over_n[buf, base_n + (p0 + i) * n_tiles + nt] = acc
            for i in range(TILE):
                for j in range(TILE):
                    st[i, j] += dyv[i] * cv[j]
            for j in range(TILE):
                acc = float32(0.0)
                for i in range(TILE):
                    acc += st[i, j] * xv[i]
                if n0 + j < state_dim:
                    over_p[buf, base_p + pt * state_dim + n0 + j] = acc
            cuda.syncthreads()
            p = tid
            while active and p < head_dim:
                s = float32(0.0)
                for kk in range(n_tiles):
                    s += over_n[buf, base_n + p * n_tiles + kk]
                dzxbcdt[row, x_col + p] = s
                p += per
            n = tid
            while active and n < state_dim:
                s = float32(0.0)
                for kk in range(p_tiles):
                    s += over_p[buf, base_p + kk * state_dim + n]
                if hd == 0:
                    dzxbcdt[row, b_col + n] = dt * s
                else:
                    dzxbcdt[row, b_col + n] += dt * s
                n += per
            decay_next = math.exp(dt * a)
            step += 1


@register((_F2, _F2, _F2, _F2, _F2, _F2, int32, int32))
@cuda.jit
def mamba2_dt_grad_kernel(zxbcdt, heads, carry, dy, dzxbcdt, part, seq_len, state_dim):
    """One thread per (sample, head), reverse in time: dx = D dy + dt g B (in place over the a_{t+1} g_{t+1} B of the
    scan), d dt_raw, and the sample's shares part[b, k H + h] of d a_log (k = 0), dD (1) and d dt_bias (2)."""
    n_heads = heads.shape[1]
    i = cuda.grid(1)
    if i < part.shape[0] * n_heads:
        b = i // n_heads
        hd = i - b * n_heads
        hp = dy.shape[1]
        head_dim = hp // n_heads
        y_col = hd * head_dim
        x_col = hp + y_col
        b_col = 2 * hp
        c_col = b_col + state_dim
        dt_col = c_col + state_dim + hd
        a = -math.exp(heads[A_LOG, hd])
        d_skip = heads[D_SKIP, hd]
        dt_bias = heads[DT_BIAS, hd]
        r_sum = float32(0.0)  # R_t
        da = float32(0.0)
        dd = float32(0.0)
        dbias = float32(0.0)
        for k_rev in range(seq_len):
            row = b * seq_len + seq_len - 1 - k_rev
            v = zxbcdt[row, dt_col] + dt_bias
            dt = softplus(v)
            cb = float32(0.0)
            for n in range(state_dim):
                cb += zxbcdt[row, b_col + n] * zxbcdt[row, c_col + n]
            s = float32(0.0)  # x_t^T g_t B_t
            carried = float32(0.0)  # dy_t . (a_t h_{t-1} C_t)
            future = float32(0.0)  # x_t^T a_{t+1} g_{t+1} B_t
            for p in range(head_dim):
                xp = zxbcdt[row, x_col + p]
                dyp = dy[row, y_col + p]
                gf = dzxbcdt[row, x_col + p]
                gb = gf + dyp * cb  # (g_t B_t)[p] = future part + dy_t[p] C_t . B_t
                s += xp * gb
                carried += dyp * carry[row, y_col + p]
                future += xp * gf
                dd += dyp * xp
                dzxbcdt[row, x_col + p] = d_skip * dyp + dt * gb
            r_sum += carried - dt * future
            d_raw = (s + a * r_sum) * sigmoid(v)
            dzxbcdt[row, dt_col] = d_raw
            dbias += d_raw
            da += dt * r_sum
        part[b, A_LOG * n_heads + hd] = a * da
        part[b, D_SKIP * n_heads + hd] = dd
        part[b, DT_BIAS * n_heads + hd] = dbias


@register((_F2, _F2))
@cuda.jit
def mamba2_head_grad_kernel(part, dheads):
    """dheads[k // H, k % H] = sum over samples of part[:, k], block k: float64, in a fixed order (a tree)."""
    tid = cuda.threadIdx.x
    k = cuda.blockIdx.x
    n_heads = dheads.shape[1]
    acc = cuda.shared.array((1, STATS_BLOCK), float64)
    acc[0, tid] = float64(0.0)
    r = tid
    while r < part.shape[0]:
        acc[0, tid] += float64(part[r, k])
        r += cuda.blockDim.x
    tree_sums(acc, 1, tid)
    if tid == 0:
        dheads[k // n_heads, k - (k // n_heads) * n_heads] = float32(acc[0, 0])


@register((_F2, _F2, _F2))
@cuda.jit
def mamba2_gate_fwd_kernel(zxbcdt, y, out):
    """out[r, c] = y[r, c] silu(z[r, c]), z = zxbcdt[r, c] (the first HP columns); one thread per element."""
    i = cuda.grid(1)
    cols = y.shape[1]
    if i < y.shape[0] * cols:
        r = i // cols
        c = i - r * cols
        z = zxbcdt[r, c]
        out[r, c] = y[r, c] * (z * sigmoid(z))


@register((_F2, _F2, _F2, _F2, _F2))
@cuda.jit
def mamba2_gate_bwd_kernel(zxbcdt, y, dout, dy, dzxbcdt):
    """dy = dout silu(z), dz = dout y silu'(z) (silu' = s (1 + z (1 - s)), s = sigmoid(z)); one thread per element."""
    i = cuda.grid(1)
    cols = y.shape[1]
    if i < y.shape[0] * cols:
        r = i // cols
        c = i - r * cols
        z = zxbcdt[r, c]
        sg = sigmoid(z)
        g = dout[r, c]
        dy[r, c] = g * (z * sg)
        dzxbcdt[r, c] = g * y[r, c] * (sg * (float32(1.0) + z * (float32(1.0) - sg)))


def _scan_dims(zxbcdt: Any, heads: Any, y: Any, seq_len: int, state_dim: int) -> tuple[int, int, int]:
    """(samples, heads, head width) of a scan's arrays, checked: zxbcdt [R, 2HP + 2N + H], heads [3, H], y [R, HP]."""
    check_array("heads", heads, "[3, H]", None)
    rows, hp = (int(d) for d in y.shape)
    shape = tuple(int(d) for d in heads.shape)
    n_heads = shape[1] if len(shape) == 2 else 0
    if shape[0] != N_HEAD_PARAMS or n_heads < 1 or hp % n_heads:
        raise ValueError(f"heads must be [3, H] with H dividing y's {hp} columns, got {tuple(heads.shape)}")
    head_dim = hp // n_heads
    if not (1 <= head_dim <= MAX_HEAD_DIM and 1 <= state_dim <= MAX_STATE_DIM and seq_len >= 1 and rows >= 1):
        raise ValueError(f"mamba2: need 1 <= P = {head_dim} <= {MAX_HEAD_DIM}, 1 <= N = {state_dim} <= "
                         f"{MAX_STATE_DIM}, T = {seq_len} >= 1 and rows")
    if rows % seq_len:
        raise ValueError(f"mamba2: {rows} rows are not whole windows of T = {seq_len} bars")
    check_array("y", y, "[R, HP]", (rows, hp))
    check_array("zxbcdt", zxbcdt, "[R, 2HP + 2N + H]", (rows, in_width(n_heads, head_dim, state_dim)))
    return rows // seq_len, n_heads, head_dim


def mamba2_scan_forward(zxbcdt: Any, heads: Any, y: Any, *, seq_len: int, state_dim: int, stream: Any) -> None:
    """y [R, HP] = the SSM output h_t C_t + D x_t of the windows of T = seq_len bars in zxbcdt (module header)."""
    samples, n_heads, head_dim = _scan_dims(zxbcdt, heads, y, seq_len, state_dim)
    p_tiles, n_tiles = tiles(head_dim, state_dim)
    units = samples * n_heads
    k = scan_units(head_dim, state_dim, units)
    launch_rows(mamba2_scan_fwd_kernel, -(-units // k), k * p_tiles * n_tiles, zxbcdt, heads, y, i32(seq_len),
                i32(state_dim), stream=stream)


def mamba2_scan_backward(zxbcdt: Any, heads: Any, dy: Any, carry: Any, dzxbcdt: Any, *, seq_len: int,
                         state_dim: int, stream: Any) -> None:
    """From dy [R, HP] = dL/dy: dB and dC into dzxbcdt's B and C columns, a_{t+1} g_{t+1} B_t into its x columns
    (finished to dx by mamba2_dt_grad), the carried readout a_t h_{t-1} C_t into carry [R, HP]."""
    samples, _, head_dim = _scan_dims(zxbcdt, heads, dy, seq_len, state_dim)
    check_array("carry", carry, "[R, HP]", tuple(int(d) for d in dy.shape))
    check_array("dzxbcdt", dzxbcdt, "[R, 2HP + 2N + H]", tuple(int(d) for d in zxbcdt.shape))
    p_tiles, n_tiles = tiles(head_dim, state_dim)
    k = scan_units(head_dim, state_dim, samples)
    launch_rows(mamba2_scan_bwd_kernel, -(-samples // k), k * p_tiles * n_tiles, zxbcdt, heads, dy, carry, dzxbcdt,
                i32(seq_len), i32(state_dim), stream=stream)


def mamba2_dt_grad(zxbcdt: Any, heads: Any, carry: Any, dy: Any, dzxbcdt: Any, part: Any, *, seq_len: int,
                   state_dim: int, stream: Any) -> None:
    """After mamba2_scan_backward (whose carry and dzxbcdt it reads): dx and d dt_raw into dzxbcdt, the per-sample
    head-parameter gradients into part [samples, 3H]."""
    samples, n_heads, _ = _scan_dims(zxbcdt, heads, dy, seq_len, state_dim)
    check_array("carry", carry, "[R, HP]", tuple(int(d) for d in dy.shape))
    check_array("dzxbcdt", dzxbcdt, "[R, 2HP + 2N + H]", tuple(int(d) for d in zxbcdt.shape))
    check_array("part", part, "[samples, 3H]", (samples, N_HEAD_PARAMS * n_heads))
    launch(mamba2_dt_grad_kernel, samples * n_heads, zxbcdt, heads, carry, dy, dzxbcdt, part, i32(seq_len),
           i32(state_dim), stream=stream)


def mamba2_head_grad(part: Any, dheads: Any, *, stream: Any) -> None:
    """dheads [3, H] = part [samples, 3H] summed over the samples (d a_log, dD, d dt_bias)."""
    check_array("dheads", dheads, "[3, H]", None)
    n = int(dheads.shape[0]) * int(dheads.shape[1])
    if int(dheads.shape[0]) != N_HEAD_PARAMS:
        raise ValueError(f"dheads must be [3, H], got {tuple(dheads.shape)}")
    check_array("part", part, "[samples, 3H]", (int(part.shape[0]), n))
    launch_rows(mamba2_head_grad_kernel, n, strided_threads(STATS_BLOCK), part, dheads, stream=stream)


def _gate_dims(zxbcdt: Any, y: Any) -> tuple[int, int]:
    rows, hp = (int(d) for d in y.shape)
    check_array("y", y, "[R, HP]", (rows, hp))
    check_array("zxbcdt", zxbcdt, "[R, 2HP + 2N + H]", None)
    if int(zxbcdt.shape[0]) != rows or int(zxbcdt.shape[1]) <= 2 * hp:
        raise ValueError(f"zxbcdt {tuple(zxbcdt.shape)} does not hold z and x for y {(rows, hp)}")
    return rows, hp


def mamba2_gate_forward(zxbcdt: Any, y: Any, out: Any, *, stream: Any) -> None:
    """out [R, HP] = y * silu(z), z the first HP columns of zxbcdt."""
    rows, hp = _gate_dims(zxbcdt, y)
    check_array("out", out, "[R, HP]", (rows, hp))
    launch(mamba2_gate_fwd_kernel, rows * hp, zxbcdt, y, out, stream=stream)


def mamba2_gate_backward(zxbcdt: Any, y: Any, dout: Any, dy: Any, dzxbcdt: Any, *, stream: Any) -> None:
    """From dout = dL/d(out): dy [R, HP] = dL/dy and dL/dz into the z columns of dzxbcdt."""
    rows, hp = _gate_dims(zxbcdt, y)
    check_array("dout", dout, "[R, HP]", (rows, hp))
    check_array("dy", dy, "[R, HP]", (rows, hp))
    check_array("dzxbcdt", dzxbcdt, "[R, 2HP + 2N + H]", tuple(int(d) for d in zxbcdt.shape))
    launch(mamba2_gate_bwd_kernel, rows * hp, zxbcdt, y, dout, dy, dzxbcdt, stream=stream)
