"""Trade flow per bar: volume, signed (aggressor) volume, trade count, and their features."""

from __future__ import annotations

import numpy as np

from fox_numba.features.lookback import rolling_sum
from fox_numba.features.names import FLOW_SUM_BARS


def trade_flow(size: np.ndarray, side: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, ...]:
    """(volume, signed volume, count) of trades lo .. hi - 1 of each bar, as exact int64 sums.

    Signed volume counts a buyer-aggressor trade +size, a seller-aggressor trade -size, unknown side 0.
    """
    size = size.astype(np.int64)
    volume = np.concatenate(([0], np.cumsum(size)))
    signed = np.concatenate(([0], np.cumsum(size * side.astype(np.int64))))
    return volume[hi] - volume[lo], signed[hi] - signed[lo], hi - lo


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    num = num.astype(np.float64)
    return np.divide(num, den, out=np.zeros_like(num), where=den > 0)


def trade_features(volume: np.ndarray, signed: np.ndarray, count: np.ndarray) -> dict[str, np.ndarray]:
    """Columns from one day's per-bar trade flow."""
    return {
        "trade_imbalance": _ratio(signed, volume),
        "trade_imbalance_sum5": _ratio(rolling_sum(signed, FLOW_SUM_BARS), rolling_sum(volume, FLOW_SUM_BARS)),
        "log_volume": np.log1p(volume.astype(np.float64)),
        "log_trade_count": np.log1p(count.astype(np.float64)),
    }
