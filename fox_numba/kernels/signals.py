"""ISV producers of the training step, and the epoch accumulators the host reads once per epoch.

Each producer reduces this step's outputs (no stale epoch scratch: the seed's fix) inside the train graph
and folds them into ISV slots; slot meanings are in fox_numba/device/ISV_SLOTS.md.

- q_signals (every step), from the online E[Q] [B, 13] and entropies of the sampled states s:
  Q_ABS_REF / Q_DIR_ABS_REF: EMA 0.05 of the mean |E[Q]| over the magnitude / direction bins;
  Q_MEAN_EMA, Q_STD_EMA: EMA 0.05 of the mean and standard deviation of E[Q] over every (sample, head);
  Q_MAX_ABS: the largest |E[Q]| (no EMA; +inf if any E[Q] is not finite); Q_DIR_GAP_EMA: EMA 0.05 of the mean gap between the best and
  second-best direction E[Q]; ATOM_ENTROPY_EMA: EMA 0.05 of the mean entropy / log(Z); ATOM_UTIL_EMA: EMA
  0.05 of the mean fraction of atoms holding probability > 1e-3 (expected_q's utilisation output).
- loss_signals (every step), from the branch rows (R = 4B, row = sample * 4 + branch):
  LOSS_RAW = sum_r weight_r * loss_r (the optimised loss: branch weight x effect / B per row);
  LOSS_EMA: EMA 0.01 of LOSS_RAW; LOSS_{DIR,MAG,ORD,URG}_EMA: EMA 0.01 of the branch's mean
  cross-entropy over the rows where the branch had an effect; TD_ABS_EMA: EMA 0.05 of the mean |TD| over
  those rows (TD = r + discount * E_target[Q(s', a*)] - E[Q(s, a)]); TARGET_Q_MEAN_EMA: EMA 0.05 of the
  mean target E[Q(s', a*)]; TARGET_Q_DRIFT_EMA: EMA 0.05 of the mean |E_target - E_online| at (s', a*).
- hidden_signals (every diag_every steps; other steps return at once), from the trunk activations of s:
  HIDDEN_RMS_L{0..3}_EMA: EMA 0.01 of each layer's RMS activation (layers past 3 are not reported);
  DEAD_UNIT_FRAC_EMA: EMA 0.01 of the fraction of trunk units that are 0 on every row of the batch.
- The learner's finish_step (kernels/learner.py) produces UPDATE_RMS_EMA, PARAM_NORM and TARGET_DRIFT_EMA.
An EMA never takes a non-finite observation; LOSS_RAW and Q_MAX_ABS are raw values and do. LOSS_RAW is NaN
when any branch row's loss, TD or target E[Q] is not finite, whatever its weight: the landed projection
gives a NaN target atom no mass (so the cross-entropy alone would hide a NaN reward), while the TD carries
the reward, the discount and both networks' values. Such a step moves no loss signal and no epoch loss
sum, and the learner's guard (kernels/learner.py loss_guard) reads LOSS_RAW to skip its update.

Epoch accumulators: float64 [N_EPOCH_STATS] indexed by EpochStat, summed by the producers every step and
read (then zeroed) once per epoch by the host: steps, applied and skipped steps, loss and per-branch loss
of applied steps, gradient norm of applied steps, mean E[Q] and mean |TD| of every step.

Launch shapes: each reduction is two passes. The partials kernel is grid-stride over the rows
(`launch_strided`, blocks of STATS_BLOCK: one row per thread on the GPU, one small block under the
simulator) and reduces each block in shared memory into one row of a float64 partials buffer; the finish
kernel is one block (`launch_rows(.., 1, strided_threads(STATS_BLOCK), ..)`) where thread j sums partials
j, j + blockDim, ... in order, then a shared-memory tree. Fixed order, deterministic, no atomics.
hidden_partials is grid-stride over (layer, row chunk, unit) and writes float32 partials.
"""

from __future__ import annotations

import enum
import math
from typing import Any

import numpy as np
from numba import cuda, float32, float64, from_dtype, int32

from fox_numba.actions import DIR_OFFSET, MAG_OFFSET, N_BRANCHES, N_DIRECTIONS, N_HEADS, ORDER_OFFSET
from fox_numba.device.isv import ISV_TOTAL_DIM, Isv
from fox_numba.device.launch import (
    check_array,
    grid_1d,
    i32,
    launch_rows,
    launch_strided,
    strided_blocks,
    strided_threads,
)
from fox_numba.device.registry import register
from fox_numba.kernels.optim import OPTIM_STATE_DTYPE, check_state

