"""Kernels of the learner's gradient step (in the order the step launches them) and of its fold resets.

    step_schedule        state.step += 1; this step's lr and tau from the schedule block and the ISV
    (replay sample and gather: kernels/replay.py, B slots and the batch with s in rows 0..B-1 and s' in
     rows B..2B-1; the observations of the 2B rows: kernels/env.py gather_obs)
    double_dqn_rows      per branch row (sample, branch): the greedy next bin from the online E[Q](s'),
                         its target distribution, supports, reward, discount, the taken logits, the weight
                         (the next bin is the direction branch's for every branch unless bootstrap=branch)
    scatter_branch_grads dlogits [B, 13, Z] from the per-row gradients (0 on heads not taken)
    aux_forecast_loss    the auxiliary regression: the forecast column's gradient and the epoch's aux loss
    (obs_noise_kernel    learner.obs_noise > 0 only, after the observation gather: Gaussian noise on the
                         market columns of the 2B observation rows, drawn from the samples' generators)
    loss_guard           a non-finite loss marks the step non-finite (GRAD_NORM_RAW = NaN, counted once)
    finish_step          commits the step: Adam's t, the target supports' Polyak, UPDATE_RMS_EMA,
                         PARAM_NORM, TARGET_DRIFT_EMA and the epoch sums of the optimiser
    fold: mix_params (shrink-and-perturb), reset_optim_state (step counters)

Per-step values live on the device (OPTIM_STATE_DTYPE, kernels/optim.py): the schedule kernel increments
the step and computes lr and tau from constants the host writes once per epoch into a ControlBlock of
SCHEDULE_DTYPE:

    progress = min((step - 1) / horizon, 1)  (0 when horizon is 0: no decay)
    cosine   = 0.5 * (1 + cos(pi * progress))
    lr       = lr_base * (lr_min_frac + (1 - lr_min_frac) * cosine)    adam_step then damps it by
                                                                         max(0.05, FOLD_WARMUP_FACTOR)
    tau      = tau_base * (tau_min_frac + (1 - tau_min_frac) * cosine) / (1 + clip(ISV[Q_DRIFT_RATE], 0, 4))

so tau stays in [tau_base * tau_min_frac / 5, tau_base] (in [tau_base / 5, tau_base] with the default
tau_min_frac = 1) and a non-finite drift counts as 0.

Branch rows: row r = sample * 4 + branch; a row's weight is branch_weight[branch] * effect / B, where
effect is 0 on a step where the branch's choice changed nothing the environment did:
- magnitude when the direction is Hold or Flat (Hold keeps the position, Flat targets 0: no size);
- order type and urgency when the direction is Hold (no order is sent);
- urgency when the order type is MARKET (a market order fills at once: no lifetime).
A zero-weight row contributes no loss and no gradient, and is left out of the branch's loss signals.

Bootstrap (learner.bootstrap): 'direction' (the default) gives every branch the same next-state value, the
direction branch's greedy distribution Z_dir(s', argmax_d E[Q_dir](s', d)), the common state-value target of
branching DQNs (Tavakoli et al. 2018). 'branch' bootstraps each branch from its own greedy bin. With the
effect masks that is wrong for magnitude, order type and urgency: they are trained only on steps that trade,
so their own next-state value is "trade again at s'", and their Q chains the costs of a trade every bar
(on the default market their E[Q] drifted to -2.5 risk units within a fold while the direction heads
stayed near +-0.3); the direction branch always has an effect, so its greedy value is the state's value.

An empty replay (size 0) or a stored row outside market_obs gives NaN rewards or observations
(kernels/replay.py, kernels/env.py), so the step is skipped by the non-finite guard rather than reading
outside an array.
Launch shapes: grid-stride through `launch_strided` (one thread per element on the GPU, one block under
the simulator); the schedule, guard and fold-counter kernels are one thread; finish_step one block.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import cuda, float32, float64, from_dtype, int32
from numba.cuda.random import xoroshiro128p_type

from fox_numba.actions import FLAT, HOLD, N_BRANCHES, N_HEADS, OrderType
from fox_numba.device.isv import ISV_TOTAL_DIM, Isv
from fox_numba.device.launch import check_array, i32, launch, launch_rows, launch_strided, strided_threads
from fox_numba.device.memory import device_empty
from fox_numba.device.registry import register
from fox_numba.device.rng import xoroshiro128p_uniform_float32
from fox_numba.kernels.heads import N_AUX, N_STREAMS, aux_column, branch_span, head_width
from fox_numba.kernels.optim import NORM_BLOCK, OPTIM_STATE_DTYPE, check_state, norm_partials_len, partials_used
from fox_numba.kernels.signals import EpochStat, check_epoch, ema, finite, tree_sums

SCHEDULE_DTYPE = np.dtype(
    [
        ("lr_base", np.float32),  # learner.lr
        ("lr_min_frac", np.float32),  # the cosine ends at lr_base * lr_min_frac
        ("tau_base", np.float32),  # learner.tau
        ("tau_min_frac", np.float32),  # the cosine of tau ends at tau_base * tau_min_frac
        ("horizon", np.int64),  # steps the cosine runs over (a fold's epochs * steps_per_epoch); 0: none
    ],
    align=True,
)
_SCHED = from_dtype(SCHEDULE_DTYPE)
_STATE = from_dtype(OPTIM_STATE_DTYPE)

DRIFT_CLIP = np.float32(4.0)
UPDATE_ALPHA = np.float32(0.01)  # UPDATE_RMS_EMA
DRIFT_ALPHA = np.float32(0.05)  # TARGET_DRIFT_EMA
PARAM_NORM_FLOOR = np.float32(1e-6)
_MARKET = int(OrderType.MARKET)
_PI = np.float32(math.pi)
_TWO_PI = np.float32(2.0 * math.pi)
U1_FLOOR = np.float32(2.0**-25)  # obs_noise_kernel's Box-Muller radius draw

_RAW = int(Isv.GRAD_NORM_RAW)
_NONFINITE = int(Isv.NONFINITE_STEPS)
_LOSS_RAW = int(Isv.LOSS_RAW)
_Q_DRIFT = int(Isv.Q_DRIFT_RATE)
_UPDATE_RMS = int(Isv.UPDATE_RMS_EMA)
_PARAM_NORM = int(Isv.PARAM_NORM)
_TARGET_DRIFT = int(Isv.TARGET_DRIFT_EMA)
_E_APPLIED, _E_SKIPPED, _E_GRAD = int(EpochStat.APPLIED), int(EpochStat.SKIPPED), int(EpochStat.GRAD_NORM)
_E_AUX = int(EpochStat.LOSS_AUX)

_F1 = float32[::1]
_F2 = float32[:, ::1]
_F3 = float32[:, :, ::1]
_I1 = int32[::1]
_I2 = int32[:, ::1]
N_ROW_STATS = 3  # per branch row: TD, target E[Q(s', a*)], target minus online E[Q(s', a*)]
BOOTSTRAP_RULES = ("direction", "branch")  # learner.bootstrap (header)
ROWS_BLOCK = 64  # double_dqn_rows: a long serial loop per thread, so small blocks spread it over more SMs


@cuda.jit(device=True)
def schedule_progress(sched, step):
    """min((step - 1) / horizon, 1), 0 when the horizon is 0: the schedule's clock at step `step` (also the
    importance-weight exponent's, kernels/priority.py)."""
    horizon = sched[0].horizon
    if horizon > 0:
        return min(float32(step - 1) / float32(horizon), float32(1.0))
    return float32(0.0)


