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
    then the EMA updates with the raw norm (rule "seed") or the clipped norm min(raw, clip) (rule "damped", whose
    slow EMA also follows a raw norm below it at 0.02 instead of 0.001)."""
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
        isv[slow] += (0.02 if rule == "damped" and raw < isv[slow] else 0.001) * (seen - isv[slow])
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

# ---- the network, the learner's kernels and its step (float64) ------------------------------------------


def branch_spans():
    """[(first head, size)] of the four branches, from fox_numba.actions."""
    from fox_numba.actions import BRANCHES

    return [(b.offset, b.size) for b in BRANCHES]


def split_streams(head, n_atoms, dtype=np.float64):
    """(values [B, 4, Z], advantages [B, 13, Z]) of the head GEMM output [B, 17 * Z (+ aux)], whose streams run
    branch by branch: a branch's value, then its heads' advantages (kernels/heads.py)."""
    spans = branch_spans()
    n_streams = len(spans) + sum(size for _, size in spans)
    h = np.asarray(head, dtype)[:, : n_streams * n_atoms].reshape(head.shape[0], n_streams, n_atoms)
    value = np.stack([h[:, off + b] for b, (off, _) in enumerate(spans)], axis=1)
    adv = np.concatenate([h[:, off + b + 1 : off + b + 1 + size] for b, (off, size) in enumerate(spans)], axis=1)
    return value, adv


def join_streams(value, adv):
    """The stream columns [B, 17 * Z] of (values [B, 4, Z], advantages [B, 13, Z]): `split_streams` inverted."""
    parts = []
    for b, (off, size) in enumerate(branch_spans()):
        parts += [value[:, b : b + 1], adv[:, off : off + size]]
    return np.concatenate(parts, axis=1).reshape(value.shape[0], -1)


def dueling64(head, n_atoms):
    """logits [B, 13, Z] = V_b + (A_a - mean of the branch's A) from the head GEMM output [B, 17 * Z (+ aux)]."""
    value, adv = split_streams(head, n_atoms)
    out = np.empty_like(adv)
    for b, (off, size) in enumerate(branch_spans()):
        a = adv[:, off : off + size]
        out[:, off : off + size] = value[:, b : b + 1] + (a - a.mean(axis=1, keepdims=True))
    return out


def dueling32(head, n_atoms):
    """`dueling64` in float32 with the kernels' order of operations (kernels/heads.py dueling_combine_fwd and
    combined_logit: the branch's advantages summed in head order, divided by its size, then V + (A - mean)), so
    its logits are the kernels' bit for bit."""
    value, adv = split_streams(head, n_atoms, np.float32)
    out = np.empty_like(adv)
    for b, (off, size) in enumerate(branch_spans()):
        mean = np.zeros((head.shape[0], n_atoms), np.float32)
        for k in range(size):
            mean = mean + adv[:, off + k]
        mean = mean / np.float32(size)
        out[:, off : off + size] = value[:, b : b + 1] + (adv[:, off : off + size] - mean[:, None])
    return out


def dueling_backward64(dlogits):
    """d head [B, 17 * Z] (the stream columns) of d logits [B, 13, Z] (the transpose of `dueling64`)."""
    spans = branch_spans()
    dl = np.asarray(dlogits, np.float64)
    dv = np.stack([dl[:, off : off + size].sum(axis=1) for off, size in spans], axis=1)
    da = np.empty_like(dl)
    for off, size in spans:
        part = dl[:, off : off + size]
        da[:, off : off + size] = part - part.mean(axis=1, keepdims=True)
    return join_streams(dv, da)


def dropout_keep64(rows, hidden, *, seed, step, layer, rate):
    """kernels/dropout.py's mask as float64 factors [rows, hidden]: 0 (dropped) or 1 / (1 - rate) (kept)."""
    from fox_numba.kernels.dropout import GOLDEN, MIX_LAYER, MIX_STEP

    mask = (1 << 64) - 1
    keep = np.empty((rows, hidden))
    base = (seed * GOLDEN + step * MIX_STEP + layer * MIX_LAYER) & mask
    for i in range(rows * hidden):
        z = (base + i) & mask
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        z ^= z >> 31
        u = (z >> 40) / float(1 << 24)
        keep[i // hidden, i % hidden] = 0.0 if u < rate else 1.0 / (1.0 - rate)
    return keep


def net_head64(p, n_layers, obs, keep=None, *, spectral=None, residual=False, depth=None):
    """(trunk activations [list of [B, H]], head GEMM output [B, 17 * Z + 1]) in float64, from host params p
    (the layout's `unpack` of a flat buffer); the last column is the auxiliary forecast. `keep` (a list of
    [B, H] factors per hidden layer, `dropout_keep64`) multiplies each layer's ReLU output. `spectral` (a list of
    (u, v) per trunk layer) divides each trunk weight by its sigma = v^T W u; `residual` makes layers 1.. blocks
    x + d * relu(x W + b), d = depth[layer - 1] [B] (`depth_factors64`) or 1."""
    x = np.asarray(obs, np.float64)
    acts = []
    for layer in range(n_layers):
        w = p[f"trunk.{layer}.weight"].astype(np.float64)
        if spectral is not None:
            u, v = spectral[layer]
            w = w / max(v @ w @ u, SN_EPS64)
        h = np.maximum(x @ w + p[f"trunk.{layer}.bias"], 0.0)
        if residual and layer > 0:
            d = np.ones(len(x)) if depth is None else depth[layer - 1]
            h = x + d[:, None] * h
        x = h * keep[layer] if keep is not None else h
        acts.append(x)
    return acts, x @ p["head.weight"].astype(np.float64) + p["head.bias"]


SN_EPS64 = 1e-12  # kernels/spectral.py SN_EPS


def spectral_power64(w, u, v, n_iters):
    """(u, v, sigma) in float64 after `n_iters` power iterations v = normalise(W u), u = normalise(W^T v) on
    W [in, out]; sigma = max(v^T W u, eps) (kernels/spectral.py)."""
    w, u, v = (np.asarray(a, np.float64) for a in (w, u, v))
    for _ in range(n_iters):
        v = w @ u
        v = v / max(np.linalg.norm(v), SN_EPS64)
        u = w.T @ v
        u = u / max(np.linalg.norm(u), SN_EPS64)
    return u, v, max(float(v @ w @ u), SN_EPS64)


def spectral_grad64(g, w, u, v, sigma):
    """dL/dW = (G - <G, W / sigma> v u^T) / sigma from G = dL/d(W / sigma), u and v held constant."""
    g = np.asarray(g, np.float64)
    w_sn = np.asarray(w, np.float64) / sigma
    return (g - np.sum(g * w_sn) * np.outer(v, u)) / sigma


def hash_uniform64(seed, step, layer, i):
    """kernels/dropout.py hash_uniform in Python integers: the top 24 bits of splitmix64 of the key, / 2**24."""
    from fox_numba.kernels.dropout import GOLDEN, MIX_LAYER, MIX_STEP

    mask = (1 << 64) - 1
    z = (seed * GOLDEN + step * MIX_STEP + layer * MIX_LAYER + i) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    z ^= z >> 31
    return (z >> 40) / float(1 << 24)


def depth_factors64(rows, *, seed, step, layer, rate):
    """kernels/depth.py's per-row keep factors [rows] of trunk layer `layer`: 0 or 1 / (1 - rate)."""
    from fox_numba.kernels.depth import DEPTH_KEY

    u = np.array([hash_uniform64(seed, step, layer + DEPTH_KEY, r) for r in range(rows)])
    return np.where(u < rate, 0.0, 1.0 / (1.0 - rate))


def position_cross64(obs, n_cross, pos_col):
    """[B, D + n_cross] float64: obs beside its position column times its first n_cross columns
    (kernels/position_cross.py)."""
    o = np.asarray(obs, np.float64)
    return np.concatenate([o, o[:, pos_col : pos_col + 1] * o[:, :n_cross]], axis=1)


def net_forward64(p, n_layers, obs, n_atoms, keep=None):
    """(trunk activations [list of [B, H]], logits [B, 13, Z]) of the network (`net_head64`, then the combine)."""
    acts, head = net_head64(p, n_layers, obs, keep)
    return acts, dueling64(head, n_atoms)


def net_backward64(p, n_layers, obs, acts, dlogits, daux=None, keep=None, dinput=None):
    """{name: d(sum dlogits * logits + sum daux * aux) / d param} in float64, from `net_forward64`'s
    activations (daux [B], the auxiliary forecast's gradient, 0 when None; `keep` as net_head64's; dinput [B, H],
    another head's gradient at the trunk's last layer, already masked by its ReLU, added to the C51 head's).
    dlogits may instead be the head GEMM's output gradient dhead [B, head width] (as the learner's fused loss
    writes it: the combine's backward taken; its forecast column then replaces daux's)."""
    grads = {}
    inputs = [np.asarray(obs, np.float64)] + acts
    if np.ndim(dlogits) == 2:
        dy = np.asarray(dlogits, np.float64)
    else:
        daux = np.zeros(dlogits.shape[0]) if daux is None else np.asarray(daux, np.float64)
        dy = np.concatenate([dueling_backward64(dlogits), daux[:, None]], axis=1)
    for layer in range(n_layers, -1, -1):
        name = "head" if layer == n_layers else f"trunk.{layer}"
        x = inputs[layer]
        grads[f"{name}.weight"] = x.T @ dy
        grads[f"{name}.bias"] = dy.sum(axis=0)
        if layer > 0:
            dy = (dy @ p[f"{name}.weight"].astype(np.float64).T) * (x > 0)
            if layer == n_layers and dinput is not None:
                dy = dy + dinput
            if keep is not None:
                dy = dy * keep[layer - 1]
    return grads


def xoroshiro_next64(states, i):
    """numba's xoroshiro128p_next on a host copy of the states (advances states[i]); returns a Python int."""
    mask = (1 << 64) - 1
    s0, s1 = int(states[i]["s0"]), int(states[i]["s1"])
    result = (s0 + s1) & mask
    s1 ^= s0

    def rot(x, k):
        return ((x << k) | (x >> (64 - k))) & mask

    states[i]["s0"] = rot(s0, 55) ^ s1 ^ ((s1 << 14) & mask)
    states[i]["s1"] = rot(s1, 36)
    return result


def sample_indices64(states, size):
    """The learner's replay slots: floor(top 32 bits of one draw / 2**32 * size) per generator, in order."""
    return np.array([((xoroshiro_next64(states, i) >> 32) * size) >> 32 for i in range(states.size)], np.int64)


def effect64(actions):
    """[B, 4] 1.0 where the branch's choice had an effect (see kernels/learner.py), else 0.0."""
    from fox_numba.actions import FLAT, HOLD, OrderType

    a = np.asarray(actions)
    eff = np.ones(a.shape, np.float64)
    eff[:, 1] = ~np.isin(a[:, 0], (HOLD, FLAT))
    eff[:, 2] = a[:, 0] != HOLD
    eff[:, 3] = (a[:, 0] != HOLD) & (a[:, 2] != int(OrderType.MARKET))
    return eff


def adamw64(p, m, v, g, *, clip_scale, lr, t, beta1, beta2, eps, weight_decay, mask):
    """One AdamW step in float64, in place; returns the update u (param -= u)."""
    g = np.asarray(g, np.float64) * clip_scale
    m[:] = beta1 * m + (1 - beta1) * g
    v[:] = beta2 * v + (1 - beta2) * g * g
    u = lr * ((m / (1 - beta1**t)) / (np.sqrt(v / (1 - beta2**t)) + eps) + weight_decay * mask * p)
    p -= u
    return u


def double_dqn64(logits, q, logits_tgt, sup_on, sup_tg, actions, rewards, discounts, branch_w,
                 bootstrap="direction"):
    """The per-row outputs of the double DQN rows (kernels/learner.py select_q_rows; a_n = a*) in float64 (dict of
    arrays); `discounts` per sample (the replay gather's gamma**k * (1 - done)); `bootstrap` as learner.bootstrap."""
    b, _, z = logits_tgt.shape
    eff = effect64(actions)
    out = {k: [] for k in ("taken", "a_n", "p_next", "sup_next", "sup_proj", "rew", "disc", "w", "stats")}
    for i in range(b):
        for br, (off, size) in enumerate(branch_spans()):
            a_t = off + actions[i, br]
            n_off, n_size = branch_spans()[0] if bootstrap == "direction" else (off, size)
            a_n = n_off + int(np.argmax(q[b + i, n_off : n_off + n_size]))  # first maximum: ties to the lowest bin
            p = softmax64(logits_tgt[i, a_n])
            e_tgt = float(p @ atoms64(sup_tg[a_n], z))
            disc = float(discounts[i])
            out["taken"].append(logits[i, a_t])
            out["a_n"].append(a_n)
            out["p_next"].append(p)
            out["sup_next"].append(sup_tg[a_n])
            out["sup_proj"].append(sup_on[a_t])
            out["rew"].append(rewards[i])
            out["disc"].append(disc)
            out["w"].append(branch_w[br] * eff[i, br] / b)
            out["stats"].append([rewards[i] + disc * e_tgt - q[i, a_t], e_tgt, e_tgt - q[b + i, a_n]])
    return {k: np.array(v, np.float64) for k, v in out.items()}


def replay_gather64(host, idx, *, stride=1, n_step=1, gamma=0.9):
    """The learner's batch from the ring `host` at slots idx, float64 (kernels/replay.py's rule, written out
    per sample): the chain s, s + stride, ... of up to n_step transitions, stopped at a done, at a slot
    whose row is not the last one's next_row, or at a slot not written after s; slot -1: row 0, zero
    portfolio and action, reward NaN, discount 0."""
    cap = host["row"].shape[0]
    cursor, size = (int(v) for v in host["meta"])
    oldest = (cursor - size) % cap
    n = idx.size
    out = {"rows": np.zeros(2 * n, np.int32), "port": np.zeros((2 * n, host["port"].shape[1])),
           "actions": np.zeros((n, 4), np.int32), "rewards": np.full(n, np.nan), "discounts": np.zeros(n)}
    for j, s in enumerate(int(v) for v in idx):
        if s < 0:
            continue
        chain = [s]
        while len(chain) < n_step:
            last, k = chain[-1], len(chain)
            nxt = (s + k * stride) % cap
            written_after = (s - oldest) % cap + k * stride < size
            if not written_after or host["done"][last] != 0 or host["row"][nxt] != host["next_row"][last]:
                break
            chain.append(nxt)
        last = chain[-1]
        out["rows"][j], out["rows"][n + j] = host["row"][s], host["next_row"][last]
        out["port"][j], out["port"][n + j] = host["port"][s], host["next_port"][last]
        out["actions"][j] = host["action"][s]
        out["rewards"][j] = sum(gamma**i * float(host["reward"][t]) for i, t in enumerate(chain))
        out["discounts"][j] = gamma ** len(chain) * (1.0 - float(host["done"][last]))
    return out


def column_branches64(n_atoms):
    """The branch of every head column (kernels/heads.py column_branch), -1 for the auxiliary ones, from the action
    table: each branch's value and advantage streams side by side."""
    from fox_numba.kernels.heads import N_STREAMS, head_width

    out = []
    for b, (_, size) in enumerate(branch_spans()):
        out += [b] * ((1 + size) * n_atoms)
    return np.array(out + [-1] * (head_width(n_atoms) - N_STREAMS * n_atoms))


def noisy_factors64(f_eps, n_in, n_atoms):
    """(f_in [n_in, q]: each column's branch input noise, f_out [q]) of a draw f_eps, zero on auxiliary columns."""
    from fox_numba.actions import N_BRANCHES

    branch = column_branches64(n_atoms)
    f_out = np.asarray(f_eps[N_BRANCHES * n_in :], np.float64).copy()
    f_in = np.zeros((n_in, len(branch)))
    for o, b in enumerate(branch):
        if b >= 0:
            f_in[:, o] = f_eps[b * n_in : (b + 1) * n_in]
        else:
            f_out[o] = 0.0
    return f_in, f_out


HINDSIGHT_NONE, HINDSIGHT_KEEP_LONG, HINDSIGHT_KEEP_SHORT = -1, 4, 5
"""Hindsight label codes beside the directions Short 0, Long 2, Flat 3 (kernels/hindsight.py)."""


def hindsight_labels64(mid, day_start, train_stop, horizon, threshold):
    """Hindsight labels of every row: the forward mid change fwd over `horizon` bars within the row's day (NaN
    where it would read a row at or after `train_stop` or past the day), classified by the oracle's rule (enter
    beyond +-threshold, else keep by the sign of fwd, Flat at fwd = 0), one row at a time in float64."""
    n = len(mid)
    labels = np.full(n, HINDSIGHT_NONE, np.int64)
    for a, b in zip(day_start[:-1], day_start[1:], strict=True):
        for r in range(int(a), int(b)):
            t = r + horizon
            if t >= int(b) or t >= train_stop:
                continue
            fwd = float(mid[t]) - float(mid[r])
            if abs(fwd) > threshold:
                labels[r] = 2 if fwd > 0 else 0
            elif fwd != 0.0:
                labels[r] = HINDSIGHT_KEEP_LONG if fwd > 0 else HINDSIGHT_KEEP_SHORT
            elif fwd == 0.0:
                labels[r] = 3
    return labels


def hindsight_relabel64(labels, rows, positions, actions, n_relabel):
    """actions [N, 4] after relabelling environments 0 .. n_relabel - 1 from labels[rows[i]] and the sign of
    positions[i]: Hold (1) where a keep label agrees with the position, Flat (3) where it does not; Hold and
    Flat take magnitude 0; unlabelled rows and the other environments keep their actions."""
    out = np.array(actions, copy=True)
    for i in range(n_relabel):
        label = int(labels[rows[i]])
        if label == HINDSIGHT_NONE:
            continue
        if label in (HINDSIGHT_KEEP_LONG, HINDSIGHT_KEEP_SHORT):
            side = 1.0 if label == HINDSIGHT_KEEP_LONG else -1.0
            label = 1 if side * float(positions[i]) > 0 else 3
        out[i, 0] = label
        if label in (1, 3):
            out[i, 1] = 0
    return out


def iqn_forward64(p, x, taus):
    """The IQN head in float64 (kernels/iqn.py): x [B, W], taus [B, N] -> (cos, phi, h [B * N, .], z [B * N, 13]),
    row i * N + k for sample i and level k."""
    n_taus = taus.shape[1]
    tau = np.asarray(taus, np.float64).reshape(-1)
    n_embed = p["iqn.embed.weight"].shape[0]
    cos = np.cos(np.pi * np.arange(n_embed)[None, :] * tau[:, None])
    phi = np.maximum(cos @ p["iqn.embed.weight"].astype(np.float64) + p["iqn.embed.bias"], 0.0)
    h = np.repeat(np.asarray(x, np.float64), n_taus, axis=0) * phi
    return cos, phi, h, h @ p["iqn.head.weight"].astype(np.float64) + p["iqn.head.bias"]


def iqn_loss64(z, z_tgt, taus, q, actions, rewards, discounts, weights, weight, shared=True):
    """(loss [4B], dz [B * N, 13]) of the quantile Huber loss at kappa 1 (kernels/iqn.py's header), written from
    the definition: per branch row, rho_tau(u) = |tau - 1{u < 0}| L(u) over every (online k, target j) pair."""
    b, n = taus.shape
    spans = branch_spans()
    loss = np.zeros(4 * b)
    dz = np.zeros((b * n, z.shape[1]))
    for i in range(b):
        for br, (off, size) in enumerate(spans):
            r = i * 4 + br
            a_t = off + actions[i, br]
            n_off, n_size = spans[0] if shared else (off, size)
            a_n = n_off + int(np.argmax(q[b + i, n_off : n_off + n_size]))
            target = rewards[r] + discounts[r] * z_tgt[i * n : (i + 1) * n, a_n].astype(np.float64)
            for k in range(n):
                u = target - float(z[i * n + k, a_t])
                level = np.abs(float(taus[i, k]) - (u < 0))
                huber = np.where(np.abs(u) <= 1, 0.5 * u * u, np.abs(u) - 0.5)
                loss[r] += (level * huber).sum() / n
                dz[i * n + k, a_t] = -weight * weights[r] / n * (level * np.clip(u, -1, 1)).sum()
    return loss, dz


def iqn_backward64(p, x, cos, phi, h, dz, mask):
    """({IQN entry: gradient}, dx [B, W]) of sum dz * z in float64 (`iqn_forward64`'s intermediates); `mask`: x
    is a ReLU's output (dx 0 where x <= 0)."""
    x = np.asarray(x, np.float64)
    n_taus = h.shape[0] // x.shape[0]
    grads = {"iqn.head.weight": h.T @ dz, "iqn.head.bias": dz.sum(0)}
    dh = dz @ p["iqn.head.weight"].astype(np.float64).T
    dphi = dh * np.repeat(x, n_taus, axis=0) * (phi > 0)
    grads["iqn.embed.weight"], grads["iqn.embed.bias"] = cos.T @ dphi, dphi.sum(0)
    dx = (dh * phi).reshape(x.shape[0], n_taus, -1).sum(1)
    return grads, dx * (x > 0) if mask else dx


def tf32_round(x):
    """float32 -> the TF32 value cvt.rna.tf32.f32 gives (10 mantissa bits, nearest, ties away from zero), as
    float32; finite inputs only."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32)
    return ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


def bf16_round(x):
    """float32 -> the bf16 value cvt.rn.bf16x2.f32 gives (7 mantissa bits, nearest, ties to even), as float32;
    finite inputs below bf16's largest only."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32)
    even = (bits >> np.uint32(16)) & np.uint32(1)
    return ((bits + np.uint32(0x7FFF) + even) & np.uint32(0xFFFF0000)).view(np.float32)

ROUND = {"tf32": tf32_round, "bf16": bf16_round}


def vsn_forward64(p, obs, groups):
    """(gate weights [B, K], gated observation [B, D]) in float64 (agent/vsn.py): w = softmax(x W_g + b_g) per row,
    x'_c = K w_k(c) x_c over the column ranges `groups` [(begin, end), ...]."""
    x = np.asarray(obs, np.float64)
    w = softmax64(x @ p["vsn.weight"].astype(np.float64) + p["vsn.bias"])
    k = len(groups)
    group_of = np.concatenate([np.full(end - begin, j) for j, (begin, end) in enumerate(groups)])
    return w, k * w[:, group_of] * x


def vsn_gate_grad64(dxg, obs, w, groups):
    """dL/d(gate logits) [G, K] from dL/d(gated observation) dxg [G, D] (kernels/vsn.py): dw_k = K sum over the
    group's columns of dxg x, then the softmax Jacobian dg = w (dw - <w, dw>)."""
    x, dxg, w = (np.asarray(a, np.float64) for a in (obs, dxg, w))
    k = len(groups)
    dw = np.stack([k * np.sum(dxg[:, b:e] * x[:, b:e], axis=1) for b, e in groups], axis=1)
    return w * (dw - np.sum(w * dw, axis=1, keepdims=True))


def vsn_focus64(w):
    """(batch mean of max_k w_k clamped to [1/K, 1], batch mean of the entropy / ln K clamped to [0, 1])."""
    w = np.asarray(w, np.float64)
    k = w.shape[1]
    ent = -np.sum(np.where(w > 0, w * np.log(np.where(w > 0, w, 1.0)), 0.0), axis=1) / np.log(k)
    return float(np.clip(w.max(axis=1).mean(), 1.0 / k, 1.0)), float(np.clip(ent.mean(), 0.0, 1.0))


def moe_mix64(e, w, n_atoms):
    """Head rows [R, HW] of the experts' outputs e [R, K * HW] under the gate weights w [R, 4, K] (kernels/moe.py):
    the gate-weighted sum per column's branch, the auxiliary column the experts' mean."""
    cb = column_branches64(n_atoms)
    rows, k = w.shape[0], w.shape[2]
    e = np.asarray(e, np.float64).reshape(rows, k, cb.size)
    gw = np.where(cb[None, :, None] >= 0, w[:, np.maximum(cb, 0), :], 1.0 / k)  # [R, HW, K]
    return np.einsum("rck,rkc->rc", gw, e)


def moe_forward64(p, x, n_experts, n_atoms):
    """(gate weights [R, 4, K], experts' outputs [R, K * HW], head rows [R, HW]) in float64 from host params p."""
    x = np.asarray(x, np.float64)
    g = x @ p["moe.weight"].astype(np.float64) + p["moe.bias"]
    w = softmax64(g.reshape(len(x), -1, n_experts))
    e = x @ p["head.weight"].astype(np.float64) + p["head.bias"]
    return w, e, moe_mix64(e, w, n_atoms)


def moe_usage64(w):
    """(u [4, K] the batch-mean gate weights, h [4] each branch's mean per-row entropy) of gate weights w [G, 4, K]."""
    w = np.asarray(w, np.float64)
    ent = -np.sum(np.where(w > 0, w * np.log(np.where(w > 0, w, 1.0)), 0.0), axis=2)
    return w.mean(axis=0), ent.mean(axis=0)


def moe_backward64(dout, e, w, lam, n_atoms):
    """(d experts [G, K * HW], d gate logits [G, 4K]) of the mixture plus lam * sum_b K sum_k u_bk**2 (kernels/moe.py),
    from dout [G, HW], the experts' outputs e [G, K * HW] and the gate weights w [G, 4, K] of the same rows."""
    cb = column_branches64(n_atoms)
    dout, w = np.asarray(dout, np.float64), np.asarray(w, np.float64)
    rows, nb, k = w.shape
    e = np.asarray(e, np.float64).reshape(rows, k, cb.size)
    gw = np.where(cb[None, :, None] >= 0, w[:, np.maximum(cb, 0), :], 1.0 / k)  # [G, HW, K]
    de = np.einsum("rck,rc->rkc", gw, dout).reshape(rows, -1)
    dw = np.stack([np.einsum("rc,rkc->rk", dout[:, cb == b], e[:, :, cb == b]) for b in range(nb)], axis=1)
    u, _ = moe_usage64(w)
    dw += lam * 2.0 * k * u[None] / rows
    dg = w * (dw - np.sum(w * dw, axis=2, keepdims=True))
    return de, dg.reshape(rows, -1)


def moe_balance64(u):
    """The balance term mean_b K sum_k u_bk**2 of the usage u [4, K] (1 balanced, K collapsed)."""
    return float(np.mean(u.shape[1] * np.sum(np.asarray(u, np.float64) ** 2, axis=1)))


def central_differences64(objective, flat, entries, eps=1e-6):
    """float64 [flat.size]: (objective(flat + eps e_k) - objective(flat - eps e_k)) / 2 eps at every index k of the
    layout `entries` (0 in the gaps between them): the gradient a network's backward must match."""
    grad = np.zeros(flat.size)
    for e in entries:
        for k in range(e.offset, e.stop):
            up, down = flat.copy(), flat.copy()
            up[k] += eps
            down[k] -= eps
            grad[k] = (objective(up) - objective(down)) / (2 * eps)
    return grad


def mirror_project64(w, b, parity, strength=1.0):
    """kernels/mirror.py in float64: W[i, d] and p_i W[i, sigma d] averaged (sigma swaps Short and Long), b likewise
    with parity +1; each value moved the fraction `strength` of the way there."""
    sigma = [2, 1, 0, 3]  # actions.Direction: SHORT 0, HOLD 1, LONG 2, FLAT 3
    w64, b64 = np.asarray(w, np.float64), np.asarray(b, np.float64)
    pw = 0.5 * (w64 + np.asarray(parity, np.float64)[:, None] * w64[:, sigma])
    pb = 0.5 * (b64 + b64[sigma])
    return w64 + strength * (pw - w64), b64 + strength * (pb - b64)
