"""Databento DBN importer: `mbp-10`, `trades` and `ohlcv-1m` files (DBN or DBN+zstd) to trading days.

Files are read in blocks (`_CHUNK` bytes of records; zstd decompressed as a stream with `zstandard`) and each
block's bytes viewed as a numpy structured array (DBN records are fixed-size C structs): no Python object per
record. Of each block only the chosen instrument's records and the fields the store needs are kept, the flags'
decisions are taken (carrying across blocks what they need of the next record), and the rows are split into
trading days, validated and appended to a staging file per input file (`stage_file`, `staging.PartWriter`), so
memory holds a block and a chunk, never a day or a file. A Ray cluster can stage the files in parallel
(`importer`); the days are then assembled, checked across files and schemas and written by one process.

Decisions:
- One instrument per import. `--instrument` names it by raw symbol (ESU4) or instrument_id (an id the
  metadata maps to a raw symbol is read as that symbol); without it the instrument with the most records
  in the earliest file is taken (ties: the alphabetically first name), and the choice is reported (it is
  made from the file's first block and confirmed by the records counted as the file is staged; where they
  disagree the import starts again with the file's choice, so the file is not decoded twice for it). Every
  file must hold it. Parent/continuous files, whose metadata maps one name to several ids, name each
  child by its instrument_id, and the store's symbol is the parent's root (ES for ES.FUT).
- Records keep the file's order (the exchange's sequence) and are never re-sorted: a decreasing
  `ts_event` within the chosen instrument is an error naming the record.
- `F_MAYBE_BAD_BOOK` (the feed lost packets, the book may be wrong): such MBP-10 records are dropped;
  trades are kept, they are still executions.
- `F_BAD_TS_RECV` (only `ts_recv` is unreliable): kept, the store uses `ts_event`; counted.
- `F_SNAPSHOT` (book replay at a session start or a recovery): of each run of consecutive snapshot MBP-10
  records only the last, complete state is kept; snapshot trade records are not executions and are dropped.
- MBP-10 records that leave the 10-level book unchanged (trade and fill records, updates deeper than 10
  levels) are dropped, except a last one that is later than the row before it (it extends the book's
  time range): the store's `mbp10` holds book changes; executions come from `trades`.
- Trades: `side` is the aggressor's side (Databento: 'B' buyer-initiated, 'A' seller-initiated, 'N' none)
  and becomes +1 / -1 / 0.
- Trading days: rows are split by `calendar.assign_days`; a day whose rows come from several files is
  joined (and checked where its files meet) once it is complete: when a later file starts after the day's end.
  Days with trades but no `ohlcv-1m` file get bars built from the trades (`bars.bars_from_trades`).
- Corrupt files: a zstd file that is cut short (an interrupted download) is refused: the decoder alone
  would return its first records as if the day had ended early; a damaged zstd frame fails its checksum.
  Plain `.dbn` files have neither, so their records are read here (fixed-size records, each declaring its
  length): a record whose declared length is wrong, or a file ending inside a record, is refused with its
  record number and byte offset (for zstd: the offset in the decompressed records). Every decoding failure
  (including the Rust decoder's panics on a bad header, which are BaseExceptions) becomes a one-line InputError
  naming the file; after any error in a zstd file its rest is decoded, and a decoding failure there is what is
  reported (a damaged block may decode to values that fail a check first).
- Against the metadata: a record whose index time (`ts_recv`; `ts_event` for ohlcv-1m) is at or past the
  metadata's `end` is an error; a last record more than `CUT_WARNING_MINUTES` of open market before the
  `end` is a warning in the import's notes (a plain file cut at a record boundary shows only this way).
Rows in errors are 0-based record numbers of the file, counting every instrument's records. Where a file holds
several faults, the first block holding one reports it.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import databento_dbn as dbn
import h5py
import numpy as np
import zstandard

from fox_numba.errors import InputError
from fox_numba.market.calendar import assign_days, day_bounds, format_ns, open_ns_between
from fox_numba.market.schema import DTYPES, N_LEVELS, SCHEMA_TYPES, SIDE_BUY, SIDE_NONE, SIDE_SELL, Instrument
from fox_numba.market.sources import Sourced, concat
from fox_numba.market.staging import Part, PartWriter, StagedDay
from fox_numba.market.validate import BOOK_FIELDS, equals_previous

DBN_SCHEMAS = {"mbp-10": "mbp10", "trades": "trades", "ohlcv-1m": "bars"}
"""DBN schemas this importer reads -> store schema."""
SUFFIXES = (".dbn", ".dbn.zst")

CUT_WARNING_MINUTES = 60
"""Open-market minutes between a file's last record and its metadata's `end` that raise a cut-file warning."""

_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_DBN_PREFIX = 8
"""b"DBN", the version byte and the metadata length (u32) precede the metadata."""
_CHUNK = 1 << 22
"""Bytes of records decoded at a time: a block (about 11,000 MBP-10 records)."""
_HEADER = [("length", "u1"), ("rtype", "u1"), ("publisher_id", "<u2"), ("instrument_id", "<u4"), ("ts_event", "<u8")]
_MBP = [
    ("price", "<i8"), ("size", "<u4"), ("action", "S1"), ("side", "S1"), ("flags", "u1"), ("depth", "u1"),
    ("ts_recv", "<u8"), ("ts_in_delta", "<i4"), ("sequence", "<u4"),
]  # fmt: skip
_LEVEL = [
    ("bid_px", "<i8"), ("ask_px", "<i8"), ("bid_sz", "<u4"), ("ask_sz", "<u4"), ("bid_ct", "<u4"), ("ask_ct", "<u4"),
]  # fmt: skip
_OHLCV = [("open", "<i8"), ("high", "<i8"), ("low", "<i8"), ("close", "<i8"), ("volume", "<u8")]
RECORD_FIELDS = {
    "mbp10": _HEADER + _MBP + [("levels", _LEVEL, (N_LEVELS,))],
    "trades": _HEADER + _MBP,
    "bars": _HEADER + _OHLCV,
}
"""DBN record layouts (identical in DBN versions 1-3): MBP-10 368 B, trades 48 B, OHLCV 56 B."""
RTYPES = {"mbp10": 0x0A, "trades": 0x00, "bars": 0x21}
_ORDER = {"mbp10": 0, "trades": 1, "bars": 2}
_ROOT = re.compile(r"^([A-Z0-9]+?)[FGHJKMNQUVXZ]\d{1,2}$")
_PARENT = re.compile(r"^([A-Z0-9]+)\.")
"""Parent (ES.FUT) and continuous (ES.c.0) symbols: the root precedes the first dot."""


@dataclass
class DbnFile:
    """The header facts of one DBN file."""

    path: Path
    dbn_schema: str
    schema: str
    start: int
    ts_out: bool
    names: dict[int, str]
    """instrument_id -> raw symbol (or the id itself where the metadata cannot tell children apart)."""
    parents: dict[int, str]
    """instrument_id -> the parent or continuous symbol it was requested by (ES.FUT), where the metadata
    maps that symbol to several ids."""
    end: int | None
    """The metadata's `end` (exclusive, UTC ns), None when it has none (live data)."""
    compressed: bool
    records_at: int
    """Byte offset of the first record in a plain file."""


