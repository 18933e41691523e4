"""The HDF5 market store: a small root file per market, one day file per schema and trading day beside it.

Layout (version 3):
    <store>                 the root file: attrs layout_version, symbol, tick_size, point_value, price_scale,
                            timezone, session_open, session_close, day_roll, day_open, calendar, and the
                            writer's own attrs; `/{schema}/{YYYY-MM-DD}` is an HDF5 external link to the
                            group of the same path in that (schema, day)'s day file, by a path relative to
                            the root file's folder, so HDF5 (and h5py, and every reader here) goes through
                            it as if the group were in the root file.
    <store>.days/{schema}/{YYYY-MM-DD}-{digest[:16]}.h5
                            a day file, named by its content (the group's digest): one group
                            `/{schema}/{YYYY-MM-DD}` with attr `contract` (the contract the day's rows are
                            from: ESU4, a LOBSTER ticker, the synthetic symbol; one per day, so a continuous
                            series across a roll shows where the contract changes); one dataset per column,
                            dtypes from `schema.DTYPES`; MBP-10 book columns are [n, 10] (`bid_px[:, k]` is
                            Databento's `bid_px_0k`); price datasets carry a `price_scale` attr. Chunked,
                            byte-shuffled and LZF-compressed (h5py only; `COMPRESSIONS`: an import may choose
                            gzip or none instead, read the same way). Attr `digest` (`group_digest`): sha256
                            of the group's content, set when it is written, after it was validated.

The store file and its `.days` folder are one unit: copy or move them together, into any folder, keeping both
names (the links name the folder relative to the store's own folder). A day file that is missing is an
`InputError` naming it. Layout 2, the single-file layout (the same groups held inside the store file itself),
is read as it is; extending it copies its groups out to day files once, and the store becomes layout 3.

Why day files: HDF5 does not reclaim the space of a deleted dataset, and a write into an HDF5 file in place is
not safe against a crash, so a store in one file had to be rewritten whole for every extension. Every day is
validated (`validate.validate_day`) before it is written and again when it is read. A write (`write_store`,
`StoreWriter`) puts each (schema, day) group it writes into a new day file (under a temporary name, then renamed
to its content-addressed one), then writes the root file under a temporary name and renames it over the store:
that rename is the commit, so a write that is rejected, interrupted or killed before it leaves the previous store
as it was (a killed one leaves at most unlinked day files, which the next write deletes). Extending a store
writes only the groups it adds or replaces, never the others; after the commit, the day files the new root no
longer links (a replaced group, a killed write's leftovers) are deleted, so a store does not grow with
re-imports of the same days, and a reader that opened the store before the commit and reaches a replaced group
only then fails, naming its day file. One process writes a store at a time (it holds `.days/.lock` locked): a
second writer is refused.

Days the store already holds are not validated again when it is extended: a group's digest attr is the record
that it was validated when written, so extending checks only that each linked day file exists and carries one.
A group without it in a single-file store was written before digests existed: its day is validated first (a day
that fails is refused, naming it) and its digest added as it is copied out.

A day's digest (`MarketStore.day_digest`) names its content: the per-day caches (the validated days of
`market/select.py`, the features of `features/cache.py`) are keyed by it, so a rewritten day misses them.
For a group without the attr, it is computed from the stored rows each time it is asked for (one read of the
day, without validation).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path

import h5py
import numpy as np

from fox_numba.errors import InputError, MissingDataError, OutputError
from fox_numba.io import TEMP_INFIX, atomic_path
from fox_numba.market.schema import (
    DTYPES,
    MANDATORY_SCHEMAS,
    PRICE_SCALE,
    SCHEMA_TYPES,
    SCHEMAS,
    Instrument,
    MarketDay,
    columns,
    n_rows,
)
from fox_numba.market.validate import validate_day, validate_instrument

LAYOUT_VERSION = 3
"""The layout written: a root file of links to per-(schema, day) day files."""
SINGLE_FILE_LAYOUT = 2
"""The layout written before day files: every group inside the store file. Read, and extended into layout 3."""
DAYS_SUFFIX = ".days"
"""The folder of a store's day files is the store's path with this appended."""
LOCK_NAME = ".lock"
"""The file in the day folder that a writer holds locked (`fcntl.flock`) while it writes."""
CHUNK_ROWS = 1 << 14
"""Rows per chunk (an MBP-10 price chunk is 16384 x 10 x 8 B = 1.3 MB before compression)."""

COMPRESSIONS: dict[str, dict[str, object]] = {
    "lzf": {"compression": "lzf", "shuffle": True},
    "gzip": {"compression": "gzip", "compression_opts": 1, "shuffle": True},
    "none": {},
}
"""How a chunked column may be compressed (HDF5's built-in filters, so any HDF5 reader reads every store). A day of
`tools/gen_dbn.py --book fresh` with 1 M MBP-10 rows and 250 k trades (tools/results/import_scale_cpu.md): lzf 54 MB,
gzip (level 1) 41 MB, ~10% slower to write and faster to read, none 339 MB, 10-25% faster to import; the same day as
one book change per record (`--book events`, tools/results/import_speed_cpu.md): lzf 24 MB."""
DEFAULT_COMPRESSION = "lzf"
"""The store's compression unless an import chooses another (`fox data import --compression`)."""
DIGEST_ATTR = "digest"
"""Attr of a (schema, day) group: `group_digest` of it, written with it."""
PRICE_FIELDS = frozenset({"open", "high", "low", "close", "price", "bid_px", "ask_px"})
INSTRUMENT_ATTRS = tuple(f.name for f in fields(Instrument))
RESERVED_ATTRS = frozenset({"layout_version", "price_scale", *INSTRUMENT_ATTRS})

IMPORT_HINT = {
    "mbp10": "Databento mbp-10 DBN files, or LOBSTER message + orderbook CSV pairs",
    "trades": "Databento trades DBN files, or LOBSTER message + orderbook CSV pairs",
    "bars": "Databento ohlcv-1m DBN files (bars are also built from trades)",
}


def day_folder(store: str | Path) -> Path:
    """The folder of `store`'s day files (`<store>.days`)."""
    store = Path(store)
    return store.with_name(store.name + DAYS_SUFFIX)


def write_store(
    path: str | Path,
    instrument: Instrument,
    days: Iterable[MarketDay],
    *,
    attrs: Mapping[str, str | int | float] | None = None,
    extend: bool = False,
    progress: Callable[[str], None] | None = None,
    compression: str = DEFAULT_COMPRESSION,
) -> Path:
    """Validate and write `days` to the store at `path`; return the path.

    Without `extend` the store holds `days` only. With `extend` it keeps what it holds (its root attrs and the
    groups this write does not replace, neither rewritten nor validated again: module docstring), and each incoming
    schema of a day replaces that schema of that day (the day's other schemas are kept, checked against the new
    data, and must come from the same contract). Pieces of the same schema and day arriving in one call (a day
    split over two files) are joined in arrival order. Each day group records its contract (`MarketDay.contract`,
    else the instrument's symbol). `attrs` go on the root group; their names must not clash with the layout's own.
    The whole call is one commit: a day that fails validation leaves the store as it was before the call.
    `compression` (a key of `COMPRESSIONS`) applies to the groups this call writes.
    """
    with StoreWriter.open(path, instrument, attrs=attrs, extend=extend, compression=compression) as writer:
        for day in days:
            contract = day.contract or instrument.symbol
            checked = validate_day(_merge(writer, day, contract), instrument, writer.path)
            for schema in day.present():
                writer.write_schema(schema, day.day, getattr(checked, schema), contract)
            if progress is not None:
                rows = ", ".join(f"{s} {n_rows(getattr(checked, s)):,}" for s in day.present())
                progress(f"wrote {day.day}: {rows}")
            del day, checked  # released before `days` makes the next one: one day in memory at a time
    return Path(path)


@dataclass
class StoreWriter:
    """A store being written (`open`): its new root file (attrs now, links when the write ends), the store it
    extends (or None), and the (schema, day) groups written so far, each sealed in its own day file."""

    path: Path
    root: h5py.File
    old: MarketStore | None
    compression: str = DEFAULT_COMPRESSION
    """How the columns this write adds are compressed (a key of `COMPRESSIONS`)."""
    written: dict[tuple[str, str], Path] = field(default_factory=dict)
    """The day file of each (schema, day) group written (the last, where a group was written twice)."""
    _open: dict[tuple[str, str], tuple[h5py.File, Path]] = field(default_factory=dict)
    _created: set[Path] = field(default_factory=set)
    """Files this write made (temporary and day files): deleted if it fails."""

    @classmethod
    @contextlib.contextmanager
    def open(
        cls,
        path: str | Path,
        instrument: Instrument,
        *,
        attrs: Mapping[str, str | int | float] | None = None,
        extend: bool = False,
        check_day: Callable[[MarketStore, str], object] = lambda store, day: store.read_day(day),
        compression: str = DEFAULT_COMPRESSION,
    ) -> Iterator[StoreWriter]:
        """Write the store at `path`: day files as groups are written, then the root renamed over the store when the
        block ends without error, then the day files it does not link deleted. With `extend` the existing store's
        day files are checked first (and the days of a single-file store without digests validated by `check_day`,
        which raises `InputError`), and its root attrs and unwritten groups kept."""
        path = Path(path)
        if compression not in COMPRESSIONS:
            raise ValueError(f"compression {compression!r} is not one of {', '.join(COMPRESSIONS)}")
        clash = RESERVED_ATTRS & set(attrs or {})
        if clash:
            raise ValueError(f"attrs {sorted(clash)} are reserved by the store layout")
        validate_instrument(instrument, path)
        if path.is_dir():
            raise OutputError(f"{path}: is a folder; name a file to write")
        folder = day_folder(path)
        with _locked(folder, path), contextlib.ExitStack() as stack:
            writer = None
            try:
                extending = extend and path.exists()
                old = stack.enter_context(_store_to_extend(path, instrument, check_day)) if extending else None
                with atomic_path(path) as tmp, h5py.File(tmp, "w") as root:
                    _write_instrument(root, instrument)
                    kept = {} if old is None else {k: v for k, v in old.file.attrs.items() if k not in RESERVED_ATTRS}
                    for key, value in {**kept, **(attrs or {})}.items():
                        root.attrs[key] = value
                    writer = cls(path, root, old, compression)
                    yield writer
                    linked = writer.link_groups()
            except BaseException:
                if writer is not None:
                    writer.discard()
                _remove_if_empty(folder)
                raise
            _sweep(folder, linked)

    @property
    def folder(self) -> Path:
        return day_folder(self.path)

    def day_group(self, schema: str, day: str, contract: str) -> h5py.Group:
        """The (new, empty) group of `schema` on `day`, recording its contract, in a new day file (`seal` ends it)."""
        if (schema, day) in self._open:
            self._open.pop((schema, day))[0].close()
        tmp = self._temporary(schema, day)
        h5 = h5py.File(tmp, "w")
        self._open[(schema, day)] = (h5, tmp)
        group = h5.create_group(f"{schema}/{day}")
        group.attrs["contract"] = contract
        return group

    def write_schema(self, schema: str, day: str, record: object, contract: str) -> None:
        group = self.day_group(schema, day, contract)
        hashes = {}
        for col, values in columns(record).items():
            create_column(group, col, values.shape, values.dtype, data=values, compression=self.compression)
            hashes[col] = ColumnHashes.of(values)
        self.seal(schema, day, digest_of(contract, hashes))

    def seal(self, schema: str, day: str, digest: str | None = None) -> None:
        """Record the digest of the (schema, day) group once all its columns are written (`digest`, as the writer
        computed it from the rows it wrote, or else read back: `group_digest`), and give its day file its
        content-addressed name."""
        h5, tmp = self._open.pop((schema, day))
        try:
            group = h5[f"{schema}/{day}"]
            digest = group_digest(group) if digest is None else digest
            group.attrs[DIGEST_ATTR] = digest
        finally:
            h5.close()
        self.written[(schema, day)] = self._place(tmp, schema, day, digest)

    def held(self, schema: str, day: str) -> tuple[Path, str, object] | None:
        """(the store path errors name, contract, rows) of `schema` on `day` as this write (an earlier piece of the
        day) or else the store it extends holds it; None where neither does."""
        if (schema, day) in self.written:
            with h5py.File(self.written[(schema, day)], "r") as f:
                return self.path, _contract_of(f, schema, day, self.path), _read_schema(f, schema, day, self.path)
        if self.old is not None and day in self.old.file.get(schema, {}):
            f, where = self.old.file, self.old.path
            return where, _contract_of(f, schema, day, where), _read_schema(f, schema, day, where)
        return None

    def link_groups(self) -> set[Path]:
        """Link every group of the new store from its root: those written, and those of the store being extended
        that were not (where one is inside a single-file store, copied out to a day file first); return the day
        files linked."""
        files = dict(self.written)
        if self.old is not None:
            for schema, day in _groups(self.old.file):
                if (schema, day) not in files:
                    files[(schema, day)] = self.old.day_file(schema, day) or self._copy_out(schema, day)
        for (schema, day), file in sorted(files.items()):
            target = os.path.relpath(file, self.path.parent)
            self.root.require_group(schema)[day] = h5py.ExternalLink(target, f"/{schema}/{day}")
        return {file.resolve() for file in files.values()}

    def discard(self) -> None:
        """Close and delete what this write made (it failed: the store keeps its previous root and day files)."""
        for h5, _ in self._open.values():
            h5.close()
        self._open.clear()
        for path in self._created:
            with contextlib.suppress(OSError):
                path.unlink()

    def _copy_out(self, schema: str, day: str) -> Path:
        """A day file holding the single-file store's group as it is (its digest added where it lacks one: its day
        was validated when the store was opened to be extended)."""
        tmp = self._temporary(schema, day)
        with h5py.File(tmp, "w") as h5:
            h5.copy(self.old.file[f"{schema}/{day}"], h5.require_group(schema), name=day)
            group = h5[f"{schema}/{day}"]
            if DIGEST_ATTR not in group.attrs:
                group.attrs[DIGEST_ATTR] = group_digest(group)
            digest = str(_plain(group.attrs[DIGEST_ATTR]))
        return self._place(tmp, schema, day, digest)

    def _temporary(self, schema: str, day: str) -> Path:
        """Where this process writes the day file of (schema, day) before it is named."""
        (self.folder / schema).mkdir(parents=True, exist_ok=True)
        tmp = self.folder / schema / f".{day}{TEMP_INFIX}{os.getpid()}.h5"
        self._created.add(tmp)
        return tmp

    def _place(self, tmp: Path, schema: str, day: str, digest: str) -> Path:
        """Rename the finished day file `tmp` to its name: the day and its content's digest, so a replaced group is a
        new file and the same content the same name."""
        final = self.folder / schema / f"{day}-{digest[:16]}.h5"
        if not final.exists():
            self._created.add(final)
        os.replace(tmp, final)
        self._created.discard(tmp)
        return final


@dataclass
class ColumnHashes:
    """A column's share of its group's digest: its dtype, its shape and the sha256 of each block of `CHUNK_ROWS`
    rows (C order; the last block may be shorter), gathered as a writer writes the column block by block."""

    dtype: np.dtype
    tail: tuple[int, ...]
    """The shape after the row axis (`(10,)` for a book column)."""
    rows: int = 0
    blocks: list[bytes] = field(default_factory=list)

    @classmethod
    def of(cls, values: np.ndarray) -> ColumnHashes:
        """The hashes of a whole column."""
        out = cls(values.dtype, tuple(int(k) for k in values.shape[1:]))
        for at in range(0, values.shape[0], CHUNK_ROWS):
            out.add(values[at : at + CHUNK_ROWS])
        return out

    def add(self, block: np.ndarray) -> None:
        """Append the next block of rows."""
        self.add_digest(hashlib.sha256(np.ascontiguousarray(block)).digest(), block.shape[0])

    def add_digest(self, digest: bytes, rows: int) -> None:
        """Append the next block of `rows` rows by its sha256 (where the writer has it already)."""
        self.blocks.append(digest)
        self.rows += rows

    def header(self, name: str) -> bytes:
        """What the digest takes of the column `name` before its block hashes: its name, dtype and shape."""
        return f"|{name}|{self.dtype.str}|{(self.rows, *self.tail)}|".encode()


def digest_of(contract: str, hashes: Mapping[str, ColumnHashes]) -> str:
    """sha256 (hex) of a (schema, day) group's content from its columns' block hashes (`group_digest`)."""
    h = hashlib.sha256(f"contract={contract}".encode())
    for name in sorted(hashes):
        h.update(hashes[name].header(name) + b"".join(hashes[name].blocks))
    return h.hexdigest()


def group_digest(group: h5py.Group) -> str:
    """sha256 (hex) of a (schema, day) group's content: its contract, then each dataset (by name) with its dtype,
    shape and the sha256 of each block of `CHUNK_ROWS` rows of its values (C order). The same rows give the same
    digest however they were chunked or compressed (LZF's output is not repeatable), and any change of a row
    changes it. A writer computes it from the rows it writes (`ColumnHashes`, `digest_of`), without reading the day
    back; this reads the group `CHUNK_ROWS` rows at a time. (Stores written before 2026-12-03 hashed each column's
    values whole instead of by block: their groups keep the digest attr they were written with, a name that only
    has to differ for different content.)"""
    hashes = {}
    for name in group:
        ds = group[name]
        hashes[name] = ColumnHashes(ds.dtype, tuple(int(k) for k in ds.shape[1:]))
        for at in range(0, ds.shape[0], CHUNK_ROWS):
            hashes[name].add(ds[at : at + CHUNK_ROWS])
    return digest_of(str(_plain(group.attrs.get("contract"))), hashes)


def create_column(
    group: h5py.Group,
    name: str,
    shape: tuple[int, ...],
    dtype: np.dtype,
    *,
    data: np.ndarray | None = None,
    compression: str = DEFAULT_COMPRESSION,
) -> h5py.Dataset:
    """A day's column as the layout stores it: chunks of `CHUNK_ROWS` rows (fewer for a shorter column), compressed
    as `compression` says (`COMPRESSIONS`), prices with their `price_scale` attr."""
    n = shape[0]
    opts = {"chunks": (min(n, CHUNK_ROWS), *shape[1:]), **COMPRESSIONS[compression]} if n else {}
    ds = group.create_dataset(name, shape=shape, dtype=dtype, data=data, **opts)
    if name in PRICE_FIELDS:
        ds.attrs["price_scale"] = PRICE_SCALE
    return ds


class MarketStore:
    """Read side of a store: instrument, root attrs, the days per schema, validated days."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if self.path.is_dir():
            raise InputError(self.path, "is a folder, not a market store file")
        if not self.path.is_file():
            raise InputError(self.path, "no such market store (write one with `fox data synth` or `fox data import`)")
        try:
            self._file = h5py.File(self.path, "r")
        except OSError:
            raise InputError(self.path, "not an HDF5 file") from None
        try:
            version = self._file.attrs.get("layout_version")
            if version not in (LAYOUT_VERSION, SINGLE_FILE_LAYOUT):
                raise InputError(
                    self.path,
                    f"store layout version {version} is not {LAYOUT_VERSION} (day files) or {SINGLE_FILE_LAYOUT} "
                    "(one file) (re-import or regenerate it)",
                )
            self.instrument = _read_instrument(self._file, self.path)
        except InputError:
            self._file.close()
            raise
        self.attrs: dict = {k: _plain(v) for k, v in self._file.attrs.items() if k not in RESERVED_ATTRS}

    def __enter__(self) -> MarketStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def days(self, schema: str | None = None) -> list[str]:
        """Trading days (sorted YYYY-MM-DD) holding `schema`, or any schema when None."""
        names = [schema] if schema is not None else list(SCHEMAS)
        found: set[str] = set()
        for name in names:
            if name in self._file:
                found.update(self._file[name].keys())
        return sorted(found)

    def has(self, schema: str) -> bool:
        return schema in self._file and len(self._file[schema]) > 0

    def read_day(self, day: str, schemas: Sequence[str] = SCHEMAS) -> MarketDay:
        """The requested schemas of `day` (absent ones are None), validated, with the day's contract."""
        unknown = [s for s in schemas if s not in SCHEMAS]
        if unknown:
            raise ValueError(f"unknown schemas {unknown}; the store holds {list(SCHEMAS)}")
        if day not in self.days():
            raise InputError(self.path, f"no trading day {day} in the store (it holds {_span(self.days())})")
        out = MarketDay(day, contract=self.contract(day))
        for schema in schemas:
            if day in self._file.get(schema, {}):
                setattr(out, schema, _read_schema(self._file, schema, day, self.path))
        return validate_day(out, self.instrument, self.path)

    def contract(self, day: str) -> str:
        """The contract `day`'s rows are from; every schema of the day must name the same one."""
        named = {schema: _contract_of(self._file, schema, day, self.path) for schema in self._schemas_of(day)}
        if len(set(named.values())) > 1:
            which = ", ".join(f"{s} {c}" for s, c in named.items())
            group = f"/{list(named)[-1]}/{day}"
            raise InputError(self.path, f"the day's schemas come from different contracts ({which})", group=group)
        return next(iter(named.values()))

    def day_digest(self, day: str) -> str:
        """sha256 (hex) naming `day`'s content: of each of its schema groups' digests (the `digest` attr; for a
        group written before digests, `group_digest` computed here: one read of its rows)."""
        h = hashlib.sha256()
        for schema in self._schemas_of(day):
            group = self.group(schema, day)
            digest = group.attrs.get(DIGEST_ATTR)
            h.update(f"{schema}={group_digest(group) if digest is None else _plain(digest)};".encode())
        return h.hexdigest()

    def undigested(self) -> list[str]:
        """The groups (`/{schema}/{day}`) without a digest attr: a single-file store written before digests existed
        (the attrs of each group are read, never its rows)."""
        return [f"/{s}/{d}" for s, d in _groups(self._file) if DIGEST_ATTR not in self.group(s, d).attrs]

    def group(self, schema: str, day: str) -> h5py.Group:
        """The (schema, day) group, through its link; a day file missing or not holding it is an `InputError`
        naming that file."""
        return _open_group(self._file, schema, day, self.path)

    def day_file(self, schema: str, day: str) -> Path | None:
        """The day file the (schema, day) group's link names, or None for a group inside the store file (layout 2)."""
        link = self._file[schema].get(day, getlink=True)
        return self.path.parent / link.filename if isinstance(link, h5py.ExternalLink) else None

    def contracts(self) -> dict[str, str]:
        """The contract of every trading day, in day order."""
        return {day: self.contract(day) for day in self.days()}

    @property
    def file(self) -> h5py.File:
        """The open root file (read-only): each group is reached through it, in a day file or (layout 2) in it."""
        return self._file

    def close(self) -> None:
        self._file.close()

    def _schemas_of(self, day: str) -> list[str]:
        return [schema for schema in SCHEMAS if day in self._file.get(schema, {})]


def store_bytes(path: str | Path) -> int:
    """Bytes on disk of the store at `path`: its root file and the day files it links (what a copy of it takes)."""
    with MarketStore(path) as store:
        files = {store.day_file(schema, day) for schema, day in _groups(store.file)} - {None}
    return Path(path).stat().st_size + sum(file.stat().st_size for file in files)


def require_schemas(
    path: str | Path, schemas: Sequence[str] = MANDATORY_SCHEMAS, days: Sequence[str] | None = None
) -> None:
    """Raise `MissingDataError` unless every trading day of the store (or each of `days`) has all `schemas`."""
    with MarketStore(path) as store:
        all_days = store.days() if days is None else list(days)
        problems = []
        for schema in schemas:
            have = set(store.days(schema))
            lacking = [d for d in all_days if d not in have]
            if not have:
                problems.append((schema, f"no {schema} data"))
            elif lacking:
                message = f"no {schema} data on {len(lacking)} of {len(all_days)} days (first {lacking[0]})"
                problems.append((schema, message))
    if problems:
        how = "; ".join(
            f"{msg} (add {IMPORT_HINT[s]} with `fox data import FILES... --out {path}`)" for s, msg in problems
        )
        raise MissingDataError(f"{path}: {how}. Training needs MBP-10 book snapshots and trades on every day.")


@contextlib.contextmanager
def _locked(folder: Path, store: Path) -> Iterator[None]:
    """Hold the lock file of `store`'s day folder (made if need be) for this writer: a second writer is refused, as
    the day files it writes before its commit are not linked, and this one's sweep would delete them."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise OutputError(f"{store}: cannot write its day folder {folder} ({e.strerror or e})") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise OutputError(f"{store}: another process is writing this store; run again when it ends") from None
        yield
    finally:
        os.close(fd)


def _remove_if_empty(folder: Path) -> None:
    """Remove the day folder of a failed write if it holds no day file (a new store, or a single-file one)."""
    for schema in SCHEMAS:
        with contextlib.suppress(OSError):
            (folder / schema).rmdir()
    with contextlib.suppress(OSError):
        if [p.name for p in folder.iterdir()] == [LOCK_NAME]:
            (folder / LOCK_NAME).unlink()
            folder.rmdir()


def _sweep(folder: Path, linked: set[Path]) -> None:
    """Delete the files of the day folder that the store's root does not link (replaced groups, the leftovers of a
    killed write); one that cannot be deleted only costs its space."""
    for schema in SCHEMAS:
        if (folder / schema).is_dir():
            for file in (folder / schema).iterdir():
                if file.resolve() not in linked:
                    with contextlib.suppress(OSError):
                        file.unlink()


@contextlib.contextmanager
def _store_to_extend(
    path: Path, instrument: Instrument, check_day: Callable[[MarketStore, str], object]
) -> Iterator[MarketStore]:
    """The existing store, open, after checking its instrument and that each group carries its digest (the record
    that it was validated when written; a day of a single-file store without one is validated now)."""
    with MarketStore(path) as old:
        _check_same_instrument(path, old.instrument, instrument)
        unrecorded = set()
        for schema, day in _groups(old.file):
            if DIGEST_ATTR in old.group(schema, day).attrs:
                continue
            file = old.day_file(schema, day)
            if file is not None:
                raise InputError(
                    file,
                    "the day file has no digest attr (each is written with one), so the store is not extended; "
                    "restore the file, or write the store afresh",
                    group=f"/{schema}/{day}",
                    field=DIGEST_ATTR,
                )
            unrecorded.add(day)
        for day in sorted(unrecorded):
            try:
                check_day(old, day)
            except InputError as e:
                reason = f"{e.reason} (the store fails validation on {day}, so it is not extended; re-import that day)"
                raise InputError(e.path, reason, group=e.group, field=e.field, row=e.row) from None
        yield old


def _merge(writer: StoreWriter, day: MarketDay, contract: str) -> MarketDay:
    """The incoming day joined with what this write (an earlier piece of the day) or the store being extended holds
    for it; kept schemas must be of the incoming day's contract."""
    merged = MarketDay(day.day, contract=contract)
    for schema in SCHEMAS:
        incoming = getattr(day, schema)
        replaced = incoming is not None and (schema, day.day) not in writer.written
        held = None if replaced else writer.held(schema, day.day)
        if held is None:
            setattr(merged, schema, incoming)
            continue
        where, have, before = held
        if have != contract:
            raise InputError(
                where,
                f"the store's {schema} of {day.day} is from {have}, the data being added from {contract}: one "
                f"contract per day (add every schema of the day from {contract})",
                group=f"/{schema}/{day.day}",
                field="contract",
            )
        if incoming is not None:  # a later piece of the day: appended
            added = columns(incoming)
            joined = {k: np.concatenate([v, np.asarray(added[k], dtype=v.dtype)]) for k, v in columns(before).items()}
            before = SCHEMA_TYPES[schema](**joined)
        setattr(merged, schema, before)
    return merged


