"""Action selection from the C51 heads: Thompson sampling and Boltzmann in training, argmax E[Q] in evaluation.

Launch shape: one block per group of up to head_rows.STAGE_SAMPLES (8) samples, `lanes` threads per sample
(`launch_rows`; default LANES = 16, so 128 threads for Z <= 51). One thread per sample left a collect
batch of B = 1,024 on 16 blocks of the 132 SMs, each thread running a serial chain of 13 softmax passes
and 4 inverse-CDF passes; here a thread owns one head, so the chain is one or two passes over Z atoms:
1. stage: the block copies its samples' logits (one contiguous run of 8 * 13 * Z floats) into shared
   memory with coalesced loads, four in flight per thread, each head's row at an odd stride (Z | 1) so
   the 13 lanes reading one atom each hit different banks; lane 13 % lanes (lane 13: no head) draws the
   sample's 8 uniforms (training only) on a register copy of its xoroshiro state into shared memory.
   Barrier.
   From the head GEMM's output rows instead ([B, head_width(Z)], `action_select_heads_kernel`: what collect and
   evaluation pass), the block copies its samples' 17 stream rows (coalesced, as the learner's fused rows do:
   head_rows.stage_combined_heads), then forms each head's row V_b + (A_a - the branch's mean A) in shared memory
   with the combine kernel's float32 operations, so the staged rows have the bits the combine kernel would have
   written, and the [B, 13, Z] logits never go through global memory (one launch and a write and read of them
   fewer per step).
2. heads: lane h < 13 runs `row_stats` (the online softmax of `distributional`, the same code as
   `expected_q`, so E[Q] has the same bits) over head h's staged row: E[Q] to shared memory; a direction
   lane (h < 4) in training then draws its Thompson atom (an inverse-CDF pass over the staged row).
   With fewer than 13 lanes a lane serves heads l, l + lanes, ... Barrier.
3. choice: lane 0 of each sample chooses all four branches from shared memory and writes the action
   and the conviction.
Shared memory is static (numba sizes it at compile time): head_rows.STAGE_WORDS floats of staged logits, so a
block holds min(8, STAGE_WORDS // (13 * (Z | 1))) samples (head_rows.stage_samples), and Z is at most MAX_ATOMS
(407). No warp shuffles (the simulator has none) and no atomics: two block barriers, one thread per head and one per
sample's draws, so the results have the same bits for any `lanes` (the tests run 1 under the simulator,
which pays per thread). Measured times: this kernel inside the collect step at N = 16,384 in
tools/results/bench_collect_h200.md, the shapes it replaced in tools/results/select_c51_before_h200.md;
`python3 tools/bench_select.py --out tools/results/bench_select_h200` compares the two on a GPU.

Policy (the seed's Plan C), for sample i with E[Q] q_a = sum_j softmax(logits[i, a])_j z_j:
- explore = 1 (collection): direction by Thompson sampling: one atom value drawn from each direction's
  distribution on its own support; the largest draw wins, and directions whose draws tie exactly (they
  often do: directions share supports, and a peaked head draws one atom) share the win uniformly at
  random: with k tied, the tie-break uniform u picks the floor(u * k)-th of them in direction order.
  (Ties to the lowest direction made the seed's T6 tile pick Short 0.56, Hold 0.22, Long 0.22, Flat
  ~1e-12, where the fair rule gives 1/3, 1/6, 1/3, 1/6.) Magnitude, order type and urgency by
  Boltzmann over their three E[Q] with tau = max(tau_mult * (max q - min q), TAU_FLOOR): tied to the
  branch's Q range, so P(best) is the same at every Q scale (1 / (1 + 2/e) for q = [0, 0, 1] at
  tau_mult = 1, the seed's rule).
  The spread (env.explore_spread, kappa in [0, 1]) narrows the Thompson draw towards the mean: a
  direction draws E[Q_d] + kappa * (z_j - E[Q_d]) for its sampled atom z_j. kappa = 1 is plain Thompson
  sampling (the draw is the atom itself, bit for bit); kappa = 0 is the greedy direction with ties
  shared fairly. Why: a C51 head's width is the market's noise (about one risk unit per bar), not doubt
  about the mean, so with E[Q] gaps of hundredths plain Thompson plays the four directions almost
  uniformly, every epoch; kappa scales that noise down while keeping the draw's shape. tau_mult
  (env.explore_tau) does the same for the other three branches. Their defaults, and the measurements that
  chose them (tools/results/learner_ablation_h200.md), are in fox_numba/config.py (table: CONFIG.md).
- explore = 0 (evaluation): argmax E[Q] in every branch, ties to the lowest bin; the RNG is not touched.
  A hold margin h >= 0 (evaluation.hold_margin) then keeps the position unless the best direction's value beats
  Hold's by at least h: a best direction other than Hold whose value - Hold's value < h becomes Hold, with
  conviction 0. h = 0 is the plain argmax (bit for bit). Why: the direction values' gaps are a fraction of a
  round trip's cost and noisy, so the plain argmax turns on every small swing of the estimate; the probe and the
  oracle trade with the same kind of hysteresis (enter past the cost, hold while the sign agrees).
  The seed kept Boltzmann for magnitude, order type and urgency in evaluation (its T8); we keep argmax.
  Evaluation scores a checkpoint (validation Sharpe picks the best one and feeds the kill criteria):
  Boltzmann at tau = the Q range plays the best bin only 58% of the time at any Q scale, so the score
  would measure exploration noise rather than the learned policy, and it would change with the RNG
  states and the chunking of the validation days. Argmax is the greedy policy the C51 targets assume,
  and it makes evaluation a deterministic function of the parameters.
- Direction Hold or Flat records magnitude 0.
- With the IQN head (network.iqn_quantiles > 0, `iqn=` [B, 2, 4]: kernels/iqn.py `act_values`), each
  direction acts on its joint value with the IQN head, the seed's "Training: argmax of (sample_C51 + sample_IQN)
  per direction (Thompson); Eval: argmax of (E_C51 + E_IQN) per direction": in evaluation the argmax of
  e_d = (E_C51[d] + E_IQN[d]) / 2; in collection the Thompson draw is (C51 draw + IQN draw) / 2, the IQN draw
  E_IQN[d] + kappa * (Z(tau_d)[d] - E_IQN[d]) for the quantile at the level tau_d drawn for that direction
  (kappa = env.explore_spread, as the C51 draw's). The mean instead of the seed's sum picks the same direction
  and keeps the conviction in Q units: the conviction reads e_d ("Conviction stays E[Q]-based": the joint
  E[Q], never a draw). Magnitude, order type and urgency stay on the C51 E[Q].
- With the direction mean head (network.mean_head, `mean=` [B, 1, 4]: agent/mean_head.py), each direction acts on
  its mean value m_d in place of E_C51[d]: evaluation takes argmax_d m_d (ties to the lowest), collection's Thompson
  draw is m_d + kappa * (z_j - E_C51[d]), the C51 draw moved to the mean head's mean (the draw's randomness, its
  uniforms and their order are the C51 draw's), and the conviction reads m. Magnitude, order type and urgency stay
  on the C51 E[Q].
Random draws come from `states[i]` (numba xoroshiro128+, bit-exact between simulator and GPU) in a fixed
order, whatever the ties and whether or not Hold/Flat later overrides the magnitude: the 4 direction
draws (DRAW_DIRECTION + d), the tie-break (DRAW_TIE), then magnitude, order type, urgency: DRAWS = 8
uniforms per sample and step. The draws are numba.cuda.random's device functions, imported by name
from device/rng.py (inside a simulated kernel `cuda` has no `random` attribute; rng.py silences the
simulator's uint64 wrap-around warning, the generator's own arithmetic). (The atom a draw selects comes from float32
cumulative sums, whose last bits differ between the GPU, which fuses multiply-adds, and the simulator.)
Outputs: actions[i] = (direction, magnitude, order type, urgency) as int32, and conviction[i] = E[Q] of
the chosen direction minus the best E[Q] among the other three (>= 0 in evaluation).
The explore flag is a kernel argument: collection and evaluation are separate captured graphs.
Fixed bins (env.fixed_bins; `fixed=` of select_actions): a branch after direction given a bin f >= 0 takes f in
collection and evaluation alike, its E[Q] unread; its uniform is still drawn, so the other branches' draws and the
RNG states are those of the free policy. Hold and Flat still record magnitude 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from numba import cuda, float32, int32
from numba.cuda.random import xoroshiro128p_dtype, xoroshiro128p_type

from fox_numba.actions import (
    BRANCHES,
    DIR_OFFSET,
    FLAT,
    HOLD,
    MAG_OFFSET,
    N_BRANCHES,
    N_DIRECTIONS,
    N_HEADS,
    ORDER_OFFSET,
    URGENCY_OFFSET,
)
from fox_numba.device.launch import check_array, launch_rows
from fox_numba.device.registry import register
from fox_numba.device.rng import XOROSHIRO_DTYPE, xoroshiro128p_uniform_float32
from fox_numba.device.runtime import SIMULATOR, u32
from fox_numba.kernels.distributional import F32_3D, row_stats
from fox_numba.kernels.head_rows import (
    MAX_ATOMS,
    STAGE_SAMPLES,
    STAGE_WORDS,
    VALUE_WORDS,
    carry,
    combined_heads_stager,
    stage_samples,
    staged_row,
)
from fox_numba.kernels.heads import N_AUX, N_STREAMS, head_width

# Below this Q range a 3-bin branch's Boltzmann tends to uniform instead of stretching differences that
# are noise to the full P(best) (E[Q] lives on supports of width ~1).
TAU_FLOOR = np.float32(1e-4)
_NEG_INF = np.float32(-np.inf)
IQN_MIX = np.float32(0.5)  # a direction's joint value with the IQN head: the mean of the C51 and IQN values
# What the directions act on (the kernel's `mode`): C51 alone, the joint values with the IQN head, the mean head.
MODE_C51, MODE_IQN, MODE_MEAN = 0, 1, 2
FREE_BINS = (-1,) * (N_BRANCHES - 1)  # magnitude, order type and urgency all chosen by the policy

LANES = 16  # threads per sample by default: one per head (13); lane 13 draws, 14 and 15 idle in phase 2

# The uniforms of one sample and step, in draw order.
DRAW_DIRECTION = 0  # + d for direction d (4 draws)
DRAW_TIE = N_DIRECTIONS  # the Thompson tie-break
DRAW_BRANCH = N_DIRECTIONS + 1  # + (k - 1) for branch k = 1 (magnitude), 2 (order type), 3 (urgency)
DRAWS = DRAW_BRANCH + N_BRANCHES - 1
# Shared-array sizes must be single constants at compile time (a product of two is typed as a runtime int).
_Q_WORDS = STAGE_SAMPLES * N_HEADS
_DRAW_WORDS = STAGE_SAMPLES * N_DIRECTIONS
_U_WORDS = STAGE_SAMPLES * DRAWS
_F2 = float32[:, ::1]

# action_select_heads_kernel's residency: its q_sh lives in the value rows it no longer needs once the combine is done
# (phase 2 first writes q_sh after the barrier that follows the uniform draws), which brings its shared memory to
# 28,128 B + the driver's 1,024 a block, so eight blocks of 128 threads fit an sm_90 SM (233,472 B) instead of seven:
# a collect batch of 16,384 is two waves of 1,056 blocks, not three of 924. launch_bounds keep the registers to it.
HEADS_BLOCKS_PER_SM = 8
_HEADS_OPTIONS = {} if SIMULATOR else {
    "launch_bounds": (STAGE_SAMPLES * LANES, HEADS_BLOCKS_PER_SM),
    "shared_memory_carveout": "MaxShared",
}
assert _Q_WORDS <= VALUE_WORDS

# Phase 3 hard-codes three bins for every branch after direction: refuse an action space it cannot serve.
assert all(b.size == 3 for b in BRANCHES[1:]), "action_select: _pick3 expects 3-bin non-direction branches"
assert N_HEADS < LANES and STAGE_SAMPLES * LANES <= 1024


@cuda.jit(device=True)
def _divmod(a, n):
    """(a // n, a % n) of uint32 a and n, in uint32."""
    q = u32(a // n)
    return q, u32(a - q * n)


@cuda.jit(device=True)
def _sample_atom(x, base, n_atoms, m, s, u):
    """Index of the atom of softmax(x[base : base + n_atoms]) at uniform u: first j with cumsum_j > u * S.

    M and S come from `row_stats`; if rounding leaves the sum short of u * S the last atom with nonzero
    weight is returned, never a weightless one.
    """
    target = u * s
    c = float32(0.0)
    pick = 0
    for j in range(n_atoms):
        w = math.exp(x[base + j] - m)
        c += w
        if w > float32(0.0):
            pick = j
        if c > target:
            break
    return pick


@cuda.jit(device=True)
def _pick3(q0, q1, q2, u, explore, tau_mult):
    """Bin of a 3-bin branch with E[Q] q0, q1, q2: Boltzmann at tau = max(tau_mult * Q range, TAU_FLOOR)
    with the uniform u, or argmax (ties to the lowest bin) when not exploring."""
    if explore == 0:
        if q0 >= q1 and q0 >= q2:
            return 0
        return 1 if q1 >= q2 else 2
    hi = max(max(q0, q1), q2)
    tau = max(tau_mult * (hi - min(min(q0, q1), q2)), TAU_FLOOR)
    w0 = math.exp((q0 - hi) / tau)
    w1 = math.exp((q1 - hi) / tau)
    w2 = math.exp((q2 - hi) / tau)
    target = u * (w0 + w1 + w2)
    if target < w0:
        return 0
    return 1 if target < w0 + w1 else 2


@cuda.jit(device=True)
def _thompson_winner(draws, base, u):
    """The direction with the largest draw among draws[base : base + 4]; k exact ties share the win by
    the uniform u: the floor(u * k)-th tied direction in order (u = 1.0, which float32 rounding allows,
    takes the last)."""
    top = draws[base]
    for d in range(1, N_DIRECTIONS):
        top = max(top, draws[base + d])
    tied = 0
    for d in range(N_DIRECTIONS):
        if draws[base + d] == top:
            tied += 1
    pick = min(int32(u * float32(tied)), tied - 1)
    winner = 0
    for d in range(N_DIRECTIONS):
        if draws[base + d] == top:
            if pick == 0:
                winner = d
            pick -= 1
    return winner


@cuda.jit(device=True)
def _direction_value(q_c51, values, mode, i, d):
    """The value direction d of sample i acts on: its C51 E[Q] `q_c51`, joint with E_IQN, or the mean head's."""
    if mode == MODE_IQN:
        return IQN_MIX * (q_c51 + values[i, 0, d])
    if mode == MODE_MEAN:
        return values[i, 0, d]
    return q_c51


@cuda.jit(device=True)
def _stage_logits(logits, first, count, stage, stride, tid, threads, n_atoms):
    """stage[(s * 13 + h) * stride + j] = logits[first + s, h, j] for s < count: element k of the block's contiguous
    run is atom j of head row `row` (row * Z + j = k). Each pass loads four elements (k, k + T, k + 2T, k + 3T for T
    threads) before storing any, so four loads are in flight per thread; (row, j) advance by carries, with no
    division in the loop. The caller's barrier follows."""
    total = u32(count * N_HEADS * n_atoms)  # uint32 walk (head_rows' header)
    nz = u32(n_atoms)
    stride = u32(stride)
    row1, j1 = _divmod(u32(threads), nz)
    row2, j2 = _divmod(u32(2 * threads), nz)
    row3, j3 = _divmod(u32(3 * threads), nz)
    row4, j4 = _divmod(u32(4 * threads), nz)
    row, j = _divmod(u32(tid), nz)
    k = u32(tid)
    while k < total:
        r1, c1 = carry(row, j, row1, j1, nz)
        r2, c2 = carry(row, j, row2, j2, nz)
        r3, c3 = carry(row, j, row3, j3, nz)
        x0 = staged_row(logits, first, row, j)
        x1 = float32(0.0)
        x2 = float32(0.0)
        x3 = float32(0.0)
        if k + threads < total:
            x1 = staged_row(logits, first, r1, c1)
        if k + 2 * threads < total:
            x2 = staged_row(logits, first, r2, c2)
        if k + 3 * threads < total:
            x3 = staged_row(logits, first, r3, c3)
        stage[u32(row * stride + j)] = x0
        if k + threads < total:
            stage[u32(r1 * stride + c1)] = x1
        if k + 2 * threads < total:
            stage[u32(r2 * stride + c2)] = x2
        if k + 3 * threads < total:
            stage[u32(r3 * stride + c3)] = x3
        k = u32(k + u32(4 * threads))
        row, j = carry(row, j, row4, j4, nz)


def _staged_selector(n_heads: int) -> Any:
    """The kernels' common body over the first n_heads heads (a compile-time constant): all 13, or the direction
    heads alone when every other branch's bin is fixed (their heads then decide nothing)."""

    @cuda.jit(device=True)
    def select_staged(stage, q_sh, draw_sh, u_sh, support, states, explore, spread, tau_mult, actions, conviction,
                       lanes, values, mode, fix_magnitude, fix_order, fix_urgency, hold_margin, n_atoms, n_samples):
        """Phases 2 and 3 of the module header on the block's staged head rows (stage[(slot * 13 + h) * stride + j]),
        after the uniforms are drawn: the kernels' common body, so both give the same bits from the same rows."""
        stride = n_atoms | 1
        threads = cuda.blockDim.x
        tid = cuda.threadIdx.x
        spb = threads // lanes
        first = cuda.blockIdx.x * spb
        count = min(spb, n_samples - first)
        slot = tid // lanes
        lane = tid - slot * lanes
        i = first + slot
        active = slot < count
        if explore != 0 and active and lane == N_HEADS % lanes:
            # the 8 draws on a copy of the state in local memory (one global read and write, not eight)
            state = cuda.local.array(1, xoroshiro128p_dtype)
            state[0]["s0"] = states[i]["s0"]
            state[0]["s1"] = states[i]["s1"]
            for d in range(DRAWS):
                u_sh[slot * DRAWS + d] = xoroshiro128p_uniform_float32(state, 0)
            states[i]["s0"] = state[0]["s0"]
            states[i]["s1"] = state[0]["s1"]
        cuda.syncthreads()

        # 2. one head per lane (or several when lanes < 13): E[Q], and a direction's Thompson draw
        if active:
            for h in range(lane, n_heads, lanes):
                base = (slot * N_HEADS + h) * stride
                v_min = support[i, h, 0]
                delta_z = support[i, h, 2]
                m, s, tz, _tlm = row_stats(stage, base, n_atoms, v_min, delta_z)
                q_sh[slot * N_HEADS + h] = tz / s
                if explore != 0 and h < N_DIRECTIONS:
                    atom = _sample_atom(stage, base, n_atoms, m, s, u_sh[slot * DRAWS + DRAW_DIRECTION + h])
                    draw = v_min + float32(atom) * delta_z
                    if mode == MODE_MEAN:
                        draw = values[i, 0, h] + spread * (draw - tz / s)
                    elif spread != float32(1.0):
                        mean = tz / s
                        draw = mean + spread * (draw - mean)
                    if mode == MODE_IQN:
                        sample = values[i, 1, h]
                        if spread != float32(1.0):
                            e_iqn = values[i, 0, h]
                            sample = e_iqn + spread * (sample - e_iqn)
                        draw = IQN_MIX * (draw + sample)
                    draw_sh[slot * N_DIRECTIONS + h] = draw
        cuda.syncthreads()

        # 3. lane 0 chooses every branch
        if active and lane == 0:
            qb = slot * N_HEADS
            ub = slot * DRAWS
            best_q = _NEG_INF  # top two direction E[Q]: argmax for evaluation and the conviction
            second_q = _NEG_INF
            best_d = 0
            for d in range(N_DIRECTIONS):
                q = _direction_value(q_sh[qb + DIR_OFFSET + d], values, mode, i, d)
                if q > best_q:
                    second_q = best_q
                    best_q = q
                    best_d = d
                elif q > second_q:
                    second_q = q
            direction = best_d
            conv = best_q - second_q
            if explore == 0 and best_d != HOLD:
                if best_q - _direction_value(q_sh[qb + DIR_OFFSET + HOLD], values, mode, i, HOLD) < hold_margin:
                    direction = HOLD
                    conv = float32(0.0)
            if explore != 0:
                direction = _thompson_winner(draw_sh, slot * N_DIRECTIONS, u_sh[ub + DRAW_TIE])
                chosen = _direction_value(q_sh[qb + DIR_OFFSET + direction], values, mode, i, direction)
                conv = chosen - (second_q if direction == best_d else best_q)
            magnitude = fix_magnitude  # a free branch's bin from its heads (a pure function: a fixed one skips it)
            if fix_magnitude < 0:
                magnitude = _pick3(
                    q_sh[qb + MAG_OFFSET], q_sh[qb + MAG_OFFSET + 1], q_sh[qb + MAG_OFFSET + 2],
                    u_sh[ub + DRAW_BRANCH], explore, tau_mult,
                )  # fmt: skip
            order = fix_order
            if fix_order < 0:
                order = _pick3(
                    q_sh[qb + ORDER_OFFSET], q_sh[qb + ORDER_OFFSET + 1], q_sh[qb + ORDER_OFFSET + 2],
                    u_sh[ub + DRAW_BRANCH + 1], explore, tau_mult,
                )  # fmt: skip
            urgency = fix_urgency
            if fix_urgency < 0:
                urgency = _pick3(
                    q_sh[qb + URGENCY_OFFSET], q_sh[qb + URGENCY_OFFSET + 1], q_sh[qb + URGENCY_OFFSET + 2],
                    u_sh[ub + DRAW_BRANCH + 2], explore, tau_mult,
                )  # fmt: skip
            if direction == HOLD or direction == FLAT:
                magnitude = 0
            actions[i, 0] = direction
            actions[i, 1] = magnitude
            actions[i, 2] = order
            actions[i, 3] = urgency
            conviction[i] = conv

    return select_staged


_select_staged = _staged_selector(N_HEADS)


@register((F32_3D, F32_3D, xoroshiro128p_type[::1], int32, float32, float32, int32[:, ::1], float32[::1], int32,
           F32_3D, int32, int32, int32, int32, float32))
@cuda.jit
def action_select_kernel(logits, support, states, explore, spread, tau_mult, actions, conviction, lanes, values,
                         mode, fix_magnitude, fix_order, fix_urgency, hold_margin):
    """actions[i] and conviction[i] for the samples of this block (launch shape and policy in the module
    header): `lanes` threads per sample, block b serving samples b * spb ... with spb = blockDim.x // lanes.
    Lane l owns heads l, l + lanes, ...; lane N_HEADS % lanes, which owns the fewest, draws the uniforms.
    With mode = MODE_IQN the directions act on their joint values with the IQN head, values[i] = (E_IQN [4], the
    sampled quantiles [4]); with MODE_MEAN on the mean head's values[i, 0] (module header); MODE_C51 reads nothing
    from `values`. fix_magnitude, fix_order and
    fix_urgency >= 0 fix that branch's bin (-1: the policy chooses it); hold_margin: evaluation's (module header)."""
    stage = cuda.shared.array(STAGE_WORDS, float32)
    q_sh = cuda.shared.array(_Q_WORDS, float32)
    draw_sh = cuda.shared.array(_DRAW_WORDS, float32)
    u_sh = cuda.shared.array(_U_WORDS, float32)
    n_atoms = logits.shape[2]
    spb = cuda.blockDim.x // lanes
    first = cuda.blockIdx.x * spb
    count = min(spb, logits.shape[0] - first)
    _stage_logits(logits, first, count, stage, n_atoms | 1, cuda.threadIdx.x, cuda.blockDim.x, n_atoms)
    _select_staged(stage, q_sh, draw_sh, u_sh, support, states, explore, spread, tau_mult, actions, conviction,
                   lanes, values, mode, fix_magnitude, fix_order, fix_urgency, hold_margin, n_atoms, logits.shape[0])


def _heads_kernel(live: int) -> Any:
    """action_select_heads_kernel staging and choosing from the first `live` branches' heads: all four, or the
    direction branch alone (select_actions takes it when every other bin is fixed)."""
    stage_heads = combined_heads_stager(live)
    select_staged = _staged_selector(N_HEADS if live == N_BRANCHES else N_DIRECTIONS)

    def action_select_heads_kernel(head, n_atoms, support, states, explore, spread, tau_mult, actions, conviction,
                                   lanes, values, mode, fix_magnitude, fix_order, fix_urgency, hold_margin):
        """action_select_kernel on the head GEMM's output rows head [B, head_width(Z)]: the block stages its
        samples' stream columns and forms their dueling combine in shared memory (head_rows.stage_combined_heads,
        the combine's bits), so the [B, 13, Z] logits are neither written nor read; then the same phases on the same
        staged rows (the direction variant: the direction heads' rows alone, every other bin fixed)."""
        stage = cuda.shared.array(STAGE_WORDS, float32)
        value_sh = cuda.shared.array(VALUE_WORDS, float32)
        q_sh = value_sh[:_Q_WORDS]  # the value rows are dead once the combine is done (HEADS_BLOCKS_PER_SM)
        draw_sh = cuda.shared.array(_DRAW_WORDS, float32)
        u_sh = cuda.shared.array(_U_WORDS, float32)
        spb = cuda.blockDim.x // lanes
        first = cuda.blockIdx.x * spb
        count = min(spb, head.shape[0] - first)
        stage_heads(head, first, count, stage, value_sh, n_atoms | 1, cuda.threadIdx.x, cuda.blockDim.x, n_atoms)
        select_staged(stage, q_sh, draw_sh, u_sh, support, states, explore, spread, tau_mult, actions, conviction,
                      lanes, values, mode, fix_magnitude, fix_order, fix_urgency, hold_margin, n_atoms, head.shape[0])

    if live < N_BRANCHES:
        action_select_heads_kernel.__name__ = action_select_heads_kernel.__qualname__ = (
            "action_select_heads_kernel_direction")
    sig = (_F2, int32, F32_3D, xoroshiro128p_type[::1], int32, float32, float32, int32[:, ::1], float32[::1], int32,
           F32_3D, int32, int32, int32, int32, float32)
    return register(sig)(cuda.jit(**_HEADS_OPTIONS)(action_select_heads_kernel))


action_select_heads_kernel = _heads_kernel(N_BRANCHES)
action_select_heads_direction = _heads_kernel(1)


def heads_kernel(fixed: Sequence[int]) -> Any:
    """The heads kernel select_actions launches for these fixed bins: the direction heads alone when every bin after
    the direction is fixed."""
    return action_select_heads_direction if min(fixed) >= 0 else action_select_heads_kernel


def check_fixed_bins(fixed: Sequence[int]) -> tuple[int, ...]:
    """`fixed` as a tuple after checking it: one bin per branch after direction, each -1 (free) or a bin of it."""
    bins = tuple(int(f) for f in fixed)
    if len(bins) != N_BRANCHES - 1 or any(not -1 <= f < br.size for f, br in zip(bins, BRANCHES[1:], strict=False)):
        names = ", ".join(f"{br.name} 0..{br.size - 1}" for br in BRANCHES[1:])
        raise ValueError(f"fixed bins {list(fixed)}: need {N_BRANCHES - 1} entries, each -1 (free) or a bin ({names})")
    return bins


def select_actions(
    logits: Any,
    support: Any,
    states: Any,
    actions: Any,
    conviction: Any,
    *,
    explore: bool,
    stream: Any,
    lanes: int | None = None,
    spread: float = 1.0,
    tau_mult: float = 1.0,
    iqn: Any = None,
    mean: Any = None,
    fixed: tuple[int, ...] = FREE_BINS,
    hold_margin: float = 0.0,
) -> None:
    """Choose one action per sample: logits[B, 13, Z] (or the head GEMM's output rows [B, head_width(Z)], whose
    dueling combine the kernel then forms in shared memory: the same bits, without the [B, 13, Z] logits in global
    memory; `action_select_heads_kernel`), support[B, 13, 3], states[>= B] (xoroshiro, sample i
    uses states[i], advanced by DRAWS = 8 draws when exploring) -> actions[B, 4] int32, conviction[B]
    float32. `explore` selects the training policy (Thompson + Boltzmann) or the evaluation policy
    (argmax E[Q]). Z is at most MAX_ATOMS. `spread` (kappa) and `tau_mult` narrow the training policy
    (module header; 1 and 1: the seed's Thompson and Boltzmann). `iqn` [B, 2, 4] float32 (network.iqn_quantiles
    > 0; kernels/iqn.py `act_values`): each direction's E_IQN, then its sampled quantile (read when
    exploring): the directions then act on their joint values with the IQN head (module header). `mean` [B, 1, 4]
    float32 (network.mean_head; agent/mean_head.py MeanActor): the mean head's direction values, which the
    directions then act on (module header); at most one of `iqn` and `mean`. `fixed`: the bin
    of magnitude, order type and urgency every sample takes, -1 where the policy chooses (module header).
    `hold_margin` >= 0: in evaluation a change of position must beat Hold's value by this much (module header; the
    values' units, risk units of reward); collection ignores it.

    `lanes` (1 to LANES, default LANES = 16 on the GPU, 1 under the simulator) sets the threads per sample. Every head is computed by one
    thread with the same code and the uniforms by one thread in the same order, whatever the lanes, so
    the results have the same bits for every value (a test checks it): fewer lanes only make a longer
    serial chain per thread. Tests pass lanes = 1 to run large batches under the simulator, which pays
    per thread; the benchmark compares the shapes on the GPU.
    """
    heads = len(logits.shape) == 2
    if heads:
        b, z = logits.shape[0], (logits.shape[1] - N_AUX) // N_STREAMS
        if b < 1 or z < 2 or logits.shape[1] != head_width(z):
            raise ValueError(f"head rows must be a float32 array [B, head_width(Z) = {N_STREAMS} Z + {N_AUX}] with "
                             f"B >= 1, Z >= 2, got {logits.shape}")  # fmt: skip
        check_array("head rows", logits, "[B, head_width(Z)]", (b, head_width(z)))
    else:
        if len(logits.shape) != 3 or logits.shape[0] < 1 or logits.shape[2] < 2:
            raise ValueError(f"logits must be a float32 array [B, {N_HEADS}, Z] with B >= 1, Z >= 2, got "
                             f"{logits.shape}")  # fmt: skip
        b, _, z = logits.shape
        check_array("logits", logits, f"[B, {N_HEADS}, Z]", (b, N_HEADS, z))
    if z > MAX_ATOMS:
        raise ValueError(f"logits: Z = {z} atoms; action selection stages a sample's logits in shared memory, "
                         f"which holds at most Z = {MAX_ATOMS}")  # fmt: skip
    check_array("support", support, f"[B, {N_HEADS}, 3]", (b, N_HEADS, 3))
    if len(states.shape) != 1 or states.shape[0] < b or states.dtype != XOROSHIRO_DTYPE:
        raise ValueError(
            f"states must be a 1-D xoroshiro128p state array of at least B = {b} entries, "
            f"got {states.dtype}{tuple(states.shape)}"
        )
    check_array("states", states, "[n >= B]", (states.shape[0],), XOROSHIRO_DTYPE)
    check_array("actions", actions, f"[B, {N_BRANCHES}]", (b, N_BRANCHES), np.int32)
    check_array("conviction", conviction, "[B]", (b,))
    lanes = (1 if SIMULATOR else LANES) if lanes is None else int(lanes)
    if not 1 <= lanes <= LANES:
        raise ValueError(f"lanes = {lanes}: threads per sample must be 1 to {LANES}")
    if not (0.0 <= spread <= 1.0 and 0.0 < tau_mult <= 1.0):
        raise ValueError(f"exploration needs 0 <= spread <= 1 and 0 < tau_mult <= 1, got {spread}, {tau_mult}")
    fixed = check_fixed_bins(fixed)
    if not hold_margin >= 0.0:
        raise ValueError(f"hold_margin must be >= 0, got {hold_margin}")
    if iqn is not None and mean is not None:
        raise ValueError("select_actions: the directions act on the IQN head's values or the mean head's, not both")
    values, mode = support, MODE_C51  # MODE_C51 reads nothing from `values`
    if iqn is not None:
        check_array("iqn", iqn, f"[B, 2, {N_DIRECTIONS}]", (b, 2, N_DIRECTIONS))
        values, mode = iqn, MODE_IQN
    if mean is not None:
        check_array("mean", mean, f"[B, 1, {N_DIRECTIONS}]", (b, 1, N_DIRECTIONS))
        values, mode = mean, MODE_MEAN
    flag = np.int32(1 if explore else 0)
    spb = stage_samples(z)
    if SIMULATOR:
        spb = min(spb, b)  # the simulator pays for every thread, idle ones included
    source = (heads_kernel(fixed), logits, np.int32(z)) if heads else (action_select_kernel, logits)
    launch_rows(
        source[0], -(-b // spb), spb * lanes, *source[1:], support, states, flag, np.float32(spread),
        np.float32(tau_mult), actions, conviction, np.int32(lanes), values, np.int32(mode),
        *(np.int32(f) for f in fixed), np.float32(hold_margin), stream=stream,
    )  # fmt: skip