STATS_BLOCK = 256  # threads of the single-block reductions on the GPU (a power of two)
HIDDEN_CHUNK = 256  # rows per partial of the hidden-activation reduction
MAX_HIDDEN_LAYERS = 4  # HIDDEN_RMS_L0..L3
N_HIDDEN_SUMS = MAX_HIDDEN_LAYERS + 1  # the layers' sums of squares, then the dead-unit count
Q_ALPHA = np.float32(0.05)
LOSS_ALPHA = np.float32(0.01)
HIDDEN_ALPHA = np.float32(0.01)
_STATE = from_dtype(OPTIM_STATE_DTYPE)


class EpochStat(enum.IntEnum):
    """Index of each epoch accumulator (float64 sums since the last read)."""

    STEPS = 0  # gradient steps run
    APPLIED = 1  # steps that updated the parameters
    SKIPPED = 2  # steps skipped by the non-finite guard
    LOSS = 3  # LOSS_RAW of applied steps
    LOSS_DIR = 4  # per-branch mean cross-entropy of applied steps
    LOSS_MAG = 5
    LOSS_ORD = 6
    LOSS_URG = 7
    GRAD_NORM = 8  # GRAD_NORM_RAW of applied steps
    Q_MEAN = 9  # batch mean E[Q] of every step (0 for a step whose E[Q] is not finite)
    TD_ABS = 10  # batch mean |TD| of finite steps
    LOSS_AUX = 11  # mean (forecast - target)**2 / 2 of the auxiliary regression, every step (as Q_MEAN)
    LOSS_IQN = 12  # the IQN quantile Huber loss (IQN_LOSS_EMA's observation) of every finite step
    SPECTRAL_SIGMA = 13  # the online trunk's spectral norm sigma, mean over layers, every step (kernels/spectral.py)
    MOE_BALANCE = 14  # the MoE load-balance term mean_b K sum_k u_bk**2 of every finite step (kernels/moe.py)
    LOSS_MEAN = 15  # the direction mean head's weighted mean squared error / 2, every step (kernels/mean_head.py)
    MEAN_GAP = 16  # the mean head's top direction value less its second, batch mean of every finite step


N_EPOCH_STATS = 17

_Q_ABS_REF = int(Isv.Q_ABS_REF)
_Q_DIR_ABS_REF = int(Isv.Q_DIR_ABS_REF)
_Q_MEAN = int(Isv.Q_MEAN_EMA)
_Q_STD = int(Isv.Q_STD_EMA)
_Q_MAX = int(Isv.Q_MAX_ABS)
_Q_GAP = int(Isv.Q_DIR_GAP_EMA)
_ENTROPY = int(Isv.ATOM_ENTROPY_EMA)
_UTIL = int(Isv.ATOM_UTIL_EMA)
_LOSS_RAW = int(Isv.LOSS_RAW)
_LOSS_EMA = int(Isv.LOSS_EMA)
_LOSS_DIR = int(Isv.LOSS_DIR_EMA)  # LOSS_DIR..LOSS_URG are consecutive slots, in branch order
_TD = int(Isv.TD_ABS_EMA)
_TARGET_Q = int(Isv.TARGET_Q_MEAN_EMA)
_TARGET_Q_DRIFT = int(Isv.TARGET_Q_DRIFT_EMA)
_HIDDEN_RMS = int(Isv.HIDDEN_RMS_L0_EMA)  # L0..L3 consecutive
_DEAD = int(Isv.DEAD_UNIT_FRAC_EMA)
_E_STEPS, _E_LOSS, _E_LOSS_DIR = int(EpochStat.STEPS), int(EpochStat.LOSS), int(EpochStat.LOSS_DIR)
_E_Q, _E_TD = int(EpochStat.Q_MEAN), int(EpochStat.TD_ABS)
assert [int(Isv.LOSS_DIR_EMA) + b for b in range(4)] == [int(Isv.LOSS_DIR_EMA), int(Isv.LOSS_MAG_EMA),
                                                         int(Isv.LOSS_ORD_EMA), int(Isv.LOSS_URG_EMA)]
assert [int(Isv.HIDDEN_RMS_L0_EMA) + k for k in range(4)] == [int(Isv.HIDDEN_RMS_L0_EMA), int(Isv.HIDDEN_RMS_L1_EMA),
                                                              int(Isv.HIDDEN_RMS_L2_EMA), int(Isv.HIDDEN_RMS_L3_EMA)]

