"""Reductions over the environments: the rollout ISV slots every collect step, the metrics once per epoch.

Both run as one block (`launch_rows(.., 1, threads, ..)`, threads a power of two <= ROLLOUT_BLOCK /
STATS_BLOCK, chosen by `stats_threads`): thread t sums environments t, t + threads, ... in order (in
registers for the rollout), stores its partial sums in shared memory, then a halving tree adds them. No atomics and no warp shuffles, so the sums have the same bits on
every run (for a fixed thread count), and the simulator runs them.

rollout_isv_kernel (every collect step, after env_step), alpha ROLLOUT_EMA_ALPHA = 0.05, means over the
N environments of this step:
  ACT_SHORT/HOLD/LONG/FLAT_FRAC_EMA  share of each direction in actions[:, 0]
  POSITION_ABS_EMA                   mean |held position| / max_position
  TURNOVER_EMA                       mean contracts filled per environment
  EPISODE_RETURN_EMA                 mean reward sum of the episodes that ended this step (untouched when
                                     none did)
  REWARD_ABS_EMA                     mean |reward|
  REWARD_PNL_EMA .. REWARD_TIMING_EMA  mean |component| (slots 63-68, in kernels/env.py COMP order)
Sums are float32 (a signal, not an account).

epoch_metrics_kernel (once per epoch, then the accumulators are cleared): float64 sums of the
per-environment accumulators (kernels/env.py ACC_*) into `out` float64 [N_METRICS], a mapped buffer the
host reads after a synchronisation; METRICS names and defines each entry.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import cuda, float32, float64, int32

from fox_numba.actions import N_BRANCHES, N_DIRECTIONS
from fox_numba.device.isv import ISV_TOTAL_DIM, Isv
from fox_numba.device.launch import check_array, launch_rows
from fox_numba.device.registry import register
from fox_numba.kernels.env import (
    ACC_COMMISSION_USD,
    ACC_COMP_0,
    ACC_DIR_0,
    ACC_EP_RETURN,
    ACC_EPISODES,
    ACC_LIMIT_FILLED,
    ACC_LIMIT_PLACED,
    ACC_PNL_USD,
    ACC_POS_ABS,
    ACC_REWARD,
    ACC_STEPS,
    ACC_TRADED,
    COMP_NAMES,
    N_ACC,
    N_COMPS,
    N_STATS,
    ST_EP_DONE,
    ST_EP_RETURN,
    ST_POS_ABS,
    ST_TRADED,
)

STATS_BLOCK = 256  # most threads of the epoch metrics reduction (float64 shared rows are sized for it)
ROLLOUT_BLOCK = 512  # most threads of the per-step rollout reduction (float32 shared rows)
ROLLOUT_EMA_ALPHA = np.float32(0.05)

# rollout partial sums (shared rows)
R_DIR_0 = 0  # .. + 3
R_POS_ABS = N_DIRECTIONS
R_TRADED = R_POS_ABS + 1
R_EP_DONE = R_TRADED + 1
R_EP_RETURN = R_EP_DONE + 1
R_REWARD_ABS = R_EP_RETURN + 1
R_COMP_0 = R_REWARD_ABS + 1  # .. + N_COMPS - 1
N_ROLL = R_COMP_0 + N_COMPS

_ACT_0 = int(Isv.ACT_SHORT_FRAC_EMA)
_POSITION_ABS = int(Isv.POSITION_ABS_EMA)
_TURNOVER = int(Isv.TURNOVER_EMA)
_EPISODE_RETURN = int(Isv.EPISODE_RETURN_EMA)
_REWARD_ABS = int(Isv.REWARD_ABS_EMA)
_REWARD_COMP_0 = int(Isv.REWARD_PNL_EMA)
assert [int(Isv[f"ACT_{d}_FRAC_EMA"]) for d in ("SHORT", "HOLD", "LONG", "FLAT")] == [_ACT_0 + k for k in range(4)]
assert [int(Isv[f"REWARD_{c.upper()}_EMA"]) for c in COMP_NAMES] == [_REWARD_COMP_0 + k for k in range(N_COMPS)]

METRICS: tuple[tuple[str, str], ...] = (
    ("steps", "Environment steps taken (summed over environments)."),
    ("episodes", "Episodes completed."),
    ("reward_mean", "Mean reward per step (risk units, shaping included)."),
    *((f"{c}_mean", f"Mean {c} reward component per step.") for c in COMP_NAMES),
    ("short_frac", "Share of steps whose action was Short."),
    ("hold_frac", "Share of steps whose action was Hold."),
    ("long_frac", "Share of steps whose action was Long."),
    ("flat_frac", "Share of steps whose action was Flat."),
    ("active_frac", "Share of steps that chose Long or Short."),
    ("turnover", "Contracts filled per step (market, limit and forced closes)."),
    ("limit_placed", "Contracts of limit orders placed."),
    ("limit_filled", "Contracts of limit orders filled."),
    ("fill_rate", "limit_filled / limit_placed (0 when none was placed)."),
    ("position_abs_mean", "Mean |position| / env.max_position held over a step."),
    ("episode_return_mean", "Mean reward sum of the completed episodes (0 when none completed)."),
    ("pnl_usd", "Equity change in dollars, net of commissions and crossing costs, summed over environments."),
    ("commission_usd", "Commissions paid in dollars."),
)
"""(name, meaning) of the epoch metrics, in the order of the kernel's output."""
METRIC_NAMES = tuple(name for name, _ in METRICS)
N_METRICS = len(METRICS)
METRICS_DTYPE = np.dtype([(name, np.float64) for name in METRIC_NAMES])
(
    M_STEPS, M_EPISODES, M_REWARD, M_COMP_0, _M1, _M2, _M3, _M4, _M5, M_SHORT, M_HOLD, M_LONG, M_FLAT, M_ACTIVE,
    M_TURNOVER, M_PLACED, M_FILLED, M_FILL_RATE, M_POS_ABS, M_EP_RETURN, M_PNL_USD, M_COMMISSION_USD,
) = range(N_METRICS)  # fmt: skip
assert METRIC_NAMES[M_COMP_0 + N_COMPS - 1] == "timing_mean" and METRIC_NAMES[M_SHORT] == "short_frac"
assert N_COMPS == 6 and N_DIRECTIONS == 4, "rollout_isv_kernel keeps one register per component and direction"


