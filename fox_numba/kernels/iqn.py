"""Implicit-quantile (IQN) head kernels (network.iqn_quantiles > 0), in the order the learner's step launches them.

    draw_taus(states, taus, stream=s)                       taus [2, B, N]: online, then target quantile levels
    head_forward(taus, x, W_e, b_e, W_q, b_q, z, stream=s)  z [R, 13] = Z(x_i, tau_r), one fused launch a head
    quantile_loss(z, z_tgt, taus, q, actions, rows, weight, loss, dz, bootstrap=b, stream=s)   loss [4B], dz [R, 13]
    loss_signal(loss, weights, isv, epoch, stream=s)        ISV[IQN_LOSS_EMA] and the epoch's LOSS_IQN
    head_backward(taus, x, W_e, b_e, W_q, dz, part, dx, (dW_e, db_e, dW_q, db_q), mask=m, stream=s)
                                                            the IQN gradients and the input's dx [B, W]: partial sums
                                                            per block (iqn_backward), then iqn_grad_reduce
acting (collect and evaluation; agent/iqn.py IqnActor):
    act_levels(states, taus, n_mid, explore=e, stream=s)   taus [B, L]: the midpoints, then (collect) 4 draws
    act_values(taus, x, W_e, b_e, W_q, b_q, values, n_mid, stream=s)   values [B, 2, 4]: E_IQN and the sampled
                                                            quantiles, the head's 4 direction outputs only

Rows: B samples x N quantile levels, row r = i * N + k (sample i, level k), R = B * N. x [B, W] is the input the
C51 heads read (the trunk's last layer, or the observation without a trunk), A = 13 action heads (one quantile
value each; no dueling).

The head (Dabney et al. 2018): phi_j(tau) = ReLU(sum_i cos(pi i tau) W_e[i, j] + b_e[j]),
Z(x, tau)[a] = sum_j x_j phi_j(tau) W_q[j, a] + b_q[a].

The loss, per branch row r = i * 4 + b (the C51 loss's rows, kernels/learner.py) with a_t the taken head of branch
b and a* = `greedy_next` (the same double-DQN next head the C51 target uses): Z_k = Z(x_i, tau_k)[a_t] on the online
levels, T_j = rew_r + disc_r Z_target(x'_i, tau'_j)[a*] on the target levels, u_jk = T_j - Z_k, and

    loss_r = (1 / N) sum_k sum_j |tau_k - 1{u_jk < 0}| L(u_jk),  L(u) = u**2 / 2 if |u| <= 1 else |u| - 1/2
    dz[i * N + k, a_t] = -weight * weights[r] / N * sum_j |tau_k - 1{u_jk < 0}| clip(u_jk, -1, 1)

(the quantile Huber loss at kappa = 1, averaged over the N' = N target levels and summed over the online ones),
0 on the branch's other heads; weights[r] is the C51 row weight (branch weight x effect / B, x the importance
weight with prioritised replay). A non-finite u gives a NaN gradient, so the learner's non-finite guard skips the
step (a clipped gradient would hide an infinite target).

Draws: sample i's thread draws 2N uniforms from the learner's generator states[i] (numba xoroshiro, bit-exact
between the GPU and the simulator): N online levels, then N target levels, tau in [0, 1).

Acting: E_IQN[d] = (1 / K) sum_k Z(x, tau_k)[d] over the K = n_mid midpoints tau_k = (k + 1/2) / K (a fixed
quadrature of the mean over tau, so evaluation stays a deterministic function of the parameters); in collection
each direction d also gets its own level tau_d, drawn from the collector's generator of the environment (4
uniforms, before action selection's draws), and its quantile Z(x, tau_d)[d]: one sample of the IQN distribution
per direction, as the C51 Thompson draw is one atom per direction (kernels/action_select.py).

The fused head kernels write nothing of size [R, W]: cos, phi and h live in registers and shared memory and the
backward recomputes them from taus and x (about a third of its instructions at E = 64; storing phi instead would
cost 2 x 4 R W bytes of traffic, 0.28 GB at B = 8192, N = 32, W = 134: which is cheaper is for the H200 to
measure). They share one inner loop: a thread owns a row (x_i, tau_r) and walks W in tiles of TILE = 16 columns;
per tile the block stages W_e[:, tile] (E x 16), b_e[tile] and W_q[tile, :] in shared memory (5 KB at E = 64:
every read of them is a broadcast, all threads at one address, and 16-byte vector loads), and the thread
accumulates the tile's 16 pre-activations in registers over j < E, the cosines coming from the rotation recurrence
(c, s)_{j+1} = (c c1 - s s1, s c1 + c s1) from (c1, s1) = (cos, sin)(pi tau) in float32. Measured against float64
over 200k random tau (and tau near 0 and 1), E = 64: the rotation's largest error is 1.4e-5 (mostly the float32
rounding of pi tau, which cos(pi j tau) computed directly also has: 1.9e-5 there), the Chebyshev recurrence
cos((j+1)a) = 2 cos a cos(ja) - cos((j-1)a) reaches 1.4e-4 (near tau = 0 or 1 float32 cos a loses a), hence the
rotation. Columns past W are staged as 0, so they add exact zeros.
- iqn_forward: one thread per row, blocks of FWD_THREADS (grid-stride over row blocks: 1 block of 4 threads under
  the simulator); per tile ReLU, h = x phi and the 13 outputs' FMAs from shared W_q.
- iqn_act_values: blocks of ACT_THREADS threads holding ACT_THREADS // L whole samples (L = n_mid (+ 4) levels),
  one thread per (sample, level), only the 4 direction outputs; each (sample, direction) then sums its midpoints
  in k order from shared memory (1 block, grid-stride over sample groups, under the simulator).
- iqn_backward: blocks of BWD_THREADS = 64 threads, each owning the row groups g = p, p + P, ... of GROUP_ROWS //
  N whole samples (P = min(groups, BWD_BLOCKS_PER_SM x 132): one wave). Per tile and group, phase A (a thread per
  row) recomputes phi and writes to shared memory cos [rows, E], dphi = dh x (phi > 0), h and dh phi [rows, 16]
  with dh = dz W_q^T, and dz [rows, 13] (38 KB in all, so 5 blocks fit an SM); phase B (a thread per 4 x 4 block
  of the tile's 64 x 16 dW_e and 4 of its 16 x 13 dW_q, unsigned indices and vector loads) adds the group's rows in
  order into registers; db_e is dW_e's row 0 (cos(0) = 1 exactly, so the same sums bit for bit), db_q 13 threads'
  sums of dz in tile 0; a thread per (sample, column) writes dx = sum_k dh phi in k order (a sample's rows lie in
  one group, so dx needs no partial sums). After its groups the block writes the tile's sums into part[p], and
  iqn_grad_reduce adds part[0], part[1], ... in order. Every sum has a fixed order and no atomics: two runs give
  the same bits, whatever the GPU (P depends on the shapes only).
Sizes: E <= EMBED_MAX = 64 (the backward's 16 x 4 threads cover 64 x 16 of dW_e), N <= GROUP_ROWS = 64, acting
L <= ACT_THREADS = 128 (`check_head` refuses more at construction).
Other launch shapes: grid-stride (`launch_strided`) over rows; the level draws one thread per sample; the loss
signal one block (a fixed-order float64 sum, then the tree: deterministic, no atomics). float32 literals; one
`cuda.shared.array` per line and no alignment under the simulator (kernels/gemm.py's caveats).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import cuda, float32, float64, int32, int64, uint32
from numba.cuda.random import xoroshiro128p_type

from fox_numba.actions import DIR_OFFSET, N_BRANCHES, N_DIRECTIONS, N_HEADS
from fox_numba.device.isv import ISV_TOTAL_DIM, Isv
from fox_numba.device.launch import check_array, i32, launch, launch_rows, launch_strided, strided_threads
from fox_numba.device.registry import register
from fox_numba.device.rng import XOROSHIRO_DTYPE, xoroshiro128p_uniform_float32
from fox_numba.device.runtime import SIMULATOR
from fox_numba.kernels.gemm import SMEM_ALIGN
from fox_numba.kernels.heads import branch_span
from fox_numba.kernels.learner import BOOTSTRAP_RULES, BranchRows, greedy_next
from fox_numba.kernels.nn import SMS
from fox_numba.kernels.signals import LOSS_ALPHA, STATS_BLOCK, EpochStat, check_epoch, ema, finite, tree_sums

TILE = 16  # columns of W a thread's registers hold at once
FWD_THREADS = 256  # iqn_forward's block
ACT_THREADS = 128  # iqn_act_values' block: its rows, ACT_THREADS // L whole samples
BWD_THREADS = 4 * TILE  # iqn_backward's block: 16 x 4 threads, each 4 x 4 of a 64 x 16 dW_e tile
EMBED_MAX = BWD_THREADS  # cosine features the kernels hold
GROUP_ROWS = BWD_THREADS  # rows of one backward group: one per thread in phase A
HEAD_ROW = 16  # a staged W_q row's floats: the 13 heads padded to 16-byte quads (vector loads)
BWD_BLOCKS_PER_SM = 5  # iqn_backward blocks resident per H200 multiprocessor (38 KB of shared memory each)
_PI = np.float32(math.pi)
_INF = np.float32(np.inf)
_NAN = np.float32(np.nan)
_IQN_LOSS = int(Isv.IQN_LOSS_EMA)
_E_IQN = int(EpochStat.LOSS_IQN)
_F1 = float32[::1]
_F2 = float32[:, ::1]
_F3 = float32[:, :, ::1]


@register((xoroshiro128p_type[::1], _F3, int32))
@cuda.jit
def iqn_taus(states, taus, n_samples):
    """taus[0, i, :] then taus[1, i, :]: 2N uniforms in [0, 1) from states[i], one thread per sample."""
    i = cuda.grid(1)
    if i < n_samples:
        for net in range(2):
            for k in range(taus.shape[2]):
                taus[net, i, k] = xoroshiro128p_uniform_float32(states, i)


@register((xoroshiro128p_type[::1], _F2, int32, int32, int32))
@cuda.jit
def iqn_act_taus(states, taus, n_mid, explore, n_samples):
    """taus[i, k] = (k + 1/2) / n_mid for k < n_mid; when explore != 0, taus[i, n_mid + d] = a uniform from
    states[i] for the 4 directions d in order. One thread per sample."""
    i = cuda.grid(1)
    if i < n_samples:
        for k in range(n_mid):
            taus[i, k] = (float32(k) + float32(0.5)) / float32(n_mid)
        if explore != 0:
            for d in range(N_DIRECTIONS):
                taus[i, n_mid + d] = xoroshiro128p_uniform_float32(states, i)


@register((_F2, _F2, _F2, _F2, int32[:, ::1], _F1, _F1, _F1, float32, int32, _F1, _F2, int32))
@cuda.jit
def iqn_quantile_loss(z, z_tgt, taus, q, actions, rewards, discounts, weights, weight, shared, loss, dz, n):
    """loss[r] and the rows of dz of branch row r (module header), one row per iteration; n = 4B."""
    n_samples = actions.shape[0]
    n_taus = taus.shape[1]
    inv_n = float32(1.0) / float32(n_taus)
    r = cuda.grid(1)
    while r < n:
        i = r // N_BRANCHES
        b = r - i * N_BRANCHES
        off, size = branch_span(b)
        bin_t = min(max(actions[i, b], 0), size - 1)
        a_t = off + bin_t
        a_n = greedy_next(q, n_samples, i, b, shared)
        reward = rewards[r]
        discount = discounts[r]
        scale = -weight * weights[r] * inv_n
        acc = float32(0.0)
        for k in range(n_taus):
            row = i * n_taus + k
            zk = z[row, a_t]
            tau = taus[i, k]
            g = float32(0.0)
            for j in range(n_taus):
                u = reward + discount * z_tgt[i * n_taus + j, a_n] - zk
                au = abs(u)
                level = abs(tau - float32(1.0)) if u < float32(0.0) else tau
                if au <= float32(1.0):
                    acc += level * (float32(0.5) * u * u)
                    g += level * u
                elif au < _INF:
                    acc += level * (au - float32(0.5))
                    g += level if u > float32(0.0) else -level
                else:  # NaN or infinite: a non-finite loss and gradient
                    acc += au
                    g += _NAN
            for h in range(size):
                dz[row, off + h] = scale * g if h == bin_t else float32(0.0)
        loss[r] = acc * inv_n
        r += cuda.gridsize(1)


@register((_F1, _F1, _F1, float64[::1], int32))
@cuda.jit
def iqn_loss_ema(loss, weights, isv, epoch, n):
    """One block: total = sum_r weights[r] * loss[r] in float64 (thread j sums rows j, j + blockDim, ... in
    order, then the tree); ISV[IQN_LOSS_EMA] += 0.01 (total - ISV) and epoch LOSS_IQN += total when finite."""
    tid = cuda.threadIdx.x
    acc = cuda.shared.array((1, STATS_BLOCK), float64)
    acc[0, tid] = float64(0.0)
    r = tid
    while r < n:
        acc[0, tid] += float64(weights[r]) * float64(loss[r])
        r += cuda.blockDim.x
    tree_sums(acc, 1, tid)
    if tid == 0:
        total = acc[0, 0]
        ema(isv, _IQN_LOSS, float32(total), LOSS_ALPHA)
        if finite(total):
            epoch[_E_IQN] += total


# ---- the head: fused forward, acting and backward --------------------------------------------------------


@cuda.jit(device=True)
def _embed_tile(swe, tau, n_embed, acc, cs, cs_row, keep):
    """acc[t] = sum_j cos(pi j tau) swe[j, t] for the TILE columns of the staged tile, j < n_embed in order; with
    keep != 0 also cs[cs_row, j] = cos(pi j tau). The cosines come from the rotation recurrence (module header)."""
    a = _PI * tau
    c1 = float32(math.cos(a))
    s1 = float32(math.sin(a))
    c = float32(1.0)
    s = float32(0.0)
    for t in range(TILE):
        acc[t] = float32(0.0)
    n = uint32(n_embed)
    j = uint32(0)
    while j < n:  # unsigned and a plain counter: the hot loop carries no negative-index or range-iterator code
        if keep != 0:
            cs[cs_row, j] = c
        for t in range(TILE):
            acc[t] += c * swe[j, t]
        c, s = c * c1 - s * s1, s * c1 + c * s1
        j += uint32(1)


@cuda.jit(device=True)
def _head_tile(swe, sbe, swq, x, i, w0, tau, n_embed, width, acc, zr, n_out):
    """zr[c] += sum over the staged tile's columns w < width of x[i, w] phi_w(tau) swq[w - w0, c], c < n_out (the
    forward's inner loop, shared by iqn_forward and iqn_act_values); columns past the head's width add nothing."""
    _embed_tile(swe, tau, n_embed, acc, swe, 0, 0)
    for t in range(TILE):
        w = w0 + t
        pre = acc[t] + sbe[t]
        h = x[i, w] * pre if w < width and pre > float32(0.0) else float32(0.0)
        for c in range(n_out):
            zr[c] += h * swq[t, c]


@cuda.jit(device=True)
def _stage(we, be, wq, w0, col0, n_cols, swe, sbe, swq, tid, threads):
    """Shared <- the head's tile of columns [w0, w0 + TILE): swe[j, t] = W_e[j, w0 + t], sbe[t] = b_e[w0 + t],
    swq[t, c] = W_q[w0 + t, col0 + c] for c < n_cols; 0 past the last column (those add exact zeros)."""
    n_embed, width = we.shape
    for e in range(tid, n_embed * TILE, threads):
        j = e // TILE
        w = w0 + e - j * TILE
        swe[j, e - j * TILE] = we[j, w] if w < width else float32(0.0)
    for e in range(tid, TILE * n_cols, threads):
        t = e // n_cols
        w = w0 + t
        swq[t, e - t * n_cols] = wq[w, col0 + e - t * n_cols] if w < width else float32(0.0)
    for t in range(tid, TILE, threads):
        sbe[t] = be[w0 + t] if w0 + t < width else float32(0.0)


@register((_F1, _F2, _F2, _F1, _F2, _F1, _F2, int32))
@cuda.jit
def iqn_forward(taus, x, we, be, wq, bq, z, n_taus):
    """z[r] = Z(x[r // n_taus], taus[r]) for every row r < R = taus.shape[0], one thread per row; the block walks
    the W columns in tiles of TILE staged in shared memory (module header)."""
    swe = cuda.shared.array((EMBED_MAX, TILE), float32, SMEM_ALIGN)
    swq = cuda.shared.array((TILE, HEAD_ROW), float32, SMEM_ALIGN)
    sbe = cuda.shared.array(TILE, float32)
    acc = cuda.local.array(TILE, float32)
    zr = cuda.local.array(N_HEADS, float32)
    n_rows = taus.shape[0]
    n_embed, width = we.shape
    tid = cuda.threadIdx.x
    threads = cuda.blockDim.x
    g = cuda.blockIdx.x
    while g * threads < n_rows:  # block-uniform: every thread reaches every barrier
        r = g * threads + tid
        valid = r < n_rows
        i = r // n_taus
        tau = taus[r] if valid else float32(0.0)
        for a in range(N_HEADS):
            zr[a] = float32(0.0)
        for w0 in range(0, width, TILE):
            cuda.syncthreads()  # the previous tile's reads are done
            _stage(we, be, wq, w0, 0, N_HEADS, swe, sbe, swq, tid, threads)
            cuda.syncthreads()
            if valid:
                _head_tile(swe, sbe, swq, x, i, w0, tau, n_embed, width, acc, zr, N_HEADS)
        if valid:
            for a in range(N_HEADS):
                z[r, a] = zr[a] + bq[a]
        g += cuda.gridDim.x


@register((_F2, _F2, _F2, _F1, _F2, _F1, _F3, int32))
@cuda.jit
def iqn_act_values(taus, x, we, be, wq, bq, values, n_mid):
    """values [B, 2, 4] of the direction heads at the levels taus [B, L] (act_levels'): values[i, 0, d] = the mean
    over k < n_mid of Z(x_i, taus[i, k])[DIR_OFFSET + d] (summed in k order), values[i, 1, d] = Z(x_i, taus[i,
    n_mid + d])[DIR_OFFSET + d] when L > n_mid, else values[i, 0, d]. A block holds blockDim // L whole samples,
    one thread per (sample, level) row; each sample's mean is one thread's fixed-order sum in shared memory."""
    swe = cuda.shared.array((EMBED_MAX, TILE), float32, SMEM_ALIGN)
    swq = cuda.shared.array((TILE, N_DIRECTIONS), float32, SMEM_ALIGN)
    sbe = cuda.shared.array(TILE, float32)
    zs = cuda.shared.array((ACT_THREADS, N_DIRECTIONS), float32)
    acc = cuda.local.array(TILE, float32)
    zr = cuda.local.array(N_DIRECTIONS, float32)
    n_samples, levels = taus.shape
    n_embed, width = we.shape
    tid = cuda.threadIdx.x
    threads = cuda.blockDim.x
    per_block = threads // levels
    s_local = tid // levels
    k = tid - s_local * levels
    g = cuda.blockIdx.x
    while g * per_block < n_samples:  # block-uniform
        i = g * per_block + s_local
        valid = s_local < per_block and i < n_samples
        tau = taus[i, k] if valid else float32(0.0)
        for d in range(N_DIRECTIONS):
            zr[d] = float32(0.0)
        for w0 in range(0, width, TILE):
            cuda.syncthreads()
            _stage(we, be, wq, w0, DIR_OFFSET, N_DIRECTIONS, swe, sbe, swq, tid, threads)
            cuda.syncthreads()
            if valid:
                _head_tile(swe, sbe, swq, x, i, w0, tau, n_embed, width, acc, zr, N_DIRECTIONS)
        if valid:
            for d in range(N_DIRECTIONS):
                zs[tid, d] = zr[d] + bq[DIR_OFFSET + d]
        cuda.syncthreads()
        for o in range(tid, per_block * N_DIRECTIONS, threads):  # a thread per (sample, direction)
            s = o // N_DIRECTIONS
            d = o - s * N_DIRECTIONS
            i = g * per_block + s
            if i < n_samples:
                total = float32(0.0)
                for k2 in range(n_mid):
                    total += zs[s * levels + k2, d]
                mean = total / float32(n_mid)
                values[i, 0, d] = mean
                values[i, 1, d] = zs[s * levels + n_mid + d, d] if levels > n_mid else mean
        g += cuda.gridDim.x


@register((_F1, _F2, _F2, _F1, _F2, _F2, _F2, _F2, int32, int32, int32))
@cuda.jit
def iqn_backward(taus, x, we, be, wq, dz, part, dx, n_taus, mask, n_groups):
    """Block p's partial IQN gradients part[p] (W_e, b_e, W_q, b_q flattened in that order) over its row groups
    g = p, p + gridDim, ... (GROUP_ROWS // n_taus whole samples each), and dx [B, W] of the samples of its
    groups, from dz [R, 13]; cos, phi and h are recomputed. BWD_THREADS threads; module header."""
    swe = cuda.shared.array((EMBED_MAX, TILE), float32, SMEM_ALIGN)
    swq = cuda.shared.array((TILE, HEAD_ROW), float32, SMEM_ALIGN)
    sbe = cuda.shared.array(TILE, float32)
    cs = cuda.shared.array((GROUP_ROWS, EMBED_MAX), float32, SMEM_ALIGN)
    sdphi = cuda.shared.array((GROUP_ROWS, TILE), float32, SMEM_ALIGN)
    sh = cuda.shared.array((GROUP_ROWS, TILE), float32)
    sq = cuda.shared.array((GROUP_ROWS, TILE), float32)
    sdz = cuda.shared.array((GROUP_ROWS, HEAD_ROW), float32)
    acc = cuda.local.array(TILE, float32)
    dzr = cuda.local.array(N_HEADS, float32)
    cu = cuda.local.array(4, float32)
    dp = cuda.local.array(4, float32)
    gwe = cuda.local.array((4, 4), float32)
    gwq = cuda.local.array(4, float32)
    n_rows = taus.shape[0]
    n_embed, width = we.shape
    off_wq = n_embed * width + width
    off_bq = off_wq + width * N_HEADS
    tid = cuda.threadIdx.x
    p = cuda.blockIdx.x
    group = (GROUP_ROWS // n_taus) * n_taus
    # phase B's indices unsigned (no negative-index code in its loop): the thread's W_e rows ju .. ju + 3 and
    # tile columns tv .. tv + 3; its W_q tile row jq and heads tq, tq + 4, tq + 8, tq + 12 (< 13 written)
    jq = uint32(tid) // uint32(4)
    tq = uint32(tid) - jq * uint32(4)
    ju = jq * uint32(4)
    tv = tq * uint32(4)
    for e in range(tid, GROUP_ROWS * EMBED_MAX, BWD_THREADS):  # the columns phase A never writes read as 0
        if e % EMBED_MAX >= n_embed:
            cs[e // EMBED_MAX, e % EMBED_MAX] = float32(0.0)
        if e % EMBED_MAX < HEAD_ROW - N_HEADS:
            sdz[e // EMBED_MAX, N_HEADS + e % EMBED_MAX] = float32(0.0)
    gbq = float32(0.0)
    for w0 in range(0, width, TILE):
        cuda.syncthreads()  # the previous tile's reads are done
        _stage(we, be, wq, w0, 0, N_HEADS, swe, sbe, swq, tid, BWD_THREADS)
        for u in range(4):
            gwq[u] = float32(0.0)
            for v in range(4):
                gwe[u, v] = float32(0.0)
        g = p
        while g < n_groups:  # block-uniform
            r0 = g * group
            rows = min(group, n_rows - r0)
            cuda.syncthreads()  # staging, or the previous group's reads, done
            if tid < rows:  # phase A: one thread per row
                r = r0 + tid
                i = r // n_taus
                _embed_tile(swe, taus[r], n_embed, acc, cs, tid, 1)
                for a in range(N_HEADS):
                    dzr[a] = dz[r, a]
                    sdz[tid, a] = dzr[a]
                for t in range(TILE):
                    w = w0 + t
                    xv = x[i, w] if w < width else float32(0.0)
                    pre = acc[t] + sbe[t]
                    dh = float32(0.0)
                    for a in range(N_HEADS):
                        dh += dzr[a] * swq[t, a]
                    on = pre > float32(0.0)
                    sh[tid, t] = xv * pre if on else float32(0.0)
                    sdphi[tid, t] = dh * xv if on else float32(0.0)
                    sq[tid, t] = dh * pre if on else float32(0.0)
            cuda.syncthreads()
            rr = uint32(0)
            while rr < uint32(rows):  # phase B: a thread per block of outputs, the group's rows in order
                for u in range(4):
                    cu[u] = cs[rr, ju + uint32(u)]
                    dp[u] = sdphi[rr, tv + uint32(u)]
                for u in range(4):
                    for v in range(4):
                        gwe[u, v] += cu[u] * dp[v]
                hv = sh[rr, jq]
                for m in range(4):
                    gwq[m] += hv * sdz[rr, tq + uint32(4 * m)]
                rr += uint32(1)
            if w0 == 0 and TILE <= tid < TILE + N_HEADS:
                for r2 in range(rows):
                    gbq += sdz[r2, tid - TILE]
            o = uint32(tid)
            while o < uint32(rows // n_taus * TILE):  # dx of the group's samples: a thread per (sample, column)
                s = o // uint32(TILE)
                t = o % uint32(TILE)
                w = w0 + int64(t)
                if w < width:
                    i = r0 // n_taus + int64(s)
                    v2 = float32(0.0)
                    k = s * uint32(n_taus)
                    while k < (s + uint32(1)) * uint32(n_taus):  # the sample's levels in order
                        v2 += sq[k, t]
                        k += uint32(1)
                    dx[i, w] = v2 if mask == 0 or x[i, w] > float32(0.0) else float32(0.0)
                o += uint32(BWD_THREADS)
            g += cuda.gridDim.x
        for u in range(4):  # this tile's partials; cos(0 pi tau) = 1, so dW_e's row 0 is db_e, bit for bit
            j = int64(ju) + u
            for v in range(4):
                w = w0 + int64(tv) + v
                if j < n_embed and w < width:
                    part[p, j * width + w] = gwe[u, v]
                    if j == 0:
                        part[p, n_embed * width + w] = gwe[u, v]
        w = w0 + int64(jq)
        for m in range(4):
            a = int64(tq) + 4 * m
            if w < width and a < N_HEADS:
                part[p, off_wq + w * N_HEADS + a] = gwq[m]
    if TILE <= tid < TILE + N_HEADS:
        part[p, off_bq + tid - TILE] = gbq


@register((_F2, _F2, _F1, _F2, _F1, int32))
@cuda.jit
def iqn_grad_reduce(part, gwe, gbe, gwq, gbq, n):
    """The IQN gradients = the sum of the blocks' partials part[0] + part[1] + ... in block order, one thread per
    element of the flattened (W_e, b_e, W_q, b_q); n = their total size."""
    n_embed, width = gwe.shape
    off_be = n_embed * width
    off_wq = off_be + width
    off_bq = off_wq + width * N_HEADS
    e = cuda.grid(1)
    while e < n:
        total = float32(0.0)
        for p in range(part.shape[0]):
            total += part[p, e]
        if e < off_be:
            j = e // width
            gwe[j, e - j * width] = total
        elif e < off_wq:
            gbe[e - off_be] = total
        elif e < off_bq:
            w = (e - off_wq) // N_HEADS
            gwq[w, e - off_wq - w * N_HEADS] = total
        else:
            gbq[e - off_bq] = total
        e += cuda.gridsize(1)


# ---- wrappers (check, then launch; they allocate nothing) ----------------------------------------------


def _shape(arr: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in arr.shape)


def _taus_shape(taus: Any) -> tuple[int, int]:
    if len(taus.shape) != 2 or min(taus.shape) < 1:
        raise ValueError(f"taus must be a float32 array [B, N] with no empty axis, got shape {_shape(taus)}")
    b, n = _shape(taus)
    check_array("taus", taus, "[B, N]", (b, n))
    return b, n


def draw_taus(states: Any, taus: Any, *, stream: Any) -> None:
    """taus [2, B, N] = the online (taus[0]) and target (taus[1]) quantile levels of this step, from the B
    generators `states` (each advances by 2N draws)."""
    if len(taus.shape) != 3 or taus.shape[0] != 2 or min(taus.shape) < 1:
        raise ValueError(f"taus must be a float32 array [2, B, N], got shape {_shape(taus)}")
    _, b, n = _shape(taus)
    check_array("taus", taus, "[2, B, N]", (2, b, n))
    check_array("states", states, "[B]", (b,), XOROSHIRO_DTYPE)
    launch(iqn_taus, b, states, taus, i32(b), stream=stream)


def quantile_loss(z: Any, z_tgt: Any, taus: Any, q: Any, actions: Any, rows: BranchRows, weight: float, loss: Any,
                  dz: Any, *, stream: Any, bootstrap: str = "direction") -> None:
    """The quantile Huber loss of every branch row and its gradient (module header): z, z_tgt [B * N, 13] (the
    online head on s at taus, the target head on s' at the target levels), taus [B, N] the online levels, q [2B,
    13] the online E[Q] of s then s' (a*), actions [B, 4], rows the C51 rows (their rewards, discounts and
    weights) -> loss [4B] (unweighted), dz [B * N, 13] (weight x row weight x d loss / d z; 0 off the taken
    heads). `bootstrap` as learner.bootstrap."""
    b, n = _taus_shape(taus)
    for name, arr in (("z", z), ("z_tgt", z_tgt), ("dz", dz)):
        check_array(name, arr, "[B * N, 13]", (b * n, N_HEADS))
    check_array("q", q, "[2B, 13]", (2 * b, N_HEADS))
    check_array("actions", actions, "[B, 4]", (b, N_BRANCHES), np.int32)
    if rows.batch != b:
        raise ValueError(f"quantile_loss: the C51 rows are of {rows.batch} samples, taus of {b}")
    check_array("loss", loss, "[4B]", (N_BRANCHES * b,))
    if bootstrap not in BOOTSTRAP_RULES or not weight >= 0.0:
        raise ValueError(f"quantile_loss needs bootstrap in {BOOTSTRAP_RULES} and weight >= 0, got {bootstrap!r}, "
                         f"{weight}")
    r = N_BRANCHES * b
    launch_strided(iqn_quantile_loss, r, z, z_tgt, taus, q, actions, rows.rewards, rows.discounts, rows.weights,
                   np.float32(weight), i32(bootstrap == "direction"), loss, dz, i32(r), stream=stream)


def loss_signal(loss: Any, weights: Any, isv: Any, epoch: Any, *, stream: Any) -> None:
    """ISV[IQN_LOSS_EMA] and the epoch's LOSS_IQN from the rows' losses and weights [R]."""
    r = _shape(loss)[0]
    check_array("loss", loss, "[R]", (r,))
    check_array("weights", weights, "[R]", (r,))
    check_array("isv", isv, "[ISV_TOTAL_DIM]", (ISV_TOTAL_DIM,))
    check_epoch(epoch)
    launch_rows(iqn_loss_ema, 1, strided_threads(STATS_BLOCK), loss, weights, isv, epoch, i32(r), stream=stream)


def act_levels(states: Any, taus: Any, n_mid: int, *, explore: bool, stream: Any) -> None:
    """taus [B, n_mid (+ 4 when exploring)]: the n_mid midpoints, then one drawn level per direction from the B
    generators `states` (each advances by 4 draws when exploring, by none otherwise)."""
    b, levels = _taus_shape(taus)
    if n_mid < 1 or levels != n_mid + (N_DIRECTIONS if explore else 0):
        raise ValueError(f"act_levels: taus has {levels} levels per sample; {n_mid} midpoints"
                         f"{' and 4 draws' if explore else ''} need {n_mid + (N_DIRECTIONS if explore else 0)}")
    if len(states.shape) != 1 or states.shape[0] < b:
        raise ValueError(f"states must be a 1-D xoroshiro128p state array of at least B = {b} entries")
    check_array("states", states, "[n >= B]", (int(states.shape[0]),), XOROSHIRO_DTYPE)
    launch(iqn_act_taus, b, states, taus, i32(n_mid), i32(int(explore)), i32(b), stream=stream)




def check_head(n_embed: int, n_taus: int, levels: int = 0) -> None:
    """Refuse sizes the fused kernels cannot hold (module header): n_embed (network.iqn_embed) cosine features,
    n_taus (network.iqn_quantiles) learner levels, `levels` acting levels per sample."""
    if not 1 <= n_embed <= EMBED_MAX:
        raise ValueError(f"network.iqn_embed must be in [1, {EMBED_MAX}] (the fused IQN kernels), got {n_embed}")
    if not 1 <= n_taus <= GROUP_ROWS or levels > ACT_THREADS:
        raise ValueError(f"network.iqn_quantiles must be in [1, {GROUP_ROWS}] and its acting levels (+ 4 draws in "
                         f"collect) at most {ACT_THREADS} (the fused IQN kernels), got {n_taus} and {levels}")


def _head_args(x: Any, we: Any, be: Any, wq: Any, bq: Any | None) -> tuple[int, int, int]:
    """(B, E, W) of x [B, W] and the head's parameters, checked."""
    if len(x.shape) != 2 or len(we.shape) != 2 or min(x.shape) < 1 or we.shape[1] != x.shape[1]:
        raise ValueError(f"x must be [B, W] and the embedding weight [E, W], got {_shape(x)} and {_shape(we)}")
    b, w = _shape(x)
    e = int(we.shape[0])
    check_head(e, 1)
    checks = [("x", x, (b, w)), ("W_e", we, (e, w)), ("b_e", be, (w,)), ("W_q", wq, (w, N_HEADS))]
    for name, arr, shape in checks + ([("b_q", bq, (N_HEADS,))] if bq is not None else []):
        check_array(name, arr, "", shape)
    return b, e, w


def head_forward(taus: Any, x: Any, we: Any, be: Any, wq: Any, bq: Any, z: Any, *, stream: Any) -> None:
    """z [B * N, 13] = Z(x_i, tau_ik) of x [B, W] at the levels taus [B * N] (a [B, N] array flattened), from the
    head's parameters W_e [E, W], b_e [W], W_q [W, 13], b_q [13]."""
    b, _, _ = _head_args(x, we, be, wq, bq)
    rows = _shape(taus)[0]
    if len(taus.shape) != 1 or rows % b:
        raise ValueError(f"taus must be [B * N] for B = {b} samples, got shape {_shape(taus)}")
    check_array("taus", taus, "[B * N]", (rows,))
    check_array("z", z, "[B * N, 13]", (rows, N_HEADS))
    launch_strided(iqn_forward, rows, taus, x, we, be, wq, bq, z, i32(rows // b), stream=stream, block=FWD_THREADS)


def act_values(taus: Any, x: Any, we: Any, be: Any, wq: Any, bq: Any, values: Any, n_mid: int, *,
               stream: Any) -> None:
    """values [B, 2, 4] (E_IQN per direction over the n_mid midpoints, then the sampled quantiles, or E_IQN again
    without draws) of x [B, W] at `act_levels`' taus [B, n_mid (+ 4)] (kernel iqn_act_values)."""
    b, _, _ = _head_args(x, we, be, wq, bq)
    levels = _taus_shape(taus)[1]
    if taus.shape[0] != b or levels not in (n_mid, n_mid + N_DIRECTIONS) or n_mid < 1 or levels > ACT_THREADS:
        raise ValueError(f"act_values: taus {_shape(taus)} for B = {b} samples and {n_mid} midpoints (at most "
                         f"{ACT_THREADS} levels)")
    check_array("values", values, f"[B, 2, {N_DIRECTIONS}]", (b, 2, N_DIRECTIONS))
    blocks = 1 if SIMULATOR else -(-b // (ACT_THREADS // levels))
    launch_rows(iqn_act_values, blocks, ACT_THREADS, taus, x, we, be, wq, bq, values, i32(n_mid), stream=stream)


def backward_groups(batch: int, n_taus: int) -> int:
    """Row groups of the backward over batch x n_taus rows: GROUP_ROWS // n_taus whole samples each."""
    check_head(1, n_taus)
    return -(-batch // (GROUP_ROWS // n_taus))


def backward_blocks(batch: int, n_taus: int) -> int:
    """Blocks (and partial-gradient rows) of the backward: one wave of BWD_BLOCKS_PER_SM per multiprocessor of an
    H200 (a constant, so the bits depend on no GPU), fewer when there are fewer row groups."""
    return min(backward_groups(batch, n_taus), BWD_BLOCKS_PER_SM * SMS)


def head_backward(taus: Any, x: Any, we: Any, be: Any, wq: Any, dz: Any, part: Any, dx: Any, grads: tuple[Any, ...],
                  *, mask: bool, stream: Any) -> None:
    """From dz [B * N, 13] = dL/dz of `head_forward` at taus [B * N]: grads = (dW_e, db_e, dW_q, db_q) (written, not
    added) and dx [B, W] = dL/dx (0 where x <= 0 when `mask`: x is a ReLU's output). part [P, E W + W + 13 W + 13]
    is the scratch of the P = part.shape[0] <= backward_groups(B, N) blocks' partial sums (backward_blocks)."""
    b, e, w = _head_args(x, we, be, wq, None)
    rows = _shape(taus)[0]
    if len(taus.shape) != 1 or rows % b:
        raise ValueError(f"taus must be [B * N] for B = {b} samples, got shape {_shape(taus)}")
    n_taus = rows // b
    groups = backward_groups(b, n_taus)
    size = e * w + w + w * N_HEADS + N_HEADS
    if len(part.shape) != 2 or not 1 <= part.shape[0] <= groups:
        raise ValueError(f"part must be [P, {size}] with 1 <= P <= {groups} row groups, got {_shape(part)}")
    gwe, gbe, gwq, gbq = grads
    checks = [("taus", taus, (rows,)), ("dz", dz, (rows, N_HEADS)), ("part", part, (int(part.shape[0]), size)),
              ("dx", dx, (b, w)), ("dW_e", gwe, (e, w)), ("db_e", gbe, (w,)), ("dW_q", gwq, (w, N_HEADS)),
              ("db_q", gbq, (N_HEADS,))]
    for name, arr, shape in checks:
        check_array(name, arr, "", shape)
    launch_rows(iqn_backward, int(part.shape[0]), BWD_THREADS, taus, x, we, be, wq, dz, part, dx, i32(n_taus),
                i32(int(mask)), i32(groups), stream=stream)
    launch_strided(iqn_grad_reduce, size, part, gwe, gbe, gwq, gbq, i32(size), stream=stream)
