"""The trading environment on the device: observation gather, reset, step (fills, marks, reward), random actions.

Every environment is one thread; its state lives on the device as a struct of arrays (field-major, so a
warp reads one field of 32 neighbouring environments in one transaction):
  si  int32   [N_SI, N]   row (current bar), last (the episode's last bar), position (signed contracts),
                          bars in position, resting order side (-1/0/+1), size left, bars left, frozen
  sf  float64 [N_SF, N]   cash (dollars), average entry price, order price, queue ahead (contracts),
                          reward sum of the running episode
  dir_ema float32 [4, N]  EMA (alpha NOVELTY_ALPHA) of the environment's direction choices (novelty)
  port float32 [N, N_PORTFOLIO]  portfolio part of the current observation (observation.py)
Environment parameters (tick, point value, commission, risk unit, targets, lifetimes, shaping weights...)
reach the kernels in one float64 array `params` [N_PARAMS] (indices PRM_*), written once per fold by the
host: a captured graph freezes its address, not its values.

Time convention (PLAN.md): a step of environment i at bar b sees the observation of bar b; its action
executes at b's close book; the environment then advances to b + 1, where its resting limit order fills
from b + 1's trades and the position is marked at b + 1's close mid.

Fill rules and why:
- Target = direction x magnitude target (params PRM_TARGET_*, round(fraction x max_position), at least 1);
  Hold changes nothing (the resting order keeps resting); Flat targets 0; delta = target - position;
  delta 0 cancels a resting order.
- MARKET (cancels a resting order): walks the far side of bar b's close book level by level (asks for a
  buy, bids for a sell) while size is shown; the fill price is the size-weighted average of the levels
  consumed. Beyond the shown depth the excess fills at the last shown level's price plus
  env.beyond_depth_ticks ticks against us: a large order is never refused (the target position is always
  reached, which keeps the action's meaning), but it pays for the liquidity it could not see.
- LIMIT_JOIN rests at our best price (best bid for a buy); LIMIT_IMPROVE one tick inside the spread, or
  joins when the spread is one tick. Queue ahead = the displayed size at that price when placed (0 when
  improving). A new order replaces a resting one, except that re-sending the same order (side, price and
  size left) keeps its place in the queue and only renews its lifetime, so an agent that keeps asking for
  the same passive entry is not sent to the back of the queue every bar.
- A resting buy at p fills from bar b + 1 on: fully when the bar traded below p (trade_lo < p: trades
  printed through it); at p (trade_lo == p) by min(size left, max(0, vol_lo - queue ahead)), and the queue
  ahead shrinks by vol_lo (not below 0). A sell mirrors it with trade_hi / vol_hi. Prices compare within
  half a tick, so a price built as bid + tick meets a trade price from the store exactly. Limit fills are
  at the order's price.
- Lifetime by urgency (PRM_LIFE_0..2 bars): after each bar's fill check the order ages one bar and the
  rest is cancelled at 0 (cancelling rather than crossing keeps a limit order's cost bounded by its price).
- Commission PRM_COMMISSION dollars per contract on every fill; cash moves by the fill's exact cost.
- Mark to market: equity = cash + position x mid x point value. Episodes end at the episode's last bar
  (episode_bars or the day's end, whichever first): the resting order is cancelled and the position is
  closed at market on that bar's close book (walked and costed like any market order); done = 1.
Reward (float64 inside, float32 out): pnl = (equity(b+1) - equity(b)) / risk unit (commissions and
crossing costs included), plus the shaping terms, each with its weight (0: off). ref = max(ISV[
Q_DIR_ABS_REF], SHAPING_REF_FLOOR) caps every unbounded factor: capped(x) = min(|x| / ref, 1) * ref.
Position terms use the position marked at b + 1 before any forced close ("held"):
  timing  (C.4)  w * sign(R) * capped(R), R = PnL realised this step (reduce, close, flip, forced close)
                 in risk units;
  persist (D.4a) w * clip(unrealised PnL at the mark in risk units, -1, 1) when held == the position
                 before the step and != 0;
  regime  (D.4b) -w * |held| / max_position * max(z_vol, 0) / clip_sigma * capped(pnl), z_vol = bar b's
                 normalised realised_vol_15 (market_obs column observation.Z_REALISED_VOL);
  novelty (B.2)  w * (1 - dir_ema[chosen direction]) (the EMA before this step's update);
  stable  (D.4c) -w * |held - position before| / max_position.
After an episode's last step: in collect mode (mode 1) the environment is reset at once to a start drawn
with its xoroshiro state (one float64 draw u per reset): starts[floor(u x reach[0] x n_starts)], uniform
over the first reach[0] share of `starts` (reach float64 [1] in device memory; 1: all of them, the plain
uniform draw). With the curriculum on (env.curriculum_epochs), `starts` is ordered easiest first
(agent/fold_market.py start_difficulty) and curriculum_reach widens reach[0] once per epoch from the
learner's per-fold step counter; off, reach[0] stays 1 and the draw is the uniform one. The outputs
(reward, done, next_row, next_port) stay those of the terminal transition. In evaluation mode (mode 0)
it stays frozen: later steps write reward 0, done 1 and leave state and accumulators alone.

Launch shapes: curriculum_reach: one thread. env_step / env_reset / random_actions: 1-D, one thread per
environment, ENV_BLOCK threads per block (`thread_block`: fewer for a small N); a short serial chain per
thread: at most two 10-level book walks, no local arrays, no spills (sm_90 PTX has no .local), ~2.7 KB of
kernel parameters.
gather_obs: 2-D, a block of (lanes, rows) threads, lane x copies columns x, x + lanes, ... of one row, so
a warp of 32 lanes reads and writes one observation row in coalesced 128-byte pieces; the simulator runs
it with one lane per row (the same kernel, fewer Python threads). Widths come from the arrays (market_obs
[n_bars, M], port [B, P]); a row outside market_obs gives a NaN market part.
Constraints: f32 literals for float32 math (`float32(0.05)`); float64 for money (prices ~5000 with 0.25
ticks; the H200's float64 rate is half its float32 rate, and this kernel is bound by memory anyway);
observations and rewards float32; no atomics. Wrappers check arrays and allocate nothing, so they can
run inside a captured StepGraph.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import cuda, float32, float64, from_dtype, int32, int64
from numba.cuda.random import xoroshiro128p_type

from fox_numba.actions import FLAT, HOLD, N_BRANCHES, N_DIRECTIONS, OrderType
from fox_numba.device.isv import ISV_TOTAL_DIM, Isv
from fox_numba.device.launch import check_array, launch, launch_2d, launch_rows
from fox_numba.device.registry import register
from fox_numba.device.rng import XOROSHIRO_DTYPE, xoroshiro128p_uniform_float32, xoroshiro128p_uniform_float64
from fox_numba.device.runtime import SIMULATOR
from fox_numba.kernels.optim import OPTIM_STATE_DTYPE
from fox_numba.kernels.optim import check_state as check_optim_state
from fox_numba.market.schema import N_LEVELS
from fox_numba.observation import (
    N_MARKET,
    N_PORTFOLIO,
    ORDER_DIST_TICKS,
    PORT_BARS_IN_POS,
    PORT_BARS_LEFT,
    PORT_ORDER_DIST,
    PORT_ORDER_SIDE,
    PORT_POSITION,
    PORT_UPNL,
    UPNL_CLIP,
    Z_REALISED_VOL,
)

ENV_BLOCK = 128


def thread_block(n: int, most: int = ENV_BLOCK) -> int:
    """Threads per block for n one-thread-per-item launches: `most`, or fewer for a small n (whole warps on
    the GPU; exactly n under the simulator, which runs every thread of a block as a Python thread)."""
    return min(most, n if SIMULATOR else -(-n // 32) * 32)


GATHER_LANES = 1 if SIMULATOR else 32  # lanes per observation row (see the header)
GATHER_ROWS = 8  # observation rows per gather block

MODE_EVAL, MODE_COLLECT = 0, 1

# params: float64 [N_PARAMS]
(
    PRM_TICK,
    PRM_POINT_VALUE,
    PRM_COMMISSION,
    PRM_RISK_UNIT,
    PRM_MAX_POSITION,
    PRM_BEYOND_TICKS,
    PRM_LIFE_0,
    PRM_LIFE_1,
    PRM_LIFE_2,
    PRM_TARGET_0,
    PRM_TARGET_1,
    PRM_TARGET_2,
    PRM_W_TIMING,
    PRM_W_PERSIST,
    PRM_W_REGIME,
    PRM_W_NOVELTY,
    PRM_W_STABLE,
    PRM_CLIP_SIGMA,
    PRM_EPISODE_BARS,
    PRM_POSITION_HISTORY,
) = range(20)
N_PARAMS = 20

# si: int32 [N_SI, N]
SI_ROW, SI_LAST, SI_POS, SI_BARS_IN_POS, SI_ORD_SIDE, SI_ORD_SIZE, SI_ORD_LIFE, SI_FROZEN = range(8)
N_SI = 8
# sf: float64 [N_SF, N]
SF_CASH, SF_AVG, SF_ORD_PRICE, SF_ORD_QUEUE, SF_EP_RETURN = range(5)
N_SF = 5

# comps: float32 [N_COMPS, N], in the order of the ISV slots REWARD_PNL_EMA .. REWARD_TIMING_EMA (63-68)
COMP_PNL, COMP_NOVELTY, COMP_PERSIST, COMP_REGIME, COMP_STABLE, COMP_TIMING = range(6)
N_COMPS = 6
COMP_NAMES = ("pnl", "novelty", "persist", "regime", "stable", "timing")

# stats: float32 [N_STATS, N], per-step values the rollout reduction reads
ST_TRADED, ST_POS_ABS, ST_EP_DONE, ST_EP_RETURN = range(4)
N_STATS = 4

# acc: float64 [N_ACC, N], per-environment sums since the last clear (epoch metrics)
ACC_STEPS = 0
ACC_REWARD = 1
ACC_COMP_0 = 2  # .. ACC_COMP_0 + N_COMPS - 1, component sums in COMP order
ACC_POS_ABS = ACC_COMP_0 + N_COMPS  # sum of |held| / max_position
ACC_TRADED = ACC_POS_ABS + 1  # contracts filled (market, limit, forced close)
ACC_LIMIT_PLACED = ACC_TRADED + 1  # contracts of new limit orders
ACC_LIMIT_FILLED = ACC_LIMIT_PLACED + 1  # contracts of limit orders filled
ACC_EPISODES = ACC_LIMIT_FILLED + 1
ACC_EP_RETURN = ACC_EPISODES + 1  # sum of completed episodes' reward sums
ACC_DIR_0 = ACC_EP_RETURN + 1  # .. + N_DIRECTIONS - 1: actions per direction
ACC_PNL_USD = ACC_DIR_0 + N_DIRECTIONS  # equity change in dollars (net of costs)
ACC_COMMISSION_USD = ACC_PNL_USD + 1
N_ACC = ACC_COMMISSION_USD + 1

NOVELTY_ALPHA = np.float32(0.05)
DIR_EMA_START = np.float32(1.0 / N_DIRECTIONS)
SHAPING_REF_FLOOR = 1e-3
_Q_DIR_ABS_REF = int(Isv.Q_DIR_ABS_REF)
_MARKET = int(OrderType.MARKET)
_IMPROVE = int(OrderType.LIMIT_IMPROVE)
_LONG = 2  # Direction.LONG (SHORT = 0): the target's sign
assert N_DIRECTIONS == 4 and HOLD == 1 and FLAT == 3

F32_1D, F32_2D = float32[::1], float32[:, ::1]
F64_1D, F64_2D = float64[::1], float64[:, ::1]
I32_1D, I32_2D = int32[::1], int32[:, ::1]
STATES = xoroshiro128p_type[::1]
OPTIM_STATE = from_dtype(OPTIM_STATE_DTYPE)[::1]


# --- device functions -------------------------------------------------------------------------------------


@cuda.jit(device=True)
def _walk_cost(px, sz, b, qty, beyond):
    """Cost (sum of price x contracts, price units) of taking `qty` contracts from one side of bar b's
    book (px, sz [n, N_LEVELS], best first), level by level while size is shown; the excess past the
    shown depth costs the last shown price + `beyond` (signed against the taker) per contract."""
    rem = float64(qty)
    cost = float64(0.0)
    last = px[b, 0]
    for k in range(N_LEVELS):
        size = float64(sz[b, k])
        if rem <= 0.0 or size <= 0.0:
            break
        take = min(rem, size)
        cost += take * px[b, k]
        rem -= take
        last = px[b, k]
    if rem > 0.0:
        cost += rem * (last + beyond)
    return cost


@cuda.jit(device=True)
def _apply_fill(pos, avg, cash, realised, dq, cost, pv):
    """Book a fill of dq contracts (signed, != 0) costing `cost` price units in total: new (position,
    average entry, cash, realised PnL in dollars). Adding to a position averages the entry; reducing
    realises (fill price - entry) per closed contract; the part that flips opens at the fill price."""
    q = abs(dq)
    price = cost / q
    held = abs(pos)
    if pos == 0 or (pos > 0) == (dq > 0):
        avg = (avg * held + cost) / (held + q)
    else:
        closed = min(q, held)
        sgn = 1.0 if pos > 0 else -1.0
        realised += (price - avg) * closed * sgn * pv
        if q > held:
            avg = price
        elif q == held:
            avg = 0.0
    if dq > 0:
        cash -= cost * pv
    else:
        cash += cost * pv
    return pos + dq, avg, cash, realised


@cuda.jit(device=True)
def _market_order(pos, avg, cash, realised, dq, bid_px, ask_px, bid_sz, ask_sz, b, beyond, pv):
    """A market order of dq contracts (signed, != 0) at bar b's close book: walks the far side (the asks for a buy)
    with `_walk_cost` and books the fill with `_apply_fill`: new (position, average entry, cash, realised PnL)."""
    if dq > 0:
        cost = _walk_cost(ask_px, ask_sz, b, dq, beyond)
    else:
        cost = _walk_cost(bid_px, bid_sz, b, -dq, -beyond)
    return _apply_fill(pos, avg, cash, realised, dq, cost, pv)


@cuda.jit(device=True)
def _write_port(port, i, pos, avg, bars_in_pos, oside, oprice, mid, row, last, params):
    """The portfolio features of a state (observation.PORTFOLIO) into port[i, :]."""
    max_pos = params[PRM_MAX_POSITION]
    episode_bars = params[PRM_EPISODE_BARS]
    upnl = 0.0
    history = params[PRM_POSITION_HISTORY] != 0.0  # env.position_history: else u and bars in position read 0
    if pos != 0 and history:
        upnl = (mid - avg) * pos * params[PRM_POINT_VALUE] / params[PRM_RISK_UNIT]
        upnl = min(max(upnl, -UPNL_CLIP), UPNL_CLIP)
    dist = 0.0
    if oside != 0:
        dist = oside * (oprice - mid) / params[PRM_TICK] / ORDER_DIST_TICKS
    port[i, PORT_POSITION] = float32(pos / max_pos)
    port[i, PORT_UPNL] = float32(upnl)
    port[i, PORT_BARS_IN_POS] = float32(min(bars_in_pos / episode_bars, 1.0)) if history else float32(0.0)
    port[i, PORT_ORDER_SIDE] = float32(oside)
    port[i, PORT_ORDER_DIST] = float32(dist)
    port[i, PORT_BARS_LEFT] = float32(min((last - row) / episode_bars, 1.0))


@cuda.jit(device=True)
def _start_episode(i, start, last, si, sf, port, mid, params):
    """A flat environment at bar `start` whose episode's last bar is `last`."""
    si[SI_ROW, i] = start
    si[SI_LAST, i] = last
    si[SI_POS, i] = 0
    si[SI_BARS_IN_POS, i] = 0
    si[SI_ORD_SIDE, i] = 0
    si[SI_ORD_SIZE, i] = 0
    si[SI_ORD_LIFE, i] = 0
    si[SI_FROZEN, i] = 0
    sf[SF_CASH, i] = 0.0
    sf[SF_AVG, i] = 0.0
    sf[SF_ORD_PRICE, i] = 0.0
    sf[SF_ORD_QUEUE, i] = 0.0
    sf[SF_EP_RETURN, i] = 0.0
    _write_port(port, i, 0, 0.0, 0, 0, 0.0, mid[start], start, last, params)