def stats_threads(n: int, most: int = STATS_BLOCK) -> int:
    """Threads of a reduction over n environments: the power of two >= n, at most `most`."""
    t = 1
    while t < min(n, most):
        t *= 2
    return t


@cuda.jit(device=True)
def _tree_rows(sh, n_rows, t, threads):
    """sh[k, 0] = sum of sh[k, 0:threads] for k < n_rows, by halving; every thread calls it."""
    cuda.syncthreads()
    s = threads // 2
    while s > 0:
        if t < s:
            for k in range(n_rows):
                sh[k, t] += sh[k, t + s]
        cuda.syncthreads()
        s //= 2


@register((int32[:, ::1], float32[::1], float32[:, ::1], float32[:, ::1], float32[::1]))
@cuda.jit
def rollout_isv_kernel(actions, reward, comps, stats, isv):
    """The rollout ISV slots' EMAs from this step's actions and env_step outputs (module header)."""
    t = cuda.threadIdx.x
    threads = cuda.blockDim.x
    n = reward.shape[0]
    sh = cuda.shared.array((N_ROLL, ROLLOUT_BLOCK), float32)
    zero = float32(0.0)
    d0 = d1 = d2 = d3 = pos_abs = traded = ep_done = ep_return = reward_abs = zero
    c0 = c1 = c2 = c3 = c4 = c5 = zero
    i = t
    while i < n:  # register sums over environments t, t + threads, ...; one shared store per row at the end
        d = actions[i, 0]
        d0 += float32(1.0) if d == 0 else zero
        d1 += float32(1.0) if d == 1 else zero
        d2 += float32(1.0) if d == 2 else zero
        d3 += float32(1.0) if d == 3 else zero
        pos_abs += stats[ST_POS_ABS, i]
        traded += stats[ST_TRADED, i]
        ep_done += stats[ST_EP_DONE, i]
        ep_return += stats[ST_EP_RETURN, i]
        reward_abs += abs(reward[i])
        c0 += abs(comps[0, i])
        c1 += abs(comps[1, i])
        c2 += abs(comps[2, i])
        c3 += abs(comps[3, i])
        c4 += abs(comps[4, i])
        c5 += abs(comps[5, i])
        i += threads
    sh[R_DIR_0, t] = d0
    sh[R_DIR_0 + 1, t] = d1
    sh[R_DIR_0 + 2, t] = d2
    sh[R_DIR_0 + 3, t] = d3
    sh[R_POS_ABS, t] = pos_abs
    sh[R_TRADED, t] = traded
    sh[R_EP_DONE, t] = ep_done
    sh[R_EP_RETURN, t] = ep_return
    sh[R_REWARD_ABS, t] = reward_abs
    sh[R_COMP_0, t] = c0
    sh[R_COMP_0 + 1, t] = c1
    sh[R_COMP_0 + 2, t] = c2
    sh[R_COMP_0 + 3, t] = c3
    sh[R_COMP_0 + 4, t] = c4
    sh[R_COMP_0 + 5, t] = c5
    _tree_rows(sh, N_ROLL, t, threads)
    if t == 0:
        inv_n = float32(1.0) / float32(n)
        for d in range(N_DIRECTIONS):
            isv[_ACT_0 + d] += ROLLOUT_EMA_ALPHA * (sh[R_DIR_0 + d, 0] * inv_n - isv[_ACT_0 + d])
        isv[_POSITION_ABS] += ROLLOUT_EMA_ALPHA * (sh[R_POS_ABS, 0] * inv_n - isv[_POSITION_ABS])
        isv[_TURNOVER] += ROLLOUT_EMA_ALPHA * (sh[R_TRADED, 0] * inv_n - isv[_TURNOVER])
        episodes = sh[R_EP_DONE, 0]
        if episodes > float32(0.0):
            isv[_EPISODE_RETURN] += ROLLOUT_EMA_ALPHA * (sh[R_EP_RETURN, 0] / episodes - isv[_EPISODE_RETURN])
        isv[_REWARD_ABS] += ROLLOUT_EMA_ALPHA * (sh[R_REWARD_ABS, 0] * inv_n - isv[_REWARD_ABS])
        for c in range(N_COMPS):
            slot = _REWARD_COMP_0 + c
            isv[slot] += ROLLOUT_EMA_ALPHA * (sh[R_COMP_0 + c, 0] * inv_n - isv[slot])