N_Q_SUMS = 7  # |q| direction, |q| magnitude, q, q**2, direction gap, entropy, atom utilisation
N_Q_PARTIALS = N_Q_SUMS + 1  # the sums, then the largest |E[Q]|
N_LOSS_SUMS = 2 + 2 * N_BRANCHES + 4  # total, td, per-branch loss and count, effective rows, target q, drift, bad


@cuda.jit(device=True)
def finite(x):
    return not (math.isinf(x) or math.isnan(x))


@cuda.jit(device=True)
def ema(isv, slot, x, alpha):
    """isv[slot] += alpha * (x - isv[slot]), unless x is not finite."""
    if finite(x):
        isv[slot] += alpha * (x - isv[slot])


@cuda.jit(device=True)
def tree_sums(acc, n_sums, tid):
    """acc[k, 0] = sum over acc[k, 0:blockDim] for k < n_sums (halving tree; blockDim a power of two)."""
    cuda.syncthreads()
    s = cuda.blockDim.x // 2
    while s > 0:
        if tid < s:
            for k in range(n_sums):
                acc[k, tid] += acc[k, tid + s]
        cuda.syncthreads()
        s //= 2


@cuda.jit(device=True)
def sum_partials(partials, n_partials, acc, n_sums, tid):
    """acc[k, tid] = partials[j, k] summed over j = tid, tid + blockDim, ... (k < n_sums), in order."""
    for k in range(n_sums):
        acc[k, tid] = float64(0.0)
    j = tid
    while j < n_partials:
        for k in range(n_sums):
            acc[k, tid] += partials[j, k]
        j += cuda.blockDim.x


@register((float32[:, ::1], float32[:, ::1], float32[:, ::1], float64[:, ::1], int32))
@cuda.jit
def q_partials(q, entropy, util, partials, n_rows):
    """partials[block] = the block's sums of the Q statistics over its rows of q, entropy, util [rows, N_HEADS]
    (rows 0..n_rows-1, grid-stride), then its largest |E[Q]| (+inf for a non-finite E[Q])."""
    tid = cuda.threadIdx.x
    acc = cuda.shared.array((N_Q_SUMS, STATS_BLOCK), float64)
    top = cuda.shared.array(STATS_BLOCK, float32)
    for k in range(N_Q_SUMS):
        acc[k, tid] = float64(0.0)
    hi = float32(0.0)
    i = cuda.grid(1)
    while i < n_rows:
        best = q[i, DIR_OFFSET]
        second = float32(-math.inf)
        for d in range(N_DIRECTIONS):
            x = q[i, DIR_OFFSET + d]
            acc[0, tid] += float64(abs(x))
            if d > 0:
                if x > best:
                    second = best
                    best = x
                elif x > second:
                    second = x
        acc[4, tid] += float64(best - second)
        for a in range(N_HEADS):
            x = q[i, a]
            if a >= MAG_OFFSET and a < ORDER_OFFSET:
                acc[1, tid] += float64(abs(x))
            acc[2, tid] += float64(x)
            acc[3, tid] += float64(x) * float64(x)
            acc[5, tid] += float64(entropy[i, a])
            acc[6, tid] += float64(util[i, a])
            if not finite(x):
                hi = float32(math.inf)  # a non-finite E[Q] shows as an infinite Q_MAX_ABS
            elif abs(x) > hi:
                hi = abs(x)
        i += cuda.gridsize(1)
    top[tid] = hi
    tree_sums(acc, N_Q_SUMS, tid)
    s = cuda.blockDim.x // 2
    while s > 0:
        if tid < s and top[tid + s] > top[tid]:
            top[tid] = top[tid + s]
        cuda.syncthreads()
        s //= 2
    if tid == 0:
        for k in range(N_Q_SUMS):
            partials[cuda.blockIdx.x, k] = acc[k, 0]
        partials[cuda.blockIdx.x, N_Q_SUMS] = float64(top[0])


