"""Validation of one trading day of market data, run by the store on every write and every read.

Every failure raises `InputError` naming the file, the group (`/{schema}/{day}`, the store's layout), the
field (Databento's flattened name, e.g. `bid_px_03`) and the first offending row. All checks are
vectorised numpy over whole columns.

What each rule means, with real feeds in mind:
- Columns: every field of the schema, equal lengths, book arrays `[n, 10]`. Values are cast to the
  store's dtypes (`schema.DTYPES`); a NaN or infinite value, a fraction, or a negative size is rejected
  before casting.
- Trading day: a YYYY-MM-DD date that is a trading day of the instrument's exchange calendar.
- Timestamps: never 0 or Databento's undefined value; inside the trading day (`calendar.day_bounds`);
  never decreasing; never in the regular hours of a closed date the day spans (a session on Good Friday,
  say, would otherwise join the next trading day: one day of two sessions with a weekend between).
- Duplicates, per schema:
  bars: a minute may appear once (strictly increasing `ts_event`), and `ts_event` is a minute start;
  mbp10: several rows may share a `ts_event` (one exchange packet carries several book changes), but a
  row equal to the previous one in every column is a duplicate (a record that changed nothing at the
  same instant: repeated or double-ingested data);
  trades: equal rows at one instant are legitimate (one aggressor filling several resting orders of the
  same size at one price, as LOBSTER and CME report them), so only ordering is checked.
- Prices: `UNDEF_PRICE` only marks an empty book level; every other price must be positive.
- Book levels: an empty level has zero size and order count, and every deeper level is empty too; a
  priced level has a positive size; bids strictly fall and asks strictly rise with depth. An empty best
  level on one side is a one-sided book and is allowed.
- Crossed or locked book (best bid >= best ask, both present): an error from the session open of the
  trading day on; before it (the pre-open, incl. CME's overnight Globex session) auctions may cross.
A time outside the day or a crossed book often means the day is cut at the wrong hour: those errors say
which import option (`--day-roll`, `--calendar`, `--session-open`) would read the row differently.
- Trades: positive size, side in {-1, 0, +1}, and, when the day has a book, inside the book's time range.
- Bars against trades: on every minute fully covered by the trades (after the first trade's minute and
  before the last one's), each bar equals the bar rebuilt from trades (`bars.bars_from_trades`), and no
  minute with trades lacks a bar; bars with zero volume and no trades are allowed.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date
from pathlib import Path
from typing import NoReturn
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import numpy as np

from fox_numba.errors import InputError
from fox_numba.market.bars import bars_from_trades, minute_of
from fox_numba.market.calendar import (
    CALENDARS,
    closed_dates,
    closed_reason,
    day_bounds,
    format_ns,
    parse_hhmm,
    session_bounds,
)
from fox_numba.market.schema import (
    DTYPES,
    N_LEVELS,
    NS_PER_MINUTE,
    PRICE_SCALE,
    SCHEMA_TYPES,
    UNDEF_PRICE,
    Bars,
    Instrument,
    MarketDay,
    Mbp10,
    Trades,
    columns,
)

UNDEF_TIMESTAMP = np.uint64(np.iinfo(np.uint64).max)
"""Databento's marker for an undefined timestamp."""

CHECK_ORDER = ("mbp10", "trades", "bars")
"""Sources first, so that a fault in trades is reported there and not in the bars built from them."""
BOOK_FIELDS = ("bid_px", "ask_px", "bid_sz", "ask_sz", "bid_ct", "ask_ct")


class RowWhere:
    """Raises `InputError` for one schema of one day of one file."""

    def __init__(self, path: str | Path, schema: str, day: str, timezone: str) -> None:
        self.path, self.group, self.timezone = path, f"/{schema}/{day}", timezone

    def fail(self, field: str | None, row: int | None, message: str) -> NoReturn:
        raise InputError(self.path, message, group=self.group, field=field, row=row)

    def check(self, bad: np.ndarray, field: str, message: str) -> None:
        """Fail at the first True of `bad`; for [n, levels] masks the field is named per level (`bid_px_03`)."""
        if not bad.any():
            return
        if bad.ndim == 1:
            self.fail(field, int(np.argmax(bad)), message)
        row = int(np.argmax(bad.any(axis=1)))
        self.fail(f"{field}_{int(np.argmax(bad[row])):02d}", row, message)

    def time(self, ts: int) -> str:
        return f"{format_ns(ts, self.timezone)} {self.timezone}"


