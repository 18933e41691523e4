"""The per-day feature cache (features/cache.py): features from a cold cache, a warm one and none are the same bit
for bit as `build_features` on the days read from the store; a warm cache reads no book row; a damaged,
mismatched or altered file, a changed day and a changed setting are rebuilt; a store without digests works; worker
processes (market.read_workers) build the missing days into the cache with the same bits, and a day they cannot build
is refused with this process's own error."""

import dataclasses
import logging
import shutil

import h5py
import numpy as np
import pytest

from fox_numba.config import FoxConfig
from fox_numba.errors import InputError
from fox_numba.features.build import build_features
from fox_numba.features import stored
from fox_numba.features.cache import SUFFIX, feature_key
from fox_numba.features.names import TW_IMBALANCE_COLUMNS
from fox_numba.market import staging
from fox_numba.market.schema import SCHEMAS, Instrument
from fox_numba.market.select import CACHE_SUFFIX, MarketSelection, select_market
from fox_numba.market.store import DIGEST_ATTR, MarketStore, write_store
from fox_numba.walkforward.driver import load_features


@pytest.fixture
def store(four_day_market, tmp_path):
    m = four_day_market
    return write_store(tmp_path / "es.h5", m.instrument, m.days[:2])


def config(store, cache="auto", ofi_levels=10, tw_imbalance=False, read_workers=1) -> FoxConfig:
    cfg = FoxConfig()
    cfg.market = dataclasses.replace(cfg.market, store=str(store), cache=cache, read_workers=read_workers)
    cfg.features = dataclasses.replace(cfg.features, ofi_levels=ofi_levels, tw_imbalance=tw_imbalance)
    return cfg


def expected(store, cfg):
    """The features built straight from the days read from the store (no selection, no cache)."""
    with MarketStore(store) as s:
        return build_features([s.read_day(d) for d in s.days()], s.instrument, cfg.features, session=cfg.market.session)


def load(cfg):
    return load_features(cfg, select_market(cfg.market))


def assert_identical(a, b):
    assert a.days == b.days and a.names == b.names and a.session == b.session and a.notes == b.notes
    pairs = [("values", a.values, b.values)]
    pairs += [(f.name, getattr(a.raw, f.name), getattr(b.raw, f.name)) for f in dataclasses.fields(a.raw)]
    for name, x, y in pairs:
        x, y = np.asarray(x), np.asarray(y)
        assert (x.dtype, x.shape, x.tobytes()) == (y.dtype, y.shape, y.tobytes()), name


@pytest.fixture
def book_reads(monkeypatch):
    """The days whose book is read in full: by `MarketStore.read_day` whole, or a chunk at a time by
    `staging.validated_chunks` (the feature build's read, `features/stored.py`, and `check_stored_day`'s)."""
    reads = []
    original, chunks = MarketStore.read_day, staging.validated_chunks

    def read_day(self, day, schemas=SCHEMAS):
        if "mbp10" in schemas:
            reads.append(day)
        return original(self, day, schemas)

    def validated_chunks(store, day, rows=None):
        reads.append(day)
        return chunks(store, day, rows)

    monkeypatch.setattr(MarketStore, "read_day", read_day)
    monkeypatch.setattr(staging, "validated_chunks", validated_chunks)
    monkeypatch.setattr(stored, "validated_chunks", validated_chunks)
    return reads


def test_cold_warm_and_no_cache_give_the_same_features_and_warm_reads_no_book(store, book_reads):
    cfg = config(store)
    want = expected(store, cfg)
    book_reads.clear()
    assert_identical(load(cfg), want)  # cold: validated and built, both recorded beside the store
    folder = store.with_name(store.name + CACHE_SUFFIX)
    assert len(list(folder.glob(f"*{SUFFIX}"))) == 2 and book_reads == [*want.days, *want.days]
    book_reads.clear()
    assert_identical(load(cfg), want)  # warm
    bare = MarketSelection(store, want.days, want.session)  # as `fox evaluate` makes one: digests asked of the store
    assert_identical(load_features(cfg, bare), want)
    assert book_reads == []
    off = config(store, cache="off")
    shutil.rmtree(folder)
    assert_identical(load(off), want)
    assert not folder.exists()


