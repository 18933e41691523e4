"""Do the agent's portfolio columns cost its counterfactual learner the linear fit's read? (CPU)

    python3 tools/port_probe.py [--store STORE.h5] [--modes plain agent history] [--seeds 0 1 2] [--ensemble K] \
        [--mirror [batch|project]] [--set folds.n_folds=1 --set folds.val_days=30 --set folds.step_days=30] \
        [--out tools/results/NAME.md]

The agent with learner.counterfactual + counterfactual_held on the mean head's position x market input (`meancf`)
earns about half of what the same values earn in tools/td_probe.py's linear fit (`qdir_cross`). That fit differs
from the agent's learner in two ways this tool separates, on the same four direction values linear in
[x, 1, q, q x] (x the 128 market columns, q the held position), Adam with the learner's schedule, a Polyak target,
one-step targets -c |q' - q| + q' r + gamma max_d' Q_target(s', d') (the forced close at a day's end), and the same
trade by argmax on the validation days:

- the batch: `qdir_cross` prices every direction from all three positions on batch_size rows each step; the agent's
  counterfactual batch holds batch_size / 4 transitions, one in four at the state its behaviour policy visited and
  three re-held at -1, 0 and +1 (kernels/counterfactual.py). Here the behaviour policy is the values' own argmax plus
  env.explore_spread x the return's standard deviation x a normal draw per direction (td_probe's `qdir_cross_draw`
  rule), re-run over every training day from flat once per epoch (random in the first);
- the portfolio columns: the agent's heads also read the unrealised PnL u, the bars in position h and the bars left
  L (observation.PORTFOLIO: u = q (mid - entry) / risk unit clipped to +-5, h = bars / env.episode_bars and L = bars
  to the day's end / env.episode_bars, both capped at 1). A re-held state enters at the bar's mid one bar earlier:
  u = 0 and h one bar, whatever the market did; the states the policy visits, and the validation days, carry the
  position's real history.

Modes (each a row of the table):
- `plain`: the agent's batch on [x, 1, q, q x] (no portfolio columns): against td_probe's `qdir_cross` row, what the
  batch's composition costs;
- `agent`: the agent's batch on [x, 1, q, q x, u, h, L], re-held states as the agent builds them;
- `history`: the same, each re-held state given a history: entered k bars earlier at that bar's mid, k uniform in
  [1, min(bars since the day's start, --history-bars)], so u and h take the values a held position has;
- `left`: the agent's batch on [x, 1, q, q x, L]: the portfolio columns without the position's history.

Fills are at the mid with the cost c (half spread + commission) charged per contract changed, as td_probe's. One
fold per row of the plan; mean (SE) over the seeds (the seed draws the batches and the behaviour policy's noise).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT))

from td_probe import (  # noqa: E402
    Rows,
    adam,
    finish_table,
    fold_rows,
    mean_se,
    next_position,
    probe_setup,
    traded_argmax,
)

from fox_numba.actions import N_DIRECTIONS  # noqa: E402
from fox_numba.agent.fold_market import FoldMarket  # noqa: E402
from fox_numba.config import FoxConfig, LearnerConfig  # noqa: E402
from fox_numba.kernels.optim import ADAM_SHRINK_M, ADAM_SHRINK_V  # noqa: E402
from fox_numba.observation import N_MARKET, UPNL_CLIP  # noqa: E402
from fox_numba.walkforward.driver import half_spread, scored_days  # noqa: E402
from fox_numba.walkforward.folds import make_folds  # noqa: E402

PORT_COLUMNS = {"plain": (), "agent": (0, 1, 2), "history": (0, 1, 2), "left": (2,)}
"""Each mode's portfolio columns, of u, h, L (Book.columns; module header)."""
MODES = tuple(PORT_COLUMNS)