@cuda.jit(device=True)
def _draw_start(states, i, starts, reach, row_stop, params):
    """(start, last bar) of a new training episode: a start drawn uniformly from the first reach[0] share
    of `starts` (all of them at reach 1, where n x 1.0 == n keeps the draw the plain uniform one)."""
    n = starts.shape[0]
    k = int32(xoroshiro128p_uniform_float64(states, i) * (n * reach[0]))
    if k >= n:
        k = n - 1
    start = starts[k]
    stop = min(start + int32(params[PRM_EPISODE_BARS]), row_stop[start])
    return start, stop - 1


# --- kernels ----------------------------------------------------------------------------------------------


@register((F32_2D, I32_1D, F32_2D, F32_2D))
@cuda.jit
def gather_obs_kernel(market_obs, rows, port, obs):
    """obs[i] = [market_obs[rows[i]] | port[i]] (x = lane within the row, y = row); the market part is NaN
    where rows[i] is outside market_obs."""
    lane, i = cuda.grid(2)
    if i >= obs.shape[0]:
        return
    lanes = cuda.blockDim.x
    n_market = market_obs.shape[1]
    r = rows[i]
    inside = r >= 0 and r < market_obs.shape[0]
    j = lane
    while j < n_market:
        obs[i, j] = market_obs[r, j] if inside else float32(math.nan)
        j += lanes
    j = lane
    while j < port.shape[1]:
        obs[i, n_market + j] = port[i, j]
        j += lanes


