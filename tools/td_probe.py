"""Can temporal-difference learning, run as the agent's learner runs it, recover the probe's linear read?

    NUMBA_ENABLE_CUDASIM=1 python3 tools/td_probe.py [--store STORE.h5] [--seeds 0 1 2 3 4] \
        [--set folds.n_folds=2 --set folds.val_days=30 --set folds.step_days=30] [--out tools/results/NAME.md]

The agent's direction values hold a weaker linear read of the coming move than the probe's ridge fit on the same
market columns (tools/results/learner_ablation_h200.md sections 15-16). This separates the value-learning step
from everything else the agent adds (C51 atoms and projection, 13 dueling heads, exploration, the portfolio,
costs): per fold, a linear value of holding one contract long, V(x) = w.x + b on the observation's market
columns, is learned from the training rows with the learner's own optimisation (Adam, its learning rate with
the cosine schedule to lr * lr_min_frac, batch, steps = epochs x steps_per_epoch, a Polyak target at tau) against

- `td`: the one-step target r + gamma V_target(x'), r the next bar's mid change (0 future at a day's end);
- `mc`: the discounted return to the day's end, sum_k gamma^k r_k (what TD converges towards, without
  bootstrapping);
- `c51`: the same one-step target as a distribution: network.n_atoms logits linear in x on a fixed support
  of half-width 3 mean|G| + 2 mean|r| / sqrt(1 - gamma^2) (G the return above; the static form of the agent's
  support rule, kernels/heads.py), the target r + gamma Z_target(x') projected onto it, cross-entropy; the
  signal is E[Z];

- `split` and `greedy`: what the agent's direction values learn from, partial feedback. Two linear values, of
  holding long (reward +r) and short (-r), each learned by one-step TD only on the transitions a behaviour policy
  took that position on: `split` takes each on a random TAKEN share of every batch, independent of the state;
  `greedy` takes the 2 TAKEN share with the largest |V_long - V_short| on the side the current values prefer, plus
  an EXPLORE share of the rest at random, as the agent's greedy policy with exploration does. The signal is
  (V_long - V_short) / 2. A full-information `td` against these tells how much of the read the agent loses by
  seeing only the reward of the position it took;
- `qlearn`: the agent's own decision problem at one contract, linear and with full information: three values
  V(x, q) of holding q = -1, 0, +1 contract over the next bar, learned by one-step Q-learning with the trade costs
  inside, target q r + gamma max_q'' [V_target(x', q'') - c' |q'' - q|] (at a day's last transition the forced
  close, q r - c' |q|; c' the next bar's half spread + commission in price units), every transition training all
  three (the market is exogenous, so every position's outcome is known: counterfactual targets). Its signal is
  (V(x, +1) - V(x, -1)) / 2, traded by the probe's rule like the others, and a second row, `qlearn argmax`, trades
  the values themselves as the agent does: from flat at each day's start, each bar the q' of the largest
  V(x, q') - c |q' - q|, flat at the day's last bar (correlation columns n/a). Against `td`, it tells whether
  Q-learning with costs and a max over the next position, acted on by argmax, keeps the read;
- `qdir` and `qdir_cross`: the same problem in the agent's own parametrisation: four direction values (Short,
  Hold, Long, Flat: target position -1, the held q, +1, 0) linear in features of the market columns and the held
  position, as the default network's linear heads read [market | portfolio]: `qdir` on [x, 1, q] (no term in which
  the market and the position interact, which is all a linear head on the observation has), `qdir_cross` on
  [x, 1, q, q x]. Q_d(x, q) = -c |q' - q| + q' r + gamma max_d' Q_target,d'(x', q'), every transition training every
  direction from every held position; traded by argmax from flat (`... argmax` rows). Against `qlearn argmax`, they
  tell whether the linear head's missing interaction costs the read (the value of Hold is q x . beta: bilinear);
- `qdir_cross_visited`: `qdir_cross` trained as the agent's replay trains it: each transition from the one position
  its behaviour policy held there (every direction still priced, as learner.counterfactual does), the policy being
  the current values' argmax traded over every training day from flat, a random direction with probability EXPLORE,
  re-run once per epoch (steps_per_epoch steps; the first epoch's collect random). Against `qdir_cross`, it tells
  whether the positions a policy visits are enough to fit the interaction (learner_ablation_h200.md section 29);
- `qdir_cross_taken`: `qdir_cross_visited` with partial feedback, as the agent's learner trains without
  learner.counterfactual: each transition trains only the direction its behaviour policy took there. Against
  `qdir_cross_visited`, it tells what pricing every direction of a visited transition is worth;
- `qdir_cross_draw`: `qdir_cross_taken` under the agent's own collect rule instead of epsilon-greedy: every bar the
  direction of the largest value + env.explore_spread x sigma x a standard normal draw per direction, sigma the
  standard deviation of the discounted return of holding one contract to the day's end (the width of a C51 head's
  return distribution, whose atom draws the agent's rule scales: kernels/action_select.py; a Gaussian stands in for
  the categorical draw). Against `qdir_cross_taken`, it tells what the agent's exploration costs the fit;
- `qdir_cross_c51`: `qdir_cross` with a C51 head per direction, as the agent's: logits linear in [x, 1, q, q x] over
  `c51`'s fixed support, the target distribution of -c |q' - q| + q' r + gamma Z_target(x', q', d*) (d* the next
  direction of the largest E[Z]) projected onto it, cross-entropy; acted on by argmax E[Z]. Against `qdir_cross`, it
  tells whether the categorical head loses the read (learner_ablation_h200.md section 31);

and the probe's ridge fit of the probe_horizon-bar change is fitted on the same rows. Each signal is scored by its
correlation with the probe_horizon-bar move on the validation days (and on the training rows). If `td` reaches the
probe's correlation, one-step TD on this read is not what the agent lacks; if `mc` does and `td` does not,
the bootstrap is; if `td` does and `c51` does not, the distributional head is.

Each signal is also traded, as tools/signal_probe.py trades the agent's direction signal: a one-column ridge-free
fit of the probe_horizon-bar change on the signal over the training rows, traded on the validation days the agent
is scored on by the oracle's rule (walkforward/probe.py: enter when the forecast beats the round-trip cost, one
contract, spread and commission paid); the probe row is the probe baseline itself (the market columns,
evaluation.probe_ridge). The columns are that trade's validation daily Sharpe and its round trips per day. An
equal correlation can still churn: the agent's own signal traded this way made twice the probe's round trips and
lost, so these say whether the TD read churns too. Mean and standard error over the seeds (the seed draws the
batches; the probe has none). CPU only.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fox_numba.actions import N_DIRECTIONS, Direction  # noqa: E402
from fox_numba.agent.fold_market import FoldMarket  # noqa: E402
from fox_numba.config import FeatureConfig, FoxConfig, LearnerConfig, load_config  # noqa: E402
from fox_numba.features.feature_set import FeatureSet  # noqa: E402
from fox_numba.features.forecast import fit_probe, forward_change  # noqa: E402
from fox_numba.market.default import ensure_default_store  # noqa: E402
from fox_numba.market.select import MarketSelection, select_market  # noqa: E402
from fox_numba.walkforward.driver import half_spread, load_features, scored_days  # noqa: E402
from fox_numba.walkforward.folds import make_folds  # noqa: E402
from fox_numba.walkforward.metrics import compute_metrics, positions_to_days  # noqa: E402
from fox_numba.walkforward.probe import probe_baseline  # noqa: E402

TARGETS = ("td", "mc", "c51", "split", "greedy", "qlearn", "qdir", "qdir_cross", "qdir_cross_visited",
           "qdir_cross_taken", "qdir_cross_draw", "qdir_cross_c51")
DIRECTED = ("qdir", "qdir_cross", "qdir_cross_visited", "qdir_cross_taken", "qdir_cross_draw", "qdir_cross_c51")
"""Targets that learn the agent's four direction values on [x, position] features (module header)."""
CROSSED = ("qdir_cross", "qdir_cross_visited", "qdir_cross_taken", "qdir_cross_draw", "qdir_cross_c51")
"""Direction-value targets whose features hold the position x market columns."""
BEHAVIOUR = ("qdir_cross_visited", "qdir_cross_taken", "qdir_cross_draw")
"""Direction-value targets trained on the positions (and directions) a behaviour policy visits."""
POSITIONS = np.array([-1.0, 0.0, 1.0])
"""`qlearn`: the positions (contracts) its three values hold."""
PARTIAL = ("split", "greedy")
"""Targets that learn a long and a short value, each only from the transitions a behaviour policy took it on."""
TAKEN = 0.15
"""Share of a batch's transitions each position is taken on, 2 TAKEN in all (`split`; `greedy` the same 2 TAKEN by
its values): the agent holds a position on 0.29 of the default market's validation bars (learner_ablation_h200.md
section 16)."""
EXPLORE = 0.1
"""`greedy`: share of the batch's other transitions given a random position (exploration)."""