@dataclasses.dataclass(frozen=True)
class Book:
    """What the portfolio columns need per row: the mid, the risk unit in price units (env.max_position x the
    one-bar move's standard deviation), env.episode_bars, each row's day start and day's last row."""

    mid: np.ndarray
    risk: float
    episode_bars: int
    first: np.ndarray
    last_row: np.ndarray

    @classmethod
    def of(cls, mid: np.ndarray, day_start: np.ndarray, train_stop: int, max_position: int,
           episode_bars: int) -> Book:
        first = np.zeros(len(mid), np.int64)
        last_row = np.zeros(len(mid), np.int64)
        moves = []
        for a, b in zip(day_start[:-1], day_start[1:], strict=True):
            first[a:b], last_row[a:b] = a, b - 1
            if b <= train_stop:
                moves.append(np.diff(mid[a:b]))
        return cls(mid, max_position * float(np.std(np.concatenate(moves))), episode_bars, first, last_row)

    def columns(self, t: np.ndarray, q: np.ndarray, entry: np.ndarray, bars: np.ndarray) -> np.ndarray:
        """[n, 3]: u, h, L of rows t held at q entered at `entry` `bars` bars ago (u = h = 0 when flat)."""
        u = np.where(q != 0, np.clip(q * (self.mid[t] - entry) / self.risk, -UPNL_CLIP, UPNL_CLIP), 0.0)
        h = np.where(q != 0, np.minimum(bars / self.episode_bars, 1.0), 0.0)
        left = np.minimum((self.last_row[t] - t) / self.episode_bars, 1.0)
        return np.stack([u, h, left], axis=1)


def features(xb: np.ndarray, q: np.ndarray, port: np.ndarray) -> np.ndarray:
    """[n, F]: [x, 1, q, q x] of rows xb [n, M + 1] (bias last) at held positions q [n], then the portfolio columns
    port [n, k] (k may be 0)."""
    return np.hstack([xb, q[:, None], q[:, None] * xb[:, :-1], port])


