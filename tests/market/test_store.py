"""The HDF5 store: layout, round trip, extend, atomic writes, validation on read, missing schemas."""

import dataclasses
import os
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from fox_numba.errors import InputError, MissingDataError, OutputError
from fox_numba.market.bars import bars_from_trades
from fox_numba.market.calendar import session_bounds
from fox_numba.market.schema import (
    DTYPES,
    NS_PER_MINUTE,
    PRICE_SCALE,
    SCHEMAS,
    Instrument,
    MarketDay,
    Mbp10,
    Trades,
    columns,
    to_fixed,
)
from fox_numba.market.store import (
    DIGEST_ATTR,
    LAYOUT_VERSION,
    LOCK_NAME,
    SINGLE_FILE_LAYOUT,
    MarketStore,
    day_folder,
    require_schemas,
    store_bytes,
    write_store,
)

INST = Instrument()
TICK = INST.tick_fixed


def make_day(day: str, n: int = 30, shift: int = 0) -> MarketDay:
    """A valid day: book every 20 s from the open, a trade 1 us after every third update, bars from trades."""
    ts = (session_bounds(day, INST)[0] + np.arange(n) * 20_000_000_000).astype(np.uint64)
    bid0 = to_fixed(4000.0) + ((np.arange(n) + shift) % 4) * TICK
    depth = np.arange(10) * TICK
    sz = (5 + np.arange(n)[:, None] + np.arange(10) + shift).astype(np.uint32)
    book = Mbp10(ts, bid0[:, None] - depth, bid0[:, None] + TICK + depth, sz, sz + 2, sz // 3 + 1, sz // 2 + 1)
    k = np.arange(0, n, 3)
    trades = Trades(ts[k] + 1000, bid0[k] + TICK, (k % 5 + 1).astype(np.uint32), np.where(k % 2 == 0, 1, -1).astype(np.int8))
    return MarketDay(day, bars_from_trades(trades), book, trades)


def single_file(path: Path, digests: bool = True) -> Path:
    """The store at `path` rewritten in the single-file layout 2, as written before day files (without `digests`: as
    written before digests too), its day folder removed."""
    legacy = path.with_name(path.name + ".legacy")
    with h5py.File(path, "r") as src, h5py.File(legacy, "w") as dst:
        dst.attrs.update(src.attrs)
        dst.attrs["layout_version"] = SINGLE_FILE_LAYOUT
        for schema in src:
            for day in src[schema]:
                dst.copy(src[f"{schema}/{day}"], dst.require_group(schema), name=day)
                if not digests:
                    del dst[f"{schema}/{day}"].attrs[DIGEST_ATTR]
    os.replace(legacy, path)
    shutil.rmtree(day_folder(path), ignore_errors=True)
    return path


def store_files(path: Path) -> dict[str, tuple[int, int]]:
    """(inode, mtime_ns) of every file of the store (its root, its day files), by path relative to its folder."""
    files = [path, *sorted(p for p in day_folder(path).rglob("*") if p.is_file() and p.name != LOCK_NAME)]
    return {str(p.relative_to(path.parent)): (p.stat().st_ino, p.stat().st_mtime_ns) for p in files}


def linked(path: Path) -> set[str]:
    """The day files the store's root links to, relative to its folder."""
    with MarketStore(path) as store:
        return {str(store.day_file(s, d).relative_to(path.parent)) for s in SCHEMAS for d in store.days(s)}


def digests(path: Path) -> dict[str, str]:
    with MarketStore(path) as store:
        return {day: store.day_digest(day) for day in store.days()}


def assert_same(a: MarketDay, b: MarketDay) -> None:
    assert a.day == b.day and a.present() == b.present()
    for schema in a.present():
        for name, values in columns(getattr(a, schema)).items():
            got = columns(getattr(b, schema))[name]
            assert got.dtype == DTYPES[schema][name]
            np.testing.assert_array_equal(got, values, err_msg=f"{schema}.{name}")


def test_round_trip_and_layout(tmp_path):
    days = [make_day("2024-07-02"), make_day("2024-07-03", shift=1)]
    path = write_store(tmp_path / "s.h5", INST, days, attrs={"oracle_ic": 0.05, "seed": 7, "note": "synthetic"})
    with MarketStore(path) as store:
        assert store.instrument == INST
        assert store.attrs == {"oracle_ic": 0.05, "seed": 7, "note": "synthetic"}
        assert store.days() == ["2024-07-02", "2024-07-03"] == store.days("mbp10")
        assert store.has("trades") and store.has("bars")
        for day in days:
            assert_same(day, store.read_day(day.day))
        only_book = store.read_day("2024-07-03", ("mbp10",))
        assert only_book.present() == ("mbp10",)
    with h5py.File(path, "r") as f:
        assert f.attrs["layout_version"] == LAYOUT_VERSION
        assert f.attrs["price_scale"] == PRICE_SCALE
        assert (f.attrs["symbol"], f.attrs["tick_size"], f.attrs["point_value"]) == ("ES", 0.25, 50.0)
        assert (f.attrs["timezone"], f.attrs["session_open"], f.attrs["session_close"]) == ("America/New_York", "09:30", "16:00")
        ds = f["mbp10/2024-07-02/bid_px"]
        assert ds.shape == (30, 10) and ds.dtype == np.int64
        assert ds.compression == "lzf" and ds.shuffle and ds.chunks == (30, 10)
        assert ds.attrs["price_scale"] == PRICE_SCALE
        assert f["trades/2024-07-02/side"].dtype == np.int8
        assert set(f["bars/2024-07-03"]) == set(DTYPES["bars"])


def test_extend_adds_days_and_replaces_one_schema_of_a_day(tmp_path):
    path = tmp_path / "s.h5"
    first = make_day("2024-07-02")
    write_store(path, INST, [first], attrs={"seed": 1})
    newer = make_day("2024-07-02", shift=2)
    write_store(path, INST, [MarketDay("2024-07-02", mbp10=newer.mbp10), make_day("2024-07-05")], extend=True, attrs={"run": "b"})
    with MarketStore(path) as store:
        assert store.days() == ["2024-07-02", "2024-07-05"]
        assert store.attrs == {"seed": 1, "run": "b"}
        got = store.read_day("2024-07-02")
    np.testing.assert_array_equal(got.mbp10.bid_sz, newer.mbp10.bid_sz)
    np.testing.assert_array_equal(got.trades.size, first.trades.size)  # kept


def test_pieces_of_one_day_in_one_call_are_joined(tmp_path):
    day = make_day("2024-07-02")
    half = 15
    pieces = [
        MarketDay(day.day, mbp10=Mbp10(**{k: v[:half] for k, v in columns(day.mbp10).items()})),
        MarketDay(day.day, mbp10=Mbp10(**{k: v[half:] for k, v in columns(day.mbp10).items()}), trades=day.trades),
    ]
    path = write_store(tmp_path / "s.h5", INST, pieces)
    with MarketStore(path) as store:
        assert_same(MarketDay(day.day, mbp10=day.mbp10, trades=day.trades), store.read_day(day.day))


def test_a_rejected_write_leaves_the_previous_store_intact(tmp_path):
    path = tmp_path / "s.h5"
    write_store(path, INST, [make_day("2024-07-02")])
    before, files = path.read_bytes(), store_files(path)
    bad = make_day("2024-07-03")
    bad.trades.size[2] = 0
    progress = []
    with pytest.raises(InputError, match=r"s.h5, group /trades/2024-07-03, field size, row 2: zero size"):
        write_store(path, INST, [make_day("2024-07-05"), bad], extend=True, progress=progress.append)
    assert progress == ["wrote 2024-07-05: bars 10, mbp10 30, trades 10"]
    assert path.read_bytes() == before and store_files(path) == files  # the day written is gone too
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.h5", "s.h5.days"]


def test_an_interrupted_write_leaves_the_previous_store_intact(tmp_path):
    path = tmp_path / "s.h5"
    write_store(path, INST, [make_day("2024-07-02")])
    before, files = path.read_bytes(), store_files(path)

    def interrupted():
        yield make_day("2024-07-03")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_store(path, INST, interrupted(), extend=True)
    assert path.read_bytes() == before and store_files(path) == files
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.h5", "s.h5.days"]


def test_without_extend_the_store_is_replaced(tmp_path):
    path = tmp_path / "s.h5"
    write_store(path, INST, [make_day("2024-07-02")])
    write_store(path, INST, [make_day("2024-07-03")])
    with MarketStore(path) as store:
        assert store.days() == ["2024-07-03"]


def test_extending_with_another_instrument_is_refused(tmp_path):
    path = tmp_path / "s.h5"
    write_store(path, INST, [make_day("2024-07-02")])
    other = dataclasses.replace(INST, symbol="NQ", tick_size=0.25, point_value=20.0)
    with pytest.raises(InputError, match=r"group /: the store holds another instrument .*symbol 'ES' vs 'NQ', point_value 50.0 vs 20.0"):
        write_store(path, other, [make_day("2024-07-03")], extend=True)


def test_reserved_attrs_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"attrs \['tick_size'\] are reserved"):
        write_store(tmp_path / "s.h5", INST, [], attrs={"tick_size": 1.0})


