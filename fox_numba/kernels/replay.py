"""The replay ring on the device: writes from the collector, uniform sampling and batch gathers for the learner.

A ring of C transitions as a struct of arrays: row int32 [C], port float32 [C, P], action int32 [C, 4],
reward float32 [C], done float32 [C], next_row int32 [C], next_port float32 [C, P], entry float64 [C] (the
average entry price of the state's position: counterfactual targets price the untaken directions from it,
kernels/counterfactual.py; the clipped upnl column cannot give it back) (P = N_PORTFOLIO in
the package, narrower in some learner tests: kernels read it from the arrays; the observation is rebuilt
from the fold's market_obs rows by kernels/env.py `gather_obs`); meta int32 [2] = (cursor, size) on the
device, so a captured graph advances it.

One collect step of N environments writes N transitions at slots (cursor + i) % C, i = 0 .. N - 1, in
three launches: replay_put_obs (before the environment step: the observed row and portfolio features, the
action and the entry price), replay_put_result (after it: reward, done, next_row, next_port), then
replay_advance (one thread: cursor = (cursor + N) % C, size = min(size + N, C)). The two puts read the
cursor and only the advance writes it, so no thread reads a cursor another thread is changing. N <= C
(checked).

One training step of B samples: replay_sample draws B slots, replay_gather copies them into the learner's
batch layout: rows2 [2B] and port2 [2B, P] hold s in rows 0..B-1 and s' in rows B..2B-1 (so one gather_obs
and one network forward cover both), actions [B, 4], rewards [B], discounts [B].

n-step returns (learner.n_step = n): the transition at slot s was written by one environment, whose next
step sits N slots later (N = the collect's environments, `stride`): a collect step writes N consecutive
slots. The gather follows that chain from s for up to n transitions t_0 = s, t_1 = s + N, ... and returns

    rewards[j]   = sum_{i < k} gamma**i * reward[t_i]           (float32, summed in order i = 0, 1, ...)
    discounts[j] = gamma**k * (1 - done[t_{k-1}])               (the bootstrap's weight; 0 after a terminal)
    s'           = next_row / next_port of t_{k-1}

with k <= n the transitions taken. The chain stops early (k < n) where the episode did: at a done
transition, or where the next slot's row is not this transition's next_row (the collect's environments
restart at fresh draws every epoch without a done), or where the next slot has not been written after s
(its position in write order, counted from the oldest slot (cursor - size) % C, would pass size - 1).
Such a truncated return bootstraps from the last state it reached, as the standard n-step target does.
With n = 1 it is the one-step target: rewards = reward[s], discounts = gamma * (1 - done[s]), bit for bit
the float32 product the learner formed before n-step returns existed. The chain follows the behaviour
policy's actions (uncorrected n-step, as in Rainbow).

Sampling: sample j uses generator states[j] (numba xoroshiro128+, bit-exact between simulator and GPU), one
draw per step: slot = floor(u * size / 2**32) with u the draw's top 32 bits, size read from meta on the
device (every slot below size holds a transition, full ring or not). An empty ring (size 0) gives slot -1,
which the gather turns into row 0, a zero portfolio and action, reward NaN and discount 0: the learner's
non-finite guard then skips the step rather than reading outside an array.

Launch shapes: puts, sample and gather 1-D, one thread per transition or sample (`thread_block`); advance
one thread.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import cuda, float32, float64, int32, uint64
from numba.cuda.random import xoroshiro128p_type

from fox_numba.actions import N_BRANCHES
from fox_numba.device.launch import check_array, i32, launch, launch_rows
from fox_numba.device.registry import register
from fox_numba.device.rng import XOROSHIRO_DTYPE, xoroshiro128p_next
from fox_numba.kernels.env import thread_block

META_CURSOR, META_SIZE = 0, 1
REPLAY_BLOCK = 128

F32_1D, F32_2D = float32[::1], float32[:, ::1]
F64_1D = float64[::1]
I32_1D, I32_2D = int32[::1], int32[:, ::1]


@register((I32_1D, I32_1D, F32_2D, I32_2D, F64_1D, I32_1D, F32_2D, I32_2D, F64_1D))
@cuda.jit
def replay_put_obs_kernel(meta, row, port, actions, entry, r_row, r_port, r_action, r_entry):
    """Slot (cursor + i) % C gets row[i], port[i], actions[i], entry[i]."""
    i = cuda.grid(1)
    if i >= row.shape[0]:
        return
    slot = (meta[META_CURSOR] + i) % r_row.shape[0]
    r_row[slot] = row[i]
    r_entry[slot] = entry[i]
    for j in range(r_port.shape[1]):
        r_port[slot, j] = port[i, j]
    for k in range(N_BRANCHES):
        r_action[slot, k] = actions[i, k]


@register((I32_1D, F32_1D, F32_1D, I32_1D, F32_2D, F32_1D, F32_1D, I32_1D, F32_2D))
@cuda.jit
def replay_put_result_kernel(meta, reward, done, next_row, next_port, r_reward, r_done, r_next_row, r_next_port):
    """Slot (cursor + i) % C gets reward[i], done[i], next_row[i], next_port[i]."""
    i = cuda.grid(1)
    if i >= reward.shape[0]:
        return
    slot = (meta[META_CURSOR] + i) % r_reward.shape[0]
    r_reward[slot] = reward[i]
    r_done[slot] = done[i]
    r_next_row[slot] = next_row[i]
    for j in range(r_next_port.shape[1]):
        r_next_port[slot, j] = next_port[i, j]


@register((I32_1D, int32, int32))
@cuda.jit
def replay_advance_kernel(meta, n, capacity):
    """cursor = (cursor + n) % capacity; size = min(size + n, capacity) (one thread)."""
    if cuda.grid(1) == 0:
        meta[META_CURSOR] = (meta[META_CURSOR] + n) % capacity
        meta[META_SIZE] = min(meta[META_SIZE] + n, capacity)


@register((I32_1D, xoroshiro128p_type[::1], I32_1D))
@cuda.jit
def replay_sample_kernel(meta, states, idx):
    """idx[j] = floor(u * size / 2**32), u the top 32 bits of one draw from states[j]; -1 while the ring is
    empty (the draw is taken either way)."""
    j = cuda.grid(1)
    if j >= idx.shape[0]:
        return
    size = meta[META_SIZE]
    u = xoroshiro128p_next(states, j) >> uint64(32)
    idx[j] = int32((u * uint64(size)) >> uint64(32)) if size > 0 else int32(-1)


@register((I32_1D, I32_1D, I32_1D, F32_2D, I32_2D, F32_1D, F32_1D, I32_1D, F32_2D, int32, int32, float32, I32_1D,
           F32_2D, I32_2D, F32_1D, F32_1D))
@cuda.jit
def replay_gather_kernel(
    meta, idx, r_row, r_port, r_action, r_reward, r_done, r_next_row, r_next_port, stride, n_step, gamma, rows2,
    port2, actions, rewards, discounts,
):  # fmt: skip
    """Sample j of slot s = idx[j]: rows2[j], port2[j] = the slot's s and actions[j] its action; the n-step
    reward, discount and s' (rows2[B + j], port2[B + j]) of the chain from s (module header). Slot -1 (an
    empty ring): row 0, zero portfolio and action, reward NaN, discount 0."""
    j = cuda.grid(1)
    n = idx.shape[0]
    if j >= n:
        return
    n_port = r_port.shape[1]
    s = idx[j]
    if s >= 0:
        cap = r_row.shape[0]
        size = meta[META_SIZE]
        pos = (s - (meta[META_CURSOR] - size) + 2 * cap) % cap  # s's place in write order, 0 = oldest
        last = s
        total = r_reward[s]
        discount = gamma
        for k in range(1, n_step):
            if pos + k * stride >= size or r_done[last] != float32(0.0):
                break
            nxt = (s + k * stride) % cap
            if r_row[nxt] != r_next_row[last]:
                break
            last = nxt
            total += discount * r_reward[last]
            discount *= gamma
        rows2[j] = r_row[s]
        rows2[n + j] = r_next_row[last]
        for c in range(n_port):
            port2[j, c] = r_port[s, c]
            port2[n + j, c] = r_next_port[last, c]
        for k in range(N_BRANCHES):
            actions[j, k] = r_action[s, k]
        rewards[j] = total
        discounts[j] = discount * (float32(1.0) - r_done[last])
    else:
        rows2[j] = 0
        rows2[n + j] = 0
        for c in range(n_port):
            port2[j, c] = float32(0.0)
            port2[n + j, c] = float32(0.0)
        for k in range(N_BRANCHES):
            actions[j, k] = 0
        rewards[j] = float32(math.nan)
        discounts[j] = float32(0.0)


def _width(port: Any) -> int:
    """P of a [C, P] portfolio array."""
    if len(port.shape) != 2:
        raise ValueError(f"a portfolio array must be float32 [n, P], got {port.shape}")
    return int(port.shape[1])


def check_ring(ring: tuple[Any, ...]) -> tuple[int, int]:
    """Check a ring's (row, port, action, reward, done, next_row, next_port) arrays; return (C, P)."""
    row, port, action, reward, done, next_row, next_port = ring
    cap, n_port = row.shape[0], _width(port)
    check_array("ring.row", row, "[C]", (cap,), np.int32)
    check_array("ring.port", port, "[C, P]", (cap, n_port))
    check_array("ring.action", action, f"[C, {N_BRANCHES}]", (cap, N_BRANCHES), np.int32)
    check_array("ring.reward", reward, "[C]", (cap,))
    check_array("ring.done", done, "[C]", (cap,))
    check_array("ring.next_row", next_row, "[C]", (cap,), np.int32)
    check_array("ring.next_port", next_port, "[C, P]", (cap, n_port))
    return cap, n_port


