"""Mixture-of-experts heads (network.moe_experts = K > 0; agent/moe.py): gate softmax, mixture, gradients, signals.

    moe_gate_softmax(g, stream=s)                        g [R, 4K]: gate logits in, per-branch softmax weights out
    moe_mix(e, g, out, stream=s)                         out [R, HW] = the gate-weighted sum of the K experts e
    moe_expert_grad(dout, g, de, stream=s)               de [G, K HW] = dL/de from dout = dL/dout
    moe_gate_grad(dout, e, g, usage, isv, dg, stream=s)  dg [G, 4K] = dL/d(gate logits), the balance term included
    moe_usage(g, usage, n_rows=G, stream=s)              usage [4K + 4]: batch-mean gate weights, branch entropies
    moe_signals(usage, isv, epoch, stream=s)             ISV 118-128 (EMAs and the lambda controller), epoch stat

Shapes. HW = head_width(Z) columns of one head GEMM (kernels/heads.py: 4 value and 13 advantage streams of Z atoms,
then the auxiliary forecast); the experts' GEMM output e [R, K HW] holds expert k's head in columns [k HW, (k + 1)
HW). The gate g [R, 4K] holds branch b's weights over the experts in columns [b K, (b + 1) K). A head column c
belongs to branch b(c): its value stream's branch, or its advantage stream's head's branch.

Forward (dense mixture: every expert runs on every row, no top-k routing, so the head is differentiable everywhere
and the GEMM of all K experts is one [H, K HW] GEMM):

    w[r, b, :] = softmax(g[r, b K : (b + 1) K])
    out[r, c]  = sum_k w[r, b(c), k] e[r, k HW + c]           (stream columns)
    out[r, c]  = (1 / K) sum_k e[r, k HW + c]                 (the auxiliary column: not an action value, no gate)

The dueling combine is linear per branch and the gate is constant over a branch's columns, so the combine of `out`
is the gate-weighted sum of the experts' logits. Backward, from dout = dL/dout [G, HW] (the first G rows):

    de[r, k HW + c] = w[r, b(c), k] dout[r, c]                (auxiliary column: dout[r, c] / K)
    dL/dw[r, b, k]  = sum_{c in b} dout[r, c] e[r, k HW + c] + lambda 2 K u[b, k] / G
    dg[r, b, k]     = w_k (dL/dw_k - sum_j w_j dL/dw_j)       (the softmax Jacobian)

with u[b, k] = (1 / G) sum_r w[r, b, k] (the utilisation of expert k by branch b's gate, `moe_usage`) and lambda =
ISV[MOE_LAMBDA_EFF]: the second term is the gradient of the load-balancing loss

    L_bal = lambda sum_b K sum_k u[b, k]**2

the Switch Transformer's K sum_k f_k P_k (Fedus et al. 2021) with the dispatch fraction f_k replaced by the soft
load P_k = u (a dense mixture dispatches nothing; this variant is differentiable in every weight). Per branch it is
1 when the load is balanced (u = 1/K) and K when one expert takes every row; it pushes the batch load towards
balance while leaving each sample free to specialise (its per-sample entropy is not penalised).

Signals (`moe_signals`, one thread, every learner step after `moe_usage` of the online forward's s rows; no
atomics, no host sync; float64 arithmetic): the balance term's mean over the branches, (1 / 4) sum_b K sum_k u^2,
joins the epoch sums (epoch stat moe_balance); the utilisation of expert k averaged over the branches, the per-sample
gate entropy / ln K averaged over the branches (clamped to [0, 1]) and the largest utilisation of a branch averaged
over the branches (clamped to [1/K, 1]) are folded into ISV[MOE_UTIL_EMA_k], ISV[MOE_GATE_ENTROPY_EMA] and
ISV[MOE_MAX_UTIL_EMA] with alpha MOE_ALPHA; while ISV[MOE_MAX_UTIL_EMA] is 0 (no observation in this fold: the fold
reset writes 0) the observation seeds them. Then the controller (the seed's "EMA-tracked diagnostic drives a
controller" pattern, as moe_lambda_eff_kernel):

    i      = (ISV[MOE_MAX_UTIL_EMA] - 1/K) / (1 - 1/K)                 load imbalance in [0, 1]
    lambda = clamp(lambda exp(MOE_LAMBDA_GAIN (i - MOE_IMBALANCE_TARGET)), MOE_LAMBDA_FLOOR, MOE_LAMBDA_CEIL)

Why this shape: the log of lambda integrates the imbalance error, so lambda grows while the load stays unbalanced
and decays back while it is balanced, multiplicatively (lambda spans decades); at full collapse (i = 1) it grows x10
in ~310 steps, on a balanced load (i = 0) it falls x10 in ~920 (quicker to defend than to relax). The floor keeps a
minimum pressure against collapse for good, the ceiling keeps the balance term from drowning the C51 loss (the
DESIGN rule: every adaptive multiplier has a permanent floor and cap). MOE_IMBALANCE_TARGET = 0.25 tolerates, e.g.
with K = 4, one expert taking 44% of a branch's load where 25% is even. A non-finite observation moves no slot.

Launch shapes: the softmax one thread per (row, branch); the mixture and the expert gradient one thread per output
element; the gate gradient one thread per (row, branch) (it loops over the branch's (1 + n_b) Z columns per expert);
`moe_usage` one block of strided_threads(STATS_BLOCK) threads per utilisation column and per branch entropy (thread t
sums rows t, t + blockDim, ... in float64, then a shared-memory tree: deterministic, no atomics); `moe_signals` one
thread. float32 literals throughout the float32 kernels.
"""

