"""What the feature builder hands on: per-bar features and the raw market the environment trades on."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RawMarket:
    """Unnormalised market state of every bar at its close, for fills and PnL (bars of all days, in order).

    Prices are float64 in price units (index points for ES); an empty book level has price NaN and size 0,
    so a market order walks a side's levels while the size is positive. The close book is the last MBP-10
    row before the bar's end; OHLC are the bar's own (trade) prices.
    """

    ts: np.ndarray
    """uint64 [n_bars]: bar start, ns since the epoch (UTC); the bar closes 60 s later."""
    day_index: np.ndarray
    """int32 [n_bars]: index of each bar's trading day in `FeatureSet.days`."""
    day_start: np.ndarray
    """int64 [n_days + 1]: day d holds bars day_start[d] .. day_start[d + 1] - 1; the last entry is n_bars.
    Episodes must not run across a day start."""
    bid_px: np.ndarray
    """float64 [n_bars, 10]: close-book bid prices, best first."""
    ask_px: np.ndarray
    """float64 [n_bars, 10]: close-book ask prices, best first."""
    bid_sz: np.ndarray
    """uint32 [n_bars, 10]: close-book bid sizes (contracts)."""
    ask_sz: np.ndarray
    """uint32 [n_bars, 10]: close-book ask sizes (contracts)."""
    mid: np.ndarray
    """float64 [n_bars]: (best bid + best ask) / 2 of the close book."""
    open: np.ndarray
    """float64 [n_bars]: bar open."""
    high: np.ndarray
    """float64 [n_bars]: bar high."""
    low: np.ndarray
    """float64 [n_bars]: bar low."""
    close: np.ndarray
    """float64 [n_bars]: bar close."""
    trade_lo: np.ndarray
    """float64 [n_bars]: lowest trade price of the bar, NaN without trades (`trade_summary`: limit fills)."""
    trade_hi: np.ndarray
    """float64 [n_bars]: highest trade price of the bar, NaN without trades."""
    vol_lo: np.ndarray
    """uint32 [n_bars]: contracts traded at exactly trade_lo in the bar (0 without trades)."""
    vol_hi: np.ndarray
    """uint32 [n_bars]: contracts traded at exactly trade_hi in the bar (0 without trades)."""
    tick_size: float
    """Minimum price increment, in price units."""
    point_value: float
    """Dollars per price unit per contract."""

    @property
    def n_bars(self) -> int:
        return int(self.ts.shape[0])

    @property
    def best_bid(self) -> np.ndarray:
        """float64 [n_bars]: best bid of the close book."""
        return np.ascontiguousarray(self.bid_px[:, 0])

    @property
    def best_ask(self) -> np.ndarray:
        """float64 [n_bars]: best ask of the close book."""
        return np.ascontiguousarray(self.ask_px[:, 0])


@dataclass(frozen=True)
class FeatureSet:
    """Unnormalised per-bar features (`values`, float64 [n_bars, n_features], columns named by `names`)
    and the raw market of the same bars. Normalise with `fit_normaliser` on a training window's rows
    (`day_rows`) and `apply_normaliser`, which gives the float32 observation matrix."""

    values: np.ndarray
    names: tuple[str, ...]
    days: tuple[str, ...]
    """Trading days (YYYY-MM-DD, exchange-local), in order: those with a bar in the session."""
    raw: RawMarket
    session: str = "regular"
    """The session whose bars these are (`market.session`)."""
    notes: tuple[str, ...] = ()
    """What the builder left out and why (a day without a bar in the session)."""

    @property
    def n_bars(self) -> int:
        return int(self.values.shape[0])

    @property
    def n_days(self) -> int:
        return len(self.days)

    def day_rows(self, first: int, stop: int) -> slice:
        """The rows of days first .. stop - 1 (indices into `days`)."""
        if not 0 <= first <= stop <= self.n_days:
            raise IndexError(f"days {first}..{stop - 1} are outside the {self.n_days} days of this feature set")
        return slice(int(self.raw.day_start[first]), int(self.raw.day_start[stop]))