def replay_put_obs(meta: Any, row: Any, port: Any, actions: Any, entry: Any, r_row: Any, r_port: Any,
                   r_action: Any, r_entry: Any, *, stream: Any) -> None:  # fmt: skip
    """Write the observed halves of N transitions (row int32 [N], port [N, P], actions int32 [N, 4], entry float64
    [N]: the position's average entry price)."""
    n = row.shape[0]
    cap = r_row.shape[0]
    n_port = _width(r_port)
    check_array("meta", meta, "[2]", (2,), np.int32)
    check_array("row", row, "[N]", (n,), np.int32)
    check_array("port", port, f"[N, {n_port}]", (n, n_port))
    check_array("actions", actions, f"[N, {N_BRANCHES}]", (n, N_BRANCHES), np.int32)
    check_array("r_row", r_row, "[C]", (cap,), np.int32)
    check_array("r_port", r_port, "[C, P]", (cap, n_port))
    check_array("r_action", r_action, f"[C, {N_BRANCHES}]", (cap, N_BRANCHES), np.int32)
    check_array("entry", entry, "[N]", (n,), np.float64)
    check_array("r_entry", r_entry, "[C]", (cap,), np.float64)
    if not 1 <= n <= cap:
        raise ValueError(f"{n} transitions per step do not fit a ring of {cap}")
    launch(replay_put_obs_kernel, n, meta, row, port, actions, entry, r_row, r_port, r_action, r_entry,
           stream=stream, block=thread_block(n, REPLAY_BLOCK))