from __future__ import annotations

import math
from typing import Any

from numba import cuda, float32, float64, int32

from fox_numba.actions import N_BRANCHES
from fox_numba.config import INT_CHOICES
from fox_numba.device.isv import ISV_TOTAL_DIM, MOE_LAMBDA_BASE, MOE_MAX_EXPERTS, Isv
from fox_numba.device.launch import check_array, i32, launch, launch_rows, strided_threads
from fox_numba.device.registry import register
from fox_numba.kernels.heads import N_AUX, N_STREAMS, branch_span, column_branch, head_width
from fox_numba.kernels.signals import STATS_BLOCK, EpochStat, check_epoch, finite, tree_sums

MIN_EXPERTS = min(k for k in INT_CHOICES["network.moe_experts"] if k)
"""Fewest experts of a mixture (network.moe_experts is 0, off, or MIN_EXPERTS .. MOE_MAX_EXPERTS; config.py)."""
MOE_ALPHA = 0.01
"""EMA weight of the utilisation, entropy and max-utilisation signals."""
MOE_LAMBDA_GAIN = 0.01
"""Per-step log-rate of the lambda controller per unit of imbalance error."""
MOE_IMBALANCE_TARGET = 0.25
"""Load imbalance i in [0, 1] the controller holds lambda steady at."""
MOE_LAMBDA_FLOOR = 0.001
"""Permanent floor of ISV[MOE_LAMBDA_EFF]."""
MOE_LAMBDA_CEIL = 1.0
"""Permanent ceiling of ISV[MOE_LAMBDA_EFF]."""
assert MOE_LAMBDA_FLOOR <= MOE_LAMBDA_BASE <= MOE_LAMBDA_CEIL

_UTIL0 = int(Isv.MOE_UTIL_EMA_0)
_ENTROPY = int(Isv.MOE_GATE_ENTROPY_EMA)
_MAX_UTIL = int(Isv.MOE_MAX_UTIL_EMA)
_LAMBDA = int(Isv.MOE_LAMBDA_EFF)
_BALANCE = int(EpochStat.MOE_BALANCE)
_F1 = float32[::1]
_F2 = float32[:, ::1]
_D1 = float64[::1]


@register((_F2,))
@cuda.jit
def moe_gate_softmax_kernel(g):
    """g[r, b K : (b + 1) K] = softmax of itself (max subtracted), one thread per (row, branch)."""
    i = cuda.grid(1)
    if i < g.shape[0] * N_BRANCHES:
        r = i // N_BRANCHES
        n = g.shape[1] // N_BRANCHES
        base = (i - r * N_BRANCHES) * n
        top = g[r, base]
        for k in range(1, n):
            top = max(top, g[r, base + k])
        total = float32(0.0)
        for k in range(n):
            e = math.exp(g[r, base + k] - top)
            g[r, base + k] = e
            total += e
        inv = float32(1.0) / total
        for k in range(n):
            g[r, base + k] *= inv