@dataclass
class DatabentoImport:
    """DBN files read in time order as trading days of one instrument."""

    files: list[DbnFile]
    name: str
    """The chosen instrument (raw symbol or instrument_id)."""
    notes: list[str] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)
    warnings: list[str] = field(default_factory=list)
    """Signs of a damaged input that do not stop the import (a file that may be cut short)."""
    _pending: dict[str, dict[str, list[Part]]] = field(default_factory=dict)
    """The staged parts of the days `days` has not yielded yet: day -> schema -> parts in file order."""
    tentative: bool = False
    """The instrument was chosen from the first block of the earliest file: `days` confirms it from the records
    per instrument that staging that file counted (`confirm`)."""

    @classmethod
    def open(
        cls, paths: Sequence[Path], instrument: str | None = None, per_id: Mapping[int, int] | None = None
    ) -> DatabentoImport:
        """Read the headers of `paths` and choose the instrument: `instrument`, else the one with the most records
        in the earliest file (`per_id`: its records per instrument_id, where known; else chosen from its first block
        for now, as one instrument per file is the rule, and confirmed once the file is staged: `confirm`), so the
        file is not decoded one more time for the choice."""
        files = sorted((read_header(p) for p in paths), key=lambda f: (f.start, _ORDER[f.schema], str(f.path)))
        notes = []
        if instrument is not None:
            name = _raw_symbol(instrument, files)
            how = f"instrument_id {instrument}, " if name != instrument else ""
            notes = [f"instrument {name} ({how}chosen with --instrument)"]
        elif per_id is not None:
            name, note = _most_records(files[0], per_id)
            notes = [note]
        else:
            first = next(record_blocks(files[0]), np.zeros(0, dtype=[("instrument_id", "<u4")]))
            name = _most_records(files[0], _per_id(first))[0]
        plain = [f.path.name for f in files if not f.compressed]
        if plain:
            notes.append(
                f"{len(plain)} plain .dbn file(s) ({', '.join(plain[:3])}{', ...' if len(plain) > 3 else ''}): "
                "no checksum or frame, so a file cut at a record boundary shows only as a last record far "
                "before the metadata's end (checked)"
            )
        return cls(files, name, notes, Counter(), tentative=instrument is None and per_id is None)

    def confirm(self, result: FileResult) -> None:
        """Confirm the instrument chosen for now from the earliest file's first block, by the file's records per
        instrument (`result` of staging it; after an error there, counted here); another choice raises
        `Rechoose`, with the counts that make it."""
        per_id = result.per_id if result.error is None else _per_id_of(self.files[0])
        name, note = _most_records(self.files[0], per_id)
        if name != self.name:
            raise Rechoose(per_id)
        self.notes.insert(0, note)
        self.tentative = False

    @property
    def symbol(self) -> str:
        """The contract's root (ES for ESU4, or for a child of ES.FUT), the store's default symbol."""
        match = _ROOT.match(self.name)
        if match:
            return match.group(1)
        if self.name.isdigit():
            parent = next((f.parents[int(self.name)] for f in self.files if int(self.name) in f.parents), "")
            if match := _PARENT.match(parent):
                return match.group(1)
        return self.name

    def tasks(self, instrument: Instrument, staging: Path, *, compression: str) -> list[FileTask]:
        """One task per file, in reading order: what `stage_file` needs to stage it into `staging`."""
        return [
            FileTask(f, self.name, instrument, staging / f"{k:05d}.h5", compression) for k, f in enumerate(self.files)
        ]

    def staged_rows(self, schema: str) -> dict[str, int]:
        """Rows of `schema` staged so far (by the files whose results `days` took) of each day not yet complete: a
        task staged after them puts its part in line with the day's chunks (`FileTask.offsets`)."""
        return {day: sum(p.rows for p in parts.get(schema, [])) for day, parts in self._pending.items()}

    def days(self, results: Iterable[FileResult], instrument: Instrument) -> Iterator[StagedDay]:
        """Trading days from the staged files (`results` of `tasks`, in their order), each once it is complete:
        when a later file starts after the day's end (`staging.commit_day` checks and writes it)."""
        pending = self._pending
        results = iter(results)
        for f in self.files:
            yield from self._flush(pending, instrument, before=f.start)
            result = next(results)  # staged (here) only once the days complete before it are written
            if self.tentative:
                self.confirm(result)
            result.raise_error()
            self.counts.update(result.counts)
            self.warnings.extend(result.warnings)
            for day, rows in result.days.items():
                part = Part(result.staged, f.path, day, f.schema, rows, len(result.days))
                pending.setdefault(day, {}).setdefault(f.schema, []).append(part)
        yield from self._flush(pending, instrument, before=None)

    def summary(self) -> list[str]:
        """The instrument choice and what the flags made the import drop or keep."""
        words = {
            "bad_book": "MBP-10 records flagged F_MAYBE_BAD_BOOK dropped",
            "snapshot": "snapshot records dropped (last state of each snapshot kept)",
            "unchanged": "MBP-10 records that left the 10-level book unchanged dropped",
            "bad_ts_recv": "records flagged F_BAD_TS_RECV kept (ts_event is used)",
        }
        return self.notes + [f"{self.counts[k]:,} {w}" for k, w in words.items() if self.counts[k]]

    def _flush(self, pending: dict, instrument: Instrument, before: int | None) -> Iterator[StagedDay]:
        labels = {s: f"{dbn_schema} {self.name}" for dbn_schema, s in DBN_SCHEMAS.items()}
        for day in sorted(pending):
            if before is not None and day_bounds(day, instrument)[1] > before:
                continue
            yield StagedDay(day, self.name, pending.pop(day), labels)


