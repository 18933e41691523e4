"""Multi-level order-flow imbalance per bar (Cont, Kukanov, Stoikov 2014; per level: Xu, Gould, Howison 2018).

For each MBP-10 event n (a book row and the row before it) and each level m, the contribution is

    e_n^m = 1{Pb_n >= Pb_n-1} qb_n - 1{Pb_n <= Pb_n-1} qb_n-1 - 1{Pa_n <= Pa_n-1} qa_n + 1{Pa_n >= Pa_n-1} qa_n-1

with Pb, qb (Pa, qa) the bid (ask) price and size at level m. A bar's OFI at level m sums e_n^m over the
events inside the bar. An empty level (price UNDEF_PRICE) is a price of -infinity on the bid side and
+infinity on the ask side, with size 0: a bid level that empties contributes -qb_n-1 (its queue left), one
that fills contributes +qb_n, and a level empty before and after contributes 0; mirrored on the ask side.

Depth D of a bar (the divisor that makes levels and regimes comparable, after the average-depth scaling of
Cont, Cucuringu, Zhang 2023, "Cross-impact of order flow imbalance in equity markets"): the mean,
over the book states seen in the bar (the state entering it and the state after each of its events, each
counted once), of the mean over all levels (all ten in the builder, whatever `ofi_levels` is) of
(bid size + ask size) / 2, empty levels counting 0: the bar's average resting size per level and side, in
contracts.
"""

from __future__ import annotations

import numpy as np

from fox_numba.features.lookback import rolling_sum
from fox_numba.features.names import FLOW_SUM_BARS
from fox_numba.jitcache import cached_njit
from fox_numba.market.schema import UNDEF_PRICE

_UNDEF = np.int64(UNDEF_PRICE)
_EMPTY_BID = np.int64(np.iinfo(np.int64).min)


@cached_njit(inline="always")
def _event_ofi(pb0: int, qb0: float, pa0: int, qa0: float, pb1: int, qb1: float, pa1: int, qa1: float) -> float:
    """e_n for one level: (pb0, qb0, pa0, qa0) before the event, (pb1, qb1, pa1, qa1) after it."""
    e = 0.0
    if pb1 >= pb0:
        e += qb1
    if pb1 <= pb0:
        e -= qb0
    if pa1 <= pa0:
        e -= qa1
    if pa1 >= pa0:
        e += qa0
    return e


@cached_njit()
def _bar_ofi(
    bid_px: np.ndarray,
    bid_sz: np.ndarray,
    ask_px: np.ndarray,
    ask_sz: np.ndarray,
    enter: np.ndarray,
    stop: np.ndarray,
    ofi: np.ndarray,
    depth: np.ndarray,
) -> None:
    n_levels = bid_px.shape[1]
    for b in range(enter.shape[0]):
        total = 0.0
        for r in range(enter[b], stop[b]):
            for m in range(n_levels):
                pb1 = bid_px[r, m]
                pa1 = ask_px[r, m]
                qb1 = 0.0 if pb1 == _UNDEF else float(bid_sz[r, m])
                qa1 = 0.0 if pa1 == _UNDEF else float(ask_sz[r, m])
                total += 0.5 * (qb1 + qa1)
                if r == enter[b]:
                    continue
                pb0 = bid_px[r - 1, m]
                pa0 = ask_px[r - 1, m]
                qb0 = 0.0 if pb0 == _UNDEF else float(bid_sz[r - 1, m])
                qa0 = 0.0 if pa0 == _UNDEF else float(ask_sz[r - 1, m])
                ofi[b, m] += _event_ofi(
                    _EMPTY_BID if pb0 == _UNDEF else pb0,
                    qb0,
                    pa0,
                    qa0,
                    _EMPTY_BID if pb1 == _UNDEF else pb1,
                    qb1,
                    pa1,
                    qa1,
                )
        depth[b] = total / ((stop[b] - enter[b]) * n_levels)


def bar_order_flow(
    bid_px: np.ndarray,
    bid_sz: np.ndarray,
    ask_px: np.ndarray,
    ask_sz: np.ndarray,
    enter: np.ndarray,
    stop: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Per-bar, per-level OFI (not yet divided by depth) and depth D of each bar.

    Book rows `enter[b]` .. `stop[b] - 1` are bar b's states: row `enter[b]` is the state entering the bar,
    each later row is one event (compared with the row before it). Prices are int64 (any unit: only their
    order matters; UNDEF_PRICE marks an empty level), sizes any numeric type, shapes [n_rows, n_levels].
    Returns `ofi` float64 [n_bars, n_levels] and `depth` float64 [n_bars]; the feature is ofi / depth.

    Worked example, one level, prices in ticks (400 = 100.00 with a 0.25 tick):

        state  bid      ask       e_n  why
        0      400 x 5  401 x 4        entering the bar
        1      400 x 7  401 x 4   +2   bid queue grows: qb_n - qb_n-1 = 7 - 5
        2      400 x 7  401 x 1   +3   ask queue shrinks: -qa_n + qa_n-1 = -1 + 4
        3      400 x 7  402 x 6   +1   ask level taken out, next ask higher: +qa_n-1 = +1
        4      399 x 9  402 x 6   -7   bid level taken out, next bid lower: -qb_n-1 = -7

    OFI = 2 + 3 + 1 - 7 = -1; depth = mean of (5+4)/2, (7+4)/2, (7+1)/2, (7+6)/2, (9+6)/2 = 28 / 5 = 5.6.

    >>> import numpy as np
    >>> bid_px = np.array([[400], [400], [400], [400], [399]])
    >>> bid_sz = np.array([[5], [7], [7], [7], [9]])
    >>> ask_px = np.array([[401], [401], [401], [402], [402]])
    >>> ask_sz = np.array([[4], [4], [1], [6], [6]])
    >>> ofi, depth = bar_order_flow(bid_px, bid_sz, ask_px, ask_sz, np.array([0]), np.array([5]))
    >>> float(ofi[0, 0]), float(depth[0])
    (-1.0, 5.6)
    """
    enter = np.asarray(enter, dtype=np.int64)
    stop = np.asarray(stop, dtype=np.int64)
    ofi = np.zeros((enter.shape[0], bid_px.shape[1]), dtype=np.float64)
    depth = np.zeros(enter.shape[0], dtype=np.float64)
    _bar_ofi(bid_px, bid_sz, ask_px, ask_sz, enter, stop, ofi, depth)
    return ofi, depth


def ofi_features(ofi: np.ndarray, depth: np.ndarray, n_events: np.ndarray, ofi_levels: int) -> dict[str, np.ndarray]:
    """The OFI columns of one day's bars: each level's OFI / D (0 where D is 0), their sum over the first
    `ofi_levels` levels and its 5-bar sum, log(1 + D) and log(1 + events)."""
    scaled = np.divide(ofi, depth[:, None], out=np.zeros_like(ofi), where=depth[:, None] > 0)
    multi = scaled[:, :ofi_levels].sum(axis=1)
    columns = {f"ofi_l{m + 1}": scaled[:, m] for m in range(scaled.shape[1])}
    columns["ofi_multi"] = multi
    columns["ofi_multi_sum5"] = rolling_sum(multi, FLOW_SUM_BARS)
    columns["log_depth"] = np.log1p(depth)
    columns["log_book_events"] = np.log1p(n_events.astype(np.float64))
    return columns
