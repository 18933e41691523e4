"""Import in blocks: a day staged part by part (blocks and store chunks cut inside it, two files, records cut
across zstd frames), memory that does not grow with the day, errors that survive a Ray task, and the same store
from a local Ray cluster and from worker processes."""

import hashlib
import importlib.util
import os
import pickle
import tracemalloc
from datetime import date
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import databento_dbn as dbn
import h5py
import numpy as np
import pytest
import zstandard
from typer.testing import CliRunner

from fox_numba.cli import app
from fox_numba.errors import ConfigError, InputError
from fox_numba.market import databento
from fox_numba.market.bars import bars_from_trades
from fox_numba.market.databento import RECORD_FIELDS, RTYPES, DatabentoImport, read_header, record_blocks, stage_file
from fox_numba.market.importer import import_market
from fox_numba.market.schema import N_LEVELS, Instrument, Trades
from fox_numba.market.store import CHUNK_ROWS, MarketStore
from test_store import single_file

ES = Instrument()
TICK = ES.tick_fixed
PX = 5_500_000_000_000
OPEN = 1_721_050_200_000_000_000  # 2024-07-15 09:30 New York (a Monday)
DAY = "2024-07-15"
MS = 1_000_000


def book_records(n: int, seed: int = 0) -> np.ndarray:
    """`n` MBP-10 records of ESU4 (instrument_id 118), one a millisecond from the open; sizes drawn afresh on every
    record, so every record changes the book and every one is stored."""
    rng = np.random.default_rng(seed)
    rec = np.zeros(n, dtype=np.dtype(RECORD_FIELDS["mbp10"]))
    rec["length"], rec["rtype"], rec["publisher_id"], rec["instrument_id"] = rec.dtype.itemsize // 4, RTYPES["mbp10"], 1, 118
    rec["ts_event"] = OPEN + np.arange(n, dtype=np.uint64) * MS
    rec["ts_recv"] = rec["ts_event"] + 500
    rec["flags"] = dbn.F_LAST
    bid = PX + TICK * np.cumsum(rng.integers(-1, 2, n))
    depth = np.arange(N_LEVELS) * TICK
    rec["levels"]["bid_px"], rec["levels"]["ask_px"] = bid[:, None] - depth, bid[:, None] + TICK + depth
    for name in ("bid_sz", "ask_sz", "bid_ct", "ask_ct"):
        rec["levels"][name] = rng.integers(1, 50, size=(n, N_LEVELS))
    return rec


def trade_records(n: int, seed: int = 1) -> np.ndarray:
    """`n` trades of ESU4, one every 4 ms from 1 ms after the open (inside the book's time range)."""
    rng = np.random.default_rng(seed)
    rec = np.zeros(n, dtype=np.dtype(RECORD_FIELDS["trades"]))
    rec["length"], rec["rtype"], rec["publisher_id"], rec["instrument_id"] = rec.dtype.itemsize // 4, RTYPES["trades"], 1, 118
    rec["ts_event"] = OPEN + MS + np.arange(n, dtype=np.uint64) * 4 * MS
    rec["ts_recv"] = rec["ts_event"] + 500
    rec["price"] = PX + TICK * rng.integers(-3, 4, n)
    rec["size"] = rng.integers(1, 20, n)
    rec["side"] = rng.choice(np.array([b"A", b"B", b"N"]), n)
    rec["action"] = b"T"
    return rec