@register((_SCHED[::1], _STATE[::1], _F1))
@cuda.jit
def step_schedule(sched, state, isv):
    """state.step += 1, then state.lr and state.tau of this step (formulas in the module header)."""
    step = state[0].step + 1
    state[0].step = step
    progress = schedule_progress(sched, step)
    cosine = float32(0.5) * (float32(1.0) + math.cos(_PI * progress))
    lr_min = sched[0].lr_min_frac
    tau_min = sched[0].tau_min_frac
    state[0].lr = sched[0].lr_base * (lr_min + (float32(1.0) - lr_min) * cosine)
    drift = isv[_Q_DRIFT]
    if not drift > float32(0.0):  # negative or NaN
        drift = float32(0.0)
    drift = min(drift, DRIFT_CLIP)
    state[0].tau = sched[0].tau_base * (tau_min + (float32(1.0) - tau_min) * cosine) / (float32(1.0) + drift)


@cuda.jit(device=True)
def _effect(actions, i, b):
    """1 when branch b's choice had an effect on sample i's step, else 0 (rules in the module header)."""
    direction = actions[i, 0]
    if b == 1 and (direction == HOLD or direction == FLAT):
        return float32(0.0)
    if b >= 2 and direction == HOLD:
        return float32(0.0)
    if b == 3 and actions[i, 2] == _MARKET:
        return float32(0.0)
    return float32(1.0)


