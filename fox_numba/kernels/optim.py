"""Optimiser kernels that run inside the captured training step: gradient norm, adaptive clip, Adam, Polyak.

One training step launches, in order: grad_sq_partials -> grad_norm_finish -> adaptive_clip_producer ->
adam_step (wrappers: global_grad_norm, update_adaptive_clip, adam_update), and polyak_update when the
target network follows.

Launch shapes:
- grad_sq_partials, adam_step, polyak_update: grid-stride over the parameters through `launch_strided`
  (one element per thread in blocks of NORM_BLOCK on the GPU; one block of 32 threads under the
  simulator, whose cost is per thread). Each block reduces its elements' squares (gradient; Adam's update;
  the target's distance to the online parameters and the online norm) in float64 through a shared-memory
  tree sized from blockDim, and writes one partial per block, in a fixed order.
- grad_norm_finish: one block (`launch_rows(.., 1, strided_threads(NORM_BLOCK), ..)`); thread j sums
  partials j, j + blockDim, ... in order, then the same tree. No atomics and no warp shuffles, so the
  norm has the same bits on every run of a build, and the simulator runs it.
- adaptive_clip_producer: one thread (`launch_rows(.., 1, 1, ..)`), a cold-path producer of ISV slots.

Where the per-step values live (a captured graph freezes kernel arguments):
- The optimiser state `state[0]` (OPTIM_STATE_DTYPE, device memory, written only by kernels of the
  step): `step` (gradient steps of the fold), `adam_t` (Adam updates applied since the last reset: the
  bias correction uses t = adam_t + 1, and a skipped step does not advance it), `lr` (the scheduled rate
  of this step, before the warm-up damping) and `tau` (this step's Polyak rate). The learner's schedule
  kernel writes lr and tau at the start of each step; nothing is written from the host per step.
- The ISV bus (GPU-written, GPU-read: adaptive signals never leave the device) carries GRAD_NORM_RAW,
  the EMAs, FOLD_WARMUP_FACTOR and CLIP_EFF. adam_step composes lr = state lr * max(LR_FLOOR, factor)
  itself and clips with ISV[CLIP_EFF].
- The observation counter of the warm-up bootstrap is ISV[GRAD_NORM_OBSERVED]; like the slow EMA it
  carries over folds, so a fold boundary (FAST_EMA and FACTOR reset to 0) damps at once instead of
  re-entering the 200-step bootstrap.
- beta1, beta2, eps, weight decay, clip_ema_mult and the warm-up rule (learner.warmup_rule: what the EMAs
  see, the raw or the clipped norm) are fixed per run: kernel arguments.
Constraints: float32 C-contiguous arrays (partials float64); literals are float32 (a Python float makes
the GPU compute in float64); slot indices are module constants taken from `Isv`. A non-finite gradient
norm is counted in ISV[NONFINITE_STEPS], leaves the EMAs alone and skips the Adam step and the Polyak
update entirely (parameters, moments and target keep their bits; their partials are then not written).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import cuda, float32, float64, from_dtype, int32

from fox_numba.device.elementwise import scale_f32
from fox_numba.device.isv import ISV_TOTAL_DIM, Isv
from fox_numba.device.launch import (
    check_array,
    grid_1d,
    i32,
    launch_rows,
    launch_strided,
    strided_blocks,
    strided_threads,
)
from fox_numba.device.registry import register
from fox_numba.errors import ConfigError

OPTIM_STATE_DTYPE = np.dtype(
    [
        ("step", np.int64),  # gradient steps taken since the last reset (the schedule's clock)
        ("adam_t", np.int64),  # Adam updates applied since the last reset (bias correction t = adam_t + 1)
        ("lr", np.float32),  # this step's scheduled learning rate, before the warm-up damping
        ("tau", np.float32),  # this step's Polyak rate of the target network
    ],
    align=True,
)
_STATE = from_dtype(OPTIM_STATE_DTYPE)

NORM_BLOCK = 256  # threads per block of the reductions on the GPU; a power of two (the tree halves it)

EMA_ALPHA = np.float32(0.01)  # GRAD_NORM_EMA and CLIP_ENGAGED_EMA
FAST_ALPHA = np.float32(0.1)
SLOW_ALPHA = np.float32(0.001)
SLOW_DOWN_ALPHA = np.float32(0.02)  # the damped rule: the slow baseline follows a raw norm below it this fast
WARMUP_MIN_OBSERVED = np.float32(200.0)  # bootstrap: factor 1 below this many observations
SLOW_EMA_MIN = np.float32(1e-6)  # bootstrap: factor 1 while the slow EMA is below this
OBSERVED_CAP = np.float32(2.0**24)  # float32 counts exactly up to here
LR_FLOOR = np.float32(0.05)  # lr = state lr * max(LR_FLOOR, factor)
CLIP_FLOOR = np.float32(0.1)  # clip_eff = clip_base * (CLIP_FLOOR + (1 - CLIP_FLOOR) * factor)
CLIP_TINY = np.float32(1e-12)  # clip_eff never reaches 0
NORM_EPS = np.float32(1e-12)  # clip scale = min(1, clip_eff / (norm + NORM_EPS))
ADAM_SHRINK_M = np.float32(0.1)  # fold boundary: keep the direction of m ...
ADAM_SHRINK_V = np.float32(0.01)  # ... and damp the magnitude history of v
WARMUP_SEED = 0  # adaptive_clip_producer rule: the EMAs take the raw gradient norm (the seed's formula)
WARMUP_DAMPED = 1  # ... the EMAs take the clipped norm min(raw, CLIP_EFF)
WARMUP_RULES = {"seed": WARMUP_SEED, "damped": WARMUP_DAMPED}  # learner.warmup_rule -> kernel argument

_RAW = int(Isv.GRAD_NORM_RAW)
_EMA = int(Isv.GRAD_NORM_EMA)
_FAST = int(Isv.GRAD_NORM_FAST_EMA)
_SLOW = int(Isv.GRAD_NORM_SLOW_EMA)
_ENGAGED = int(Isv.CLIP_ENGAGED_EMA)
_NONFINITE = int(Isv.NONFINITE_STEPS)
_OBSERVED = int(Isv.GRAD_NORM_OBSERVED)
_CLIP_EFF = int(Isv.CLIP_EFF)
_FACTOR = int(Isv.FOLD_WARMUP_FACTOR)


@cuda.jit(device=True)
def _tree_sum(acc, tid):
    """Sum acc[0:blockDim] into acc[0] by halving (blockDim a power of two); every thread calls it."""
    cuda.syncthreads()
    s = cuda.blockDim.x // 2
    while s > 0:
        if tid < s:
            acc[tid] += acc[tid + s]
        cuda.syncthreads()
        s //= 2


@cuda.jit(device=True)
def _finite(x):
    return not (math.isinf(x) or math.isnan(x))


@register((float32[::1], float64[::1], int32))
@cuda.jit
def grad_sq_partials(grad, partials, n):
    """partials[b] = sum of grad[i]**2 over block b's elements, in float64 (pass 1 of the norm)."""
    tid = cuda.threadIdx.x
    acc = cuda.shared.array(NORM_BLOCK, float64)
    s = float64(0.0)
    i = cuda.grid(1)
    while i < n:
        g = float64(grad[i])
        s += g * g
        i += cuda.gridsize(1)
    acc[tid] = s
    _tree_sum(acc, tid)
    if tid == 0:
        partials[cuda.blockIdx.x] = acc[0]