@cuda.jit(device=True)
def _ratio(num, den):
    return num / den if den > 0.0 else 0.0


@register((float64[:, ::1], float64[::1]))
@cuda.jit
def epoch_metrics_kernel(acc, out):
    """out[M_*] from the sums of acc [N_ACC, N] over the environments (module header)."""
    t = cuda.threadIdx.x
    threads = cuda.blockDim.x
    n = acc.shape[1]
    sh = cuda.shared.array((N_ACC, STATS_BLOCK), float64)
    for k in range(N_ACC):
        s = 0.0
        i = t
        while i < n:
            s += acc[k, i]
            i += threads
        sh[k, t] = s
    _tree_rows(sh, N_ACC, t, threads)
    if t == 0:
        steps = sh[ACC_STEPS, 0]
        out[M_STEPS] = steps
        out[M_EPISODES] = sh[ACC_EPISODES, 0]
        out[M_REWARD] = _ratio(sh[ACC_REWARD, 0], steps)
        for c in range(N_COMPS):
            out[M_COMP_0 + c] = _ratio(sh[ACC_COMP_0 + c, 0], steps)
        for d in range(N_DIRECTIONS):
            out[M_SHORT + d] = _ratio(sh[ACC_DIR_0 + d, 0], steps)
        out[M_ACTIVE] = _ratio(sh[ACC_DIR_0, 0] + sh[ACC_DIR_0 + 2, 0], steps)
        out[M_TURNOVER] = _ratio(sh[ACC_TRADED, 0], steps)
        out[M_PLACED] = sh[ACC_LIMIT_PLACED, 0]
        out[M_FILLED] = sh[ACC_LIMIT_FILLED, 0]
        out[M_FILL_RATE] = _ratio(sh[ACC_LIMIT_FILLED, 0], sh[ACC_LIMIT_PLACED, 0])
        out[M_POS_ABS] = _ratio(sh[ACC_POS_ABS, 0], steps)
        out[M_EP_RETURN] = _ratio(sh[ACC_EP_RETURN, 0], sh[ACC_EPISODES, 0])
        out[M_PNL_USD] = sh[ACC_PNL_USD, 0]
        out[M_COMMISSION_USD] = sh[ACC_COMMISSION_USD, 0]


def rollout_isv(actions: Any, reward: Any, comps: Any, stats: Any, isv: Any, *, stream: Any) -> None:
    """Fold this collect step's means into the rollout ISV slots (actions int32 [N, 4], reward float32 [N],
    comps float32 [N_COMPS, N], stats float32 [N_STATS, N] from env_step; isv float32 [ISV_TOTAL_DIM])."""
    if len(reward.shape) != 1 or reward.shape[0] < 1:
        raise ValueError(f"reward must be float32 [N] with N >= 1, got {reward.shape}")
    n = reward.shape[0]
    check_array("actions", actions, f"[N, {N_BRANCHES}]", (n, N_BRANCHES), np.int32)
    check_array("reward", reward, "[N]", (n,))
    check_array("comps", comps, f"[{N_COMPS}, N]", (N_COMPS, n))
    check_array("stats", stats, f"[{N_STATS}, N]", (N_STATS, n))
    check_array("isv", isv, f"[{ISV_TOTAL_DIM}]", (ISV_TOTAL_DIM,))
    threads = stats_threads(n, ROLLOUT_BLOCK)
    launch_rows(rollout_isv_kernel, 1, threads, actions, reward, comps, stats, isv, stream=stream)


def epoch_metrics(acc: Any, out: Any, *, stream: Any) -> None:
    """out float64 [N_METRICS] (a mapped buffer's device view) = the metrics of acc float64 [N_ACC, N]."""
    if len(acc.shape) != 2 or acc.shape[1] < 1:
        raise ValueError(f"acc must be float64 [{N_ACC}, N], got {acc.shape}")
    check_array("acc", acc, f"[{N_ACC}, N]", (N_ACC, acc.shape[1]), np.float64)
    check_array("out", out, f"[{N_METRICS}]", (N_METRICS,), np.float64)
    launch_rows(epoch_metrics_kernel, 1, stats_threads(acc.shape[1]), acc, out, stream=stream)