@dataclass(frozen=True)
class Rows:
    """One fold's training rows that have a next bar in their day (`idx`), that row's reward and next row, whether
    the next row ends the day (`last`: no future after it) and each row's discounted return to its day's end."""

    idx: np.ndarray
    reward: np.ndarray
    last: np.ndarray
    ret: np.ndarray
    cost: np.ndarray | None = None
    """`qlearn`: per row, what changing the position by one contract at that bar costs (half spread + commission,
    price units)."""


def fold_rows(mid: np.ndarray, day_start: np.ndarray, stop: int, gamma: float) -> Rows:
    """The transitions of rows [0, stop): r_t = mid[t+1] - mid[t] inside a day; the day's final row has none."""
    reward = np.full(mid.shape, np.nan)
    ret = np.full(mid.shape, np.nan)
    last = np.zeros(mid.shape, dtype=bool)
    for a, b in zip(day_start[:-1], day_start[1:], strict=True):
        a, b = int(a), int(b)
        if b - a < 2:
            continue
        reward[a : b - 1] = np.diff(mid[a:b])
        last[b - 2] = True
        acc = 0.0
        for t in range(b - 2, a - 1, -1):
            acc = reward[t] + gamma * acc
            ret[t] = acc
    idx = np.arange(stop)[np.isfinite(reward[:stop])]
    return Rows(idx, reward, last, ret)