def test_opening_what_is_not_a_store(tmp_path):
    with pytest.raises(InputError, match="no such market store"):
        MarketStore(tmp_path / "none.h5")
    (tmp_path / "text.h5").write_text("hello")
    with pytest.raises(InputError, match="text.h5: not an HDF5 file"):
        MarketStore(tmp_path / "text.h5")
    with h5py.File(tmp_path / "old.h5", "w") as f:
        f.attrs["layout_version"] = 0
    with pytest.raises(InputError, match=f"old.h5: store layout version 0 is not {LAYOUT_VERSION}"):
        MarketStore(tmp_path / "old.h5")


def test_missing_root_attributes_are_named(tmp_path):
    path = write_store(tmp_path / "s.h5", INST, [make_day("2024-07-02")])
    with h5py.File(path, "r+") as f:
        del f.attrs["price_scale"], f.attrs["day_roll"]
    with pytest.raises(InputError, match=r"s.h5, group /: root attributes \['price_scale', 'day_roll'\] are missing"):
        MarketStore(path)


def test_reading_validates(tmp_path):
    path = write_store(tmp_path / "s.h5", INST, [make_day("2024-07-02")])
    with h5py.File(path, "r+") as f:
        ask = f["mbp10/2024-07-02/ask_px"]
        ask[12, 0] = f["mbp10/2024-07-02/bid_px"][12, 0]
        del f["trades/2024-07-02/side"]
    with MarketStore(path) as store:
        with pytest.raises(InputError, match=r"s.h5, group /mbp10/2024-07-02, field bid_px_00, row 12: locked book"):
            store.read_day("2024-07-02", ("mbp10",))
        with pytest.raises(InputError, match=r"s.h5, group /trades/2024-07-02, field side: missing dataset"):
            store.read_day("2024-07-02", ("trades",))
        with pytest.raises(InputError, match=r"no trading day 2024-07-09 in the store \(it holds 2024-07-02 to 2024-07-02\)"):
            store.read_day("2024-07-09")


