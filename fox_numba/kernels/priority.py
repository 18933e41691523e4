"""Prioritised replay (learner.priority_alpha > 0): a sum tree of the ring's slot priorities on the device.

Layout: tree float64 [2L], L = tree_leaves(C) the smallest power of two >= the ring's capacity C; node 1 is the
root, node k has children 2k and 2k + 1, slot s's priority is the leaf tree[L + s]. Leaves of slots never
written (and of s >= C) hold 0, so they are never sampled; max_priority float64 [1] is the running maximum
of the priorities ever set (PRIORITY_START after a clear), which every new transition gets (Schaul et al.
2016, "Prioritized Experience Replay").

Writers: the collector's put (priority_put_kernel, with the ring's put_obs: slots (cursor + i) % C get
max_priority) and the learner's update (after the C51 loss). Leaves only: the inner nodes are rebuilt from
the leaves at the start of every sample (sum_tree_level_kernel, one launch per level, bottom up), so
whoever wrote a leaf, the tree the walk reads is exact for it. Each node is one float64 addition of its two
children: no atomics, the same sums every run. A full rebuild moves about 3L float64 (24 MiB at C = 2**20) in
log2(L) launches; it keeps the collector free of any tree work (not timed yet: tools/bench_learner.py
--priority-alpha on a GPU).

Sampling (priority_sample_kernel, stratified as in the paper): sample j of B draws U_j (the top 32 bits of
one draw from states[j] over 2**32, the uniform sampler's one draw) and walks down from the root with
x = (j + U_j) * total / B: left when x < sum(left) or the right subtree is empty, else x -= sum(left) and
right. The empty-subtree rule keeps a walk that float rounding carried past the last positive leaf on a
positive leaf. P(slot s) = p_s / total over the batch; an empty tree (total 0) gives slot -1, as the uniform
sampler does for an empty ring.

Importance weights (importance_weights_kernel, one block): w_i = (N P(i))**-beta / max_j w_j over the batch
(the max over the batch, as Dopamine's Rainbow does; it needs no second tree). N and the total cancel:
w_i = (p_min / p_i)**beta, p_min the smallest priority in the batch. beta = beta0 + (1 - beta0) * progress,
progress the learning-rate schedule's (kernels/learner.py schedule_progress: linear from 0 at a fold's first
step to 1 at the end of its steps). Each sample's four branch-row weights are multiplied by w_i, so the loss, its
gradient and the loss signals are importance weighted.

Update (priority_zero_kernel, then priority_set_kernel): p_i = (max(loss_i, 0) + eps)**alpha from the
direction branch's C51 cross-entropy (row 4i of the learner's rows; the max only absorbs float32 rounding
below 0). Why the direction branch and not the sum over branches: it has an effect on every step, and its
greedy distribution is every branch's bootstrap target (learner.bootstrap = 'direction', the default), so its
error is the TD error of the state's value;
the other branches' rows are masked (zero weight) on Hold / Flat steps, and their cross-entropy there is an
error the learner never trains, so summing it in would hand a fixed, never shrinking priority to such steps.
A slot drawn twice in one batch gets the larger of its priorities: the first launch zeroes every drawn
leaf, the second takes atomic maxima (the result does not depend on the order). A non-finite loss leaves
its leaf unchanged. max_priority takes the atomic maximum of the batch's priorities. The cross-entropy is the
KL divergence Rainbow prioritises by plus the projected target's entropy, so a priority does not fall below
(entropy + eps)**alpha: a softer contrast between transitions than the KL's.

Launch shapes: levels, sample, put and update one thread per node / sample / transition (1-D); weights one
block of NORM_BLOCK threads; clear grid-stride.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import cuda, float32, float64, from_dtype, int32, uint64
from numba.cuda.random import xoroshiro128p_type

from fox_numba.actions import N_BRANCHES
from fox_numba.device.launch import check_array, i32, launch, launch_rows, launch_strided, strided_threads
from fox_numba.device.registry import register
from fox_numba.device.rng import XOROSHIRO_DTYPE, xoroshiro128p_next
from fox_numba.kernels.env import thread_block
from fox_numba.kernels.learner import SCHEDULE_DTYPE, schedule_progress
from fox_numba.kernels.optim import NORM_BLOCK, OPTIM_STATE_DTYPE, check_state
from fox_numba.kernels.replay import META_CURSOR, REPLAY_BLOCK
from fox_numba.kernels.signals import finite

PRIORITY_START = np.float64(1.0)  # max_priority after a clear: the first transitions' priority (as in PER)
TWO_POW_M32 = np.float64(2.0**-32)  # a draw's top 32 bits -> [0, 1)

_F1, _F64 = float32[::1], float64[::1]
_I1 = int32[::1]
_SCHED = from_dtype(SCHEDULE_DTYPE)
_STATE = from_dtype(OPTIM_STATE_DTYPE)


def tree_leaves(capacity: int) -> int:
    """L, the leaves of the sum tree of a ring of `capacity` slots: the smallest power of two >= capacity."""
    if capacity < 1:
        raise ValueError(f"a sum tree needs at least one leaf, got capacity {capacity}")
    return 1 << (capacity - 1).bit_length()


@register((_F64, int32))
@cuda.jit
def sum_tree_level_kernel(tree, first):
    """tree[k] = tree[2k] + tree[2k + 1] for the level's nodes k = first .. 2 first - 1 (one thread each)."""
    k = first + cuda.grid(1)
    if k < 2 * first:
        tree[k] = tree[2 * k] + tree[2 * k + 1]