class Rechoose(Exception):  # noqa: N818 (not an error: the import starts again)
    """The earliest file's records per instrument choose another instrument than its first block did: the import
    starts again with them (`DatabentoImport.open(per_id=...)`)."""

    def __init__(self, per_id: Mapping[int, int]) -> None:
        super().__init__("the instrument is chosen again")
        self.per_id = dict(per_id)


def _most_records(f: DbnFile, per_id: Mapping[int, int]) -> tuple[str, str]:
    """The instrument with the most records in `f` (`per_id`: records per instrument_id; ties: the alphabetically
    first name) and the note that reports the choice."""
    have = Counter({f.names.get(i, str(i)): c for i, c in sorted(per_id.items())})
    if not have:
        raise InputError(f.path, "the file holds no records")
    name = min(have, key=lambda k: (-have[k], k))
    tied = sorted(k for k in have if k != name and have[k] == have[name])
    others = ", ".join(f"{k} {c:,}" for k, c in have.most_common() if k != name)
    note = f"instrument {name}: {have[name]:,} records in {f.path.name}, the most"
    if tied:
        note += f"; tied with {', '.join(tied)}: the alphabetically first is taken"
    return name, note + (f" (others: {others}; choose with --instrument)" if others else "")


def _per_id(block: np.ndarray) -> Counter:
    """Records per instrument_id of a block (a block of one instrument, the common case, is not sorted)."""
    ids = block["instrument_id"]
    if ids.size and (ids == ids[0]).all():
        return Counter({int(ids[0]): ids.size})
    ids, n = np.unique(ids, return_counts=True)
    return Counter(dict(zip(ids.tolist(), n.tolist(), strict=True)))


def _per_id_of(f: DbnFile) -> Counter:
    """Records per instrument_id of a whole file (a decoding failure raises its InputError)."""
    out: Counter = Counter()
    for block in record_blocks(f):
        out.update(_per_id(block))
    return out