@register((_F2, _F2, _F2))
@cuda.jit
def moe_mix_kernel(e, g, out):
    """out[r, c] = sum_k g[r, b(c) K + k] e[r, k HW + c]; the auxiliary columns the experts' mean."""
    i = cuda.grid(1)
    hw = out.shape[1]
    if i < out.shape[0] * hw:
        r = i // hw
        c = i - r * hw
        n = g.shape[1] // N_BRANCHES
        z = (hw - N_AUX) // N_STREAMS
        acc = float32(0.0)
        if c >= N_STREAMS * z:
            for k in range(n):
                acc += e[r, k * hw + c]
            acc /= float32(n)
        else:
            base = column_branch(c, z) * n
            for k in range(n):
                acc += g[r, base + k] * e[r, k * hw + c]
        out[r, c] = acc


@register((_F2, _F2, _F2))
@cuda.jit
def moe_expert_grad_kernel(dout, g, de):
    """de[r, k HW + c] = g[r, b(c) K + k] dout[r, c]; the auxiliary columns dout / K."""
    i = cuda.grid(1)
    width = de.shape[1]
    if i < de.shape[0] * width:
        r = i // width
        j = i - r * width
        hw = dout.shape[1]
        k = j // hw
        c = j - k * hw
        n = g.shape[1] // N_BRANCHES
        z = (hw - N_AUX) // N_STREAMS
        if c >= N_STREAMS * z:
            de[r, j] = dout[r, c] / float32(n)
        else:
            de[r, j] = g[r, column_branch(c, z) * n + k] * dout[r, c]


@cuda.jit(device=True)
def _stream_dot(dout, e, r, col0, ecol0, z):
    """sum_{c < z} dout[r, col0 + c] e[r, ecol0 + c]."""
    s = float32(0.0)
    for c in range(z):
        s += dout[r, col0 + c] * e[r, ecol0 + c]
    return s


@register((_F2, _F2, _F2, _F1, _F1, _F2))
@cuda.jit
def moe_gate_grad_kernel(dout, e, g, usage, isv, dg):
    """dg[r, b K + k] = w_k (dw_k - sum_j w_j dw_j), dw_k the mixture's and the balance loss's dL/dw (module header);
    one thread per (row, branch) of dg's G rows."""
    i = cuda.grid(1)
    if i < dg.shape[0] * N_BRANCHES:
        r = i // N_BRANCHES
        b = i - r * N_BRANCHES
        n = dg.shape[1] // N_BRANCHES
        hw = dout.shape[1]
        z = (hw - N_AUX) // N_STREAMS
        first, size = branch_span(b)
        balance = isv[_LAMBDA] * float32(2.0) * float32(n) / float32(dg.shape[0])
        dot = float32(0.0)
        col = (first + b) * z  # the branch's value stream, then its advantage streams (kernels/heads.py)
        for k in range(n):
            s = _stream_dot(dout, e, r, col, k * hw + col, (1 + size) * z)
            s += balance * usage[b * n + k]
            dg[r, b * n + k] = s
            dot += g[r, b * n + k] * s
        for k in range(n):
            dg[r, b * n + k] = g[r, b * n + k] * (dg[r, b * n + k] - dot)


@register((_F2, int32, _F1))
@cuda.jit
def moe_usage_kernel(g, n_rows, usage):
    """Block j < 4K: usage[j] = mean of g[:n_rows, j]; block 4K + b: usage[4K + b] = the mean per-row entropy
    -sum_k w_k ln w_k of branch b's gate."""
    tid = cuda.threadIdx.x
    j = cuda.blockIdx.x
    width = g.shape[1]
    n = width // N_BRANCHES
    acc = cuda.shared.array((1, STATS_BLOCK), float64)
    acc[0, tid] = float64(0.0)
    r = tid
    while r < n_rows:
        if j < width:
            acc[0, tid] += float64(g[r, j])
        else:
            base = (j - width) * n
            h = float64(0.0)
            for k in range(n):
                p = float64(g[r, base + k])
                if p > float64(0.0) or math.isnan(p):  # a NaN weight reaches the sum (and skips the signals)
                    h -= p * math.log(p)
            acc[0, tid] += h
        r += cuda.blockDim.x
    tree_sums(acc, 1, tid)
    if tid == 0:
        usage[j] = float32(acc[0, 0] / float64(n_rows))


