"""1-minute OHLCV bars built from trades, the way Databento builds `ohlcv-1m`.

A bar exists for every minute with at least one trade: `ts_event` is the minute's start, open/close are
the first/last trade price in it, high/low the extremes, volume the summed size. Minutes without trades
get no bar (Databento's convention too).
"""

from __future__ import annotations

import numpy as np

from fox_numba.market.schema import DTYPES, NS_PER_MINUTE, Bars, Trades


def minute_of(ts_event: np.ndarray) -> np.ndarray:
    """Start of the minute containing each timestamp (uint64 ns)."""
    ts = np.asarray(ts_event, dtype=np.uint64)
    return ts - ts % np.uint64(NS_PER_MINUTE)


def bars_from_trades(trades: Trades) -> Bars:
    """OHLCV per minute from trades in time order."""
    dt = DTYPES["bars"]
    minutes = minute_of(trades.ts_event)
    if minutes.size == 0:
        return Bars(**{name: np.zeros(0, dtype=d) for name, d in dt.items()})
    starts = np.flatnonzero(np.r_[True, minutes[1:] != minutes[:-1]])
    ends = np.r_[starts[1:], minutes.size] - 1
    price = np.asarray(trades.price, dtype=np.int64)
    return Bars(
        ts_event=minutes[starts],
        open=price[starts],
        high=np.maximum.reduceat(price, starts),
        low=np.minimum.reduceat(price, starts),
        close=price[ends],
        volume=np.add.reduceat(np.asarray(trades.size, dtype=np.uint64), starts),
    )