def test_require_schemas_names_what_is_missing_and_how_to_import_it(tmp_path):
    day = make_day("2024-07-02")
    path = write_store(tmp_path / "s.h5", INST, [MarketDay(day.day, bars=day.bars)])
    with pytest.raises(MissingDataError) as info:
        require_schemas(path)
    message = str(info.value)
    assert message == (
        f"{path}: no mbp10 data (add Databento mbp-10 DBN files, or LOBSTER message + orderbook CSV pairs with "
        f"`fox data import FILES... --out {path}`); no trades data (add Databento trades DBN files, or LOBSTER "
        f"message + orderbook CSV pairs with `fox data import FILES... --out {path}`). "
        "Training needs MBP-10 book snapshots and trades on every day."
    )

    both = write_store(tmp_path / "t.h5", INST, [make_day("2024-07-02"), MarketDay("2024-07-03", mbp10=make_day("2024-07-03").mbp10)])
    with pytest.raises(MissingDataError, match=r"no trades data on 1 of 2 days \(first 2024-07-03\)"):
        require_schemas(both)
    require_schemas(both, ("mbp10",))


def test_a_day_of_synthetic_size_reads_back_as_written(tmp_path):
    """250,000 book rows (several storage chunks) come back bit for bit (speed is a benchmark's business:
    tools/bench_import.py)."""
    n = 250_000
    day = "2024-07-02"
    rng = np.random.default_rng(1)
    open_ns, close_ns = session_bounds(day, INST)
    ts = np.sort(rng.integers(open_ns, close_ns, n)).astype(np.uint64)
    bid0 = to_fixed(5000.0) + np.cumsum(rng.integers(-1, 2, n)) * TICK
    depth = np.arange(10) * TICK
    sz = rng.integers(1, 100, (n, 10)).astype(np.uint32)
    k = np.arange(0, n, 10)
    trades = Trades(ts[k], bid0[k], sz[k, 0], np.ones(k.size, dtype=np.int8))
    big = MarketDay(day, bars_from_trades(trades), Mbp10(ts, bid0[:, None] - depth, bid0[:, None] + TICK + depth, sz, sz, sz, sz), trades)
    path = write_store(tmp_path / "big.h5", INST, [big])
    with MarketStore(path) as store:
        got = store.read_day(day)
    assert got.mbp10.ts_event.size == n and got.bars.ts_event[1] - got.bars.ts_event[0] == NS_PER_MINUTE
    for name in ("ts_event", "bid_px", "ask_px", "bid_sz", "ask_sz"):
        np.testing.assert_array_equal(getattr(got.mbp10, name), getattr(big.mbp10, name), err_msg=name)
    np.testing.assert_array_equal(got.trades.price, trades.price)