@register((float64[:, ::1], float32[::1], float64[::1], int32, int32, int32))
@cuda.jit
def q_finish(partials, isv, epoch, n_partials, n_rows, n_atoms):
    """The Q signals of the module header from the first n_partials partials of `q_partials`."""
    tid = cuda.threadIdx.x
    acc = cuda.shared.array((N_Q_SUMS, STATS_BLOCK), float64)
    top = cuda.shared.array(STATS_BLOCK, float64)
    sum_partials(partials, n_partials, acc, N_Q_SUMS, tid)
    hi = float64(0.0)
    j = tid
    while j < n_partials:
        hi = max(hi, partials[j, N_Q_SUMS])
        j += cuda.blockDim.x
    top[tid] = hi
    tree_sums(acc, N_Q_SUMS, tid)
    s = cuda.blockDim.x // 2
    while s > 0:
        if tid < s and top[tid + s] > top[tid]:
            top[tid] = top[tid + s]
        cuda.syncthreads()
        s //= 2
    if tid == 0:
        rows = float64(n_rows)
        count = rows * float64(N_HEADS)
        mean = acc[2, 0] / count
        var = max(acc[3, 0] / count - mean * mean, float64(0.0))
        ema(isv, _Q_DIR_ABS_REF, float32(acc[0, 0] / (rows * float64(N_DIRECTIONS))), Q_ALPHA)
        ema(isv, _Q_ABS_REF, float32(acc[1, 0] / (rows * float64(ORDER_OFFSET - MAG_OFFSET))), Q_ALPHA)
        ema(isv, _Q_MEAN, float32(mean), Q_ALPHA)
        ema(isv, _Q_STD, float32(math.sqrt(var)), Q_ALPHA)
        ema(isv, _Q_GAP, float32(acc[4, 0] / rows), Q_ALPHA)
        ema(isv, _ENTROPY, float32(acc[5, 0] / count / math.log(float64(n_atoms))), Q_ALPHA)
        ema(isv, _UTIL, float32(acc[6, 0] / count), Q_ALPHA)
        isv[_Q_MAX] = float32(top[0])
        if finite(mean):  # a non-finite forward (a step the guard skips) adds nothing
            epoch[_E_Q] += mean


@register((float32[::1], float32[::1], float32[:, ::1], float64[:, ::1], int32))
@cuda.jit
def loss_partials(loss, weights, row_stats, partials, n_rows):
    """partials[block] = the block's sums of the loss statistics over its branch rows (grid-stride)."""
    tid = cuda.threadIdx.x
    acc = cuda.shared.array((N_LOSS_SUMS, STATS_BLOCK), float64)
    for k in range(N_LOSS_SUMS):
        acc[k, tid] = float64(0.0)
    r = cuda.grid(1)
    while r < n_rows:
        b = r % N_BRANCHES
        w = weights[r]
        lr_ = float64(loss[r])
        acc[0, tid] += float64(w) * lr_
        if w > float32(0.0):
            acc[1, tid] += abs(float64(row_stats[r, 0]))
            acc[2 + b, tid] += lr_
            acc[2 + N_BRANCHES + b, tid] += float64(1.0)
            acc[2 + 2 * N_BRANCHES, tid] += float64(1.0)
        acc[3 + 2 * N_BRANCHES, tid] += float64(row_stats[r, 1])
        acc[4 + 2 * N_BRANCHES, tid] += abs(float64(row_stats[r, 2]))
        if not (finite(loss[r]) and finite(row_stats[r, 0]) and finite(row_stats[r, 1])):
            acc[5 + 2 * N_BRANCHES, tid] += float64(1.0)
        r += cuda.gridsize(1)
    tree_sums(acc, N_LOSS_SUMS, tid)
    if tid == 0:
        for k in range(N_LOSS_SUMS):
            partials[cuda.blockIdx.x, k] = acc[k, 0]


@register((float64[:, ::1], float32[::1], float64[::1], int32, int32))
@cuda.jit
def loss_finish(partials, isv, epoch, n_partials, n_samples):
    """The loss signals of the module header from the first n_partials partials of `loss_partials`."""
    tid = cuda.threadIdx.x
    acc = cuda.shared.array((N_LOSS_SUMS, STATS_BLOCK), float64)
    sum_partials(partials, n_partials, acc, N_LOSS_SUMS, tid)
    tree_sums(acc, N_LOSS_SUMS, tid)
    if tid == 0:
        n_rows = n_samples * N_BRANCHES
        epoch[_E_STEPS] += float64(1.0)
        total = float32(acc[0, 0])
        if acc[5 + 2 * N_BRANCHES, 0] > float64(0.0):
            total = float32(math.nan)  # a non-finite row anywhere: the guard skips the step
        isv[_LOSS_RAW] = total
        if not finite(total):
            return
        ema(isv, _LOSS_EMA, total, LOSS_ALPHA)
        effective = max(acc[2 + 2 * N_BRANCHES, 0], float64(1.0))
        td = float32(acc[1, 0] / effective)
        ema(isv, _TD, td, Q_ALPHA)
        ema(isv, _TARGET_Q, float32(acc[3 + 2 * N_BRANCHES, 0] / float64(n_rows)), Q_ALPHA)
        ema(isv, _TARGET_Q_DRIFT, float32(acc[4 + 2 * N_BRANCHES, 0] / float64(n_rows)), Q_ALPHA)
        epoch[_E_LOSS] += acc[0, 0]
        epoch[_E_TD] += float64(td)
        for b in range(N_BRANCHES):
            count = acc[2 + N_BRANCHES + b, 0]
            if count > float64(0.0):
                mean_b = float32(acc[2 + b, 0] / count)
                ema(isv, _LOSS_DIR + b, mean_b, LOSS_ALPHA)
                epoch[_E_LOSS_DIR + b] += float64(mean_b)


