"""The replay buffer: a device ring of transitions written by the collector and sampled by the learner.

Layout and write protocol: kernels/replay.py. The buffer is allocated once (zeroed); `clear` empties it
at a fold boundary (cursor = size = 0, a graph-safe kernel); every method only launches kernels, so a
collect step or a training step that uses it can be captured as one StepGraph.

A collect step, with env an agent.environment.VecEnv and `actions` its [N, 4] action buffer:

    env.observe(obs, stream=s)                                     # obs [N, obs_dim]
    ... network forward + action selection -> actions ...
    replay.put_obs(env.row, env.port, actions, env.entry, stream=s)   # before the step
    env.step(actions, stream=s)
    replay.put_result(env.reward, env.done, env.next_row, env.next_port, stream=s)   # + cursor advance
    env.rollout_stats(actions, stream=s)

A training step (agent/learner.py) samples and gathers a batch of B transitions, s and s' stacked so one
observation gather and one network forward cover both, then rebuilds the 2B observations with gather_obs
(kernels/env.py):

    batch = ReplayBatch(B, stream=s)               # once, with obs [2B, obs_dim] beside it
    replay.sample(states, batch.idx, stream=s)     # states: xoroshiro [>= B], one draw each
    replay.gather(batch, stride=N, n_step=n, gamma=g, stream=s)   # rows [2B], port [2B, P]: s, then s' (n steps on);
                                                                  # actions, n-step rewards and discounts
    gather_obs(market.market_obs, batch.rows, batch.port, obs, stream=s)    # obs[:B] = s, obs[B:] = s'

Prioritised replay (learner.priority_alpha > 0): the learner calls `prioritise` once at construction, before
any collect step is captured; from then on put_obs also gives the new slots the running max priority and
clear also clears the priorities, and the learner samples with `priorities.sample` (kernels/priority.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fox_numba.actions import N_BRANCHES
from fox_numba.device.memory import device_zeros, zero_fill
from fox_numba.device.staging import Stager
from fox_numba.kernels.priority import (
    importance_weights,
    priority_clear,
    priority_put,
    priority_sample,
    priority_update,
    tree_leaves,
)
from fox_numba.kernels.replay import (
    META_CURSOR,
    META_SIZE,
    replay_gather,
    replay_put_obs,
    replay_put_result,
    replay_sample,
)
from fox_numba.observation import N_PORTFOLIO

FIELDS: tuple[str, ...] = ("row", "port", "action", "reward", "done", "next_row", "next_port")
"""The transition arrays, in the order the gather kernel takes them."""
STORED: tuple[str, ...] = (*FIELDS, "entry")
"""Every per-slot array of the ring (checkpoints, upload, download): the transitions and each state's entry price."""


class ReplayBatch:
    """B sampled transitions in the learner's layout: idx int32 [B] (the slots, -1 from an empty ring),
    rows int32 [2B] and port float32 [2B, P] (s in rows 0..B-1, s' in rows B..2B-1), actions int32 [B, 4],
    n-step rewards float32 [B] and discounts float32 [B] (gamma**k * (1 - done); kernels/replay.py)."""

    def __init__(self, batch: int, *, stream: Any, n_port: int = N_PORTFOLIO) -> None:
        if batch < 1:
            raise ValueError(f"a batch needs at least one transition, got {batch}")
        self.size = batch
        self.idx = device_zeros(batch, np.int32, stream=stream)
        self.rows = device_zeros(2 * batch, np.int32, stream=stream)
        self.port = device_zeros((2 * batch, n_port), np.float32, stream=stream)
        self.actions = device_zeros((batch, N_BRANCHES), np.int32, stream=stream)
        self.rewards = device_zeros(batch, np.float32, stream=stream)
        self.discounts = device_zeros(batch, np.float32, stream=stream)