def test_each_day_records_its_contract(tmp_path):
    path = tmp_path / "s.h5"
    write_store(path, INST, [dataclasses.replace(make_day("2024-07-02"), contract="ESU4"), make_day("2024-07-03")])
    with MarketStore(path) as store:
        assert store.contracts() == {"2024-07-02": "ESU4", "2024-07-03": "ES"}  # no contract given: the symbol
        assert store.read_day("2024-07-02").contract == "ESU4"
    with h5py.File(path, "r") as f:
        assert {f[f"{s}/2024-07-02"].attrs["contract"] for s in ("bars", "mbp10", "trades")} == {"ESU4"}
    # One contract per day: replacing only the book of an ESU4 day with ESZ4 data is refused.
    day = make_day("2024-07-02", shift=1)
    with pytest.raises(InputError) as info:
        write_store(path, INST, [MarketDay(day.day, mbp10=day.mbp10, contract="ESZ4")], extend=True)
    assert (info.value.group, info.value.field) == ("/bars/2024-07-02", "contract")
    assert "the store's bars of 2024-07-02 is from ESU4, the data being added from ESZ4: one contract per day" in str(info.value)
    write_store(path, INST, [dataclasses.replace(day, contract="ESZ4")], extend=True)  # the whole day: fine
    with MarketStore(path) as store:
        assert store.contracts() == {"2024-07-02": "ESZ4", "2024-07-03": "ES"}
    with h5py.File(path, "r+") as f:
        f["trades/2024-07-02"].attrs["contract"] = "ESH5"
        del f["bars/2024-07-03"].attrs["contract"]
    with MarketStore(path) as store, pytest.raises(InputError, match=r"group /trades/2024-07-02: the day's schemas come from different contracts \(bars ESZ4, mbp10 ESZ4, trades ESH5\)"):
        store.read_day("2024-07-02")
    with MarketStore(path) as store, pytest.raises(InputError, match=r"group /bars/2024-07-03, field contract: missing attribute"):
        store.read_day("2024-07-03")


def test_extending_a_store_that_fails_validation_is_refused_naming_the_day(tmp_path):
    """A day without digests (a single-file store written before them) is validated before the store is extended."""
    path = single_file(write_store(tmp_path / "s.h5", INST, [make_day("2024-07-02"), make_day("2024-07-03")]), False)
    with h5py.File(path, "r+") as f:
        f["trades/2024-07-03/price"][4] = -5
    before = path.read_bytes()
    with pytest.raises(InputError) as info:
        write_store(path, INST, [make_day("2024-07-05")], extend=True)
    e = info.value
    assert (e.path, e.group, e.field, e.row) == (str(path), "/trades/2024-07-03", "price", 4)
    assert e.reason == "non-positive price (the store fails validation on 2024-07-03, so it is not extended; re-import that day)"
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["s.h5"]


def test_rewriting_the_same_days_does_not_grow_the_store(tmp_path):
    path = tmp_path / "s.h5"
    days = [make_day("2024-07-02", n=600), make_day("2024-07-03", n=600, shift=1)]
    write_store(path, INST, days, attrs={"seed": 1})
    sizes = [store_bytes(path)]
    for _ in range(3):
        write_store(path, INST, days, extend=True)  # a full re-import of the same days
        sizes.append(store_bytes(path))
    for _ in range(2):  # one schema of one day, the rest kept
        write_store(path, INST, [MarketDay(days[0].day, mbp10=days[0].mbp10)], extend=True)
        sizes.append(store_bytes(path))
    assert sizes[1:4] == sizes[:3] and sizes[5] == sizes[4] <= sizes[0], sizes
    assert len(store_files(path)) == 1 + 6  # the root and one day file per group: none left over
    assert sizes[-1] == sum(p.stat().st_size for p in [path, *day_folder(path).rglob("*")] if p.is_file())
    with MarketStore(path) as store:
        assert store.attrs == {"seed": 1}
        for day in days:
            assert_same(day, store.read_day(day.day))


