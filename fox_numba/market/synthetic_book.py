"""The event-driven 10-level book of the synthetic market: one trading day per call, in numba (`@njit`).

Prices are integer ticks inside the kernel. Each side holds `HIDDEN_LEVELS` contiguous price levels (one
tick apart, best first); the top `N_LEVELS` are what an MBP-10 row shows. A level carries its resting
size and its mean order size, from which the order count is derived (`count = max(1, round(size /
order_size))`). The mean size of level k of a side under latent state x is

    mean_k(x) = depth_scale[regime] * depth_k * exp(tilt_k * x * s / gamma),  s = +1 bid, -1 ask,

the equilibrium of the add/cancel odds below: with x > 0 the bid side is deeper and the ask side thinner.

The book follows a latent efficient price f (ticks, continuous): between events f moves with the
minute's drift and volatility (arithmetic Brownian motion). Each event is the first that applies of:

1. Catch-up, when |f - mid| > catchup_ticks. The book re-centres so that the best bid is floor(f): the
   stale side loses every level in the way, either to one market order that walks them (one trade per
   level, with probability p_partial also part of the next level) or to cancellations (quote fade);
   if no level is in the way, the other side steps towards f instead.
2. Improvement, with probability p_improve while the spread is wider than one tick: a new best level
   one tick inside the spread, on the side towards f.
3. Market order, with probability p_market: buyer-initiated with probability sigmoid(mo_tilt * x); it
   walks the book, one trade per level it touches.
4. Limit add or cancel at level k (drawn with weights exp(-k / level_decay)) of a random side: an add
   with probability sigmoid(gamma * log(mean_k(0) / size_k) + tilt_k * x * s), else a cancel. A cancel
   can empty the best level only (deeper levels keep at least one contract).

When an event empties a best level and leaves the spread wider than one tick, the other side follows
at once with probability `refill[regime]` (new best levels up to one tick from the far side, on the
side towards f); otherwise the spread stays wide until improvements close it. A new best level starts
with `fresh_frac` of its mean size; a level pushed deeper closes `deep_fill` of the gap to its new
mean; a level entering at the back is drawn around its mean.

After every event one MBP-10 row (the top 10 levels of both sides) is written, at strictly increasing
timestamps, so no two rows share a `ts_event`; a market order's trades carry its row's timestamp.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from fox_numba.jitcache import cached_njit
from fox_numba.market.schema import N_LEVELS, NS_PER_MINUTE

HIDDEN_LEVELS = 20
"""Levels kept per side; levels beyond the visible 10 absorb sweeps and refills without gaps."""


class BookParams(NamedTuple):
    """Scalar and per-level parameters of the book kernel (ticks and contracts)."""

    catchup_ticks: float
    p_sweep: float
    p_partial: float
    p_improve: float
    p_market: float
    mo_median: float
    mo_sigma: float
    mo_tilt: float
    gamma: float
    flow_frac: float
    flow_sigma: float
    fresh_frac: float
    deep_fill: float
    order_size: float
    depth: np.ndarray  # float64 [HIDDEN_LEVELS]: mean resting size per level (calm regime)
    tilt: np.ndarray  # float64 [N_LEVELS]: latent tilt of add/cancel per level
    level_cdf: np.ndarray  # float64 [N_LEVELS]: cumulative level weights of add/cancel events


class DayBook(NamedTuple):
    """What one day's kernel call returns (prices in ticks)."""

    ts: np.ndarray  # int64 [rows]: ns since the epoch, strictly increasing
    book: np.ndarray  # int64 [6, rows, 10]: bid_px, ask_px, bid_sz, ask_sz, bid_ct, ask_ct
    trades: np.ndarray  # int64 [trades, 4]: ts, price, size, side (+1 buy aggressor, -1 sell)
    close_bid: np.ndarray  # int64 [minutes]: best bid at each minute's end
    close_ask: np.ndarray  # int64 [minutes]: best ask at each minute's end
    close_f: np.ndarray  # float64 [minutes]: efficient price at each minute's end


@cached_njit()
def _sigmoid(z: float) -> float:
    return 1.0 / (1.0 + np.exp(-z))


