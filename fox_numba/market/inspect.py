"""`fox data inspect`: a per-day summary of a market store (contract, rows, time range, spread, depth, trades,
gaps).

Book statistics are taken over the book rows of the whole trading day: the median spread (in ticks) of
rows with both sides present, the mean size at the best bid and ask, and the count of one-sided rows in
the regular session. Gaps: regular-session minutes without a bar, and the longest time between two
consecutive book rows.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from rich.table import Table

from fox_numba.market.calendar import format_ns, session_bounds, session_minutes
from fox_numba.market.schema import SCHEMAS, UNDEF_PRICE, Instrument, MarketDay, n_rows
from fox_numba.market.store import MarketStore


@dataclass
class DaySummary:
    day: str
    contract: str
    """The contract the day's rows are from (a change from one day to the next is a roll)."""
    rows: dict[str, int]
    first: str | None
    """Earliest ts_event of the day over all schemas (local time)."""
    last: str | None
    median_spread_ticks: float | None
    mean_top_depth: float | None
    """Mean of (best bid size + best ask size) / 2 over book rows with both sides present."""
    one_sided_rows: int
    """Book rows in the regular session with an empty best bid or ask."""
    trades: int
    volume: int
    missing_minutes: int | None
    """Regular-session minutes without a bar (None without bars)."""
    longest_book_gap_s: float | None
    """Longest time between consecutive book rows, seconds (None with fewer than two rows)."""


def summarize_day(day: MarketDay, instrument: Instrument) -> DaySummary:
    """The summary of one validated trading day."""
    stamps = [getattr(day, s).ts_event for s in day.present() if n_rows(getattr(day, s))]
    first = min(int(t[0]) for t in stamps) if stamps else None
    last = max(int(t[-1]) for t in stamps) if stamps else None
    spread = depth = gap = None
    one_sided = 0
    if day.mbp10 is not None and n_rows(day.mbp10):
        book = day.mbp10
        bid, ask = book.bid_px[:, 0], book.ask_px[:, 0]
        both = (bid != UNDEF_PRICE) & (ask != UNDEF_PRICE)
        if both.any():
            spread = float(np.median((ask[both] - bid[both]) / instrument.tick_fixed))
            depth = float(np.mean((book.bid_sz[both, 0].astype(np.float64) + book.ask_sz[both, 0]) / 2))
        open_ns, close_ns = session_bounds(day.day, instrument)
        in_session = (book.ts_event >= np.uint64(open_ns)) & (book.ts_event < np.uint64(close_ns))
        one_sided = int(np.count_nonzero(in_session & ~both))
        if n_rows(book) > 1:
            gap = float(np.diff(book.ts_event).max()) / 1e9
    missing = None
    if day.bars is not None:
        missing = int(np.count_nonzero(~np.isin(session_minutes(day.day, instrument), day.bars.ts_event)))
    trades = day.trades
    return DaySummary(
        day=day.day,
        contract=day.contract,
        rows={s: n_rows(getattr(day, s)) for s in day.present()},
        first=None if first is None else format_ns(first, instrument.timezone),
        last=None if last is None else format_ns(last, instrument.timezone),
        median_spread_ticks=spread,
        mean_top_depth=depth,
        one_sided_rows=one_sided,
        trades=0 if trades is None else n_rows(trades),
        volume=0 if trades is None else int(trades.size.sum(dtype=np.uint64)),
        missing_minutes=missing,
        longest_book_gap_s=gap,
    )


def summarize(path: str | Path) -> dict:
    """Instrument, root attributes and per-day summaries of a store, as plain data (for --json)."""
    with MarketStore(path) as store:
        days = [asdict(summarize_day(store.read_day(d), store.instrument)) for d in store.days()]
        return {
            "path": str(store.path),
            "instrument": asdict(store.instrument),
            "attrs": store.attrs,
            "schemas": {s: len(store.days(s)) for s in SCHEMAS},
            "days": days,
        }


def summary_table(summary: dict) -> Table:
    """A rich table with one row per trading day."""
    inst = summary["instrument"]
    table = Table(
        title=f"{summary['path']}: {inst['symbol']} (tick {inst['tick_size']:g}, ${inst['point_value']:g}/point, "
        f"session {inst['session_open']}-{inst['session_close']} {inst['timezone']})",
        title_justify="left",
    )
    stats = ("spread (ticks)", "top depth", "one-sided", "trades", "volume", "missing min", "max book gap (s)")
    for name in ("day", "contract", *SCHEMAS, "first", "last", *stats):
        table.add_column(name, justify="left" if name in ("day", "contract", "first", "last") else "right")
    for d in summary["days"]:
        table.add_row(
            d["day"],
            d["contract"],
            *(_num(d["rows"].get(s)) for s in SCHEMAS),
            _clock(d["first"]),
            _clock(d["last"]),
            _num(d["median_spread_ticks"], ".2f"),
            _num(d["mean_top_depth"], ".1f"),
            _num(d["one_sided_rows"]),
            _num(d["trades"]),
            _num(d["volume"]),
            _num(d["missing_minutes"]),
            _num(d["longest_book_gap_s"], ".3f"),
        )
    return table


def _num(value: float | int | None, fmt: str = ",") -> str:
    return "-" if value is None else format(value, fmt)


def _clock(stamp: str | None) -> str:
    """Local date and time to the millisecond."""
    return "-" if stamp is None else stamp[:23]
