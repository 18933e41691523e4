"""Float64 numpy references shared by the kernel tests: C51 supports, softmax, expected Q, projection, loss.

Every kernel test compares against these (or a reference of its own for what only it computes), so a
reference is written once. Test modules import it as `reference` (tests/ is on sys.path through its
conftest.py).
"""

import numpy as np


def linear_support(v_min, v_max, n_atoms):
    """(v_min, v_max, delta_z) as float32, broadcastable to [..., 3]."""
    v_min, v_max = np.asarray(v_min, np.float32), np.asarray(v_max, np.float32)
    dz = ((v_max.astype(np.float64) - v_min) / (n_atoms - 1)).astype(np.float32)
    return np.stack(np.broadcast_arrays(v_min, v_max, dz), axis=-1)


def random_support(rng, shape, n_atoms):
    """(v_min, v_max, delta_z) float32 rows with v_min in [-1.5, -0.1] and v_max in [0.1, 1.5]."""
    v_min = rng.uniform(-1.5, -0.1, shape).astype(np.float32)
    v_max = rng.uniform(0.1, 1.5, shape).astype(np.float32)
    return linear_support(v_min, v_max, n_atoms)


def atoms64(support, n_atoms):
    """Atom values v_min + j * delta_z [..., Z] of supports [..., 3]."""
    return support[..., :1].astype(np.float64) + np.arange(n_atoms) * support[..., 2:3].astype(np.float64)


def softmax64(x):
    """Softmax over the last axis, in float64."""
    x = np.asarray(x, np.float64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def expected_q64(logits, support):
    """E[Q] [...] of logits [..., Z] on supports [..., 3]."""
    return (softmax64(logits) * atoms64(support, logits.shape[-1])).sum(axis=-1)


def project64(p, rewards, discounts, support_next, support_proj):
    """C51 projection in Bellemare et al.'s scatter form (floor/ceil neighbours, the l == u case kept whole)."""
    rows, z = p.shape
    out = np.zeros((rows, z))
    tz = rewards[:, None].astype(np.float64) + discounts[:, None] * atoms64(support_next, z)
    v_min, dz = support_proj[:, :1].astype(np.float64), support_proj[:, 2:].astype(np.float64)
    b = np.clip((tz - v_min) / dz, 0, z - 1)
    lo, hi = np.floor(b).astype(int), np.ceil(b).astype(int)
    for r in range(rows):
        for j in range(z):
            if lo[r, j] == hi[r, j]:
                out[r, lo[r, j]] += p[r, j]
            else:
                out[r, lo[r, j]] += p[r, j] * (hi[r, j] - b[r, j])
                out[r, hi[r, j]] += p[r, j] * (b[r, j] - lo[r, j])
    return out


def loss64(logits, target):
    """Cross-entropy -sum_k m_k log softmax(x)_k per row."""
    x = np.asarray(logits, np.float64)
    m = x.max(axis=-1, keepdims=True)
    log_softmax = x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))
    return -(np.asarray(target, np.float64) * log_softmax).sum(axis=-1)


def adaptive_clip64(isv, mult=2.0, rule="damped"):
    """float64 adaptive-clip producer (kernels/optim.py) on an ISV vector, in place, written from the spec's
    numbers: factor and clip from the EMAs before this step's norm (the first finite norm seeds EMA and SLOW),
    then the EMA updates with the raw norm (rule "seed") or the clipped norm min(raw, clip) (rule "damped")."""
    from fox_numba.device.isv import Isv

    raw = isv[Isv.GRAD_NORM_RAW]
    finite = np.isfinite(raw)
    ema, fast, slow = Isv.GRAD_NORM_EMA, Isv.GRAD_NORM_FAST_EMA, Isv.GRAD_NORM_SLOW_EMA
    factor, clip, observed = Isv.FOLD_WARMUP_FACTOR, Isv.CLIP_EFF, Isv.GRAD_NORM_OBSERVED
    if finite:
        isv[ema] = isv[ema] or raw
        isv[slow] = isv[slow] or raw
    bootstrap = isv[observed] < 200 or isv[slow] < np.float32(1e-6)  # the kernel's float32 floor
    isv[factor] = 1.0 if bootstrap else min(max(isv[fast] / isv[slow], 0.0), 1.0)
    isv[clip] = max(isv[ema] * mult * (0.1 + 0.9 * isv[factor]), 1e-12)
    if finite:
        seen = min(raw, isv[clip]) if rule == "damped" else raw
        isv[Isv.CLIP_ENGAGED_EMA] += 0.01 * (float(raw > isv[clip]) - isv[Isv.CLIP_ENGAGED_EMA])
        isv[ema] += 0.01 * (seen - isv[ema])
        isv[fast] += 0.1 * (seen - isv[fast])
        isv[slow] += 0.001 * (seen - isv[slow])
        isv[observed] = min(isv[observed] + 1, 2.0**24)


def q_drift_rate64(isv, q):
    """float64 Q_DRIFT_RATE producer (kernels/drift.py) on an ISV vector, in place, for the epoch mean q."""
    from fox_numba.device.isv import Isv

    if not np.isfinite(q):
        return
    prev = isv[Isv.Q_EPOCH_MEAN_PREV]
    if abs(prev) > 1e-6:
        denom = max(abs(prev), isv[Isv.Q_ABS_REF] + isv[Isv.Q_DIR_ABS_REF], 1e-6)
        isv[Isv.Q_DRIFT_RATE] = min(max(abs(q - prev) / denom, 0.0), 4.0)
    isv[Isv.Q_EPOCH_MEAN_PREV] = q

def atoms32(support, n_atoms):
    """Atom values [..., Z] as a float32 kernel computes them, v_min + float32(j) * delta_z with a rounding after
    the multiply and after the add (the simulator; the GPU fuses the two into one rounding, so tests that compare
    atom values for equality use supports whose atoms are short binary fractions, exact either way)."""
    j = np.arange(n_atoms, dtype=np.float32)
    return (support[..., :1].astype(np.float32) + j * support[..., 2:3].astype(np.float32)).astype(np.float32)


def variance64(logits, support):
    """Var[Z] = sum_j p_j (z_j - E[Q])**2 [...] of logits [..., Z] on supports [..., 3]."""
    p, z = softmax64(logits), atoms64(support, logits.shape[-1])
    q = (p * z).sum(axis=-1, keepdims=True)
    return (p * (z - q) ** 2).sum(axis=-1)