def adam(lc: LearnerConfig, steps: int, moments: list[np.ndarray] | None = None,
         eps: float = 1e-8) -> Callable[[int, np.ndarray, np.ndarray], np.ndarray]:
    """The learner's update as a function (step, w, grad) -> new w: Adam with its betas and `eps`, the cosine
    learning rate from lc.lr to lc.lr * lc.lr_min_frac over `steps`. `moments`: [m, v] to start from (updated in
    place; zeros if empty or None)."""
    moments = [] if moments is None else moments

    def update(step: int, w: np.ndarray, grad: np.ndarray) -> np.ndarray:
        if not moments:
            moments.extend([np.zeros_like(w), np.zeros_like(w)])
        m, v = moments
        m *= lc.adam_beta1
        m += (1 - lc.adam_beta1) * grad
        v *= lc.adam_beta2
        v += (1 - lc.adam_beta2) * grad * grad
        lr = lc.lr * (lc.lr_min_frac + (1 - lc.lr_min_frac) * 0.5 * (1 + math.cos(math.pi * step / steps)))
        m_hat, v_hat = m / (1 - lc.adam_beta1 ** (step + 1)), v / (1 - lc.adam_beta2 ** (step + 1))
        return w - lr * m_hat / (np.sqrt(v_hat) + eps)

    return update


def softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def project(p_next: np.ndarray, reward: np.ndarray, discount: np.ndarray, z: np.ndarray) -> np.ndarray:
    """C51's projection of the distribution reward + discount * Z (atoms z with probabilities p_next [B, A])
    onto the support z: each shifted atom's mass split between its two neighbours."""
    n, a = p_next.shape
    dz = z[1] - z[0]
    b = (np.clip(reward[:, None] + discount[:, None] * z[None, :], z[0], z[-1]) - z[0]) / dz
    lo = np.floor(b).astype(np.int64)
    hi = np.minimum(lo + 1, a - 1)
    frac = b - lo
    base = np.arange(n)[:, None] * a
    flat = np.bincount((base + lo).ravel(), (p_next * (1 - frac)).ravel(), minlength=n * a)
    flat += np.bincount((base + hi).ravel(), (p_next * frac).ravel(), minlength=n * a)
    return flat.reshape(n, a)


