"""The HDF5 market store: one file per market, one group per schema and trading day.

Layout (version 2):
    /                       attrs: layout_version, symbol, tick_size, point_value, price_scale, timezone,
                                   session_open, session_close, day_roll, day_open, calendar, and the writer's own attrs
    /{schema}/{YYYY-MM-DD}/ attr `contract` (the contract the day's rows are from: ESU4, a LOBSTER
                            ticker, the synthetic symbol; one per day, so a continuous series across a
                            roll shows where the contract changes); one dataset per column, dtypes from
                            `schema.DTYPES`; MBP-10 book columns are [n, 10] (`bid_px[:, k]` is
                            Databento's `bid_px_0k`); price datasets carry a `price_scale` attr.
                            Chunked, byte-shuffled and LZF-compressed (h5py only). Attr `digest`
                            (`group_digest`): sha256 of the group's content, set when it is written.

Every day is validated (`validate.validate_day`) before it is written and again when it is read. Writes
go to a temporary file that is renamed over the target at the end, so an interrupted or rejected write
leaves the previous store untouched; the file is written afresh each time, so it does not grow with
re-imports of the same days.

A day's digest (`MarketStore.day_digest`) names its content: the per-day caches (the validated days of
`market/select.py`, the features of `features/cache.py`) are keyed by it, so a rewritten day misses them.
Stores written before digests existed have groups without the attr: their digest is computed from the stored
rows each time it is asked for (one read of the day, without validation), and a rewrite
(`fox data import --extend`) adds the attr to the groups it copies.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path

import h5py
import numpy as np

from fox_numba.errors import InputError, MissingDataError
from fox_numba.io import atomic_path
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

LAYOUT_VERSION = 2
CHUNK_ROWS = 1 << 14
"""Rows per chunk (an MBP-10 price chunk is 16384 x 10 x 8 B = 1.3 MB before compression)."""

COMPRESSION = {"compression": "lzf", "shuffle": True}
"""How every chunked column is compressed."""
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


def write_store(
    path: str | Path,
    instrument: Instrument,
    days: Iterable[MarketDay],
    *,
    attrs: Mapping[str, str | int | float] | None = None,
    extend: bool = False,
    progress: Callable[[str], None] | None = None,
) -> Path:
    """Validate and write `days` to the store at `path`; return the path.

    The file is always written afresh: HDF5 does not reclaim the space of a replaced dataset in place,
    so a store rewritten in place grew with every re-import of the same days. With `extend`, every day
    the existing store holds is validated first (a store that fails is refused, naming the day: extending
    it would keep the fault), then its root attrs and the groups this write does not replace are copied
    over unchanged, and each incoming schema of a day replaces that schema of that day (the day's other
    schemas are kept, checked against the new data, and must come from the same contract). Pieces of the
    same schema and day arriving in one call (a day split over two files) are joined in arrival order.
    Each day group records its contract (`MarketDay.contract`, else the instrument's symbol). `attrs` go
    on the root group; their names must not clash with the layout's own.
    """
    with StoreWriter.open(path, instrument, attrs=attrs, extend=extend) as writer:
        for day in days:
            contract = day.contract or instrument.symbol
            merged = _merge(writer.file, writer.old, day, contract, writer.written, writer.path)
            checked = validate_day(merged, instrument, writer.path)
            for schema in day.present():
                writer.write_schema(schema, day.day, getattr(checked, schema), contract)
            if progress is not None:
                rows = ", ".join(f"{s} {n_rows(getattr(checked, s)):,}" for s in day.present())
                progress(f"wrote {day.day}: {rows}")
            del day, merged, checked  # released before `days` makes the next one: one day in memory at a time
    return Path(path)


@dataclass
class StoreWriter:
    """A store being written afresh (`open`): the new file, the store it extends (or None), and the
    (schema, day) groups written so far; groups of the old store not written are copied over at the end."""

    path: Path
    file: h5py.File
    old: MarketStore | None
    written: set[tuple[str, str]] = field(default_factory=set)

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
    ) -> Iterator[StoreWriter]:
        """Write the store at `path` under a temporary name, renamed over it when the block ends without error;
        with `extend` the existing store is validated first (each day by `check_day`, which raises `InputError`)
        and its root attrs and unwritten groups kept."""
        path = Path(path)
        clash = RESERVED_ATTRS & set(attrs or {})
        if clash:
            raise ValueError(f"attrs {sorted(clash)} are reserved by the store layout")
        validate_instrument(instrument, path)
        with contextlib.ExitStack() as stack:
            extending = extend and path.exists()
            old = stack.enter_context(_store_to_extend(path, instrument, check_day)) if extending else None
            tmp = stack.enter_context(atomic_path(path))
            with h5py.File(tmp, "w") as f:
                _write_instrument(f, instrument)
                if old is not None:
                    for key, value in old.file.attrs.items():
                        if key not in RESERVED_ATTRS:
                            f.attrs[key] = value
                for key, value in (attrs or {}).items():
                    f.attrs[key] = value
                writer = cls(path, f, old)
                yield writer
                if old is not None:
                    for schema, day_name in _groups(old.file):
                        if (schema, day_name) not in writer.written:
                            f.copy(old.file[f"{schema}/{day_name}"], f.require_group(schema), name=day_name)
                            copied = f[f"{schema}/{day_name}"]
                            if DIGEST_ATTR not in copied.attrs:  # a group written before digests
                                copied.attrs[DIGEST_ATTR] = group_digest(copied)

    def day_group(self, schema: str, day: str, contract: str) -> h5py.Group:
        """The (new, empty) group of `schema` on `day`, recording its contract."""
        name = f"{schema}/{day}"
        if name in self.file:
            del self.file[name]
        group = self.file.require_group(name)
        group.attrs["contract"] = contract
        self.written.add((schema, day))
        return group

    def write_schema(self, schema: str, day: str, record: object, contract: str) -> None:
        group = self.day_group(schema, day, contract)
        for col, values in columns(record).items():
            create_column(group, col, values.shape, values.dtype, data=values)
        self.seal(schema, day)

    def seal(self, schema: str, day: str) -> None:
        """Record the digest of the (schema, day) group once all its columns are written."""
        group = self.file[f"{schema}/{day}"]
        group.attrs[DIGEST_ATTR] = group_digest(group)


def group_digest(group: h5py.Group) -> str:
    """sha256 (hex) of a (schema, day) group's content: its contract, then each dataset (by name) with its dtype,
    shape and values (C order), read `CHUNK_ROWS` rows at a time. The same rows give the same digest however they
    were chunked or compressed (LZF's output is not repeatable), and any change of a row changes it."""
    h = hashlib.sha256(f"contract={_plain(group.attrs.get('contract'))}".encode())
    for name in sorted(group):
        ds = group[name]
        h.update(f"|{name}|{ds.dtype.str}|{ds.shape}|".encode())
        for at in range(0, ds.shape[0], CHUNK_ROWS):
            h.update(np.ascontiguousarray(ds[at : at + CHUNK_ROWS]).tobytes())
    return h.hexdigest()


def create_column(
    group: h5py.Group, name: str, shape: tuple[int, ...], dtype: np.dtype, *, data: np.ndarray | None = None
) -> h5py.Dataset:
    """A day's column as the layout stores it: chunks of `CHUNK_ROWS` rows (fewer for a shorter column), shuffled
    and LZF-compressed, prices with their `price_scale` attr."""
    n = shape[0]
    opts = {"chunks": (min(n, CHUNK_ROWS), *shape[1:]), **COMPRESSION} if n else {}
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
            if version != LAYOUT_VERSION:
                raise InputError(
                    self.path, f"store layout version {version} is not {LAYOUT_VERSION} (re-import or regenerate it)"
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
            group = self._file[f"{schema}/{day}"]
            digest = group.attrs.get(DIGEST_ATTR)
            h.update(f"{schema}={group_digest(group) if digest is None else _plain(digest)};".encode())
        return h.hexdigest()

    def contracts(self) -> dict[str, str]:
        """The contract of every trading day, in day order."""
        return {day: self.contract(day) for day in self.days()}

    @property
    def file(self) -> h5py.File:
        """The open HDF5 file (read-only), for copying groups unchanged into a rewritten store."""
        return self._file

    def close(self) -> None:
        self._file.close()

    def _schemas_of(self, day: str) -> list[str]:
        return [schema for schema in SCHEMAS if day in self._file.get(schema, {})]


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
def _store_to_extend(
    path: Path, instrument: Instrument, check_day: Callable[[MarketStore, str], object]
) -> Iterator[MarketStore]:
    """The existing store, open, after checking its instrument and validating every day it holds."""
    with MarketStore(path) as old:
        _check_same_instrument(path, old.instrument, instrument)
        for day in old.days():
            try:
                check_day(old, day)
            except InputError as e:
                reason = f"{e.reason} (the store fails validation on {day}, so it is not extended; re-import that day)"
                raise InputError(e.path, reason, group=e.group, field=e.field, row=e.row) from None
        yield old


def _merge(
    f: h5py.File, old: MarketStore | None, day: MarketDay, contract: str, written: set[tuple[str, str]], path: Path
) -> MarketDay:
    """The incoming day joined with what this write (`f`) or the store being extended (`old`) holds for it;
    kept schemas must be of the incoming day's contract."""
    merged = MarketDay(day.day, contract=contract)
    for schema in SCHEMAS:
        incoming = getattr(day, schema)
        if (schema, day.day) in written:
            source, where = f, path
        elif old is not None and day.day in old.file.get(schema, {}):
            source, where = old.file, old.path
        else:
            source = where = None
        if source is not None and (incoming is None or (schema, day.day) in written):
            have = _contract_of(source, schema, day.day, where)
            if have != contract:
                raise InputError(
                    where,
                    f"the store's {schema} of {day.day} is from {have}, the data being added from {contract}: one "
                    f"contract per day (add every schema of the day from {contract})",
                    group=f"/{schema}/{day.day}",
                    field="contract",
                )
        if incoming is None:
            if source is not None:
                setattr(merged, schema, _read_schema(source, schema, day.day, where))
        elif (schema, day.day) in written:
            before = columns(_read_schema(f, schema, day.day, path))
            joined = {
                k: np.concatenate([before[k], np.asarray(v, dtype=before[k].dtype)])
                for k, v in columns(incoming).items()
            }
            setattr(merged, schema, SCHEMA_TYPES[schema](**joined))
        else:
            setattr(merged, schema, incoming)
    return merged


def _groups(f: h5py.File) -> list[tuple[str, str]]:
    return [(schema, day) for schema in SCHEMAS for day in f.get(schema, {})]


def _contract_of(f: h5py.File, schema: str, day: str, path: Path) -> str:
    value = f[f"{schema}/{day}"].attrs.get("contract")
    if value is None:
        raise InputError(path, "missing attribute", group=f"/{schema}/{day}", field="contract")
    return str(_plain(value))


def _read_schema(f: h5py.File, schema: str, day: str, path: Path) -> object:
    group = f[f"{schema}/{day}"]
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