def test_a_deferred_selection_reads_each_day_once_and_validates_it_on_that_read(store, book_reads):
    """select_market(defer=True) reads bars only; the feature build's one full read of each day validates and
    records it: a cold run reads every book once (twice without the deferral, the test above); cached features
    without a record cost one read; a day that fails validation is refused there with inspect's words."""
    cfg = config(store)
    want = expected(store, cfg)
    book_reads.clear()
    cold = select_market(cfg.market, defer=True)
    assert cold.unchecked == want.days and book_reads == []
    assert_identical(load_features(cfg, cold), want)
    assert book_reads == list(want.days)
    book_reads.clear()
    warm = select_market(cfg.market, defer=True)
    assert warm.unchecked == () and warm.digests == cold.digests
    assert_identical(load_features(cfg, warm), want) and book_reads == []
    folder = store.with_name(store.name + CACHE_SUFFIX)
    for record in folder.glob("*.valid"):
        record.unlink()
    again = select_market(cfg.market, defer=True)
    assert again.unchecked == want.days
    assert_identical(load_features(cfg, again), want)
    assert book_reads == list(want.days)  # features cached, each day read once to validate it
    with h5py.File(store, "r+") as f:
        day = f["mbp10"][want.days[1]]
        ts = day["ts_event"]
        ts[100], ts[101] = ts[101], ts[100]
    bad = select_market(config(store, cache="off").market, defer=True)
    with pytest.raises(InputError, match=f"group /mbp10/{want.days[1]}, field ts_event, row 101"):
        load_features(config(store, cache="off"), bad)


