"""Kernels that fill the HEALTH_DIAG snapshot (fox_numba/diag/layout.py) in mapped pinned memory.

The snapshot is one record of 4-byte words; kernels take two flat views of it, `snap_f` (float32) and
`snap_u` (uint32), and write words by index (the layout's compile-time constants), so the host never
copies a per-sample buffer to build it: it reads the mapped record after a synchronisation, and formats.

Launch shapes:
- isv_mirror: 1-D, one thread per mirrored field (ISV slot -> word).
- action_histogram: one block of DIAG_BLOCK threads; thread t counts the rows t, t + DIAG_BLOCK, ... of
  actions [N, 4] into 13 per-head counters, then a shared-memory tree adds the threads' counters.
  Integer sums: the same result in any order, so deterministic without atomics.
- finalise: one thread: the step counter, the clipped gradient norm, lr_eff and tau_eff from the learner's
  optimiser state and the ISV, the limit fill rate from the collect environments' metrics record.
- tally_actions: one thread per row (per evaluation environment, every evaluation step), count_histogram
  one block once per validation pass: the eval histogram without a block reduction per step.
- noisy_sigma_means (network.noisy_sigma0 > 0, with each snapshot): one block of DIAG_BLOCK threads per
  branch; mean |sigma| over the noisy head's weights and biases of the branch's columns (its value stream and
  its heads' advantage streams, kernels/noisy.py), float64 per thread (strided, in order), then the tree.
- magnitude_stats: one block of DIAG_BLOCK threads; per magnitude bin, over the rows whose direction is
  Long or Short: count, wins (reward > 0), sum and sum of squares of the reward, in float64 per thread
  (strided rows, in order), then a fixed shared-memory tree: the same bits on every run.
Constraints: float32 literals; one `cuda.shared.array` per source line; no warp shuffles (the simulator
has none, and the trees are short).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import cuda, float32, float64, from_dtype, int32, uint32

from fox_numba.actions import DIR_OFFSET, LONG, MAG_OFFSET, N_BRANCHES, N_HEADS, ORDER_OFFSET, SHORT, URGENCY_OFFSET
from fox_numba.device.isv import ISV_TOTAL_DIM, Isv
from fox_numba.device.launch import check_array, i32, launch, launch_rows
from fox_numba.device.registry import register
from fox_numba.device.runtime import SIMULATOR
from fox_numba.diag.layout import (
    N_WORDS,
    W_EVAL_HIST,
    W_GRAD_CLIPPED,
    W_LIMIT_FILL,
    W_LR_EFF,
    W_MAG_VAR,
    W_MAG_WIN,
    W_NOISY_SIGMA,
    W_STEP,
    W_TAU_EFF,
    W_TRAIN_HIST,
)
from fox_numba.kernels.env import thread_block
from fox_numba.kernels.env_stats import METRIC_NAMES, N_METRICS
from fox_numba.kernels.heads import branch_span
from fox_numba.kernels.noisy import n_atoms_of
from fox_numba.kernels.optim import LR_FLOOR, OPTIM_STATE_DTYPE

# Threads of the single-block reductions; a power of two (the trees halve it). Under the simulator, which
# pays for every thread, 4 (the sums are integers or float64 trees: fewer threads change no result's
# meaning, and the integer histograms not even a bit).
DIAG_BLOCK = 4 if SIMULATOR else 256
M_FILL_RATE = METRIC_NAMES.index("fill_rate")
N_MAGS = 3
MAG_COLS = 4 * N_MAGS  # count, wins, sum, sum of squares per magnitude (a constant: shared shapes must be)


@register((float32[::1], int32[::1], int32[::1], float32[::1], int32))
@cuda.jit
def isv_mirror(isv, slots, words, snap_f, n):
    """snap_f[words[k]] = isv[slots[k]] for k < n."""
    k = cuda.grid(1)
    if k < n:
        snap_f[words[k]] = isv[slots[k]]


@cuda.jit(device=True)
def _tree_sum_i32(acc, tid):
    """acc[0, :] = sum over rows of acc[0:DIAG_BLOCK, :] by halving; every thread of the block calls it."""
    cuda.syncthreads()
    s = DIAG_BLOCK // 2
    while s > 0:
        if tid < s:
            for c in range(acc.shape[1]):
                acc[tid, c] += acc[tid + s, c]
        cuda.syncthreads()
        s //= 2


@register((int32[:, ::1], uint32[::1], int32, int32))
@cuda.jit
def action_histogram(actions, snap_u, base, accumulate):
    """snap_u[base + h] (+)= number of rows of actions [N, 4] choosing head h (13 heads, branch order)."""
    tid = cuda.threadIdx.x
    acc = cuda.shared.array((DIAG_BLOCK, N_HEADS), int32)
    for h in range(N_HEADS):
        acc[tid, h] = 0
    r = tid
    while r < actions.shape[0]:
        acc[tid, DIR_OFFSET + actions[r, 0]] += 1
        acc[tid, MAG_OFFSET + actions[r, 1]] += 1
        acc[tid, ORDER_OFFSET + actions[r, 2]] += 1
        acc[tid, URGENCY_OFFSET + actions[r, 3]] += 1
        r += DIAG_BLOCK
    _tree_sum_i32(acc, tid)
    h = tid
    while h < N_HEADS:  # the block may have fewer threads than heads (the simulator's)
        total = uint32(acc[0, h])
        if accumulate != 0:
            total += snap_u[base + h]
        snap_u[base + h] = total
        h += DIAG_BLOCK


@register((int32[:, ::1], int32[:, ::1]))
@cuda.jit
def tally_actions(actions, counts):
    """counts[i, h] += 1 for the four heads of row i's action (one thread per row, no atomics)."""
    i = cuda.grid(1)
    if i < actions.shape[0]:
        counts[i, DIR_OFFSET + actions[i, 0]] += 1
        counts[i, MAG_OFFSET + actions[i, 1]] += 1
        counts[i, ORDER_OFFSET + actions[i, 2]] += 1
        counts[i, URGENCY_OFFSET + actions[i, 3]] += 1