@register((float64[::1], float32[::1], int32))
@cuda.jit
def grad_norm_finish(partials, isv, n_partials):
    """ISV[GRAD_NORM_RAW] = sqrt(sum of partials); a non-finite norm adds 1 to ISV[NONFINITE_STEPS]."""
    tid = cuda.threadIdx.x
    acc = cuda.shared.array(NORM_BLOCK, float64)
    s = float64(0.0)
    j = tid
    while j < n_partials:
        s += partials[j]
        j += cuda.blockDim.x
    acc[tid] = s
    _tree_sum(acc, tid)
    if tid == 0:
        norm = float32(math.sqrt(acc[0]))
        isv[_RAW] = norm
        if not _finite(norm):
            isv[_NONFINITE] += float32(1.0)


@register((float32[::1], float32, int32))
@cuda.jit
def adaptive_clip_producer(isv, clip_ema_mult, rule):
    """Write FOLD_WARMUP_FACTOR, CLIP_EFF and CLIP_ENGAGED_EMA, then fold this step's norm into the EMAs.

    The factor and the clip come from the EMAs before this step's norm joins them (as in the seed, where
    the clip of step t came from norms up to t - 1), so a spike is clipped against the history. The first
    finite observation seeds GRAD_NORM_EMA and the slow EMA (while 0); the fast EMA is not seeded, so after
    a fold reset it climbs from 0 and the factor (fast / slow) damps lr and clip for ~20-50 steps.

    rule WARMUP_SEED (0): the EMAs take the raw norm (the seed's formula). rule WARMUP_DAMPED (1): they
    take the clipped norm min(raw, CLIP_EFF), the gradient Adam actually receives, so a spike moves the
    clip base by at most EMA_ALPHA * (clip_ema_mult - 1) per step; and the slow baseline follows a raw norm
    below it at SLOW_DOWN_ALPHA (20x its rise), so a fold whose gradients are genuinely smaller re-baselines
    within ~50 steps. Without that, a fold starting at a third of the old scale kept the factor small, the
    clip at 0.2 x EMA, and the EMAs fed that clip shrank it further until it reached CLIP_TINY (seen on the
    default market). The baseline therefore sits on the low side of the norms (about their lower quartile
    under lognormal noise): a stale, high baseline pins the factor near 0, a low one costs nothing (the
    factor is capped at 1).
    """
    raw = isv[_RAW]
    finite = not (math.isinf(raw) or math.isnan(raw))
    if finite and isv[_EMA] == float32(0.0):
        isv[_EMA] = raw
    if finite and isv[_SLOW] == float32(0.0):
        isv[_SLOW] = raw
    ema = isv[_EMA]
    fast = isv[_FAST]
    slow = isv[_SLOW]
    factor = float32(1.0)
    if isv[_OBSERVED] >= WARMUP_MIN_OBSERVED and slow >= SLOW_EMA_MIN:
        factor = min(max(fast / slow, float32(0.0)), float32(1.0))
    isv[_FACTOR] = factor
    clip = max(ema * clip_ema_mult * (CLIP_FLOOR + (float32(1.0) - CLIP_FLOOR) * factor), CLIP_TINY)
    isv[_CLIP_EFF] = clip
    if finite:
        engaged = float32(1.0) if raw > clip else float32(0.0)
        isv[_ENGAGED] += EMA_ALPHA * (engaged - isv[_ENGAGED])
        seen = raw
        if rule == WARMUP_DAMPED:
            seen = min(raw, clip)
        isv[_EMA] = ema + EMA_ALPHA * (seen - ema)
        isv[_FAST] = fast + FAST_ALPHA * (seen - fast)
        slow_alpha = SLOW_ALPHA
        if rule == WARMUP_DAMPED and raw < slow:
            slow_alpha = SLOW_DOWN_ALPHA
        isv[_SLOW] = slow + slow_alpha * (seen - slow)
        isv[_OBSERVED] = min(isv[_OBSERVED] + float32(1.0), OBSERVED_CAP)