def test_a_damaged_mismatched_or_altered_file_is_rebuilt_and_logged(store, tmp_path, caplog, book_reads):
    cfg = config(store, cache=str(tmp_path / "cache"))
    want = expected(store, cfg)
    load(cfg)
    first, second = sorted((tmp_path / "cache").glob(f"*{SUFFIX}"))
    data = bytearray(first.read_bytes())
    data[len(data) // 2] ^= 0xFF  # damaged
    first.write_bytes(bytes(data))
    with np.load(second) as npz:
        arrays = {k: npz[k] for k in npz.files}
    arrays["values"][3, 2] += 1e-9  # altered, its recorded checksum kept
    with open(second, "wb") as fh:
        np.savez(fh, **arrays)
    book_reads.clear()
    with caplog.at_level(logging.WARNING, logger="fox_numba.features.cache"):
        assert_identical(load(cfg), want)
    assert book_reads == list(want.days)
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 2 and str(first) in logged[0] and "does not load" in logged[0]
    assert str(second) in logged[1] and "checksum" in logged[1]
    shutil.copy(second, first)  # another day's file under this day's name
    caplog.clear()
    book_reads.clear()
    with caplog.at_level(logging.WARNING, logger="fox_numba.features.cache"):
        assert_identical(load(cfg), want)
    assert book_reads == [want.days[0]] and "another day digest" in caplog.records[0].getMessage()
    caplog.clear()
    assert_identical(load(cfg), want)  # all rebuilt: nothing logged
    assert caplog.records == []


def test_a_changed_setting_or_day_misses_the_cache(four_day_market, store, tmp_path, book_reads):
    cfg = config(store, cache=str(tmp_path / "cache"))
    load(cfg)
    three = config(store, cache=str(tmp_path / "cache"), ofi_levels=3)
    want = expected(store, three)
    assert not np.array_equal(want.values, expected(store, cfg).values)
    book_reads.clear()
    assert_identical(load(three), want)
    assert book_reads == list(want.days)  # validated already (same store version): read once, to build
    assert len(list((tmp_path / "cache").glob(f"*{SUFFIX}"))) == 4
    m = four_day_market
    sizes = m.days[1].mbp10.bid_sz.copy()
    sizes[len(sizes) // 2, 1] += 7
    write_store(store, m.instrument, [m.days[0], dataclasses.replace(m.days[1], mbp10=dataclasses.replace(
        m.days[1].mbp10, bid_sz=sizes))])  # fmt: skip
    want = expected(store, cfg)
    book_reads.clear()
    assert_identical(load(cfg), want)
    assert book_reads == [want.days[1], want.days[1]]  # a new version of day 2: validated and built


PLAIN_KEY = "899e8b6ab79bfbc74327645061c06c1a0131b4fe1de4acf1b7a566aa4e77d7a0"
"""feature_key of the default features without the time-weighted imbalance, regular session, default instrument:
the default key from before features.tw_imbalance existed."""


def test_the_time_weighted_imbalance_misses_a_cache_without_its_columns(store, tmp_path, book_reads):
    """features.tw_imbalance enters the key (through the day's column names): a day cached without its columns is
    never read for a run with them, nor the reverse; each has its own files, warm alike; without them the key is the
    one from before the field existed, so a cache made then still serves a run with the block off."""
    assert feature_key(config(store).features, "regular", Instrument()) == PLAIN_KEY
    assert feature_key(FoxConfig().features, "regular", Instrument()) != PLAIN_KEY  # the block is on by default
    folder = tmp_path / "cache"
    off, on = config(store, cache=str(folder)), config(store, cache=str(folder), tw_imbalance=True)
    assert feature_key(on.features, "regular", Instrument()) != PLAIN_KEY
    plain = load(off)
    book_reads.clear()
    wide = load(on)
    assert book_reads == list(wide.days)  # the cached days without the columns missed: built afresh
    assert_identical(wide, expected(store, on))
    assert wide.names[32:] == TW_IMBALANCE_COLUMNS and wide.values.shape == (plain.values.shape[0], 44)
    np.testing.assert_array_equal(wide.values[:, :32], plain.values)
    assert len(list(folder.glob(f"*{SUFFIX}"))) == 4
    book_reads.clear()
    assert_identical(load(on), wide)
    assert_identical(load(off), plain)
    assert book_reads == []


def test_a_store_without_digests_uses_and_fills_the_cache(store, tmp_path, book_reads):
    cfg = config(store, cache=str(tmp_path / "cache"))
    want = expected(store, cfg)
    load(cfg)
    with h5py.File(store, "r+") as f:
        for schema in SCHEMAS:
            for day in f[schema]:
                del f[f"{schema}/{day}"].attrs[DIGEST_ATTR]
    book_reads.clear()
    assert_identical(load(cfg), want)  # the digests computed from the rows are those recorded
    assert book_reads == []
    shutil.rmtree(tmp_path / "cache")
    assert_identical(load(cfg), want)
    assert_identical(load(cfg), want)


def test_a_cache_folder_that_cannot_be_written_is_logged_and_costs_only_the_reads(store, tmp_path, caplog):
    cfg = config(store, cache=str(tmp_path / "a_file"))
    (tmp_path / "a_file").write_text("not a folder")
    with caplog.at_level(logging.WARNING):
        assert_identical(load(cfg), expected(store, cfg))
    logged = [r.getMessage() for r in caplog.records]
    assert sum("validated-day record not written" in m for m in logged) == 2
    assert sum("feature cache file not written" in m for m in logged) == 2


@pytest.fixture
def four_days(four_day_market, tmp_path):
    m = four_day_market
    return write_store(tmp_path / "four.h5", m.instrument, m.days)


def test_worker_processes_build_the_missing_days_with_the_same_bits(four_days, book_reads):
    """Two workers: this process reads only the first day (the workers' reads happen in theirs), every day is cached
    and recorded as validated, and the features are `build_features`' bit for bit, with the cache off too."""
    cfg = config(four_days, read_workers=2)
    want = expected(four_days, cfg)
    book_reads.clear()
    cold = select_market(cfg.market, defer=True)
    assert_identical(load_features(cfg, cold), want)
    assert book_reads == [want.days[0]]
    folder = four_days.with_name(four_days.name + CACHE_SUFFIX)
    assert len(list(folder.glob(f"*{SUFFIX}"))) == 4 and len(list(folder.glob("*.valid"))) == 4
    book_reads.clear()
    warm = select_market(cfg.market, defer=True)
    assert warm.unchecked == () and book_reads == []
    assert_identical(load_features(cfg, warm), want) and book_reads == []
    off = config(four_days, cache="off", read_workers=2)  # no cache: the workers' features come back to this process
    assert_identical(load(off), want) and book_reads == [want.days[0]]


def test_a_day_no_worker_can_build_is_refused_with_this_process_s_error(four_days, book_reads):
    cfg = config(four_days, read_workers=3)
    days = MarketStore(four_days).days()
    with h5py.File(four_days, "r+") as f:
        ts = f["mbp10"][days[2]]["ts_event"]
        ts[100], ts[101] = ts[101], ts[100]
    book_reads.clear()
    with pytest.raises(InputError, match=f"group /mbp10/{days[2]}, field ts_event, row 101"):
        load_features(cfg, select_market(cfg.market, defer=True))
    assert book_reads == [days[0], days[2]]  # the first day here, then the failed one read again here
    folder = four_days.with_name(four_days.name + CACHE_SUFFIX)
    assert sorted(p.name.split(".")[0] for p in folder.glob(f"*{SUFFIX}")) == [days[0], days[1]]  # those handed out