@cached_njit()
def _fresh_size(mean: float, sigma: float) -> int:
    """A positive integer size around `mean` (log-normal, mean preserved)."""
    return max(1, int(np.rint(mean * np.exp(sigma * np.random.standard_normal() - 0.5 * sigma * sigma))))


@cached_njit()
def _level_mean(k: int, sign: float, x: float, depth_scale: float, bp: BookParams) -> float:
    """Mean size of level k of a side (sign +1 bid, -1 ask) at equilibrium of the add/cancel odds under
    latent state x: depth_k * exp(tilt_k * x * sign / gamma) (levels past the 10th use the 10th's tilt)."""
    tilt = bp.tilt[min(k, N_LEVELS - 1)]
    return depth_scale * bp.depth[k] * np.exp(tilt * x * sign / bp.gamma)


@cached_njit()
def _pop_best(sz: np.ndarray, osz: np.ndarray, sign: float, x: float, depth_scale: float, bp: BookParams) -> None:
    """Remove the best level; a fresh level appears at the back (the book stays contiguous)."""
    m = sz.size
    for k in range(m - 1):
        sz[k] = sz[k + 1]
        osz[k] = osz[k + 1]
    sz[m - 1] = _fresh_size(_level_mean(m - 1, sign, x, depth_scale, bp), 0.5)
    osz[m - 1] = bp.order_size * np.exp(0.3 * np.random.standard_normal())


@cached_njit()
def _push_best(
    sz: np.ndarray, osz: np.ndarray, n: int, sign: float, x: float, depth_scale: float, bp: BookParams
) -> None:
    """Insert `n` new best levels with small fresh queues (the deepest levels fall off the back).

    A level pushed deeper closes the fraction `deep_fill` of the gap to its new level's mean size: the
    orders resting at that distance from the touch that are not simulated one by one.
    """
    m = sz.size
    n = min(n, m)
    for k in range(m - 1, n - 1, -1):
        mean = _level_mean(k, sign, x, depth_scale, bp)
        sz[k] = max(1, int(np.rint(sz[k - n] + bp.deep_fill * (mean - sz[k - n]))))
        osz[k] = osz[k - n]
    for k in range(n):
        sz[k] = _fresh_size(bp.fresh_frac * _level_mean(k, sign, x, depth_scale, bp), 0.7)
        osz[k] = bp.order_size * np.exp(0.3 * np.random.standard_normal())


@cached_njit()
def _trade(trades: np.ndarray, nt: int, ts: int, px: int, qty: int, side: int) -> int:
    """Append one trade row (ts, price ticks, size, side) and return the new count."""
    if nt >= trades.shape[0]:
        raise ValueError("synthetic book: trade buffer full")
    trades[nt, 0] = ts
    trades[nt, 1] = px
    trades[nt, 2] = qty
    trades[nt, 3] = side
    return nt + 1


@cached_njit()
def _walk(
    sz: np.ndarray, osz: np.ndarray, qty: int, side: int, best: int, x: float, depth_scale: float,
    bp: BookParams, trades: np.ndarray, nt: int, ts: int,
) -> tuple[int, int]:
    """A market order of `qty` (aggressor `side`, +1 buy) against the opposite side of the book: one
    trade per level it touches; returns (levels emptied, trade count)."""
    gone = 0
    while qty > 0:
        take = min(qty, sz[0])
        nt = _trade(trades, nt, ts, best + side * gone, take, side)
        qty -= take
        sz[0] -= take
        if sz[0] == 0:
            _pop_best(sz, osz, -side, x, depth_scale, bp)
            gone += 1
    return gone, nt


@cached_njit()
def _clear(
    sz: np.ndarray, osz: np.ndarray, n: int, side: int, best: int, sweep: bool, partial: bool, x: float,
    depth_scale: float, bp: BookParams, trades: np.ndarray, nt: int, ts: int,
) -> int:
    """Catch-up on the stale side: remove its `n` best levels, by one sweeping market order (trades,
    optionally into part of the next level) or by cancellations; returns the trade count."""
    for k in range(n):
        if sweep:
            nt = _trade(trades, nt, ts, best + side * k, sz[0], side)
        _pop_best(sz, osz, -side, x, depth_scale, bp)
    if sweep and partial and sz[0] > 1:
        take = 1 + int(np.random.random() * (sz[0] - 1))
        nt = _trade(trades, nt, ts, best + side * n, take, side)
        sz[0] -= take
    return nt