@register((OPTIM_STATE, float64, int64, F64_1D))
@cuda.jit
def curriculum_reach_kernel(optim_state, reach0, horizon, reach):
    """reach[0] = reach0 + (1 - reach0) x min(step / horizon, 1), step = the learner's per-fold gradient
    step counter (optim_state[0].step; epoch e of a fold collects at step e x steps_per_epoch); 1 when
    horizon is 0."""
    if cuda.grid(1) != 0:
        return
    progress = 1.0
    if horizon > 0:
        progress = min(float64(optim_state[0].step) / float64(horizon), 1.0)
    reach[0] = reach0 + (1.0 - reach0) * progress


@register((int32, I32_1D, F64_1D, I32_2D, I32_1D, F64_1D, F64_1D, STATES, I32_2D, F64_2D, F32_2D, F32_2D))
@cuda.jit
def env_reset_kernel(mode, starts, reach, windows, row_stop, mid, params, states, si, sf, dir_ema, port):
    """Start every environment flat: collect mode at a drawn start, eval mode at validation window i.

    Collect mode staggers the first episodes: after the start, a second float64 draw u cuts the first
    episode to 2 + floor(u x (full length - 1)) bars, so that the environments' episode ends (and the
    terminal transitions in the replay) spread over the steps instead of all falling on the same step;
    the auto-resets after it run whole episodes."""
    i = cuda.grid(1)
    if i >= si.shape[1]:
        return
    if mode == MODE_COLLECT:
        start, last = _draw_start(states, i, starts, reach, row_stop, params)
        # stagger: the first episode after a reset runs 2 .. its full length bars (one more draw)
        bars = 2 + int32(xoroshiro128p_uniform_float64(states, i) * (last - start))
        last = start + min(bars, last - start + 1) - 1
    else:
        start = windows[i, 0]
        last = windows[i, 1] - 1
    _start_episode(i, start, last, si, sf, port, mid, params)
    for d in range(N_DIRECTIONS):
        dir_ema[d, i] = DIR_EMA_START