def learn_value(x: np.ndarray, rows: Rows, target: str, lc: LearnerConfig, seed: int, atoms: int = 51,
                spread: float = 0.0) -> np.ndarray:
    """The weights of a linear value learned as the agent's learner learns (Adam on uniform batches, cosine
    learning rate, Polyak target): w [M + 1] of V(x) = w.x + b (the bias last) for `td` and `mc` (mean squared
    error), W [M + 1, atoms] of the logits for `c51` (cross-entropy); `value(x, w)` reads either. `spread` is
    `qdir_cross_draw`'s env.explore_spread."""
    rng = np.random.default_rng(seed)
    xb = np.hstack([x, np.ones((len(x), 1))])
    shape = (xb.shape[1], atoms) if target == "c51" else (xb.shape[1], 2) if target in PARTIAL else (xb.shape[1],)
    w, w_tgt = np.zeros(shape), np.zeros(shape)
    steps = lc.epochs * lc.steps_per_epoch
    update = adam(lc, steps)
    discount = np.where(rows.last, 0.0, lc.gamma)
    if target in ("c51", "qdir_cross_c51"):
        half = 3 * np.mean(np.abs(rows.ret[rows.idx])) + 2 * np.mean(np.abs(rows.reward[rows.idx])) / math.sqrt(
            1 - lc.gamma**2)
        z = np.linspace(-half, half, atoms)
    if target == "qlearn":
        w, w_tgt = np.zeros((xb.shape[1], len(POSITIONS))), np.zeros((xb.shape[1], len(POSITIONS)))
    if target in DIRECTED:
        width = direction_features(xb[:1], 0.0, target in CROSSED).shape[1]
        shape = (width, N_DIRECTIONS, atoms) if target == "qdir_cross_c51" else (width, N_DIRECTIONS)
        w, w_tgt = np.zeros(shape), np.zeros(shape)
    visited = taken = None
    for step in range(steps):
        if target in BEHAVIOUR and step % lc.steps_per_epoch == 0:  # the epoch's collect
            noise = spread * float(np.std(rows.ret[rows.idx])) if target == "qdir_cross_draw" else 0.0
            visited, taken = visited_positions(xb, rows, w if step else None, rng, noise)
        i = rng.choice(rows.idx, size=lc.batch_size)
        if target == "qlearn":
            grad = qlearn_grad(xb, rows, i, w, w_tgt, lc.gamma)
        elif target == "qdir_cross_c51":
            grad = qdir_c51_grad(xb, rows, i, w, w_tgt, lc.gamma, z)
        elif target in DIRECTED:
            grad = qdir_grad(xb, rows, i, w, w_tgt, lc.gamma, target in CROSSED,
                             held=visited[i] if visited is not None else None,
                             taken=taken[i] if target in ("qdir_cross_taken", "qdir_cross_draw") else None)
        elif target in PARTIAL:
            grad = partial_grad(xb, rows, i, w, w_tgt, discount, target, rng)
        elif target == "c51":
            m = project(softmax(xb[i + 1] @ w_tgt), rows.reward[i], discount[i], z)
            grad = xb[i].T @ (softmax(xb[i] @ w) - m) / lc.batch_size
        else:
            y = rows.reward[i] + discount[i] * (xb[i + 1] @ w_tgt) if target == "td" else rows.ret[i]
            grad = 2.0 * xb[i].T @ (xb[i] @ w - y) / lc.batch_size
        w = update(step, w, grad)
        w_tgt = (1 - lc.tau) * w_tgt + lc.tau * w
    if target in PARTIAL:
        return (w[:, 0] - w[:, 1]) / 2
    if target == "qdir_cross_c51":  # the support as a last feature row, as `c51` returns it
        return np.concatenate([w, np.broadcast_to(z, (1, N_DIRECTIONS, atoms))])
    if target == "qlearn" or target in DIRECTED:
        return w
    return w if target != "c51" else np.vstack([w, z[None, :]])


def direction_features(xb: np.ndarray, q: float | np.ndarray, cross: bool) -> np.ndarray:
    """[n, F]: the features of rows xb [n, M + 1] (bias last) at held position q: [x, 1, q], and q x with `cross`."""
    qcol = np.broadcast_to(np.asarray(q, np.float64), (len(xb),))[:, None]
    parts = [xb, qcol] + ([qcol * xb[:, :-1]] if cross else [])
    return np.hstack(parts)


def next_position(q: float | np.ndarray) -> np.ndarray:
    """[..., 4]: the position each direction (Short, Hold, Long, Flat) targets from the held q (one contract)."""
    q = np.asarray(q, np.float64)[..., None]
    return np.concatenate(np.broadcast_arrays(-1.0 + 0 * q, q, 1.0 + 0 * q, 0 * q), axis=-1)