@cuda.jit(device=True)
def greedy_next(q, n_samples, i, b, shared):
    """a*, the head of branch row (i, b)'s next-state value: the argmax of the online E[Q](s') = q[n_samples + i]
    over the direction branch's bins when shared != 0, else over branch b's (ties to the lowest bin)."""
    off, size = branch_span(0 if shared != 0 else b)
    best = 0
    for k in range(1, size):
        if q[n_samples + i, off + k] > q[n_samples + i, off + best]:
            best = k
    return off + best


@register((_F3, _F2, _F3, _F2, _F2, _I2, _F1, _F1, _F1, int32,
           _F2, _F2, _F2, _F2, _F1, _F1, _F1, _F2, int32))
@cuda.jit
def double_dqn_rows(logits, q, logits_tgt, support_online, support_target, actions, rewards, discounts,
                    branch_w, shared, taken, p_next, sup_next, sup_proj, rew_r, disc_r, weights, row_stats,
                    n):
    """Per branch row r = i * 4 + b (n = 4B rows); logits and q hold s in rows 0..B-1 and s' in rows B..2B-1.

    a_t = the taken head of branch b; a* = argmax of the online E[Q](s') over the bins of the direction
    branch when shared = 1, else of branch b (ties to the lowest bin). taken[r] = online logits(s)[a_t];
    p_next[r] = softmax(target logits(s')[a*]);
    sup_next[r] = target support[a*]; sup_proj[r] = online support[a_t]; rew_r[r] = reward (the n-step
    return); disc_r[r] = discounts[i] (the replay gather's gamma**k * (1 - done)); weights[r] = branch_w[b] *
    effect / B; row_stats[r] = (TD, E_target[Q(s', a*)], E_target - E_online at (s', a*)),
    TD = reward + disc * E_target - E[Q(s, a_t)].
    """
    n_atoms = logits.shape[2]
    n_samples = actions.shape[0]
    r = cuda.grid(1)
    while r < n:
        i = r // N_BRANCHES
        b = r - i * N_BRANCHES
        off, size = branch_span(b)
        bin_t = min(max(actions[i, b], 0), size - 1)
        a_t = off + bin_t
        a_n = greedy_next(q, n_samples, i, b, shared)
        for z in range(n_atoms):
            taken[r, z] = logits[i, a_t, z]
        mx = logits_tgt[i, a_n, 0]
        for z in range(1, n_atoms):
            mx = max(mx, logits_tgt[i, a_n, z])
        total = float32(0.0)
        for z in range(n_atoms):
            total += math.exp(logits_tgt[i, a_n, z] - mx)
        v_min = support_target[a_n, 0]
        dz = support_target[a_n, 2]
        e_tgt = float32(0.0)
        for z in range(n_atoms):
            p = math.exp(logits_tgt[i, a_n, z] - mx) / total
            p_next[r, z] = p
            e_tgt += p * (v_min + float32(z) * dz)
        for c in range(3):
            sup_next[r, c] = support_target[a_n, c]
            sup_proj[r, c] = support_online[a_t, c]
        reward = rewards[i]
        discount = discounts[i]
        rew_r[r] = reward
        disc_r[r] = discount
        weights[r] = branch_w[b] * _effect(actions, i, b) / float32(n_samples)
        row_stats[r, 0] = reward + discount * e_tgt - q[i, a_t]
        row_stats[r, 1] = e_tgt
        row_stats[r, 2] = e_tgt - q[n_samples + i, a_n]
        r += cuda.gridsize(1)