@dataclass(frozen=True)
class FileTask:
    """One DBN file to stage (plain data: a Ray task receives it pickled)."""

    file: DbnFile
    name: str
    """The chosen instrument."""
    instrument: Instrument
    staged: Path
    """The HDF5 file its days are staged in."""
    compression: str
    """How the store being written compresses its columns (`store.COMPRESSIONS`): the staged chunks are compressed
    so, and the store takes them as they are (`staging.PartWriter`)."""
    offsets: dict[str, int] = field(default_factory=dict)
    """Rows of each day of this file's schema staged before it (`DatabentoImport.staged_rows`), where known."""


@dataclass
class FileResult:
    """What staging one file gave: rows per trading day, the flags' counts, warnings, or the error (its fields:
    an exception with keyword arguments does not survive pickling, and a Ray task's result is pickled)."""

    staged: Path
    days: dict[str, int] = field(default_factory=dict)
    per_id: Counter = field(default_factory=Counter)
    """Records per instrument_id in the file (every instrument), for the choice of the instrument."""
    counts: Counter = field(default_factory=Counter)
    warnings: list[str] = field(default_factory=list)
    error: tuple[str, str, str | None, str | None, int | None] | None = None

    def raise_error(self) -> None:
        if self.error is not None:
            path, reason, group, field_, row = self.error
            raise InputError(path, reason, group=group, field=field_, row=row)


def stage_file(task: FileTask) -> FileResult:
    """Read one DBN file block by block and stage the chosen instrument's rows, validated, per trading day.

    Each block is decoded, filtered to the instrument, passed through the flags' decisions (`_FileRows`) and
    split into trading days, and each day's rows are validated and appended to `task.staged`
    (`staging.PartWriter`): memory holds a block and a chunk, never a day. A failure is returned in
    the result; after one, the rest of a zstd file is still decoded so that a damaged stream is what is
    reported (a corrupt block can decode to values that fail validation first).
    """
    f = task.file
    result = FileResult(task.staged)
    rows = _FileRows(f, task.name)
    label = f"{f.dbn_schema} {task.name}"
    blocks = record_blocks(f)
    try:
        with h5py.File(task.staged, "w") as h5:
            writers: dict[str, PartWriter] = {}
            for block in blocks:
                _stage(rows.feed(block), writers, result.days, h5, task, label)
            _stage(rows.finish(), writers, result.days, h5, task, label)
            for day, writer in writers.items():
                result.days[day] = writer.close()
        if not rows.seen:
            held = ", ".join(sorted({f.names.get(i, str(i)) for i in rows.per_id})) or "none"
            raise InputError(f.path, f"no records for instrument {task.name} (the file holds {held})")
        result.warnings = _cut_warnings(f, rows.last, task.instrument)
    except InputError as e:
        try:
            if f.compressed:
                for _ in blocks:
                    pass
        except InputError as decoding:
            e = decoding
        result.error = (e.path, e.reason, e.group, e.field, e.row)
    result.counts, result.per_id = rows.counts, rows.per_id
    return result


def _stage(
    rows: Sourced | None, writers: dict[str, PartWriter], done: dict[str, int], h5: h5py.File, task: FileTask,
    label: str,
) -> None:  # fmt: skip
    """Split `rows` (in time order) into trading days and append each day's run to its writer; the writers of
    the days before a new one are closed (`done`: their rows), as no later row is theirs."""
    if rows is None or rows.record.size == 0:
        return
    ts = rows.data.ts_event
    for writer in writers.values():  # rows inside the open writer's day (the common case) need no split
        if writer.bounds[0] <= ts[0] and ts[-1] < writer.bounds[1]:
            writer.append(rows)
            return
    day_names, day_idx = assign_days(ts, task.instrument)
    ends = np.searchsorted(day_idx, np.arange(1, len(day_names) + 1))  # rows are in time order: days are runs
    for day, a, b in zip(day_names, np.r_[0, ends[:-1]], ends, strict=True):
        if day not in writers:
            for earlier in list(writers):
                done[earlier] = writers.pop(earlier).close()
            writers[day] = PartWriter(
                h5, day, task.file.schema, label, task.name, task.instrument, compression=task.compression,
                pad=task.offsets.get(day, 0),
            )  # fmt: skip
        writers[day].append(rows.take(slice(a, b)))


def _cut_warnings(f: DbnFile, last: int | None, instrument: Instrument) -> list[str]:
    """A warning when the file's last index time (`last`) is far before its metadata's end."""
    if f.end is None or last is None:
        return []
    last += 60 * 10**9 if f.schema == "bars" else 0
    gap = open_ns_between(last, f.end, instrument) / 60e9
    if gap <= CUT_WARNING_MINUTES:
        return []
    return [
        f"{f.path.name}: its last record ({format_ns(last, instrument.timezone)[:19]}) is {gap:,.0f} "
        "minutes of open market before the end its metadata gives "
        f"({format_ns(f.end, instrument.timezone)[:19]} {instrument.timezone}): was the file cut short? "
        "Compare it with the download"
    ]


