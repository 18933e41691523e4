"""C51 value distributions: expected Q and its statistics, the categorical projection, the cross-entropy loss.

Layouts (float32, C-contiguous; B samples, A action heads in branch order, Z atoms, R loss rows):
- logits[B, A, Z]: one categorical distribution per (sample, head), p = softmax over Z.
- support[B, A, 3] = (v_min, v_max, delta_z) per (sample, head): atom j sits at v_min + j * delta_z, and
  v_max = v_min + (Z - 1) * delta_z is the last atom. Kernels read v_min and delta_z only; v_max is kept
  for readers of the range. A single shared support is the case where every row holds the same triple.
- Projection and loss work on rows: a row is one (sample, branch) pair, or one sample, as the learner
  lays them out; per-row supports are [R, 3] in the same (v_min, v_max, delta_z) form.

Launch shapes (all 1-D through `fox_numba.device.launch.launch`), and why:
- expected_q_kernel: one thread per (sample, head), B * A threads; one online-softmax pass over the
  head's Z logits (`row_stats`). B * A is 10^4-10^5 threads, enough to fill the GPU, and a head's Z
  logits are one contiguous run that the thread walks through L1.
- expected_q_stats_kernel (when the variance or the utilisation is asked for): the same threads, then a
  second pass over the Z logits, which needs the final max and sum: the seed's "utilisation pass".
- c51_project_kernel: one thread per row, R threads, blocks of PROJECT_BLOCK. Each row walks its Z source
  atoms once in the order of their target positions b_j (monotone in j) and scatters each atom's mass
  to its two neighbours b_j falls between, writing every output atom exactly once when the walk has
  passed it: O(Z) work per row instead of the O(Z**2) of a thread per output atom gathering over all
  sources, no atomics and no zeroing pass. Each output atom receives its terms in the same order (j
  ascending) as that gather would, so the results are the gather's bit for bit.
- c51_loss_kernel: one thread per row, R threads; two passes over the row's Z logits.
The per-row arithmetic lives in device functions (row_stats, atom_pass, project_row, cross_entropy_row) that take a
1-D array and a base offset, so the learner's fused kernels (kernels/learner.py select_q_rows, project_loss_scatter)
run the same code on rows staged in shared memory and get the same bits; the kernels here serve the collect and
evaluate paths (expected_q) and tools/bench_select.py.
Measured times live in tools/results/ (tools/bench_select.py), not here: they go stale.
Constraints: literals are float32 (a Python float in a kernel makes the GPU compute in float64);
`float32(j)` converts atom indices before they meet float32 values (int64 * float32 is float64).
Sizes come from the array shapes; the wrappers check them and allocate nothing, so they can run
inside a captured `StepGraph`. On the GPU, a * b + c contracts to one fused multiply-add, so float32
results differ from the simulator's in the last bits (the tests' tolerances cover both).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import cuda, float32, int32

from fox_numba.device.launch import check_array, launch
from fox_numba.device.registry import register
from fox_numba.device.runtime import u32

F32_2D = float32[:, ::1]
F32_3D = float32[:, :, ::1]

# ISV ATOM_UTIL_EMA's meaning: an atom is used when it holds more than this probability.
UTIL_THRESHOLD = np.float32(1e-3)
# Which optional outputs expected_q_stats_kernel writes (bits of its `outputs` argument).
WANT_VARIANCE = 1
WANT_UTILISATION = 2
PROJECT_BLOCK = 64  # rows per block: R = 8-33k rows then spread over 128-512 blocks on 132 SMs


@cuda.jit(device=True)
def row_stats(x, base, n_atoms, v_min, delta_z):
    """One pass of online softmax over x[base : base + n_atoms] on the atoms v_min + j * delta_z.

    Returns (M, S, TZ, TLM): M the running max, S = sum_j w_j with w_j = exp(x_j - M), TZ = sum_j w_j z_j
    and TLM = sum_j w_j (x_j - M). Then E[Q] = TZ / S and the entropy -sum p log p = log S - TLM / S.
    When the max rises from M to M' every sum is rescaled by exp(M - M'), and TLM also gains
    S * (M - M') because each of its terms (x_j - M) becomes (x_j - M'). Starting from atom 0 keeps
    -inf out of the arithmetic. `x` is any 1-D float32 array (a row of global logits, or a row staged
    in shared memory): every caller runs this same code, so E[Q] has the same bits in every kernel.
    """
    b = u32(base)  # uint32 indices: no 64-bit arithmetic, no negative-index wrap (kernels/head_rows.py)
    m = x[b]
    s = float32(1.0)
    tz = v_min
    tlm = float32(0.0)
    nz = u32(n_atoms)
    j = u32(1)
    while j < nz:  # a uint32 counter: numba's range() keeps a 64-bit (start, count) pair
        xj = x[u32(b + j)]
        if xj > m:
            shift = m - xj
            scale = math.exp(shift)
            tlm = (tlm + s * shift) * scale
            s = s * scale
            tz = tz * scale
            m = xj
        w = math.exp(xj - m)
        s += w
        tz += w * (v_min + float32(j) * delta_z)
        tlm += w * (xj - m)
        j = u32(j + u32(1))
    return m, s, tz, tlm


@cuda.jit(device=True)
def softmax_stats(logits, support, i, a):
    """`row_stats` of logits[i, a, :] on the atoms of support[i, a]: (M, S, TZ, TLM)."""
    return row_stats(logits[i, a], 0, logits.shape[2], support[i, a, 0], support[i, a, 2])


@register((F32_3D, F32_3D, F32_2D, F32_2D))
@cuda.jit
def expected_q_kernel(logits, support, q, entropy):
    """q[i, a] = E[Q] and entropy[i, a] = -sum p log p of softmax(logits[i, a, :]) on support[i, a]."""
    t = cuda.grid(1)
    n_heads = logits.shape[1]
    if t < logits.shape[0] * n_heads:
        i = t // n_heads
        a = t - i * n_heads
        _m, s, tz, tlm = softmax_stats(logits, support, i, a)
        q[i, a] = tz / s
        entropy[i, a] = math.log(s) - tlm / s


@cuda.jit(device=True)
def atom_pass(x, base, n_atoms, m, s, mean, v_min, delta_z):
    """The second pass over x[base : base + n_atoms], given `row_stats`' M and S and E[Q] = mean: (used, spread) with
    used = the number of atoms with p_j > UTIL_THRESHOLD and spread = sum_j w_j (z_j - mean)**2 (variance * S).
    Shared by `expected_q_stats_kernel` and the learner's fused select (kernels/learner.py): one code, one set
    of bits."""
    threshold = UTIL_THRESHOLD * s  # p_j > 1e-3  <=>  w_j > 1e-3 * S
    used = 0
    spread = float32(0.0)
    b = u32(base)
    nz = u32(n_atoms)
    j = u32(0)
    while j < nz:
        w = math.exp(x[u32(b + j)] - m)
        if w > threshold:
            used += 1
        d = (v_min + float32(j) * delta_z) - mean
        spread += w * (d * d)
        j = u32(j + u32(1))
    return used, spread


@register((F32_3D, F32_3D, F32_2D, F32_2D, F32_2D, F32_2D, int32))
@cuda.jit
def expected_q_stats_kernel(logits, support, q, entropy, variance, utilisation, outputs):
    """`expected_q_kernel`'s q and entropy, then a second pass over the atoms (`atom_pass`) for
    variance[i, a] = sum_j p_j (z_j - E[Q])**2 (bit WANT_VARIANCE of `outputs`) and
    utilisation[i, a] = (number of atoms with p_j > UTIL_THRESHOLD) / Z (bit WANT_UTILISATION).
    An output whose bit is clear is not written (the wrapper passes q in its place)."""
    t = cuda.grid(1)
    n_heads = logits.shape[1]
    if t < logits.shape[0] * n_heads:
        i = t // n_heads
        a = t - i * n_heads
        n_atoms = logits.shape[2]
        row = logits[i, a]
        v_min = support[i, a, 0]
        delta_z = support[i, a, 2]
        m, s, tz, tlm = row_stats(row, 0, n_atoms, v_min, delta_z)
        mean = tz / s
        q[i, a] = mean
        entropy[i, a] = math.log(s) - tlm / s
        used, spread = atom_pass(row, 0, n_atoms, m, s, mean, v_min, delta_z)
        if outputs & WANT_VARIANCE:
            variance[i, a] = spread / s
        if outputs & WANT_UTILISATION:
            utilisation[i, a] = float32(used) / float32(n_atoms)


@cuda.jit(device=True)
def project_row(p, p_base, reward, discount, v_min_next, dz_next, v_min_proj, dz_proj, m, m_base, n_atoms):
    """m[m_base + k] = sum_j p[p_base + j] * max(0, 1 - |b_j - k|), k, j < n_atoms: one row of `c51_project_kernel`
    (the walk of its docstring); p and m are 1-D float32 arrays (global rows, or rows staged in shared memory: the
    learner's fused loss, kernels/learner.py, runs this same code). Writes each m atom exactly once, in ascending
    order. A non-finite input writes NaN to every atom."""
    inv_dz_proj = float32(1.0) / dz_proj
    if not (math.isfinite(reward) and math.isfinite(discount) and math.isfinite(v_min_next)
            and math.isfinite(dz_next) and math.isfinite(v_min_proj) and math.isfinite(inv_dz_proj)):
        for k in range(n_atoms):
            m[m_base + k] = float32(math.nan)
        return
    top = float32(n_atoms - 1)
    last_lower = n_atoms - 2
    descending = discount * dz_next * inv_dz_proj < float32(0.0)
    pb = u32(p_base)  # uint32 indices (row_stats)
    mb = u32(m_base)
    nz = u32(n_atoms)
    cur = u32(0)
    acc_lo = float32(0.0)  # mass so far of atom cur
    acc_hi = float32(0.0)  # mass so far of atom cur + 1
    step = u32(0)
    while step < nz:
        j = step
        if descending:
            j = u32(nz - u32(1) - step)
        tz = reward + discount * (v_min_next + float32(j) * dz_next)
        b = min(max((tz - v_min_proj) * inv_dz_proj, float32(0.0)), top)
        lower = u32(min(int32(b), last_lower))  # floor: b >= 0
        while cur < lower:
            m[u32(mb + cur)] = acc_lo
            acc_lo = acc_hi
            acc_hi = float32(0.0)
            cur = u32(cur + u32(1))
        pj = p[u32(pb + j)]
        w_lo = float32(1.0) - abs(b - float32(lower))
        w_hi = float32(1.0) - abs(b - float32(lower + 1))
        if w_lo > float32(0.0):
            acc_lo += pj * w_lo
        if w_hi > float32(0.0):
            acc_hi += pj * w_hi
        step = u32(step + u32(1))
    m[u32(mb + cur)] = acc_lo
    m[u32(mb + cur + u32(1))] = acc_hi
    k = u32(cur + u32(2))
    while k < nz:
        m[u32(mb + k)] = float32(0.0)
        k = u32(k + u32(1))


@register((F32_2D, float32[::1], float32[::1], F32_2D, F32_2D, F32_2D))
@cuda.jit
def c51_project_kernel(p_next, rewards, discounts, support_next, support_proj, m):
    """m[r, k] = sum_j p_next[r, j] * max(0, 1 - |b_j - k|), b_j the clipped target atom in atom units.

    b_j = clip((rewards[r] + discounts[r] * z_j - v_min_p) / delta_z_p, 0, Z - 1), z_j the atoms of
    support_next[r], v_min_p and delta_z_p those of support_proj[r] (see `c51_project`). One thread per
    row (`project_row`): b_j is monotone in j (non-decreasing for the discounts >= 0 and widths > 0 of real
    rows; a row whose slope is negative is walked from j = Z - 1 down), so the walk keeps two accumulators,
    atom `cur` (= floor(b_j), at most Z - 2) and cur + 1, writes atom cur once b_j has moved past it, and
    writes the atoms after the last one reached as 0. Each source atom adds p_j * (1 - |b_j - k|) to its
    two neighbours k when that weight is positive, as the gather over sources did.
    A row whose reward, discount or supports are not finite (an empty replay's NaN reward, say) gets m = NaN
    in every atom, so its loss is NaN and the learner's non-finite guard skips the step: b would be NaN, and
    casting it to an atom index is undefined (the GPU and the simulator disagree on it).
    """
    r = cuda.grid(1)
    if r < p_next.shape[0]:
        project_row(p_next[r], 0, rewards[r], discounts[r], support_next[r, 0], support_next[r, 2],
                    support_proj[r, 0], support_proj[r, 2], m[r], 0, p_next.shape[1])


@cuda.jit(device=True)
def cross_entropy_row(x, x_base, target, t_base, weight, dl, dl_base, n_atoms):
    """One row of `c51_loss_kernel` over n_atoms atoms from x_base, t_base and dl_base of 1-D float32 arrays:
    returns -sum_k m_k log softmax(x)_k and writes dl[k] = weight * (sum(m) softmax(x)_k - m_k). dl may be the
    target itself (each m_k is read before dl[k] is written), as in the learner's fused loss (kernels/learner.py),
    which runs this same code on rows staged in shared memory."""
    xb = u32(x_base)  # uint32 indices (row_stats)
    tb = u32(t_base)
    db = u32(dl_base)
    mx = x[xb]
    s = float32(1.0)
    mass = target[tb]
    nz = u32(n_atoms)
    k = u32(1)
    while k < nz:
        xk = x[u32(xb + k)]
        mass += target[u32(tb + k)]
        if xk > mx:
            s = s * math.exp(mx - xk) + float32(1.0)
            mx = xk
        else:
            s += math.exp(xk - mx)
        k = u32(k + u32(1))
    inv_s = float32(1.0) / s
    scaled_mass = weight * mass * inv_s
    acc = float32(0.0)
    k = u32(0)
    while k < nz:
        xk = x[u32(xb + k)]
        mk = target[u32(tb + k)]
        acc += mk * (mx - xk)
        dl[u32(db + k)] = scaled_mass * math.exp(xk - mx) - weight * mk
        k = u32(k + u32(1))
    return acc + mass * math.log(s)


@register((F32_2D, F32_2D, float32[::1], float32[::1], F32_2D))
@cuda.jit
def c51_loss_kernel(logits, target, weights, loss, dlogits):
    """loss[r] = -sum_k m_k log softmax(x)_k; dlogits[r, k] = weights[r] * (sum(m) softmax(x)_k - m_k)
    (`cross_entropy_row`)."""
    r = cuda.grid(1)
    if r < logits.shape[0]:
        loss[r] = cross_entropy_row(logits[r], 0, target[r], 0, weights[r], dlogits[r], 0, logits.shape[1])


def _check_3d(name: str, arr: Any) -> tuple[int, int, int]:
    if len(arr.shape) != 3 or min(arr.shape) < 1:
        raise ValueError(f"{name} must be a float32 array [B, A, Z] with no empty axis, got shape {arr.shape}")
    return tuple(arr.shape)  # type: ignore[return-value]


def _check_rows(name: str, arr: Any) -> tuple[int, int]:
    if len(arr.shape) != 2 or min(arr.shape) < 1:
        raise ValueError(f"{name} must be a float32 array [R, Z] with no empty axis, got shape {arr.shape}")
    return tuple(arr.shape)  # type: ignore[return-value]


def expected_q(
    logits: Any,
    support: Any,
    q: Any,
    entropy: Any,
    *,
    stream: Any,
    variance: Any = None,
    utilisation: Any = None,
) -> None:
    """Write E[Q] and the entropy of every head: logits[B, A, Z], support[B, A, 3] -> q, entropy [B, A].

    Optionally also, per head, into [B, A] float32 arrays:
    - variance = Var[Z] = sum_j p_j (z_j - E[Q])**2 (E[Z**2] is variance + q**2). It is summed about
      E[Q] in the second pass rather than formed as E[Z**2] - E[Q]**2 from the first, which in float32
      loses the variance of a narrow distribution far from 0 (a peak at z = 1 of variance 1e-7 would
      be below the rounding of E[Z**2] = 1);
    - utilisation = the fraction of the Z atoms with probability > UTIL_THRESHOLD (1e-3): the per-head
      value whose batch mean the ATOM_UTIL_EMA producer folds into the ISV (the learner's step computes it
      with the same `atom_pass` in its fused select_q_rows, kernels/learner.py).
    Asking for either runs `expected_q_stats_kernel` (a second pass over the logits) instead of
    `expected_q_kernel`; q and entropy have the same bits either way.
    """
    b, a, z = _check_3d("logits", logits)
    if z < 2:
        raise ValueError(f"logits: a C51 distribution needs at least 2 atoms, got Z = {z}")
    check_array("logits", logits, "[B, A, Z]", (b, a, z))
    check_array("support", support, "[B, A, 3]", (b, a, 3))
    check_array("q", q, "[B, A]", (b, a))
    check_array("entropy", entropy, "[B, A]", (b, a))
    if variance is None and utilisation is None:
        launch(expected_q_kernel, b * a, logits, support, q, entropy, stream=stream)
        return
    outputs = 0
    if variance is not None:
        check_array("variance", variance, "[B, A]", (b, a))
        outputs |= WANT_VARIANCE
    if utilisation is not None:
        check_array("utilisation", utilisation, "[B, A]", (b, a))
        outputs |= WANT_UTILISATION
    launch(
        expected_q_stats_kernel, b * a, logits, support, q, entropy,
        q if variance is None else variance, q if utilisation is None else utilisation, np.int32(outputs),
        stream=stream,
    )  # fmt: skip


def c51_project(
    p_next: Any, rewards: Any, discounts: Any, support_next: Any, support_proj: Any, m: Any, *, stream: Any
) -> None:
    """Project the target distribution r + discount * Z' onto the projection atoms (Bellemare et al. 2017).

    p_next[R, Z] holds the probabilities of the greedy next action (target network) on the atoms of
    support_next[R, 3]; discounts[R] = gamma**n * (1 - done). Each target atom r + discount * z_j is
    clipped to [v_min, v_max] of support_proj[R, 3] (the online head's atoms), and its mass is split
    between the two nearest atoms in proportion to closeness; m[R, Z] receives the result. Mass is
    conserved: sum_k m[r, k] = sum_j p_next[r, j].

    Worked example (Z = 5; the test asserts it exactly, every number being a short binary fraction):

        row 0: atoms z = [-2, -1, 0, 1, 2] for both supports (v_min -2, delta_z 1)
               r = 0.5, discount = 0.5, p_next = [0.25, 0.25, 0.25, 0.125, 0.125]
               r + discount * z = [-0.5, 0, 0.5, 1, 1.5]
               -0.5 -> half to -1, half to 0;  0 -> 0;  0.5 -> half to 0, half to 1;  1 -> 1;
               1.5 -> half to 1, half to 2
               m = [0, 0.125, 0.125 + 0.25 + 0.125, 0.125 + 0.125 + 0.0625, 0.0625]
                 = [0, 0.125, 0.5, 0.3125, 0.0625]
        row 1: target atoms [0, 1, 2, 3, 4] (v_min 0, delta_z 1), projection atoms
               [-1, -0.5, 0, 0.5, 1] (v_min -1, delta_z 0.5); r = 0.25, discount = 0.5,
               p_next = [0.5, 0.25, 0.125, 0.0625, 0.0625]
               r + discount * z = [0.25, 0.75, 1.25, 1.75, 2.25], clipped to [0.25, 0.75, 1, 1, 1]
               0.25 -> half to 0, half to 0.5;  0.75 -> half to 0.5, half to 1;  the rest -> 1
               m = [0, 0, 0.25, 0.25 + 0.125, 0.125 + 0.125 + 0.0625 + 0.0625] = [0, 0, 0.25, 0.375, 0.375]
        row 2: terminal (discount 0), r = -0.75, both supports as row 0, p_next = [0.125, 0.25, 0.25, 0.25, 0.125]:
               every atom lands on -0.75 = 3/4 of the way from 0 down to -1
               m = [0, 0.75, 0.25, 0, 0]
    """
    r, z = _check_rows("p_next", p_next)
    check_array("p_next", p_next, "[R, Z]", (r, z))
    check_array("rewards", rewards, "[R]", (r,))
    check_array("discounts", discounts, "[R]", (r,))
    check_array("support_next", support_next, "[R, 3]", (r, 3))
    check_array("support_proj", support_proj, "[R, 3]", (r, 3))
    check_array("m", m, "[R, Z]", (r, z))
    args = (p_next, rewards, discounts, support_next, support_proj, m)
    launch(c51_project_kernel, r, *args, stream=stream, block=PROJECT_BLOCK)


def c51_loss(logits: Any, target: Any, weights: Any, loss: Any, dlogits: Any, *, stream: Any) -> None:
    """Cross-entropy of the online logits of the taken action against the projected target, and its gradient.

    logits[R, Z] (online network, taken action), target[R, Z] (`c51_project`'s m), weights[R] (importance
    weight / batch size) -> loss[R] = -sum_k m_k log softmax(logits)_k, unweighted (a priority for
    replay), and dlogits[R, Z] = weights * d loss / d logits = weights * (sum(m) * softmax - m), which is
    weights * (softmax - m) for a normalised target and sums to zero over atoms either way.
    One thread per row: deterministic, no atomics.
    """
    r, z = _check_rows("logits", logits)
    check_array("logits", logits, "[R, Z]", (r, z))
    check_array("target", target, "[R, Z]", (r, z))
    check_array("weights", weights, "[R]", (r,))
    check_array("loss", loss, "[R]", (r,))
    check_array("dlogits", dlogits, "[R, Z]", (r, z))
    launch(c51_loss_kernel, r, logits, target, weights, loss, dlogits, stream=stream)
