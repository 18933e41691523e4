"""A day's content digest: written with every (schema, day) group, the same for the same rows however they were
written, changed by any row, computed from the stored bytes for a store written before digests, and added to the
groups of such a store when it is extended; and the validated-day records that let `select_market` skip a day it
has checked."""

import dataclasses
import hashlib

import h5py
import numpy as np

from fox_numba.config import MarketConfig
from fox_numba.market.importer import import_market
from fox_numba.market import staging
from fox_numba.market.schema import SCHEMAS, columns
from fox_numba.market.select import select_market, validated_record
from fox_numba.market.store import CHUNK_ROWS, DIGEST_ATTR, MarketStore, group_digest, write_store
from test_import_staging import DAY, day_files
from test_store import single_file


def _independent_digest(contract: str, record: object) -> str:
    """`group_digest` written out from the day's columns as read (whole arrays cut into blocks of CHUNK_ROWS rows here,
    not by the store's writers or its chunked read)."""
    h = hashlib.sha256(f"contract={contract}".encode())
    for name, values in sorted(columns(record).items()):
        blocks = np.array_split(values, range(CHUNK_ROWS, len(values), CHUNK_ROWS)) if len(values) else []
        h.update(f"|{name}|{values.dtype.str}|{values.shape}|".encode())
        h.update(b"".join(hashlib.sha256(np.ascontiguousarray(b).tobytes()).digest() for b in blocks))
    return h.hexdigest()


def _check_digests(path) -> None:
    """Every group's `digest` attr is the digest of the rows it holds."""
    with MarketStore(path) as store, h5py.File(path) as f:
        for day in store.days():
            market_day = store.read_day(day)
            for schema in SCHEMAS:
                group = f[f"{schema}/{day}"]
                expected = _independent_digest(market_day.contract, getattr(market_day, schema))
                assert group.attrs[DIGEST_ATTR] == expected == group_digest(group)


def test_every_group_records_the_digest_of_its_rows(four_day_market, tmp_path):
    m = four_day_market
    _check_digests(write_store(tmp_path / "a.h5", m.instrument, m.days[:2]))


def test_the_same_rows_give_the_same_digest_and_a_changed_row_another(four_day_market, tmp_path):
    m = four_day_market
    a = write_store(tmp_path / "a.h5", m.instrument, m.days[:2])
    b = write_store(tmp_path / "b.h5", m.instrument, m.days[:2][::-1])
    book = m.days[1].mbp10
    sizes = book.bid_sz.copy()
    sizes[len(sizes) // 2, 3] += 1
    changed = dataclasses.replace(m.days[1], mbp10=dataclasses.replace(book, bid_sz=sizes))
    c = write_store(tmp_path / "c.h5", m.instrument, [m.days[0], changed])
    with MarketStore(a) as sa, MarketStore(b) as sb, MarketStore(c) as sc:
        d0, d1 = sa.days()
        assert sa.day_digest(d0) == sb.day_digest(d0) == sc.day_digest(d0)
        assert sa.day_digest(d1) == sb.day_digest(d1) != sc.day_digest(d1)
        assert sa.day_digest(d0) != sa.day_digest(d1)


def test_a_store_without_digests_gets_the_same_digest_from_its_rows_and_a_rewrite_adds_them(four_day_market, tmp_path):
    m = four_day_market
    path = write_store(tmp_path / "a.h5", m.instrument, m.days[:2])
    with MarketStore(path) as store:
        before = {d: store.day_digest(d) for d in store.days()}
    single_file(path, digests=False)  # the store as written before digests: no `digest` attr on any group
    with MarketStore(path) as store:
        assert {d: store.day_digest(d) for d in store.days()} == before
    write_store(path, m.instrument, [m.days[2]], extend=True)  # copies the two old days' groups
    _check_digests(path)
    with MarketStore(path) as store:
        assert {d: store.day_digest(d) for d in list(before)} == before


def test_an_imported_day_records_the_digest_of_the_same_rows_written_whole(tmp_path):
    """The staged import (`staging.commit_day`, a day of two store chunks) seals the groups it copies: the digest
    is the one `write_store` gives the same rows read back."""
    files, _, _ = day_files(tmp_path, 2 * 16384 + 100, 20_001)
    import_market(files, tmp_path / "es.h5")
    _check_digests(tmp_path / "es.h5")
    with MarketStore(tmp_path / "es.h5") as store:
        imported, day, instrument = store.day_digest(DAY), store.read_day(DAY), store.instrument
    with MarketStore(write_store(tmp_path / "whole.h5", instrument, [day])) as whole:
        assert whole.day_digest(DAY) == imported


def test_a_day_is_validated_once_per_digest(four_day_market, tmp_path, monkeypatch):
    """A day is read in full (a chunk at a time, `staging.validated_chunks`) until its validation is recorded; after
    that, only its bars."""
    m = four_day_market
    path = write_store(tmp_path / "a.h5", m.instrument, m.days[:2])
    cfg = MarketConfig(store=str(path), cache=str(tmp_path / "cache"))
    reads = []
    original, chunks = MarketStore.read_day, staging.validated_chunks
    monkeypatch.setattr(MarketStore, "read_day", lambda self, day, schemas=SCHEMAS: reads.append(tuple(schemas))
                        or original(self, day, schemas))  # fmt: skip
    monkeypatch.setattr(staging, "validated_chunks", lambda store, day, rows=None: reads.append("full")
                        or chunks(store, day, rows))  # fmt: skip
    first = select_market(cfg)
    assert reads == ["full", ("bars",), "full", ("bars",)]
    with MarketStore(path) as store:
        assert first.digests == tuple(store.day_digest(d) for d in first.days)
        assert all(validated_record(tmp_path / "cache", d, g, store.instrument).is_file()
                   for d, g in zip(first.days, first.digests))  # fmt: skip
    reads.clear()
    assert select_market(cfg) == first
    assert reads == [("bars",), ("bars",)]  # no book, no trades
    reads.clear()
    assert select_market(dataclasses.replace(cfg, cache="off")).digests == ()
    assert reads == ["full", ("bars",), "full", ("bars",)]
    reads.clear()
    sizes = m.days[1].mbp10.bid_sz.copy()
    sizes[0, 0] += 1
    changed = dataclasses.replace(m.days[1], mbp10=dataclasses.replace(m.days[1].mbp10, bid_sz=sizes))
    write_store(path, m.instrument, [m.days[0], changed])  # a new store version: day 2 is checked again
    select_market(cfg)
    assert reads == [("bars",), "full", ("bars",)]
