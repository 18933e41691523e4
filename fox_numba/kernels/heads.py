"""The dueling C51 heads: the combine into per-bin logits, its backward, and the per-head adaptive supports.

Head GEMM output layout (one row per sample, S = N_BRANCHES + N_HEADS = 17 streams of Z atoms, branch by branch:
a branch's value stream, then the advantage streams of its heads; then N_AUX auxiliary columns; `head_width(Z)`
columns in all):

    stream  0 | 1-4        | 5 | 6-8         | 9 | 10-12        | 13 | 14-16
            V_direction, A_0-3 | V_magnitude, A_4-6 | V_order, A_7-9 | V_urgency, A_10-12
    head[i, s * Z + z]     s = value_stream(b) = offset_b + b: the value stream V_b of branch b
                           s = adv_stream(a) = a + branch_of(a) + 1: the advantage stream A_a of head a
    head[i, S * Z]         the auxiliary forecast (the learner's aux loss, kernels/learner.py; the
                           combine neither reads nor writes it)

Branch by branch, so the first `live_streams(n)` streams hold the first n branches whole: a network whose later
branches are fixed computes only those columns (`live_columns`, agent/network.py's ParamLayout.live_branches).

Dueling combine (per branch b with bins a in b, n_b = the branch's size):

    logits[i, a, z] = V_b[i, z] + (A_a[i, z] - mean_{a' in b} A_a'[i, z])
    backward:  dV_b[i, z] = sum_{a in b} dlogits[i, a, z]
               dA_a[i, z] = dlogits[i, a, z] - mean_{a' in b} dlogits[i, a', z]

Supports: support[a] = (v_min, v_max, delta_z) of head a, [N_HEADS, 3], linear atoms v_min + j * delta_z.
The rule (`support_refresh`, once per epoch, from the ISV):

    q_ref_a  = ISV[Q_DIR_ABS_REF] for the direction heads, ISV[Q_ABS_REF] for the others
    r_ref    = ISV[REWARD_ABS_EMA] (mean |reward| per environment step)
    want_a   = Q_COVER * q_ref_a + RETURN_COVER * r_ref / sqrt(1 - gamma**2)
    scale_a  = want_a / max(|base v_min|, |base v_max|), clamped to [old / SCALE_STEP, old * SCALE_STEP]
               and then to [1, cap] (cap = network.support_max_scale)
    support  = (base v_min * scale, base v_max * scale, (base v_max - base v_min) * scale / (Z - 1))

Why: the atoms must cover the values the head is asked to represent, no wider, or the resolution
(delta_z) is wasted. Two things set that range. The Q scale (the EMA of mean |E[Q]| this very head
family produces, Q_COVER = 3 times it leaves room for the spread of Q across states and its growth during
an epoch) and the return noise: with per-step rewards of size r_ref, a discounted return spreads over
about r_ref / sqrt(1 - gamma**2) (the standard deviation of a discounted sum of independent terms),
RETURN_COVER = 2 of those covers most of the distribution's mass. The base support from the config is a
permanent floor (at bootstrap both references are small, and the network starts on the base support) and
the cap bounds the width for good (network.support_max_scale = 1 turns adaptation off). The supports and
all three references carry over fold boundaries (none has a fold-reset value in device/isv.py), so the
refresh before a fold's first collect leaves the supports where the last fold's ended. Between epochs
the width moves by at most SCALE_STEP = 2x: widening the atoms under fixed logits scales every E[Q]
of the head by the same factor, so a bounded step keeps the Q_ABS_REF -> width -> E[Q] loop damped while
the TD targets pull E[Q] back to the returns. Scaling the base support keeps its shape (an asymmetric
base stays asymmetric). A non-finite reference leaves the head's support as it was.
Per head, not per sample: the kernels that read supports (expected_q, action selection, the projection)
take them as per-(sample, head) rows [B, 13, 3], the seed's per-sample support, and `broadcast_supports`
fills those rows from the [13, 3] table. The rule writes one value per head because every input it reads
is a run-wide ISV scalar: a per-sample rule on the same inputs would write the same numbers B times. A
rule with per-sample inputs (the sample's volatility regime, say) would only change how the rows are filled.
The learner's fused C51 kernels (kernels/learner.py) read the [13, 3] tables directly; per-sample supports
would give them [B, 13, 3] arguments too.

Online and target supports differ: the target network is a Polyak average of past online parameters,
whose logits were trained on the supports of their time, so its support is the Polyak average of the
online supports at the same rate (the learner's `finish_step`), and `c51_project` maps the target's atoms
onto the online ones. A fold reset (`sync_target`) copies both.
Non-linear atom positions are not implemented (linear atoms only).

Launch shapes: combine forward/backward and the broadcast are grid-stride over their outputs
(`launch_strided`: one thread per element on the GPU, one block under the simulator); the refresh runs one
thread per head. float32 throughout, literals float32; the branch layout comes from fox_numba.actions as
compile-time constants.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import cuda, float32, int32

from fox_numba.actions import BRANCHES, MAG_OFFSET, N_BRANCHES, N_HEADS, ORDER_OFFSET, URGENCY_OFFSET
from fox_numba.device.isv import ISV_TOTAL_DIM, Isv
from fox_numba.device.launch import check_array, i32, launch_strided
from fox_numba.device.registry import register
from fox_numba.device.runtime import u32

N_STREAMS = N_BRANCHES + N_HEADS  # each branch's value stream, then its advantage streams, branch by branch
N_AUX = 1  # auxiliary forecast columns after the streams
MAX_BRANCH_SIZE = max(b.size for b in BRANCHES)  # the bound of the combine's unrolled loops
VALUE_STREAMS = tuple(b.offset + k for k, b in enumerate(BRANCHES))  # (0, 5, 9, 13)


def live_streams(n_branches: int) -> int:
    """Streams of the first n_branches branches: the leading streams a network with the others fixed computes."""
    if not 1 <= n_branches <= N_BRANCHES:
        raise ValueError(f"live branches must be in 1..{N_BRANCHES}, got {n_branches}")
    return N_STREAMS if n_branches == N_BRANCHES else VALUE_STREAMS[n_branches]


def live_columns(n_branches: int, n_atoms: int) -> int:
    """Leading head-output columns a network computes when only its first n_branches branches act: their streams,
    and with every branch live the auxiliary column too (the whole width)."""
    return head_width(n_atoms) if n_branches == N_BRANCHES else live_streams(n_branches) * n_atoms


def advantage_stream_of(a: int) -> int:
    """Host: the stream of head a's advantage (`adv_stream` on the device)."""
    b = next(k for k, br in enumerate(BRANCHES) if br.offset <= a < br.offset + br.size)
    return a + b + 1