class Priorities:
    """The proportional priorities of a ring's `capacity` slots: a float64 sum tree [2L] whose leaf L + s is slot
    s's priority, and the running max priority float64 [1] (kernels/priority.py). Cleared at construction."""

    def __init__(self, capacity: int, *, stream: Any) -> None:
        self.capacity, self.n_leaves = capacity, tree_leaves(capacity)
        self.tree = device_zeros(2 * self.n_leaves, np.float64, stream=stream)
        self.max_priority = device_zeros(1, np.float64, stream=stream)
        self.clear(stream=stream)

    def clear(self, *, stream: Any) -> None:
        """Every priority 0 (nothing sampleable) and the running max back to PRIORITY_START."""
        priority_clear(self.tree, self.max_priority, stream=stream)

    def put(self, meta: Any, n: int, *, stream: Any) -> None:
        """The n slots a collect step writes from the ring's cursor get the running max priority."""
        priority_put(meta, n, self.capacity, self.tree, self.max_priority, stream=stream)

    def sample(self, states: Any, idx: Any, *, stream: Any) -> None:
        """idx int32 [B] = stratified draws proportional to priority, -1 while every priority is 0 (the tree is
        rebuilt from its leaves first; states: xoroshiro [>= B], one draw each)."""
        priority_sample(self.tree, states, idx, stream=stream)

    def weights(self, idx: Any, sched: Any, state: Any, beta0: float, row_w: Any, is_w: Any, *, stream: Any) -> None:
        """is_w [B] = the importance weights of the slots idx (beta annealed from beta0 on the schedule's clock),
        and the learner's branch-row weights row_w [4B] multiplied by them."""
        importance_weights(self.tree, idx, sched, state, beta0, row_w, is_w, stream=stream)

    def update(self, idx: Any, loss: Any, *, alpha: float, eps: float, stream: Any) -> None:
        """The drawn slots' priorities = (direction-row loss + eps)**alpha (loss [4B], the learner's rows)."""
        priority_update(idx, loss, alpha, eps, self.tree, self.max_priority, stream=stream)

    def upload(self, leaves: np.ndarray, max_priority: float, stager: Stager) -> None:
        """Set every slot's priority (float64 [capacity]) and the running max (tests, benchmarks)."""
        tree = np.zeros(2 * self.n_leaves, np.float64)
        tree[self.n_leaves : self.n_leaves + self.capacity] = leaves
        stager.upload(tree, self.tree)
        stager.upload(np.array([max_priority], np.float64), self.max_priority)

    def download(self, stager: Stager) -> tuple[np.ndarray, float]:
        """(the slots' priorities float64 [capacity], the running max) on the host (synchronises)."""
        tree = stager.download(self.tree)
        return tree[self.n_leaves : self.n_leaves + self.capacity].copy(), float(stager.download(self.max_priority)[0])