@register(
    (
        int32,  # mode
        F32_2D, F64_2D, F64_2D, F32_2D, F32_2D, F64_1D, F64_1D, F64_1D, F32_1D, F32_1D, I32_1D, I32_1D,  # market
        F64_1D, F64_1D, F32_1D, STATES,  # reach, params, isv, rng
        I32_2D,  # actions
        I32_2D, F64_2D, F32_2D, F32_2D,  # state
        F32_1D, F32_1D, I32_1D, F32_2D, F32_2D, F32_2D,  # outputs
        F64_2D,  # accumulators
    )
)  # fmt: skip
@cuda.jit
def env_step_kernel(
    mode,
    market_obs, bid_px, ask_px, bid_sz, ask_sz, mid, trade_lo, trade_hi, vol_lo, vol_hi, row_stop, starts,
    reach, params, isv, states,
    actions,
    si, sf, dir_ema, port,
    reward, done, next_row, next_port, comps, stats,
    acc,
):  # fmt: skip
    """One step of environment i (rules in the module header)."""
    i = cuda.grid(1)
    if i >= si.shape[1]:
        return
    b = si[SI_ROW, i]
    if si[SI_FROZEN, i] != 0:
        reward[i] = float32(0.0)
        done[i] = float32(1.0)
        next_row[i] = b
        for j in range(N_PORTFOLIO):
            next_port[i, j] = port[i, j]
        for c in range(N_COMPS):
            comps[c, i] = float32(0.0)
        for s in range(N_STATS):
            stats[s, i] = float32(0.0)
        return

    tick = params[PRM_TICK]
    half_tick = 0.5 * tick
    pv = params[PRM_POINT_VALUE]
    commission = params[PRM_COMMISSION]
    risk = params[PRM_RISK_UNIT]
    max_pos = params[PRM_MAX_POSITION]
    beyond = params[PRM_BEYOND_TICKS] * tick

    last = si[SI_LAST, i]
    pos0 = si[SI_POS, i]
    pos = pos0
    bars_in_pos = si[SI_BARS_IN_POS, i]
    oside = si[SI_ORD_SIDE, i]
    osize = si[SI_ORD_SIZE, i]
    olife = si[SI_ORD_LIFE, i]
    cash = sf[SF_CASH, i]
    avg = sf[SF_AVG, i]
    oprice = sf[SF_ORD_PRICE, i]
    oqueue = sf[SF_ORD_QUEUE, i]
    equity0 = cash + pos * mid[b] * pv

    direction = actions[i, 0]
    magnitude = actions[i, 1]
    order = actions[i, 2]
    urgency = actions[i, 3]
    realised = 0.0
    traded = 0
    placed = 0
    filled = 0

    # 1. the action, at bar b's close book
    if direction != HOLD:
        target = 0
        if direction != FLAT:
            target = int32(params[PRM_TARGET_0 + magnitude])
            if direction != _LONG:
                target = -target
        delta = target - pos
        if delta == 0:
            oside = 0
            osize = 0
        elif order == _MARKET:
            oside = 0
            osize = 0
            pos, avg, cash, realised = _market_order(pos, avg, cash, realised, delta, bid_px, ask_px, bid_sz, ask_sz,
                                                     b, beyond, pv)  # fmt: skip
            traded += abs(delta)
        else:
            side = 1 if delta > 0 else -1
            size = abs(delta)
            best_bid = bid_px[b, 0]
            best_ask = ask_px[b, 0]
            improve = order == _IMPROVE and best_ask - best_bid > tick + half_tick
            if side > 0:
                price = best_bid + tick if improve else best_bid
                queue = 0.0 if improve else float64(bid_sz[b, 0])
            else:
                price = best_ask - tick if improve else best_ask
                queue = 0.0 if improve else float64(ask_sz[b, 0])
            if not (side == oside and size == osize and abs(price - oprice) < half_tick):
                oside = side
                osize = size
                oprice = price
                oqueue = queue
                placed += size
            olife = int32(params[PRM_LIFE_0 + urgency])

    # 2. advance to bar b + 1: the resting order fills from its trades, then ages
    nb = b + 1
    if oside != 0:
        q = 0
        if oside > 0:
            t_px = trade_lo[nb]
            t_vol = float64(vol_lo[nb])
            through = t_px < oprice - half_tick
        else:
            t_px = trade_hi[nb]
            t_vol = float64(vol_hi[nb])
            through = t_px > oprice + half_tick
        if through:
            q = osize
        elif abs(t_px - oprice) < half_tick:
            q = int32(min(float64(osize), max(0.0, t_vol - oqueue)))
            oqueue = max(0.0, oqueue - t_vol)
        if q > 0:
            pos, avg, cash, realised = _apply_fill(pos, avg, cash, realised, oside * q, q * oprice, pv)
            traded += q
            filled += q
            osize -= q
        olife -= 1
        if osize <= 0 or olife <= 0:
            oside = 0
            osize = 0
    if oside == 0:
        osize = 0
        olife = 0
        oprice = 0.0
        oqueue = 0.0

    # 3. mark at bar b + 1's close mid; the episode's last bar closes the position at market
    held = pos
    mid1 = mid[nb]
    upnl_held = 0.0
    if held != 0:
        upnl_held = (mid1 - avg) * held * pv
    end = nb >= last
    if end:
        oside = 0
        osize = 0
        olife = 0
        oprice = 0.0
        oqueue = 0.0
        if pos != 0:
            traded += abs(pos)
            pos, avg, cash, realised = _market_order(pos, avg, cash, realised, -pos, bid_px, ask_px, bid_sz, ask_sz,
                                                     nb, beyond, pv)  # fmt: skip
    cash -= commission * traded
    equity1 = cash + pos * mid1 * pv

    # 4. reward and its components
    pnl_usd = equity1 - equity0
    pnl = pnl_usd / risk
    ref = max(float64(isv[_Q_DIR_ABS_REF]), SHAPING_REF_FLOOR)
    timing = 0.0
    if realised != 0.0:
        r_units = realised / risk
        timing = params[PRM_W_TIMING] * min(abs(r_units), ref)
        if r_units < 0.0:
            timing = -timing
    persist = 0.0
    if held == pos0 and pos0 != 0:
        persist = params[PRM_W_PERSIST] * min(max(upnl_held / risk, -1.0), 1.0)
    z_vol = max(float64(market_obs[b, Z_REALISED_VOL]), 0.0)
    regime = -params[PRM_W_REGIME] * (abs(held) / max_pos) * (z_vol / params[PRM_CLIP_SIGMA]) * min(abs(pnl), ref)
    novelty = params[PRM_W_NOVELTY] * (1.0 - float64(dir_ema[direction, i]))
    stable = -params[PRM_W_STABLE] * abs(held - pos0) / max_pos
    r32 = float32(pnl + novelty + persist + regime + stable + timing)
    c_pnl = float32(pnl)
    c_novelty = float32(novelty)
    c_persist = float32(persist)
    c_regime = float32(regime)
    c_stable = float32(stable)
    c_timing = float32(timing)
    for d in range(N_DIRECTIONS):
        e = dir_ema[d, i]
        hit = float32(1.0) if d == direction else float32(0.0)
        dir_ema[d, i] = e + NOVELTY_ALPHA * (hit - e)

    if pos == 0:
        bars_in_pos = 0
    elif pos0 != 0 and (pos > 0) == (pos0 > 0):
        bars_in_pos += 1
    else:
        bars_in_pos = 1
    ep_return = sf[SF_EP_RETURN, i] + float64(r32)

    # 5. outputs of the transition (terminal when the episode ended)
    reward[i] = r32
    done[i] = float32(1.0) if end else float32(0.0)
    next_row[i] = nb
    _write_port(next_port, i, pos, avg, bars_in_pos, oside, oprice, mid1, nb, last, params)
    comps[COMP_PNL, i] = c_pnl
    comps[COMP_NOVELTY, i] = c_novelty
    comps[COMP_PERSIST, i] = c_persist
    comps[COMP_REGIME, i] = c_regime
    comps[COMP_STABLE, i] = c_stable
    comps[COMP_TIMING, i] = c_timing
    stats[ST_TRADED, i] = float32(traded)
    stats[ST_POS_ABS, i] = float32(abs(held) / max_pos)
    stats[ST_EP_DONE, i] = float32(1.0) if end else float32(0.0)
    stats[ST_EP_RETURN, i] = float32(ep_return) if end else float32(0.0)

    acc[ACC_STEPS, i] += 1.0
    acc[ACC_REWARD, i] += float64(r32)
    acc[ACC_COMP_0 + COMP_PNL, i] += float64(c_pnl)
    acc[ACC_COMP_0 + COMP_NOVELTY, i] += float64(c_novelty)
    acc[ACC_COMP_0 + COMP_PERSIST, i] += float64(c_persist)
    acc[ACC_COMP_0 + COMP_REGIME, i] += float64(c_regime)
    acc[ACC_COMP_0 + COMP_STABLE, i] += float64(c_stable)
    acc[ACC_COMP_0 + COMP_TIMING, i] += float64(c_timing)
    acc[ACC_POS_ABS, i] += abs(held) / max_pos
    acc[ACC_TRADED, i] += float64(traded)
    acc[ACC_LIMIT_PLACED, i] += float64(placed)
    acc[ACC_LIMIT_FILLED, i] += float64(filled)
    acc[ACC_DIR_0 + direction, i] += 1.0
    acc[ACC_PNL_USD, i] += pnl_usd
    acc[ACC_COMMISSION_USD, i] += commission * traded
    if end:
        acc[ACC_EPISODES, i] += 1.0
        acc[ACC_EP_RETURN, i] += ep_return

    # 6. the new state: the next bar, a fresh episode (collect) or frozen (eval)
    if end and mode == MODE_COLLECT:
        start, new_last = _draw_start(states, i, starts, reach, row_stop, params)
        _start_episode(i, start, new_last, si, sf, port, mid, params)
        return
    si[SI_ROW, i] = nb
    si[SI_POS, i] = pos
    si[SI_BARS_IN_POS, i] = bars_in_pos
    si[SI_ORD_SIDE, i] = oside
    si[SI_ORD_SIZE, i] = osize
    si[SI_ORD_LIFE, i] = olife
    si[SI_FROZEN, i] = 1 if end else 0
    sf[SF_CASH, i] = cash
    sf[SF_AVG, i] = avg
    sf[SF_ORD_PRICE, i] = oprice
    sf[SF_ORD_QUEUE, i] = oqueue
    sf[SF_EP_RETURN, i] = ep_return
    for j in range(N_PORTFOLIO):
        port[i, j] = next_port[i, j]