@register((float32[:, :, ::1], float32[:, :, :, ::1], _STATE[::1], int32, int32))
@cuda.jit
def hidden_partials(acts, partials, state, n_rows, diag_every):
    """partials[l, c, u] = (sum of squares, count of nonzeros) of unit u of layer l over row chunk c of the
    first n_rows rows; only on steps that are a multiple of diag_every."""
    if state[0].step % diag_every != 0:
        return
    n_layers, _rows, n_units = acts.shape
    n_chunks = partials.shape[1]
    n = n_layers * n_chunks * n_units
    t = cuda.grid(1)
    while t < n:
        u = t % n_units
        lc = t // n_units
        c = lc % n_chunks
        layer = lc // n_chunks
        sq = float32(0.0)
        nz = float32(0.0)
        stop = min((c + 1) * HIDDEN_CHUNK, n_rows)
        for i in range(c * HIDDEN_CHUNK, stop):
            x = acts[layer, i, u]
            sq += x * x
            if x != float32(0.0):
                nz += float32(1.0)
        partials[layer, c, u, 0] = sq
        partials[layer, c, u, 1] = nz
        t += cuda.gridsize(1)


@register((float32[:, :, :, ::1], float32[::1], _STATE[::1], int32, int32))
@cuda.jit
def hidden_finish(partials, isv, state, n_rows, diag_every):
    """HIDDEN_RMS_L*_EMA and DEAD_UNIT_FRAC_EMA from `hidden_partials` (same steps only)."""
    if state[0].step % diag_every != 0:
        return
    tid = cuda.threadIdx.x
    acc = cuda.shared.array((N_HIDDEN_SUMS, STATS_BLOCK), float64)
    n_layers, n_chunks, n_units, _two = partials.shape
    for k in range(N_HIDDEN_SUMS):
        acc[k, tid] = float64(0.0)
    u = tid
    while u < n_units:
        for layer in range(n_layers):
            sq = float64(0.0)
            nz = float64(0.0)
            for c in range(n_chunks):
                sq += float64(partials[layer, c, u, 0])
                nz += float64(partials[layer, c, u, 1])
            if layer < MAX_HIDDEN_LAYERS:
                acc[layer, tid] += sq
            if nz == float64(0.0):
                acc[MAX_HIDDEN_LAYERS, tid] += float64(1.0)
        u += cuda.blockDim.x
    tree_sums(acc, N_HIDDEN_SUMS, tid)
    if tid == 0:
        for layer in range(min(n_layers, MAX_HIDDEN_LAYERS)):
            rms = float32(math.sqrt(acc[layer, 0] / (float64(n_rows) * float64(n_units))))
            ema(isv, _HIDDEN_RMS + layer, rms, HIDDEN_ALPHA)
        dead = float32(acc[MAX_HIDDEN_LAYERS, 0] / (float64(n_layers) * float64(n_units)))
        ema(isv, _DEAD, dead, HIDDEN_ALPHA)


def _check_isv(isv: Any) -> None:
    check_array("isv", isv, "[ISV_TOTAL_DIM]", (ISV_TOTAL_DIM,))


def check_epoch(epoch: Any) -> None:
    check_array("epoch", epoch, "[N_EPOCH_STATS]", (N_EPOCH_STATS,), np.float64)


def signal_partials_shape(n_rows: int, n_values: int) -> tuple[int, int]:
    """Shape of the float64 partials buffer of a two-pass reduction over n_rows rows (the GPU's block
    count; the simulator uses the first partial only)."""
    return (grid_1d(n_rows, STATS_BLOCK), n_values)