@cuda.jit(device=True)
def tree_walk(tree, x):
    """The slot whose leaf interval holds x (module header: left when x < sum(left) or right is empty)."""
    n_leaves = tree.shape[0] // 2
    k = 1
    while k < n_leaves:
        left = tree[2 * k]
        if x < left or not tree[2 * k + 1] > float64(0.0):
            k = 2 * k
        else:
            x -= left
            k = 2 * k + 1
    return k - n_leaves


@register((_F64, xoroshiro128p_type[::1], _I1))
@cuda.jit
def priority_sample_kernel(tree, states, idx):
    """idx[j] = the slot of the stratified draw x = (j + U_j) * total / B (U_j from states[j]); -1 when the tree
    is empty (the draw is taken either way)."""
    j = cuda.grid(1)
    n = idx.shape[0]
    if j >= n:
        return
    u = xoroshiro128p_next(states, j) >> uint64(32)
    total = tree[1]
    if total > float64(0.0):
        x = (float64(j) + float64(u) * TWO_POW_M32) * total / float64(n)
        idx[j] = int32(tree_walk(tree, x))
    else:
        idx[j] = int32(-1)


@register((_F64, _I1, _SCHED[::1], _STATE[::1], float32, _F1, _F1))
@cuda.jit
def importance_weights_kernel(tree, idx, sched, state, beta0, row_w, is_w):
    """is_w[i] = (p_min / p_i)**beta (1 for slot -1) and row_w[4i + b] *= is_w[i]; p_min the batch's smallest
    priority, beta = beta0 + (1 - beta0) * schedule progress (one block; module header)."""
    tid = cuda.threadIdx.x
    lo = cuda.shared.array(NORM_BLOCK, float64)
    n = idx.shape[0]
    n_leaves = tree.shape[0] // 2
    m = float64(math.inf)
    i = tid
    while i < n:
        if idx[i] >= 0:
            m = min(m, tree[n_leaves + idx[i]])
        i += cuda.blockDim.x
    lo[tid] = m
    cuda.syncthreads()
    s = cuda.blockDim.x // 2
    while s > 0:
        if tid < s:
            lo[tid] = min(lo[tid], lo[tid + s])
        cuda.syncthreads()
        s //= 2
    p_min = lo[0]
    beta = beta0 + (float32(1.0) - beta0) * schedule_progress(sched, state[0].step)
    i = tid
    while i < n:
        w = float32(1.0)
        if idx[i] >= 0:
            w = float32(math.pow(p_min / tree[n_leaves + idx[i]], float64(beta)))
        is_w[i] = w
        for b in range(N_BRANCHES):
            row_w[i * N_BRANCHES + b] *= w
        i += cuda.blockDim.x