@register((_F2, _I2, _F3, int32))
@cuda.jit
def scatter_branch_grads(dl_rows, actions, dlogits, n):
    """dlogits[i, a, z] = dl_rows[i * 4 + b, z] for the taken head a of each branch b, 0 on the branch's
    other heads; one (i, b, z) per iteration, n = B * 4 * Z."""
    n_atoms = dlogits.shape[2]
    t = cuda.grid(1)
    while t < n:
        r = t // n_atoms
        z = t - r * n_atoms
        i = r // N_BRANCHES
        b = r - i * N_BRANCHES
        off, size = branch_span(b)
        taken = min(max(actions[i, b], 0), size - 1)
        g = dl_rows[r, z]
        for k in range(size):
            dlogits[i, off + k, z] = g if k == taken else float32(0.0)
        t += cuda.gridsize(1)


@register((_F2, _I1, _F1, float32, _F2, float64[::1], int32, int32))
@cuda.jit
def aux_forecast_loss(head, rows, aux_target, weight, dhead, epoch, col, n_samples):
    """The auxiliary regression of the first n_samples rows (one block): y = aux_target[rows[i]], f = head[i,
    col]; where y is finite dhead[i, col] = weight * (f - y) / n_samples, else 0; epoch LOSS_AUX += the mean
    of (f - y)**2 / 2 over the rows with a target (nothing when none has, or the mean is not finite: a step the
    non-finite guard skips)."""
    tid = cuda.threadIdx.x
    acc = cuda.shared.array((2, NORM_BLOCK), float64)
    acc[0, tid] = float64(0.0)
    acc[1, tid] = float64(0.0)
    n_market = aux_target.shape[0]
    i = tid
    while i < n_samples:
        m = rows[i]
        y = aux_target[m] if 0 <= m < n_market else float32(math.nan)
        g = float32(0.0)
        if finite(y):
            d = head[i, col] - y
            g = weight * d / float32(n_samples)
            acc[0, tid] += float64(d) * float64(d) * float64(0.5)
            acc[1, tid] += float64(1.0)
        dhead[i, col] = g
        i += cuda.blockDim.x
    tree_sums(acc, 2, tid)
    if tid == 0 and acc[1, 0] > float64(0.0) and finite(acc[0, 0]):
        epoch[_E_AUX] += acc[0, 0] / acc[1, 0]


@register((_F2, xoroshiro128p_type[::1], float32, int32, int32))
@cuda.jit
def obs_noise_kernel(obs, states, sigma, n_market, n_samples):
    """Sample j (one thread) adds sigma * N(0, 1) to columns 0..n_market-1 of obs rows j, then n_samples + j,
    column pairs (c, c + 1) in order from one Box-Muller pair of draws from states[j]: u1 = max(1 - U, 2**-25)
    (a float32 U rounds to 1.0 about once in 2**25 draws: the floor keeps the log finite, clipping |z| at 5.9),
    u2 = U, r = sqrt(-2 log u1); c gets r cos(2 pi u2), c + 1 gets r sin(2 pi u2)."""
    j = cuda.grid(1)
    if j >= n_samples:
        return
    for half in range(2):
        row = j + half * n_samples
        c = 0
        while c < n_market:
            u1 = max(float32(1.0) - xoroshiro128p_uniform_float32(states, j), U1_FLOOR)
            u2 = xoroshiro128p_uniform_float32(states, j)
            r = sigma * math.sqrt(float32(-2.0) * math.log(u1))
            obs[row, c] += r * math.cos(_TWO_PI * u2)
            if c + 1 < n_market:
                obs[row, c + 1] += r * math.sin(_TWO_PI * u2)
            c += 2