def head_width(n_atoms: int) -> int:
    """Columns of the head GEMM's output: the streams' atoms, then the auxiliary forecast."""
    return N_STREAMS * n_atoms + N_AUX


def aux_column(n_atoms: int) -> int:
    """The head output's column of the auxiliary forecast."""
    return N_STREAMS * n_atoms

Q_COVER = np.float32(3.0)
RETURN_COVER = np.float32(2.0)
SCALE_STEP = np.float32(2.0)
_Q_ABS_REF = int(Isv.Q_ABS_REF)
_Q_DIR_ABS_REF = int(Isv.Q_DIR_ABS_REF)
_REWARD_ABS = int(Isv.REWARD_ABS_EMA)
assert [b.offset for b in BRANCHES] == [0, MAG_OFFSET, ORDER_OFFSET, URGENCY_OFFSET]

_F1 = float32[::1]
_F2 = float32[:, ::1]
_F3 = float32[:, :, ::1]


@cuda.jit(device=True)
def branch_span(b):
    """(first head, size) of branch b."""
    if b == 0:
        return 0, MAG_OFFSET
    if b == 1:
        return MAG_OFFSET, ORDER_OFFSET - MAG_OFFSET
    if b == 2:
        return ORDER_OFFSET, URGENCY_OFFSET - ORDER_OFFSET
    return URGENCY_OFFSET, N_HEADS - URGENCY_OFFSET


@cuda.jit(device=True)
def branch_of(a):
    """The branch of head a."""
    if a < MAG_OFFSET:
        return 0
    if a < ORDER_OFFSET:
        return 1
    if a < URGENCY_OFFSET:
        return 2
    return 3


@cuda.jit(device=True)
def value_stream(b):
    """The stream of branch b's value V_b (module header)."""
    off, _ = branch_span(b)
    return off + b


@cuda.jit(device=True)
def adv_stream(a):
    """The stream of head a's advantage A_a (module header)."""
    return a + branch_of(a) + 1


@cuda.jit(device=True)
def stream_branch(s):
    """The branch of stream s (value or advantage); N_BRANCHES past the streams (the auxiliary columns)."""
    if s < MAG_OFFSET + 1:
        return 0
    if s < ORDER_OFFSET + 2:
        return 1
    if s < URGENCY_OFFSET + 3:
        return 2
    if s < N_STREAMS:
        return 3
    return N_BRANCHES