@register((_I1, _F1, _F64))
@cuda.jit
def priority_zero_kernel(idx, loss, tree):
    """Leaf of slot idx[j] = 0 where sample j's direction loss loss[4j] is finite (the update's first launch)."""
    j = cuda.grid(1)
    if j < idx.shape[0] and idx[j] >= 0 and finite(loss[N_BRANCHES * j]):
        tree[tree.shape[0] // 2 + idx[j]] = float64(0.0)


@register((_I1, _F1, float64, float64, _F64, _F64))
@cuda.jit
def priority_set_kernel(idx, loss, alpha, eps, tree, max_p):
    """Leaf of slot idx[j] = max(itself, p_j) and max_p[0] = max(itself, p_j), p_j = (max(loss[4j], 0) + eps)**alpha,
    where loss[4j] is finite (atomic maxima: the order of the samples does not matter)."""
    j = cuda.grid(1)
    if j < idx.shape[0] and idx[j] >= 0 and finite(loss[N_BRANCHES * j]):
        p = math.pow(max(float64(loss[N_BRANCHES * j]), float64(0.0)) + eps, alpha)
        cuda.atomic.max(tree, tree.shape[0] // 2 + idx[j], p)
        cuda.atomic.max(max_p, 0, p)


@register((_I1, int32, int32, _F64, _F64))
@cuda.jit
def priority_put_kernel(meta, n, capacity, tree, max_p):
    """Leaf of slot (cursor + i) % capacity = max_p[0] for the n transitions of a collect step (i < n)."""
    i = cuda.grid(1)
    if i < n:
        tree[tree.shape[0] // 2 + (meta[META_CURSOR] + i) % capacity] = max_p[0]


@register((_F64, _F64, int32))
@cuda.jit
def priority_clear_kernel(tree, max_p, n):
    """tree[:n] = 0 (every leaf and node) and max_p[0] = PRIORITY_START (grid-stride)."""
    i = cuda.grid(1)
    if i == 0:
        max_p[0] = PRIORITY_START
    while i < n:
        tree[i] = float64(0.0)
        i += cuda.gridsize(1)


# ---- wrappers (check, then launch; they allocate nothing) ----------------------------------------------


def _check_tree(tree: Any, max_p: Any | None = None) -> int:
    """Check a tree float64 [2L] (L a power of two) and max_p float64 [1]; return L."""
    if len(tree.shape) != 1 or tree.shape[0] < 2 or tree.shape[0] & (tree.shape[0] - 1):
        raise ValueError(f"a sum tree is float64 [2L] with L a power of two, got {tuple(tree.shape)}")
    check_array("tree", tree, "[2L]", (tree.shape[0],), np.float64)
    if max_p is not None:
        check_array("max_priority", max_p, "[1]", (1,), np.float64)
    return int(tree.shape[0]) // 2


def _check_batch(idx: Any) -> int:
    if len(idx.shape) != 1 or idx.shape[0] < 1:
        raise ValueError(f"idx must be int32 [B] with B >= 1, got {tuple(idx.shape)}")
    b = int(idx.shape[0])
    check_array("idx", idx, "[B]", (b,), np.int32)
    return b


def priority_clear(tree: Any, max_p: Any, *, stream: Any) -> None:
    """Every leaf and node 0, max_priority = PRIORITY_START (a fold boundary empties the ring)."""
    _check_tree(tree, max_p)
    n = int(tree.shape[0])
    launch_strided(priority_clear_kernel, n, tree, max_p, i32(n), stream=stream)


def priority_put(meta: Any, n: int, capacity: int, tree: Any, max_p: Any, *, stream: Any) -> None:
    """The n slots a collect step writes from the ring's cursor (meta, read on the device) get max_priority."""
    n_leaves = _check_tree(tree, max_p)
    check_array("meta", meta, "[2]", (2,), np.int32)
    if not 1 <= n <= capacity <= n_leaves:
        raise ValueError(f"priority_put: need 1 <= n ({n}) <= capacity ({capacity}) <= the tree's leaves ({n_leaves})")
    launch(priority_put_kernel, n, meta, i32(n), i32(capacity), tree, max_p, stream=stream,
           block=thread_block(n, REPLAY_BLOCK))


def rebuild_tree(tree: Any, *, stream: Any) -> None:
    """Every inner node from the leaves, bottom up (one launch per level, L - 1 nodes in all)."""
    first = _check_tree(tree) // 2
    while first >= 1:
        launch(sum_tree_level_kernel, first, tree, i32(first), stream=stream, block=thread_block(first, REPLAY_BLOCK))
        first //= 2


def priority_sample(tree: Any, states: Any, idx: Any, *, stream: Any) -> None:
    """Rebuild the tree, then idx int32 [B] = stratified proportional draws (one from states[j] each)."""
    b = _check_batch(idx)
    if len(states.shape) != 1 or states.shape[0] < b:
        raise ValueError(f"states must be xoroshiro128p states [>= {b}], got {tuple(states.shape)}")
    check_array("states", states, f"[>= {b}]", (states.shape[0],), XOROSHIRO_DTYPE)
    rebuild_tree(tree, stream=stream)
    launch(priority_sample_kernel, b, tree, states, idx, stream=stream, block=thread_block(b, REPLAY_BLOCK))


def importance_weights(tree: Any, idx: Any, sched: Any, state: Any, beta0: float, row_w: Any, is_w: Any, *,
                       stream: Any) -> None:
    """is_w float32 [B] = the batch's importance weights, and row_w float32 [4B] (the learner's branch-row
    weights) multiplied by them (kernel importance_weights_kernel); sched: the learner's schedule block."""
    _check_tree(tree)
    b = _check_batch(idx)
    check_array("sched", sched, "[1] SCHEDULE_DTYPE", (1,), SCHEDULE_DTYPE)
    check_state(state)
    check_array("row_w", row_w, "[4B]", (N_BRANCHES * b,))
    check_array("is_w", is_w, "[B]", (b,))
    if not 0.0 <= beta0 <= 1.0:
        raise ValueError(f"learner.priority_beta0 must be in [0, 1], got {beta0}")
    launch_rows(importance_weights_kernel, 1, strided_threads(NORM_BLOCK), tree, idx, sched, state,
                np.float32(beta0), row_w, is_w, stream=stream)


def priority_update(idx: Any, loss: Any, alpha: float, eps: float, tree: Any, max_p: Any, *, stream: Any) -> None:
    """Leaves of the drawn slots = (direction loss + eps)**alpha (loss float32 [4B], the learner's rows), the
    larger one for a slot drawn twice; max_priority follows (two launches; module header)."""
    _check_tree(tree, max_p)
    b = _check_batch(idx)
    check_array("loss", loss, "[4B]", (N_BRANCHES * b,))
    if not (alpha > 0.0 and eps > 0.0):
        raise ValueError(f"priorities need alpha > 0 and eps > 0, got {alpha}, {eps}")
    block = thread_block(b, REPLAY_BLOCK)
    launch(priority_zero_kernel, b, idx, loss, tree, stream=stream, block=block)
    launch(priority_set_kernel, b, idx, loss, np.float64(alpha), np.float64(eps), tree, max_p, stream=stream,
           block=block)
