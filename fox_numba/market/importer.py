"""`fox data import`: files or folders of Databento DBN or LOBSTER data into one market store.

The format is told from the file names (`.dbn`, `.dbn.zst`; LOBSTER's `TICKER_DATE_..._message_L.csv`)
unless given. Folders are scanned (not recursively) for daily files. An existing store is extended: its
instrument is the starting point, the symbol comes from the data (contract root or ticker) unless
--symbol is given, and a store of another instrument is refused. Each schema of a trading day in the
import replaces that schema of that day in the store; bars come from the import's `ohlcv-1m` files,
else they are built from the day's trades. The store is rewritten atomically,
so a rejected import leaves it as it was.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from fox_numba.errors import InputError, OutputError
from fox_numba.market.databento import SUFFIXES, DatabentoImport, find_files
from fox_numba.market.lobster import NAME, LobsterPair, equity_instrument, find_pairs, read_pair
from fox_numba.market.schema import Instrument, MarketDay, n_rows
from fox_numba.market.store import MarketStore, write_store

FORMATS = ("auto", "databento", "lobster")


@dataclass
class ImportResult:
    """What an import wrote: rows per schema per trading day, notes on what was chosen or dropped, and
    warnings (signs of damaged input that did not stop the import)."""

    path: Path
    instrument: Instrument
    rows: dict[str, dict[str, int]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        days = sorted(self.rows)
        span = f"{days[0]} to {days[-1]}" if len(days) > 1 else (days[0] if days else "nothing")
        out = [f"wrote {self.path}: {self.instrument.symbol}, {len(days)} trading day(s), {span}"]
        for day in days:
            out.append(f"  {day}: " + ", ".join(f"{s} {n:,}" for s, n in self.rows[day].items()))
        return out + [f"  note: {n}" for n in self.notes] + [f"  warning: {w}" for w in self.warnings]


def import_market(
    paths: Sequence[Path],
    out: Path,
    *,
    fmt: str = "auto",
    instrument: str | None = None,
    overrides: Mapping[str, object] | None = None,
    progress: Callable[[str], None] | None = None,
) -> ImportResult:
    """Import `paths` into the store `out` (created or extended); `overrides` set Instrument fields."""
    if out.is_dir():
        raise OutputError(f"{out}: is a folder; --out names the store file to write or extend, e.g. {out / 'es.h5'}")
    fmt = detect_format(paths) if fmt == "auto" else fmt
    if fmt not in FORMATS[1:]:
        raise ValueError(f"format {fmt!r} is not one of {FORMATS}")
    existing = _existing_instrument(out)
    source = None
    if fmt == "databento":
        source = DatabentoImport.open(_expand(paths, find_files, "DBN files (.dbn, .dbn.zst)"), instrument)
        inst = _instrument(existing or Instrument(), source.symbol, overrides)
        days = source.days(inst, progress)
    else:
        if instrument is not None:
            raise InputError(paths[0], "--instrument selects a Databento instrument; LOBSTER files hold one stock each")
        pairs = _lobster_pairs(paths)
        inst = _instrument(existing or equity_instrument(pairs[0].ticker), pairs[0].ticker, overrides)
        days = _lobster_days(pairs, inst, progress)
    result = ImportResult(out, inst)
    write_store(out, inst, _counted(days, result), extend=True, progress=progress)
    if source is not None:
        result.notes = source.summary()
        result.warnings = source.warnings
    with MarketStore(out) as store:
        result.notes += contract_changes(store.contracts(), set(result.rows))
    return result


def contract_changes(contracts: Mapping[str, str], touched: set[str]) -> list[str]:
    """A note for each change of contract between consecutive days of a store that involves a day in
    `touched` (the days an import wrote): where a continuous series rolls from one contract to the next."""
    days = list(contracts)
    notes = []
    for before, after in itertools.pairwise(days):
        if contracts[before] != contracts[after] and {before, after} & touched:
            notes.append(
                f"the contract changes from {contracts[before]} (last day {before}) to {contracts[after]} (first "
                f"day {after}): a roll; prices jump by the spread between the two contracts there"
            )
    return notes


def detect_format(paths: Iterable[Path]) -> str:
    """'databento' or 'lobster' from the names of the files (and of the files in folders)."""
    names: list[str] = []
    for p in paths:
        if not p.exists():
            raise InputError(p, "no such file or folder")
        names.extend([q.name for q in p.iterdir()] if p.is_dir() else [p.name])
    found = {"databento" for n in names if n.endswith(SUFFIXES)} | {"lobster" for n in names if NAME.match(n)}
    if len(found) != 1:
        what = "both Databento and LOBSTER files" if found else "no Databento (.dbn, .dbn.zst) or LOBSTER files"
        raise InputError(next(iter(paths)), f"found {what}; name the format with --format")
    return found.pop()


def _instrument(base: Instrument, symbol: str, overrides: Mapping[str, object] | None) -> Instrument:
    """The base (the store's, else the format's defaults) with the data's symbol, then the options."""
    return replace(base, **{"symbol": symbol, **(overrides or {})})


def _existing_instrument(out: Path) -> Instrument | None:
    if not out.exists():
        return None
    with MarketStore(out) as store:
        return store.instrument


def _expand(paths: Sequence[Path], scan: Callable[[Path], list], what: str) -> list:
    found = []
    for p in paths:
        if not p.exists():
            raise InputError(p, "no such file or folder")
        items = scan(p) if p.is_dir() else [p]
        if not items:
            raise InputError(p, f"the folder holds no {what}")
        found.extend(items)
    return found


def _lobster_pairs(paths: Sequence[Path]) -> list[LobsterPair]:
    found = _expand(paths, find_pairs, "LOBSTER message/orderbook pairs")
    pairs = sorted({p if isinstance(p, LobsterPair) else LobsterPair.of(p) for p in found}, key=lambda p: p.day)
    tickers = sorted({p.ticker for p in pairs})
    if len(tickers) > 1:
        raise InputError(pairs[0].message, f"one market per store, but the files hold {', '.join(tickers)}")
    days = [p.day for p in pairs]
    twice = sorted({d for d in days if days.count(d) > 1})
    if twice:
        raise InputError(pairs[0].message, f"more than one pair for {twice[0]}")
    return pairs


def _lobster_days(
    pairs: list[LobsterPair], inst: Instrument, progress: Callable[[str], None] | None
) -> Iterator[MarketDay]:
    for pair in pairs:
        if progress is not None:
            progress(f"reading {pair.message.name}")
        yield read_pair(pair, inst)


def _counted(days: Iterable[MarketDay], result: ImportResult) -> Iterator[MarketDay]:
    for day in days:
        result.rows[day.day] = {s: n_rows(getattr(day, s)) for s in day.present()}
        yield day
        del day  # released before `days` makes the next one