@register(
    (float32[::1], float32[::1], float32[::1], float32[::1], float32[::1], float32[::1], _STATE[::1],
     float64[::1], float32, float32, float32, float32, int32)
)
@cuda.jit
def adam_step(params, grads, m, v, decay_mask, isv, state, partials, beta1, beta2, eps, weight_decay, n):
    """One AdamW step on the clipped gradient; nothing written when GRAD_NORM_RAW is not finite.

    g = grad * min(1, CLIP_EFF / (norm + 1e-12)); m, v the usual moments; bias corrections
    1 - beta**t = -expm1(t * log(beta)) (accurate in float32 for small t), t = state adam_t + 1;
    lr = state lr * max(0.05, FOLD_WARMUP_FACTOR); update u = lr * (m_hat / (sqrt(v_hat) + eps) +
    weight_decay * decay_mask * param) (decoupled weight decay; decay_mask 0 on biases, and the learner's holds each
    element's rate, with weight_decay 1); param -= u.
    partials[block] = the float64 sum of u**2 over the block's parameters (UPDATE_RMS_EMA).
    """
    tid = cuda.threadIdx.x
    norm = isv[_RAW]
    if not _finite(norm):
        return
    acc = cuda.shared.array(NORM_BLOCK, float64)
    scale = min(float32(1.0), isv[_CLIP_EFF] / (norm + NORM_EPS))
    t = float32(state[0].adam_t + 1)
    bc1 = -math.expm1(t * math.log(beta1))
    bc2 = -math.expm1(t * math.log(beta2))
    lr = state[0].lr * max(LR_FLOOR, isv[_FACTOR])
    s = float64(0.0)
    i = cuda.grid(1)
    while i < n:
        g = grads[i] * scale
        mi = beta1 * m[i] + (float32(1.0) - beta1) * g
        vi = beta2 * v[i] + (float32(1.0) - beta2) * (g * g)
        m[i] = mi
        v[i] = vi
        p = params[i]
        u = lr * ((mi / bc1) / (math.sqrt(vi / bc2) + eps) + weight_decay * decay_mask[i] * p)
        params[i] = p - u
        s += float64(u) * float64(u)
        i += cuda.gridsize(1)
    acc[tid] = s
    _tree_sum(acc, tid)
    if tid == 0:
        partials[cuda.blockIdx.x] = acc[0]