@cached_njit()
def _add_or_cancel(
    b_sz: np.ndarray, a_sz: np.ndarray, b_os: np.ndarray, a_os: np.ndarray, x: float, depth_scale: float,
    bp: BookParams,
) -> int:
    """One limit add or cancel; returns 1 if it emptied the best bid, 2 the best ask, else 0."""
    u = np.random.random()
    k = 0
    while k < N_LEVELS - 1 and u > bp.level_cdf[k]:
        k += 1
    is_bid = np.random.random() < 0.5
    sz = b_sz if is_bid else a_sz
    sign = 1.0 if is_bid else -1.0
    target = depth_scale * bp.depth[k]
    logit = bp.gamma * np.log(target / sz[k]) + bp.tilt[k] * x * sign
    qty = _fresh_size(bp.flow_frac * target, bp.flow_sigma)
    if (k > 0 and sz[k] == 1) or np.random.random() < _sigmoid(logit):
        sz[k] += qty
    elif k > 0 or qty < sz[0]:
        sz[k] -= min(qty, sz[k] - 1) if k > 0 else qty
    else:
        _pop_best(sz, b_os if is_bid else a_os, sign, x, depth_scale, bp)
        return 1 if is_bid else 2
    return 0


@cached_njit()
def _snapshot(
    book: np.ndarray, ts_out: np.ndarray, row: int, ts: int, bid: int, ask: int,
    b_sz: np.ndarray, a_sz: np.ndarray, b_os: np.ndarray, a_os: np.ndarray,
) -> None:
    """Write the top 10 levels of both sides as MBP-10 row `row`."""
    ts_out[row] = ts
    for k in range(N_LEVELS):
        book[0, row, k] = bid - k
        book[1, row, k] = ask + k
        book[2, row, k] = b_sz[k]
        book[3, row, k] = a_sz[k]
        book[4, row, k] = max(1, int(np.rint(b_sz[k] / b_os[k])))
        book[5, row, k] = max(1, int(np.rint(a_sz[k] / a_os[k])))


