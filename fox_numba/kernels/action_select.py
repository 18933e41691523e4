"""Action selection from the C51 heads: Thompson sampling and Boltzmann in training, argmax E[Q] in evaluation.

Launch shape: 1-D, one thread per sample, blocks of 64 threads (a collect batch is a few thousand
environments, so small blocks spread it over more SMs). Each thread runs one online-softmax pass over
the Z logits of each of the 13 heads (`distributional.softmax_stats`), plus one inverse-CDF pass per
direction when exploring; everything lives in scalars (40 registers, no local memory on sm_90).
The serial chain per thread sets the time, not B: 175 us (explore) / 155 us (eval) on the H200 at
Z = 51 for B = 1024 and 8192 alike, 75 / 66 us at Z = 21.

Policy (the seed's Plan C), for sample i with E[Q] q_a = sum_j softmax(logits[i, a])_j z_j:
- explore = 1 (collection): direction by Thompson sampling: one atom value drawn from each direction's
  distribution, the largest draw wins (ties to the lowest direction). Magnitude, order type and urgency
  by Boltzmann over their three E[Q] with tau = max(max q - min q, TAU_FLOOR): tied to the branch's
  Q range, so P(best) is the same at every Q scale (1 / (1 + 2/e) for q = [0, 0, 1]).
- explore = 0 (evaluation): argmax E[Q] in every branch, ties to the lowest bin; the RNG is not touched.
- Direction Hold or Flat records magnitude 0.
Random draws come from `states[i]` (numba xoroshiro128+, bit-exact between simulator and GPU) in a fixed
order, whether or not Hold/Flat later overrides the magnitude: the 4 directions, then magnitude, order
type, urgency (7 uniforms per sample and step). The draws are numba.cuda.random's device functions,
imported by name: inside a simulated kernel `cuda` has no `random` attribute.
Outputs: actions[i] = (direction, magnitude, order type, urgency) as int32, and conviction[i] = E[Q] of
the chosen direction minus the best E[Q] among the other three (>= 0 in evaluation).
The explore flag is a kernel argument: collection and evaluation are separate captured graphs.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import cuda, float32, int32
from numba.cuda.random import xoroshiro128p_type, xoroshiro128p_uniform_float32

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
from fox_numba.device.launch import check_array, launch
from fox_numba.device.registry import register
from fox_numba.device.rng import XOROSHIRO_DTYPE
from fox_numba.kernels.distributional import F32_3D, softmax_stats

# Below this Q range a 3-bin branch's Boltzmann tends to uniform instead of stretching differences that
# are noise to the full P(best) (E[Q] lives on supports of width ~1).
TAU_FLOOR = np.float32(1e-4)
_NEG_INF = np.float32(-np.inf)
ACTION_BLOCK = 64
# _pick3 hard-codes three bins for every branch after direction: refuse an action space it cannot serve.
assert all(b.size == 3 for b in BRANCHES[1:]), "action_select: _pick3 expects 3-bin non-direction branches"


@cuda.jit(device=True)
def _sample_atom(logits, i, a, m, s, u):
    """Index of the atom of softmax(logits[i, a, :]) at uniform u: first j with cumsum_j > u * S.

    M and S come from `softmax_stats`; if rounding leaves the sum short of u * S the last atom with
    nonzero weight is returned, never a weightless one.
    """
    target = u * s
    c = float32(0.0)
    pick = 0
    for j in range(logits.shape[2]):
        w = math.exp(logits[i, a, j] - m)
        c += w
        if w > float32(0.0):
            pick = j
        if c > target:
            break
    return pick


@cuda.jit(device=True)
def _pick3(logits, support, states, i, offset, explore):
    """Bin of the 3-head branch at `offset`: Boltzmann at tau = max(Q range, TAU_FLOOR), or argmax."""
    _m, s0, tz0, _tlm = softmax_stats(logits, support, i, offset)
    _m, s1, tz1, _tlm = softmax_stats(logits, support, i, offset + 1)
    _m, s2, tz2, _tlm = softmax_stats(logits, support, i, offset + 2)
    q0 = tz0 / s0
    q1 = tz1 / s1
    q2 = tz2 / s2
    if explore == 0:
        if q0 >= q1 and q0 >= q2:
            return 0
        return 1 if q1 >= q2 else 2
    u = xoroshiro128p_uniform_float32(states, i)
    hi = max(max(q0, q1), q2)
    tau = max(hi - min(min(q0, q1), q2), TAU_FLOOR)
    w0 = math.exp((q0 - hi) / tau)
    w1 = math.exp((q1 - hi) / tau)
    w2 = math.exp((q2 - hi) / tau)
    target = u * (w0 + w1 + w2)
    if target < w0:
        return 0
    return 1 if target < w0 + w1 else 2


@register((F32_3D, F32_3D, xoroshiro128p_type[::1], int32, int32[:, ::1], float32[::1]))
@cuda.jit
def action_select_kernel(logits, support, states, explore, actions, conviction):
    """actions[i] and conviction[i] from the C51 heads of sample i (policy in the module header)."""
    i = cuda.grid(1)
    if i >= logits.shape[0]:
        return
    best_q = _NEG_INF  # top two direction E[Q]: argmax for evaluation and the conviction
    second_q = _NEG_INF
    best_d = 0
    draw_v = _NEG_INF  # the largest Thompson draw, its direction and that direction's E[Q]
    draw_d = 0
    draw_q = float32(0.0)
    for d in range(N_DIRECTIONS):
        a = DIR_OFFSET + d
        m, s, tz, _tlm = softmax_stats(logits, support, i, a)
        q = tz / s
        if q > best_q:
            second_q = best_q
            best_q = q
            best_d = d
        elif q > second_q:
            second_q = q
        if explore != 0:
            u = xoroshiro128p_uniform_float32(states, i)
            v = support[i, a, 0] + float32(_sample_atom(logits, i, a, m, s, u)) * support[i, a, 2]
            if v > draw_v:
                draw_v = v
                draw_d = d
                draw_q = q
    direction = best_d
    conv = best_q - second_q
    if explore != 0:
        direction = draw_d
        conv = draw_q - (second_q if draw_d == best_d else best_q)
    magnitude = _pick3(logits, support, states, i, MAG_OFFSET, explore)
    order = _pick3(logits, support, states, i, ORDER_OFFSET, explore)
    urgency = _pick3(logits, support, states, i, URGENCY_OFFSET, explore)
    if direction == HOLD or direction == FLAT:
        magnitude = 0
    actions[i, 0] = direction
    actions[i, 1] = magnitude
    actions[i, 2] = order
    actions[i, 3] = urgency
    conviction[i] = conv


def select_actions(
    logits: Any, support: Any, states: Any, actions: Any, conviction: Any, *, explore: bool, stream: Any
) -> None:
    """Choose one action per sample: logits[B, 13, Z], support[B, 13, 3], states[>= B] (xoroshiro, sample i
    uses states[i], advanced by 7 draws when exploring) -> actions[B, 4] int32, conviction[B] float32.
    `explore` selects the training policy (Thompson + Boltzmann) or the evaluation policy (argmax E[Q]).
    """
    if len(logits.shape) != 3 or logits.shape[0] < 1 or logits.shape[2] < 2:
        raise ValueError(f"logits must be a float32 array [B, {N_HEADS}, Z] with B >= 1, Z >= 2, got {logits.shape}")
    b, _, z = logits.shape
    check_array("logits", logits, f"[B, {N_HEADS}, Z]", (b, N_HEADS, z))
    check_array("support", support, f"[B, {N_HEADS}, 3]", (b, N_HEADS, 3))
    if len(states.shape) != 1 or states.shape[0] < b or states.dtype != XOROSHIRO_DTYPE:
        raise ValueError(
            f"states must be a 1-D xoroshiro128p state array of at least B = {b} entries, "
            f"got {states.dtype}{tuple(states.shape)}"
        )
    check_array("states", states, "[n >= B]", (states.shape[0],), XOROSHIRO_DTYPE)
    check_array("actions", actions, f"[B, {N_BRANCHES}]", (b, N_BRANCHES), np.int32)
    check_array("conviction", conviction, "[B]", (b,))
    flag = np.int32(1 if explore else 0)
    launch(
        action_select_kernel, b, logits, support, states, flag, actions, conviction, stream=stream, block=ACTION_BLOCK
    )
