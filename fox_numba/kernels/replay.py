"""The replay ring on the device: writes from the collector, uniform sampling and batch gathers for the learner.

A ring of C transitions as a struct of arrays: row int32 [C], port float32 [C, P], action int32 [C, 4],
reward float32 [C], done float32 [C], next_row int32 [C], next_port float32 [C, P] (P = N_PORTFOLIO; the
observation is rebuilt from the fold's market_obs rows by kernels/env.py `gather_obs`); meta int32 [2] =
(cursor, size) on the device, so a captured graph advances it.

One collect step of N environments writes N transitions at slots (cursor + i) % C, i = 0 .. N - 1, in
three launches: replay_put_obs (before the environment step: the observed row and portfolio features and
the action), replay_put_result (after it: reward, done, next_row, next_port), then replay_advance (one
thread: cursor = (cursor + N) % C, size = min(size + N, C)). The two puts read the cursor and only the
advance writes it, so no thread reads a cursor another thread is changing. N <= C (checked).

Launch shapes: puts, sample and gather 1-D, one thread per transition; advance one thread. Sampling draws
one float64 uniform per sample from its xoroshiro state: slot = floor(u * size) (every slot below size
holds a transition, full ring or not).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import cuda, float32, int32
from numba.cuda.random import xoroshiro128p_type, xoroshiro128p_uniform_float64

from fox_numba.actions import N_BRANCHES
from fox_numba.device.launch import check_array, i32, launch, launch_rows
from fox_numba.device.registry import register
from fox_numba.device.rng import XOROSHIRO_DTYPE
from fox_numba.kernels.env import thread_block
from fox_numba.observation import N_PORTFOLIO

META_CURSOR, META_SIZE = 0, 1
REPLAY_BLOCK = 128

F32_1D, F32_2D = float32[::1], float32[:, ::1]
I32_1D, I32_2D = int32[::1], int32[:, ::1]


@register((I32_1D, I32_1D, F32_2D, I32_2D, I32_1D, F32_2D, I32_2D))
@cuda.jit
def replay_put_obs_kernel(meta, row, port, actions, r_row, r_port, r_action):
    """Slot (cursor + i) % C gets row[i], port[i], actions[i]."""
    i = cuda.grid(1)
    if i >= row.shape[0]:
        return
    slot = (meta[META_CURSOR] + i) % r_row.shape[0]
    r_row[slot] = row[i]
    for j in range(N_PORTFOLIO):
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
    for j in range(N_PORTFOLIO):
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
    """idx[j] = floor(u * size), u a float64 uniform from states[j] (idx[j] = 0 while the ring is empty)."""
    j = cuda.grid(1)
    if j >= idx.shape[0]:
        return
    size = meta[META_SIZE]
    k = int32(xoroshiro128p_uniform_float64(states, j) * size)
    k = max(min(k, size - 1), 0)
    idx[j] = k


@register(
    (I32_1D, I32_1D, F32_2D, I32_2D, F32_1D, F32_1D, I32_1D, F32_2D, I32_1D, F32_2D, I32_2D, F32_1D, F32_1D, I32_1D, F32_2D)
)
@cuda.jit
def replay_gather_kernel(
    idx, r_row, r_port, r_action, r_reward, r_done, r_next_row, r_next_port,
    b_row, b_port, b_action, b_reward, b_done, b_next_row, b_next_port,
):  # fmt: skip
    """Batch entry j = the transition in slot idx[j]."""
    j = cuda.grid(1)
    if j >= idx.shape[0]:
        return
    s = idx[j]
    b_row[j] = r_row[s]
    b_reward[j] = r_reward[s]
    b_done[j] = r_done[s]
    b_next_row[j] = r_next_row[s]
    for c in range(N_PORTFOLIO):
        b_port[j, c] = r_port[s, c]
        b_next_port[j, c] = r_next_port[s, c]
    for k in range(N_BRANCHES):
        b_action[j, k] = r_action[s, k]


def check_transitions(prefix: str, n: int, row: Any, port: Any, action: Any, reward: Any, done: Any,
                      next_row: Any, next_port: Any) -> None:  # fmt: skip
    """Check a struct of arrays of n transitions (the ring, a batch)."""
    check_array(f"{prefix}row", row, "[n]", (n,), np.int32)
    check_array(f"{prefix}port", port, f"[n, {N_PORTFOLIO}]", (n, N_PORTFOLIO))
    check_array(f"{prefix}action", action, f"[n, {N_BRANCHES}]", (n, N_BRANCHES), np.int32)
    check_array(f"{prefix}reward", reward, "[n]", (n,))
    check_array(f"{prefix}done", done, "[n]", (n,))
    check_array(f"{prefix}next_row", next_row, "[n]", (n,), np.int32)
    check_array(f"{prefix}next_port", next_port, f"[n, {N_PORTFOLIO}]", (n, N_PORTFOLIO))


def replay_put_obs(meta: Any, row: Any, port: Any, actions: Any, r_row: Any, r_port: Any, r_action: Any,
                   *, stream: Any) -> None:  # fmt: skip
    """Write the observed halves of N transitions (row int32 [N], port [N, P], actions int32 [N, 4])."""
    n = row.shape[0]
    cap = r_row.shape[0]
    check_array("meta", meta, "[2]", (2,), np.int32)
    check_array("row", row, "[N]", (n,), np.int32)
    check_array("port", port, f"[N, {N_PORTFOLIO}]", (n, N_PORTFOLIO))
    check_array("actions", actions, f"[N, {N_BRANCHES}]", (n, N_BRANCHES), np.int32)
    check_array("r_row", r_row, "[C]", (cap,), np.int32)
    check_array("r_port", r_port, f"[C, {N_PORTFOLIO}]", (cap, N_PORTFOLIO))
    check_array("r_action", r_action, f"[C, {N_BRANCHES}]", (cap, N_BRANCHES), np.int32)
    if not 1 <= n <= cap:
        raise ValueError(f"{n} transitions per step do not fit a ring of {cap}")
    launch(replay_put_obs_kernel, n, meta, row, port, actions, r_row, r_port, r_action, stream=stream,
           block=thread_block(n, REPLAY_BLOCK))


def replay_put_result(meta: Any, reward: Any, done: Any, next_row: Any, next_port: Any, r_reward: Any, r_done: Any,
                      r_next_row: Any, r_next_port: Any, *, stream: Any) -> None:  # fmt: skip
    """Write the result halves of N transitions, then advance the cursor by N."""
    n = reward.shape[0]
    cap = r_reward.shape[0]
    check_array("meta", meta, "[2]", (2,), np.int32)
    check_array("reward", reward, "[N]", (n,))
    check_array("done", done, "[N]", (n,))
    check_array("next_row", next_row, "[N]", (n,), np.int32)
    check_array("next_port", next_port, f"[N, {N_PORTFOLIO}]", (n, N_PORTFOLIO))
    check_array("r_reward", r_reward, "[C]", (cap,))
    check_array("r_done", r_done, "[C]", (cap,))
    check_array("r_next_row", r_next_row, "[C]", (cap,), np.int32)
    check_array("r_next_port", r_next_port, f"[C, {N_PORTFOLIO}]", (cap, N_PORTFOLIO))
    if not 1 <= n <= cap:
        raise ValueError(f"{n} transitions per step do not fit a ring of {cap}")
    launch(replay_put_result_kernel, n, meta, reward, done, next_row, next_port, r_reward, r_done, r_next_row,
           r_next_port, stream=stream, block=thread_block(n, REPLAY_BLOCK))  # fmt: skip
    launch_rows(replay_advance_kernel, 1, 1, meta, i32(n), i32(cap), stream=stream)


def replay_sample(meta: Any, states: Any, idx: Any, *, stream: Any) -> None:
    """idx int32 [B] = uniform slots below the ring's size, one float64 draw from states[j] each."""
    check_array("meta", meta, "[2]", (2,), np.int32)
    if len(idx.shape) != 1 or idx.shape[0] < 1:
        raise ValueError(f"idx must be int32 [B] with B >= 1, got {idx.shape}")
    b = idx.shape[0]
    check_array("idx", idx, "[B]", (b,), np.int32)
    if len(states.shape) != 1 or states.shape[0] < b or states.dtype != XOROSHIRO_DTYPE:
        raise ValueError(f"states must be xoroshiro128p states [>= {b}], got {states.dtype}{tuple(states.shape)}")
    check_array("states", states, f"[>= {b}]", (states.shape[0],), XOROSHIRO_DTYPE)
    launch(replay_sample_kernel, b, meta, states, idx, stream=stream, block=thread_block(b, REPLAY_BLOCK))


def replay_gather(idx: Any, ring: tuple[Any, ...], batch: tuple[Any, ...], *, stream: Any) -> None:
    """batch[*][j] = ring[*][idx[j]]; ring and batch are (row, port, action, reward, done, next_row,
    next_port) tuples of C and B transitions."""
    if len(idx.shape) != 1 or idx.shape[0] < 1:
        raise ValueError(f"idx must be int32 [B] with B >= 1, got {idx.shape}")
    b = idx.shape[0]
    check_array("idx", idx, "[B]", (b,), np.int32)
    check_transitions("ring.", ring[0].shape[0], *ring)
    check_transitions("batch.", b, *batch)
    launch(replay_gather_kernel, b, idx, *ring, *batch, stream=stream, block=thread_block(b, REPLAY_BLOCK))