@register((_F1,))
@cuda.jit
def loss_guard(isv):
    """A non-finite LOSS_RAW with a finite gradient norm: GRAD_NORM_RAW = NaN and NONFINITE_STEPS += 1,
    so the clip producer, Adam and Polyak skip the step as they do for a non-finite gradient."""
    if not finite(isv[_LOSS_RAW]) and finite(isv[_RAW]):
        isv[_RAW] = float32(math.nan)
        isv[_NONFINITE] += float32(1.0)


@register((_F1, _STATE[::1], float64[::1], float64[:, ::1], int32, int32, _F2, _F2, float64[::1]))
@cuda.jit
def finish_step(isv, state, adam_partials, polyak_partials, n_partials, n_params, support_online,
                support_target, epoch):
    """Commit the step once Adam and Polyak ran. Applied (finite GRAD_NORM_RAW): adam_t += 1; target
    supports += tau * (online - target); UPDATE_RMS_EMA (alpha 0.01) of sqrt(sum u**2 / n_params);
    PARAM_NORM = ||online||; TARGET_DRIFT_EMA (alpha 0.05) of ||target - online|| / max(PARAM_NORM, 1e-6);
    epoch APPLIED += 1, GRAD_NORM += norm. Skipped: epoch SKIPPED += 1, nothing else."""
    tid = cuda.threadIdx.x
    norm = isv[_RAW]
    applied = finite(norm)
    acc = cuda.shared.array((3, NORM_BLOCK), float64)
    for k in range(3):
        acc[k, tid] = float64(0.0)
    if applied:
        j = tid
        while j < n_partials:
            acc[0, tid] += adam_partials[j]
            acc[1, tid] += polyak_partials[j, 0]
            acc[2, tid] += polyak_partials[j, 1]
            j += cuda.blockDim.x
    tree_sums(acc, 3, tid)
    if tid != 0:
        return
    if not applied:
        epoch[_E_SKIPPED] += float64(1.0)
        return
    state[0].adam_t = state[0].adam_t + 1
    tau = state[0].tau
    for a in range(support_target.shape[0]):
        for c in range(3):
            support_target[a, c] = support_target[a, c] + tau * (support_online[a, c] - support_target[a, c])
    ema(isv, _UPDATE_RMS, float32(math.sqrt(acc[0, 0] / float64(n_params))), UPDATE_ALPHA)
    param_norm = float32(math.sqrt(acc[2, 0]))
    isv[_PARAM_NORM] = param_norm
    ema(isv, _TARGET_DRIFT, float32(math.sqrt(acc[1, 0])) / max(param_norm, PARAM_NORM_FLOOR), DRIFT_ALPHA)
    epoch[_E_APPLIED] += float64(1.0)
    epoch[_E_GRAD] += float64(norm)


@register((_F1, _F1, float32, int32))
@cuda.jit
def mix_params(params, fresh, keep, n):
    """params = keep * params + (1 - keep) * fresh (shrink-and-perturb at a fold boundary)."""
    i = cuda.grid(1)
    while i < n:
        params[i] = keep * params[i] + (float32(1.0) - keep) * fresh[i]
        i += cuda.gridsize(1)


@register((_STATE[::1],))
@cuda.jit
def reset_optim_state(state):
    """step = 0 and adam_t = 0: the schedule and Adam's bias correction start again (lr, tau kept)."""
    state[0].step = 0
    state[0].adam_t = 0


# ---- wrappers (check, then launch; they allocate nothing) ----------------------------------------------


def _shape(arr: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in arr.shape)


def _check_isv(isv: Any) -> None:
    check_array("isv", isv, "[ISV_TOTAL_DIM]", (ISV_TOTAL_DIM,))


def schedule_step(sched: Any, state: Any, isv: Any, *, stream: Any) -> None:
    """Advance the step counter and compute this step's lr and tau (sched: a ControlBlock's `.device`)."""
    check_array("sched", sched, "[1] SCHEDULE_DTYPE", (1,), SCHEDULE_DTYPE)
    check_state(state)
    _check_isv(isv)
    launch_rows(step_schedule, 1, 1, sched, state, isv, stream=stream)


