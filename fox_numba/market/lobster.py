"""LOBSTER importer: one message + orderbook CSV pair (one stock, one day) to a trading day.

LOBSTER's files (lobsterdata.com), no header rows:
    {TICKER}_{YYYY-MM-DD}_{start}_{end}_message_{L}.csv    time, type, order id, size, price, direction
    {TICKER}_{YYYY-MM-DD}_{start}_{end}_orderbook_{L}.csv  per level 1..L: ask px, ask size, bid px, bid size
Row i of the orderbook is the book after message i. Conversions:
- time is seconds after midnight, exchange-local (New York), on the date in the file name -> UTC ns;
- prices are dollars x 10000 -> 1e-9 fixed point (x 100000); the empty-level markers 9999999999 (ask) and
  -9999999999 (bid) become `UNDEF_PRICE`;
- LOBSTER has no order counts per level: `bid_ct` / `ask_ct` are written as 0;
- books deeper than 10 levels are cut to 10, shallower ones are padded with empty levels;
- book rows that leave the stored book unchanged (hidden executions, halts, changes deeper than 10) are
  dropped, as for Databento (`sources.unchanged_book_rows`);
- trades are the executions, types 4 (visible) and 5 (hidden); `direction` is the side of the resting
  limit order, so the aggressor is its opposite (executing a sell limit order, -1, is a buy, +1). Type 6
  (auction cross) is not a continuous-trading execution and is left out.
Rows in errors are 0-based data rows of the named file (the files have no header line), fields are named
as above (`price`, `ask_price_1`); a value that is not a number, a NaN or a row of the wrong width is
found and named here, not in numpy's words.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import numpy as np

from fox_numba.errors import InputError
from fox_numba.market.calendar import local_ns
from fox_numba.market.schema import N_LEVELS, UNDEF_PRICE, Instrument, MarketDay, Mbp10, Trades
from fox_numba.market.sources import Sourced, bars_sourced, unchanged_book_rows, validate_sourced

NAME = re.compile(
    r"^(?P<ticker>[^_]+)_(?P<date>\d{4}-\d{2}-\d{2})_(?P<start>\d+)_(?P<end>\d+)_(?P<kind>message|orderbook)_(?P<levels>\d+)\.csv$"
)
TO_FIXED = 100_000
"""LOBSTER price (dollars x 10000) to 1e-9 fixed point."""
EMPTY_ASK, EMPTY_BID = 9_999_999_999, -9_999_999_999
EXECUTIONS = (4, 5)
TIMEZONE = "America/New_York"
MESSAGE_FIELDS = ("time", "type", "order_id", "size", "price", "direction")


def orderbook_fields(levels: int) -> tuple[str, ...]:
    """LOBSTER's orderbook columns: ask price, ask size, bid price, bid size per level 1..levels."""
    return tuple(f"{side}_{what}_{m}" for m in range(1, levels + 1) for side, what in _BOOK_COLUMNS)


_BOOK_COLUMNS = (("ask", "price"), ("ask", "size"), ("bid", "price"), ("bid", "size"))


def equity_instrument(ticker: str) -> Instrument:
    """Defaults for a US stock: one-cent tick, $1 per share, NYSE/Nasdaq hours and holidays, calendar-date days."""
    return Instrument(
        symbol=ticker, tick_size=0.01, point_value=1.0, timezone=TIMEZONE, day_roll="24:00", day_open="24:00"
    )


@dataclass(frozen=True)
class LobsterPair:
    """The two files of one stock-day."""

    message: Path
    orderbook: Path
    ticker: str
    day: str
    levels: int

    @classmethod
    def of(cls, path: Path) -> LobsterPair:
        """The pair a message or orderbook file belongs to (its partner must sit beside it)."""
        match = NAME.match(path.name)
        if match is None:
            raise InputError(path, "not a LOBSTER file name (TICKER_YYYY-MM-DD_start_end_message|orderbook_LEVELS.csv)")
        other = "orderbook" if match["kind"] == "message" else "message"
        partner = path.with_name(path.name.replace(f"_{match['kind']}_", f"_{other}_"))
        if not partner.is_file():
            raise InputError(path, f"its {other} file {partner.name} is missing")
        message, orderbook = (path, partner) if match["kind"] == "message" else (partner, path)
        return cls(message, orderbook, match["ticker"], match["date"], int(match["levels"]))


def find_pairs(folder: Path) -> list[LobsterPair]:
    """Every message/orderbook pair in a folder (not recursive), by date."""
    pairs = [LobsterPair.of(p) for p in folder.iterdir() if NAME.match(p.name) and "_message_" in p.name]
    return sorted(pairs, key=lambda p: (p.day, p.ticker))


def read_pair(pair: LobsterPair, instrument: Instrument) -> MarketDay:
    """The validated trading day of a pair: book changes, executions, bars from the executions."""
    msg = _load(pair.message, MESSAGE_FIELDS, np.float64)
    book = _load(pair.orderbook, orderbook_fields(pair.levels), np.int64)
    if msg.shape[0] != book.shape[0]:
        raise InputError(pair.orderbook, f"{book.shape[0]} rows, but the message file has {msg.shape[0]}")
    ts = _timestamps(msg[:, 0], pair)
    mbp = _book(book, pair.orderbook, ts)
    trades = _trades(msg, ts, pair.message)
    parts = {"mbp10": mbp, "trades": trades, "bars": bars_sourced(trades)}
    labels = {"mbp10": "orderbook", "trades": "executions", "bars": "bars built from executions"}
    return validate_sourced(pair.day, parts, instrument, labels, pair.ticker)