@register((int32[:, ::1], uint32[::1], int32))
@cuda.jit
def count_histogram(counts, snap_u, base):
    """snap_u[base + h] = sum over rows of counts[:, h] (one block, a shared-memory tree)."""
    tid = cuda.threadIdx.x
    acc = cuda.shared.array((DIAG_BLOCK, N_HEADS), int32)
    for h in range(N_HEADS):
        acc[tid, h] = 0
    r = tid
    while r < counts.shape[0]:
        for h in range(N_HEADS):
            acc[tid, h] += counts[r, h]
        r += DIAG_BLOCK
    _tree_sum_i32(acc, tid)
    h = tid
    while h < N_HEADS:
        snap_u[base + h] = uint32(acc[0, h])
        h += DIAG_BLOCK


@register((int32[:, ::1], float32[::1], float32[::1]))
@cuda.jit
def magnitude_stats(actions, reward, snap_f):
    """Per magnitude bin m over rows with direction Long or Short: win share and reward variance."""
    tid = cuda.threadIdx.x
    acc = cuda.shared.array((DIAG_BLOCK, MAG_COLS), float64)
    for c in range(MAG_COLS):
        acc[tid, c] = float64(0.0)
    r = tid
    while r < actions.shape[0]:
        d = actions[r, 0]
        if d == SHORT or d == LONG:
            m = actions[r, 1]
            x = float64(reward[r])
            acc[tid, 4 * m] += float64(1.0)
            if x > float64(0.0):
                acc[tid, 4 * m + 1] += float64(1.0)
            acc[tid, 4 * m + 2] += x
            acc[tid, 4 * m + 3] += x * x
        r += DIAG_BLOCK
    cuda.syncthreads()
    s = DIAG_BLOCK // 2
    while s > 0:
        if tid < s:
            for c in range(MAG_COLS):
                acc[tid, c] += acc[tid + s, c]
        cuda.syncthreads()
        s //= 2
    if tid < N_MAGS:
        n = acc[0, 4 * tid]
        win = float64(0.0)
        var = float64(0.0)
        if n > float64(0.0):
            win = acc[0, 4 * tid + 1] / n
        if n > float64(1.0):
            mean = acc[0, 4 * tid + 2] / n
            var = max(acc[0, 4 * tid + 3] / n - mean * mean, float64(0.0))
        snap_f[W_MAG_WIN + tid] = float32(win)
        snap_f[W_MAG_VAR + tid] = float32(var)