@register((STATES, I32_2D))
@cuda.jit
def random_actions_kernel(states, actions):
    """actions[i] = uniform direction, magnitude, order type, urgency (4 float32 draws from states[i], in
    that order; Hold / Flat record magnitude 0): a policy-free action source for tests and benchmarks."""
    i = cuda.grid(1)
    if i >= actions.shape[0]:
        return
    d = min(int32(xoroshiro128p_uniform_float32(states, i) * float32(N_DIRECTIONS)), N_DIRECTIONS - 1)
    m = min(int32(xoroshiro128p_uniform_float32(states, i) * float32(3.0)), 2)
    o = min(int32(xoroshiro128p_uniform_float32(states, i) * float32(3.0)), 2)
    u = min(int32(xoroshiro128p_uniform_float32(states, i) * float32(3.0)), 2)
    if d == HOLD or d == FLAT:
        m = 0
    actions[i, 0] = d
    actions[i, 1] = m
    actions[i, 2] = o
    actions[i, 3] = u


# --- wrappers ---------------------------------------------------------------------------------------------


def _check_states(states: Any, n: int) -> None:
    if len(states.shape) != 1 or states.shape[0] < n or states.dtype != XOROSHIRO_DTYPE:
        raise ValueError(f"states must be xoroshiro128p states [>= {n}], got {states.dtype}{tuple(states.shape)}")
    check_array("states", states, f"[>= {n}]", (states.shape[0],), XOROSHIRO_DTYPE)


