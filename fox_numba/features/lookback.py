"""Look-back windows over the bars of one day: they restart at the day's first bar.

Every function takes the per-bar series of a single day; a window that would reach before the day's
first bar is shortened to the bars the day has so far.
"""

from __future__ import annotations

import numpy as np


def window_start(n_bars: int, length: int) -> np.ndarray:
    """Index of the first bar of each bar's window of `length` bars (itself included), clamped at 0."""
    return np.maximum(np.arange(n_bars) - (length - 1), 0)


def rolling_sum(x: np.ndarray, length: int) -> np.ndarray:
    """Sum of `x` over each bar's window of `length` bars (itself included)."""
    csum = np.concatenate(([0], np.cumsum(x)))
    return csum[1:] - csum[window_start(x.shape[0], length)]