def produce_q_signals(q: Any, entropy: Any, util: Any, partials: Any, isv: Any, epoch: Any, *, n_rows: int,
                      n_atoms: int, stream: Any) -> None:
    """Q statistics of the first n_rows rows of q, entropy, util (expected_q's outputs) [rows, N_HEADS] into the
    ISV and the epoch sums; partials: float64 signal_partials_shape(n_rows, N_Q_PARTIALS)."""
    rows = int(q.shape[0])
    check_array("q", q, "[rows, N_HEADS]", (rows, N_HEADS))
    check_array("entropy", entropy, "[rows, N_HEADS]", (rows, N_HEADS))
    check_array("util", util, "[rows, N_HEADS]", (rows, N_HEADS))
    check_array("partials", partials, "signal_partials_shape(n_rows, N_Q_PARTIALS)",
                signal_partials_shape(n_rows, N_Q_PARTIALS), np.float64)
    _check_isv(isv)
    check_epoch(epoch)
    if not 1 <= n_rows <= rows or n_atoms < 2:
        raise ValueError(f"q signals: need 1 <= n_rows <= {rows} and n_atoms >= 2, got {n_rows}, {n_atoms}")
    launch_strided(q_partials, n_rows, q, entropy, util, partials, i32(n_rows), stream=stream, block=STATS_BLOCK)
    launch_rows(q_finish, 1, strided_threads(STATS_BLOCK), partials, isv, epoch,
                i32(strided_blocks(n_rows, STATS_BLOCK)), i32(n_rows), i32(n_atoms), stream=stream)


def produce_loss_signals(loss: Any, weights: Any, row_stats: Any, partials: Any, isv: Any, epoch: Any, *,
                         stream: Any) -> None:
    """Loss statistics of the branch rows (loss, weights [R], row_stats [R, 3]) into the ISV and epoch sums;
    partials: float64 signal_partials_shape(R, N_LOSS_SUMS)."""
    r = int(loss.shape[0])
    if r % N_BRANCHES or r < N_BRANCHES:
        raise ValueError(f"loss signals: R = {r} rows is not a positive multiple of {N_BRANCHES}")
    check_array("loss", loss, "[R]", (r,))
    check_array("weights", weights, "[R]", (r,))
    check_array("row_stats", row_stats, "[R, 3]", (r, 3))
    check_array("partials", partials, "signal_partials_shape(R, N_LOSS_SUMS)", signal_partials_shape(r, N_LOSS_SUMS),
                np.float64)
    _check_isv(isv)
    check_epoch(epoch)
    launch_strided(loss_partials, r, loss, weights, row_stats, partials, i32(r), stream=stream, block=STATS_BLOCK)
    launch_rows(loss_finish, 1, strided_threads(STATS_BLOCK), partials, isv, epoch,
                i32(strided_blocks(r, STATS_BLOCK)), i32(r // N_BRANCHES), stream=stream)


def hidden_partials_shape(n_layers: int, n_rows: int, hidden: int) -> tuple[int, int, int, int]:
    """Shape of the float32 partials buffer of `produce_hidden_signals`."""
    return (n_layers, -(-n_rows // HIDDEN_CHUNK), hidden, 2)


def produce_hidden_signals(
    acts: Any, partials: Any, isv: Any, state: Any, *, n_rows: int, diag_every: int, stream: Any
) -> None:
    """Hidden RMS and dead-unit fraction of the first n_rows rows of acts [L, rows, H], every diag_every steps."""
    n_layers, rows, hidden = (int(d) for d in acts.shape)
    check_array("acts", acts, "[L, rows, H]", (n_layers, rows, hidden))
    if not 1 <= n_rows <= rows or diag_every < 1:
        raise ValueError(f"hidden signals: need 1 <= n_rows <= {rows} and diag_every >= 1, got {n_rows}, {diag_every}")
    shape = hidden_partials_shape(n_layers, n_rows, hidden)
    check_array("partials", partials, "[L, chunks, H, 2]", shape)
    _check_isv(isv)
    check_state(state)
    n = n_layers * shape[1] * hidden
    launch_strided(hidden_partials, n, acts, partials, state, i32(n_rows), i32(diag_every), stream=stream)
    launch_rows(hidden_finish, 1, strided_threads(STATS_BLOCK), partials, isv, state, i32(n_rows), i32(diag_every),
                stream=stream)