def direction_values(xb: np.ndarray, q: np.ndarray, w: np.ndarray, cross: bool) -> np.ndarray:
    """[n, 4]: the four direction values of rows xb [n, M + 1] at held positions q [n], without building the features:
    xb @ W_x + q (u + x @ W_qx) for the weights' blocks [x, 1 | q | q x]."""
    m1 = xb.shape[1]
    slope = w[m1] + (xb[:, :-1] @ w[m1 + 1 :] if cross else 0.0)
    return xb @ w[:m1] + q[:, None] * slope


def qdir_grad(xb: np.ndarray, rows: Rows, i: np.ndarray, w: np.ndarray, w_tgt: np.ndarray, gamma: float,
              cross: bool, held: np.ndarray | None = None, taken: np.ndarray | None = None) -> np.ndarray:
    """The squared TD error's gradient for the four direction values w [F, 4] on batch rows i, from every held
    position (`qdir` in the module header), averaged over the rows and the three positions; with `held` [B], from
    that position of each row alone (`qdir_cross_visited`); with `taken` [B] too, of that row's direction alone
    (`qdir_cross_taken`)."""
    assert rows.cost is not None
    grad = np.zeros_like(w)
    nxt = xb[i + 1]
    positions = [np.full(len(i), q) for q in POSITIONS] if held is None else [held]
    for q in positions:
        target = next_position(q)  # [B, 4]: the position each direction leaves held
        future = np.empty_like(target)
        for d in range(N_DIRECTIONS):
            best = direction_values(nxt, target[:, d], w_tgt, cross).max(axis=1)
            future[:, d] = np.where(rows.last[i], -rows.cost[i + 1] * np.abs(target[:, d]), gamma * best)
        y = -rows.cost[i][:, None] * np.abs(target - q[:, None]) + target * rows.reward[i][:, None] + future
        phi = direction_features(xb[i], q, cross)
        err = phi @ w - y
        if taken is not None:
            err = np.where(np.arange(N_DIRECTIONS) == taken[:, None], err, 0.0)
        grad += 2.0 * phi.T @ err / (len(i) * len(positions))
    return grad


