"""A stored day's features with its book read a chunk at a time, so that building them holds memory for a chunk of
book rows and the rows of one bar, not for the day's book (a 5 M-row day's book is about 1.6 GB).

The store's rows arrive validated, chunk by chunk (`staging.validated_chunks`, the checks `read_day` makes of the
whole day). A first pass over the book's timestamps alone places every bar's rows (`windows.book_windows`); then
each run of bars whose rows have all arrived gets its `build.bar_book`, from those rows only. Every per-bar quantity
reads only its bar's rows and the row entering it, so the features are `build.day_features`' bit for bit
(tests/features/test_stored_features.py).
"""

from __future__ import annotations

import numpy as np

from fox_numba.config import FeatureConfig
from fox_numba.errors import InputError, MissingDataError
from fox_numba.features.build import BOOK_COLUMNS, BarBook, DayFeatures, assemble_day, bar_book, session_bars
from fox_numba.market.schema import DTYPES, NS_PER_MINUTE, Instrument, Mbp10
from fox_numba.market.sources import concat
from fox_numba.market.staging import READ_ROWS, check_stored_day, validated_chunks
from fox_numba.market.store import MarketStore


def stored_day_features(
    store: MarketStore, day: str, instrument: Instrument, config: FeatureConfig, session: str
) -> DayFeatures | None:
    """`build.day_features` of the store's `day`, validating it on the way (its one full read)."""
    source = str(store.path)
    missing = _missing(store, day)
    if missing:
        raise MissingDataError(f"{source}: {missing}")
    bars = session_bars(store.read_day(day, ("bars",)).bars, day, instrument, session, source)
    if bars is None:
        check_stored_day(store, day, READ_ROWS)  # no feature, but the full read still validates the day
        return None
    bar_ts = bars.ts_event.astype(np.int64)
    stream = _BookStream(bar_ts, *_windows(store, day, bar_ts), config.tw_imbalance, source, day)
    trades = []
    for schema, chunk in validated_chunks(store, day, READ_ROWS):
        if schema == "mbp10":
            stream.feed(chunk.data)
        elif schema == "trades":
            trades.append(chunk)
        del chunk  # before the next is read
    return assemble_day(day, bars, concat(trades).data, stream.finish(), instrument, config, source, session)


def _missing(store: MarketStore, day: str) -> str:
    """What a day lacks for features ('' if nothing), in `build._require`'s words."""
    held = {s: store.group(s, day)["ts_event"].shape[0] for s in DTYPES if day in store.file.get(s, {})}
    if not held.get("bars"):
        return f"day {day} has no bars; features are built on the 1-minute bars"
    for schema, name in (("mbp10", "MBP-10"), ("trades", "trade")):
        if schema not in held or (schema == "mbp10" and held[schema] == 0):
            return (f"day {day} has bars but no {name} data; MBP-10 and trades are mandatory (import them with "
                    "`fox data import`)")  # fmt: skip
    return ""


def _windows(store: MarketStore, day: str, bar_ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`book_windows` of the stored book, its timestamps read a chunk at a time. A book out of time order is refused
    here, by the full validation (whose error names the row)."""
    column = store.group("mbp10", day)["ts_event"]
    first = np.zeros(bar_ts.shape[0], np.int64)
    stop = np.zeros(bar_ts.shape[0], np.int64)
    last = None
    for at in range(0, column.shape[0], READ_ROWS):
        ts = column[at : at + READ_ROWS].astype(np.int64)
        if np.any(np.diff(ts) < 0) or (last is not None and ts[0] < last):
            check_stored_day(store, day, READ_ROWS)
            raise InputError(store.path, "MBP-10 timestamps are not in time order", group=f"/mbp10/{day}")
        first += np.searchsorted(ts, bar_ts, side="left")
        stop += np.searchsorted(ts, bar_ts + NS_PER_MINUTE, side="left")
        last = ts[-1]
    return np.maximum(first - 1, 0), stop


class _BookStream:
    """Fed the day's book in order, a chunk at a time; holds the rows from the first bar not yet done (its entering
    row) to the last row seen, and builds each run of bars as soon as its rows are all held."""

    def __init__(self, bar_ts: np.ndarray, enter: np.ndarray, stop: np.ndarray, tw_imbalance: bool, source: str,
                 day: str) -> None:  # fmt: skip
        self.bar_ts, self.enter, self.stop = bar_ts, enter, stop
        self.tw_imbalance, self.source, self.day = tw_imbalance, source, day
        self.rows: dict[str, np.ndarray] | None = None
        self.lo = self.hi = 0
        """`rows` are the day's rows lo .. hi - 1 (none while lo >= hi)."""
        self.done = 0
        """Bars built so far."""
        self.parts: list[BarBook] = []

    def feed(self, book: Mbp10) -> None:
        start, self.hi = self.hi, self.hi + book.ts_event.shape[0]
        cut = max(self.lo - start, 0)  # rows before the next bar's entering row are not needed
        cols = {k: getattr(book, k)[cut:] for k in BOOK_COLUMNS}
        if self.rows is not None:
            cols = {k: np.concatenate([self.rows[k], v]) for k, v in cols.items()}
        self.rows = cols
        ready = int(np.searchsorted(self.stop, self.hi, side="right"))
        if ready > self.done:
            bars = slice(self.done, ready)
            self.parts.append(bar_book(
                self.rows, self.bar_ts[bars], self.enter[bars] - self.lo, self.stop[bars] - self.lo,
                first_row=self.lo, first_bar=self.done, tw_imbalance=self.tw_imbalance, source=self.source,
                day=self.day,
            ))  # fmt: skip
            self.done = ready
        keep = int(self.enter[self.done]) if self.done < self.enter.shape[0] else self.hi
        if keep > self.lo:
            self.rows = {k: v[min(keep, self.hi) - self.lo :].copy() for k, v in self.rows.items()}
            self.lo = keep

    def finish(self) -> BarBook:
        """Every bar's `BarBook` (every row has been fed by now)."""
        if self.done < self.stop.shape[0]:
            raise AssertionError(f"bars {self.done}.. of day {self.day} were not reached by its book")
        return {k: np.concatenate([p[k] for p in self.parts]) for k in self.parts[0]}
