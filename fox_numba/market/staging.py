"""Staging: an import's trading days written part by part to HDF5 files, then checked whole and committed.

An importer stages each input file on its own (in this process or as a Ray task): its rows of each trading day
are validated block by block and appended to `/{day}/{schema}/` of the file's staging file (`PartWriter`), one
dataset per store column plus `record` (each row's record number in the input file), `hashes/` (each staged
chunk's sha256, per column) and for trades `built/`: the bars built from them. The columns are chunked and compressed
as the store's, and where one process stages the files in order a part that continues a day is staged in line with
the day's chunks (`PartWriter`), so that committing a day copies its chunks as they are stored, and takes its digest
from their hashes: the day is compressed once and never read back. Memory holds a block and a chunk buffer (that of
the day being staged: a file's earlier days are closed once a later one starts), never a day.

One process then takes the days in order (`StagedDay`, its parts in file order) and commits each into the store
being written (`commit_day`): the checks that need more than one part are made there from a few rows of each
part (where two files meet: the row pairs; trades inside the book's time range; imported bars against the bars
built from the trades), then the parts are copied into the store's layout a chunk at a time. A fault in a staged
row names its input file and record; a fault in a row the store already holds names the store, its group and
row (as `store.write_store` does).

The staging files are plain data on a file system every task can reach (the store's folder); the driver
removes them at the end (`staging_folder`).
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from fox_numba.errors import InputError
from fox_numba.io import running_process, temporary_path
from fox_numba.market.calendar import day_bounds
from fox_numba.market.schema import DTYPES, SCHEMA_TYPES, Bars, Instrument, MarketDay, Mbp10, Trades, columns
from fox_numba.market.sources import Sourced, bars_sourced, concat, validate_sourced
from fox_numba.market.store import (
    CHUNK_ROWS,
    COMPRESSIONS,
    ColumnHashes,
    MarketStore,
    StoreWriter,
    create_column,
    digest_of,
)
from fox_numba.market.validate import CHECK_ORDER, check_bars_match_trades, check_trades, RowWhere, validate_day

RECORD = "record"
"""Each staged row's record number in its input file."""
BUILT = "built"
"""Bars built from a part's trades (with `record`: the first trade of each minute)."""
HASHES = "hashes"
"""sha256 of each staged chunk's rows of each column ([chunks, 32] uint8 per column): the store's digest of a chunk
copied as it is stored (`store.ColumnHashes`), so the day is not read back to be digested."""
PAD = "pad"
"""Attr of a staged part: the unused rows before its first row, which put its chunks in line with the day's."""
STAGING_SUFFIX = ".staging"