@register((float32[::1], float32[::1], float32[::1], _STATE[::1], float64[:, ::1], int32))
@cuda.jit
def polyak_update(target, online, isv, state, partials, n):
    """target += tau * (online - target), tau = state[0].tau; untouched when GRAD_NORM_RAW is not finite.

    partials[block] = (sum of (target - online)**2 after the update, sum of online**2) over the block's
    parameters, in float64 (TARGET_DRIFT_EMA and PARAM_NORM).
    """
    tid = cuda.threadIdx.x
    if not _finite(isv[_RAW]):
        return
    acc_d = cuda.shared.array(NORM_BLOCK, float64)
    acc_p = cuda.shared.array(NORM_BLOCK, float64)
    tau = state[0].tau
    d2 = float64(0.0)
    p2 = float64(0.0)
    i = cuda.grid(1)
    while i < n:
        o = online[i]
        t = target[i] + tau * (o - target[i])
        target[i] = t
        d = float64(t) - float64(o)
        d2 += d * d
        p2 += float64(o) * float64(o)
        i += cuda.gridsize(1)
    acc_d[tid] = d2
    acc_p[tid] = p2
    cuda.syncthreads()
    s = cuda.blockDim.x // 2
    while s > 0:
        if tid < s:
            acc_d[tid] += acc_d[tid + s]
            acc_p[tid] += acc_p[tid + s]
        cuda.syncthreads()
        s //= 2
    if tid == 0:
        partials[cuda.blockIdx.x, 0] = acc_d[0]
        partials[cuda.blockIdx.x, 1] = acc_p[0]


def norm_partials_len(n: int) -> int:
    """Length of the float64 partials buffers of the reductions over `n` parameters (gradient norm, Adam,
    Polyak): the GPU's block count; the simulator uses the first partial only."""
    return grid_1d(n, NORM_BLOCK)


def partials_used(n: int) -> int:
    """Partials the reductions over `n` parameters write on this platform (their finish kernels sum these)."""
    return strided_blocks(n, NORM_BLOCK)


def _check_isv(isv: Any) -> None:
    check_array("isv", isv, "[ISV_TOTAL_DIM]", (ISV_TOTAL_DIM,))


def check_state(state: Any) -> None:
    check_array("state", state, "[1] OPTIM_STATE_DTYPE", (1,), OPTIM_STATE_DTYPE)