class BranchRows:
    """The per-row buffers of a batch of B samples (R = 4B rows): allocated once by the learner."""

    def __init__(self, batch: int, n_atoms: int) -> None:
        r = N_BRANCHES * batch
        self.batch, self.n_atoms = batch, n_atoms
        self.taken = device_empty((r, n_atoms), np.float32)  # online logits of the taken heads on s
        self.p_next = device_empty((r, n_atoms), np.float32)  # target distribution of a* on s'
        self.target = device_empty((r, n_atoms), np.float32)  # the projection m
        self.dl = device_empty((r, n_atoms), np.float32)  # d loss / d taken logits
        self.sup_next = device_empty((r, 3), np.float32)
        self.sup_proj = device_empty((r, 3), np.float32)
        self.rewards = device_empty(r, np.float32)
        self.discounts = device_empty(r, np.float32)
        self.weights = device_empty(r, np.float32)
        self.loss = device_empty(r, np.float32)
        self.stats = device_empty((r, N_ROW_STATS), np.float32)


def select_rows(logits: Any, q: Any, logits_tgt: Any, support_online: Any, support_target: Any, actions: Any,
                rewards: Any, discounts: Any, branch_w: Any, rows: BranchRows, *, stream: Any,
                bootstrap: str = "direction") -> None:
    """Fill `rows` for double DQN (kernel double_dqn_rows); logits [2B, 13, Z] and q [2B, 13] of the online
    network on s then s', logits_tgt [B, 13, Z] of the target network on s'; `bootstrap` as in the header."""
    b, z = rows.batch, rows.n_atoms
    r = N_BRANCHES * b
    check_array("logits", logits, "[2B, 13, Z]", (2 * b, N_HEADS, z))
    check_array("q", q, "[2B, 13]", (2 * b, N_HEADS))
    check_array("logits_tgt", logits_tgt, "[B, 13, Z]", (b, N_HEADS, z))
    check_array("support_online", support_online, "[13, 3]", (N_HEADS, 3))
    check_array("support_target", support_target, "[13, 3]", (N_HEADS, 3))
    check_array("actions", actions, "[B, 4]", (b, N_BRANCHES), np.int32)
    check_array("rewards", rewards, "[B]", (b,))
    check_array("discounts", discounts, "[B]", (b,))
    check_array("branch_w", branch_w, "[4]", (N_BRANCHES,))
    if bootstrap not in BOOTSTRAP_RULES:
        raise ValueError(f"learner.bootstrap must be one of {BOOTSTRAP_RULES}, got {bootstrap!r}")
    launch_strided(double_dqn_rows, r, logits, q, logits_tgt, support_online, support_target, actions, rewards,
                   discounts, branch_w, i32(bootstrap == "direction"), rows.taken, rows.p_next,
                   rows.sup_next, rows.sup_proj, rows.rewards, rows.discounts, rows.weights, rows.stats, i32(r),
                   stream=stream, block=ROWS_BLOCK)


def scatter_grads(dl_rows: Any, actions: Any, dlogits: Any, *, stream: Any) -> None:
    """dlogits [B, 13, Z] from the per-row gradients dl_rows [4B, Z] at the taken heads, 0 elsewhere."""
    b, _, z = _shape(dlogits)
    check_array("dlogits", dlogits, "[B, 13, Z]", (b, N_HEADS, z))
    check_array("dl_rows", dl_rows, "[4B, Z]", (N_BRANCHES * b, z))
    check_array("actions", actions, "[B, 4]", (b, N_BRANCHES), np.int32)
    n = b * N_BRANCHES * z
    launch_strided(scatter_branch_grads, n, dl_rows, actions, dlogits, i32(n), stream=stream)