def validate_day(day: MarketDay, instrument: Instrument, path: str | Path) -> MarketDay:
    """Check one trading day; return it with every column cast to the store's dtypes."""
    _check_day_name(day.day, instrument, path)
    out = MarketDay(day.day, contract=day.contract)
    for schema in CHECK_ORDER:
        if getattr(day, schema) is None:
            continue
        where = RowWhere(path, schema, day.day, instrument.timezone)
        record = _cast(getattr(day, schema), schema, where)
        _check_timestamps(record.ts_event, day.day, instrument, where, strict=schema == "bars")
        if schema == "mbp10":
            _check_book(record, day.day, instrument, where)
        elif schema == "trades":
            check_trades(record, out.mbp10, where)
        else:
            _check_bars(record, where)
            if out.trades is not None:
                check_bars_match_trades(record, out.trades, where)
        setattr(out, schema, record)
    return out


def validate_instrument(instrument: Instrument, path: str | Path) -> None:
    """Check the instrument's attributes: positive tick and point value, a known zone and calendar, HH:MM
    times in order (session open < close <= day roll <= day open)."""
    for name in ("tick_size", "point_value"):
        value = getattr(instrument, name)
        if not (isinstance(value, int | float) and np.isfinite(value) and value > 0):
            raise InputError(path, f"{name} must be a positive number, got {value!r}", group="/", field=name)
    try:
        ZoneInfo(instrument.timezone)
    except (TypeError, ValueError, ZoneInfoNotFoundError):
        raise InputError(path, f"unknown time zone {instrument.timezone!r}", group="/", field="timezone") from None
    if instrument.calendar not in CALENDARS:
        message = f"calendar {instrument.calendar!r} is not one of {', '.join(CALENDARS)}"
        raise InputError(path, message, group="/", field="calendar")
    minutes = {}
    for name in ("session_open", "session_close", "day_roll", "day_open"):
        try:
            minutes[name] = parse_hhmm(getattr(instrument, name))
        except (AttributeError, ValueError) as e:
            raise InputError(path, str(e), group="/", field=name) from None
    order = (
        ("session_open", "session_close", "session_open must be before session_close"),
        ("session_close", "day_roll", "the regular session must end by the day roll (session_close <= day_roll)"),
        ("day_roll", "day_open", "day_open (the reopen after the daily break) must not be before day_roll"),
    )
    for first, then, message in order:
        late = minutes[first] >= minutes[then] if first == "session_open" else minutes[first] > minutes[then]
        if late:
            raise InputError(path, message, group="/", field=first)


def _check_day_name(day: str, instrument: Instrument, path: str | Path) -> None:
    try:
        ok = date.fromisoformat(day).isoformat() == day
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise InputError(path, f"trading day {day!r} is not a YYYY-MM-DD date")
    closed = closed_reason(date.fromisoformat(day), instrument.calendar)
    if closed is not None:
        others = ", ".join(c for c in CALENDARS if c != instrument.calendar)
        raise InputError(
            path,
            f"{day} is {closed}, not a trading day of the {instrument.calendar!r} calendar "
            f"(--calendar {others} would count it)",
        )


def _cast(record: Bars | Mbp10 | Trades, schema: str, where: RowWhere) -> Bars | Mbp10 | Trades:
    if not isinstance(record, SCHEMA_TYPES[schema]):
        where.fail(None, None, f"expected {SCHEMA_TYPES[schema].__name__}, got {type(record).__name__}")
    cols = columns(record)
    n = np.asarray(cols["ts_event"]).shape[0] if np.ndim(cols["ts_event"]) == 1 else -1
    if n < 0:
        where.fail("ts_event", None, "ts_event must be one-dimensional")
    out = {}
    for name, dtype in DTYPES[schema].items():
        values = np.asarray(cols[name])
        want = (n, N_LEVELS) if schema == "mbp10" and name != "ts_event" else (n,)
        if values.shape != want:
            where.fail(name, None, f"shape {values.shape}, expected {want}")
        out[name] = _cast_column(values, dtype, name, where)
    return SCHEMA_TYPES[schema](**out)