def global_grad_norm(grad: Any, partials: Any, isv: Any, *, stream: Any) -> None:
    """ISV[GRAD_NORM_RAW] = ||grad||_2 (two deterministic passes through `partials`, float64
    [norm_partials_len(n)]); a non-finite norm adds 1 to ISV[NONFINITE_STEPS]."""
    n = grad.shape[0]
    check_array("grad", grad, "[n]", (n,))
    k = norm_partials_len(n)
    check_array("partials", partials, "[norm_partials_len(n)]", (k,), np.float64)
    _check_isv(isv)
    launch_strided(grad_sq_partials, n, grad, partials, i32(n), stream=stream, block=NORM_BLOCK)
    launch_rows(grad_norm_finish, 1, strided_threads(NORM_BLOCK), partials, isv, i32(partials_used(n)),
                stream=stream)


def warmup_rule_code(name: str) -> int:
    """The kernel argument of a `learner.warmup_rule` name; a ConfigError naming the choices otherwise."""
    if name not in WARMUP_RULES:
        raise ConfigError(f"learner.warmup_rule is {name!r}; choose one of {', '.join(map(repr, WARMUP_RULES))}")
    return WARMUP_RULES[name]


def update_adaptive_clip(isv: Any, clip_ema_mult: float, *, stream: Any, warmup_rule: str = "damped") -> None:
    """Run the adaptive-clip producer on the last GRAD_NORM_RAW (clip_ema_mult and warmup_rule:
    LearnerConfig's)."""
    _check_isv(isv)
    if not clip_ema_mult > 0:
        raise ValueError(f"clip_ema_mult must be > 0, got {clip_ema_mult}")
    rule = warmup_rule_code(warmup_rule)
    launch_rows(adaptive_clip_producer, 1, 1, isv, np.float32(clip_ema_mult), i32(rule), stream=stream)


def adam_update(
    params: Any, grads: Any, m: Any, v: Any, decay_mask: Any, isv: Any, state: Any, partials: Any, *,
    beta1: float, beta2: float, eps: float, weight_decay: float, stream: Any,
) -> None:
    """One AdamW step of `params` with the clip, step and lr described in the module header; `partials`
    (float64 [norm_partials_len(n)]) receives the per-block sums of the squared update."""
    n = params.shape[0]
    for name, arr in (("params", params), ("grads", grads), ("m", m), ("v", v), ("decay_mask", decay_mask)):
        check_array(name, arr, "[n]", (n,))
    _check_isv(isv)
    check_state(state)
    check_array("partials", partials, "[norm_partials_len(n)]", (norm_partials_len(n),), np.float64)
    if not (0 < beta1 < 1 and 0 < beta2 < 1 and eps > 0 and weight_decay >= 0):
        raise ValueError(
            f"Adam needs 0 < beta1, beta2 < 1, eps > 0 and weight_decay >= 0, got {beta1}, {beta2}, {eps}, "
            f"{weight_decay}"
        )
    launch_strided(adam_step, n, params, grads, m, v, decay_mask, isv, state, partials, np.float32(beta1),
                   np.float32(beta2), np.float32(eps), np.float32(weight_decay), i32(n), stream=stream,
                   block=NORM_BLOCK)


def polyak(target: Any, online: Any, isv: Any, state: Any, partials: Any, *, stream: Any) -> None:
    """target += state tau * (online - target) unless the step is non-finite; `partials` (float64
    [norm_partials_len(n), 2]) receives the per-block drift and online-norm sums."""
    n = online.shape[0]
    check_array("target", target, "[n]", (n,))
    check_array("online", online, "[n]", (n,))
    _check_isv(isv)
    check_state(state)
    check_array("partials", partials, "[norm_partials_len(n), 2]", (norm_partials_len(n), 2), np.float64)
    launch_strided(polyak_update, n, target, online, isv, state, partials, i32(n), stream=stream,
                   block=NORM_BLOCK)


def shrink_adam_moments(m: Any, v: Any, *, stream: Any) -> None:
    """Fold boundary: m *= ADAM_SHRINK_M, v *= ADAM_SHRINK_V (direction kept, magnitude history damped);
    the learner also restarts the optimiser state's adam_t so the bias correction starts again."""
    n = m.shape[0]
    check_array("m", m, "[n]", (n,))
    check_array("v", v, "[n]", (n,))
    launch_strided(scale_f32, n, m, ADAM_SHRINK_M, i32(n), stream=stream)
    launch_strided(scale_f32, n, v, ADAM_SHRINK_V, i32(n), stream=stream)