def gather_obs(market_obs: Any, rows: Any, port: Any, obs: Any, *, stream: Any, lanes: int = GATHER_LANES) -> None:
    """obs[i] = [market_obs[rows[i], :] | port[i, :]]: market_obs float32 [n_bars, M], rows int32 [B], port
    float32 [B, P] -> obs float32 [B, M + P] (M = N_MARKET and P = N_PORTFOLIO in the package; the learner's
    tests use narrower observations). A row outside market_obs gives a NaN market part, so a bad stored row
    fails the learner's non-finite guard instead of reading outside the array. The one observation gather:
    the collector and the evaluator on the environments' state (VecEnv.observe), the learner on a replay
    batch's 2B rows (s rows, then s' rows)."""
    if len(obs.shape) != 2 or obs.shape[0] < 1:
        raise ValueError(f"obs must be float32 [B, M + P] with B >= 1, got {obs.shape}")
    if len(market_obs.shape) != 2 or len(port.shape) != 2:
        raise ValueError(f"market_obs and port must be 2-D, got {market_obs.shape} and {port.shape}")
    b = obs.shape[0]
    m, p = market_obs.shape[1], port.shape[1]
    check_array("market_obs", market_obs, "[n_bars, M]", (market_obs.shape[0], m))
    check_array("rows", rows, "[B]", (b,), np.int32)
    check_array("port", port, "[B, P]", (b, p))
    check_array("obs", obs, "[B, M + P]", (b, m + p))
    if not 1 <= lanes <= 32:
        raise ValueError(f"lanes must be 1..32, got {lanes}")
    rows_per_block = min(GATHER_ROWS, b) if SIMULATOR else GATHER_ROWS
    launch_2d(gather_obs_kernel, lanes, b, market_obs, rows, port, obs, stream=stream, block=(lanes, rows_per_block))


