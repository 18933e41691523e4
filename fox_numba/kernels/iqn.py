"""Implicit-quantile (IQN) head kernels (network.iqn_quantiles > 0), in the order the learner's step launches them.

    draw_taus(states, taus, stream=s)                       taus [2, B, N]: online, then target quantile levels
    cos_embed(taus, cos, stream=s)                          cos [R, E] = cos(pi j tau_r), j < E
    (phi = ReLU(cos @ W_e + b_e): a dense layer, agent/dense.py)
    modulate(x, phi, h, stream=s)                           h [R, W] = x[r // N] * phi[r]
    (Z = h @ W_q + b_q [R, 13]: a dense layer)
    quantile_loss(z, z_tgt, taus, q, actions, rows, weight, loss, dz, bootstrap=b, stream=s)   loss [4B], dz [R, 13]
    loss_signal(loss, weights, isv, epoch, stream=s)        ISV[IQN_LOSS_EMA] and the epoch's LOSS_IQN
    (dW_q, db_q, dh: dense backward)
    modulate_backward(dh, x, phi, dphi, dx, mask=m, stream=s)   dphi [R, W] and the shared input's dx [B, W]
    (dW_e, db_e: dense weight gradient)
acting (collect and evaluation; agent/iqn.py IqnActor):
    act_levels(states, taus, n_mid, explore=e, stream=s)   taus [B, L]: the midpoints, then (collect) 4 draws
    (the head's forward on the B * L rows)
    direction_values(z, values, n_mid, stream=s)           values [B, 2, 4]: E_IQN and the sampled quantiles

Rows: B samples x N quantile levels, row r = i * N + k (sample i, level k), R = B * N. x [B, W] is the input the
C51 heads read (the trunk's last layer, or the observation without a trunk), A = 13 action heads (one quantile
value each; no dueling).

The head (Dabney et al. 2018): phi_j(tau) = ReLU(sum_i cos(pi i tau) W_e[i, j] + b_e[j]),
Z(x, tau)[a] = sum_j x_j phi_j(tau) W_q[j, a] + b_q[a].

The loss, per branch row r = i * 4 + b (the C51 loss's rows, kernels/learner.py) with a_t the taken head of branch
b and a* = `greedy_next` (the same double-DQN next head the C51 target uses): Z_k = Z(x_i, tau_k)[a_t] on the online
levels, T_j = rew_r + disc_r Z_target(x'_i, tau'_j)[a*] on the target levels, u_jk = T_j - Z_k, and

    loss_r = (1 / N) sum_k sum_j |tau_k - 1{u_jk < 0}| L(u_jk),  L(u) = u**2 / 2 if |u| <= 1 else |u| - 1/2
    dz[i * N + k, a_t] = -weight * weights[r] / N * sum_j |tau_k - 1{u_jk < 0}| clip(u_jk, -1, 1)

(the quantile Huber loss at kappa = 1, averaged over the N' = N target levels and summed over the online ones),
0 on the branch's other heads; weights[r] is the C51 row weight (branch weight x effect / B, x the importance
weight with prioritised replay). A non-finite u gives a NaN gradient, so the learner's non-finite guard skips the
step (a clipped gradient would hide an infinite target).

Draws: sample i's thread draws 2N uniforms from the learner's generator states[i] (numba xoroshiro, bit-exact
between the GPU and the simulator): N online levels, then N target levels, tau in [0, 1).

Acting: E_IQN[d] = (1 / K) sum_k Z(x, tau_k)[d] over the K = n_mid midpoints tau_k = (k + 1/2) / K (a fixed
quadrature of the mean over tau, so evaluation stays a deterministic function of the parameters); in collection
each direction d also gets its own level tau_d, drawn from the collector's generator of the environment (4
uniforms, before action selection's draws), and its quantile Z(x, tau_d)[d]: one sample of the IQN distribution
per direction, as the C51 Thompson draw is one atom per direction (kernels/action_select.py).
Launch shapes: grid-stride (`launch_strided`) over elements or rows; the level draws one thread per sample; the loss
signal one block (a fixed-order float64 sum, then the tree: deterministic, no atomics). float32 literals.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import cuda, float32, float64, int32
from numba.cuda.random import xoroshiro128p_type

from fox_numba.actions import DIR_OFFSET, N_BRANCHES, N_DIRECTIONS, N_HEADS
from fox_numba.device.isv import ISV_TOTAL_DIM, Isv
from fox_numba.device.launch import check_array, i32, launch, launch_rows, launch_strided, strided_threads
from fox_numba.device.registry import register
from fox_numba.device.rng import XOROSHIRO_DTYPE, xoroshiro128p_uniform_float32
from fox_numba.kernels.heads import branch_span
from fox_numba.kernels.learner import BOOTSTRAP_RULES, BranchRows, greedy_next
from fox_numba.kernels.signals import LOSS_ALPHA, STATS_BLOCK, EpochStat, check_epoch, ema, finite, tree_sums

_PI = np.float32(math.pi)
_INF = np.float32(np.inf)
_NAN = np.float32(np.nan)
_IQN_LOSS = int(Isv.IQN_LOSS_EMA)
_E_IQN = int(EpochStat.LOSS_IQN)
_F1 = float32[::1]
_F2 = float32[:, ::1]
_F3 = float32[:, :, ::1]


@register((xoroshiro128p_type[::1], _F3, int32))
@cuda.jit
def iqn_taus(states, taus, n_samples):
    """taus[0, i, :] then taus[1, i, :]: 2N uniforms in [0, 1) from states[i], one thread per sample."""
    i = cuda.grid(1)
    if i < n_samples:
        for net in range(2):
            for k in range(taus.shape[2]):
                taus[net, i, k] = xoroshiro128p_uniform_float32(states, i)


@register((xoroshiro128p_type[::1], _F2, int32, int32, int32))
@cuda.jit
def iqn_act_taus(states, taus, n_mid, explore, n_samples):
    """taus[i, k] = (k + 1/2) / n_mid for k < n_mid; when explore != 0, taus[i, n_mid + d] = a uniform from
    states[i] for the 4 directions d in order. One thread per sample."""
    i = cuda.grid(1)
    if i < n_samples:
        for k in range(n_mid):
            taus[i, k] = (float32(k) + float32(0.5)) / float32(n_mid)
        if explore != 0:
            for d in range(N_DIRECTIONS):
                taus[i, n_mid + d] = xoroshiro128p_uniform_float32(states, i)


@register((_F2, _F3, int32, int32))
@cuda.jit
def iqn_direction_values(z, values, n_mid, n):
    """For (i, d), n = B * 4, L = z.shape[0] // B levels per sample: values[i, 0, d] = the mean of z[i * L + k,
    DIR_OFFSET + d] over k < n_mid (summed in k order); values[i, 1, d] = z[i * L + n_mid + d, DIR_OFFSET + d]
    when L > n_mid (the sampled level of direction d), else values[i, 0, d]."""
    levels = z.shape[0] // values.shape[0]
    t = cuda.grid(1)
    while t < n:
        i = t // N_DIRECTIONS
        d = t - i * N_DIRECTIONS
        base = i * levels
        acc = float32(0.0)
        for k in range(n_mid):
            acc += z[base + k, DIR_OFFSET + d]
        mean = acc / float32(n_mid)
        values[i, 0, d] = mean
        values[i, 1, d] = z[base + n_mid + d, DIR_OFFSET + d] if levels > n_mid else mean
        t += cuda.gridsize(1)


@register((_F1, _F2, int32))
@cuda.jit
def iqn_cos(taus, cos, n):
    """cos[r, j] = cos(pi * j * taus[r]); n = R * E."""
    n_embed = cos.shape[1]
    t = cuda.grid(1)
    while t < n:
        r = t // n_embed
        j = t - r * n_embed
        cos[r, j] = math.cos(_PI * float32(j) * taus[r])
        t += cuda.gridsize(1)


@register((_F2, _F2, _F2, int32, int32))
@cuda.jit
def iqn_modulate(x, phi, h, n_taus, n):
    """h[r, w] = x[r // n_taus, w] * phi[r, w]; n = R * W."""
    width = h.shape[1]
    t = cuda.grid(1)
    while t < n:
        r = t // width
        w = t - r * width
        h[r, w] = x[r // n_taus, w] * phi[r, w]
        t += cuda.gridsize(1)


@register((_F2, _F2, _F2, _F2, int32[:, ::1], _F1, _F1, _F1, float32, int32, _F1, _F2, int32))
@cuda.jit
def iqn_quantile_loss(z, z_tgt, taus, q, actions, rewards, discounts, weights, weight, shared, loss, dz, n):
    """loss[r] and the rows of dz of branch row r (module header), one row per iteration; n = 4B."""
    n_samples = actions.shape[0]
    n_taus = taus.shape[1]
    inv_n = float32(1.0) / float32(n_taus)
    r = cuda.grid(1)
    while r < n:
        i = r // N_BRANCHES
        b = r - i * N_BRANCHES
        off, size = branch_span(b)
        bin_t = min(max(actions[i, b], 0), size - 1)
        a_t = off + bin_t
        a_n = greedy_next(q, n_samples, i, b, shared)
        reward = rewards[r]
        discount = discounts[r]
        scale = -weight * weights[r] * inv_n
        acc = float32(0.0)
        for k in range(n_taus):
            row = i * n_taus + k
            zk = z[row, a_t]
            tau = taus[i, k]
            g = float32(0.0)
            for j in range(n_taus):
                u = reward + discount * z_tgt[i * n_taus + j, a_n] - zk
                au = abs(u)
                level = abs(tau - float32(1.0)) if u < float32(0.0) else tau
                if au <= float32(1.0):
                    acc += level * (float32(0.5) * u * u)
                    g += level * u
                elif au < _INF:
                    acc += level * (au - float32(0.5))
                    g += level if u > float32(0.0) else -level
                else:  # NaN or infinite: a non-finite loss and gradient
                    acc += au
                    g += _NAN
            for h in range(size):
                dz[row, off + h] = scale * g if h == bin_t else float32(0.0)
        loss[r] = acc * inv_n
        r += cuda.gridsize(1)


@register((_F1, _F1, _F1, float64[::1], int32))
@cuda.jit
def iqn_loss_ema(loss, weights, isv, epoch, n):
    """One block: total = sum_r weights[r] * loss[r] in float64 (thread j sums rows j, j + blockDim, ... in
    order, then the tree); ISV[IQN_LOSS_EMA] += 0.01 (total - ISV) and epoch LOSS_IQN += total when finite."""
    tid = cuda.threadIdx.x
    acc = cuda.shared.array((1, STATS_BLOCK), float64)
    acc[0, tid] = float64(0.0)
    r = tid
    while r < n:
        acc[0, tid] += float64(weights[r]) * float64(loss[r])
        r += cuda.blockDim.x
    tree_sums(acc, 1, tid)
    if tid == 0:
        total = acc[0, 0]
        ema(isv, _IQN_LOSS, float32(total), LOSS_ALPHA)
        if finite(total):
            epoch[_E_IQN] += total


@register((_F2, _F2, _F2, _F2, _F2, int32, int32, int32))
@cuda.jit
def iqn_modulate_backward(dh, x, phi, dphi, dx, n_taus, mask, n):
    """For (i, w), n = B * W: dphi[r, w] = dh[r, w] * x[i, w] where phi[r, w] > 0 (the ReLU), else 0, for the
    rows r = i * n_taus + k; dx[i, w] = sum_k dh[r, w] * phi[r, w] in k order, 0 where x[i, w] <= 0 when
    mask != 0 (x a ReLU's output)."""
    width = dx.shape[1]
    t = cuda.grid(1)
    while t < n:
        i = t // width
        w = t - i * width
        xi = x[i, w]
        acc = float32(0.0)
        for k in range(n_taus):
            r = i * n_taus + k
            g = dh[r, w]
            p = phi[r, w]
            dphi[r, w] = g * xi if p > float32(0.0) else float32(0.0)
            acc += g * p
        if mask != 0 and not xi > float32(0.0):
            acc = float32(0.0)
        dx[i, w] = acc
        t += cuda.gridsize(1)


# ---- wrappers (check, then launch; they allocate nothing) ----------------------------------------------


def _shape(arr: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in arr.shape)


def _taus_shape(taus: Any) -> tuple[int, int]:
    if len(taus.shape) != 2 or min(taus.shape) < 1:
        raise ValueError(f"taus must be a float32 array [B, N] with no empty axis, got shape {_shape(taus)}")
    b, n = _shape(taus)
    check_array("taus", taus, "[B, N]", (b, n))
    return b, n


def draw_taus(states: Any, taus: Any, *, stream: Any) -> None:
    """taus [2, B, N] = the online (taus[0]) and target (taus[1]) quantile levels of this step, from the B
    generators `states` (each advances by 2N draws)."""
    if len(taus.shape) != 3 or taus.shape[0] != 2 or min(taus.shape) < 1:
        raise ValueError(f"taus must be a float32 array [2, B, N], got shape {_shape(taus)}")
    _, b, n = _shape(taus)
    check_array("taus", taus, "[2, B, N]", (2, b, n))
    check_array("states", states, "[B]", (b,), XOROSHIRO_DTYPE)
    launch(iqn_taus, b, states, taus, i32(b), stream=stream)


def cos_embed(taus: Any, cos: Any, *, stream: Any) -> None:
    """cos [R, E] = cos(pi j tau_r) of the levels taus [R] (a [B, N] array flattened)."""
    r = _shape(taus)[0]
    check_array("taus", taus, "[R]", (r,))
    if len(cos.shape) != 2 or cos.shape[0] != r or cos.shape[1] < 1:
        raise ValueError(f"cos must be a float32 array [R = {r}, E], got shape {_shape(cos)}")
    check_array("cos", cos, "[R, E]", _shape(cos))
    n = r * int(cos.shape[1])
    launch_strided(iqn_cos, n, taus, cos, i32(n), stream=stream)


def _rows(x: Any, phi: Any) -> tuple[int, int, int]:
    """(B, N, W) of x [B, W] and phi [B * N, W]."""
    if len(x.shape) != 2 or len(phi.shape) != 2 or min(x.shape) < 1 or phi.shape[1] != x.shape[1] or (
            phi.shape[0] % x.shape[0] or phi.shape[0] < 1):
        raise ValueError(f"x must be [B, W] and phi [B * N, W], got {_shape(x)} and {_shape(phi)}")
    b, w = _shape(x)
    return b, int(phi.shape[0]) // b, w


def modulate(x: Any, phi: Any, h: Any, *, stream: Any) -> None:
    """h [B * N, W] = x [B, W] (each row repeated over its N levels) * phi [B * N, W]."""
    b, n, w = _rows(x, phi)
    for name, arr, shape in (("x", x, (b, w)), ("phi", phi, (b * n, w)), ("h", h, (b * n, w))):
        check_array(name, arr, "", shape)
    launch_strided(iqn_modulate, b * n * w, x, phi, h, i32(n), i32(b * n * w), stream=stream)


def quantile_loss(z: Any, z_tgt: Any, taus: Any, q: Any, actions: Any, rows: BranchRows, weight: float, loss: Any,
                  dz: Any, *, stream: Any, bootstrap: str = "direction") -> None:
    """The quantile Huber loss of every branch row and its gradient (module header): z, z_tgt [B * N, 13] (the
    online head on s at taus, the target head on s' at the target levels), taus [B, N] the online levels, q [2B,
    13] the online E[Q] of s then s' (a*), actions [B, 4], rows the C51 rows (their rewards, discounts and
    weights) -> loss [4B] (unweighted), dz [B * N, 13] (weight x row weight x d loss / d z; 0 off the taken
    heads). `bootstrap` as learner.bootstrap."""
    b, n = _taus_shape(taus)
    for name, arr in (("z", z), ("z_tgt", z_tgt), ("dz", dz)):
        check_array(name, arr, "[B * N, 13]", (b * n, N_HEADS))
    check_array("q", q, "[2B, 13]", (2 * b, N_HEADS))
    check_array("actions", actions, "[B, 4]", (b, N_BRANCHES), np.int32)
    if rows.batch != b:
        raise ValueError(f"quantile_loss: the C51 rows are of {rows.batch} samples, taus of {b}")
    check_array("loss", loss, "[4B]", (N_BRANCHES * b,))
    if bootstrap not in BOOTSTRAP_RULES or not weight >= 0.0:
        raise ValueError(f"quantile_loss needs bootstrap in {BOOTSTRAP_RULES} and weight >= 0, got {bootstrap!r}, "
                         f"{weight}")
    r = N_BRANCHES * b
    launch_strided(iqn_quantile_loss, r, z, z_tgt, taus, q, actions, rows.rewards, rows.discounts, rows.weights,
                   np.float32(weight), i32(bootstrap == "direction"), loss, dz, i32(r), stream=stream)


def loss_signal(loss: Any, weights: Any, isv: Any, epoch: Any, *, stream: Any) -> None:
    """ISV[IQN_LOSS_EMA] and the epoch's LOSS_IQN from the rows' losses and weights [R]."""
    r = _shape(loss)[0]
    check_array("loss", loss, "[R]", (r,))
    check_array("weights", weights, "[R]", (r,))
    check_array("isv", isv, "[ISV_TOTAL_DIM]", (ISV_TOTAL_DIM,))
    check_epoch(epoch)
    launch_rows(iqn_loss_ema, 1, strided_threads(STATS_BLOCK), loss, weights, isv, epoch, i32(r), stream=stream)


def modulate_backward(dh: Any, x: Any, phi: Any, dphi: Any, dx: Any, *, mask: bool, stream: Any) -> None:
    """dphi [B * N, W] and dx [B, W] from dh [B * N, W] = dL/dh (kernel iqn_modulate_backward); `mask`: x is a
    ReLU's output, so dx is 0 where x <= 0."""
    b, n, w = _rows(x, phi)
    for name, arr, shape in (("dh", dh, (b * n, w)), ("x", x, (b, w)), ("phi", phi, (b * n, w)),
                             ("dphi", dphi, (b * n, w)), ("dx", dx, (b, w))):
        check_array(name, arr, "", shape)
    launch_strided(iqn_modulate_backward, b * w, dh, x, phi, dphi, dx, i32(n), i32(int(mask)), i32(b * w),
                   stream=stream)


def act_levels(states: Any, taus: Any, n_mid: int, *, explore: bool, stream: Any) -> None:
    """taus [B, n_mid (+ 4 when exploring)]: the n_mid midpoints, then one drawn level per direction from the B
    generators `states` (each advances by 4 draws when exploring, by none otherwise)."""
    b, levels = _taus_shape(taus)
    if n_mid < 1 or levels != n_mid + (N_DIRECTIONS if explore else 0):
        raise ValueError(f"act_levels: taus has {levels} levels per sample; {n_mid} midpoints"
                         f"{' and 4 draws' if explore else ''} need {n_mid + (N_DIRECTIONS if explore else 0)}")
    if len(states.shape) != 1 or states.shape[0] < b:
        raise ValueError(f"states must be a 1-D xoroshiro128p state array of at least B = {b} entries")
    check_array("states", states, "[n >= B]", (int(states.shape[0]),), XOROSHIRO_DTYPE)
    launch(iqn_act_taus, b, states, taus, i32(n_mid), i32(int(explore)), i32(b), stream=stream)


def direction_values(z: Any, values: Any, n_mid: int, *, stream: Any) -> None:
    """values [B, 2, 4] (E_IQN per direction, then the sampled quantiles, or E_IQN again without draws) from the
    head's z [B * L, 13] on `act_levels`' taus."""
    if len(values.shape) != 3 or values.shape[0] < 1:
        raise ValueError(f"values must be a float32 array [B, 2, {N_DIRECTIONS}], got shape {_shape(values)}")
    b = int(values.shape[0])
    check_array("values", values, f"[B, 2, {N_DIRECTIONS}]", (b, 2, N_DIRECTIONS))
    rows = int(z.shape[0])
    levels = rows // b
    if rows % b or levels not in (n_mid, n_mid + N_DIRECTIONS) or n_mid < 1:
        raise ValueError(f"direction_values: z has {rows} rows for B = {b} samples and {n_mid} midpoints")
    check_array("z", z, "[B * L, 13]", (rows, N_HEADS))
    launch_strided(iqn_direction_values, b * N_DIRECTIONS, z, values, i32(n_mid), i32(b * N_DIRECTIONS),
                   stream=stream)