class _FileRows:
    """The flags' decisions on one file's records of the chosen instrument, taken block by block.

    A decision that needs the next record (a snapshot run ends where the next record is not a snapshot) or the
    file's end (a last unchanged book is kept when it is later) holds that record back until the next block or
    `finish`; so the rows kept are those of the file read whole. Records are checked as they pass: an undefined
    `ts_event`, an index time at or past the metadata's end, a decreasing `ts_event` among kept rows.
    """

    def __init__(self, f: DbnFile, name: str) -> None:
        self.f = f
        self.ids = [i for i, n in f.names.items() if n == name] or ([int(name)] if name.isdigit() else [])
        self.index = "ts_event" if f.schema == "bars" else "ts_recv"
        self.label = f"{f.dbn_schema} {name}"
        self.counts: Counter = Counter()
        self.per_id: Counter = Counter()
        """Records per instrument_id so far (every instrument)."""
        self.seen = False
        self.last: int | None = None
        """The largest index time of the file (every instrument), for the cut-file warning."""
        self.offset = 0
        self.held: tuple[dict[str, np.ndarray], np.ndarray] | None = None
        """MBP-10: the last record (columns, record number), awaiting the next record's snapshot flag."""
        self.pending: tuple[dict[str, np.ndarray], np.ndarray, bool] | None = None
        """MBP-10: the last record through the snapshot and bad-book filters, awaiting the next (or the file's
        end), with whether its book equals the one before it."""
        self.before_ts: np.ndarray | None = None
        """MBP-10: ts_event of the last record through those filters whose book changed."""
        self.last_kept: tuple[np.ndarray, np.ndarray] | None = None
        """ts_event and record number of the last row kept, for the order check across blocks."""

    def feed(self, block: np.ndarray) -> Sourced | None:
        """The rows of `block` decided so far (None when none are)."""
        f = self.f
        self.per_id.update(_per_id(block))
        late = None
        if block.size and f.end is not None:
            index = block[self.index]
            beyond = np.flatnonzero(index >= np.uint64(f.end))
            if beyond.size:
                message = (
                    f"{self.index} {format_ns(int(index[beyond[0]]), 'UTC')} UTC is at or past the end of the file's "
                    f"metadata ({format_ns(f.end, 'UTC')} UTC): the file is damaged or its records are not its own"
                )
                late = InputError(f.path, message, field=self.index, row=self.offset + int(beyond[0]))
            self.last = max(int(index.max()), self.last or 0)
        ids = block["instrument_id"]
        mine = np.flatnonzero(ids == self.ids[0] if len(self.ids) == 1 else np.isin(ids, self.ids))
        cols, records = _columns(block, _run_or_index(mine), f.schema), mine + self.offset
        self.offset += block.size
        self.seen |= bool(mine.size)
        ts = cols["ts_event"]
        # 0 and UNDEF_TIMESTAMP mark an undefined time; past int64 (year 2262) no trading day can hold it.
        undefined = (ts == 0) | (ts > np.uint64(np.iinfo(np.int64).max))
        if undefined.any():
            row = int(records[np.argmax(undefined)])
            raise InputError(f.path, "undefined ts_event", group=self.label, field="ts_event", row=row)
        if f.schema == "bars":
            rows = self._rows(cols, records)
        else:
            flags = cols.pop("flags")
            self.counts["bad_ts_recv"] += int(np.count_nonzero(flags & dbn.F_BAD_TS_RECV))
            if f.schema == "trades":
                snap = (flags & dbn.F_SNAPSHOT) != 0
                self.counts["snapshot"] += int(np.count_nonzero(snap))
                rows = self._rows(cols, records, np.flatnonzero(~snap))
            else:
                rows = self._book(cols | {"flags": flags}, records, final=False)
        if late is not None:  # after the checks above: an undefined or decreasing time is the first fault
            raise late
        return rows

    def finish(self) -> Sourced | None:
        """The rows held back for the file's end."""
        if self.held is None:
            return None
        cols, records = self.held
        self.held = None
        return self._book(cols, records, final=True)

    def _book(self, cols: dict[str, np.ndarray], records: np.ndarray, *, final: bool) -> Sourced | None:
        """MBP-10 records (after the one held back) through the snapshot and bad-book filters, then the
        unchanged-book rule. Only the flags are joined to the held record here: the rows through, the held one and
        the block's, are joined once, by `_unchanged`."""
        pieces = ([self.held] if self.held is not None else []) + [(cols, records)]
        records = np.concatenate([r for _, r in pieces])
        if records.size == 0:
            return None
        flags = np.concatenate([c["flags"] for c, _ in pieces])
        snap = (flags & dbn.F_SNAPSHOT) != 0
        keep = ~snap | ~np.r_[snap[1:], False]
        if not final:  # the last record waits for the next one's snapshot flag (the block may hold none)
            last = next(piece for piece, rows in reversed(pieces) if rows.size)
            self.held = ({c: v[-1:] for c, v in last.items()}, records[-1:])
            keep[-1] = False
            snap[-1] = False  # not counted yet
        self.counts["snapshot"] += int(np.count_nonzero(~keep & snap))
        bad = (flags & dbn.F_MAYBE_BAD_BOOK) != 0
        self.counts["bad_book"] += int(np.count_nonzero(bad & keep))
        through, at = keep & ~bad, 0
        for k, (piece, rows) in enumerate(pieces):
            taken = _run_or_index(np.flatnonzero(through[at : at + rows.size]))
            pieces[k] = ({c: v[taken] for c, v in piece.items() if c != "flags"}, rows[taken])
            at += rows.size
        out = self._unchanged(pieces)
        return out if not final else _join(out, self._end_book())

    def _unchanged(self, pieces: list[tuple[dict[str, np.ndarray], np.ndarray]]) -> Sourced | None:
        """Rows (`pieces` of them, in order) whose book differs from the row before (the last one waits in
        `pending`)."""
        if sum(rows.size for _, rows in pieces) == 0:
            return None
        if self.pending is not None:  # decided now: a record follows it
            pieces = [self.pending[:2], *pieces]
        cols = {c: _joined([piece[c] for piece, _ in pieces]) for c in pieces[0][0]}
        records = _joined([rows for _, rows in pieces])
        same = np.r_[self.pending[2] if self.pending is not None else False, _same_book(cols)]
        changed = np.flatnonzero(~same)
        if changed.size:
            self.before_ts = cols["ts_event"][changed[-1] : changed[-1] + 1]
        self.pending = ({c: v[-1:] for c, v in cols.items()}, records[-1:], bool(same[-1]))
        decided = _run_or_index(np.flatnonzero(~same[:-1]))
        self.counts["unchanged"] += int(np.count_nonzero(same[:-1]))
        return self._rows({c: v[decided] for c, v in cols.items()}, records[decided])

    def _end_book(self) -> Sourced | None:
        """The last record through the filters: kept if its book changed or it is later than the last change."""
        if self.pending is None:
            return None
        cols, records, same = self.pending
        self.pending = None
        if same and cols["ts_event"][0] == self.before_ts[0]:
            self.counts["unchanged"] += 1
            return None
        return self._rows(cols, records)

    def _rows(self, cols: dict[str, np.ndarray], records: np.ndarray, keep: np.ndarray | None = None) -> Sourced:
        """Kept rows as a schema record, after checking that ts_event does not decrease (across blocks too)."""
        if keep is not None:
            cols, records = {c: v[keep] for c, v in cols.items()}, records[keep]
        ts = cols["ts_event"]
        if self.last_kept is not None:
            ts, records_checked = np.r_[self.last_kept[0], ts], np.r_[self.last_kept[1], records]
        else:
            records_checked = records
        _check_order(ts, records_checked, self.f.path, self.label)
        if records.size:
            self.last_kept = (cols["ts_event"][-1:], records[-1:])
        schema = self.f.schema
        if schema == "trades":
            side = cols.pop("side")
            cols["side"] = np.select([side == b"B", side == b"A"], [SIDE_BUY, SIDE_SELL], SIDE_NONE).astype(np.int8)
        data = SCHEMA_TYPES[schema](**{c: cols[c] for c in DTYPES[schema]})
        return Sourced.one_file(data, self.f.path, records)


