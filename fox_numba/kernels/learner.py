"""Kernels of the learner's gradient step (in the order the step launches them) and of its fold resets.

    step_schedule        state.step += 1; this step's lr and tau from the schedule block and the ISV
    (replay sample and gather: kernels/replay.py, B slots and the batch with s in rows 0..B-1 and s' in
     rows B..2B-1; the observations of the 2B rows: kernels/env.py gather_obs)
    select_q_rows        from the head GEMM outputs (the dueling combine formed in shared memory as the
                         rows are staged): the online E[Q], entropy and utilisation of every head (s
                         and s'), then per branch row (sample, branch) the greedy next bin from the online
                         E[Q](s') (the direction branch's for every branch unless bootstrap=branch), its
                         target softmax's max and sum, reward, discount, weight and row statistics
    (importance weights: kernels/priority.py, prioritised replay only, multiply the rows' weights here)
    project_loss_scatter per branch row the C51 projection, the cross-entropy and its gradient, scattered into
                         the heads (0 on heads not taken) and taken back through the dueling combine into the
                         head GEMM's stream columns of dhead [B, head_width(Z)] (kernels/heads.py's backward)
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

The two C51 kernels fuse the chain dueling_combine_fwd (online and target) -> expected_q (with the utilisation pass)
-> double DQN rows -> c51_project -> c51_loss -> scatter -> dueling_combine_bwd: two launches instead of eight, and
neither the [2B + B, 13, Z] logits, the [4B, Z] rows (taken logits, p_next, the projection, the row gradients) nor
the [B, 13, Z] logit gradients go through global memory. The kernels read the head GEMMs' outputs [rows,
head_width(Z)] and form the logits they stage with the combine kernel's arithmetic (the same bits): select_q_rows
copies whole samples' stream columns and combines them in shared memory (a branch's mean once per atom), the
target rows of the a* and project_loss_scatter's rows, a few per sample, take heads.combined_logit (the mean
recomputed per logit, from rows the cache holds). The importance weights (prioritised
replay) multiply the rows' weights between the two, which is where the chain was split. Results are the chain's bit
for bit: every float32 value comes from the same code in the same order (distributional.py's device functions
row_stats, atom_pass, project_row, cross_entropy_row, run on rows staged in shared memory instead of global rows;
the target softmax p = exp(x - max) / sum from the same max and sum); tests/agent/test_learner_fused.py runs whole
steps against the chain. Launch shapes (`launch_rows`), both staging with coalesced loads at an odd row stride (Z | 1,
so threads reading one atom of different rows hit different banks) because a thread walking its own global row
made every warp load touch 32 rows:
- select_q_rows: one block per up to head_rows.STAGE_SAMPLES (8) samples, 13 threads per sample (thread = head),
  rounded up to whole warps (104 -> 128: the spare threads of the last warp, which the GPU allocates whole, share
  the staging loads), eight blocks per SM (head_rows' shared-memory budget; launch_bounds holds the registers to
  64, the carveout is the most shared memory). Three
  rounds, each staging rows into head_rows.STAGE_WORDS floats (four loads in flight per thread; in the first two the
  value streams into VALUE_WORDS more, then the combine in place), a barrier, then one row per thread from
  shared memory: the 13 online s rows of each sample (E[Q], entropy, utilisation); the 13
  online s' rows (E[Q]); then threads h < 4 pick each branch row's a* from the block's q of s' (global memory,
  written before the barriers), and only those target rows are staged for the branch rows' target softmax: 4 per
  sample, or one with the default bootstrap, where every branch row bootstraps from the same a* (a quarter of the
  loads, each of which, (size + 2) logits of the GEMM output for heads.combined_logit, waits a memory latency).
  With the direction branch alone (live 1, the default network) the block is compact: 4 threads a sample (a live
  head in the first two rounds, a branch row in the third), only the live heads' rows staged, so the same shared
  memory holds 26 samples (select_samples; SELECT_ROWS bounds the a* array to keep eight blocks an SM) and a step
  launches 316 blocks instead of 1,024, of which 3 threads in 4 computed no row. The same bits; on an H100 eight
  learners sharing the card step 8 % faster, one alone 3 % slower (learner_ablation_h200.md section 93).
- project_loss_scatter: one block per up to LOSS_SAMPLES (16) samples' live branch rows (64 rows), LOSS_THREADS_PER_ROW
  (4) threads per row: all of them stage the rows' p_next (formed from the target logits) and taken online
  logits, one per row projects into a staged scratch and writes the gradient over it, then all write the
  block's samples' stream columns of dhead (every value and advantage stream, every atom) coalesced, each the
  combine's backward of the staged row gradients: dV_b = the sum over the branch's heads (in head order), dA_a =
  the head's gradient - that sum / the branch's size, as dueling_combine_bwd computes them.
Z is at most MAX_ATOMS (407) for the staging (the wrappers refuse more); action selection has the same bound.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import cuda, float32, float64, from_dtype, int32
from numba.cuda.random import xoroshiro128p_type

from fox_numba.actions import FLAT, HOLD, N_BRANCHES, N_HEADS, OrderType
from fox_numba.config import CHOICES
from fox_numba.device.isv import ISV_TOTAL_DIM, Isv
from fox_numba.device.launch import check_array, i32, launch, launch_rows, launch_strided, strided_threads
from fox_numba.device.memory import device_empty
from fox_numba.device.registry import register
from fox_numba.device.runtime import SIMULATOR, u32
from fox_numba.device.rng import xoroshiro128p_uniform_float32
from fox_numba.kernels.distributional import atom_pass, cross_entropy_row, project_row, row_stats
from fox_numba.kernels.head_rows import (
    MAX_ATOMS,
    STAGE_SAMPLES,
    STAGE_WORDS,
    VALUE_WORDS,
    carry,
    combined_heads_stager,
    live_heads,
    stage_samples,
    walk_start,
)
from fox_numba.kernels.heads import (
    N_AUX,
    N_STREAMS,
    aux_column,
    branch_span,
    combined_logit,
    head_width,
    live_streams,
    stream_branch,
)
from fox_numba.kernels.optim import NORM_BLOCK, OPTIM_STATE_DTYPE, check_state, norm_partials_len, partials_used
from fox_numba.kernels.signals import LOSS_ALPHA, EpochStat, check_epoch, ema, finite, tree_sums

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
_AUX_LOSS = int(Isv.AUX_LOSS_EMA)

_F1 = float32[::1]
_F2 = float32[:, ::1]
_F3 = float32[:, :, ::1]
_I1 = int32[::1]
_I2 = int32[:, ::1]
_NB_U = np.uint32(N_BRANCHES)  # uint32 index arithmetic (head_rows' header)
_NS_U = np.uint32(N_STREAMS)
N_ROW_STATS = 3  # per branch row: TD, target E[Q(s', a*)], target minus online E[Q(s', a*)]
BOOTSTRAP_RULES = CHOICES["learner.bootstrap"]  # (header)
# Shared-memory staging of the fused C51 kernels (header). Shared-array sizes must be single constants.
SELECT_THREADS = 128  # select_q_rows' threads a block at most: 8 samples x 13 heads, or 26 x 4 compact (live 1)
# a* of a block's branch rows (4 a sample): 104 int32, the 416 B head_rows' staging (27,744 B) leaves of an eighth of
# an SM's shared memory less the driver's 1,024 B (28,160 B), so eight blocks still fit; 26 samples in a compact block
SELECT_ROWS = 104
SELECT_BLOCKS_PER_SM = 8  # its shared memory fits eight blocks (head_rows' budget); launch_bounds keeps registers too


def select_lanes(live: int) -> int:
    """Threads a sample in select_q_rows: one a head (13) with every branch live; with fewer, one a live head or
    branch row, whichever is more (the compact layout: 4 with the direction branch alone)."""
    return N_HEADS if live >= N_BRANCHES else max(live_heads(live), N_BRANCHES)


def select_samples(n_atoms: int, live: int) -> int:
    """Samples a select_q_rows block takes: what its staging holds (head_rows.stage_samples with every branch live;
    compact, a sample's live head rows, its live value rows and up to 4 target rows) and its threads allow."""
    if live >= N_BRANCHES:
        return stage_samples(n_atoms)
    stride = n_atoms | 1
    rows = max(live_heads(live), N_BRANCHES)
    return min(SELECT_THREADS // select_lanes(live), SELECT_ROWS // N_BRANCHES, STAGE_WORDS // (rows * stride),
               VALUE_WORDS // (live * stride))


def select_threads(samples: int, live: int = N_BRANCHES) -> int:
    """Threads of a select_q_rows block of `samples` samples: select_lanes(live) a sample, rounded up to whole warps
    (the GPU allocates the last warp whole; its spare threads share the staging loads and compute no row)."""
    return -(-samples * select_lanes(live) // 32) * 32


assert select_threads(STAGE_SAMPLES) == SELECT_THREADS and select_threads(select_samples(2, 1), 1) <= SELECT_THREADS
assert STAGE_SAMPLES * N_BRANCHES <= SELECT_ROWS


_SELECT_OPTIONS = {} if SIMULATOR else {
    "launch_bounds": (SELECT_THREADS, SELECT_BLOCKS_PER_SM),
    "shared_memory_carveout": "MaxShared",
}
LOSS_SAMPLES = 16  # project_loss_scatter: samples per block at most (their live branch rows: 64 of all four)
LOSS_ROWS = LOSS_SAMPLES * N_BRANCHES  # branch rows per block at most with every branch live
LOSS_THREADS_PER_ROW = 4  # its threads per row: all stage and scatter, one per row projects


def loss_stage_words(live: int) -> int:
    """Floats of each of project_loss_scatter's three staged arrays with `live` branches: LOSS_SAMPLES samples' live
    rows at Z = 51 (13.3 KB with all four, 3.3 KB with the direction branch alone, which keeps a block to 16
    samples and so 512 blocks at batch 8,192, not 128 blocks of 64)."""
    return LOSS_SAMPLES * live * 52


assert N_BRANCHES * (MAX_ATOMS | 1) <= loss_stage_words(N_BRANCHES) and MAX_ATOMS | 1 <= loss_stage_words(1), (
    "project_loss_scatter must stage a sample at any staged Z")


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


@cuda.jit(device=True)
def _taken_head(actions, i, b):
    """(first head of branch b, the taken bin of sample i in it)."""
    off, size = branch_span(b)
    return off, min(max(actions[i, b], 0), size - 1)


def _select_kernel(live: int) -> Any:
    """select_q_rows with the first `live` branches' heads formed from the head rows (compile-time constants)."""
    compact = live < N_BRANCHES
    stage_heads = combined_heads_stager(live, compact=compact)
    first_dead = live_heads(live)
    n_dead = N_HEADS - first_dead
    lanes = select_lanes(live)
    row_heads = first_dead if compact else N_HEADS  # staged head rows a sample

    def select_q_rows(head, head_tgt, support_online, support_target, actions, rewards, discounts, branch_w, shared,
                      spb, q, entropy, util, next_head, next_stats, rew_r, disc_r, weights, stats, dead):
        """The online E[Q] statistics and the double DQN rows of the block's samples (launch shape in the header): the
        online head GEMM's output head [2B, head_width(Z)] holds s in rows 0..B-1 and s' in rows B..2B-1, head_tgt
        [B, head_width(Z)] the target's s'; every logit read is formed from them (heads.combined_logit).
        Thread (slot, h) owns head h of sample i = first + slot; each round stages rows of the block's samples, then
        reads them from shared memory with the code the unfused kernels ran on global rows:
        1. s: `row_stats` and `atom_pass` on support_online[h]: q[i, h] = E[Q], entropy[i, h], util[i, h] = the
           fraction of atoms with p > UTIL_THRESHOLD (`expected_q_stats_kernel`'s arithmetic).
        2. s': q[B + i, h] = E[Q].
        3. the target on s', lanes h < 4 (branch b = h, row r = i * 4 + b): a* = next_head[r] = argmax of the
           online E[Q](s') over the bins of the direction branch when shared = 1, else of branch b (ties to the lowest
           bin), to shared memory; barrier; the distinct target rows of the a* staged (1 or 4 per sample); a_t = the
           taken head of branch b; next_stats[r] = (max, sum of exp(x - max)) of the target logits(s')[a*]
           (project_loss_scatter forms p_next = exp(x - max) / sum from them); rew_r[r] = reward (the n-step return);
           disc_r[r] = discounts[i] (the gather's gamma**k * (1 - done)); weights[r] = branch_w[b] * effect / B;
           stats[r] = (TD, E_target[Q(s', a*)], E_target - E_online at (s', a*)), TD = reward + disc * E_target -
           E[Q(s, a_t)].
        With live < 4 (agent/network.py's live branches) only the live branches' streams are staged and combined,
        and the other heads' q (s and s'), entropy and util are dead[h] = (E[Q], entropy, util) of a zero logit row
        on their support (`zero_row_stats`, the same code on the same zeros: the same bits). The block is then
        compact (select_samples): thread (slot, h) owns live head h and branch row h (select_lanes a sample), the
        staged rows are the live heads' alone, and the block's threads copy the dead heads' statistics in turn; each
        row's arithmetic is the one above, so the outputs are the same bits with 26 samples a block instead of 8.
        """
        stage = cuda.shared.array(STAGE_WORDS, float32)
        values = cuda.shared.array(VALUE_WORDS, float32)
        next_sh = cuda.shared.array(SELECT_ROWS, int32)  # a* of the block's branch rows
        n_atoms = (head.shape[1] - N_AUX) // N_STREAMS
        n_samples = actions.shape[0]
        stride = n_atoms | 1
        threads = cuda.blockDim.x
        tid = cuda.threadIdx.x
        first = cuda.blockIdx.x * spb
        count = min(spb, n_samples - first)
        slot = tid // lanes
        h = tid - slot * lanes
        i = first + slot
        active = slot < count
        base = (slot * row_heads + h) * stride  # this thread's staged row (head h < first_dead)

        stage_heads(head, first, count, stage, values, stride, tid, threads, n_atoms)
        cuda.syncthreads()
        if compact:  # the dead heads' statistics, (sample, dead head) pairs in turn
            k = tid
            while k < count * n_dead:
                sk = k // n_dead
                hk = first_dead + k - sk * n_dead
                q[first + sk, hk] = dead[hk, 0]
                entropy[first + sk, hk] = dead[hk, 1]
                util[first + sk, hk] = dead[hk, 2]
                q[n_samples + first + sk, hk] = dead[hk, 0]
                k += threads
        elif active and h >= first_dead:
            q[i, h] = dead[h, 0]
            entropy[i, h] = dead[h, 1]
            util[i, h] = dead[h, 2]
        if active and h < first_dead:
            v_min = support_online[h, 0]
            delta_z = support_online[h, 2]
            m, s, tz, tlm = row_stats(stage, base, n_atoms, v_min, delta_z)
            mean = tz / s
            q[i, h] = mean
            entropy[i, h] = math.log(s) - tlm / s
            used, _spread = atom_pass(stage, base, n_atoms, m, s, mean, v_min, delta_z)
            util[i, h] = float32(used) / float32(n_atoms)
        cuda.syncthreads()

        stage_heads(head, n_samples + first, count, stage, values, stride, tid, threads, n_atoms)
        cuda.syncthreads()
        if not compact and active and h >= first_dead:
            q[n_samples + i, h] = dead[h, 0]
        elif active and h < first_dead:
            _m, s, tz, _tlm = row_stats(stage, base, n_atoms, support_online[h, 0], support_online[h, 2])
            q[n_samples + i, h] = tz / s
        cuda.syncthreads()

        branch_row = active and h < N_BRANCHES
        if branch_row:
            next_sh[slot * N_BRANCHES + h] = greedy_next(q, n_samples, i, h, shared)
        cuda.syncthreads()
        # the target rows of the a* only, coalesced within each row: per sample one (every branch bootstraps from the
        # direction branch's a* when shared) or four (row slot * 4 + b)
        per = u32(1 if shared != 0 else N_BRANCHES)
        rows = u32(count * per)
        nz = u32(n_atoms)
        d_row, d_j, row, j = walk_start(tid, threads, nz)
        while row < rows:
            sample = u32(row // per)
            a_star = next_sh[u32(sample * _NB_U + row - sample * per)]
            stage[u32(row * u32(stride) + j)] = combined_logit(head_tgt, first + sample, a_star, j, nz)
            row, j = carry(row, j, d_row, d_j, nz)
        cuda.syncthreads()
        if not branch_row:
            return
        b = h
        r = i * N_BRANCHES + b
        off, taken = _taken_head(actions, i, b)
        a_t = off + taken
        a_n = next_sh[slot * N_BRANCHES + b]
        next_head[r] = a_n
        row = u32(u32(slot * per + min(b, per - 1)) * u32(stride))
        end = u32(row + nz)
        mx = stage[row]
        at = u32(row + u32(1))
        while at < end:  # uint32 counters (distributional.row_stats)
            mx = max(mx, stage[at])
            at = u32(at + u32(1))
        total = float32(0.0)
        at = row
        while at < end:
            total += math.exp(stage[at] - mx)
            at = u32(at + u32(1))
        v_min = support_target[a_n, 0]
        dz = support_target[a_n, 2]
        e_tgt = float32(0.0)
        z = u32(0)
        while z < nz:
            p = math.exp(stage[u32(row + z)] - mx) / total
            e_tgt += p * (v_min + float32(z) * dz)
            z = u32(z + u32(1))
        next_stats[r, 0] = mx
        next_stats[r, 1] = total
        reward = rewards[i]
        discount = discounts[i]
        rew_r[r] = reward
        disc_r[r] = discount
        weights[r] = branch_w[b] * _effect(actions, i, b) / float32(n_samples)
        stats[r, 0] = reward + discount * e_tgt - q[i, a_t]
        stats[r, 1] = e_tgt
        stats[r, 2] = e_tgt - q[n_samples + i, a_n]

    suffix = "" if live == N_BRANCHES else f"_live{live}"
    select_q_rows.__name__ = select_q_rows.__qualname__ = f"select_q_rows{suffix}"
    sig = (_F2, _F2, _F2, _F2, _I2, _F1, _F1, _F1, int32, int32, _F2, _F2, _F2, _I1, _F2, _F1, _F1, _F1, _F2, _F2)
    return register(sig)(cuda.jit(**_SELECT_OPTIONS)(select_q_rows))


SELECT_KERNELS = {live: _select_kernel(live) for live in (N_BRANCHES, 1)}
"""select_q_rows for every branch, and for the direction branch alone (as LOSS_KERNELS)."""
select_q_rows = SELECT_KERNELS[N_BRANCHES]


_ZERO_ROW = MAX_ATOMS | 1  # zero_row_stats' row (a module constant: the local array's size must be one)


@register((_F2, _F2, int32, int32))
@cuda.jit
def zero_row_stats(support_online, dead, n_atoms, first_dead):
    """dead[h] = (E[Q], entropy, util) of a logit row of zeros on support_online[h] for the heads h >= first_dead
    (one thread each): select_q_rows' row_stats and atom_pass on zeros, for the heads past a network's live
    branches, whose logits are 0 (agent/network.py)."""
    h = first_dead + cuda.grid(1)
    if h >= N_HEADS:
        return
    zeros = cuda.local.array(_ZERO_ROW, float32)
    for k in range(n_atoms):
        zeros[k] = float32(0.0)
    v_min = support_online[h, 0]
    delta_z = support_online[h, 2]
    m, s, tz, tlm = row_stats(zeros, 0, n_atoms, v_min, delta_z)
    mean = tz / s
    dead[h, 0] = mean
    dead[h, 1] = math.log(s) - tlm / s
    used, _spread = atom_pass(zeros, 0, n_atoms, m, s, mean, v_min, delta_z)
    dead[h, 2] = float32(used) / float32(n_atoms)


def _loss_kernel(live: int) -> Any:
    """project_loss_scatter over the rows and streams of the first `live` branches (compile-time constants)."""
    n_live = np.uint32(live)
    n_streams = np.uint32(live_streams(live))
    n_dead = N_BRANCHES - live
    words = loss_stage_words(live)

    def project_loss_scatter(head, head_tgt, next_head, next_stats, rew_r, disc_r, actions, support_online,
                             support_target, weights, loss, dhead):
        """The C51 projection, the cross-entropy with its gradient, and its scatter through the dueling combine's
        backward into the stream columns of dhead [B, head_width(Z)] for the block's live branch rows (the rows of
        branches b < live of its samples, blockDim / LOSS_THREADS_PER_ROW of them at most, whole samples; launch
        shape in the header), in three steps:
        1. every thread, coalesced: stage p_next[r] = exp(x - max) / sum over the target logits(s')[a*] (next_head,
           next_stats: the softmax select_q_rows took) and the online logits(s) of the row's taken head a_t, each
           formed from the head GEMM outputs head [2B, head_width(Z)] and head_tgt [B, head_width(Z)]
           (heads.combined_logit).
        2. one row per thread (the first ones): `project_row` of rew_r + disc_r * z(a*) (support_target[a*]) onto the
           atoms of support_online[a_t] into a staged scratch m, then loss[r] = `cross_entropy_row` of the staged
           logits against m, its gradient weights[r] * (sum(m) softmax - m) written over m: c51_project's and
           c51_loss's code.
        3. every thread, coalesced: the block's samples' stream columns of dhead, every stream and atom: with g the
           row gradient at the taken heads and 0 on the branches' other heads (the scatter), the value stream of branch
           b takes total = sum of g over b's heads in head order, the advantage stream of head a g[a] - total / size
           (dueling_combine_bwd's arithmetic); the forecast column is left alone.
        With live < 4 (agent/network.py's live branches: the other branches' rows have weight 0) their rows' loss is
        written 0 (the loss signals add weight x loss and count only rows of positive weight: the same sums) and their
        streams of dhead are not written (the caller keeps them 0)."""
        p_st = cuda.shared.array(words, float32)
        x_st = cuda.shared.array(words, float32)
        m_st = cuda.shared.array(words, float32)
        n_atoms = (head.shape[1] - N_AUX) // N_STREAMS
        stride = n_atoms | 1
        threads = cuda.blockDim.x
        tid = cuda.threadIdx.x
        per_block = threads // LOSS_THREADS_PER_ROW
        q0 = cuda.blockIdx.x * per_block  # the block's first live row (live row q: branch row q // live * 4 + q % live)
        count = min(per_block, (next_head.shape[0] // N_BRANCHES) * live - q0)
        i0 = u32(q0 // live)  # its first sample

        nz = u32(n_atoms)  # uint32 walks (head_rows' header)
        stride_u = u32(stride)
        d_row, d_j, row, j = walk_start(tid, threads, nz)
        while row < count:
            q = u32(q0 + row)
            i = u32(q // n_live)
            b = u32(q - i * n_live)
            r = u32(i * _NB_U + b)
            off, taken = _taken_head(actions, i, b)
            xt = combined_logit(head_tgt, i, next_head[r], j, nz)
            at = u32(row * stride_u + j)
            x_st[at] = combined_logit(head, i, off + taken, j, nz)
            p_st[at] = math.exp(xt - next_stats[r, 0]) / next_stats[r, 1]
            row, j = carry(row, j, d_row, d_j, nz)
        cuda.syncthreads()

        if tid < count:
            q = q0 + tid
            i = q // live
            b = q - i * live
            r = i * N_BRANCHES + b
            off, taken = _taken_head(actions, i, b)
            a_n = next_head[r]
            base = tid * stride
            project_row(p_st, base, rew_r[r], disc_r[r], support_target[a_n, 0], support_target[a_n, 2],
                        support_online[off + taken, 0], support_online[off + taken, 2], m_st, base, n_atoms)
            loss[r] = cross_entropy_row(x_st, base, m_st, base, weights[r], m_st, base, n_atoms)
        if n_dead > 0:
            k = tid
            while k < (count // live) * n_dead:  # the dead rows of the block's samples
                s = k // n_dead
                loss[(i0 + s) * N_BRANCHES + live + k - s * n_dead] = float32(0.0)
                k += threads
        cuda.syncthreads()

        rows = u32(u32(count // live) * n_streams)
        _dr, _dj, row, j = walk_start(tid, threads, nz)
        while row < rows:
            sample = u32(row // n_streams)
            head_stream = u32(row - sample * n_streams)
            b = u32(stream_branch(head_stream))
            off, size = branch_span(b)
            taken = off + _taken_head(actions, u32(i0 + sample), b)[1]
            g_taken = m_st[u32(u32(sample * n_live + b) * stride_u + j)]
            total = float32(0.0)
            for k in range(size):
                total += g_taken if off + k == taken else float32(0.0)
            col = u32(head_stream * nz + j)
            if head_stream == u32(off + b):  # the branch's value stream (heads.value_stream)
                dhead[u32(i0 + sample), col] = total
            else:
                g = g_taken if u32(head_stream - b - u32(1)) == taken else float32(0.0)
                dhead[u32(i0 + sample), col] = g - total / float32(size)
            row, j = carry(row, j, d_row, d_j, nz)

    suffix = "" if live == N_BRANCHES else f"_live{live}"
    project_loss_scatter.__name__ = project_loss_scatter.__qualname__ = f"project_loss_scatter{suffix}"
    sig = (_F2, _F2, _I1, _F2, _F1, _F1, _I2, _F2, _F2, _F1, _F1, _F2)
    return register(sig)(cuda.jit(project_loss_scatter))


LOSS_KERNELS = {live: _loss_kernel(live) for live in (N_BRANCHES, 1)}
"""project_loss_scatter for every branch, and for the direction branch alone (the default network's live branches;
any other live count runs the whole kernel, its dead rows weighing 0)."""
project_loss_scatter = LOSS_KERNELS[N_BRANCHES]


@register((_F2, _I1, _F1, float32, _F2, _F1, float64[::1], int32, int32))
@cuda.jit
def aux_forecast_loss(head, rows, aux_target, weight, dhead, isv, epoch, col, n_samples):
    """The auxiliary regression of the first n_samples rows (one block): y = aux_target[rows[i]], f = head[i,
    col]; where y is finite dhead[i, col] = weight * (f - y) / n_samples, else 0; epoch LOSS_AUX += the mean
    of (f - y)**2 / 2 over the rows with a target and ISV[AUX_LOSS_EMA] += 0.01 (mean - ISV) (nothing when none
    has, or the mean is not finite: a step the non-finite guard skips)."""
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
        mean = acc[0, 0] / acc[1, 0]
        epoch[_E_AUX] += mean
        ema(isv, _AUX_LOSS, float32(mean), LOSS_ALPHA)


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
        self.next_head = device_empty(r, np.int32)  # a*, the head of the row's next-state value
        self.next_stats = device_empty((r, 2), np.float32)  # (max, sum exp(x - max)) of the target logits(s')[a*]
        self.rewards = device_empty(r, np.float32)
        self.discounts = device_empty(r, np.float32)
        self.weights = device_empty(r, np.float32)
        self.loss = device_empty(r, np.float32)
        self.stats = device_empty((r, N_ROW_STATS), np.float32)
        self.dead = device_empty((N_HEADS, 3), np.float32)  # zero_row_stats' table (live branches < 4)


def loss_rows(n_atoms: int, live: int = N_BRANCHES) -> int:
    """Live branch rows per block of project_loss_scatter: as many whole samples' live rows as its staging holds."""
    return min(LOSS_SAMPLES * live, loss_stage_words(live) // (n_atoms | 1) // live * live)


def _check_atoms(n_atoms: int) -> None:
    if not 2 <= n_atoms <= MAX_ATOMS:
        raise ValueError(f"the learner's C51 rows need 2 <= n_atoms <= {MAX_ATOMS} (shared-memory staging), got "
                         f"{n_atoms}")


def select_rows(head: Any, head_tgt: Any, support_online: Any, support_target: Any, actions: Any, rewards: Any,
                discounts: Any, branch_w: Any, q: Any, entropy: Any, util: Any, rows: BranchRows, *, stream: Any,
                bootstrap: str = "direction", live: int = N_BRANCHES) -> None:
    """The online E[Q] statistics and the double DQN rows (kernel select_q_rows): head [2B, head_width(Z)], the
    online network's head GEMM output on s then s', head_tgt [B, head_width(Z)] the target's on s' (the logits are
    their dueling combine), supports [13, 3] -> q [2B, 13] (s and s'), entropy and util [B, 13] (s), and `rows`;
    `bootstrap` as in the header. `live`: the network's live branches; with 1 only the direction heads' rows are
    formed, the others' statistics come from zero_row_stats (SELECT_KERNELS)."""
    b, z = rows.batch, rows.n_atoms
    _check_atoms(z)
    check_array("head", head, "[2B, head_width(Z)]", (2 * b, head_width(z)))
    check_array("head_tgt", head_tgt, "[B, head_width(Z)]", (b, head_width(z)))
    check_array("support_online", support_online, "[13, 3]", (N_HEADS, 3))
    check_array("support_target", support_target, "[13, 3]", (N_HEADS, 3))
    check_array("actions", actions, "[B, 4]", (b, N_BRANCHES), np.int32)
    check_array("rewards", rewards, "[B]", (b,))
    check_array("discounts", discounts, "[B]", (b,))
    check_array("branch_w", branch_w, "[4]", (N_BRANCHES,))
    check_array("q", q, "[2B, 13]", (2 * b, N_HEADS))
    check_array("entropy", entropy, "[B, 13]", (b, N_HEADS))
    check_array("util", util, "[B, 13]", (b, N_HEADS))
    if bootstrap not in BOOTSTRAP_RULES:
        raise ValueError(f"learner.bootstrap must be one of {BOOTSTRAP_RULES}, got {bootstrap!r}")
    if not 1 <= live <= N_BRANCHES:
        raise ValueError(f"select_rows: live branches must be in 1..{N_BRANCHES}, got {live}")
    live = live if live in SELECT_KERNELS else N_BRANCHES
    if live < N_BRANCHES:
        first_dead = live_heads(live)
        launch_rows(zero_row_stats, 1, N_HEADS - first_dead, support_online, rows.dead, i32(z), i32(first_dead),
                    stream=stream)
    spb = min(select_samples(z, live), b)
    launch_rows(SELECT_KERNELS[live], -(-b // spb), select_threads(spb, live), head, head_tgt, support_online,
                support_target, actions, rewards, discounts, branch_w, i32(bootstrap == "direction"), i32(spb), q,
                entropy, util, rows.next_head, rows.next_stats, rows.rewards, rows.discounts, rows.weights, rows.stats,
                rows.dead, stream=stream)


def branch_loss(head: Any, head_tgt: Any, rows: BranchRows, actions: Any, support_online: Any,
                support_target: Any, dhead: Any, *, stream: Any, live: int = N_BRANCHES) -> None:
    """rows.loss [4B] and the stream columns of dhead [B, head_width(Z)] (every element but the forecast column's:
    the C51 loss's gradient through the dueling combine) from `select_rows`' rows, their weights as they stand
    (after the importance weights, prioritised), the online head GEMM output [2B, head_width(Z)] (its s rows) and
    the target's [B, head_width(Z)], whose dueling combines are the logits (kernel project_loss_scatter). `live`: the
    network's live branches; with 1 the direction branch's rows and streams alone (LOSS_KERNELS), the others' loss
    0 and their dhead streams not written."""
    b, z = rows.batch, rows.n_atoms
    _check_atoms(z)
    check_array("head", head, "[2B, head_width(Z)]", (2 * b, head_width(z)))
    check_array("head_tgt", head_tgt, "[B, head_width(Z)]", (b, head_width(z)))
    check_array("actions", actions, "[B, 4]", (b, N_BRANCHES), np.int32)
    check_array("support_online", support_online, "[13, 3]", (N_HEADS, 3))
    check_array("support_target", support_target, "[13, 3]", (N_HEADS, 3))
    check_array("dhead", dhead, "[B, head_width(Z)]", (b, head_width(z)))
    if not 1 <= live <= N_BRANCHES:
        raise ValueError(f"branch_loss: live branches must be in 1..{N_BRANCHES}, got {live}")
    live = live if live in LOSS_KERNELS else N_BRANCHES
    r = live * b
    per_block = min(loss_rows(z, live), r)
    launch_rows(LOSS_KERNELS[live], -(-r // per_block), per_block * LOSS_THREADS_PER_ROW, head, head_tgt,
                rows.next_head, rows.next_stats, rows.rewards, rows.discounts, actions, support_online, support_target,
                rows.weights, rows.loss, dhead, stream=stream)


def aux_loss(head: Any, rows: Any, aux_target: Any, weight: float, dhead: Any, isv: Any, epoch: Any, *,
             stream: Any) -> None:
    """The auxiliary forecast's gradient into dhead's forecast column and its loss into ISV[AUX_LOSS_EMA] and the
    epoch sums (kernel aux_forecast_loss): head [2B or B, head_width(Z)] (the online forward; its first B rows are
    the samples' s), rows int32 [>= B] (their market rows), aux_target float32 [n_market], dhead [B,
    head_width(Z)], isv float32 [ISV_TOTAL_DIM]."""
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
    _check_isv(isv)
    check_epoch(epoch)
    if not weight >= 0.0:
        raise ValueError(f"learner.aux_weight must be >= 0, got {weight}")
    launch_rows(aux_forecast_loss, 1, strided_threads(NORM_BLOCK), head, rows, aux_target, np.float32(weight),
                dhead, isv, epoch, i32(aux_column(z)), i32(b), stream=stream)


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