# The day-file layout (3): one file per group, linked from the root; extending writes only what it adds or replaces.


def test_each_group_is_a_day_file_linked_from_the_root_and_the_pair_moves_together(tmp_path):
    path = write_store(tmp_path / "s.h5", INST, [make_day("2024-07-02"), make_day("2024-07-03", shift=1)])
    with h5py.File(path, "r") as f:
        link = f["mbp10"].get("2024-07-02", getlink=True)
        assert isinstance(link, h5py.ExternalLink) and link.path == "/mbp10/2024-07-02"
        digest = f["mbp10/2024-07-02"].attrs[DIGEST_ATTR]
        assert link.filename == f"s.h5.days/mbp10/2024-07-02-{digest[:16]}.h5"
    assert set(store_files(path)) - {"s.h5"} == linked(path) and len(linked(path)) == 6
    before = digests(path)
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    for name in ("s.h5", "s.h5.days"):
        (tmp_path / name).rename(moved / name)
    with MarketStore(moved / "s.h5") as store:
        assert_same(make_day("2024-07-03", shift=1), store.read_day("2024-07-03"))
    assert digests(moved / "s.h5") == before


def test_appending_a_day_leaves_the_other_day_files_untouched_and_unread(tmp_path, monkeypatch):
    days = [make_day("2024-07-02"), make_day("2024-07-03", shift=1), make_day("2024-07-05", shift=2)]
    path = write_store(tmp_path / "s.h5", INST, days[:2])
    files = store_files(path)
    reads = []
    read_day = MarketStore.read_day
    monkeypatch.setattr(MarketStore, "read_day", lambda self, day, *a: reads.append(day) or read_day(self, day, *a))
    write_store(path, INST, days[2:], extend=True)
    assert reads == []  # the stored days are not validated again: their digests record it
    after = store_files(path)
    assert all(after[k] == files[k] for k in files if k != "s.h5")  # the same inodes, not written since
    assert len(after) == len(files) + 3 and set(after) - {"s.h5"} == linked(path)
    fresh = write_store(tmp_path / "fresh.h5", INST, days)
    assert digests(path) == digests(fresh)


def test_replacing_a_day_writes_only_its_new_groups_and_deletes_the_old_ones(tmp_path):
    path = write_store(tmp_path / "s.h5", INST, [make_day("2024-07-02"), make_day("2024-07-03")])
    files, before = store_files(path), digests(path)
    newer = make_day("2024-07-03", shift=3)
    write_store(path, INST, [MarketDay(newer.day, mbp10=newer.mbp10)], extend=True)  # the book only
    after = store_files(path)
    gone, added = set(files) - set(after), set(after) - set(files)
    assert len(gone) == len(added) == 1 and set(after) - {"s.h5"} == linked(path)
    assert [Path(name).parent.name for name in (*gone, *added)] == ["mbp10", "mbp10"]
    assert all(after[k] == files[k] for k in after if k in files and k != "s.h5")  # the day's bars, trades and 07-02
    now = digests(path)
    assert now["2024-07-02"] == before["2024-07-02"] and now["2024-07-03"] != before["2024-07-03"]
    with MarketStore(path) as store:
        got = store.read_day("2024-07-03")
    np.testing.assert_array_equal(got.mbp10.bid_sz, newer.mbp10.bid_sz)
    fresh = [make_day("2024-07-02"), dataclasses.replace(make_day("2024-07-03"), mbp10=newer.mbp10)]
    assert now == digests(write_store(tmp_path / "f.h5", INST, fresh))