@register((_F1, int32, _F1, _D1))
@cuda.jit
def moe_signals_kernel(usage, n, isv, epoch):
    """The epoch's balance term, the EMAs of ISV 118-127 and the lambda controller of ISV 128 (module header); one
    thread."""
    if cuda.grid(1) != 0:
        return
    kk = float64(n)
    top_sum = float64(0.0)
    balance = float64(0.0)
    entropy = float64(0.0)
    for b in range(N_BRANCHES):
        top = float64(usage[b * n])
        sq = float64(0.0)
        for k in range(n):
            p = float64(usage[b * n + k])
            if math.isnan(p) or p > top:
                top = p
            sq += p * p
        top_sum += top
        balance += kk * sq
        entropy += float64(usage[N_BRANCHES * n + b])
    nb = float64(N_BRANCHES)
    m = top_sum / nb
    h = entropy / (nb * math.log(kk))
    balance /= nb
    if not (finite(m) and finite(h) and finite(balance)):
        return
    epoch[_BALANCE] += balance
    m32 = float32(min(max(m, float64(1.0) / kk), float64(1.0)))
    h32 = float32(min(max(h, float64(0.0)), float64(1.0)))
    alpha = float32(MOE_ALPHA)
    seed = isv[_MAX_UTIL] == float32(0.0)
    for k in range(n):
        u = float64(0.0)
        for b in range(N_BRANCHES):
            u += float64(usage[b * n + k])
        u32 = float32(u / nb)
        if seed:
            isv[_UTIL0 + k] = u32
        else:
            isv[_UTIL0 + k] += alpha * (u32 - isv[_UTIL0 + k])
    if seed:
        isv[_ENTROPY] = h32
        isv[_MAX_UTIL] = m32
    else:
        isv[_ENTROPY] += alpha * (h32 - isv[_ENTROPY])
        isv[_MAX_UTIL] += alpha * (m32 - isv[_MAX_UTIL])
    imbalance = (float64(isv[_MAX_UTIL]) - float64(1.0) / kk) / (float64(1.0) - float64(1.0) / kk)
    lam = float64(isv[_LAMBDA]) * math.exp(MOE_LAMBDA_GAIN * (imbalance - MOE_IMBALANCE_TARGET))
    isv[_LAMBDA] = float32(min(max(lam, MOE_LAMBDA_FLOOR), MOE_LAMBDA_CEIL))


def check_experts(n_experts: int) -> None:
    """Refuse a mixture size outside MIN_EXPERTS .. MOE_MAX_EXPERTS (one utilisation slot per expert)."""
    if not MIN_EXPERTS <= n_experts <= MOE_MAX_EXPERTS:
        raise ValueError(f"a mixture of experts needs {MIN_EXPERTS} .. {MOE_MAX_EXPERTS} experts, got {n_experts}")


