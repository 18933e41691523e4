"""Features of the book at a bar's close (spread, depth imbalance, microprice), the bar's mean spread, and its
time-weighted depth imbalance per level (TW_IMBALANCE_COLUMNS: the observation's block, features.tw_imbalance, on by
default; what it adds: sections 67-68 of tools/results/learner_ablation_h200.md)."""

from __future__ import annotations

import numpy as np

from fox_numba.features.names import TW_IMBALANCE_COLUMNS
from fox_numba.features.windows import book_windows
from fox_numba.jitcache import cached_njit
from fox_numba.market.schema import NS_PER_MINUTE, UNDEF_PRICE

_UNDEF = np.int64(UNDEF_PRICE)


def resting_sizes(px: np.ndarray, sz: np.ndarray) -> np.ndarray:
    """Sizes as float64 with empty levels (price UNDEF_PRICE) set to 0."""
    return np.where(px == UNDEF_PRICE, 0.0, sz.astype(np.float64))


def _imbalance(bid: np.ndarray, ask: np.ndarray) -> np.ndarray:
    total = bid + ask
    return np.divide(bid - ask, total, out=np.zeros_like(total), where=total > 0)


def close_book_features(
    bid_px: np.ndarray, bid_sz: np.ndarray, ask_px: np.ndarray, ask_sz: np.ndarray, tick_fixed: int
) -> dict[str, np.ndarray]:
    """Columns from each bar's close book ([n_bars, n_levels] fixed-point prices; both best levels set)."""
    bid_q = resting_sizes(bid_px, bid_sz)
    ask_q = resting_sizes(ask_px, ask_sz)
    spread = (ask_px[:, 0] - bid_px[:, 0]) / tick_fixed
    imbalance_l1 = _imbalance(bid_q[:, 0], ask_q[:, 0])
    return {
        "spread_close_ticks": spread,
        "depth_imbalance_l1": imbalance_l1,
        "depth_imbalance_l5": _imbalance(bid_q[:, :5].sum(axis=1), ask_q[:, :5].sum(axis=1)),
        "depth_imbalance_l10": _imbalance(bid_q.sum(axis=1), ask_q.sum(axis=1)),
        # microprice - mid = (ask - bid) / 2 * (bid size - ask size) / (bid size + ask size)
        "microprice_offset_ticks": 0.5 * spread * imbalance_l1,
    }


@cached_njit()
def _time_weighted_spread(
    book_ts: np.ndarray,
    best_bid: np.ndarray,
    best_ask: np.ndarray,
    bar_ts: np.ndarray,
    enter: np.ndarray,
    stop: np.ndarray,
    out: np.ndarray,
) -> None:
    for b in range(bar_ts.shape[0]):
        bar_end = bar_ts[b] + NS_PER_MINUTE
        weighted = 0.0
        weight = 0.0
        for r in range(enter[b], stop[b]):
            if best_bid[r] == _UNDEF or best_ask[r] == _UNDEF:
                continue
            end = book_ts[r + 1] if r + 1 < stop[b] else bar_end
            w = float(end - max(book_ts[r], bar_ts[b]))
            weighted += w * float(best_ask[r] - best_bid[r])
            weight += w
        out[b] = weighted / weight


def mean_spread(
    book_ts: np.ndarray,
    best_bid: np.ndarray,
    best_ask: np.ndarray,
    bar_ts: np.ndarray,
    enter: np.ndarray,
    stop: np.ndarray,
) -> np.ndarray:
    """Time-weighted mean spread of each bar, in fixed-point price units (int64 ns timestamps).

    Each book state weighs the time it rests inside [t, t + 60 s): from its timestamp (or the bar start,
    for the state entering the bar) to the next row (or the bar end). States with an empty best level are
    left out; the close book must be two-sided, which keeps the total weight positive.
    """
    out = np.empty(bar_ts.shape[0], dtype=np.float64)
    _time_weighted_spread(book_ts, best_bid, best_ask, bar_ts, enter, stop, out)
    return out


@cached_njit()
def _time_weighted_imbalance(book_ts: np.ndarray, bid_q: np.ndarray, ask_q: np.ndarray, bar_ts: np.ndarray,
                             enter: np.ndarray, stop: np.ndarray, out: np.ndarray) -> None:
    n_levels = bid_q.shape[1]
    for b in range(bar_ts.shape[0]):
        bar_end = bar_ts[b] + NS_PER_MINUTE
        weight = 0.0
        for c in range(out.shape[1]):
            out[b, c] = 0.0
        for r in range(enter[b], stop[b]):
            end = book_ts[r + 1] if r + 1 < stop[b] else bar_end
            w = float(end - max(book_ts[r], bar_ts[b]))
            weight += w
            bid5 = ask5 = bid10 = ask10 = 0.0
            for k in range(n_levels):
                x, y = bid_q[r, k], ask_q[r, k]
                if x + y > 0.0:
                    out[b, k] += w * (x - y) / (x + y)
                bid10 += x
                ask10 += y
                if k < 5:
                    bid5 += x
                    ask5 += y
            if bid5 + ask5 > 0.0:
                out[b, n_levels] += w * (bid5 - ask5) / (bid5 + ask5)
            if bid10 + ask10 > 0.0:
                out[b, n_levels + 1] += w * (bid10 - ask10) / (bid10 + ask10)
        for c in range(out.shape[1]):
            out[b, c] /= weight


def time_weighted_imbalance(book_ts: np.ndarray, bid_q: np.ndarray, ask_q: np.ndarray, bar_ts: np.ndarray,
                            windows: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """float64 [n_bars, len(TW_IMBALANCE_COLUMNS)]: each bar's depth imbalance (bid size - ask size) / (bid size +
    ask size) averaged over its book states, each weighted by the time it rests inside [t, t + 60 s) (mean_spread's
    weights), at each level and over levels 1-5 and 1-10 (0 where both sides are empty). Sizes float64
    [n_rows, N_LEVELS] with empty levels 0 (resting_sizes); int64 ns timestamps; every bar has a book state.
    `windows`: the bars' (enter, stop) rows (`book_windows`, computed here when None)."""
    enter, stop = book_windows(book_ts, bar_ts) if windows is None else windows
    out = np.empty((bar_ts.shape[0], len(TW_IMBALANCE_COLUMNS)), dtype=np.float64)
    _time_weighted_imbalance(book_ts, np.ascontiguousarray(bid_q), np.ascontiguousarray(ask_q), bar_ts,
                             np.asarray(enter, np.int64), np.asarray(stop, np.int64), out)  # fmt: skip
    return out