def write_records(path: Path, schema: dbn.Schema, rec: np.ndarray, *, frames: int = 0) -> Path:
    """A DBN file of `rec` (metadata mapping ESU4 to 118; end a minute after the last record): plain with
    `frames=0`, else zstd in `frames` frames cut every len/frames bytes of the stream, inside records."""
    interval = SimpleNamespace(start_date=date(2024, 7, 1), end_date=date(2024, 8, 1), symbol="118")
    meta = dbn.Metadata(
        dataset="GLBX.MDP3", start=int(rec["ts_event"][0]) - 60 * 10**9, stype_in=dbn.SType.RAW_SYMBOL,
        stype_out=dbn.SType.INSTRUMENT_ID, schema=schema, symbols=["ESU4"], end=int(rec["ts_recv"].max()) + 60 * 10**9,
        mappings=[SimpleNamespace(raw_symbol="ESU4", intervals=[interval])],
    )  # fmt: skip
    raw = bytes(meta.encode()) + rec.tobytes()
    if frames:
        step = -(-len(raw) // frames)
        compressor = zstandard.ZstdCompressor(write_checksum=True)
        raw = b"".join(compressor.compress(raw[k : k + step]) for k in range(0, len(raw), step))
    path.write_bytes(raw)
    return path


def day_files(folder: Path, n_book: int, cut: int) -> tuple[list[Path], np.ndarray, np.ndarray]:
    """A day of `n_book` book records in two files (a plain one of the first `cut`, a zstd one of the rest) and
    a zstd trades file in 7 frames; returns the files, the book and the trade records."""
    book, trades = book_records(n_book), trade_records(n_book // 4)
    files = [
        write_records(folder / "a.mbp-10.dbn", dbn.Schema.MBP_10, book[:cut]),
        write_records(folder / "b.mbp-10.dbn.zst", dbn.Schema.MBP_10, book[cut:], frames=3),
        write_records(folder / "c.trades.dbn.zst", dbn.Schema.TRADES, trades, frames=7),
    ]
    return files, book, trades


def test_zstd_frames_cut_inside_records_decode_to_the_records(tmp_path, monkeypatch):
    """Frames end inside records and blocks hold 20 trade records: the blocks join to the records written."""
    monkeypatch.setattr(databento, "_CHUNK", 997)
    trades = trade_records(1000)
    path = write_records(tmp_path / "t.trades.dbn.zst", dbn.Schema.TRADES, trades, frames=9)
    blocks = list(record_blocks(read_header(path)))
    assert [len(b) for b in blocks] == [20] * 50
    assert np.concatenate(blocks).tobytes() == trades.tobytes()


def test_a_day_over_blocks_chunks_and_two_files_is_stored_as_its_records(tmp_path, monkeypatch):
    """A day of 2.3 store chunks, read 178 records a block, from two book files cut inside a chunk (row 20,001),
    and trades whose zstd frames end inside records: the store holds exactly the records written."""
    monkeypatch.setattr(databento, "_CHUNK", 1 << 16)
    n = 2 * CHUNK_ROWS + 5000
    files, book, trades = day_files(tmp_path, n, 20_001)
    side = np.select([trades["side"] == b"B", trades["side"] == b"A"], [1, -1], 0)
    expected = bars_from_trades(Trades(trades["ts_event"], trades["price"], trades["size"], side))
    result = import_market(files, tmp_path / "es.h5")
    assert result.rows == {DAY: {"bars": len(expected.ts_event), "mbp10": n, "trades": n // 4}}
    with MarketStore(tmp_path / "es.h5") as store:
        day = store.read_day(DAY)
    np.testing.assert_array_equal(day.mbp10.ts_event, book["ts_event"])
    for name in ("bid_px", "ask_px", "bid_sz", "ask_sz", "bid_ct", "ask_ct"):
        np.testing.assert_array_equal(getattr(day.mbp10, name), book["levels"][name])
    np.testing.assert_array_equal(day.trades.side, side)
    for name in ("ts_event", "price", "size"):
        np.testing.assert_array_equal(getattr(day.trades, name), trades[name])
    np.testing.assert_array_equal(day.bars.volume, expected.volume)
    np.testing.assert_array_equal(day.bars.close, expected.close)
    with h5py.File(tmp_path / "es.h5") as f:
        ds = f[f"mbp10/{DAY}/bid_px"]
        assert (ds.chunks, ds.compression, ds.shuffle, ds.maxshape) == ((CHUNK_ROWS, N_LEVELS), "lzf", True, (n, N_LEVELS))
    assert sorted(p.name for p in tmp_path.glob(".*")) == []  # the staging folder is gone


def test_a_fault_across_two_files_of_a_day_names_the_second_file(tmp_path):
    """Where two files of a day meet, a time going back names the second file's first record."""
    book = book_records(50)
    first = write_records(tmp_path / "a.mbp-10.dbn", dbn.Schema.MBP_10, book[:30])
    book["ts_event"][30:] -= 10 * MS  # record 0 of the second file is 9 ms before the last of the first
    book["ts_recv"][30:] -= 10 * MS
    second = write_records(tmp_path / "b.mbp-10.dbn", dbn.Schema.MBP_10, book[30:])
    with pytest.raises(InputError) as info:
        import_market([first, second], tmp_path / "es.h5")
    e = info.value
    assert (e.path, e.group, e.field, e.row) == (str(second), f"mbp-10 ESU4 {DAY}", "ts_event", 0), str(e)
    assert "ts_event decreases" in e.reason


def test_memory_does_not_grow_with_the_day(tmp_path, monkeypatch):
    """Peak Python-heap memory of importing a day of 60,000 MBP-10 rows into a store that holds it without a digest
    (the stored day is validated, then the new one staged and written) is that of a day of 20,000 (a block, the
    store's chunk and what is staged before a chunk is whole), not three times it."""
    monkeypatch.setattr(databento, "_CHUNK", 1 << 16)
    peaks = []
    for n in (20_000, 60_000):
        path = write_records(tmp_path / f"{n}.mbp-10.dbn.zst", dbn.Schema.MBP_10, book_records(n), frames=1)
        single_file(import_market([path], tmp_path / f"{n}.h5").path, digests=False)
        tracemalloc.start()
        try:  # the second import stages and writes the day as the first did, after validating the stored one
            assert import_market([path], tmp_path / f"{n}.h5").rows == {DAY: {"mbp10": n}}
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
    assert peaks[1] < 1.15 * peaks[0], peaks
    assert peaks[1] < 3 * CHUNK_ROWS * 340, peaks  # three chunks of stored rows; the importer that held a day: 770 B a row


def test_a_stored_day_is_validated_a_chunk_at_a_time_before_it_is_extended(tmp_path):
    """Faults in a day the store holds without a digest (a single-file store written before digests), inside its
    second chunk and where two chunks meet, name the store, the day's group and row (the day row, as when the day
    was read whole)."""
    files, book, _ = day_files(tmp_path, 2 * CHUNK_ROWS + 5000, 20_001)
    store = single_file(import_market(files, tmp_path / "es.h5").path, digests=False)  # days without digests
    other = write_records(tmp_path / "later.trades.dbn", dbn.Schema.TRADES, trade_records(10))
    good = store.read_bytes()
    faults = [
        ("bid_sz", CHUNK_ROWS + 5, 0, "bid_sz_00", "priced level with zero size"),
        ("ts_event", CHUNK_ROWS, int(book["ts_event"][CHUNK_ROWS - 1]) - 1, "ts_event", "ts_event decreases"),
    ]
    for name, row, value, field, words in faults:
        with h5py.File(store, "r+") as f:
            f[f"mbp10/{DAY}/{name}"][row] = value
        before = store.read_bytes()
        with pytest.raises(InputError) as info:
            import_market([other], store)
        e = info.value
        assert (e.path, e.group, e.field, e.row) == (str(store), f"/mbp10/{DAY}", field, row), str(e)
        assert words in e.reason and e.reason.endswith(f"(the store fails validation on {DAY}, so it is not extended; re-import that day)")
        assert store.read_bytes() == before
        store.write_bytes(good)


def test_a_wrong_record_length_inside_a_zstd_stream_names_the_record(tmp_path):
    """Past the part of the file its header is read from (databento-dbn decodes the first 64 KiB there)."""
    trades = trade_records(20_000)
    trades["length"][15_123] = 7
    path = write_records(tmp_path / "t.trades.dbn.zst", dbn.Schema.TRADES, trades, frames=2)
    with pytest.raises(InputError) as info:
        import_market([path], tmp_path / "es.h5")
    e = info.value
    assert (e.path, e.field, e.row) == (str(path), "length", 15_123), str(e)
    assert e.reason == (
        f"record at byte {15_123 * 48:,} of the decompressed records declares a length of 28 bytes, expected 48 for "
        "trades: the file is damaged"
    )


def test_a_damaged_zstd_stream_is_reported_before_a_fault_it_decodes_to(tmp_path, monkeypatch):
    """A frame whose checksum fails at its end, holding a crossed book in its first block: the decoding failure
    is what is reported, as when a file was decoded whole before its rows were checked."""
    monkeypatch.setattr(databento, "_CHUNK", 368 * 10)
    book = book_records(5000)  # past the 64 KiB its header is read from
    book["levels"]["bid_px"][3, 0] = book["levels"]["ask_px"][3, 0] + TICK
    path = write_records(tmp_path / "x.mbp-10.dbn.zst", dbn.Schema.MBP_10, book, frames=1)
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF  # the frame's checksum
    path.write_bytes(bytes(raw))
    with pytest.raises(InputError) as info:
        import_market([path], tmp_path / "es.h5")
    assert str(info.value).startswith(f"{path}: DBN decoding failed after record "), str(info.value)
    assert "checksum" in info.value.reason
    path.write_bytes(bytes(raw[:-1]) + bytes([raw[-1] ^ 0xFF]))
    with pytest.raises(InputError, match="crossed book after the session open") as info:
        import_market([path], tmp_path / "es.h5")
    assert (info.value.field, info.value.row) == ("bid_px_00", 3)


def test_a_staged_file_error_survives_the_trip_back_from_a_task(tmp_path):
    """A Ray task's result is pickled: the error it carries is raised by the driver with every field."""
    book = book_records(40)
    book["levels"]["bid_sz"][17, 2] = 0  # a priced level of zero size
    path = write_records(tmp_path / "z.mbp-10.dbn", dbn.Schema.MBP_10, book)
    source = DatabentoImport.open([path])
    (task,) = source.tasks(ES, tmp_path, compression="lzf")
    result = pickle.loads(pickle.dumps(stage_file(task)))
    with pytest.raises(InputError) as info:
        result.raise_error()
    e = info.value
    assert (e.path, e.group, e.field, e.row) == (str(path), f"mbp-10 ESU4 {DAY}", "bid_sz_02", 17)
    assert e.reason == "priced level with zero size"


@pytest.mark.skipif(importlib.util.find_spec("ray") is None and not os.environ.get("CI"),
                    reason="ray is not installed (pip install -e '.[ray]'); under CI, which installs it, the test runs")
def test_ray_stages_the_files_and_the_store_is_the_same_bit_for_bit(tmp_path):
    """`fox data import --ray` on a local cluster: one task per file (the staged chunks copied as they are, where a
    part starts on a chunk boundary), the same datasets and attributes as the import in one process."""
    files, _, _ = day_files(tmp_path, 2 * CHUNK_ROWS + 5000, 20_001)
    local = import_market(files, tmp_path / "local.h5")
    run = CliRunner().invoke(app, ["data", "import", *map(str, files), "--out", str(tmp_path / "ray.h5"), "--ray"])
    assert run.exit_code == 0, run.output
    assert run.stdout.splitlines() == [line.replace("local.h5", "ray.h5") for line in local.lines()]
    assert_same_store(tmp_path / "local.h5", tmp_path / "ray.h5")


def test_worker_processes_stage_the_files_and_the_store_is_the_same_bit_for_bit(tmp_path):
    """`fox data import --workers 3`: each file staged in a spawned process, as a Ray task would; the same store."""
    files, _, _ = day_files(tmp_path, 2 * CHUNK_ROWS + 5000, 20_001)
    local = import_market(files, tmp_path / "local.h5", workers=1)
    run = CliRunner().invoke(app, ["data", "import", *map(str, files), "--out", str(tmp_path / "pool.h5"),
                                   "--workers", "3"])
    assert run.exit_code == 0, run.output
    assert run.stdout.splitlines() == [line.replace("local.h5", "pool.h5") for line in local.lines()]
    assert_same_store(tmp_path / "local.h5", tmp_path / "pool.h5")
    with pytest.raises(ConfigError, match="--workers sets the processes"):
        import_market(files, tmp_path / "both.h5", ray=True, workers=2)


def assert_same_store(first: Path, second: Path) -> None:
    """The same attributes, groups, datasets (dtype, shape, chunks, filters) and bytes."""
    with h5py.File(first) as a, h5py.File(second) as b:
        assert dict(a.attrs) == dict(b.attrs)
        names = _names(a)
        assert names == _names(b) and len(names) == 23  # 3 schemas, 3 day groups, 17 columns
        for name in names:
            assert dict(a[name].attrs) == dict(b[name].attrs), name
            if isinstance(a[name], h5py.Dataset):
                x, y = a[name], b[name]
                assert (x.dtype, x.shape, x.chunks, x.compression, x.shuffle) == (y.dtype, y.shape, y.chunks, y.compression, y.shuffle)
                assert x[()].tobytes() == y[()].tobytes(), name


def _names(f: h5py.File) -> list[str]:
    """Every group and dataset of the store, through the links to its day files (which `visit` does not follow)."""
    names: list[str] = []
    for schema in f:
        names.append(schema)
        for day in f[schema]:
            names.append(f"{schema}/{day}")
            f[f"{schema}/{day}"].visit(lambda name, at=f"{schema}/{day}": names.append(f"{at}/{name}"))
    return names


def test_a_staging_file_is_removed_once_its_days_are_written(tmp_path):
    """Three files over four days (test_databento.mixed_files): a.mbp-10 (staged first) holds 8 and 9 July,
    c.trades 8 to 10 July, b.mbp-10 (the second half of the book, read last) 9 to 11 July. 8 July is written before
    b is read; each staging file goes once its last day is written."""
    from test_databento import mixed_files

    files = mixed_files(tmp_path)
    out = tmp_path / "es.h5"
    seen = []

    def progress(message: str) -> None:
        if message.startswith("wrote"):
            staged = sorted(p.name for p in tmp_path.glob(".es.h5.tmp-*.staging/*"))
            seen.append((message.split()[1].rstrip(":"), staged))

    import_market(files, out, progress=progress)
    assert seen == [
        ("2024-07-08", ["00000.h5", "00001.h5"]),
        ("2024-07-09", ["00001.h5", "00002.h5"]),
        ("2024-07-10", ["00002.h5"]),
        ("2024-07-11", []),
    ]


def test_a_part_staged_after_rows_of_its_day_is_staged_in_line_with_the_days_chunks(tmp_path):
    """The second book file of a day, staged knowing that 20,001 rows of the day came before it (an import in one
    process), starts at row 20,001 % CHUNK_ROWS of its staging file, so each staged chunk is a chunk of the day, and
    the hash staged with it is the day's block's (what the store's digest takes for a chunk copied as it is)."""
    n, cut = 3 * CHUNK_ROWS + 100, 20_001
    files, book, _ = day_files(tmp_path, n, cut)
    tasks = DatabentoImport.open(files).tasks(ES, tmp_path, compression="lzf")
    task = next(t for t in tasks if t.file.path == files[1])
    assert stage_file(replace(task, offsets={DAY: cut})).days == {DAY: n - cut}
    pad = cut % CHUNK_ROWS
    with h5py.File(task.staged, "r") as f:
        group = f[f"{DAY}/mbp10"]
        assert group.attrs["pad"] == pad and group["ts_event"].shape == (pad + n - cut,)
        np.testing.assert_array_equal(group["ts_event"][pad:], book["ts_event"][cut:])
        hashes = group["hashes/bid_px"][()]
    assert hashes.shape == (3, 32)  # staged chunks 0 (after the pad), 1 (whole) and 2 (the day's last rows)
    day_block = np.ascontiguousarray(book["levels"]["bid_px"][2 * CHUNK_ROWS : 3 * CHUNK_ROWS])
    assert hashes[1].tobytes() == hashlib.sha256(day_block).digest()


def test_the_compression_option_changes_the_filters_not_the_rows_or_the_digests(tmp_path):
    """`--compression gzip` and `none` store the same rows, with the same digests, as the default lzf; the day's
    chunks are copied from staging as they are compressed there."""
    files, _, _ = day_files(tmp_path, CHUNK_ROWS + 500, 300)
    stores = {"lzf": import_market(files, tmp_path / "lzf.h5").path}
    for name in ("gzip", "none"):
        run = CliRunner().invoke(app, ["data", "import", *map(str, files), "--out", str(tmp_path / f"{name}.h5"),
                                       "--compression", name])  # fmt: skip
        assert run.exit_code == 0, run.output
        stores[name] = tmp_path / f"{name}.h5"
    digests, values = {}, {}
    for name, path in stores.items():
        with MarketStore(path) as store:
            digests[name] = store.day_digest(DAY)
            group = store.group("mbp10", DAY)
            assert (group["bid_px"].compression, group["bid_px"].shuffle) == {
                "lzf": ("lzf", True), "gzip": ("gzip", True), "none": (None, False)
            }[name]  # fmt: skip
            values[name] = group["bid_px"][()].tobytes() + store.group("trades", DAY)["price"][()].tobytes()
    assert digests["gzip"] == digests["none"] == digests["lzf"] and values["gzip"] == values["none"] == values["lzf"]
    run = CliRunner().invoke(app, ["data", "import", str(files[0]), "--out", str(tmp_path / "x.h5"), "--compression",
                                   "zstd"])  # fmt: skip
    assert run.exit_code == 2 and "'zstd' is not one of lzf, gzip, none" in run.output


def test_the_earliest_file_is_decoded_once_and_its_records_choose_the_instrument(tmp_path, monkeypatch):
    """The instrument is chosen from the earliest file's first block and confirmed by its records once it is
    staged, so a file of one instrument is decoded once (and its first block once more). Where the first block
    holds another instrument than most of the file, the import starts again with the file's choice."""
    monkeypatch.setattr(databento, "_CHUNK", 48 * 100)
    blocks = []

    def counted(f):
        for block in record_blocks(f):
            blocks.append(f.path.name)
            yield block

    monkeypatch.setattr(databento, "record_blocks", counted)
    trades = trade_records(1000)
    path = write_records(tmp_path / "t.trades.dbn.zst", dbn.Schema.TRADES, trades, frames=2)
    import_market([path], tmp_path / "one.h5")
    assert len(blocks) == 10 + 1
    trades["instrument_id"][:150] = 999  # not mapped: named by its id
    mixed = write_records(tmp_path / "m.trades.dbn.zst", dbn.Schema.TRADES, trades, frames=2)
    result = import_market([mixed], tmp_path / "mixed.h5")
    assert result.notes[0] == "instrument ESU4: 850 records in m.trades.dbn.zst, the most (others: 999 150; choose " \
                              "with --instrument)"  # fmt: skip
    assert result.rows[DAY]["trades"] == 850
    with MarketStore(tmp_path / "mixed.h5") as store:
        assert store.instrument.symbol == "ES"
        np.testing.assert_array_equal(store.read_day(DAY).trades.ts_event, trades["ts_event"][150:])


@pytest.mark.parametrize(("inputs", "compression"), [("generated", "none"), ("fixture", "lzf")])
def test_the_block_size_does_not_change_the_store_bit_for_bit(tmp_path, monkeypatch, inputs, compression):
    """Blocks of a few records (rows staged into a chunk from many blocks, the flags' held records crossing every
    block) give the store that blocks of `_CHUNK` bytes give: every dataset's layout, filters and bytes and every
    attribute, the digests included, and (uncompressed) every stored chunk as it is stored (LZF's stored bytes are
    not repeatable from one run to the next). Inputs: a day over two files and three store chunks, and the
    committed ESU4 trades and ohlcv-1m files."""
    if inputs == "generated":
        files, _, _ = day_files(tmp_path, 2 * CHUNK_ROWS + 5000, 20_001)
    else:
        files = [Path(__file__).parents[1] / "fixtures" / "databento_esu4_20240701"]
    large = import_market(files, tmp_path / "large.h5", compression=compression)
    monkeypatch.setattr(databento, "_CHUNK", 5000)  # 13 MBP-10 or 104 trade records
    small = import_market(files, tmp_path / "small.h5", compression=compression)
    assert small.rows == large.rows and small.notes == large.notes
    with h5py.File(tmp_path / "large.h5") as a, h5py.File(tmp_path / "small.h5") as b:
        assert dict(a.attrs) == dict(b.attrs)
        names = _names(a)
        assert names == _names(b)
        for name in names:
            assert {k: str(v) for k, v in a[name].attrs.items()} == {k: str(v) for k, v in b[name].attrs.items()}, name
            if isinstance(a[name], h5py.Dataset):
                x, y = a[name], b[name]
                layout = ("dtype", "shape", "chunks", "compression", "shuffle", "maxshape")
                assert [getattr(x, p) for p in layout] == [getattr(y, p) for p in layout], name
                assert x[()].tobytes() == y[()].tobytes(), name
                for k in range(x.id.get_num_chunks() if x.chunks and compression == "none" else 0):
                    at = x.id.get_chunk_info(k).chunk_offset
                    assert x.id.read_direct_chunk(at) == y.id.read_direct_chunk(at), (name, at)