def _cast_column(values: np.ndarray, dtype: np.dtype, name: str, where: RowWhere) -> np.ndarray:
    if values.dtype == dtype:
        return values
    if values.dtype.kind not in "biuf":
        where.fail(name, None, f"dtype {values.dtype} is not numeric")
    if values.dtype.kind == "f":
        where.check(~np.isfinite(values), name, "NaN or infinite value")
        where.check(values != np.round(values), name, "fractional value where an integer is stored")
    info = np.iinfo(dtype)
    where.check(values < info.min, name, "negative value" if info.min == 0 else f"value below {info.min}")
    where.check(values > info.max, name, f"value above {info.max} (the {dtype} range)")
    return values.astype(dtype)


def _check_timestamps(ts: np.ndarray, day: str, instrument: Instrument, where: RowWhere, *, strict: bool) -> None:
    where.check((ts == 0) | (ts == UNDEF_TIMESTAMP), "ts_event", "undefined timestamp")
    start, end = day_bounds(day, instrument)
    outside = (ts < np.uint64(start)) | (ts >= np.uint64(end))
    if outside.any():
        row = int(np.argmax(outside))
        where.fail(
            "ts_event",
            row,
            f"{where.time(int(ts[row]))} is outside trading day {day[:10]} "
            f"({where.time(start)} to {where.time(end)}; a day runs from the day roll on the trading day "
            f"before it, set by --day-roll {instrument.day_roll} and --calendar {instrument.calendar})",
        )
    _check_closed_sessions(ts, day, instrument, where)
    if ts.size > 1:
        step = ts[1:].astype(np.int64) - ts[:-1].astype(np.int64)
        where.check(np.r_[False, step < 0], "ts_event", "ts_event decreases (rows must be in time order)")
        if strict:
            where.check(np.r_[False, step == 0], "ts_event", "duplicate minute")


def _check_closed_sessions(ts: np.ndarray, day: str, instrument: Instrument, where: RowWhere) -> None:
    """Refuse rows in the regular hours of a closed date that the day spans (Good Friday before Monday's
    day): that session would be folded into `day`, which would then hold two sessions and the gap between."""
    for closed, reason in closed_dates(day, instrument):
        lo, hi = session_bounds(closed.isoformat(), instrument)
        inside = (ts >= np.uint64(lo)) & (ts < np.uint64(hi))
        if inside.any():
            row = int(np.argmax(inside))
            opens = next(c for c in CALENDARS if closed_reason(closed, c) is None)
            where.fail(
                "ts_event",
                row,
                f"{where.time(int(ts[row]))} is in the regular hours of {closed}, {reason}, not a trading day of "
                f"the {instrument.calendar!r} calendar: its session would be folded into trading day {day} "
                f"(--calendar {opens} keeps {closed} a day of its own)",
            )


def _check_prices(px: np.ndarray, name: str, where: RowWhere, *, allow_undef: bool) -> None:
    if not allow_undef:
        where.check(px == UNDEF_PRICE, name, "undefined price (UNDEF_PRICE)")
    where.check(px <= 0, name, "non-positive price")


def _check_bars(bars: Bars, where: RowWhere) -> None:
    where.check(bars.ts_event % np.uint64(NS_PER_MINUTE) != 0, "ts_event", "not the start of a minute")
    for name in ("open", "high", "low", "close"):
        _check_prices(getattr(bars, name), name, where, allow_undef=False)
    where.check(bars.high < np.maximum(bars.open, bars.close), "high", "high below open or close")
    where.check(bars.low > np.minimum(bars.open, bars.close), "low", "low above open or close")