class ReplayBuffer:
    """A ring of `capacity` transitions on the device (struct of arrays, zeroed) with meta = (cursor, size).

    row int32 [C], port float32 [C, P], action int32 [C, 4], reward float32 [C], done float32 [C] (0 or 1),
    next_row int32 [C], next_port float32 [C, P], entry float64 [C] (the state's average entry price); meta int32
    [2]. P = n_port: N_PORTFOLIO, the observation's
    portfolio part (tests of the learner use narrower rings).
    """

    NOT_STATE = ("capacity", "n_port")  # the transitions and the cursor are state: the fold reset empties it

    def __init__(self, capacity: int, *, stream: Any, n_port: int = N_PORTFOLIO) -> None:
        if capacity < 1:
            raise ValueError(f"the replay buffer needs a capacity of at least 1, got {capacity}")
        if n_port < 1:
            raise ValueError(f"the replay buffer needs a portfolio width of at least 1, got {n_port}")
        self.capacity, self.n_port = capacity, n_port
        self.row = device_zeros(capacity, np.int32, stream=stream)
        self.port = device_zeros((capacity, n_port), np.float32, stream=stream)
        self.action = device_zeros((capacity, N_BRANCHES), np.int32, stream=stream)
        self.reward = device_zeros(capacity, np.float32, stream=stream)
        self.done = device_zeros(capacity, np.float32, stream=stream)
        self.next_row = device_zeros(capacity, np.int32, stream=stream)
        self.next_port = device_zeros((capacity, n_port), np.float32, stream=stream)
        self.entry = device_zeros(capacity, np.float64, stream=stream)
        self.meta = device_zeros(2, np.int32, stream=stream)
        self.priorities: Priorities | None = None  # prioritised replay only (`prioritise`)

    def prioritise(self, *, stream: Any) -> Priorities:
        """The ring's priorities, allocated (and cleared) at the first call: from then on put_obs and clear keep
        them (call before any collect step is captured, so its graph holds the priority writes)."""
        if self.priorities is None:
            self.priorities = Priorities(self.capacity, stream=stream)
        return self.priorities

    def arrays(self) -> tuple[Any, ...]:
        """(row, port, action, reward, done, next_row, next_port)."""
        return tuple(getattr(self, f) for f in FIELDS)

    def clear(self, *, stream: Any) -> None:
        """Empty the ring (cursor = size = 0, every slot zero bits) and clear its priorities. Emptied slots are
        never sampled; zeroing them makes an emptied ring the same bytes whatever it held, so a run resumed at a
        fold boundary from a checkpoint without the ring (trainer.RING_STATE) checkpoints as an uninterrupted
        one does."""
        for name in (*STORED, "meta"):
            zero_fill(getattr(self, name), stream=stream)
        if self.priorities is not None:
            self.priorities.clear(stream=stream)

    def put_obs(self, row: Any, port: Any, actions: Any, entry: Any, *, stream: Any) -> None:
        """The observed half of N transitions (before the environment step): rows int32 [N], portfolio
        features [N, N_PORTFOLIO], actions int32 [N, 4], the positions' average entry prices float64 [N];
        prioritised, their slots get the running max priority."""
        replay_put_obs(self.meta, row, port, actions, entry, self.row, self.port, self.action, self.entry,
                       stream=stream)
        if self.priorities is not None:
            self.priorities.put(self.meta, int(row.shape[0]), stream=stream)

    def put_result(self, reward: Any, done: Any, next_row: Any, next_port: Any, *, stream: Any) -> None:
        """The result half of the same N transitions (after the step); advances the cursor by N."""
        replay_put_result(self.meta, reward, done, next_row, next_port, self.reward, self.done, self.next_row,
                          self.next_port, stream=stream)  # fmt: skip

    def sample(self, states: Any, idx: Any, *, stream: Any) -> None:
        """idx int32 [B] = uniform slots of the filled part, -1 while empty (states: xoroshiro [>= B], one
        draw each; the rule in kernels/replay.py)."""
        replay_sample(self.meta, states, idx, stream=stream)

    def gather(self, batch: ReplayBatch, *, stride: int, n_step: int = 1, gamma: float, stream: Any) -> None:
        """The transitions at batch.idx into the batch's arrays (s rows, then the s' rows n_step transitions on),
        with their n-step rewards and discounts; `stride`: transitions written per collect step (the collect's
        environments), which places an environment's next transition (kernels/replay.py)."""
        replay_gather(self.meta, batch.idx, self.arrays(), batch.rows, batch.port, batch.actions, batch.rewards,
                      batch.discounts, stride=stride, n_step=n_step, gamma=gamma, stream=stream)

    def read_meta(self, stager: Stager) -> tuple[int, int]:
        """(cursor, size) on the host (synchronises the stager's stream)."""
        meta = stager.download(self.meta)
        return int(meta[META_CURSOR]), int(meta[META_SIZE])

    def upload(self, arrays: dict[str, np.ndarray], stager: Stager) -> None:
        """Write host copies of every array and meta (the keys of `download`; tests, benchmarks)."""
        for name in (*STORED, "meta"):
            stager.upload(np.ascontiguousarray(arrays[name]), getattr(self, name))

    def download(self, stager: Stager) -> dict[str, np.ndarray]:
        """Host copies of every array and meta (tests, diagnostics)."""
        out = {f: stager.download(getattr(self, f)) for f in STORED}
        out["meta"] = stager.download(self.meta)
        return out
