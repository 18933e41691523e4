"""The in-memory shape of market data, shared by the store, the importers, the generator and features.

One `MarketDay` per trading day holds three column sets, with Databento's conventions:
- prices are fixed-point int64 in units of `PRICE_SCALE` (1e-9), `UNDEF_PRICE` marks an empty level;
- timestamps are uint64 nanoseconds since the Unix epoch, UTC (`ts_event`);
- sizes and order counts are unsigned ints; a trade's `side` is the aggressor: +1 buy, -1 sell, 0 unknown.

MBP-10 book fields follow Databento's names with the level index folded into a second axis:
`bid_px[:, k]` is Databento's `bid_px_0k` (k = 0 is the best level).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

PRICE_SCALE = 1e-9
"""Value of one fixed-point price unit (Databento: 1 unit = 1e-9)."""

UNDEF_PRICE = np.int64(np.iinfo(np.int64).max)
"""Databento's marker for an empty book level or an undefined price."""

N_LEVELS = 10
"""Book depth of the MBP-10 schema."""

NS_PER_MINUTE = 60_000_000_000

SIDE_BUY, SIDE_SELL, SIDE_NONE = 1, -1, 0

SCHEMAS = ("bars", "mbp10", "trades")
MANDATORY_SCHEMAS = ("mbp10", "trades")
"""Training refuses to start without these: a model without real order flow is a degraded variant."""


@dataclass(frozen=True)
class Instrument:
    """What the store records about the traded contract (written as HDF5 attributes)."""

    symbol: str = "ES"
    tick_size: float = 0.25
    """Minimum price increment, in price units (index points for ES)."""
    point_value: float = 50.0
    """Dollars per one price unit per contract."""
    timezone: str = "America/New_York"
    """Exchange-local time zone that the session hours are given in."""
    session_open: str = "09:30"
    """Start of the regular session (HH:MM, local)."""
    session_close: str = "16:00"
    """End of the regular session (HH:MM, local)."""
    day_roll: str = "17:00"
    """Local time at which a trading day ends and the next one begins (CME Globex closes the day at 17:00
    New York time; the break and pre-open after it belong to the next trading day); "24:00" means the
    trading day is the calendar date."""
    day_open: str = "18:00"
    """Local time, on the calendar day before a trading day, at which its full session opens (CME Globex
    reopens at 18:00 New York time after the daily break); at or after `day_roll`, "24:00" for equities."""
    calendar: str = "us"
    """Exchange calendar of trading days (`calendar.CALENDARS`): "us" (NYSE holidays, which CME equity
    futures follow for their trade dates), "weekdays" or "all-days"."""

    @property
    def tick_fixed(self) -> int:
        """The tick size in fixed-point units."""
        return int(round(self.tick_size / PRICE_SCALE))


@dataclass
class Bars:
    """1-minute OHLCV bars; `ts_event` is the start of the minute."""

    ts_event: np.ndarray  # uint64 [n]
    open: np.ndarray  # int64 [n]
    high: np.ndarray  # int64 [n]
    low: np.ndarray  # int64 [n]
    close: np.ndarray  # int64 [n]
    volume: np.ndarray  # uint64 [n]


@dataclass
class Mbp10:
    """Snapshots of the 10-level book, one row per update (Databento MBP-10 after each event)."""

    ts_event: np.ndarray  # uint64 [n]
    bid_px: np.ndarray  # int64 [n, 10]
    ask_px: np.ndarray  # int64 [n, 10]
    bid_sz: np.ndarray  # uint32 [n, 10]
    ask_sz: np.ndarray  # uint32 [n, 10]
    bid_ct: np.ndarray  # uint32 [n, 10]
    ask_ct: np.ndarray  # uint32 [n, 10]


@dataclass
class Trades:
    """Executed trades in time order."""

    ts_event: np.ndarray  # uint64 [n]
    price: np.ndarray  # int64 [n]
    size: np.ndarray  # uint32 [n]
    side: np.ndarray  # int8 [n]: +1 buy aggressor, -1 sell aggressor, 0 unknown


DTYPES: dict[str, dict[str, np.dtype]] = {
    "bars": {
        "ts_event": np.dtype(np.uint64),
        "open": np.dtype(np.int64),
        "high": np.dtype(np.int64),
        "low": np.dtype(np.int64),
        "close": np.dtype(np.int64),
        "volume": np.dtype(np.uint64),
    },
    "mbp10": {
        "ts_event": np.dtype(np.uint64),
        "bid_px": np.dtype(np.int64),
        "ask_px": np.dtype(np.int64),
        "bid_sz": np.dtype(np.uint32),
        "ask_sz": np.dtype(np.uint32),
        "bid_ct": np.dtype(np.uint32),
        "ask_ct": np.dtype(np.uint32),
    },
    "trades": {
        "ts_event": np.dtype(np.uint64),
        "price": np.dtype(np.int64),
        "size": np.dtype(np.uint32),
        "side": np.dtype(np.int8),
    },
}
"""Column dtypes per schema: the one source the store, importers and generator write with."""

SCHEMA_TYPES = {"bars": Bars, "mbp10": Mbp10, "trades": Trades}


@dataclass
class MarketDay:
    """One trading day (`day` is the exchange-local date, YYYY-MM-DD); a schema may be absent."""

    day: str
    bars: Bars | None = None
    mbp10: Mbp10 | None = None
    trades: Trades | None = None
    contract: str = ""
    """The contract the rows are from (Databento raw symbol such as ESU4, LOBSTER ticker); empty: the
    store's symbol. One per day: a store may follow a continuous series across contract rolls."""

    def present(self) -> tuple[str, ...]:
        return tuple(s for s in SCHEMAS if getattr(self, s) is not None)


def columns(record: Bars | Mbp10 | Trades) -> dict[str, np.ndarray]:
    """The named columns of a schema record, in declaration order."""
    return {f.name: getattr(record, f.name) for f in fields(record)}


def n_rows(record: Bars | Mbp10 | Trades) -> int:
    return int(record.ts_event.shape[0])


def to_price(fixed: np.ndarray | int) -> np.ndarray | float:
    """Fixed-point prices to float64 price units (UNDEF_PRICE becomes NaN)."""
    arr = np.asarray(fixed)
    out = arr.astype(np.float64) * PRICE_SCALE
    return np.where(arr == UNDEF_PRICE, np.nan, out) if out.ndim else (np.nan if arr == UNDEF_PRICE else float(out))


def to_fixed(price: np.ndarray | float) -> np.ndarray | int:
    """Float price units to fixed-point int64 (rounded to the nearest unit)."""
    arr = np.asarray(price, dtype=np.float64)
    out = np.rint(arr / PRICE_SCALE).astype(np.int64)
    return out if out.ndim else int(out)