def _check_book(book: Mbp10, day: str, instrument: Instrument, where: RowWhere) -> None:
    """The level rules, a crossed book after the open, duplicate rows. The level checks, which name a fault,
    run only where one cheaper pass (`_levels_faulty`) finds one."""
    if _levels_faulty(book):
        _check_levels(book, where)
    _check_cross(book, day, instrument, where)
    tie = book.ts_event[1:] == book.ts_event[:-1]
    ties = np.flatnonzero(tie)
    if ties.size == 0:
        return
    cols = [getattr(book, n) for n in BOOK_FIELDS]
    if 4 * ties.size < tie.size:  # few rows share a ts_event (only they can be duplicates): those compared alone
        differs = cols[0][ties + 1] != cols[0][ties]
        for col in cols[1:]:
            differs |= col[ties + 1] != col[ties]
        tie[ties] = ~differs.any(axis=1)
    else:
        tie &= equals_previous(cols)
    where.check(np.r_[False, tie], "ts_event", "duplicate row (same ts_event and book as the row before)")


def _levels_faulty(book: Mbp10) -> bool:
    """Whether any row breaks a rule `_check_levels` checks (which then runs, to name the first fault), in fewer
    passes: a side without an empty level (the common case) only needs its minimum price and size and its order;
    one with empty levels gets the rules' masks joined and reduced once."""
    if book.bid_px.size == 0:
        return False
    for side in ("bid", "ask"):
        px, sz, ct = (getattr(book, f"{side}_{k}") for k in ("px", "sz", "ct"))
        empty = px == UNDEF_PRICE
        order = px[:, 1:] >= px[:, :-1] if side == "bid" else px[:, 1:] <= px[:, :-1]
        if not empty.any():
            if px.min() <= 0 or sz.min() == 0 or order.any():
                return True
            continue
        bad = px <= 0
        bad |= (sz == 0) != empty  # an empty level with a size, or a priced one without
        bad |= empty & (ct != 0)
        bad[:, 1:] |= empty[:, :-1] > empty[:, 1:]  # a priced level below an empty one
        bad[:, 1:] |= order & ~(empty[:, 1:] | empty[:, :-1])
        if bad.any():
            return True
    return False


def _check_levels(book: Mbp10, where: RowWhere) -> None:
    """Each level rule in turn, failing at its first offending row and level."""
    for side in ("bid", "ask"):
        px, sz, ct = (getattr(book, f"{side}_{k}") for k in ("px", "sz", "ct"))
        empty = px == UNDEF_PRICE
        _check_prices(px, f"{side}_px", where, allow_undef=True)
        where.check(empty & (sz != 0), f"{side}_sz", "empty level (UNDEF_PRICE) with a non-zero size")
        where.check(empty & (ct != 0), f"{side}_ct", "empty level (UNDEF_PRICE) with a non-zero order count")
        where.check(~empty & (sz == 0), f"{side}_sz", "priced level with zero size")
        deeper = np.zeros_like(empty)
        deeper[:, 1:] = empty[:, :-1] & ~empty[:, 1:]
        where.check(deeper, f"{side}_px", "priced level below an empty level")
        both = ~empty[:, 1:] & ~empty[:, :-1]
        order = px[:, 1:] >= px[:, :-1] if side == "bid" else px[:, 1:] <= px[:, :-1]
        bad = np.zeros_like(empty)
        bad[:, 1:] = both & order
        word = "falling" if side == "bid" else "rising"
        where.check(bad, f"{side}_px", f"{side} prices are not strictly {word} with depth")


def equals_previous(cols: Sequence[np.ndarray]) -> np.ndarray:
    """Whether each row equals the row before it in every one of `cols` (each [n, k], n >= 1; n - 1 values). The
    columns' element-wise differences are joined first and reduced over a row once (a reduction per column cost
    more than the comparisons; rows compared as opaque bytes are slow where they are equal, as books mostly are)."""
    differs = cols[0][1:] != cols[0][:-1]
    for col in cols[1:]:
        differs |= col[1:] != col[:-1]
    return ~differs.any(axis=1)