def _load(path: Path, names: tuple[str, ...], dtype: type) -> np.ndarray:
    """The CSV as a [rows, len(names)] array; a malformed file is an InputError naming the row and field."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "input contained no data": refused just below
            data = np.loadtxt(path, delimiter=",", dtype=dtype, ndmin=2)
    except OSError as e:
        raise InputError(path, f"cannot read the file ({e.strerror or e})") from None
    except ValueError:  # numpy's words and 1-based rows: find the fault and say it in ours
        _find_bad_value(path, names, dtype)
        raise InputError(path, "not a LOBSTER CSV (comma-separated numbers, no header)") from None
    if data.shape[0] == 0:
        raise InputError(path, "the file holds no rows (a day without messages cannot be imported)")
    if data.shape[1] != len(names):
        raise InputError(path, f"{data.shape[1]} fields, expected {len(names)} ({', '.join(names[:6])}...)", row=0)
    if data.dtype.kind == "f":
        bad = ~np.isfinite(data)
        if bad.any():
            row = int(np.argmax(bad.any(axis=1)))
            raise InputError(path, "NaN or infinite value", field=names[int(np.argmax(bad[row]))], row=row)
    return data


def _find_bad_value(path: Path, names: tuple[str, ...], dtype: type) -> None:
    """Raise an InputError at the first row of the wrong width or value that does not parse as `dtype`."""
    parse, kind = (int, "an integer") if np.dtype(dtype).kind == "i" else (float, "a number")
    try:
        with path.open(encoding="utf-8") as fh:
            for row, line in enumerate(fh):
                values = line.rstrip("\r\n").split(",")
                if len(values) != len(names):
                    raise InputError(path, f"{len(values)} fields, expected {len(names)}", row=row)
                for name, text in zip(names, values, strict=True):
                    try:
                        parse(text)
                    except ValueError:
                        raise InputError(path, f"{text.strip()!r} is not {kind}", field=name, row=row) from None
    except UnicodeDecodeError:
        raise InputError(path, "not a LOBSTER CSV (not UTF-8 text)") from None


def _timestamps(seconds: np.ndarray, pair: LobsterPair) -> np.ndarray:
    bad = ~np.isfinite(seconds) | (seconds < 0) | (seconds >= 86_400)
    if bad.any():
        raise InputError(pair.message, "time is not seconds after midnight", field="time", row=int(np.argmax(bad)))
    down = np.flatnonzero(np.diff(seconds) < 0)
    if down.size:
        message = "time decreases (messages must be in time order)"
        raise InputError(pair.message, message, field="time", row=int(down[0]) + 1)
    midnight = local_ns(date.fromisoformat(pair.day), 0, TIMEZONE)
    return (np.uint64(midnight) + np.rint(seconds * 1e9).astype(np.uint64)).astype(np.uint64)


def _book(raw: np.ndarray, path: Path, ts: np.ndarray) -> Sourced:
    n, levels = raw.shape[0], raw.shape[1] // 4
    cols = raw.reshape(n, levels, 4)[:, :N_LEVELS]
    pad = N_LEVELS - cols.shape[1]
    ask_px, ask_sz, bid_px, bid_sz = (np.pad(cols[:, :, k], ((0, 0), (0, pad))) for k in range(4))
    ask_empty = np.pad(cols[:, :, 0] == EMPTY_ASK, ((0, 0), (0, pad)), constant_values=True)
    bid_empty = np.pad(cols[:, :, 2] == EMPTY_BID, ((0, 0), (0, pad)), constant_values=True)
    book = Mbp10(  # sizes stay int64 here: validation casts them, refusing negative or oversized ones
        ts_event=ts,
        bid_px=np.where(bid_empty, UNDEF_PRICE, bid_px * TO_FIXED),
        ask_px=np.where(ask_empty, UNDEF_PRICE, ask_px * TO_FIXED),
        bid_sz=bid_sz,
        ask_sz=ask_sz,
        bid_ct=np.zeros((n, N_LEVELS), dtype=np.uint32),
        ask_ct=np.zeros((n, N_LEVELS), dtype=np.uint32),
    )
    rows = np.arange(n)
    keep = np.flatnonzero(~unchanged_book_rows([book.bid_px, book.ask_px, book.bid_sz, book.ask_sz], ts))
    return Sourced.one_file(book, path, rows).take(keep)


def _trades(msg: np.ndarray, ts: np.ndarray, path: Path) -> Sourced:
    rows = np.flatnonzero(np.isin(msg[:, 1], EXECUTIONS))
    direction = msg[rows, 5]
    bad = (direction != 1) & (direction != -1)
    if bad.any():
        k = int(np.argmax(bad))
        raise InputError(path, f"direction {direction[k]:g} is not +1 or -1", field="direction", row=int(rows[k]))
    trades = Trades(
        ts_event=ts[rows],
        price=msg[rows, 4].astype(np.int64) * TO_FIXED,
        size=msg[rows, 3],
        side=(-direction).astype(np.int8),
    )
    return Sourced.one_file(trades, path, rows)