def _run_or_index(rows: np.ndarray) -> np.ndarray | slice:
    """`rows` (increasing indices) as a slice where they are one run (the common case: a block of one instrument,
    no record dropped), so that taking them is a view and not a copy."""
    if rows.size and int(rows[-1]) - int(rows[0]) + 1 == rows.size:
        return slice(int(rows[0]), int(rows[-1]) + 1)
    return rows


def _join(a: Sourced | None, b: Sourced | None) -> Sourced | None:
    return a if b is None else b if a is None else concat([a, b])


def _same_book(cols: dict[str, np.ndarray]) -> np.ndarray:
    """Whether each row's 10-level book after the first equals the row before it (`validate.equals_previous`)."""
    return equals_previous([cols[name] for name in BOOK_FIELDS])


def _joined(arrays: list[np.ndarray]) -> np.ndarray:
    """`arrays` joined, without a copy where there is one."""
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


def read_header(path: Path) -> DbnFile:
    """The metadata of a DBN file (only its first block is decoded)."""
    with _open(path) as fh:
        head = fh.read(_DBN_PREFIX)
        compressed = head[:4] == _ZSTD_MAGIC
        plain = not compressed and head[:3] == b"DBN"
        records_at = _DBN_PREFIX + int.from_bytes(head[4:8], "little") if plain else 0
        decoder = dbn.DBNDecoder(compression=dbn.Compression.ZSTD if compressed else dbn.Compression.NONE)
        block = head + (fh.read(records_at - _DBN_PREFIX) if plain else b"")  # plain: the metadata alone
        while not (out := _decode(decoder, block, path, "not a readable DBN file")):
            if not block:
                raise InputError(path, "not a readable DBN file (no metadata)")
            block = fh.read(1 << 16)
    meta = out[0]
    if not isinstance(meta, dbn.Metadata):
        raise InputError(path, "not a readable DBN file (no metadata)")
    schema = None if meta.schema is None else str(meta.schema.value)
    if schema not in DBN_SCHEMAS:
        raise InputError(path, f"DBN schema {schema} is not imported (use {', '.join(DBN_SCHEMAS)})")
    end = None if meta.end is None or int(meta.end) >= int(np.iinfo(np.int64).max) else int(meta.end)
    names, parents = _names(meta)
    return DbnFile(
        path, schema, DBN_SCHEMAS[schema], int(meta.start), bool(meta.ts_out), names, parents, end, compressed,
        records_at,
    )  # fmt: skip