@contextlib.contextmanager
def staging_folder(store: Path) -> Iterator[Path]:
    """A folder beside `store` for the staging files of one import (`.{name}.tmp-{pid}.staging`), removed at the
    end; those left by processes that no longer run are removed first."""
    folder = temporary_path(store).with_name(temporary_path(store).name + STAGING_SUFFIX)
    prefix = temporary_path(store, 0).name[:-1]
    for old in store.parent.glob(f"{prefix}*{STAGING_SUFFIX}"):
        pid = old.name[len(prefix) : -len(STAGING_SUFFIX)]
        if pid.isdigit() and not running_process(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


class PartWriter:
    """One schema of one trading day from one input file: rows validated as they come (each block with the row
    before it, so pairs across blocks are checked) and copied into a buffer of one chunk per column, which is
    appended to the staging file when it is whole (no joins of blocks), compressed as the store compresses it
    (`compression`) and hashed (`HASHES`), so the store takes each chunk as it is (`_copy`). `pad`:
    rows of the day staged before this part (by earlier files), known where one process stages the files in order;
    the part's first row is then staged at row `pad % CHUNK_ROWS`, so that its chunks are the day's (a Ray task
    does not know it: 0, and the chunks of a part that does not start the day are read and written again)."""

    def __init__(
        self, h5: h5py.File, day: str, schema: str, label: str, contract: str, instrument: Instrument, *,
        compression: str, pad: int,
    ) -> None:  # fmt: skip
        self.group = h5.require_group(f"{day}/{schema}")
        self.compression, self.pad = compression, pad % CHUNK_ROWS
        self.group.attrs[PAD] = self.pad
        self.day, self.schema, self.contract, self.instrument = day, schema, contract, instrument
        self.bounds = day_bounds(day, instrument)
        """[start, end) of the day, UTC ns (`calendar.day_bounds`): rows inside it are this writer's."""
        self.labels = {schema: label}
        self.rows = 0
        self.filled = 0
        """Rows in the chunk buffers, which hold file rows `pad + rows` on (from buffer row `(pad + rows) %
        CHUNK_ROWS`: only the first chunk starts inside the buffer)."""
        self.buffers: dict[str, np.ndarray] = {}
        self.last: Sourced | None = None
        self.built: Sourced | None = None
        self.datasets: dict[str, h5py.Dataset] = {}
        self.hashes: dict[str, list[bytes]] = {}
        """Each column's chunk hashes so far (`HASHES`), written at `close`."""

    def append(self, rows: Sourced) -> None:
        """Validate `rows` (after the rows appended before) and stage them."""
        if self.last is not None:
            self._validate(concat([self.last, rows.take(np.arange(1))]))
        self._validate(rows)
        n = len(rows.record)
        self.last = rows.take(np.arange(n - 1, n))
        if self.schema == "trades":
            self.built = merge_bars(self.built, bars_sourced(rows))
        values = (*columns(rows.data).items(), (RECORD, rows.record))
        k = 0
        while k < n:
            at = (self.pad + self.rows) % CHUNK_ROWS + self.filled
            take = min(n - k, CHUNK_ROWS - at)
            for name, column in values:
                self._buffer(name, column)[at : at + take] = column[k : k + take]
            self.filled += take
            k += take
            if at + take == CHUNK_ROWS:
                self._flush()

    def close(self) -> int:
        """Write what is buffered (and the built bars), free the buffers; return the rows staged."""
        self._flush()
        self.buffers = {}
        for name, digests in self.hashes.items():
            self.group.require_group(HASHES)[name] = np.frombuffer(b"".join(digests), dtype=np.uint8).reshape(-1, 32)
        if self.built is not None:
            built = self.group.create_group(BUILT)
            for name, values in columns(self.built.data).items():
                built.create_dataset(name, data=values)
            built.create_dataset(RECORD, data=self.built.record)
        return self.rows

    def _validate(self, rows: Sourced) -> None:
        validate_sourced(self.day, {self.schema: rows}, self.instrument, self.labels, self.contract)

    def _buffer(self, name: str, column: np.ndarray) -> np.ndarray:
        """The chunk buffer of column `name`, made on first use."""
        if name not in self.buffers:
            self.buffers[name] = np.empty((CHUNK_ROWS, *column.shape[1:]), dtype=column.dtype)
        return self.buffers[name]

    def _flush(self) -> None:
        """Append the buffered rows (up to a chunk boundary, or the part's last rows) and their chunk's hash."""
        if self.filled == 0:
            return
        at = self.pad + self.rows
        a = at % CHUNK_ROWS
        for name, buffer in self.buffers.items():
            values = buffer[a : a + self.filled]
            ds = self._dataset(name, values)
            ds.resize(at + self.filled, axis=0)
            ds[at:] = values
            if name != RECORD:
                self.hashes[name].append(hashlib.sha256(values).digest())
        self.rows += self.filled
        self.filled = 0

    def _dataset(self, name: str, values: np.ndarray) -> h5py.Dataset:
        """The staged column `name`, created (empty, chunked and compressed as the store's) on first use."""
        if name not in self.datasets:
            tail = values.shape[1:]
            self.datasets[name] = self.group.create_dataset(
                name, shape=(0, *tail), maxshape=(None, *tail), dtype=values.dtype, chunks=(CHUNK_ROWS, *tail),
                **COMPRESSIONS[self.compression],
            )  # fmt: skip
            self.hashes.setdefault(name, [])
        return self.datasets[name]


def merge_bars(a: Sourced | None, b: Sourced) -> Sourced:
    """Bars built from consecutive runs of trades joined: a minute split between them becomes one bar (open and
    origin of the first run, close of the second), as `bars_from_trades` on the joined trades gives."""
    if a is None or len(a.record) == 0 or len(b.record) == 0 or a.data.ts_event[-1] != b.data.ts_event[0]:
        return b if a is None or len(a.record) == 0 else joined([a, b]) if len(b.record) else a
    x, y = a.data, b.data
    minute = Bars(
        ts_event=x.ts_event[-1:], open=x.open[-1:], high=np.maximum(x.high[-1:], y.high[:1]),
        low=np.minimum(x.low[-1:], y.low[:1]), close=y.close[:1], volume=x.volume[-1:] + y.volume[:1],
    )  # fmt: skip
    split = Sourced(minute, a.files, a.file_idx[-1:], a.record[-1:])
    return joined([a.take(slice(0, len(a.record) - 1)), split, b.take(slice(1, len(b.record)))])


def joined(parts: list[Sourced]) -> Sourced:
    """`sources.concat` with each input file listed once: joined again and again (a part's blocks, its bars),
    the list of files would otherwise grow with every join."""
    out = concat(parts)
    files = list(dict.fromkeys(out.files))
    remap = np.array([files.index(f) for f in out.files], dtype=np.int32)
    return Sourced(out.data, files, remap[out.file_idx], out.record)


@dataclass(frozen=True)
class Part:
    """Rows of one schema of one trading day from one input file, staged in `staged`."""

    staged: Path
    source: Path
    day: str
    schema: str
    rows: int
    siblings: int
    """Parts staged in `staged` (one per day of the file): once that many are committed, it can go."""


@dataclass
class StagedDay:
    """A complete trading day: its staged parts per schema, in file order, and the contract they are from."""

    day: str
    contract: str
    parts: dict[str, list[Part]]
    labels: dict[str, str]
    """Each schema as the input calls it (`mbp-10 ESU4`): the group of errors in its rows."""


class _Rows:
    """One schema of one day as stored segments, read a few rows or a chunk at a time: the staged parts of an
    import (rows named by input file and record) or the group the store being extended holds (by day row)."""

    def __init__(self, schema: str, day: str, groups: list[h5py.Group], origin: list[Path]) -> None:
        self.schema, self.day, self.groups, self.origin = schema, day, groups, origin
        self.pads = [int(g.attrs.get(PAD, 0)) for g in groups]
        """Rows before each segment's first (`PAD`: a staged part's; 0 in a store's group)."""
        self.sizes = [g["ts_event"].shape[0] - pad for g, pad in zip(groups, self.pads, strict=True)]
        self.starts = np.r_[0, np.cumsum(self.sizes)].astype(np.int64)
        self.staged = RECORD in groups[0] if groups else False

    @property
    def n(self) -> int:
        return int(self.starts[-1])

    def take(self, k: int, count: int = 1) -> Sourced:
        """Rows k..k+count-1 (inside one segment) with their origin."""
        seg = int(np.searchsorted(self.starts, k, side="right")) - 1
        g, at = self.groups[seg], k - int(self.starts[seg]) + self.pads[seg]
        cols = {c: g[c][at : at + count] for c in DTYPES[self.schema]}
        records = g[RECORD][at : at + count] if self.staged else np.arange(k, k + count, dtype=np.int64)
        return Sourced.one_file(SCHEMA_TYPES[self.schema](**cols), self.origin[seg], records)

    def chunks(self, rows: int | None = None) -> Iterator[Sourced]:
        """Every row, `rows` at a time (`CHUNK_ROWS` when None; a multiple of it reads whole store chunks), in order
        (no rows: the first segment's empty columns, once)."""
        rows = rows or CHUNK_ROWS
        if self.n == 0:
            g, pad = self.groups[0], self.pads[0]
            data = SCHEMA_TYPES[self.schema](**{c: g[c][pad:] for c in DTYPES[self.schema]})
            yield Sourced.one_file(data, self.origin[0], np.zeros(0, dtype=np.int64))
        for seg, size in enumerate(self.sizes):
            for at in range(0, size, rows):
                yield self.take(int(self.starts[seg]) + at, min(rows, size - at))

    def ts(self, k: int) -> int:
        return int(self.take(k).data.ts_event[0])

    def first_after(self, ts: int) -> int:
        """The first row later than `ts` (`n` if none)."""
        for seg, (pad, size) in enumerate(zip(self.pads, self.sizes, strict=True)):
            column = self.groups[seg]["ts_event"]
            for at in range(0, size, CHUNK_ROWS):
                later = np.flatnonzero(column[pad + at : pad + at + CHUNK_ROWS] > np.uint64(ts))
                if later.size:
                    return int(self.starts[seg]) + at + int(later[0])
        return self.n

    def built(self) -> Sourced | None:
        """Bars built from these trades (staged: from each part's `built`; stored: a chunk at a time); None
        without trades."""
        out = None
        if self.staged:
            for seg, g in enumerate(self.groups):
                cols = {c: g[BUILT][c][()] for c in DTYPES["bars"]}
                out = merge_bars(out, Sourced.one_file(Bars(**cols), self.origin[seg], g[BUILT][RECORD][()]))
        else:
            for rows in self.chunks():
                out = merge_bars(out, bars_sourced(rows))
        return out

    def error(self, e: InputError, rows: Sourced, label: str | None) -> InputError:
        """`e`, raised at row `e.row` of `rows` (read from here), naming the input file and record of a staged
        row, else the store's group and day row."""
        path, record = rows.locate(e.row)
        group = f"{label} {self.day}" if self.staged else f"/{self.schema}/{self.day}"
        return InputError(path, e.reason, group=group, field=e.field, row=record)


def commit_day(writer: StoreWriter, day: StagedDay, instrument: Instrument, staged: dict[Path, h5py.File]) -> dict:
    """Check `day` across its parts and against what the store being extended keeps of it, then write it;
    return its rows per schema. `staged` holds the staging files opened so far (read-only)."""
    for part in (p for parts in day.parts.values() for p in parts):
        if part.staged not in staged:
            staged[part.staged] = h5py.File(part.staged, "r")
    incoming = {
        schema: _Rows(schema, day.day, [staged[p.staged][f"{p.day}/{schema}"] for p in ps], [p.source for p in ps])
        for schema, ps in day.parts.items()
    }
    for schema in CHECK_ORDER:
        if schema in incoming:
            _check_junctions(incoming[schema], day, instrument)
    labels = dict(day.labels)
    if "bars" in incoming:
        bars = concat(list(incoming["bars"].chunks()))
    elif "trades" in incoming:
        bars = incoming["trades"].built()
        labels["bars"] = f"bars built from trades {day.contract}"
        validate_sourced(day.day, {"bars": bars}, instrument, labels, day.contract)
    else:
        bars = None
    kept = _kept(writer, day, incoming)
    book, trades = incoming.get("mbp10", kept.get("mbp10")), incoming.get("trades", kept.get("trades"))
    if book is not None and trades is not None and trades.n:
        _check_inside_book(trades, book, instrument, day.day, labels)
    if "bars" in incoming and trades is not None:
        _check_bars_against(bars, trades, incoming["bars"], instrument, day.day, labels)
    out = {}
    for schema in ("bars", "mbp10", "trades"):
        if schema == "bars" and bars is not None:
            writer.write_schema("bars", day.day, bars.data, day.contract)
            out["bars"] = len(bars.record)
        elif schema in incoming and schema != "bars":
            hashes = _copy(incoming[schema], writer.day_group(schema, day.day, day.contract), writer.compression)
            writer.seal(schema, day.day, digest_of(day.contract, hashes))
            out[schema] = incoming[schema].n
    return out


READ_ROWS = 8 * CHUNK_ROWS
"""Rows of a stored day a stage reads at a time (`validated_chunks`): 8 store chunks, about 43 MB of MBP-10. The
import's own check reads one chunk at a time; a stage reading 20 days of 3 M rows took 58 s a chunk at a time and
48 s eight at a time (45 s reading each day whole, at 11 x the memory; tools/results/scale_cpu.md)."""


def check_stored_day(store: MarketStore, day: str, rows: int | None = None) -> None:
    """Validate a day the store holds a chunk at a time, as `MarketStore.read_day` validates it whole
    (`validated_chunks`). Asked by the import of a day without a digest, in a single-file store written before
    digests (`store.StoreWriter.open`), and by the stages that validate a day they do not read in full."""
    collections.deque(validated_chunks(store, day, rows), maxlen=0)  # each chunk let go before the next is read


def validated_chunks(store: MarketStore, day: str, rows: int | None = None) -> Iterator[tuple[str, Sourced]]:
    """The rows of each schema of a stored `day`, in `CHECK_ORDER`, `rows` at a time (`CHUNK_ROWS` when None), each
    chunk yielded once it is validated with the row before it (`validate.validate_day`); after the last, trades
    inside the book's time range and the bars against the trades. Errors name the store, the day's group and row,
    as `read_day`'s do. Memory holds a chunk (and the day's bars for the last check), whatever the day's size."""
    contract = store.contract(day)
    stored = {}
    for schema in CHECK_ORDER:
        if day not in store.file.get(schema, {}):
            continue
        group = store.file[f"{schema}/{day}"]
        missing = [c for c in DTYPES[schema] if c not in group]
        if missing:
            raise InputError(store.path, "missing dataset", group=f"/{schema}/{day}", field=missing[0])
        stored[schema] = _Rows(schema, day, [group], [store.path])
        before = None
        for chunk in stored[schema].chunks(rows):
            for block in ([] if before is None else [concat([before, chunk.take(np.arange(1))])]) + [chunk]:
                try:
                    market_day = MarketDay(day, contract=contract, **{schema: block.data})
                    validate_day(market_day, store.instrument, store.path)
                except InputError as e:
                    row = block.locate(e.row)[1]
                    raise InputError(e.path, e.reason, group=e.group, field=e.field, row=row) from None
            before = chunk.take(np.arange(len(chunk.record) - 1, len(chunk.record)))
            del block, market_day
            yield schema, chunk
            del chunk  # before the next chunk is read
    if "trades" in stored and "mbp10" in stored and stored["trades"].n:
        _check_inside_book(stored["trades"], stored["mbp10"], store.instrument, day, {})
    if "bars" in stored and "trades" in stored:
        bars = concat(list(stored["bars"].chunks()))
        _check_bars_against(bars, stored["trades"], stored["bars"], store.instrument, day, {})


def _check_junctions(rows: _Rows, day: StagedDay, instrument: Instrument) -> None:
    """Where one part ends and the next begins, the pair checks (time order, duplicate rows or minutes)."""
    for seg in range(1, len(rows.sizes)):
        k = int(rows.starts[seg])
        pair = concat([rows.take(k - 1), rows.take(k)])
        validate_sourced(day.day, {rows.schema: pair}, instrument, day.labels, day.contract)


def _kept(writer: StoreWriter, day: StagedDay, incoming: dict[str, _Rows]) -> dict[str, _Rows]:
    """The schemas of `day` that the store being extended holds and this import does not replace; each must be
    of the day's contract."""
    old = writer.old
    kept = {}
    for schema in ("bars", "mbp10", "trades"):
        if old is None or schema in incoming or day.day not in old.file.get(schema, {}):
            continue
        group = old.file[f"{schema}/{day.day}"]
        have = str(group.attrs.get("contract", ""))
        have = have.decode() if isinstance(have, bytes) else have
        if have != day.contract:
            raise InputError(
                old.path,
                f"the store's {schema} of {day.day} is from {have}, the data being added from {day.contract}: one "
                f"contract per day (add every schema of the day from {day.contract})",
                group=f"/{schema}/{day.day}",
                field="contract",
            )
        kept[schema] = _Rows(schema, day.day, [group], [old.path])
    return kept


def _check_inside_book(trades: _Rows, book: _Rows, instrument: Instrument, day: str, labels: dict) -> None:
    """Every trade inside the book's time range (`validate.check_trades`, on the first trade outside it)."""
    first, last = (book.ts(0), book.ts(book.n - 1)) if book.n else (None, None)
    k = 0 if first is None or trades.ts(0) < first else trades.first_after(last)
    if k == trades.n:
        return
    ends = np.array([first, last] if first is not None else [], dtype=np.uint64)
    stand_in = Mbp10(ends, *([None] * (len(DTYPES["mbp10"]) - 1)))
    row = trades.take(k)
    try:
        check_trades(row.data, stand_in, RowWhere("", "trades", day, instrument.timezone))
    except InputError as e:
        raise trades.error(e, row, labels.get("trades")) from None


def _check_bars_against(bars: Sourced, trades: _Rows, rows: _Rows, instrument: Instrument, day: str,
                        labels: dict) -> None:  # fmt: skip
    """Imported bars against the bars built from the day's trades (`validate.check_bars_match_trades`, given
    trades standing in for the day's: the open, high, low and close of each built minute, at its start, the
    volume on the first, which `bars_from_trades` turns back into the same bars)."""
    built = trades.built()
    if built is None:
        return
    built = built.data
    n = len(built.ts_event)
    stand_in = Trades(
        ts_event=np.repeat(built.ts_event, 4),
        price=np.stack([built.open, built.high, built.low, built.close], axis=1).ravel(),
        size=np.stack([built.volume] + [np.zeros(n, dtype=np.uint64)] * 3, axis=1).ravel(),
        side=np.zeros(4 * n, dtype=np.int8),
    )
    try:
        check_bars_match_trades(bars.data, stand_in, RowWhere("", "bars", day, instrument.timezone))
    except InputError as e:
        raise rows.error(e, bars, labels.get("bars")) from None


def _copy(rows: _Rows, group: h5py.Group, compression: str) -> dict[str, ColumnHashes]:
    """Write the staged parts as the store's columns (`store.create_column`), a chunk at a time; return their hashes
    (`store.ColumnHashes`: the digest without reading the day back). A chunk of the day that is a whole chunk of one
    staged part (staged in line with the day's chunks: `PartWriter`) is copied as it is stored, without
    decompressing it, with its staged hash; the others (where two parts meet) are read, written and hashed."""
    if rows.n < CHUNK_ROWS:  # one chunk, or fewer rows: chunked as the store chunks a short column
        data = concat([rows.take(int(rows.starts[s]), size) for s, size in enumerate(rows.sizes)]).data
        for name, values in columns(data).items():
            create_column(group, name, values.shape, values.dtype, data=values, compression=compression)
        return {name: ColumnHashes.of(values) for name, values in columns(data).items()}
    out = {
        name: create_column(group, name, (rows.n, *rows.groups[0][name].shape[1:]), dtype, compression=compression)
        for name, dtype in DTYPES[rows.schema].items()
    }
    hashes = {name: ColumnHashes(ds.dtype, ds.shape[1:]) for name, ds in out.items()}
    staged = [{name: (g[name], g[HASHES][name][()]) for name in out} for g in rows.groups]
    for part in staged:
        for name, (source, _) in part.items():
            if _filters(source) != _filters(out[name]):
                raise ValueError(f"{source.name}: staged with other filters than the store's {compression}")
    buffer = np.empty(0, dtype=np.uint8)  # the stored chunk read into one buffer: no bytes allocated per chunk
    for at in range(0, rows.n, CHUNK_ROWS):
        count = min(CHUNK_ROWS, rows.n - at)
        seg = int(np.searchsorted(rows.starts, at, side="right")) - 1
        local = at - int(rows.starts[seg]) + rows.pads[seg]
        if local % CHUNK_ROWS == 0 and local + count <= rows.pads[seg] + rows.sizes[seg]:  # the part's chunk
            for name, ds in out.items():
                source, digests = staged[seg][name]
                where = (local, *(0,) * (source.ndim - 1))
                size = source.id.get_chunk_info_by_coord(where).size
                if size > buffer.size:
                    buffer = np.empty(size, dtype=np.uint8)
                mask, raw = source.id.read_direct_chunk(where, out=buffer)
                ds.id.write_direct_chunk((at, *(0,) * (ds.ndim - 1)), raw, mask)
                hashes[name].add_digest(digests[local // CHUNK_ROWS].tobytes(), count)
            continue
        pieces = []
        k = at
        while k < at + count:
            seg = int(np.searchsorted(rows.starts, k, side="right")) - 1
            take = min(at + count, int(rows.starts[seg + 1])) - k
            pieces.append(rows.take(k, take))
            k += take
        for name, values in columns(concat(pieces).data).items():
            out[name][at : at + count] = values
            hashes[name].add(values)
    return hashes


def _filters(ds: h5py.Dataset) -> tuple:
    """What decides a column's stored chunk bytes: dtype, chunk shape and filters."""
    return ds.dtype, ds.chunks, ds.compression, ds.compression_opts, ds.shuffle
