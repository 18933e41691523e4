"""The direction mean head's loss (network.mean_head; its forward and backward are dense layers: agent/mean_head.py).

    mean_loss(m, m_tgt, actions, rows, weight, dm, epoch, stream=s)   dm [B, 4], the epoch's LOSS_MEAN and MEAN_GAP

The head m(x, d), d < 4, is linear on the C51 heads' input x. m [2B, 4] holds the online head on the batch's s
rows, then its s' rows; m_tgt [B, 4] the target network's head on s'. For sample i with taken direction
a_i = actions[i, 0], the direction branch row r = 4 i of the C51 rows (kernels/learner.py BranchRows: its reward,
its discount gamma**k (1 - done) and its weight w_i = branch_weight x effect / B, times the importance weight with
prioritised replay):

    a*_i  = argmax_d m[B + i, d]               (double DQN on the head itself; ties to the lowest direction)
    y_i   = rewards[r] + discounts[r] m_tgt[i, a*_i]
    e_i   = m[i, a_i] - y_i
    loss  = weight sum_i w_i e_i**2 / 2
    dm[i, a_i] = weight w_i e_i, 0 in the other three columns

A non-finite e_i gives a non-finite gradient, so the learner's non-finite guard skips the step. The epoch sums
(kernels/signals.py EpochStat) get LOSS_MEAN += sum_i w_i e_i**2 / 2 / sum_i w_i (the weighted mean, before
`weight`) and MEAN_GAP += the mean over the s rows of the head's top value less its second (the margin of the
greedy direction, the figure learner_ablation_h200.md section 31 read off the C51 E[Q]), each only when finite.
Two passes, as kernels/signals.py's reductions: mean_loss_partials is grid-stride over the samples (one per thread
on the GPU, blocks of STATS_BLOCK), writes dm and reduces each block's three sums into a row of the float64
partials buffer (`mean_loss_partials_shape`); mean_loss_finish, one block, sums the rows in a fixed order and moves
the epoch sums. Fixed order, no atomics: the same bits on every run of a batch size. (One block walking the whole
batch took 44 us of the 0.69-ms default step on an H200: profile_default_tf32_h200.md.)
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import cuda, float32, float64, int32

from fox_numba.actions import N_BRANCHES, N_DIRECTIONS
from fox_numba.device.launch import check_array, launch_rows, launch_strided, strided_blocks, strided_threads
from fox_numba.device.registry import register
from fox_numba.kernels.learner import BranchRows
from fox_numba.kernels.signals import (
    N_EPOCH_STATS,
    STATS_BLOCK,
    EpochStat,
    finite,
    signal_partials_shape,
    sum_partials,
    tree_sums,
)

_E_LOSS = int(EpochStat.LOSS_MEAN)
_E_GAP = int(EpochStat.MEAN_GAP)
_NEG_INF = np.float32(-np.inf)
N_MEAN_SUMS = 3  # the partials' columns: sum w e**2 / 2, sum w, sum of the top-two gaps
_F1 = float32[::1]
_F2 = float32[:, ::1]


@register((_F2, _F2, int32[:, ::1], _F1, _F1, _F1, float32, _F2, float64[:, ::1], int32))
@cuda.jit
def mean_loss_partials(m, m_tgt, actions, rewards, discounts, weights, weight, dm, partials, n_samples):
    """dm, and partials[block] = the block's sums of w e**2 / 2, w and the head's top-two gap (grid-stride)."""
    tid = cuda.threadIdx.x
    acc = cuda.shared.array((N_MEAN_SUMS, STATS_BLOCK), float64)
    for k in range(N_MEAN_SUMS):
        acc[k, tid] = float64(0.0)
    i = cuda.grid(1)
    while i < n_samples:
        nxt = n_samples + i
        best = 0
        for d in range(1, N_DIRECTIONS):
            if m[nxt, d] > m[nxt, best]:
                best = d
        r = N_BRANCHES * i
        y = rewards[r] + discounts[r] * m_tgt[i, best]
        taken = actions[i, 0]
        e = m[i, taken] - y
        w = weights[r]
        for d in range(N_DIRECTIONS):
            dm[i, d] = weight * w * e if d == taken else float32(0.0)
        acc[0, tid] += float64(w) * float64(e) * float64(e) * float64(0.5)
        acc[1, tid] += float64(w)
        top = 0
        for d in range(1, N_DIRECTIONS):
            if m[i, d] > m[i, top]:
                top = d
        second = _NEG_INF
        for d in range(N_DIRECTIONS):
            if d != top:
                second = max(second, m[i, d])
        acc[2, tid] += float64(m[i, top]) - float64(second)
        i += cuda.gridsize(1)
    tree_sums(acc, N_MEAN_SUMS, tid)
    if tid == 0:
        for k in range(N_MEAN_SUMS):
            partials[cuda.blockIdx.x, k] = acc[k, 0]


@register((float64[:, ::1], float64[::1], int32, int32))
@cuda.jit
def mean_loss_finish(partials, epoch, n_partials, n_samples):
    """LOSS_MEAN and MEAN_GAP of the module header from the first n_partials rows of `mean_loss_partials`."""
    tid = cuda.threadIdx.x
    acc = cuda.shared.array((N_MEAN_SUMS, STATS_BLOCK), float64)
    sum_partials(partials, n_partials, acc, N_MEAN_SUMS, tid)
    tree_sums(acc, N_MEAN_SUMS, tid)
    if tid == 0:
        if acc[1, 0] > float64(0.0) and finite(acc[0, 0]):
            epoch[_E_LOSS] += acc[0, 0] / acc[1, 0]
        if finite(acc[2, 0]):
            epoch[_E_GAP] += acc[2, 0] / float64(n_samples)


def mean_loss_partials_shape(batch: int) -> tuple[int, int]:
    """Shape of the float64 partials buffer `mean_loss` takes for a batch of `batch` samples."""
    return signal_partials_shape(batch, N_MEAN_SUMS)


def mean_loss(m: Any, m_tgt: Any, actions: Any, rows: BranchRows, weight: float, dm: Any, partials: Any, epoch: Any,
              *, stream: Any) -> None:
    """dm [B, 4] and the epoch's LOSS_MEAN and MEAN_GAP (module header) from m [2B, 4] (online, s then s'), m_tgt
    [B, 4] (target, s'), actions int32 [B, 4] and the C51 rows' rewards, discounts and weights; `partials` float64
    [mean_loss_partials_shape(B)] is the two passes' scratch."""
    b = rows.batch
    check_array("m", m, "[2B, 4]", (2 * b, N_DIRECTIONS), np.float32)
    check_array("m_tgt", m_tgt, "[B, 4]", (b, N_DIRECTIONS), np.float32)
    check_array("actions", actions, "[B, 4]", (b, N_BRANCHES), np.int32)
    check_array("dm", dm, "[B, 4]", (b, N_DIRECTIONS), np.float32)
    check_array("partials", partials, "mean_loss_partials_shape(B)", mean_loss_partials_shape(b), np.float64)
    check_array("epoch", epoch, "[N_EPOCH_STATS]", (N_EPOCH_STATS,), np.float64)
    if not weight >= 0:
        raise ValueError(f"learner.mean_weight must be >= 0, got {weight}")
    launch_strided(mean_loss_partials, b, m, m_tgt, actions, rows.rewards, rows.discounts, rows.weights,
                   np.float32(weight), dm, partials, int32(b), stream=stream, block=STATS_BLOCK)
    launch_rows(mean_loss_finish, 1, strided_threads(STATS_BLOCK), partials, epoch,
                int32(strided_blocks(b, STATS_BLOCK)), int32(b), stream=stream)