def check_env_state(si: Any, sf: Any, dir_ema: Any, port: Any) -> int:
    """Check the state arrays of N environments and return N."""
    if len(si.shape) != 2 or si.shape[1] < 1:
        raise ValueError(f"si must be int32 [{N_SI}, N], got {si.shape}")
    n = si.shape[1]
    check_array("si", si, f"[{N_SI}, N]", (N_SI, n), np.int32)
    check_array("sf", sf, f"[{N_SF}, N]", (N_SF, n), np.float64)
    check_array("dir_ema", dir_ema, f"[{N_DIRECTIONS}, N]", (N_DIRECTIONS, n))
    check_array("port", port, f"[N, {N_PORTFOLIO}]", (n, N_PORTFOLIO))
    return n


def _check_reach(reach: Any) -> None:
    check_array("reach", reach, "[1]", (1,), np.float64)


def curriculum_reach(optim_state: Any, reach0: float, horizon: int, reach: Any, *, stream: Any) -> None:
    """reach float64 [1] = the share of the (easiest-first) starts a collect draw reaches at the learner's
    per-fold step optim_state[0].step: reach0 at step 0, widening linearly to 1 at step `horizon` (1 when
    horizon is 0). Graph-safe; launched once per epoch before the collect phase."""
    check_optim_state(optim_state)
    _check_reach(reach)
    if not 0.0 < reach0 <= 1.0 or horizon < 0:
        raise ValueError(f"reach0 must be in (0, 1] and horizon >= 0, got {reach0} and {horizon}")
    launch_rows(curriculum_reach_kernel, 1, 1, optim_state, np.float64(reach0), np.int64(horizon), reach,
                stream=stream)  # fmt: skip


def env_reset(
    mode: int, starts: Any, reach: Any, windows: Any, row_stop: Any, mid: Any, params: Any, states: Any,
    si: Any, sf: Any, dir_ema: Any, port: Any, *, stream: Any,
) -> None:  # fmt: skip
    """Start N environments flat: mode MODE_COLLECT at starts drawn with states[i] from the first reach[0]
    share of `starts` (two float64 draws each: the start, then the staggered length of the first episode),
    MODE_EVAL at windows[i] = (first row, stop row) (needs N <= n_windows). Resets dir_ema to uniform."""
    n = check_env_state(si, sf, dir_ema, port)
    check_array("starts", starts, "[n_starts]", (starts.shape[0],), np.int32)
    _check_reach(reach)
    check_array("windows", windows, "[n_windows, 2]", (windows.shape[0], 2), np.int32)
    check_array("row_stop", row_stop, "[n_bars]", (row_stop.shape[0],), np.int32)
    check_array("mid", mid, "[n_bars]", (row_stop.shape[0],), np.float64)
    check_array("params", params, f"[{N_PARAMS}]", (N_PARAMS,), np.float64)
    _check_states(states, n)
    if mode not in (MODE_EVAL, MODE_COLLECT):
        raise ValueError(f"mode must be MODE_EVAL or MODE_COLLECT, got {mode}")
    if mode == MODE_EVAL and windows.shape[0] < n:
        raise ValueError(f"eval mode needs a window per environment: {windows.shape[0]} windows for {n}")
    if mode == MODE_COLLECT and starts.shape[0] < 1:
        raise ValueError("collect mode needs at least one episode start")
    launch(
        env_reset_kernel, n, np.int32(mode), starts, reach, windows, row_stop, mid, params, states, si, sf, dir_ema,
        port,
        stream=stream, block=thread_block(n),
    )  # fmt: skip