@register((float32[:, ::1], float32[::1], float32[::1], int32))
@cuda.jit
def noisy_sigma_means(sig_w, sig_b, snap_f, n_atoms):
    """snap_f[W_NOISY_SIGMA + b] = mean |sigma| over rows 0..p (p weight rows, then the bias) of the columns
    of branch b = blockIdx.x: its value stream, then its heads' advantage streams."""
    b = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    acc = cuda.shared.array((DIAG_BLOCK, 1), float64)
    acc[tid, 0] = float64(0.0)
    off, size = branch_span(b)
    cols = (1 + size) * n_atoms
    n_in = sig_w.shape[0]
    j = tid
    while j < (n_in + 1) * cols:
        row = j // cols
        c = j - row * cols
        o = (off + b) * n_atoms + c  # the branch's streams are adjacent from its value stream (kernels/heads.py)
        if row < n_in:
            acc[tid, 0] += float64(abs(sig_w[row, o]))
        else:
            acc[tid, 0] += float64(abs(sig_b[o]))
        j += DIAG_BLOCK
    cuda.syncthreads()
    s = DIAG_BLOCK // 2
    while s > 0:
        if tid < s:
            acc[tid, 0] += acc[tid + s, 0]
        cuda.syncthreads()
        s //= 2
    if tid == 0:
        snap_f[W_NOISY_SIGMA + b] = float32(acc[0, 0] / float64((n_in + 1) * cols))


def _check_snapshot(snap_f: Any, snap_u: Any | None = None) -> None:
    check_array("snap_f", snap_f, "[N_WORDS]", (N_WORDS,))
    if snap_u is not None:
        check_array("snap_u", snap_u, "[N_WORDS]", (N_WORDS,), np.uint32)


def mirror_isv(isv: Any, slots: Any, words: Any, snap_f: Any, *, stream: Any) -> None:
    """Copy the ISV slots `slots` (int32 [k]) into the snapshot words `words` (int32 [k])."""
    n = slots.shape[0]
    check_array("slots", slots, "[k]", (n,), np.int32)
    check_array("words", words, "[k]", (n,), np.int32)
    _check_snapshot(snap_f)
    launch(isv_mirror, n, isv, slots, words, snap_f, i32(n), stream=stream)


def histogram_actions(actions: Any, snap_u: Any, *, evaluation: bool, accumulate: bool, stream: Any) -> None:
    """Count the actions [N, 4] per head into the train (or eval) histogram words; `accumulate` adds to
    them instead of overwriting (the validation backtest counts over all its steps)."""
    check_array("actions", actions, f"[N, {N_BRANCHES}]", (actions.shape[0], N_BRANCHES), np.int32)
    check_array("snap_u", snap_u, "[N_WORDS]", (N_WORDS,), np.uint32)
    base = W_EVAL_HIST if evaluation else W_TRAIN_HIST
    launch_rows(action_histogram, 1, DIAG_BLOCK, actions, snap_u, i32(base), i32(1 if accumulate else 0),
                stream=stream)