def _groups(f: h5py.File) -> list[tuple[str, str]]:
    return [(schema, day) for schema in SCHEMAS for day in f.get(schema, {})]


def _open_group(f: h5py.File, schema: str, day: str, path: Path) -> h5py.Group:
    """The (schema, day) group of the store `f` (at `path`), through its link to a day file: one missing, or not
    holding the group, is an `InputError` naming it."""
    name = f"/{schema}/{day}"
    try:
        return f[name]
    except KeyError:
        link = f.get(name, getlink=True)
        if not isinstance(link, h5py.ExternalLink):
            raise
    file = path.parent / link.filename
    if file.exists():
        raise InputError(file, f"the store's day file does not hold {link.path}", group=name)
    folder = day_folder(path).name
    raise InputError(file, f"the store's day file is missing (the {folder} folder travels with the store)", group=name)


def _contract_of(f: h5py.File, schema: str, day: str, path: Path) -> str:
    value = _open_group(f, schema, day, path).attrs.get("contract")
    if value is None:
        raise InputError(path, "missing attribute", group=f"/{schema}/{day}", field="contract")
    return str(_plain(value))


def _read_schema(f: h5py.File, schema: str, day: str, path: Path) -> object:
    group = _open_group(f, schema, day, path)
    cols = {}
    for col in DTYPES[schema]:
        if col not in group:
            raise InputError(path, "missing dataset", group=f"/{schema}/{day}", field=col)
        cols[col] = group[col][()]
    return SCHEMA_TYPES[schema](**cols)