def replay_put_result(meta: Any, reward: Any, done: Any, next_row: Any, next_port: Any, r_reward: Any, r_done: Any,
                      r_next_row: Any, r_next_port: Any, *, stream: Any) -> None:  # fmt: skip
    """Write the result halves of N transitions, then advance the cursor by N."""
    n = reward.shape[0]
    cap = r_reward.shape[0]
    n_port = _width(r_next_port)
    check_array("meta", meta, "[2]", (2,), np.int32)
    check_array("reward", reward, "[N]", (n,))
    check_array("done", done, "[N]", (n,))
    check_array("next_row", next_row, "[N]", (n,), np.int32)
    check_array("next_port", next_port, f"[N, {n_port}]", (n, n_port))
    check_array("r_reward", r_reward, "[C]", (cap,))
    check_array("r_done", r_done, "[C]", (cap,))
    check_array("r_next_row", r_next_row, "[C]", (cap,), np.int32)
    check_array("r_next_port", r_next_port, "[C, P]", (cap, n_port))
    if not 1 <= n <= cap:
        raise ValueError(f"{n} transitions per step do not fit a ring of {cap}")
    launch(replay_put_result_kernel, n, meta, reward, done, next_row, next_port, r_reward, r_done, r_next_row,
           r_next_port, stream=stream, block=thread_block(n, REPLAY_BLOCK))  # fmt: skip
    launch_rows(replay_advance_kernel, 1, 1, meta, i32(n), i32(cap), stream=stream)