def _check_cross(book: Mbp10, day: str, instrument: Instrument, where: RowWhere) -> None:
    bid, ask = book.bid_px[:, 0], book.ask_px[:, 0]
    session_open, session_close = session_bounds(day, instrument)
    crossed = (book.ts_event >= np.uint64(session_open)) & (bid != UNDEF_PRICE) & (ask != UNDEF_PRICE) & (bid >= ask)
    if crossed.any():
        row = int(np.argmax(crossed))
        ts = int(book.ts_event[row])
        kind = "locked" if bid[row] == ask[row] else "crossed"
        if ts >= session_close:
            hint = (
                f"it is after the {instrument.session_close} close, and the day rolls only at "
                f"{instrument.day_roll}: an earlier --day-roll (CME Globex: 17:00 New York) makes it the next "
                "trading day's pre-open"
            )
        else:
            hint = f"a crossed book is allowed only before the session open, --session-open {instrument.session_open}"
        where.fail(
            "bid_px_00",
            row,
            f"{kind} book after the session open: bid {bid[row] * PRICE_SCALE:.9g} >= ask "
            f"{ask[row] * PRICE_SCALE:.9g} at {where.time(ts)} ({hint})",
        )


def check_trades(trades: Trades, book: Mbp10 | None, where: RowWhere) -> None:
    _check_prices(trades.price, "price", where, allow_undef=False)
    where.check(trades.size == 0, "size", "zero size")
    where.check((trades.side < -1) | (trades.side > 1), "side", "side must be -1, 0 or +1")
    if book is None or trades.ts_event.size == 0:
        return
    if book.ts_event.size == 0:
        where.fail("ts_event", 0, "trades on a day whose book has no rows")
    first, last = int(book.ts_event[0]), int(book.ts_event[-1])
    outside = (trades.ts_event < np.uint64(first)) | (trades.ts_event > np.uint64(last))
    if outside.any():
        row = int(np.argmax(outside))
        where.fail(
            "ts_event",
            row,
            f"trade at {where.time(int(trades.ts_event[row]))} is outside the book's time range "
            f"({where.time(first)} to {where.time(last)})",
        )


def check_bars_match_trades(bars: Bars, trades: Trades, where: RowWhere) -> None:
    if trades.ts_event.size == 0:
        return
    lo = minute_of(trades.ts_event[:1])[0] + np.uint64(NS_PER_MINUTE)
    hi = minute_of(trades.ts_event[-1:])[0]
    built = bars_from_trades(trades)
    keep = (built.ts_event >= lo) & (built.ts_event < hi)
    in_range = np.flatnonzero((bars.ts_event >= lo) & (bars.ts_event < hi))
    ref_at = np.searchsorted(built.ts_event, bars.ts_event[in_range])
    ref_at = np.minimum(ref_at, built.ts_event.size - 1)
    found = built.ts_event[ref_at] == bars.ts_event[in_range]
    missing_ok = bars.volume[in_range] == 0
    no_trades = ~found & ~missing_ok
    if no_trades.any():
        row = int(in_range[np.argmax(no_trades)])
        where.fail("volume", row, f"bar has volume {bars.volume[row]} but its minute has no trades")
    rows, refs = in_range[found], ref_at[found]
    for name in ("open", "high", "low", "close", "volume"):
        mine, theirs = getattr(bars, name)[rows], getattr(built, name)[refs]
        bad = mine != theirs
        if bad.any():
            k = int(np.argmax(bad))
            unit = PRICE_SCALE if name != "volume" else 1
            where.fail(
                name,
                int(rows[k]),
                f"bar {name} {mine[k] * unit:.9g} differs from the trades' {theirs[k] * unit:.9g} "
                f"(minute {where.time(int(bars.ts_event[rows[k]]))})",
            )
    covered = built.ts_event[keep]
    lacking = ~np.isin(covered, bars.ts_event)
    if lacking.any():
        minute = int(covered[np.argmax(lacking)])
        row = int(np.searchsorted(bars.ts_event, np.uint64(minute)))
        where.fail("ts_event", row, f"no bar for minute {where.time(minute)}, which has trades")