def step_portfolio(q: np.ndarray, entry: np.ndarray, bars: np.ndarray, q_next: np.ndarray,
                   mid_now: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(entry, bars) after moving from q to q_next at a bar of mid `mid_now`: a position kept on its side keeps its
    entry and counts one bar more; a new side enters at the mid with one bar; flat holds none."""
    kept = (q_next == q) & (q != 0)
    new_entry = np.where(kept, entry, mid_now)
    new_bars = np.where(kept, bars + 1, np.where(q_next != 0, 1, 0))
    return new_entry, new_bars


def held_states(book: Book, t: np.ndarray, mode: str, history: int,
                rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(q, entry, bars) of transitions t re-held at -1, 0, +1 by t's position in the batch (i mod 4 = 1, 2, 3):
    entered one bar earlier at the bar's mid (`agent`), or k bars earlier at that bar's mid (`history`)."""
    q = (np.arange(len(t)) % 4 - 2).astype(np.float64)
    if mode == "history":
        k = 1 + np.floor(rng.random(len(t)) * np.minimum(t - book.first[t], history)).astype(np.int64)
        k = np.maximum(k, 1)
        entry = book.mid[np.maximum(t - k, book.first[t])]
        return q, np.where(q != 0, entry, 0.0), np.where(q != 0, k, 0)
    return q, np.where(q != 0, book.mid[t], 0.0), np.where(q != 0, 1, 0)


def held_target(xb: np.ndarray, book: Book, rows: Rows, t: np.ndarray, q: np.ndarray, qn: np.ndarray,
                w_tgt: np.ndarray, gamma: float, cols: tuple[int, ...], n_step: int) -> np.ndarray:
    """The `n_step` target of moving from q to qn at rows t and holding qn for n_step bars: the cost of the move,
    the discounted PnL of the bars held, then gamma^n_step max_d Q_target at the row reached, or the forced close's
    cost where the day ends first (its last row). Only for modes whose portfolio columns do not follow the held
    position's history (u and h), since the bootstrap row's columns are priced from t alone."""
    assert rows.cost is not None
    y = -rows.cost[t] * np.abs(qn - q)
    alive = np.ones(len(t), bool)
    tk, disc = t.copy(), 1.0
    for _ in range(n_step):
        y = y + np.where(alive, disc * qn * rows.reward[tk], 0.0)
        ends = alive & rows.last[tk]
        y = y - np.where(ends, disc * rows.cost[np.minimum(tk + 1, len(rows.cost) - 1)] * np.abs(qn), 0.0)
        alive &= ~rows.last[tk]
        tk = np.where(alive, tk + 1, tk)
        disc *= gamma
    unused = np.zeros(len(t))
    phi = features(xb[tk], qn, book.columns(tk, qn, unused, unused)[:, cols])
    return y + np.where(alive, disc * (phi @ w_tgt).max(axis=1), 0.0)


def batch_grad(xb: np.ndarray, book: Book, rows: Rows, t: np.ndarray, q: np.ndarray, entry: np.ndarray,
               bars: np.ndarray, w: np.ndarray, w_tgt: np.ndarray, gamma: float,
               cols: tuple[int, ...], n_step: int = 1, flat_one_step: bool = False) -> np.ndarray:
    """The squared TD error's gradient of the four direction values w [F, 4] on transitions t held at q (entry,
    bars), every direction priced (one step, or held n_step bars: `held_target`; with `flat_one_step` a direction
    whose reached position is flat keeps the one-step target): 2 phi^T (phi w - y) / n."""
    assert rows.cost is not None
    phi = features(xb[t], q, book.columns(t, q, entry, bars)[:, cols])
    targets = next_position(q)  # [n, 4]
    y = np.empty_like(targets)
    last = rows.last[t]
    for d in range(N_DIRECTIONS):
        qn = targets[:, d]
        if n_step > 1 and not (flat_one_step and (qn == 0).any()):
            y[:, d] = held_target(xb, book, rows, t, q, qn, w_tgt, gamma, cols, n_step)
            continue
        e2, b2 = step_portfolio(q, entry, bars, qn, book.mid[t])
        phi2 = features(xb[t + 1], qn, book.columns(t + 1, qn, e2, b2)[:, cols])
        future = np.where(last, -rows.cost[t + 1] * np.abs(qn), gamma * (phi2 @ w_tgt).max(axis=1))
        y[:, d] = -rows.cost[t] * np.abs(qn - q) + qn * rows.reward[t] + future
        if n_step > 1:  # flat_one_step: the rows whose reached position is not flat are held
            held = held_target(xb, book, rows, t, q, qn, w_tgt, gamma, cols, n_step)
            y[:, d] = np.where(qn == 0, y[:, d], held)
    return 2.0 * phi.T @ (phi @ w - y) / len(t)


def trade_day(xb: np.ndarray, book: Book, a: int, b: int, w: np.ndarray, cols: tuple[int, ...],
              noise: np.ndarray | None = None, every: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Rows [a, b) of one day traded from flat by the argmax of the values (plus `noise` [b - a, 4] when given),
    deciding at every `every`-th row of the day and holding between, flat at the last row: (position after each
    row's decision, and the held q, entry and bars entering it)."""
    n = b - a
    held, entry, bars, after = np.zeros(n), np.zeros(n), np.zeros(n, np.int64), np.zeros(n)
    q, e, h = 0.0, 0.0, 0
    m1 = xb.shape[1]
    base = xb[a:b] @ w[:m1]
    slope = w[m1] + xb[a:b, :-1] @ w[m1 + 1 : 2 * m1]
    rows = np.arange(a, b)
    for k in range(n - 1):
        held[k], entry[k], bars[k] = q, e, h
        v = base[k] + q * slope[k]
        if cols:
            v = v + book.columns(rows[k : k + 1], np.array([q]), np.array([e]), np.array([h]))[0, cols] @ w[2 * m1 :]
        if noise is not None:
            v = v + noise[k]
        q_next = float(next_position(q)[int(np.argmax(v))]) if k % every == 0 else q
        e_new, h_new = step_portfolio(np.array([q]), np.array([e]), np.array([h]), np.array([q_next]),
                                      book.mid[rows[k : k + 1]])
        q, e, h = q_next, float(e_new[0]), int(h_new[0])
        after[k] = q
    held[n - 1], entry[n - 1], bars[n - 1] = q, e, h
    return after, held, entry, bars


def behaviour(xb: np.ndarray, book: Book, rows: Rows, w: np.ndarray | None, cols: tuple[int, ...], noise: float,
              rng: np.random.Generator, every: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(q, entry, bars) entering every training row when the values w trade each training day from flat with the
    draw rule (module header), deciding every `every` bars; a uniformly random direction at each decision when w is
    None (the first epoch)."""
    q, entry, bars = np.zeros(len(xb)), np.zeros(len(xb)), np.zeros(len(xb), np.int64)
    days = np.split(rows.idx, np.flatnonzero(np.diff(rows.idx) > 1) + 1)
    width = 2 * xb.shape[1] + len(cols)
    for day in days:
        a, b = int(day[0]), int(day[-1]) + 2  # the rows with a next bar, and the day's last row
        if w is None:
            draws = rng.standard_normal((b - a, N_DIRECTIONS))
            _, q[a:b], entry[a:b], bars[a:b] = trade_day(xb, book, a, b, np.zeros((width, N_DIRECTIONS)), cols,
                                                         draws, every)
        else:
            draws = noise * rng.standard_normal((b - a, N_DIRECTIONS))
            _, q[a:b], entry[a:b], bars[a:b] = trade_day(xb, book, a, b, w, cols, draws, every)
    return q, entry, bars


def enters_average(step: int, steps_per_epoch: int, average: str, start: int) -> bool:
    """Whether the weights after `step` (0-based) enter the traded average (`learn`): with 'epoch' an epoch's last
    step from epoch `start` on, with 'step' every step from there; with 'none' none (the last weights are traded)."""
    epoch, last = step // steps_per_epoch, (step + 1) % steps_per_epoch == 0
    return epoch >= start and (average == "step" or (average == "epoch" and last))


@dataclasses.dataclass
class Carry:
    """What a fold hands the next (`--carry`): the last weights and Adam's moments, as the agent's fold boundary
    does with learner.fold_keep = keep: w = keep w (the replica's fresh weights are zero), m *= 0.1, v *= 0.01,
    the step and the schedule from 0, the target re-synced (walkforward/trainer_state.py)."""

    w: np.ndarray
    moments: list[np.ndarray]

    def start(self, keep: float) -> tuple[np.ndarray, list[np.ndarray]]:
        m, v = self.moments
        return keep * self.w, [ADAM_SHRINK_M * m, ADAM_SHRINK_V * v]


def initial_weights(n_in: int, bias_row: int, scale: float, seed: int) -> np.ndarray:
    """The values' starting weights [n_in, 4] (rows as `features` orders them): the agent's mean-head draw
    (Xavier-uniform, U(+-sqrt(6 / (n_in + 4))), agent/network.py init_params) times `scale`
    (network.head_init_scale), the bias row at 0 as the agent's bias; zeros at scale 0. Drawn from a generator of
    its own, so the batches' draws do not move."""
    w = np.zeros((n_in, N_DIRECTIONS))
    if scale > 0:
        bound = scale * math.sqrt(6.0 / (n_in + N_DIRECTIONS))
        w[:] = np.random.default_rng([seed, 1]).uniform(-bound, bound, w.shape)
        w[bias_row] = 0.0
    return w


AGENT_GRAD_SCALE = 1.0 / 8.0
"""The agent's mean-head gradient over this fit's: sum over B rows of e x / B (kernels/mean_head.py, w_i = 1 / B)
against 2 / n times the sum over n = B / 4 transitions of their four directions' e x (`batch_grad`)."""


def in_risk_units(rows: Rows, risk_points: float) -> Rows:
    """`rows` with rewards, returns and costs divided by the agent's risk unit in price points (env.max_position x
    the one-bar mid change's standard deviation: FoldMarket.risk_unit / point_value), the units of its rewards."""
    assert rows.cost is not None
    return dataclasses.replace(rows, reward=rows.reward / risk_points, ret=rows.ret / risk_points,
                               cost=rows.cost / risk_points)


def mirrored(xb: np.ndarray, rows: Rows) -> tuple[np.ndarray, Rows]:
    """The market mirrored about its prices (tools/symmetry_probe.py): the signed market columns of xb [n, M + 1]
    negated (the bias column last stays), and every bar's price change, so each reward q' r, negated."""
    from symmetry_probe import signed_columns

    xm = xb.copy()
    xm[:, signed_columns()] *= -1.0
    return xm, dataclasses.replace(rows, reward=-rows.reward, ret=-rows.ret)


MIRROR_DIRECTIONS = np.array([2, 1, 0, 3])
"""The direction each one becomes in the mirror: Short and Long swap, Hold and Flat stay (actions.Direction)."""


def mirror_parity(n_x: int, cols: tuple[int, ...]) -> np.ndarray:
    """[F]: +1 for a feature the mirror leaves, -1 for one it negates, in `features`' order [x, 1, q, q x, port]:
    the signed market columns -1, the bias +1, q -1, q x_signed +1, q x_unsigned -1; of the portfolio columns
    only the bars left (L) is allowed, +1 (`mirrored`)."""
    from symmetry_probe import signed_columns

    x = np.ones(n_x)
    x[signed_columns()] = -1.0
    x[N_MARKET:] = -1.0  # the time-weighted imbalance and forecast columns are odd (observation.mirror_parity)
    return np.concatenate([x, [1.0, -1.0], -x, np.ones(len(cols))])


def mirror_project(w: np.ndarray, parity: np.ndarray, strength: float = 1.0) -> np.ndarray:
    """The weights [F, 4] moved the fraction `strength` of the way to mirror-symmetric ones, Q(mirror x, -q, sigma d)
    = Q(x, q, d): the mean of w and its mirror image parity * w[:, sigma] (odd inputs then carry no Hold or Flat
    value, and Short and Long share the rest with opposite signs on the odd inputs); kernels/mirror.py's rule
    (network.mirror_strength)."""
    symmetric = 0.5 * (w + parity[:, None] * w[:, MIRROR_DIRECTIONS])
    return symmetric if strength == 1.0 else w + strength * (symmetric - w)


def learn(xb: np.ndarray, book: Book, rows: Rows, mode: str, lc: LearnerConfig, seed: int, spread: float,
          history: int, n_step: int = 1, average: str = "none", average_start: int = 1,
          start: tuple[np.ndarray, list[np.ndarray]] | None = None,
          init_scale: float = 0.0, agent_units: bool = False, mirror: str = "none", mirror_strength: float = 1.0,
          flat_one_step: bool = False, every: int = 1) -> tuple[np.ndarray, Carry]:
    """The four direction values' weights [F, 4] learned from the agent's counterfactual batches (module header),
    and the state a next fold would carry. `average`: 'none' trades the last step's weights; 'epoch' the mean of
    the epoch-end weights from epoch `average_start` on (the agent's evaluation.network = 'average'); 'step' the
    mean of every step's weights from that epoch on (Polyak-Ruppert averaging). `start`: the weights and Adam
    moments to begin from (Carry.start), else `initial_weights` with `init_scale` (0: zeros); a carried or random
    start also drives the first epoch's behaviour. `agent_units`: the gradient of the agent's mean-head loss, the
    mean over the batch's rows (each a transition's direction) of e**2 / 2, one eighth of this fit's 2 / n sum
    over transitions, and Adam with the agent's epsilon (learner.adam_eps); pass rows in risk units with it
    (`in_risk_units`). `mirror` (modes plain and left only, whose portfolio columns do not read the price):
    'batch' makes each step's gradient the mean of the batch's and of its mirror's (`mirrored`: the same transitions
    in the market reflected about its prices, held at -q); 'project' projects the weights onto the mirror-symmetric
    ones after each step (`mirror_project`; `mirror_strength` of the way there); 'none' neither. `flat_one_step`:
    with n_step > 1, the directions that reach flat keep one-step targets (`batch_grad`). `every`: the behaviour
    policy decides every that many bars and holds between (`trade_day`)."""
    rng = np.random.default_rng(seed)
    xm, rows_m = mirrored(xb, rows) if mirror == "batch" else (xb, rows)
    parity = mirror_parity(xb.shape[1] - 1, PORT_COLUMNS[mode])
    cols = PORT_COLUMNS[mode]
    n_in = 2 * xb.shape[1] + len(cols)
    w = initial_weights(n_in, xb.shape[1] - 1, init_scale, seed) if start is None else start[0].copy()
    w_tgt = w.copy()
    steps = lc.epochs * lc.steps_per_epoch
    moments = [] if start is None else [a.copy() for a in start[1]]
    update = adam(lc, steps, moments, lc.adam_eps if agent_units else 1e-8)
    grad_scale = AGENT_GRAD_SCALE if agent_units else 1.0
    noise = spread * float(np.std(rows.ret[rows.idx]))
    n = lc.batch_size // 4
    total, count = np.zeros_like(w), 0
    for step in range(steps):
        if step % lc.steps_per_epoch == 0:
            drawn = step or start is not None or init_scale > 0
            vq, ve, vb = behaviour(xb, book, rows, w if drawn else None, cols, noise, rng, every)
        t = rng.choice(rows.idx, size=n)
        q, entry, bars = held_states(book, t, mode, history, rng)
        stored = np.arange(n) % 4 == 0
        q, entry, bars = (np.where(stored, vq[t], q), np.where(stored, ve[t], entry), np.where(stored, vb[t], bars))
        g = batch_grad(xb, book, rows, t, q, entry, bars, w, w_tgt, lc.gamma, cols, n_step, flat_one_step)
        if mirror == "batch":
            g = 0.5 * (g + batch_grad(xm, book, rows_m, t, -q, entry, bars, w, w_tgt, lc.gamma, cols, n_step,
                                      flat_one_step))
        w = update(step, w, grad_scale * g)
        if mirror == "project":
            w = mirror_project(w, parity, mirror_strength)
        w_tgt = (1 - lc.tau) * w_tgt + lc.tau * w
        if enters_average(step, lc.steps_per_epoch, average, average_start):
            total, count = total + w, count + 1
    return (total / count if count else w), Carry(w, moments)


def fold_inputs(m: FoldMarket, cfg: FoxConfig, agent_units: bool) -> tuple[np.ndarray, Book, Rows]:
    """A fold's [x, 1] rows (every market column of m), its book and its training transitions with the probe's cost
    (half spread + commission), in the agent's risk units with `agent_units`: what `learn` fits on."""
    x = np.asarray(m.market_obs, dtype=np.float64)
    xb = np.hstack([x, np.ones((len(x), 1))])
    mid = np.asarray(m.mid, dtype=np.float64)
    book = Book.of(mid, m.day_start, m.train_stop, cfg.env.max_position, cfg.env.episode_bars)
    rows = fold_rows(mid, m.day_start, m.train_stop, cfg.learner.gamma)
    rows = dataclasses.replace(rows, cost=half_spread(m) + cfg.env.commission / m.point_value)
    return xb, book, (in_risk_units(rows, m.risk_unit / m.point_value) if agent_units else rows)


def in_market(xb: np.ndarray, book: Book, w: np.ndarray, cols: tuple[int, ...], m: FoldMarket,
              every: int = 1) -> float:
    """Fraction of the scored validation days' rows the values' argmax enters holding a position (`trade_day`)."""
    held = [trade_day(xb, book, int(m.day_start[d]), int(m.day_start[d + 1]), w, cols, None, every)[1]
            for d in scored_days(m)]  # fmt: skip
    return float(np.mean(np.concatenate(held) != 0))


def ensembles(fits: list[np.ndarray], k: int) -> list[np.ndarray]:
    """The mean weights of each group of k consecutive fits (seeds in order): an ensemble of k values linear in the
    same columns is the linear values of their mean weights, so it trades as one."""
    return [np.mean(fits[i : i + k], axis=0) for i in range(0, len(fits), k)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", type=Path, help="market store (default: the embedded default market)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--history-bars", type=int, default=60, help="`history`: the longest re-held history")
    parser.add_argument("--n-step", type=int, default=1, help="targets of holding the reached position this many "
                        "bars (`held_target`; plain and left only)")
    parser.add_argument("--flat-one-step", action="store_true", help="with --n-step above 1, the directions that "
                        "reach flat keep one-step targets (`batch_grad`): holding a position is valued over the "
                        "bars held, staying out is not tied up for them")
    parser.add_argument("--decide-every", type=int, default=1, metavar="N", help="the behaviour policy and the "
                        "validation trading decide every N bars of a day and hold between (`trade_day`): the "
                        "execution a held target of N bars values")
    parser.add_argument("--average", choices=("none", "epoch", "step"), default="none",
                        help="weights traded: the last step's, the mean of the epoch-end ones, or of every step's, "
                        "from epoch --average-start on (`learn`)")
    parser.add_argument("--average-start", type=int, default=1, help="first epoch averaged (0-based)")
    parser.add_argument("--forecast", action="store_true", help="x also holds the forecast columns of "
                        "features.forecast_horizons (set them with --set), crossed with q as the market columns are")
    parser.add_argument("--carry", type=float, metavar="KEEP", help="each fold after the first starts from the last "
                        "one's weights x KEEP and its Adam moments shrunk, as the agent's learner.fold_keep (`Carry`); "
                        "default: every fold from zero")
    parser.add_argument("--init-scale", type=float, default=0.0, help="start the weights from the agent's mean-head "
                        "draw times this (network.head_init_scale; `initial_weights`), not from zero")
    parser.add_argument("--agent-units", action="store_true", help="rewards in the agent's risk units, its "
                        "mean-head loss's gradient scale and its Adam epsilon (`learn`, `in_risk_units`)")
    parser.add_argument("--mirror", nargs="?", const="batch", choices=("none", "batch", "project"), default="none",
                        help="the market's "
                        "up/down symmetry: train on each batch and its mirror, or project the weights onto the "
                        "symmetric ones after each step (`learn`; modes plain and left)")
    parser.add_argument("--mirror-strength", type=float, default=1.0, metavar="S", help="with --mirror project: "
                        "move the weights the fraction S of the way to the symmetric ones (network.mirror_strength)")
    parser.add_argument("--ensemble", type=int, metavar="K", help="also trade the mean of K seeds' weights: the seeds "
                        "in order in groups of K, each group's averaged weights traded (`ensembles`)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE", help="config override")
    parser.add_argument("--out", type=Path, help="also write the table to this markdown file")
    args = parser.parse_args(argv)
    if args.ensemble is not None and not (2 <= args.ensemble <= len(args.seeds)
                                          and len(args.seeds) % args.ensemble == 0):
        parser.error(f"--ensemble {args.ensemble}: K must be at least 2 and divide the {len(args.seeds)} seeds")
    if args.n_step < 1 or (args.n_step > 1 and {"agent", "history"} & set(args.modes)):
        parser.error("--n-step must be >= 1, and above 1 only with the modes plain and left")
    if args.flat_one_step and args.n_step == 1:
        parser.error("--flat-one-step needs --n-step above 1")
    if args.decide_every < 1:
        parser.error("--decide-every must be >= 1 bar")
    if not 0.0 < args.mirror_strength <= 1.0 or (args.mirror_strength != 1.0 and args.mirror != "project"):
        parser.error("--mirror-strength: in (0, 1], and below 1 only with --mirror project")
    if args.mirror != "none" and {"agent", "history"} & set(args.modes):
        parser.error("--mirror: only the modes plain and left (their portfolio columns do not read the price)")
    cfg, selection, feats, plain = probe_setup(args.store, args.set)
    lc = cfg.learner
    lines = ["| fold | mode | traded by argmax: validation daily Sharpe | round trips/day | in market | per seed |",
             "| ---: | --- | ---: | ---: | ---: | --- |"]
    carried: dict[str, list[Carry]] = {}
    for fold in make_folds(cfg.folds, selection.days):
        m = FoldMarket.build(feats, fold, cfg.features if args.forecast else plain, cfg.env)
        xb, book, rows = fold_inputs(m, cfg, args.agent_units)
        for mode in args.modes:
            cols = PORT_COLUMNS[mode]
            prev = carried.get(mode) if args.carry is not None else None
            out = [learn(xb, book, rows, mode, lc, seed, cfg.env.explore_spread, args.history_bars, args.n_step,
                         args.average, args.average_start, prev[i].start(args.carry) if prev else None,
                         args.init_scale, args.agent_units, args.mirror, args.mirror_strength, args.flat_one_step,
                         args.decide_every)
                   for i, seed in enumerate(args.seeds)]
            fits, carried[mode] = [w for w, _ in out], [c for _, c in out]
            every = args.decide_every
            acts = [traded_argmax(lambda a, b, w=w: trade_day(xb, book, a, b, w, cols, None, every)[0], m, cfg)
                    for w in fits]  # fmt: skip
            held = [in_market(xb, book, w, cols, m, every) for w in fits]
            lines.append(f"| {fold.index} | {mode} | {mean_se([s for s, _ in acts], 2)} | "
                         f"{mean_se([r for _, r in acts], 1, '')} | {mean_se(held, 2, '')} | "
                         f"{' '.join(f'{s:+.2f}' for s, _ in acts)} |")
            print(lines[-1], flush=True)
            if args.ensemble is not None:
                groups = [traded_argmax(lambda a, b, w=w: trade_day(xb, book, a, b, w, cols, None, every)[0], m,
                                        cfg) for w in ensembles(fits, args.ensemble)]  # fmt: skip
                lines.append(f"| {fold.index} | {mode}, mean of {args.ensemble} seeds' weights | "
                             f"{mean_se([s for s, _ in groups], 2)} | {mean_se([r for _, r in groups], 1, '')} | | "
                             f"{' '.join(f'{s:+.2f}' for s, _ in groups)} |")
                print(lines[-1], flush=True)
    finish_table(lines, args.out, "port_probe.py", argv,
                 "The agent's counterfactual batch and portfolio columns in the linear fit",
                 f"Store: {selection.path}, {len(selection.days)} days; seeds {args.seeds}; learner: lr {lc.lr} "
                 f"(cosine to x{lc.lr_min_frac}), batch {lc.batch_size} ({lc.batch_size // 4} transitions x 4 "
                 f"directions), {lc.epochs * lc.steps_per_epoch} steps, gamma {lc.gamma}, tau {lc.tau}; behaviour "
                 f"spread {cfg.env.explore_spread}; history up to {args.history_bars} bars; targets of {args.n_step} "
                 f"bar(s) held{' (flat one bar)' if args.flat_one_step else ''}; decisions every "
                 f"{args.decide_every} bar(s); forecast columns: "
                 f"{cfg.features.forecast_horizons if args.forecast else 'none'}; "
                 f"weights traded: averaged '{args.average}' (from epoch {args.average_start}); folds after the "
                 f"first start from {'zero' if args.carry is None else f'the last x {args.carry}'}; initial weights: "
                 f"{'zero' if not args.init_scale else f'the mean head draw x {args.init_scale}'}; mirror: "
                 f"{args.mirror}{f' at strength {args.mirror_strength}' if args.mirror_strength != 1.0 else ''}; "
                 "units: "
                 f"{f'the agent (risk units, Adam eps {lc.adam_eps})' if args.agent_units else 'price points'}. Mean "
                 "(standard error) over the seeds of the validation daily Sharpe of the values' argmax from flat "
                 "each day, and each seed's (in order; a seed's random draws are the same in every variant, so two "
                 "variants pair by seed).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