def _experts_of(g: Any, rows: int) -> int:
    """K of a gate array g [>= rows, 4K]."""
    check_array("g", g, "[rows, 4K]", None)
    width = int(g.shape[1])
    if width % N_BRANCHES or int(g.shape[0]) < rows:
        raise ValueError(f"gate of shape {tuple(g.shape)}: need {N_BRANCHES} K columns and >= {rows} rows")
    check_experts(width // N_BRANCHES)
    return width // N_BRANCHES


def _check_heads(out: Any, e: Any, n_experts: int, rows: int) -> int:
    """HW of head outputs out [rows, HW] and expert outputs e [>= rows, K HW]."""
    check_array("out", out, "[rows, HW]", None)
    hw = int(out.shape[1])
    if int(out.shape[0]) != rows or (hw - N_AUX) % N_STREAMS or hw != head_width((hw - N_AUX) // N_STREAMS):
        raise ValueError(f"head rows of shape {tuple(out.shape)}: need [{rows}, head_width(Z)]")
    check_array("e", e, "[rows, K HW]", None)
    if int(e.shape[0]) < rows or int(e.shape[1]) != n_experts * hw:
        raise ValueError(f"expert outputs of shape {tuple(e.shape)}: need >= {rows} rows of {n_experts} x {hw}")
    return hw


def moe_gate_softmax(g: Any, *, stream: Any) -> None:
    """g [R, 4K]: each branch's gate logits become their softmax weights, in place."""
    _experts_of(g, 1)
    launch(moe_gate_softmax_kernel, int(g.shape[0]) * N_BRANCHES, g, stream=stream)


def moe_mix(e: Any, g: Any, out: Any, *, stream: Any) -> None:
    """out [R, HW] = the mixture of the experts' head outputs e [R, K HW] under the gate weights g [R, 4K]."""
    rows = int(out.shape[0])
    n_experts = _experts_of(g, rows)
    hw = _check_heads(out, e, n_experts, rows)
    if int(g.shape[0]) != rows or int(e.shape[0]) != rows:
        raise ValueError(f"moe_mix: e, g and out need {rows} rows each")
    launch(moe_mix_kernel, rows * hw, e, g, out, stream=stream)


def moe_expert_grad(dout: Any, g: Any, de: Any, *, stream: Any) -> None:
    """de [G, K HW] = dL/d(expert outputs) of the first G rows, from dout [G, HW]; g [G, 4K] their gate weights."""
    rows = int(dout.shape[0])
    n_experts = _experts_of(g, rows)
    _check_heads(dout, de, n_experts, rows)
    if int(de.shape[0]) != rows or int(g.shape[0]) != rows:
        raise ValueError(f"moe_expert_grad: g and de need {rows} rows (dout's)")
    launch(moe_expert_grad_kernel, int(de.size), dout, g, de, stream=stream)


def moe_gate_grad(dout: Any, e: Any, g: Any, usage: Any, isv: Any, dg: Any, *, stream: Any) -> None:
    """dg [G, 4K] = dL/d(gate logits) of the first G rows: the mixture's gradient from dout [G, HW] and the experts'
    outputs e [G, K HW], plus ISV[MOE_LAMBDA_EFF] times the balance loss's from usage [4K + 4] (`moe_usage` of the
    same G rows); g [G, 4K] their gate weights."""
    rows = int(dout.shape[0])
    n_experts = _experts_of(g, rows)
    _check_heads(dout, e, n_experts, rows)
    if int(e.shape[0]) != rows or int(g.shape[0]) != rows:
        raise ValueError(f"moe_gate_grad: e and g need {rows} rows (dout's)")
    check_array("usage", usage, "[4K + 4]", ((n_experts + 1) * N_BRANCHES,))
    check_array("isv", isv, "[ISV_TOTAL_DIM]", (ISV_TOTAL_DIM,))
    check_array("dg", dg, "[G, 4K]", (rows, n_experts * N_BRANCHES))
    launch(moe_gate_grad_kernel, rows * N_BRANCHES, dout, e, g, usage, isv, dg, stream=stream)


def moe_usage(g: Any, usage: Any, *, n_rows: int, stream: Any) -> None:
    """usage [4K + 4]: the mean gate weight of every (branch, expert) column over the first n_rows rows of g [R, 4K],
    then each branch's mean per-row gate entropy."""
    if n_rows < 1:
        raise ValueError(f"moe_usage: n_rows must be >= 1, got {n_rows}")
    n_experts = _experts_of(g, n_rows)
    check_array("usage", usage, "[4K + 4]", ((n_experts + 1) * N_BRANCHES,))
    launch_rows(moe_usage_kernel, int(usage.shape[0]), strided_threads(STATS_BLOCK), g, i32(n_rows), usage,
                stream=stream)


def moe_signals(usage: Any, isv: Any, epoch: Any, *, n_experts: int, stream: Any) -> None:
    """Fold `moe_usage`'s usage [4K + 4] into ISV 118-127, step the lambda controller (ISV 128) and add the balance
    term to epoch[MOE_BALANCE] (module header)."""
    check_experts(n_experts)
    check_array("usage", usage, "[4K + 4]", ((n_experts + 1) * N_BRANCHES,))
    check_array("isv", isv, "[ISV_TOTAL_DIM]", (ISV_TOTAL_DIM,))
    check_epoch(epoch)
    launch_rows(moe_signals_kernel, 1, 1, usage, i32(n_experts), isv, epoch, stream=stream)
