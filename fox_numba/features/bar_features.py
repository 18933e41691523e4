"""Features of one day's bar series: mid returns, realised volatility, bar range, time of day."""

from __future__ import annotations

import numpy as np

from fox_numba.features.lookback import rolling_sum, window_start
from fox_numba.features.names import RETURN_LAGS, VOL_BARS
from fox_numba.market.calendar import session_bounds
from fox_numba.market.schema import NS_PER_MINUTE, Instrument


def return_features(mid: np.ndarray) -> dict[str, np.ndarray]:
    """Log mid returns over `RETURN_LAGS` bars and the realised volatility of one-bar returns.

    Look-backs restart at the day's first bar: a lag that reaches before it is taken from the first bar's
    close mid, and the first bar's one-bar return is 0 (it has no earlier bar in the day), so it is left
    out of the volatility window.
    """
    n = mid.shape[0]
    columns = {f"ret_{lag}": np.log(mid / mid[window_start(n, lag + 1)]) for lag in RETURN_LAGS}
    returns_in_window = np.maximum(np.minimum(np.arange(n), VOL_BARS), 1)
    squares = rolling_sum(columns["ret_1"] ** 2, VOL_BARS)
    columns[f"realised_vol_{VOL_BARS}"] = np.sqrt(squares / returns_in_window)
    return columns


def range_feature(high: np.ndarray, low: np.ndarray, mid: np.ndarray) -> dict[str, np.ndarray]:
    """Bar range relative to the close mid (all three in the same price unit)."""
    return {"range_rel": (high - low) / mid}


def session_features(bar_ts: np.ndarray, day: str, instrument: Instrument, session: str) -> dict[str, np.ndarray]:
    """Time of day at each bar's end (int64 ns bar starts) as a fraction of `session` ("regular" or "full",
    `calendar.session_bounds`) and on the unit circle; bars inside the session give (0, 1]."""
    open_ns, close_ns = session_bounds(day, instrument, session)
    frac = (bar_ts + NS_PER_MINUTE - open_ns) / (close_ns - open_ns)
    return {"tod_sin": np.sin(2 * np.pi * frac), "tod_cos": np.cos(2 * np.pi * frac), "session_frac": frac}