def test_a_crash_before_the_root_is_renamed_leaves_the_store_as_it_was(tmp_path, monkeypatch):
    """A write that dies at the commit (the root's rename), without its clean-up, as a killed process: the store
    reads as before, and the next write deletes the day files the dead one left."""
    from fox_numba.market import store as store_module

    path = write_store(tmp_path / "s.h5", INST, [make_day("2024-07-02"), make_day("2024-07-03")])
    before, files = digests(path), store_files(path)
    replace = os.replace

    def crash(src, dst):
        if Path(dst) == path:
            raise SystemExit("killed at the commit")
        replace(src, dst)

    monkeypatch.setattr(os, "replace", crash)
    monkeypatch.setattr(store_module.StoreWriter, "discard", lambda self: None)
    with pytest.raises(SystemExit):
        write_store(path, INST, [make_day("2024-07-03", shift=1), make_day("2024-07-05")], extend=True)
    monkeypatch.undo()
    assert digests(path) == before and len(store_files(path)) > len(files)  # the dead write's day files
    with MarketStore(path) as store:
        assert_same(make_day("2024-07-03"), store.read_day("2024-07-03"))
    write_store(path, INST, [make_day("2024-07-05")], extend=True)
    assert set(store_files(path)) - {"s.h5"} == linked(path) and len(linked(path)) == 9


def test_extending_a_single_file_store_copies_its_groups_out_once(tmp_path, monkeypatch):
    days = [make_day("2024-07-02"), make_day("2024-07-03", shift=1)]
    fresh = digests(write_store(tmp_path / "fresh.h5", INST, [*days, make_day("2024-07-05")]))
    reads = []
    read_day = MarketStore.read_day
    monkeypatch.setattr(MarketStore, "read_day", lambda self, day, *a: reads.append(day) or read_day(self, day, *a))
    for with_digests, validated in ((True, []), (False, ["2024-07-02", "2024-07-03"])):
        path = single_file(write_store(tmp_path / f"{with_digests}.h5", INST, days), with_digests)
        with MarketStore(path) as store:
            assert store.undigested() == ([] if with_digests else [f"/{s}/{d.day}" for s in SCHEMAS for d in days])
            assert store.day_file("mbp10", "2024-07-02") is None
        reads.clear()
        write_store(path, INST, [make_day("2024-07-05")], extend=True)
        assert reads == validated  # days without digests are validated before they are copied out with them
        with h5py.File(path, "r") as f:
            assert f.attrs["layout_version"] == LAYOUT_VERSION
        assert digests(path) == fresh and len(linked(path)) == 9
        assert set(store_files(path)) - {path.name} == linked(path)


def test_a_missing_or_altered_day_file_is_refused_with_its_name(tmp_path):
    path = write_store(tmp_path / "s.h5", INST, [make_day("2024-07-02"), make_day("2024-07-03")])
    with MarketStore(path) as store:
        book, trades = store.day_file("mbp10", "2024-07-03"), store.day_file("trades", "2024-07-02")
    book.unlink()
    with MarketStore(path) as store, pytest.raises(InputError) as info:
        store.read_day("2024-07-03")
    assert (info.value.path, info.value.group) == (str(book), "/mbp10/2024-07-03")
    assert info.value.reason == "the store's day file is missing (the s.h5.days folder travels with the store)"
    before = path.read_bytes()
    with pytest.raises(InputError, match=f"{book}, group /mbp10/2024-07-03: the store's day file is missing"):
        write_store(path, INST, [make_day("2024-07-05")], extend=True)
    assert path.read_bytes() == before
    shutil.copy(trades, book)  # another group's file under this one's name
    with pytest.raises(InputError, match=f"{book}, group /mbp10/2024-07-03: the store.s day file does not hold"):
        write_store(path, INST, [make_day("2024-07-05")], extend=True)
    write_store(path, INST, [make_day("2024-07-02"), make_day("2024-07-03")])  # written afresh: the same files
    with h5py.File(path, "r+") as f:
        del f["trades/2024-07-02"].attrs[DIGEST_ATTR]
    with pytest.raises(InputError) as info:
        write_store(path, INST, [make_day("2024-07-05")], extend=True)
    assert (info.value.path, info.value.group, info.value.field) == (str(trades), "/trades/2024-07-02", DIGEST_ATTR)
    assert "the day file has no digest attr" in info.value.reason


def test_a_second_writer_is_refused(tmp_path):
    import fcntl

    path = write_store(tmp_path / "s.h5", INST, [make_day("2024-07-02")])
    fd = os.open(day_folder(path) / LOCK_NAME, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as another writer holds it
        with pytest.raises(OutputError, match="s.h5: another process is writing this store"):
            write_store(path, INST, [make_day("2024-07-03")], extend=True)
    finally:
        os.close(fd)
    write_store(path, INST, [make_day("2024-07-03")], extend=True)  # the lock released: fine
    assert list(digests(path)) == ["2024-07-02", "2024-07-03"]