def record_blocks(f: DbnFile) -> Iterator[np.ndarray]:
    """The data records of the file in blocks (structured arrays over about `_CHUNK` bytes of records, in file
    order, every instrument), read straight from the file's bytes (zstd: decompressed as a stream), with no
    Python object per record. A record that declares another length than the schema's, or another record type,
    is refused with its record number; in a zstd file only after the rest decodes (a damaged stream is what is
    reported)."""
    dtype = np.dtype(RECORD_FIELDS[f.schema] + ([("ts_out", "<u8")] if f.ts_out else []))
    n = 0
    with _open(f.path) as fh:
        raw = _zstd_blocks(fh, f, dtype.itemsize) if f.compressed else _plain_blocks(fh, f, dtype.itemsize)
        for data in raw:
            block = np.frombuffer(data, dtype=dtype)
            declared = block["length"].astype(np.int64) * 4
            bad = np.flatnonzero((declared != dtype.itemsize) | (block["rtype"] != RTYPES[f.schema]))
            if bad.size:
                if f.compressed:
                    for _ in raw:
                        pass
                raise _record_fault(f, n + int(bad[0]), int(declared[bad[0]]), int(block["rtype"][bad[0]]), dtype)
            n += block.size
            yield block


def _record_fault(f: DbnFile, k: int, declared: int, rtype: int, dtype: np.dtype) -> InputError:
    """The error for record `k`, which declares `declared` bytes and record type `rtype`."""
    if declared != dtype.itemsize:
        where = f"byte {k * dtype.itemsize:,} of the decompressed records" if f.compressed else (
            f"byte {f.records_at + k * dtype.itemsize:,}"
        )
        message = (
            f"record at {where} declares a length of {declared} bytes, expected {dtype.itemsize} for "
            f"{f.dbn_schema}: the file is damaged"
        )
        return InputError(f.path, message, field="length", row=k)
    return InputError(f.path, f"record type {rtype:#x} in a {f.dbn_schema} file", field="rtype", row=k)