def aux_loss(head: Any, rows: Any, aux_target: Any, weight: float, dhead: Any, epoch: Any, *, stream: Any) -> None:
    """The auxiliary forecast's gradient into dhead's forecast column and its loss into the epoch sums (kernel
    aux_forecast_loss): head [2B or B, head_width(Z)] (the online forward; its first B rows are the samples'
    s), rows int32 [>= B] (their market rows), aux_target float32 [n_market], dhead [B, head_width(Z)]."""
    b, width = _shape(dhead)
    z = (width - N_AUX) // N_STREAMS
    check_array("dhead", dhead, "[B, head_width(Z)]", (b, head_width(z)))
    for name, arr, dtype in (("head", head, np.float32), ("rows", rows, np.int32),
                             ("aux_target", aux_target, np.float32)):
        check_array(name, arr, "", None, dtype)
    if len(head.shape) != 2 or head.shape[0] < b or head.shape[1] != width or len(rows.shape) != 1 or rows.shape[0] < b:
        raise ValueError(
            f"aux_loss: head {_shape(head)} and rows {_shape(rows)} need >= {b} rows, head {width} columns"
        )
    if len(aux_target.shape) != 1:
        raise ValueError(f"aux_loss: aux_target must be [n_market], got {_shape(aux_target)}")
    check_epoch(epoch)
    if not weight >= 0.0:
        raise ValueError(f"learner.aux_weight must be >= 0, got {weight}")
    launch_rows(aux_forecast_loss, 1, strided_threads(NORM_BLOCK), head, rows, aux_target, np.float32(weight),
                dhead, epoch, i32(aux_column(z)), i32(b), stream=stream)


def add_obs_noise(obs: Any, states: Any, sigma: float, n_market: int, *, stream: Any) -> None:
    """obs [2B, D] (s rows, then s' rows) += sigma * N(0, 1) on its first n_market columns (kernel
    obs_noise_kernel), from the B generators `states` (each advances by 2 * ceil(n_market / 2) draws)."""
    rows, width = _shape(obs)
    b = rows // 2
    check_array("obs", obs, "[2B, D]", (2 * b, width))
    check_array("states", states, "[B]", (b,), states.dtype)
    if not (sigma > 0.0 and 0 < n_market <= width):
        raise ValueError(f"observation noise needs sigma > 0 and 0 < n_market <= {width}, got {sigma}, {n_market}")
    launch(obs_noise_kernel, b, obs, states, np.float32(sigma), i32(n_market), i32(b), stream=stream)


def guard_loss(isv: Any, *, stream: Any) -> None:
    """Mark the step non-finite when LOSS_RAW is (after the gradient norm, before the clip producer)."""
    _check_isv(isv)
    launch_rows(loss_guard, 1, 1, isv, stream=stream)


def finish(isv: Any, state: Any, adam_partials: Any, polyak_partials: Any, n_params: int, support_online: Any,
           support_target: Any, epoch: Any, *, stream: Any) -> None:
    """Commit the step (kernel finish_step) from the partials Adam and Polyak wrote over n_params."""
    _check_isv(isv)
    check_state(state)
    k = norm_partials_len(n_params)
    check_array("adam_partials", adam_partials, "[k]", (k,), np.float64)
    check_array("polyak_partials", polyak_partials, "[k, 2]", (k, 2), np.float64)
    check_array("support_online", support_online, "[13, 3]", (N_HEADS, 3))
    check_array("support_target", support_target, "[13, 3]", (N_HEADS, 3))
    check_epoch(epoch)
    launch_rows(finish_step, 1, strided_threads(NORM_BLOCK), isv, state, adam_partials, polyak_partials,
                i32(partials_used(n_params)), i32(n_params), support_online, support_target, epoch, stream=stream)


def shrink_perturb(params: Any, fresh: Any, keep: float, *, stream: Any) -> None:
    """params = keep * params + (1 - keep) * fresh."""
    n = _shape(params)[0]
    check_array("params", params, "[n]", (n,))
    check_array("fresh", fresh, "[n]", (n,))
    if not 0.0 <= keep <= 1.0:
        raise ValueError(f"shrink-and-perturb keeps a fraction in [0, 1], got {keep}")
    launch_strided(mix_params, n, params, fresh, np.float32(keep), i32(n), stream=stream)


def reset_counters(state: Any, *, stream: Any) -> None:
    """Restart the optimiser state's step and adam_t at 0."""
    check_state(state)
    launch_rows(reset_optim_state, 1, 1, state, stream=stream)