def visited_positions(xb: np.ndarray, rows: Rows, w: np.ndarray | None, rng: np.random.Generator,
                      noise: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """float64 [rows] and int [rows]: the position held entering each training row, and the direction taken there,
    when the direction values w (`qdir_cross`'s features) trade every training day from flat: each bar the argmax
    direction, a uniformly random one with probability EXPLORE (every bar when w is None: the first epoch's
    collect); with `noise` > 0 instead the argmax of the values plus noise x a standard normal per direction
    (`qdir_cross_draw`). Rows outside the training days hold 0 and take Hold."""
    held = np.zeros(len(xb))
    taken = np.full(len(xb), int(Direction.HOLD))
    days = np.split(rows.idx, np.flatnonzero(np.diff(rows.idx) > 1) + 1)
    m1 = xb.shape[1]
    for day in days:
        q = 0.0
        explore = rng.random(len(day)) < EXPLORE if w is not None and noise == 0 else np.ones(len(day), bool)
        random_d = rng.integers(0, N_DIRECTIONS, len(day))
        if w is not None:  # direction values at held q: base + q slope (direction_values' blocks)
            base, slope = xb[day] @ w[:m1], w[m1] + xb[day][:, :-1] @ w[m1 + 1 :]
            if noise > 0:
                explore[:] = False
                base = base + noise * rng.standard_normal(base.shape)
        for k, t in enumerate(day):
            held[t] = q
            d = random_d[k] if explore[k] else int(np.argmax(base[k] + q * slope[k]))
            taken[t] = d
            q = float(next_position(q)[d])
    return held, taken


def direction_scores(phi: np.ndarray, w: np.ndarray) -> np.ndarray:
    """[n, 4]: the four direction values of features phi [n, F]: phi @ w, or for a C51 fit (w [F + 1, 4, atoms], the
    support as its last row) each direction's E[Z] = softmax(phi @ w_d) . z."""
    if w.ndim == 2:
        return phi @ w
    return np.stack([softmax(phi @ w[:-1, d]) @ w[-1, d] for d in range(N_DIRECTIONS)], axis=1)


def qdir_c51_grad(xb: np.ndarray, rows: Rows, i: np.ndarray, w: np.ndarray, w_tgt: np.ndarray, gamma: float,
                  z: np.ndarray) -> np.ndarray:
    """`qdir_cross_c51`: the cross-entropy gradient of the four directions' C51 logits w [F, 4, atoms] on batch rows
    i, from every held position (`qdir_cross`'s problem): the target of direction d from q is the distribution of
    -c |q' - q| + q' r + gamma Z_target(x', q', d*), d* the next direction of the largest E[Z] (at a day's last
    transition the forced close's cost and no future), projected onto the fixed support z."""
    assert rows.cost is not None
    grad = np.zeros_like(w)
    n = len(i)
    best = {}  # per next held position: the target network's distribution of its best direction
    for q2 in POSITIONS:
        phi2 = direction_features(xb[i + 1], q2, True)
        probs = np.stack([softmax(phi2 @ w_tgt[:, d]) for d in range(N_DIRECTIONS)], axis=1)
        best[float(q2)] = probs[np.arange(n), np.argmax(probs @ z, axis=1)]
    last = rows.last[i]
    for q in POSITIONS:
        phi = direction_features(xb[i], q, True)
        for d, target in enumerate(next_position(q)):
            reward = -rows.cost[i] * abs(target - q) + target * rows.reward[i]
            reward = np.where(last, reward - rows.cost[i + 1] * abs(target), reward)
            m = project(best[float(target)], reward, np.where(last, 0.0, gamma), z)
            grad[:, d] += phi.T @ (softmax(phi @ w[:, d]) - m) / (n * len(POSITIONS))
    return grad


def direction_positions(xb: np.ndarray, w: np.ndarray, cross: bool) -> np.ndarray:
    """float64 [bars]: one day traded by argmax over the four direction values from flat, flat at the last bar."""
    pos = np.zeros(len(xb))
    held = 0.0
    for t in range(len(xb) - 1):
        d = int(np.argmax(direction_scores(direction_features(xb[t : t + 1], held, cross), w)))
        held = float(next_position(held)[d])
        pos[t] = held
    return pos


def qlearn_grad(xb: np.ndarray, rows: Rows, i: np.ndarray, w: np.ndarray, w_tgt: np.ndarray,
                gamma: float) -> np.ndarray:
    """The squared TD error's gradient for the three position values w [M + 1, 3] on batch rows i, every row training
    every position (`qlearn` in the module header)."""
    assert rows.cost is not None
    q = POSITIONS[None, :]
    change = np.abs(POSITIONS[None, :, None] - POSITIONS[None, None, :])  # [1, q, q'']
    nxt = (xb[i + 1] @ w_tgt)[:, None, :] - rows.cost[i + 1][:, None, None] * change
    future = np.where(rows.last[i][:, None], -rows.cost[i + 1][:, None] * np.abs(q), gamma * nxt.max(axis=2))
    y = q * rows.reward[i][:, None] + future
    return 2.0 * xb[i].T @ (xb[i] @ w - y) / len(i)


def argmax_positions(values: np.ndarray, cost: np.ndarray) -> np.ndarray:
    """float64 [bars]: one day traded on position values [bars, 3] as the agent acts, from flat: each bar the
    position q' of the largest V(x, q') - cost |q' - q| given the held q, flat at the day's last bar."""
    pos = np.zeros(len(values))
    held = 0.0
    for t in range(len(values) - 1):
        held = float(POSITIONS[np.argmax(values[t] - cost[t] * np.abs(POSITIONS - held))])
        pos[t] = held
    return pos


def traded_argmax(act: Callable[[int, int], np.ndarray], m: FoldMarket, cfg: FoxConfig) -> tuple[float, float]:
    """Validation daily Sharpe and round trips per day of the positions act(first, stop) takes on each scored
    validation day's rows, with the probe's cost model (walkforward/metrics.py positions_to_days)."""
    half, commission = half_spread(m), cfg.env.commission
    windows = [(int(m.day_start[d]), int(m.day_start[d + 1])) for d in scored_days(m)]
    days = positions_to_days([act(a, b) for a, b in windows],
                             [m.mid[a:b] for a, b in windows], [half[a:b] for a, b in windows],
                             point_value=m.point_value, commission=commission)  # fmt: skip
    metrics = compute_metrics(days, annualisation_days=cfg.evaluation.annualisation_days)
    return metrics.sharpe_daily, metrics.round_trips / metrics.n_days


def partial_grad(xb: np.ndarray, rows: Rows, i: np.ndarray, w: np.ndarray, w_tgt: np.ndarray, discount: np.ndarray,
                 target: str, rng: np.random.Generator) -> np.ndarray:
    """The squared TD error's gradient for the long and short values w [M + 1, 2] on batch rows i, each value's
    term only over the transitions the behaviour policy of `target` (module header) took its position on; the sum
    is over the batch, divided by its size, as the learner averages a branch's loss over all its transitions."""
    n = len(i)
    side = np.full(n, -1)
    if target == "split":
        u = rng.random(n)
        side[u < TAKEN] = 0
        side[(u >= TAKEN) & (u < 2 * TAKEN)] = 1
    else:
        est = xb[i] @ (w[:, 0] - w[:, 1])
        top = np.argsort(-np.abs(est))[: int(2 * TAKEN * n)]
        side[top] = np.where(est[top] >= 0, 0, 1)
        rest = np.flatnonzero(side < 0)
        explore = rest[rng.random(rest.size) < EXPLORE]
        side[explore] = rng.integers(0, 2, explore.size)
    grad = np.zeros_like(w)
    for k, sign in ((0, 1.0), (1, -1.0)):
        j = i[side == k]
        y = sign * rows.reward[j] + discount[j] * (xb[j + 1] @ w_tgt[:, k])
        grad[:, k] = 2.0 * xb[j].T @ (xb[j] @ w[:, k] - y) / n
    return grad


def value(xb: np.ndarray, w: np.ndarray) -> np.ndarray:
    """V of every row of xb [n, M + 1] (the bias column last): w.x, or E[Z] = softmax(x W) . z for a C51 fit
    (learn_value returns its W with the support z as a last row)."""
    return xb @ w if w.ndim == 1 else softmax(xb @ w[:-1]) @ w[-1]


def correlation(signal: np.ndarray, move: np.ndarray, rows: np.ndarray) -> float:
    ok = rows & np.isfinite(move)
    return float(np.corrcoef(signal[ok], move[ok])[0, 1])


def traded(cols: np.ndarray, m: FoldMarket, ridge: float, cfg: FoxConfig) -> tuple[float, float]:
    """Validation daily Sharpe and round trips per day of a fit of the probe's target on `cols` [n, k] over the
    training rows, traded on the scored validation days by the oracle's rule (tools/signal_probe.py's trade)."""
    ev = cfg.evaluation
    r = probe_baseline(cols, m.mid, half_spread(m), m.day_start, slice(0, m.train_stop), scored_days(m), ridge=ridge,
                       horizon=ev.probe_horizon_bars, tick_size=m.tick_size, point_value=m.point_value,
                       commission=cfg.env.commission, annualisation_days=ev.annualisation_days)  # fmt: skip
    return r.metrics.sharpe_daily, r.metrics.round_trips / r.metrics.n_days


def signal_of(target: str, xb: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Each row's scalar signal of a fit: the value, or for the position and direction values half the long one
    minus the short one (flat held)."""
    if target == "qlearn":
        return (xb @ w[:, 2] - xb @ w[:, 0]) / 2
    if target in DIRECTED:
        scores = direction_scores(direction_features(xb, 0.0, target in CROSSED), w)
        return (scores[:, 2] - scores[:, 0]) / 2
    return value(xb, w)


def acting(target: str, xb: np.ndarray, w: np.ndarray, cost: np.ndarray) -> Callable[[int, int], np.ndarray]:
    """The argmax trader of a Q fit: (first, stop) -> the positions it takes on those rows."""
    if target == "qlearn":
        return lambda a, b: argmax_positions(xb[a:b] @ w, cost[a:b])
    return lambda a, b: direction_positions(xb[a:b], w, target in CROSSED)


def mean_se(values: list[float], digits: int = 3, sign: str = "+") -> str:
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else float("nan")
    return f"{statistics.fmean(values):{sign}.{digits}f} ({se:.{digits}f})"


def probe_setup(store: Path | None, sets: list[str]) -> tuple[FoxConfig, MarketSelection, FeatureSet, FeatureConfig]:
    """A CPU probe's market: the default preset on `store` (else the embedded default market) with the `--set`
    overrides, its selection, its features, and the feature config without forecast columns (the probes read the
    market columns alone)."""
    cfg = load_config("default", overrides=[f'market.store="{store or ensure_default_store()}"', *sets])
    selection = select_market(cfg.market)
    plain = FeatureConfig(**{**vars(cfg.features), "forecast_horizons": []})
    return cfg, selection, load_features(cfg, selection), plain


def finish_table(lines: list[str], out: Path | None, tool: str, argv: list[str] | None, title: str,
                 about: str) -> None:
    """Print a probe's markdown table; with `out`, also write it under `title` with the command that made it (tool
    and argv) and the paragraph `about`."""
    table = "\n".join(lines) + "\n"
    print(table, end="")
    if out is not None:
        command = f"python3 tools/{tool} " + " ".join(argv if argv is not None else sys.argv[1:])
        out.write_text(f"# {title}\n\nCommand: `{command}`\n\n{about}\n\n{table}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", type=Path, help="market store (default: the embedded default market)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--targets", nargs="+", choices=TARGETS, default=list(TARGETS), help="the fits to run")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE", help="config override")
    parser.add_argument("--out", type=Path, help="also write the table to this markdown file")
    args = parser.parse_args(argv)
    cfg, selection, features, plain = probe_setup(args.store, args.set)
    lc, horizon = cfg.learner, cfg.evaluation.probe_horizon_bars
    lines = [f"| fold | signal | corr. with the {horizon}-bar move, validation days | same, training rows | "
             "traded: validation daily Sharpe | traded: round trips/day |",
             "| ---: | --- | ---: | ---: | ---: | ---: |"]
    for fold in make_folds(cfg.folds, selection.days):
        m = FoldMarket.build(features, fold, plain, cfg.env)
        x = np.asarray(m.market_obs, dtype=np.float64)  # the run's market part, the block included when on
        all_rows = np.arange(m.n_rows)
        train, val = all_rows < m.train_stop, all_rows >= m.val_start
        move = forward_change(m.mid, m.day_start, horizon)
        probe = fit_probe(x, move, slice(0, m.train_stop), ridge=cfg.features.forecast_ridge, horizon=horizon)
        signal = (x - probe.x_mean) @ probe.weights
        sharpe, trips = traded(m.market_obs, m, cfg.evaluation.probe_ridge, cfg)
        lines.append(f"| {fold.index} | probe (ridge, {horizon}-bar change) | {correlation(signal, move, val):+.3f} | "
                     f"{correlation(signal, move, train):+.3f} | {sharpe:+.2f} | {trips:.1f} |")
        rows = fold_rows(np.asarray(m.mid, dtype=np.float64), m.day_start, m.train_stop, lc.gamma)
        rows = dataclasses.replace(rows, cost=half_spread(m) + cfg.env.commission / m.point_value)
        xb = np.hstack([x, np.ones((len(x), 1))])
        for target in args.targets:
            fits = [learn_value(x, rows, target, lc, seed, cfg.network.n_atoms, cfg.env.explore_spread)
                    for seed in args.seeds]
            signals = [signal_of(target, xb, w) for w in fits]
            scores = [(correlation(v, move, val), correlation(v, move, train), *traded(v[:, None], m, 0.0, cfg))
                      for v in signals]  # fmt: skip
            lines.append(f"| {fold.index} | {target} | {mean_se([s[0] for s in scores])} | "
                         f"{mean_se([s[1] for s in scores])} | {mean_se([s[2] for s in scores], 2)} | "
                         f"{mean_se([s[3] for s in scores], 1, '')} |")
            print(lines[-1], flush=True)
            if target == "qlearn" or target in DIRECTED:
                acts = [traded_argmax(acting(target, xb, w, rows.cost), m, cfg) for w in fits]
                lines.append(f"| {fold.index} | {target} argmax | n/a | n/a | {mean_se([a[0] for a in acts], 2)} | "
                             f"{mean_se([a[1] for a in acts], 1, '')} |")
                print(lines[-1], flush=True)
    finish_table(lines, args.out, "td_probe.py", argv, "One-step TD against the probe on the same linear read",
                 f"Store: {selection.path}, {len(selection.days)} days; seeds {args.seeds}; learner: lr {lc.lr} "
                 f"(cosine to x{lc.lr_min_frac}), batch {lc.batch_size}, {lc.epochs * lc.steps_per_epoch} steps, "
                 f"gamma {lc.gamma}, tau {lc.tau}. Mean (standard error) over the seeds. Traded: each signal fitted "
                 f"ridge-free to the {horizon}-bar change on the training rows (the probe: its market columns, ridge "
                 f"{cfg.evaluation.probe_ridge}) and traded on the validation days by the oracle's rule, as "
                 "tools/signal_probe.py trades the agent's signal.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