def env_step(
    mode: int, market: Any, reach: Any, params: Any, isv: Any, states: Any, actions: Any,
    si: Any, sf: Any, dir_ema: Any, port: Any,
    reward: Any, done: Any, next_row: Any, next_port: Any, comps: Any, stats: Any, acc: Any, *, stream: Any,
) -> None:  # fmt: skip
    """Step N environments one bar with actions [N, 4] (rules in the module header). `market` carries the
    fold's device tensors by name (agent.fold_market.FoldMarketDevice); an auto-reset draws from the first
    reach[0] share of its train_starts. Outputs: reward / done float32 [N],
    next_row int32 [N], next_port float32 [N, N_PORTFOLIO], comps float32 [N_COMPS, N], stats float32
    [N_STATS, N]; acc float64 [N_ACC, N] accumulates."""
    n = check_env_state(si, sf, dir_ema, port)
    n_bars = market.mid.shape[0]
    m = market.market_obs.shape[1]
    if m < N_MARKET:  # the step reads the feature columns only (Z_REALISED_VOL); further market columns may follow
        raise ValueError(f"market_obs has {m} columns; the environment step needs at least {N_MARKET}")
    check_array("market_obs", market.market_obs, f"[n_bars, {m}]", (n_bars, m))
    for name in ("bid_px", "ask_px"):
        check_array(name, getattr(market, name), f"[n_bars, {N_LEVELS}]", (n_bars, N_LEVELS), np.float64)
    for name in ("bid_sz", "ask_sz"):
        check_array(name, getattr(market, name), f"[n_bars, {N_LEVELS}]", (n_bars, N_LEVELS), np.float32)
    for name in ("mid", "trade_lo", "trade_hi"):
        check_array(name, getattr(market, name), "[n_bars]", (n_bars,), np.float64)
    for name in ("vol_lo", "vol_hi"):
        check_array(name, getattr(market, name), "[n_bars]", (n_bars,), np.float32)
    check_array("row_stop", market.row_stop, "[n_bars]", (n_bars,), np.int32)
    check_array("train_starts", market.train_starts, "[n_starts]", (market.train_starts.shape[0],), np.int32)
    _check_reach(reach)
    check_array("params", params, f"[{N_PARAMS}]", (N_PARAMS,), np.float64)
    check_array("isv", isv, f"[{ISV_TOTAL_DIM}]", (ISV_TOTAL_DIM,))
    _check_states(states, n)
    check_array("actions", actions, f"[N, {N_BRANCHES}]", (n, N_BRANCHES), np.int32)
    check_array("reward", reward, "[N]", (n,))
    check_array("done", done, "[N]", (n,))
    check_array("next_row", next_row, "[N]", (n,), np.int32)
    check_array("next_port", next_port, f"[N, {N_PORTFOLIO}]", (n, N_PORTFOLIO))
    check_array("comps", comps, f"[{N_COMPS}, N]", (N_COMPS, n))
    check_array("stats", stats, f"[{N_STATS}, N]", (N_STATS, n))
    check_array("acc", acc, f"[{N_ACC}, N]", (N_ACC, n), np.float64)
    if mode not in (MODE_EVAL, MODE_COLLECT):
        raise ValueError(f"mode must be MODE_EVAL or MODE_COLLECT, got {mode}")
    launch(
        env_step_kernel, n, np.int32(mode),
        market.market_obs, market.bid_px, market.ask_px, market.bid_sz, market.ask_sz, market.mid,
        market.trade_lo, market.trade_hi, market.vol_lo, market.vol_hi, market.row_stop, market.train_starts,
        reach, params, isv, states, actions, si, sf, dir_ema, port,
        reward, done, next_row, next_port, comps, stats, acc,
        stream=stream, block=thread_block(n),
    )  # fmt: skip


def random_actions(states: Any, actions: Any, *, stream: Any) -> None:
    """Uniform random actions [N, 4] from states[i] (4 float32 draws per environment)."""
    if len(actions.shape) != 2 or actions.shape[0] < 1:
        raise ValueError(f"actions must be int32 [N, {N_BRANCHES}], got {actions.shape}")
    n = actions.shape[0]
    check_array("actions", actions, f"[N, {N_BRANCHES}]", (n, N_BRANCHES), np.int32)
    _check_states(states, n)
    launch(random_actions_kernel, n, states, actions, stream=stream, block=thread_block(n))

