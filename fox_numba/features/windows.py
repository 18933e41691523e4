"""Which book rows and trades each 1-minute bar covers.

A bar starting at t covers events with t <= ts < t + 60 s. The book state entering the bar is the last
MBP-10 row before t; on a day whose book starts inside a bar, the day's first row is that bar's entering
state and later rows are its events. The bar's close book is its last row before t + 60 s.
"""

from __future__ import annotations

import numpy as np

from fox_numba.market.schema import NS_PER_MINUTE


def book_windows(book_ts: np.ndarray, bar_ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(enter, stop) per bar: rows enter .. stop - 1 are the bar's book states, stop - 1 its close book.

    A bar that ends before the first book row gets stop = 0 (no close book); the caller rejects it.
    """
    first = np.searchsorted(book_ts, bar_ts, side="left")
    stop = np.searchsorted(book_ts, bar_ts + NS_PER_MINUTE, side="left").astype(np.int64)
    enter = np.maximum(first - 1, 0).astype(np.int64)
    return enter, stop


def trade_windows(trade_ts: np.ndarray, bar_ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi) per bar: trades lo .. hi - 1 fall inside the bar."""
    lo = np.searchsorted(trade_ts, bar_ts, side="left").astype(np.int64)
    hi = np.searchsorted(trade_ts, bar_ts + NS_PER_MINUTE, side="left").astype(np.int64)
    return lo, hi