def tally(actions: Any, counts: Any, *, stream: Any) -> None:
    """Add the actions [N, 4] of one step to the per-row head counts [N, 13] (the evaluation's tally)."""
    n = actions.shape[0]
    check_array("actions", actions, f"[N, {N_BRANCHES}]", (n, N_BRANCHES), np.int32)
    check_array("counts", counts, f"[N, {N_HEADS}]", (n, N_HEADS), np.int32)
    launch(tally_actions, n, actions, counts, stream=stream, block=thread_block(n))


def histogram_counts(counts: Any, snap_u: Any, *, stream: Any) -> None:
    """The eval histogram words = the head counts [N, 13] summed over rows."""
    check_array("counts", counts, f"[N, {N_HEADS}]", (counts.shape[0], N_HEADS), np.int32)
    check_array("snap_u", snap_u, "[N_WORDS]", (N_WORDS,), np.uint32)
    launch_rows(count_histogram, 1, DIAG_BLOCK, counts, snap_u, i32(W_EVAL_HIST), stream=stream)


def reduce_magnitude_stats(actions: Any, reward: Any, snap_f: Any, *, stream: Any) -> None:
    """Win share and reward variance per magnitude bin of the Long/Short rows of one collect step."""
    n = actions.shape[0]
    check_array("actions", actions, f"[N, {N_BRANCHES}]", (n, N_BRANCHES), np.int32)
    check_array("reward", reward, "[N]", (n,))
    _check_snapshot(snap_f)
    launch_rows(magnitude_stats, 1, DIAG_BLOCK, actions, reward, snap_f, stream=stream)


def reduce_noisy_sigma(sig_w: Any, sig_b: Any, snap_f: Any, *, stream: Any) -> None:
    """The mean |sigma| per branch of the noisy head's sigma_W [p, head_width(Z)] and sigma_b [head_width(Z)]."""
    n_in, q = (int(d) for d in sig_w.shape)
    check_array("sig_w", sig_w, "[p, q]", (n_in, q))
    check_array("sig_b", sig_b, "[q]", (q,))
    _check_snapshot(snap_f)
    launch_rows(noisy_sigma_means, N_BRANCHES, DIAG_BLOCK, sig_w, sig_b, snap_f, i32(n_atoms_of(q)), stream=stream)


_STATE = from_dtype(OPTIM_STATE_DTYPE)
_RAW = int(Isv.GRAD_NORM_RAW)
_CLIP = int(Isv.CLIP_EFF)
_FACTOR = int(Isv.FOLD_WARMUP_FACTOR)


@register((float32[::1], _STATE[::1], float64[::1], float32[::1], uint32[::1]))
@cuda.jit
def finalise(isv, state, env_metrics, snap_f, snap_u):
    """The derived words: step, clipped gradient norm, lr_eff, tau_eff and the limit fill rate (one thread)."""
    if cuda.grid(1) != 0:
        return
    snap_u[W_STEP] = uint32(state[0].step)
    raw = isv[_RAW]
    snap_f[W_GRAD_CLIPPED] = min(raw, isv[_CLIP])
    snap_f[W_LR_EFF] = state[0].lr * max(LR_FLOOR, isv[_FACTOR])
    snap_f[W_TAU_EFF] = state[0].tau
    snap_f[W_LIMIT_FILL] = float32(env_metrics[M_FILL_RATE])


def finalise_snapshot(isv: Any, state: Any, env_metrics: Any, snap_f: Any, snap_u: Any, *, stream: Any) -> None:
    """Write the finalise kernel's words from the ISV, the learner's optimiser state [1] and the collect
    environments' epoch metrics record (float64 [N_METRICS], kernels/env_stats.py)."""
    check_array("isv", isv, "[ISV_TOTAL_DIM]", (ISV_TOTAL_DIM,))
    check_array("state", state, "[1]", (1,), OPTIM_STATE_DTYPE)
    check_array("env_metrics", env_metrics, "[N_METRICS]", (N_METRICS,), np.float64)
    _check_snapshot(snap_f, snap_u)
    launch_rows(finalise, 1, 1, isv, state, env_metrics, snap_f, snap_u, stream=stream)