def _write_instrument(f: h5py.File, instrument: Instrument) -> None:
    f.attrs["layout_version"] = LAYOUT_VERSION
    f.attrs["price_scale"] = PRICE_SCALE
    for name in INSTRUMENT_ATTRS:
        f.attrs[name] = getattr(instrument, name)


def _read_instrument(f: h5py.File, path: Path) -> Instrument:
    missing = [n for n in ("price_scale", *INSTRUMENT_ATTRS) if n not in f.attrs]
    if missing:
        raise InputError(path, f"root attributes {missing} are missing", group="/")
    if f.attrs["price_scale"] != PRICE_SCALE:
        message = f"price_scale {f.attrs['price_scale']} is not {PRICE_SCALE}"
        raise InputError(path, message, group="/", field="price_scale")
    instrument = Instrument(**{n: _plain(f.attrs[n]) for n in INSTRUMENT_ATTRS})
    validate_instrument(instrument, path)
    return instrument


def _check_same_instrument(path: Path, have: Instrument, new: Instrument) -> None:
    if have != new:
        diff = ", ".join(
            f"{n} {getattr(have, n)!r} vs {getattr(new, n)!r}"
            for n in INSTRUMENT_ATTRS
            if getattr(have, n) != getattr(new, n)
        )
        raise InputError(path, f"the store holds another instrument than the one being added ({diff})", group="/")


def _plain(value: object) -> object:
    """HDF5 attribute values as plain Python scalars."""
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, np.generic):
        return value.item()
    return value


def _span(days: list[str]) -> str:
    return f"{days[0]} to {days[-1]}" if days else "no days"