def replay_sample(meta: Any, states: Any, idx: Any, *, stream: Any) -> None:
    """idx int32 [B] = uniform slots below the ring's size (meta[1], read on the device), one draw from
    states[j] each (-1 while the ring is empty)."""
    check_array("meta", meta, "[2]", (2,), np.int32)
    if len(idx.shape) != 1 or idx.shape[0] < 1:
        raise ValueError(f"idx must be int32 [B] with B >= 1, got {idx.shape}")
    b = idx.shape[0]
    check_array("idx", idx, "[B]", (b,), np.int32)
    if len(states.shape) != 1 or states.shape[0] < b or states.dtype != XOROSHIRO_DTYPE:
        raise ValueError(f"states must be xoroshiro128p states [>= {b}], got {states.dtype}{tuple(states.shape)}")
    check_array("states", states, f"[>= {b}]", (states.shape[0],), XOROSHIRO_DTYPE)
    launch(replay_sample_kernel, b, meta, states, idx, stream=stream, block=thread_block(b, REPLAY_BLOCK))


def replay_gather(meta: Any, idx: Any, ring: tuple[Any, ...], rows2: Any, port2: Any, actions: Any, rewards: Any,
                  discounts: Any, *, stride: int, n_step: int, gamma: float, stream: Any) -> None:
    """Gather the B transitions at the slots idx [B] of `ring` (row, port, action, reward, done, next_row,
    next_port; meta its (cursor, size)) into the learner's batch: rows2 int32 [2B] and port2 [2B, P] hold s in
    0..B-1 and s' in B..2B-1 (one network forward covers both), actions int32 [B, 4], and the n-step rewards
    [B] and discounts [B] of the module header (`stride`: transitions written per collect step)."""
    if len(idx.shape) != 1 or idx.shape[0] < 1:
        raise ValueError(f"idx must be int32 [B] with B >= 1, got {idx.shape}")
    b = idx.shape[0]
    cap, n_port = check_ring(ring)
    check_array("meta", meta, "[2]", (2,), np.int32)
    check_array("idx", idx, "[B]", (b,), np.int32)
    check_array("rows2", rows2, "[2B]", (2 * b,), np.int32)
    check_array("port2", port2, "[2B, P]", (2 * b, n_port))
    check_array("actions", actions, f"[B, {N_BRANCHES}]", (b, N_BRANCHES), np.int32)
    check_array("rewards", rewards, "[B]", (b,))
    check_array("discounts", discounts, "[B]", (b,))
    if n_step < 1 or not 1 <= stride <= cap or not 0.0 <= gamma <= 1.0:
        raise ValueError(f"replay_gather needs n_step >= 1, 1 <= stride <= {cap} and gamma in [0, 1]; got "
                         f"n_step {n_step}, stride {stride}, gamma {gamma}")
    launch(replay_gather_kernel, b, meta, idx, *ring, i32(stride), i32(n_step), np.float32(gamma), rows2, port2,
           actions, rewards, discounts, stream=stream, block=thread_block(b, REPLAY_BLOCK))