@cuda.jit(device=True)
def column_branch(o, n_atoms):
    """The branch of head column o (its stream's, `stream_branch`); N_BRANCHES for the auxiliary columns."""
    return stream_branch(o // n_atoms)


@cuda.jit(device=True)
def combined_logit(head, i, a, z, n_atoms):
    """logits[i, a, z] of the head GEMM's output rows head: V_b + (A_a - the mean of branch b's A) at atom z, with
    dueling_combine_fwd's arithmetic (the same float32 operations in the same order: the same bits)."""
    b = branch_of(a)
    off, size = branch_span(b)
    row = u32(i)  # uint32 indices: no 64-bit multiply, no negative-index wrap (head_rows' header)
    nz = u32(n_atoms)
    atom = u32(z)
    v = u32(off + b)  # value_stream(b); its advantage streams follow
    mean = float32(0.0)
    for k in range(MAX_BRANCH_SIZE):  # a constant trip count: unrolled, the loads issued together
        if k < size:
            mean += head[row, u32(u32(v + u32(1 + k)) * nz + atom)]
    mean = mean / float32(size)
    return head[row, u32(v * nz + atom)] + (head[row, u32(u32(a + b + 1) * nz + atom)] - mean)


@register((_F2, _F3, int32))
@cuda.jit
def dueling_combine_fwd(head, logits, n):
    """logits[i, a, z] = V_b[i, z] + (A_a[i, z] - mean over the branch's A[i, z]) for every head a of
    branch b; one (i, b, z) per iteration, n = B * N_BRANCHES * Z."""
    n_atoms = logits.shape[2]
    t = cuda.grid(1)
    while t < n:
        i = t // (N_BRANCHES * n_atoms)
        r = t - i * (N_BRANCHES * n_atoms)
        b = r // n_atoms
        z = r - b * n_atoms
        off, size = branch_span(b)
        vs = off + b  # value_stream(b)
        mean = float32(0.0)
        for k in range(MAX_BRANCH_SIZE):  # unrolled (combined_logit)
            if k < size:
                mean += head[i, (vs + 1 + k) * n_atoms + z]
        mean = mean / float32(size)
        v = head[i, vs * n_atoms + z]
        for k in range(MAX_BRANCH_SIZE):
            if k < size:
                logits[i, off + k, z] = v + (head[i, (vs + 1 + k) * n_atoms + z] - mean)
        t += cuda.gridsize(1)


@register((_F3, _F2, int32))
@cuda.jit
def dueling_combine_bwd(dlogits, dhead, n):
    """dhead from dlogits [B, N_HEADS, Z] (formulas in the module header): the value column of branch b and
    the advantage columns of its heads; one (i, b, z) per iteration, n = B * N_BRANCHES * Z."""
    n_atoms = dlogits.shape[2]
    t = cuda.grid(1)
    while t < n:
        i = t // (N_BRANCHES * n_atoms)
        r = t - i * (N_BRANCHES * n_atoms)
        b = r // n_atoms
        z = r - b * n_atoms
        off, size = branch_span(b)
        vs = off + b  # value_stream(b)
        total = float32(0.0)
        for k in range(size):
            total += dlogits[i, off + k, z]
        dhead[i, vs * n_atoms + z] = total
        mean = total / float32(size)
        for k in range(size):
            dhead[i, (vs + 1 + k) * n_atoms + z] = dlogits[i, off + k, z] - mean
        t += cuda.gridsize(1)


@register((_F1, _F2, float32, float32, float32, float32, int32))
@cuda.jit
def support_refresh(isv, support, v_min, v_max, return_spread, scale_cap, n_atoms):
    """support[a] <- the rule of the module header from the ISV and support[a]'s current width."""
    a = cuda.grid(1)
    while a < N_HEADS:
        q_ref = isv[_Q_DIR_ABS_REF] if a < MAG_OFFSET else isv[_Q_ABS_REF]
        want = Q_COVER * q_ref + RETURN_COVER * return_spread * isv[_REWARD_ABS]
        half = max(abs(v_min), abs(v_max))
        width = v_max - v_min
        old = (support[a, 1] - support[a, 0]) / width
        old_ok = not (math.isinf(old) or math.isnan(old)) and old > float32(0.0)
        scale = want / half
        if math.isinf(scale) or math.isnan(scale):
            scale = old if old_ok else float32(1.0)
        elif old_ok:
            scale = min(max(scale, old / SCALE_STEP), old * SCALE_STEP)
        scale = min(max(scale, float32(1.0)), scale_cap)
        support[a, 0] = v_min * scale
        support[a, 1] = v_max * scale
        support[a, 2] = width * scale / float32(n_atoms - 1)
        a += cuda.gridsize(1)


@register((_F2, _F3, int32))
@cuda.jit
def broadcast_support(support, out, n):
    """out[r, a, :] = support[a, :] for every row r (n = R * N_HEADS * 3): the [B, A, 3] layout of the
    distributional kernels."""
    t = cuda.grid(1)
    while t < n:
        c = t % (N_HEADS * 3)
        out[t // (N_HEADS * 3), c // 3, c % 3] = support[c // 3, c % 3]
        t += cuda.gridsize(1)


def _shape(arr: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in arr.shape)


def dueling_combine_forward(head: Any, logits: Any, *, stream: Any) -> None:
    """head [B, head_width(Z)] -> logits [B, N_HEADS, Z]."""
    b, _, z = _shape(logits) if len(logits.shape) == 3 else (0, 0, 0)
    check_array("logits", logits, "[B, N_HEADS, Z]", (b, N_HEADS, z))
    check_array("head", head, "[B, head_width(Z)]", (b, head_width(z)))
    n = b * N_BRANCHES * z
    launch_strided(dueling_combine_fwd, n, head, logits, i32(n), stream=stream)


def dueling_combine_backward(dlogits: Any, dhead: Any, *, stream: Any) -> None:
    """dlogits [B, N_HEADS, Z] -> dhead [B, head_width(Z)]: every stream column written, the auxiliary
    column left as it is (the aux loss writes it)."""
    b, _, z = _shape(dlogits) if len(dlogits.shape) == 3 else (0, 0, 0)
    check_array("dlogits", dlogits, "[B, N_HEADS, Z]", (b, N_HEADS, z))
    check_array("dhead", dhead, "[B, head_width(Z)]", (b, head_width(z)))
    n = b * N_BRANCHES * z
    launch_strided(dueling_combine_bwd, n, dlogits, dhead, i32(n), stream=stream)


def return_spread(gamma: float) -> float:
    """1 / sqrt(1 - gamma**2): a discounted return's spread in units of the per-step reward's."""
    if not 0.0 <= gamma < 1.0:
        raise ValueError(f"gamma must be in [0, 1), got {gamma}")
    return 1.0 / math.sqrt(1.0 - gamma * gamma)


def base_support(v_min: float, v_max: float, n_atoms: int) -> np.ndarray:
    """The base support of every head, float32 [N_HEADS, 3] (the starting and floor support)."""
    if not v_min < v_max or n_atoms < 2:
        raise ValueError(f"a support needs v_min < v_max and at least 2 atoms, got {v_min}, {v_max}, {n_atoms}")
    row = np.array([v_min, v_max, (v_max - v_min) / (n_atoms - 1)], np.float32)
    return np.tile(row, (N_HEADS, 1))


def refresh_supports(
    isv: Any, support: Any, *, v_min: float, v_max: float, gamma: float, scale_cap: float, n_atoms: int,
    stream: Any,
) -> None:
    """Apply the support rule of the module header to every head's support [N_HEADS, 3], in place."""
    check_array("isv", isv, "[ISV_TOTAL_DIM]", (ISV_TOTAL_DIM,))
    check_array("support", support, "[N_HEADS, 3]", (N_HEADS, 3))
    if not (v_min < v_max and scale_cap >= 1.0 and n_atoms >= 2):
        raise ValueError(f"support refresh needs v_min < v_max, scale_cap >= 1, n_atoms >= 2; got "
                         f"{v_min}, {v_max}, {scale_cap}, {n_atoms}")
    launch_strided(support_refresh, N_HEADS, isv, support, np.float32(v_min), np.float32(v_max),
                   np.float32(return_spread(gamma)), np.float32(scale_cap), i32(n_atoms), stream=stream)


def broadcast_supports(support: Any, out: Any, *, stream: Any) -> None:
    """out [R, N_HEADS, 3] = support [N_HEADS, 3] on every row (expected_q / action_select take [B, A, 3])."""
    check_array("support", support, "[N_HEADS, 3]", (N_HEADS, 3))
    r = int(out.shape[0])
    check_array("out", out, "[R, N_HEADS, 3]", (r, N_HEADS, 3))
    n = r * N_HEADS * 3
    launch_strided(broadcast_support, n, support, out, i32(n), stream=stream)