@cached_njit()
def simulate_day(
    seed: int,
    open_ns: int,
    f0: float,
    n_events: np.ndarray,
    drift: np.ndarray,
    vol: np.ndarray,
    x: np.ndarray,
    depth_scale: np.ndarray,
    refill: np.ndarray,
    bp: BookParams,
) -> DayBook:
    """Simulate one regular session: an opening snapshot, then `n_events[m]` book events in minute m.

    Per minute m: `drift` (ticks/minute) and `vol` (ticks/sqrt(minute)) of `f`, the latent state `x`,
    the regime's depth multiplier and refill probability. `f0` is `f` at the open (ticks).
    """
    np.random.seed(seed)
    n_min = n_events.size
    n_rows = 1 + int(n_events.sum())
    ts_out = np.empty(n_rows, np.int64)
    book = np.empty((6, n_rows, N_LEVELS), np.int64)
    trades = np.empty((n_rows * (HIDDEN_LEVELS + 1), 4), np.int64)  # room for 21 trades per event
    close_bid = np.empty(n_min, np.int64)
    close_ask = np.empty(n_min, np.int64)
    close_f = np.empty(n_min, np.float64)

    b_sz = np.empty(HIDDEN_LEVELS, np.int64)
    a_sz = np.empty(HIDDEN_LEVELS, np.int64)
    b_os = np.empty(HIDDEN_LEVELS, np.float64)
    a_os = np.empty(HIDDEN_LEVELS, np.float64)
    for k in range(HIDDEN_LEVELS):
        b_sz[k] = _fresh_size(_level_mean(k, 1.0, x[0], depth_scale[0], bp), 0.5)
        a_sz[k] = _fresh_size(_level_mean(k, -1.0, x[0], depth_scale[0], bp), 0.5)
        b_os[k] = bp.order_size * np.exp(0.3 * np.random.standard_normal())
        a_os[k] = bp.order_size * np.exp(0.3 * np.random.standard_normal())
    f = f0
    bid = int(np.floor(f))
    ask = bid + 1
    nt = 0
    ts = open_ns
    _snapshot(book, ts_out, 0, ts, bid, ask, b_sz, a_sz, b_os, a_os)
    row = 1
    for m in range(n_min):
        times = np.sort(np.random.random(n_events[m]))
        ds = depth_scale[m]
        t_prev = 0.0
        for i in range(n_events[m]):
            dt = times[i] - t_prev
            t_prev = times[i]
            f += drift[m] * dt + vol[m] * np.sqrt(dt) * np.random.standard_normal()
            ts = max(open_ns + m * NS_PER_MINUTE + int(times[i] * NS_PER_MINUTE), ts + 1)
            gap = f - 0.5 * (bid + ask)
            moved = True
            if abs(gap) > bp.catchup_ticks:
                # Re-centre: the target best bid is floor(f), the target best ask one tick above.
                sweep = np.random.random() < bp.p_sweep
                partial = np.random.random() < bp.p_partial
                target = int(np.floor(f))
                if gap > 0:
                    n = max(0, target + 1 - ask)
                    nt = _clear(a_sz, a_os, n, 1, ask, sweep, partial, x[m], ds, bp, trades, nt, ts)
                    ask += n
                    if n == 0:
                        _push_best(b_sz, b_os, target - bid, 1.0, x[m], ds, bp)
                        bid = target
                else:
                    n = max(0, bid - target)
                    nt = _clear(b_sz, b_os, n, -1, bid, sweep, partial, x[m], ds, bp, trades, nt, ts)
                    bid -= n
                    if n == 0:
                        _push_best(a_sz, a_os, ask - target - 1, -1.0, x[m], ds, bp)
                        ask = target + 1
            elif ask - bid > 1 and np.random.random() < bp.p_improve:
                if gap > 0:
                    _push_best(b_sz, b_os, 1, 1.0, x[m], ds, bp)
                    bid += 1
                else:
                    _push_best(a_sz, a_os, 1, -1.0, x[m], ds, bp)
                    ask -= 1
                moved = False
            elif np.random.random() < bp.p_market:
                qty = _fresh_size(bp.mo_median * np.exp(0.5 * bp.mo_sigma * bp.mo_sigma), bp.mo_sigma)
                if np.random.random() < _sigmoid(bp.mo_tilt * x[m]):
                    gone, nt = _walk(a_sz, a_os, qty, 1, ask, x[m], ds, bp, trades, nt, ts)
                    ask += gone
                else:
                    gone, nt = _walk(b_sz, b_os, qty, -1, bid, x[m], ds, bp, trades, nt, ts)
                    bid -= gone
                moved = gone > 0
            else:
                emptied = _add_or_cancel(b_sz, a_sz, b_os, a_os, x[m], ds, bp)
                if emptied == 1:
                    bid -= 1
                elif emptied == 2:
                    ask += 1
                moved = emptied > 0
            if moved and ask - bid > 1 and np.random.random() < refill[m]:
                if f > 0.5 * (bid + ask):
                    _push_best(b_sz, b_os, ask - 1 - bid, 1.0, x[m], ds, bp)
                    bid = ask - 1
                else:
                    _push_best(a_sz, a_os, ask - bid - 1, -1.0, x[m], ds, bp)
                    ask = bid + 1
            _snapshot(book, ts_out, row, ts, bid, ask, b_sz, a_sz, b_os, a_os)
            row += 1
        dt = 1.0 - t_prev
        f += drift[m] * dt + vol[m] * np.sqrt(dt) * np.random.standard_normal()
        close_bid[m] = bid
        close_ask[m] = ask
        close_f[m] = f
    return DayBook(ts_out, book, trades[:nt].copy(), close_bid, close_ask, close_f)