def _block_bytes(itemsize: int) -> int:
    """Bytes of whole records read at a time: `_CHUNK`, at least one record."""
    return max(1, _CHUNK // itemsize) * itemsize


def _zstd_blocks(fh: BinaryIO, f: DbnFile, itemsize: int) -> Iterator[memoryview]:
    """The record bytes of a DBN+zstd file in blocks of whole records, decompressed as a stream (`zstandard`;
    each frame's checksum is verified as its end is read), after checking that the frames are whole."""
    if not _zstd_complete(fh):
        raise InputError(f.path, "the zstd stream is cut short (an interrupted download?)")
    fh.seek(0)
    reader = zstandard.ZstdDecompressor().stream_reader(fh, read_across_frames=True, closefd=False)
    head = _zstd_read(reader, _DBN_PREFIX, f.path, 0)
    _zstd_read(reader, int.from_bytes(head[4:8], "little"), f.path, 0)  # the metadata, read by `read_header`
    n, rest = 0, b""
    while data := _zstd_read(reader, _block_bytes(itemsize) - len(rest), f.path, n):
        data = rest + data
        whole = len(data) // itemsize * itemsize
        rest = data[whole:]
        n += whole // itemsize
        if whole:
            yield memoryview(data)[:whole]
    if rest:
        raise InputError(f.path, f"the file ends inside a record (after record {n - 1})")


def _zstd_read(reader: zstandard.ZstdDecompressionReader, size: int, path: Path, n: int) -> bytes:
    """Up to `size` decompressed bytes (fewer only at the end); a zstd failure names the records before it."""
    out = []
    try:
        while size > 0 and (data := reader.read(size)):
            out.append(data)
            size -= len(data)
    except zstandard.ZstdError as e:
        raise InputError(path, f"DBN decoding failed after record {n} ({_first_line(e)})") from None
    return b"".join(out)


def _plain_blocks(fh: BinaryIO, f: DbnFile, itemsize: int) -> Iterator[memoryview]:
    """The record bytes of a plain DBN file in blocks of whole records; a file that does not end on a record
    boundary is refused, naming the record it ends inside."""
    fh.seek(f.records_at)
    n = 0
    while data := fh.read(_block_bytes(itemsize)):
        whole = len(data) // itemsize
        if whole:
            yield memoryview(data)[: whole * itemsize]
        n += whole
        if len(data) % itemsize:
            raise InputError(
                f.path,
                f"the file ends inside a record (after record {n - 1}, {len(data) % itemsize} bytes of record {n})",
            )


def _columns(block: np.ndarray, rows: np.ndarray | slice, schema: str) -> dict[str, np.ndarray]:
    """The fields `_FileRows` reads of `rows` of a block (the book split per field: `bid_px` [n, 10]...): views
    of the block for a slice (the first join with the record held back copies them), else copies."""
    if schema == "mbp10":
        levels = block["levels"]
        return {"ts_event": block["ts_event"][rows], "flags": block["flags"][rows]} | {
            c: levels[c][rows] for c in BOOK_FIELDS
        }
    names = ("ts_event", "price", "size", "side", "flags") if schema == "trades" else tuple(DTYPES["bars"])
    return {c: block[c][rows] for c in names}


def find_files(folder: Path) -> list[Path]:
    """The DBN files of a folder (not recursive), sorted by name."""
    return sorted(p for p in folder.iterdir() if p.is_file() and p.name.endswith(SUFFIXES))


def _check_order(ts: np.ndarray, records: np.ndarray, path: Path, label: str) -> None:
    down = np.flatnonzero(ts[1:] < ts[:-1])
    if down.size:
        k = int(down[0]) + 1
        raise InputError(
            path,
            f"ts_event decreases ({ts[k - 1]} then {ts[k]} ns); records of one instrument must be in event order",
            group=label,
            field="ts_event",
            row=int(records[k]),
        )


def _names(meta: dbn.Metadata) -> tuple[dict[int, str], dict[int, str]]:
    """instrument_id -> raw symbol (an id mapped from a symbol of several ids is named by itself), and
    instrument_id -> that symbol (the parent) for those ids."""
    pairs: list[tuple[int, str]] = []
    for key, intervals in meta.mappings.items():
        for iv in intervals:
            if iv["symbol"].isdigit():
                pairs.append((int(iv["symbol"]), key))
            elif key.isdigit():
                pairs.append((int(key), iv["symbol"]))
    per_name = Counter(name for _, name in set(pairs))
    names = {i: (name if per_name[name] == 1 else str(i)) for i, name in pairs}
    return names, {i: name for i, name in pairs if per_name[name] > 1}


def _raw_symbol(instrument: str, files: list[DbnFile]) -> str:
    """`--instrument` as the data names it: an instrument_id that a file maps to a raw symbol is that symbol."""
    if instrument.isdigit():
        for f in files:
            name = f.names.get(int(instrument))
            if name is not None and not name.isdigit():
                return name
    return instrument


def _zstd_complete(fh: BinaryIO) -> bool:
    """Whether a zstd file is whole frames to its last byte, read from the frame and block headers only.

    The decoder yields the records of a cut-short stream without complaint; an interrupted download
    must not pass for a day that ended early. Each header is read with one `pread` (a seek and a read through the
    file object's buffer cost a syscall more and a buffer's worth of bytes, per zstd block of at most 128 KiB).
    """
    size = fh.seek(0, 2)
    fd = fh.fileno()
    pos = 0
    while pos < size:
        head = os.pread(fd, 8, pos)
        magic = int.from_bytes(head[:4], "little")
        if 0x184D2A50 <= magic <= 0x184D2A5F:  # a skippable frame
            pos += 8 + int.from_bytes(head[4:8], "little")
            continue
        if head[:4] != _ZSTD_MAGIC or len(head) < 5:
            return False
        descriptor = head[4]
        single_segment = (descriptor >> 5) & 1
        content_size = (single_segment, 2, 4, 8)[descriptor >> 6]
        pos += 5 + (1 - single_segment) + (0, 1, 2, 4)[descriptor & 3] + content_size
        last = 0
        while not last:
            block = os.pread(fd, 3, pos)
            if len(block) < 3:
                return False
            header = int.from_bytes(block, "little")
            last, kind, length = header & 1, (header >> 1) & 3, header >> 3
            pos += 3 + (1 if kind == 1 else length)
        pos += 4 * ((descriptor >> 2) & 1)
    return pos == size


def _open(path: Path) -> BinaryIO:
    try:
        return path.open("rb")
    except OSError as e:
        raise InputError(path, f"cannot read the file ({e.strerror})") from None


def _decode(decoder: dbn.DBNDecoder, chunk: bytes, path: Path, what: str) -> list:
    """Feed `chunk` and decode; any failure of the Rust decoder becomes an InputError "{what} (reason)".

    It raises DBNError, RuntimeError (zstd: "Restored data doesn't match checksum", "Data corruption
    detected") or, on a malformed record, pyo3's PanicException, a BaseException whose Rust panic message
    also goes to stderr: that is kept off the terminal while the decoder runs.
    """
    try:
        with _stderr_to_void():
            decoder.write(chunk)
            return decoder.decode()
    except Exception as e:  # noqa: BLE001 (every decoder error is the input's fault)
        raise InputError(path, f"{what} ({_first_line(e)})") from None
    except BaseException as e:
        if type(e).__name__ != "PanicException":
            raise
        raise InputError(path, f"{what} ({_first_line(e)})") from None


@contextlib.contextmanager
def _stderr_to_void() -> Iterator[None]:
    """Send file descriptor 2 to /dev/null for the duration (Python's sys.stderr is flushed first)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as void:
            os.dup2(void.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _first_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0]
