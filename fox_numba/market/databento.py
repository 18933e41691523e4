"""Databento DBN importer: `mbp-10`, `trades` and `ohlcv-1m` files (DBN or DBN+zstd) to trading days.

Files are decoded with `databento_dbn` in blocks (`_CHUNK` bytes of input) and each block's records viewed as a
numpy structured array (DBN records are fixed-size C structs), so a day of MBP-10 converts without a Python
loop per field; of each block only the chosen instrument's records and the fields the store needs are kept.

Decisions:
- One instrument per import. `--instrument` names it by raw symbol (ESU4) or instrument_id (an id the
  metadata maps to a raw symbol is read as that symbol); without it the instrument with the most records
  in the earliest file is taken (ties: the alphabetically first name), and the choice is reported. Every
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
  joined before it is validated, and it is complete once a later file starts after the day's end.
  Days with trades but no `ohlcv-1m` file get bars built from the trades (`bars.bars_from_trades`).
- Corrupt files: a zstd file that is cut short (an interrupted download) is refused: the decoder alone
  would return its first records as if the day had ended early; a damaged zstd frame fails its checksum.
  Plain `.dbn` files have neither, so their records are read here (fixed-size records, each declaring its
  length): a record whose declared length is wrong, or a file ending inside a record, is refused with its
  record number and byte offset. Every decoder failure (including the Rust decoder's panics, which are
  BaseExceptions) becomes a one-line InputError naming the file.
- Against the metadata: a record whose index time (`ts_recv`; `ts_event` for ohlcv-1m) is at or past the
  metadata's `end` is an error; a last record more than `CUT_WARNING_MINUTES` of open market before the
  `end` is a warning in the import's notes (a plain file cut at a record boundary shows only this way).
Rows in errors are 0-based record numbers of the file, counting every instrument's records.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import databento_dbn as dbn
import numpy as np

from fox_numba.errors import InputError
from fox_numba.market.calendar import assign_days, day_bounds, format_ns, open_ns_between
from fox_numba.market.schema import (
    DTYPES,
    N_LEVELS,
    SIDE_BUY,
    SIDE_NONE,
    SIDE_SELL,
    Bars,
    Instrument,
    MarketDay,
    Mbp10,
    Trades,
)
from fox_numba.market.sources import Sourced, bars_sourced, concat, unchanged_book_rows, validate_sourced
from fox_numba.market.validate import BOOK_FIELDS

DBN_SCHEMAS = {"mbp-10": "mbp10", "trades": "trades", "ohlcv-1m": "bars"}
"""DBN schemas this importer reads -> store schema."""
SUFFIXES = (".dbn", ".dbn.zst")

CUT_WARNING_MINUTES = 60
"""Open-market minutes between a file's last record and its metadata's `end` that raise a cut-file warning."""

_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_DBN_PREFIX = 8
"""b"DBN", the version byte and the metadata length (u32) precede the metadata."""
_CHUNK = 1 << 20
"""Bytes of input read at a time: a block of records. A compressed chunk decodes to a few times as many bytes, and
databento_dbn makes a Python object of each of its records (~1.5 KB) before the block is packed into numpy."""
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

    @classmethod
    def open(cls, paths: Sequence[Path], instrument: str | None = None) -> DatabentoImport:
        """Read the headers of `paths` and choose the instrument."""
        files = sorted((read_header(p) for p in paths), key=lambda f: (f.start, _ORDER[f.schema], str(f.path)))
        per_id: Counter = Counter()
        for block in record_blocks(files[0]):
            ids, n = np.unique(block["instrument_id"], return_counts=True)
            per_id.update(dict(zip(ids.tolist(), n.tolist(), strict=True)))
        have = Counter({files[0].names.get(i, str(i)): c for i, c in sorted(per_id.items())})
        if instrument is None:
            if not have:
                raise InputError(files[0].path, "the file holds no records")
            name = min(have, key=lambda k: (-have[k], k))
            tied = sorted(k for k in have if k != name and have[k] == have[name])
            others = ", ".join(f"{k} {c:,}" for k, c in have.most_common() if k != name)
            note = f"instrument {name}: {have[name]:,} records in {files[0].path.name}, the most"
            if tied:
                note += f"; tied with {', '.join(tied)}: the alphabetically first is taken"
            notes = [note + (f" (others: {others}; choose with --instrument)" if others else "")]
        else:
            name = _raw_symbol(instrument, files)
            how = f"instrument_id {instrument}, " if name != instrument else ""
            notes = [f"instrument {name} ({how}chosen with --instrument)"]
        plain = [f.path.name for f in files if not f.compressed]
        if plain:
            notes.append(
                f"{len(plain)} plain .dbn file(s) ({', '.join(plain[:3])}{', ...' if len(plain) > 3 else ''}): "
                "no checksum or frame, so a file cut at a record boundary shows only as a last record far "
                "before the metadata's end (checked)"
            )
        return cls(files, name, notes, Counter())

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

    def days(self, instrument: Instrument, progress: Callable[[str], None] | None = None) -> Iterator[MarketDay]:
        """Validated trading days, each complete across files, with bars built from trades if none came."""
        pending: dict[str, dict[str, list[Sourced]]] = {}
        for f in self.files:
            yield from self._flush(pending, instrument, before=f.start)
            if progress is not None:
                progress(f"reading {f.path.name}")
            for day, rows in self._file_days(f, instrument):
                pending.setdefault(day, {}).setdefault(f.schema, []).append(rows)
        yield from self._flush(pending, instrument, before=None)

    def _file_days(self, f: DbnFile, instrument: Instrument) -> list[tuple[str, Sourced]]:
        """The chosen instrument's rows of file `f`, converted and split into trading days.

        The file is read block by block: each block keeps only the chosen instrument's records and the fields
        `_convert` reads, so no copy of the whole file's records is ever held. The per-file decisions (snapshot
        runs, unchanged books, order) are taken on the joined rows, as on a file read whole.
        """
        ids = [i for i, n in f.names.items() if n == self.name]
        if not ids and self.name.isdigit():
            ids = [int(self.name)]
        index = "ts_event" if f.schema == "bars" else "ts_recv"
        parts: dict[str, list[np.ndarray]] = {}
        at: list[np.ndarray] = []
        present: set[int] = set()
        late: tuple[int, int] | None = None
        last: int | None = None
        offset = 0
        for block in record_blocks(f):
            mine = np.flatnonzero(np.isin(block["instrument_id"], ids))
            for name, values in _columns(block, mine, f.schema).items():
                parts.setdefault(name, []).append(values)
            at.append(mine + offset)
            present.update(np.unique(block["instrument_id"]).tolist())
            if block.size and f.end is not None:
                beyond = np.flatnonzero(block[index] >= np.uint64(f.end))
                if beyond.size and late is None:
                    late = (offset + int(beyond[0]), int(block[index][beyond[0]]))
                last = max(int(block[index].max()), last or 0)
            offset += block.size
        selected = np.concatenate(at) if at else np.zeros(0, dtype=np.int64)
        if selected.size == 0:
            held = ", ".join(sorted({f.names.get(i, str(i)) for i in present})) or "none"
            raise InputError(f.path, f"no records for instrument {self.name} (the file holds {held})")
        cols = {name: np.concatenate(parts.pop(name)) for name in list(parts)}  # one column's blocks at a time
        rows = self._convert(f, cols, selected)
        self._check_end(f, index, late, last, instrument)
        day_names, day_idx = assign_days(rows.data.ts_event, instrument)
        ends = np.searchsorted(day_idx, np.arange(1, len(day_names) + 1))  # rows are in time order: days are runs
        return [(day, rows.take(slice(a, b))) for day, a, b in zip(day_names, np.r_[0, ends[:-1]], ends, strict=True)]

    def _check_end(
        self, f: DbnFile, index: str, late: tuple[int, int] | None, last: int | None, instrument: Instrument
    ) -> None:
        """Refuse records at or past the metadata's end (`late`: the first one's record number and `index` time);
        warn when the last `index` time is far before it."""
        if f.end is None or last is None:
            return
        if late is not None:
            message = (
                f"{index} {format_ns(late[1], 'UTC')} UTC is at or past the end of the file's "
                f"metadata ({format_ns(f.end, 'UTC')} UTC): the file is damaged or its records are not its own"
            )
            raise InputError(f.path, message, field=index, row=late[0])
        last += 60 * 10**9 if f.schema == "bars" else 0
        gap = open_ns_between(last, f.end, instrument) / 60e9
        if gap > CUT_WARNING_MINUTES:
            self.warnings.append(
                f"{f.path.name}: its last record ({format_ns(last, instrument.timezone)[:19]}) is {gap:,.0f} "
                "minutes of open market before the end its metadata gives "
                f"({format_ns(f.end, instrument.timezone)[:19]} {instrument.timezone}): was the file cut short? "
                "Compare it with the download"
            )

    def summary(self) -> list[str]:
        """The instrument choice and what the flags made the import drop or keep."""
        words = {
            "bad_book": "MBP-10 records flagged F_MAYBE_BAD_BOOK dropped",
            "snapshot": "snapshot records dropped (last state of each snapshot kept)",
            "unchanged": "MBP-10 records that left the 10-level book unchanged dropped",
            "bad_ts_recv": "records flagged F_BAD_TS_RECV kept (ts_event is used)",
        }
        return self.notes + [f"{self.counts[k]:,} {w}" for k, w in words.items() if self.counts[k]]

    def _flush(self, pending: dict, instrument: Instrument, before: int | None) -> Iterator[MarketDay]:
        for day in sorted(pending):
            if before is not None and day_bounds(day, instrument)[1] > before:
                continue
            parts = {schema: concat(p) for schema, p in pending.pop(day).items()}
            labels = {s: f"{dbn_schema} {self.name}" for dbn_schema, s in DBN_SCHEMAS.items()}
            if "bars" not in parts and "trades" in parts:
                parts["bars"] = bars_sourced(parts["trades"])
                labels["bars"] = f"bars built from trades {self.name}"
            yield validate_sourced(day, parts, instrument, labels, self.name)

    def _convert(self, f: DbnFile, cols: dict[str, np.ndarray], selected: np.ndarray) -> Sourced:
        """Rows of the chosen instrument's records (columns `cols` from `_columns`, filtered in place so that a
        column and its filtered copy are the only two alive; record numbers `selected`) after the flags'
        decisions."""
        label = f"{f.dbn_schema} {self.name}"
        ts = cols["ts_event"]
        # 0 and UNDEF_TIMESTAMP mark an undefined time; past int64 (year 2262) no trading day can hold it.
        undefined = (ts == 0) | (ts > np.uint64(np.iinfo(np.int64).max))
        if undefined.any():
            row = int(selected[np.argmax(undefined)])
            raise InputError(f.path, "undefined ts_event", group=label, field="ts_event", row=row)
        if f.schema == "bars":
            return Sourced.one_file(Bars(**{c: cols[c] for c in DTYPES["bars"]}), f.path, selected)
        flags = cols.pop("flags")
        self.counts["bad_ts_recv"] += int(np.count_nonzero(flags & dbn.F_BAD_TS_RECV))
        keep = np.flatnonzero(
            _mbp10_keep(cols, flags, self.counts) if f.schema == "mbp10" else _trades_keep(flags, self.counts)
        )
        del ts  # the unfiltered column: each is replaced by its filtered copy below
        for name in cols:
            cols[name] = cols[name][keep]
        selected = selected[keep]
        _check_order(cols["ts_event"], selected, f.path, label)
        if f.schema == "trades":
            side = cols.pop("side")
            cols["side"] = np.select([side == b"B", side == b"A"], [SIDE_BUY, SIDE_SELL], SIDE_NONE).astype(np.int8)
            return Sourced.one_file(Trades(**cols), f.path, selected)
        return Sourced.one_file(Mbp10(**cols), f.path, selected)


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
    """The data records of the file in blocks (structured arrays over about `_CHUNK` bytes of input, in file
    order, every instrument). A damaged file is refused as if it had been read whole: a decoding failure
    first, then a cut record, a wrong record length, a wrong record type."""
    dtype = np.dtype(RECORD_FIELDS[f.schema] + ([("ts_out", "<u8")] if f.ts_out else []))
    other: tuple[int, int] | None = None
    offset = 0
    with _open(f.path) as fh:
        for data in (_zstd_blocks if f.compressed else _plain_blocks)(fh, f, dtype.itemsize):
            block = np.frombuffer(data, dtype=dtype)
            wrong = np.flatnonzero(block["rtype"] != RTYPES[f.schema])
            if wrong.size and other is None:
                other = (offset + int(wrong[0]), int(block["rtype"][wrong[0]]))
            offset += block.size
            yield block
    if other is not None:
        raise InputError(f.path, f"record type {other[1]:#x} in a {f.dbn_schema} file", field="rtype", row=other[0])


def _zstd_blocks(fh: BinaryIO, f: DbnFile, itemsize: int) -> Iterator[bytes]:
    """The record bytes of a DBN+zstd file, one block per `_CHUNK` of input, decoded with databento_dbn (after
    checking the frames are whole). After a record of the wrong length nothing more is yielded; the rest is
    decoded to report a decoding failure first, as for a file read whole."""
    if not _zstd_complete(fh):
        raise InputError(f.path, "the zstd stream is cut short (an interrupted download?)")
    fh.seek(0)
    decoder = _decoder(fh.read(4))
    n = 0
    wrong: tuple[int, int] | None = None
    while chunk := fh.read(_CHUNK):
        out = _decode(decoder, chunk, f.path, f"DBN decoding failed after record {n}")
        if out and isinstance(out[0], dbn.Metadata):
            out = out[1:]
        blobs = [bytes(r) for r in out]
        sizes = np.fromiter(map(len, blobs), dtype=np.int64, count=len(blobs))
        bad = np.flatnonzero(sizes != itemsize)
        if bad.size and wrong is None:
            wrong = (n + int(bad[0]), int(sizes[bad[0]]))
        n += len(blobs)
        if wrong is None:
            yield b"".join(blobs)
    if decoder.buffer():
        raise InputError(f.path, f"the file ends inside a record (after record {n - 1})")
    if wrong is not None:
        message = f"record of {wrong[1]} bytes, expected {itemsize} for {f.dbn_schema}"
        raise InputError(f.path, message, row=wrong[0])


def _plain_blocks(fh: BinaryIO, f: DbnFile, itemsize: int) -> Iterator[bytes]:
    """The record bytes of a plain DBN file in blocks of whole records. Every record declares the schema's
    length (in 4-byte words) and the file ends on a record boundary; otherwise name the first bad record and
    its byte offset."""
    fh.seek(f.records_at)
    n = 0
    while data := fh.read(_CHUNK // itemsize * itemsize):
        whole = len(data) // itemsize
        declared = np.frombuffer(data, dtype=np.uint8, count=whole * itemsize)[::itemsize].astype(np.int64) * 4
        wrong = np.flatnonzero(declared != itemsize)
        if wrong.size:
            k = n + int(wrong[0])
            message = (
                f"record at byte {f.records_at + k * itemsize:,} declares a length of {declared[wrong[0]]} bytes, "
                f"expected {itemsize} for {f.dbn_schema}: the file is damaged"
            )
            raise InputError(f.path, message, field="length", row=k)
        n += whole
        if len(data) % itemsize:
            raise InputError(
                f.path,
                f"the file ends inside a record (after record {n - 1}, {len(data) % itemsize} bytes of record {n})",
            )
        yield data


def _columns(block: np.ndarray, rows: np.ndarray, schema: str) -> dict[str, np.ndarray]:
    """The fields `DatabentoImport._convert` reads of `rows` of a block, each its own contiguous array (the book
    split per field: `bid_px` [n, 10]...), so nothing else of a record outlives its block."""
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


def _mbp10_keep(cols: dict[str, np.ndarray], flags: np.ndarray, counts: Counter) -> np.ndarray:
    snap = (flags & dbn.F_SNAPSHOT) != 0
    keep = ~snap | ~np.r_[snap[1:], False]
    counts["snapshot"] += int(np.count_nonzero(~keep))
    bad = (flags & dbn.F_MAYBE_BAD_BOOK) != 0
    counts["bad_book"] += int(np.count_nonzero(bad & keep))
    keep &= ~bad
    kept = np.flatnonzero(keep)
    same = unchanged_book_rows((cols[c][kept] for c in BOOK_FIELDS), cols["ts_event"][kept])
    counts["unchanged"] += int(np.count_nonzero(same))
    keep[kept[same]] = False
    return keep


def _trades_keep(flags: np.ndarray, counts: Counter) -> np.ndarray:
    snap = (flags & dbn.F_SNAPSHOT) != 0
    counts["snapshot"] += int(np.count_nonzero(snap))
    return ~snap


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
    must not pass for a day that ended early.
    """
    size = fh.seek(0, 2)
    pos = 0
    while pos < size:
        fh.seek(pos)
        head = fh.read(8)
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
            fh.seek(pos)
            block = fh.read(3)
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


def _decoder(magic: bytes) -> dbn.DBNDecoder:
    """A decoder for plain or zstd-compressed DBN, told apart by the first bytes."""
    compression = dbn.Compression.ZSTD if magic == _ZSTD_MAGIC else dbn.Compression.NONE
    decoder = dbn.DBNDecoder(compression=compression)
    decoder.write(magic)
    return decoder


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
