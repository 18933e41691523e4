"""Rows with their origin: which input file and which record of it each row of a day came from.

Importers keep this beside the columns so that a validation failure on an assembled day names the input
file and its record number (0-based, counting every data record of the file) instead of a row of an
in-memory array.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fox_numba.errors import InputError
from fox_numba.market.bars import bars_from_trades, minute_of
from fox_numba.market.schema import SCHEMA_TYPES, Bars, Instrument, MarketDay, Mbp10, Trades, columns
from fox_numba.market.validate import validate_day


@dataclass
class Sourced:
    """Rows of one schema; row i came from `files[file_idx[i]]`, record `record[i]`."""

    data: Bars | Mbp10 | Trades
    files: list[Path]
    file_idx: np.ndarray
    record: np.ndarray

    @classmethod
    def one_file(cls, data: Bars | Mbp10 | Trades, path: Path, record: np.ndarray) -> Sourced:
        return cls(data, [path], np.zeros(len(record), dtype=np.int32), np.asarray(record, dtype=np.int64))

    def take(self, rows: np.ndarray | slice) -> Sourced:
        """The rows `rows`: copied for an index array, a view for a slice."""
        data = type(self.data)(**{k: v[rows] for k, v in columns(self.data).items()})
        return Sourced(data, self.files, self.file_idx[rows], self.record[rows])

    def locate(self, row: int | None) -> tuple[Path, int | None]:
        if row is None or row >= len(self.record):
            return self.files[0], None
        return self.files[int(self.file_idx[row])], int(self.record[row])


def concat(parts: Sequence[Sourced]) -> Sourced:
    """Join pieces of one schema in the given order."""
    if len(parts) == 1:
        return parts[0]
    files: list[Path] = []
    idx = []
    for p in parts:
        offset = len(files)
        files.extend(p.files)
        idx.append(p.file_idx + offset)
    cols = {k: np.concatenate([columns(p.data)[k] for p in parts]) for k in columns(parts[0].data)}
    return Sourced(type(parts[0].data)(**cols), files, np.concatenate(idx), np.concatenate([p.record for p in parts]))


def bars_sourced(trades: Sourced) -> Sourced:
    """Bars built from trades; each bar points at the first trade of its minute."""
    bars = bars_from_trades(trades.data)
    first = np.searchsorted(minute_of(trades.data.ts_event), bars.ts_event)
    return Sourced(bars, trades.files, trades.file_idx[first], trades.record[first])


def validate_sourced(
    day: str, parts: dict[str, Sourced], instrument: Instrument, labels: dict[str, str], contract: str
) -> MarketDay:
    """Validate the day made of `parts` (schema -> rows) of `contract`; a failure names the input file and
    record. `labels` names each schema as the input calls it (e.g. "mbp-10 ESU4"); it becomes the error's group.
    """
    market_day = MarketDay(day, contract=contract, **{schema: p.data for schema, p in parts.items()})
    try:
        return validate_day(market_day, instrument, "<import>")
    except InputError as e:
        schema = (e.group or "/").split("/")[1]
        if schema not in SCHEMA_TYPES or schema not in parts:
            raise
        path, record = parts[schema].locate(e.row)
        raise InputError(path, e.reason, group=f"{labels[schema]} {day}", field=e.field, row=record) from None


def unchanged_book_rows(columns: Iterable[np.ndarray], ts_event: np.ndarray) -> np.ndarray:
    """Rows equal to the previous row in every one of `columns` (each [n, ...], the book's fields).

    Such rows carry no book change (a trade record, a hidden execution, a change deeper than the stored
    levels). The last row is kept when it is later than the row before it, so the book's time range still
    reaches the file's last event. `columns` is read one at a time (a generator may make each on demand),
    and each row is compared as one opaque value, so no [n, bytes] mask is built.
    """
    n = ts_event.shape[0]
    same = np.zeros(n, dtype=bool)
    if n == 0:
        return same
    same[1:] = True
    for col in columns:
        raw = np.ascontiguousarray(col).view(np.uint8).reshape(n, -1)
        flat = raw.view(f"V{raw.shape[1]}").ravel()
        same[1:] &= flat[1:] == flat[:-1]
    if n > 1 and same[-1]:
        before = np.flatnonzero(~same[:-1])[-1]
        same[-1] = ts_event[-1] == ts_event[before]
    return same
