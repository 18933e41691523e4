"""Counterfactual direction targets (learner.counterfactual): every sampled transition trains all four direction heads.

Why: the greedy policy's data gives each direction head a target only where the current values already favour that
direction, so each head is fitted on the tails of its own choices (tools/results/learner_ablation_h200.md section
22: a linear TD fit of the same inputs trades well from every transition and badly from the greedy policy's share).
With market orders at one fixed size and no resting order (env.fixed_bins fixes the magnitude and order type
Market), the environment's step from a state depends on the chosen direction alone and on data the replay holds:
the bar, the position, its average entry price (the replay's `entry`), bars in position, and whether the episode
ends at the next bar. So the reward and the next portfolio of every direction are computed here with the step's own
device functions (kernels/env.py `_market_order`, `_write_port`).

counterfactual_batch: one thread per (sample i, direction d) of n drawn transitions, output row j = 4 i + d of a batch
of B = 4 n pseudo-transitions in the learner's layout (s rows 0..B-1, s' rows B..2B-1):
  rows[j] = the s row, rows[B + j] = the s' row (the next bar: the same for every direction);
  port[j] = the s portfolio; actions[j] = (d, magnitude if d is Short or Long else 0, the taken order type and
  urgency); discounts[j] = the stored discount (gamma (1 - done): whether the episode ends does not depend on d);
  d = the taken direction: rewards[j] and port[B + j] are the stored reward and next portfolio (what happened);
  d != taken: target = the position for Hold, 0 for Flat, +-targets[magnitude] for Long / Short; a market order for
  target - position walks bar b's close book; the position is marked at b + 1's close mid; at the episode's last bar
  the position is closed at market on b + 1's book; commissions on every contract filled; reward = (equity change)
  / risk unit (the environment's PnL reward: counterfactual mode needs every shaping weight at 0); the next
  portfolio from the resulting position, entry and bars in position, no resting order, and the stored next
  portfolio's bars-left column.
Held positions (learner.counterfactual_held, `held=True`): the four rows of a transition also train from positions
its policy did not hold, since the market does not depend on them. Transition i keeps its stored state for
i = 0 mod 4; for i = 1, 2, 3 mod 4 its state is re-held at position (i mod 4 - 2) T (short, flat, long; T =
targets[magnitude] contracts), entered at bar b's mid one bar earlier (average entry mid[b], one bar in position, or
flat) with no resting order and the stored bars-left column: port[j] is that state's portfolio, and every direction,
the taken one included, is priced from it as above (the draws are uniform, so which transitions are re-held is
independent of their content). The value of holding is bilinear in the position and the market; the policy's own
positions alone leave that term fitted on one side of q per market state (tools/results/learner_ablation_h200.md
section 29).
Re-held histories (learner.counterfactual_history H > 0): a re-held long or short position has been held k bars,
entered at mid[b - k + 1] (k = 1 is the rule above), k = 1 + floor(u min(b - day_first[b] + 1, H)) with u the
counter-based uniform of kernels/dropout.py `hash_uniform(idx[i], i, 0, b)` (the replay slot drawn, the transition's
place in the batch, the bar): the unrealised PnL and bars-in-position columns then take the values held positions
have, where one bar at this bar's mid sets them to 0 and 1 whatever the market did, so a head that reads them learns
from re-held states unlike every state it acts in (tools/port_probe.py; learner_ablation_h200.md section 42).
Held targets (learner.counterfactual_hold_bars K > 1): every priced row (all but a kept transition's taken
direction, which stays the stored one-step transition) holds the position its direction reaches at bar b for k =
min(K, bars left in the episode after b) bars: reward = sum over s < k of gamma^s (equity change over bar b + 1 + s)
/ risk unit, the entry's commission in the first, the close at market on the episode's last bar (and its commission)
in the last; s' is bar b + k with that position held k bars longer, discount gamma^k (0 at the episode's end). The
return over the signal's horizon that n-step returns give the one-step learner, for the four directions alike; the
value fitted is that of committing to a direction for K bars, then acting greedily.
A stored transition this model cannot price (a resting order in its state, or a taken order type other than Market)
gets NaN rewards on its untaken rows, so the learner's non-finite guard skips the step instead of training on a
wrong target; the config checks (agent/learner.py) keep such transitions out of the replay.

Launch shape: 1-D, one thread per output row (`thread_block`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import cuda, float32, float64, int32, uint64

from fox_numba.actions import FLAT, HOLD, N_BRANCHES, N_DIRECTIONS, OrderType
from fox_numba.device.launch import check_array, launch
from fox_numba.device.registry import register
from fox_numba.kernels.dropout import hash_uniform
from fox_numba.kernels.env import (
    N_PARAMS,
    PRM_BEYOND_TICKS,
    PRM_COMMISSION,
    PRM_EPISODE_BARS,
    PRM_MAX_POSITION,
    PRM_POINT_VALUE,
    PRM_RISK_UNIT,
    PRM_TARGET_0,
    PRM_TICK,
    _market_order,
    _write_port,
    thread_block,
)
from fox_numba.market.schema import N_LEVELS
from fox_numba.observation import N_PORTFOLIO, PORT_BARS_IN_POS, PORT_BARS_LEFT, PORT_ORDER_SIDE, PORT_POSITION

_MARKET = int(OrderType.MARKET)
_LONG = 2  # Direction.LONG (SHORT = 0)

_F32_1D, _F32_2D = float32[::1], float32[:, ::1]
_F64_1D, _F64_2D = float64[::1], float64[:, ::1]
_I32_1D, _I32_2D = int32[::1], int32[:, ::1]


@register((_F64_2D, _F64_2D, _F32_2D, _F32_2D, _F64_1D, _I32_1D, _F64_1D, _F64_1D, int32, int32, int32, int32, float64,
           _I32_1D, _I32_1D, _F32_2D, _I32_2D, _F32_1D, _F32_1D,
           _I32_1D, _F32_2D, _I32_2D, _F32_1D, _F32_1D))  # fmt: skip
@cuda.jit
def counterfactual_batch_kernel(bid_px, ask_px, bid_sz, ask_sz, mid, day_first, params, entry, magnitude, held,
                                history, hold_bars, gamma, idx, rows_in, port_in, actions_in, rewards_in, discounts_in,
                                rows, port, actions, rewards, discounts):  # fmt: skip
    """Output row j = 4 i + d of the pseudo-batch (module header)."""
    j = cuda.grid(1)
    n_out = actions.shape[0]
    if j >= n_out:
        return
    n = actions_in.shape[0]
    i = j // N_DIRECTIONS
    d = j - i * N_DIRECTIONS
    b = rows_in[i]
    nb = rows_in[n + i]
    rows[j] = b
    rows[n_out + j] = nb
    for c in range(N_PORTFOLIO):
        port[j, c] = port_in[i, c]
    actions[j, 0] = d
    actions[j, 1] = magnitude if (d != HOLD and d != FLAT) else 0
    actions[j, 2] = actions_in[i, 2]
    actions[j, 3] = actions_in[i, 3]
    discounts[j] = discounts_in[i]
    rehold = held != 0 and i % N_DIRECTIONS != 0
    if d == actions_in[i, 0] and not rehold:
        rewards[j] = rewards_in[i]
        for c in range(N_PORTFOLIO):
            port[n_out + j, c] = port_in[n + i, c]
        return
    if not rehold and (port_in[i, PORT_ORDER_SIDE] != float32(0.0) or actions_in[i, 2] != _MARKET):
        rewards[j] = float32(math.nan)
        for c in range(N_PORTFOLIO):
            port[n_out + j, c] = port_in[n + i, c]
        return

    max_pos = params[PRM_MAX_POSITION]
    episode_bars = params[PRM_EPISODE_BARS]
    pv = params[PRM_POINT_VALUE]
    beyond = params[PRM_BEYOND_TICKS] * params[PRM_TICK]
    pos0 = int32(round(float64(port_in[i, PORT_POSITION]) * max_pos))
    bars0 = int32(round(float64(port_in[i, PORT_BARS_IN_POS]) * episode_bars))
    avg = entry[idx[i]] if pos0 != 0 else 0.0
    if rehold:  # short, flat or long T contracts, held k bars (one, or a drawn history: module header)
        pos0 = (i % N_DIRECTIONS - 2) * int32(params[PRM_TARGET_0 + magnitude])
        k = 1
        span = min(b - day_first[b] + 1, history)
        if span > 1:
            u = hash_uniform(uint64(idx[i]), uint64(i), 0, uint64(b))
            k = 1 + int32(float64(u) * span)
        bars0 = k if pos0 != 0 else 0
        avg = mid[b - k + 1] if pos0 != 0 else 0.0
        _write_port(port, j, pos0, avg, bars0, 0, 0.0, mid[b], b, b, params)
        port[j, PORT_BARS_LEFT] = port_in[i, PORT_BARS_LEFT]
    end = port_in[n + i, PORT_BARS_LEFT] <= float32(0.0)
    k = int32(1)  # bars the reached position is held: hold_bars, cut at the episode's last bar (module header)
    left = int32(0)
    if hold_bars > 1 and not end:
        left = int32(round(float64(port_in[n + i, PORT_BARS_LEFT]) * episode_bars))  # bars after nb in the episode
        k = min(hold_bars, left + 1)
        end = k == left + 1

    target = pos0
    if d == FLAT:
        target = 0
    elif d != HOLD:
        target = int32(params[PRM_TARGET_0 + magnitude])
        if d != _LONG:
            target = -target
    pos = pos0
    cash = 0.0
    realised = 0.0
    traded = 0
    delta = target - pos0
    if delta != 0:
        pos, avg, cash, realised = _market_order(pos, avg, cash, realised, delta, bid_px, ask_px, bid_sz, ask_sz, b,
                                                 beyond, pv)  # fmt: skip
        traded += abs(delta)
    held_pos = pos  # the position the direction reaches at bar b, held to bar b + k
    eq_prev = pos0 * mid[b] * pv
    total = 0.0
    g = 1.0
    for step in range(k):  # bar b + 1 + step: marked at its close mid, closed on its book at the episode's end
        r1 = b + 1 + step
        if end and step == k - 1 and pos != 0:
            traded += abs(pos)
            pos, avg, cash, realised = _market_order(pos, avg, cash, realised, -pos, bid_px, ask_px, bid_sz, ask_sz,
                                                     r1, beyond, pv)  # fmt: skip
        cash -= params[PRM_COMMISSION] * traded
        traded = 0
        eq = cash + pos * mid[r1] * pv
        total += g * ((eq - eq_prev) / params[PRM_RISK_UNIT])
        eq_prev = eq
        g *= gamma
    rewards[j] = float32(total)
    nk = b + k
    bars = 0
    if pos != 0:
        bars = bars0 + k if (pos0 != 0 and (held_pos > 0) == (pos0 > 0)) else k
    _write_port(port, n_out + j, pos, avg, bars, 0, 0.0, mid[nk], nk, nk, params)
    if k == 1:
        port[n_out + j, PORT_BARS_LEFT] = port_in[n + i, PORT_BARS_LEFT]
    else:  # the held rows' s' is bar b + k: its row, the discount gamma^k (0 at the episode's end), its bars left
        rows[n_out + j] = nk
        discounts[j] = float32(0.0) if end else float32(g)
        port[n_out + j, PORT_BARS_LEFT] = float32((left - (k - 1)) / episode_bars)


def counterfactual_batch(market: Any, params: Any, entry: Any, magnitude: int, batch: Any, out: Any, *,
                         held: bool = False, history: int = 0, hold_bars: int = 1, gamma: float = 0.0,
                         stream: Any) -> None:  # fmt: skip
    """The pseudo-batch `out` (B = 4 n rows, agent/replay.py ReplayBatch) of the n transitions in `batch` (its idx,
    rows, port, actions, rewards, discounts; one-step: s' is the next bar), rules in the module header. market: the
    fold's device book (FoldMarketDevice: bid_px, ask_px, bid_sz, ask_sz, mid, day_first); params float64 [N_PARAMS]
    (the environment's, kernels/env.py); entry float64 [C] (the replay's average entry prices, by slot); magnitude:
    the fixed magnitude bin of Short and Long; `held`: re-hold three of every four transitions at -T, 0, +T;
    `history`: the longest history a re-held position is drawn (0 or 1: one bar at this bar's mid); `hold_bars`:
    the bars each priced direction's position is held (1: one step), discounted by `gamma` per bar."""
    n, n_out = batch.size, out.size
    if n_out != N_DIRECTIONS * n:
        raise ValueError(f"the counterfactual batch holds {N_DIRECTIONS} rows per transition: {n_out} for {n}")
    if not 0 <= magnitude < 3:
        raise ValueError(f"magnitude must be a bin 0..2, got {magnitude}")
    if history < 0:
        raise ValueError(f"history must be >= 0 bars, got {history}")
    if hold_bars < 1 or (hold_bars > 1 and not 0.0 < gamma <= 1.0):
        raise ValueError(f"hold_bars must be >= 1 and, above 1, gamma in (0, 1]: got {hold_bars}, {gamma}")
    n_bars = market.mid.shape[0]
    for name in ("bid_px", "ask_px"):
        check_array(name, getattr(market, name), f"[n_bars, {N_LEVELS}]", (n_bars, N_LEVELS), np.float64)
    for name in ("bid_sz", "ask_sz"):
        check_array(name, getattr(market, name), f"[n_bars, {N_LEVELS}]", (n_bars, N_LEVELS), np.float32)
    check_array("mid", market.mid, "[n_bars]", (n_bars,), np.float64)
    check_array("day_first", market.day_first, "[n_bars]", (n_bars,), np.int32)
    check_array("params", params, f"[{N_PARAMS}]", (N_PARAMS,), np.float64)
    check_array("entry", entry, "[C]", (entry.shape[0],), np.float64)
    for name, size in (("batch", n), ("out", n_out)):
        b = batch if name == "batch" else out
        check_array(f"{name}.rows", b.rows, "[2B]", (2 * size,), np.int32)
        check_array(f"{name}.port", b.port, f"[2B, {N_PORTFOLIO}]", (2 * size, N_PORTFOLIO))
        check_array(f"{name}.actions", b.actions, f"[B, {N_BRANCHES}]", (size, N_BRANCHES), np.int32)
        check_array(f"{name}.rewards", b.rewards, "[B]", (size,))
        check_array(f"{name}.discounts", b.discounts, "[B]", (size,))
    check_array("batch.idx", batch.idx, "[B]", (n,), np.int32)
    launch(counterfactual_batch_kernel, n_out, market.bid_px, market.ask_px, market.bid_sz, market.ask_sz, market.mid,
           market.day_first, params, entry, np.int32(magnitude), np.int32(held), np.int32(history),
           np.int32(hold_bars), np.float64(gamma), batch.idx,
           batch.rows, batch.port, batch.actions,
           batch.rewards, batch.discounts, out.rows, out.port, out.actions, out.rewards, out.discounts,
           stream=stream, block=thread_block(n_out))  # fmt: skip
