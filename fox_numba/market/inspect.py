"""`fox data inspect`: a per-day summary of a market store (contract, rows, time range, spread, depth, trades,
gaps).

Each day is read and validated a chunk at a time, so memory does not grow with its size. Book statistics are
taken over the book rows of the whole trading day: the median spread (in ticks) of
rows with both sides present, the mean size at the best bid and ask, and the count of one-sided rows in
the regular session. Gaps: regular-session minutes without a bar, and the longest time between two
consecutive book rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from rich.table import Table

from fox_numba.market.calendar import format_ns, session_bounds, session_minutes
from fox_numba.market.day_workers import outcome, read_workers, start_pool
from fox_numba.market.schema import SCHEMAS, UNDEF_PRICE, Instrument, Mbp10
from fox_numba.market.staging import READ_ROWS, validated_chunks
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


class _BookStats:
    """The book's statistics, fed its rows a chunk at a time: the spreads of two-sided rows as value counts (their
    median is then exact), the top sizes' integer sum, the one-sided rows in the session and the longest gap."""

    def __init__(self, day: str, instrument: Instrument) -> None:
        self.tick = instrument.tick_fixed
        self.open_ns, self.close_ns = (np.uint64(t) for t in session_bounds(day, instrument))
        self.spreads: dict[int, int] = {}
        self.top_size = self.both = self.one_sided = 0
        self.gap: int | None = None
        self.last: np.uint64 | None = None

    def feed(self, book: Mbp10) -> None:
        ts = book.ts_event
        bid, ask = book.bid_px[:, 0], book.ask_px[:, 0]
        both = (bid != UNDEF_PRICE) & (ask != UNDEF_PRICE)
        values, counts = np.unique(ask[both] - bid[both], return_counts=True)
        for v, c in zip(values.tolist(), counts.tolist(), strict=True):
            self.spreads[v] = self.spreads.get(v, 0) + c
        self.top_size += int(book.bid_sz[both, 0].sum(dtype=np.uint64)) + int(book.ask_sz[both, 0].sum(dtype=np.uint64))
        self.both += int(np.count_nonzero(both))
        self.one_sided += int(np.count_nonzero((ts >= self.open_ns) & (ts < self.close_ns) & ~both))
        steps = np.diff(ts if self.last is None else np.r_[self.last, ts])
        if steps.size:
            self.gap = max(self.gap or 0, int(steps.max()))
        self.last = ts[-1]

    def median_spread_ticks(self) -> float | None:
        """The median of the two-sided rows' spreads in ticks, as `np.median` of them all gives it."""
        if not self.both:
            return None
        values = sorted(self.spreads)
        at = np.cumsum([self.spreads[v] for v in values])
        middle = [values[int(np.searchsorted(at, k, side="right"))] for k in {(self.both - 1) // 2, self.both // 2}]
        return float(np.median(np.array(sorted(middle), dtype=np.int64) / self.tick))


def summarize_day(store: MarketStore, day: str) -> DaySummary:
    """The summary of one stored trading day, read and validated a chunk at a time (`staging.validated_chunks`), so
    memory does not grow with the day's size."""
    instrument = store.instrument
    rows: dict[str, int] = {}
    first: int | None = None
    last: int | None = None
    book = _BookStats(day, instrument)
    volume = 0
    bars: list[np.ndarray] = []
    for schema, chunk in validated_chunks(store, day, READ_ROWS):
        ts = chunk.data.ts_event
        rows[schema] = rows.get(schema, 0) + ts.shape[0]
        if ts.shape[0]:
            first = int(ts[0]) if first is None else min(first, int(ts[0]))
            last = int(ts[-1]) if last is None else max(last, int(ts[-1]))
            if schema == "mbp10":
                book.feed(chunk.data)
            elif schema == "trades":
                volume += int(chunk.data.size.sum(dtype=np.uint64))
        if schema == "bars":
            bars.append(ts)
        del chunk  # before the next is read
    missing = None
    if "bars" in rows:
        missing = int(np.count_nonzero(~np.isin(session_minutes(day, instrument), np.concatenate(bars))))
    return DaySummary(
        day=day,
        contract=store.contract(day),
        rows={s: rows[s] for s in SCHEMAS if s in rows},
        first=None if first is None else format_ns(first, instrument.timezone),
        last=None if last is None else format_ns(last, instrument.timezone),
        median_spread_ticks=book.median_spread_ticks(),
        mean_top_depth=book.top_size / (2 * book.both) if book.both else None,
        one_sided_rows=book.one_sided,
        trades=rows.get("trades", 0),
        volume=volume,
        missing_minutes=missing,
        longest_book_gap_s=None if book.gap is None else book.gap / 1e9,
    )


def summarize(path: str | Path, progress: Callable[[str], None] | None = None, workers: int = 0) -> dict:
    """Instrument, root attributes and per-day summaries of a store, as plain data (for --json). `progress` is told
    each day as it is read. `workers`: processes reading the days side by side (market/day_workers.py; 0: one per
    core, at most 8, for 8 days or more; 1: this process alone); the summary is the same whatever the count."""
    with MarketStore(path) as store:
        names = store.days()
        pool = start_pool(min(read_workers(workers, len(names), "--workers"), len(names)))
        ahead = [pool.submit(summarize_stored_day, store.path, day) for day in names] if pool is not None else []
        days = []
        try:
            for k, day in enumerate(names):
                if progress is not None:
                    progress(f"reading {day} ({k + 1} of {len(names)})")
                found = outcome(ahead[k], None) if ahead else None
                days.append(found if found is not None else asdict(summarize_day(store, day)))
        finally:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
        return {
            "path": str(store.path),
            "instrument": asdict(store.instrument),
            "attrs": store.attrs,
            "schemas": {s: len(store.days(s)) for s in SCHEMAS},
            "days": days,
        }


def summarize_stored_day(path: Path, day: str) -> dict | None:
    """`summarize_day` of `day` of the store at `path`, as plain data (a worker of `summarize`); None where it fails:
    the caller reads the day again, and its error names file, group, field and row."""
    try:
        with MarketStore(path) as store:
            return asdict(summarize_day(store, day))
    except Exception:  # noqa: BLE001
        return None


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
