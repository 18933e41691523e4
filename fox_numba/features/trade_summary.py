"""Per-bar trade summary for resting limit orders: the bar's lowest and highest trade price and the
contracts traded at exactly those prices.

The environment fills a resting buy limit at price p from a bar's trades: fully when the bar traded below
p (trades printed through it), partly when its lowest trade is exactly p (the contracts traded at p, less
the queue ahead of the order). A sell mirrors it with the highest trade. So per bar it needs four numbers:

    trade_lo  lowest trade price of the bar (price units; NaN without trades)
    trade_hi  highest trade price of the bar (NaN without trades)
    vol_lo    contracts traded at exactly trade_lo (0 without trades)
    vol_hi    contracts traded at exactly trade_hi (0 without trades)

A bar covers the trades with bar start <= ts < bar start + 60 s (`windows.trade_windows`), so the summary
of a bar uses nothing after its close. Prices are compared as the store's fixed-point integers, so
"exactly" is exact.
"""

from __future__ import annotations

import numpy as np

from fox_numba.market.schema import PRICE_SCALE


def trade_summary(
    price: np.ndarray, size: np.ndarray, lo: np.ndarray, hi: np.ndarray
) -> dict[str, np.ndarray]:
    """The four summary columns of bars whose trades are lo[b] .. hi[b] - 1 of (`price` fixed-point int64,
    `size` contracts), as {trade_lo, trade_hi: float64 price units; vol_lo, vol_hi: uint32}.
    Windows are in order and do not overlap (trade_windows of sorted timestamps)."""
    n_bars = lo.shape[0]
    counts = (hi - lo).astype(np.int64)
    has = counts > 0
    out_lo = np.full(n_bars, np.nan)
    out_hi = np.full(n_bars, np.nan)
    vol_lo = np.zeros(n_bars, np.uint64)
    vol_hi = np.zeros(n_bars, np.uint64)
    if has.any():
        take = np.concatenate([np.arange(a, b) for a, b in zip(lo[has], hi[has], strict=True)])
        px = np.asarray(price, np.int64)[take]
        sz = np.asarray(size, np.uint64)[take]
        starts = np.concatenate(([0], np.cumsum(counts[has])[:-1]))
        bar_lo = np.minimum.reduceat(px, starts)
        bar_hi = np.maximum.reduceat(px, starts)
        owner = np.repeat(np.arange(starts.shape[0]), counts[has])
        at_lo = np.where(px == bar_lo[owner], sz, 0).astype(np.uint64)
        at_hi = np.where(px == bar_hi[owner], sz, 0).astype(np.uint64)
        vol_lo[has] = np.add.reduceat(at_lo, starts)
        vol_hi[has] = np.add.reduceat(at_hi, starts)
        out_lo[has] = bar_lo * PRICE_SCALE
        out_hi[has] = bar_hi * PRICE_SCALE
    if max(int(vol_lo.max(initial=0)), int(vol_hi.max(initial=0))) > np.iinfo(np.uint32).max:
        raise ValueError("more than 2**32 - 1 contracts traded at one price in one bar")
    return {
        "trade_lo": out_lo,
        "trade_hi": out_hi,
        "vol_lo": vol_lo.astype(np.uint32),
        "vol_hi": vol_hi.astype(np.uint32),
    }
