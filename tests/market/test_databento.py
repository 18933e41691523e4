"""Databento DBN import: real files from Databento and nautilus_trader, and files written here with
databento-dbn's encoder (multi-day, unsorted, crossed, snapshots, bad-book and bad-ts flags)."""

import hashlib
import io
import os
import signal
import subprocess
import sys
import tempfile
from datetime import UTC, date, datetime
from pathlib import Path
from types import SimpleNamespace

import databento_dbn as dbn
import h5py
import numpy as np
import pytest
from typer.testing import CliRunner

from fox_numba.cli import app
from fox_numba.cli import main as cli_main
from fox_numba.errors import InputError
from fox_numba.market.bars import bars_from_trades
from fox_numba.market import databento
from fox_numba.market.databento import DatabentoImport, read_header, record_blocks
from fox_numba.market.importer import import_market
from fox_numba.market.inspect import summarize
from fox_numba.market.schema import UNDEF_PRICE, Instrument
from fox_numba.market.store import MarketStore, require_schemas
from test_store import single_file

FIXTURES = Path(__file__).parents[1] / "fixtures"
STUBS = FIXTURES / "databento_stubs"
ESU4 = FIXTURES / "databento_esu4_20240701"
ES = Instrument()
TICK = ES.tick_fixed
PX = 5_500_000_000_000  # 5500.00


def ns(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()) * 1_000_000_000


def write_dbn(
    path: Path, schema: dbn.Schema, records: list, *, start: int, compress: bool = True, symbols=None, end: int | None = None
) -> Path:
    """A DBN file as Databento writes one: metadata (with raw symbol -> instrument_id mappings), records."""
    symbols = symbols or {"ESU4": 118}  # a parent symbol maps to a list of ids: {"ES.FUT": [118, 999]}
    mappings = [
        SimpleNamespace(
            raw_symbol=s,
            intervals=[SimpleNamespace(start_date=date(2024, 6, 1), end_date=date(2024, 8, 1), symbol=str(i)) for i in np.atleast_1d(ids)],
        )
        for s, ids in symbols.items()
    ]
    if end is None:  # the query's end: just after the last record, as for a download of exactly this range
        end = max((r.ts_event for r in records if r.ts_event < 2**62), default=start) + 60 * 10**9
    meta = dbn.Metadata(
        dataset="GLBX.MDP3", start=start, stype_in=dbn.SType.RAW_SYMBOL, stype_out=dbn.SType.INSTRUMENT_ID,
        schema=schema, symbols=list(symbols), end=end, mappings=mappings,
    )  # fmt: skip
    raw = bytes(meta.encode()) + b"".join(bytes(r) for r in records)
    if compress:
        buffer = io.BytesIO()
        transcoder = dbn.Transcoder(buffer, dbn.Encoding.DBN, dbn.Compression.ZSTD)
        transcoder.write(raw)
        del transcoder  # the zstd frame is finished when the transcoder is dropped, not by flush()
        raw = buffer.getvalue()
    path.write_bytes(raw)
    return path


def book(ts: int, bid: int = PX, *, ask: int | None = None, flags: int = dbn.F_LAST, iid: int = 118, size: int = 5, action=dbn.Action.ADD):
    ask = bid + TICK if ask is None else ask
    levels = [
        dbn.BidAskPair(bid_px=bid - k * TICK, ask_px=ask + k * TICK, bid_sz=size + k, ask_sz=size + k + 1, bid_ct=1 + k, ask_ct=2 + k)
        for k in range(10)
    ]
    return dbn.MBP10Msg(1, iid, ts, bid, 1, action, dbn.Side.BID, 0, ts + 500, flags=flags, levels=levels)


def trade(ts: int, price: int = PX, size: int = 1, side=dbn.Side.BID, flags: int = 0, iid: int = 118, ts_recv: int | None = None):
    return dbn.TradeMsg(1, iid, ts, price, size, dbn.Action.TRADE, side, 0, ts + 500 if ts_recv is None else ts_recv, flags=flags)


def all_days(paths: list[Path], instrument: str | None = None) -> tuple[SimpleNamespace, list]:
    """Import `paths` into a fresh store; the instrument chosen, the import's notes and warnings, and the days
    read back from the store."""
    source = DatabentoImport.open(paths, instrument)
    with tempfile.TemporaryDirectory() as tmp:
        result = import_market(paths, Path(tmp) / "es.h5", instrument=instrument)
        with MarketStore(Path(tmp) / "es.h5") as store:
            days = [store.read_day(d) for d in store.days()]
    notes = result.notes
    return SimpleNamespace(name=source.name, symbol=source.symbol, summary=lambda: notes, warnings=result.warnings), days


def rejects(paths: list[Path], path: Path, group: str | None, field: str | None, row: int | None, words: str) -> None:
    with pytest.raises(InputError) as info:
        all_days(paths)
    e = info.value
    assert (e.path, e.group, e.field, e.row) == (str(path), group, field, row), str(e)
    assert words in e.reason, e.reason


# Real files


def test_real_esu4_trades_with_bars_built_from_them():
    source, days = all_days([next(ESU4.glob("futures_trades_*"))])
    assert [d.day for d in days] == ["2024-07-02"]  # 19:58 New York on 1 July belongs to 2 July
    trades = days[0].trades
    assert trades.ts_event.size == 120
    assert (trades.ts_event[0], trades.price[0], trades.size[0], trades.side[0]) == (1719878281218218853, 5528750000000, 2, 1)
    assert (np.count_nonzero(trades.side == 1), np.count_nonzero(trades.side == -1)) == (66, 54)  # 'B' 66, 'A' 54
    assert days[0].bars.volume.tolist() == [18, 23, 175, 37]
    assert source.symbol == "ES" and source.summary() == ["instrument ESU4: 120 records in " + next(ESU4.glob("futures_trades_*")).name + ", the most"]


def test_real_multi_instrument_ohlcv_picks_one_and_says_so():
    path = next(ESU4.glob("futures_ohlcv-1m_*"))
    source, days = all_days([path])
    assert source.name == "ESU4"
    assert source.summary()[0] == (
        f"instrument ESU4: 30 records in {path.name}, the most; tied with NQU4: the alphabetically first is taken "
        "(others: NQU4 30; choose with --instrument)"
    )
    assert days[0].bars.open[0] == 5527250000000 and days[0].bars.volume[0] == 180
    nq, days = all_days([path], "NQU4")
    assert nq.symbol == "NQ" and days[0].bars.ts_event.size == 30 and days[0].bars.open[0] != 5527250000000
    by_id, by_id_days = all_days([path], "4358")  # an instrument_id is read as the raw symbol it maps to
    assert (by_id.name, by_id.symbol) == ("NQU4", "NQ")
    assert by_id.summary() == ["instrument NQU4 (instrument_id 4358, chosen with --instrument)"]
    np.testing.assert_array_equal(by_id_days[0].bars.close, days[0].bars.close)
    with pytest.raises(InputError, match=r"ohlcv-1m.*dbn.zst: no records for instrument ESZ4 \(the file holds ESU4, NQU4\)"):
        all_days([path], "ESZ4")


def test_the_structured_view_equals_the_decoders_fields():
    for path in (STUBS / "test_data.mbp-10.dbn.zst", STUBS / "test_data.trades.dbn.zst", next(ESU4.glob("futures_ohlcv-1m_*"))):
        records = np.concatenate(list(record_blocks(read_header(path))))
        decoder = dbn.DBNDecoder(compression=dbn.Compression.ZSTD)
        decoder.write(path.read_bytes())
        objects = decoder.decode()[1:]
        assert len(records) == len(objects)
        for rec, obj in zip(records, objects, strict=True):
            for name in rec.dtype.names:
                if name == "levels":
                    for k, level in enumerate(obj.levels):
                        for f in ("bid_px", "ask_px", "bid_sz", "ask_sz", "bid_ct", "ask_ct"):
                            assert rec["levels"][k][f] == getattr(level, f)
                elif name in ("action", "side"):
                    assert rec[name].decode() == str(getattr(obj, name))
                elif name == "length":
                    assert int(rec[name]) * 4 == rec.dtype.itemsize
                else:
                    assert rec[name] == int(getattr(obj, name)), (path.name, name)


def test_real_mbp10_file():
    _, days = all_days([STUBS / "test_data.mbp-10.dbn.zst"])
    book10 = days[0].mbp10
    assert days[0].day == "2020-12-28"  # 00:00 UTC Monday = Sunday 19:00 New York, next day's session
    assert book10.ts_event.tolist() == [1609113600005871213, 1609113600062570311, 1609113600076022275, 1609113600076339855]
    assert book10.bid_px[0].tolist() == [3702250000000 - k * TICK for k in range(10)]
    assert book10.bid_sz[:, 0].tolist() == [19, 20, 20, 21] and book10.ask_ct[0, :3].tolist() == [13, 17, 14]


def test_real_book_and_trades_that_do_not_overlap_in_time_are_refused():
    trades = STUBS / "test_data.trades.dbn.zst"
    rejects([STUBS / "test_data.mbp-10.dbn.zst", trades], trades, "trades ESH1 2020-12-28", "ts_event", 0, "outside the book's time range")


def test_other_schemas_and_non_dbn_files_are_refused(tmp_path):
    with pytest.raises(InputError, match=r"test_data.definition.dbn.zst: DBN schema definition is not imported \(use mbp-10, trades, ohlcv-1m\)"):
        read_header(STUBS / "test_data.definition.dbn.zst")
    (tmp_path / "junk.dbn").write_bytes(b"not dbn at all" * 10)
    with pytest.raises(InputError, match=r"junk.dbn: not a readable DBN file"):
        read_header(tmp_path / "junk.dbn")


# Files written with the encoder

T = ns("2024-07-02T12:00:00")  # 08:00 New York, pre-open of 2 July
OPEN = ns("2024-07-02T13:30:00")
S = 10**9


def test_multi_day_file_is_split_at_the_17_00_roll(tmp_path):
    evening = ns("2024-07-02T21:00:00")  # 17:00 New York, the Globex close: from here on 3 July's day
    records = [book(T), book(T + S, PX + TICK), book(evening - 1, PX), book(evening, PX + TICK), book(evening + S, PX)]
    path = write_dbn(tmp_path / "two.mbp-10.dbn.zst", dbn.Schema.MBP_10, records, start=T)
    _, days = all_days([path])
    assert [d.day for d in days] == ["2024-07-02", "2024-07-03"]
    assert days[0].mbp10.ts_event.tolist() == [T, T + S, evening - 1]
    assert days[1].mbp10.bid_px[:, 0].tolist() == [PX + TICK, PX]


def test_unsorted_records_are_refused_with_the_record_number(tmp_path):
    records = [book(T), book(T + 2 * S, PX + TICK), book(T + S, PX)]
    path = write_dbn(tmp_path / "unsorted.mbp-10.dbn.zst", dbn.Schema.MBP_10, records, start=T)
    rejects([path], path, "mbp-10 ESU4", "ts_event", 2, "ts_event decreases")


def test_unsorted_records_across_a_day_boundary_are_refused(tmp_path):
    evening = ns("2024-07-02T22:00:00")
    records = [trade(T), trade(evening + S), trade(evening - S)]
    path = write_dbn(tmp_path / "t.trades.dbn", dbn.Schema.TRADES, records, start=T, compress=False)
    rejects([path], path, "trades ESU4", "ts_event", 2, "ts_event decreases")


def test_crossed_book_after_the_open_names_file_and_record(tmp_path):
    other = book(OPEN, iid=999)
    records = [book(OPEN - S), other, book(OPEN + S, PX + 2 * TICK, ask=PX + TICK), book(OPEN + 2 * S)]
    path = write_dbn(tmp_path / "x.mbp-10.dbn.zst", dbn.Schema.MBP_10, records, start=T, symbols={"ESU4": 118, "ESZ4": 999})
    rejects([path], path, "mbp-10 ESU4 2024-07-02", "bid_px_00", 2, "crossed book after the session open: bid 5500.5 >= ask 5500.25")


def test_crossed_book_in_the_pre_open_is_kept(tmp_path):
    records = [book(T, PX + 2 * TICK, ask=PX + TICK), book(T + S)]
    path = write_dbn(tmp_path / "x.mbp-10.dbn.zst", dbn.Schema.MBP_10, records, start=T)
    _, days = all_days([path])
    assert days[0].mbp10.bid_px[0, 0] > days[0].mbp10.ask_px[0, 0]


@pytest.mark.parametrize("chunk", [databento._CHUNK, 368, 3 * 368])  # 368: one MBP-10 record a block
def test_snapshot_bad_book_and_unchanged_records(tmp_path, monkeypatch, chunk):
    """Each decision that needs the next record (a snapshot run's end) or the file's end (the last unchanged
    book) gives the same rows when every record is a block of its own."""
    monkeypatch.setattr(databento, "_CHUNK", chunk)
    snap = dbn.F_SNAPSHOT
    records = [
        book(T, PX - 4 * TICK, flags=snap),  # partial replay state: dropped
        book(T, PX - 2 * TICK, flags=snap),  # dropped
        book(T, PX, flags=snap | dbn.F_LAST),  # the replayed book: kept
        book(T + S, PX + TICK, flags=dbn.F_LAST | dbn.F_BAD_TS_RECV),  # kept, counted
        book(T + 2 * S, PX + 3 * TICK, flags=dbn.F_MAYBE_BAD_BOOK),  # dropped
        book(T + 3 * S, PX + TICK, action=dbn.Action.TRADE),  # same book as the last kept: dropped
        book(T + 4 * S, PX),
        book(T + 5 * S, PX, action=dbn.Action.FILL),  # unchanged, but the last record: kept (book time range)
    ]
    path = write_dbn(tmp_path / "s.mbp-10.dbn.zst", dbn.Schema.MBP_10, records, start=T)
    source, days = all_days([path])
    got = days[0].mbp10
    assert got.ts_event.tolist() == [T, T + S, T + 4 * S, T + 5 * S]
    assert got.bid_px[:, 0].tolist() == [PX, PX + TICK, PX, PX]
    assert source.summary()[1:] == [
        "1 MBP-10 records flagged F_MAYBE_BAD_BOOK dropped",
        "2 snapshot records dropped (last state of each snapshot kept)",
        "1 MBP-10 records that left the 10-level book unchanged dropped",
        "1 records flagged F_BAD_TS_RECV kept (ts_event is used)",
    ]


def test_trades_side_flags_and_a_day_split_over_two_files(tmp_path):
    t0 = OPEN + 30 * S
    first = [trade(t0, side=dbn.Side.BID, size=3), trade(t0 + 10 * S, PX + TICK, side=dbn.Side.ASK, flags=dbn.F_BAD_TS_RECV)]
    second = [
        trade(t0 + 20 * S, PX - TICK, side=dbn.Side.NONE, size=2),
        trade(t0 + 21 * S, PX, flags=dbn.F_SNAPSHOT),  # not an execution: dropped
        trade(t0 + 40 * S, PX, size=4),
    ]
    a = write_dbn(tmp_path / "a.trades.dbn.zst", dbn.Schema.TRADES, first, start=T)
    b = write_dbn(tmp_path / "b.trades.dbn.zst", dbn.Schema.TRADES, second, start=t0 + 15 * S)
    _, days = all_days([b, a])  # order of arguments does not matter: files are read by start time
    trades, bars = days[0].trades, days[0].bars
    assert trades.side.tolist() == [1, -1, 0, 1] and trades.size.tolist() == [3, 1, 2, 4]
    assert bars.ts_event.tolist() == [OPEN, OPEN + 60 * S]
    assert (bars.open.tolist(), bars.high.tolist(), bars.low.tolist(), bars.close.tolist()) == (
        [PX, PX],
        [PX + TICK, PX],
        [PX - TICK, PX],
        [PX - TICK, PX],
    )
    assert bars.volume.tolist() == [6, 4]


def test_imported_bars_against_trades(tmp_path):
    t0 = OPEN + 30 * S
    trades = [trade(t0 + k * 30 * S, PX + (k % 2) * TICK, size=k + 1) for k in range(8)]  # 4 minutes
    # Minutes 1-3 are fully covered by the trades; minutes 0 and 4 are not and are not compared.
    expected = {1: 5, 2: 9, 3: 13}
    ohlcv = [dbn.OHLCVMsg(dbn.RType.OHLCV_1M, 1, 118, OPEN, PX, PX + TICK, PX - TICK, PX, 50)]
    ohlcv += [
        dbn.OHLCVMsg(dbn.RType.OHLCV_1M, 1, 118, OPEN + m * 60 * S, PX + TICK, PX + TICK, PX, PX, v + (5 if m == 2 else 0))
        for m, v in expected.items()
    ]
    ohlcv.append(dbn.OHLCVMsg(dbn.RType.OHLCV_1M, 1, 118, OPEN + 240 * S, PX + TICK, PX + TICK, PX + TICK, PX + TICK, 8))
    tp = write_dbn(tmp_path / "t.trades.dbn.zst", dbn.Schema.TRADES, trades, start=T)
    bp = write_dbn(tmp_path / "b.ohlcv-1m.dbn.zst", dbn.Schema.OHLCV_1M, ohlcv, start=T)
    rejects([tp, bp], bp, "ohlcv-1m ESU4 2024-07-02", "volume", 2, "bar volume 14 differs from the trades' 9")


def test_undefined_timestamp_and_bad_prices(tmp_path):
    path = write_dbn(tmp_path / "u.trades.dbn.zst", dbn.Schema.TRADES, [trade(T), trade(2**64 - 1, ts_recv=T + S)], start=T)
    rejects([path], path, "trades ESU4", "ts_event", 1, "undefined ts_event")
    path = write_dbn(tmp_path / "v.trades.dbn.zst", dbn.Schema.TRADES, [trade(T), trade(2**63 + 5)], start=T)
    rejects([path], path, "trades ESU4", "ts_event", 1, "undefined ts_event")  # was an OverflowError
    path = write_dbn(tmp_path / "p.trades.dbn.zst", dbn.Schema.TRADES, [trade(T), trade(T + S, price=int(UNDEF_PRICE))], start=T)
    rejects([path], path, "trades ESU4 2024-07-02", "price", 1, "undefined price")


def test_empty_levels_in_a_real_shaped_record(tmp_path):
    thin = book(T + S)
    levels = thin.levels
    for k in range(6, 10):
        levels[k].ask_px, levels[k].ask_sz, levels[k].ask_ct = int(UNDEF_PRICE), 0, 0
    thin.levels = levels
    bad = book(T + 2 * S, PX + TICK)
    levels = bad.levels
    levels[3].bid_px = int(UNDEF_PRICE)  # size left: not an empty level
    bad.levels = levels
    path = write_dbn(tmp_path / "e.mbp-10.dbn.zst", dbn.Schema.MBP_10, [book(T), thin, bad], start=T)
    rejects([path], path, "mbp-10 ESU4 2024-07-02", "bid_sz_03", 2, "empty level (UNDEF_PRICE) with a non-zero size")
    path = write_dbn(tmp_path / "f.mbp-10.dbn.zst", dbn.Schema.MBP_10, [book(T), thin], start=T)
    _, days = all_days([path])
    assert days[0].mbp10.ask_px[1, 6:].tolist() == [UNDEF_PRICE] * 4


def test_a_folder_of_daily_files_assembles_trading_days_across_files(tmp_path):
    folder = tmp_path / "batch"
    folder.mkdir()
    (folder / "metadata.json").write_text("{}")  # Databento batch downloads carry these: ignored
    for d in ("2024-07-02", "2024-07-03"):
        start = ns(f"{d}T00:00:00")
        at = {h: ns(f"{d}T{h}") for h in ("13:00:00", "13:30:00", "14:00:00", "23:00:00")}
        books = [book(at["13:00:00"]), book(at["14:00:00"], PX + TICK), book(at["23:00:00"], PX + 2 * TICK)]
        trades = [trade(at["13:30:00"], size=2), trade(at["23:00:00"], size=5, side=dbn.Side.ASK)]
        stamp = d.replace("-", "")
        write_dbn(folder / f"glbx-mdp3-{stamp}.mbp-10.dbn.zst", dbn.Schema.MBP_10, books, start=start)
        write_dbn(folder / f"glbx-mdp3-{stamp}.trades.dbn.zst", dbn.Schema.TRADES, trades, start=start)
    out = tmp_path / "es.h5"
    result = import_market([folder], out)
    # 23:00 UTC is 19:00 New York: the evening rows of one UTC file belong to the next trading day, which
    # after 3 July is 5 July (4 July, Independence Day, is not a trading day).
    assert result.rows == {
        "2024-07-02": {"bars": 1, "mbp10": 2, "trades": 1},
        "2024-07-03": {"bars": 2, "mbp10": 3, "trades": 2},
        "2024-07-05": {"bars": 1, "mbp10": 1, "trades": 1},
    }
    require_schemas(out)
    with MarketStore(out) as store:
        day = store.read_day("2024-07-03")
    assert day.mbp10.ts_event.tolist() == [ns("2024-07-02T23:00:00"), ns("2024-07-03T13:00:00"), ns("2024-07-03T14:00:00")]
    assert day.trades.size.tolist() == [5, 2] and day.trades.side.tolist() == [-1, 1]


def test_cut_short_files_are_refused(tmp_path):
    real = next(ESU4.glob("futures_trades_*")).read_bytes()
    for cut in (len(real) // 2, len(real) - 1):
        path = tmp_path / f"cut{cut}.trades.dbn.zst"
        path.write_bytes(real[:cut])
        with pytest.raises(InputError, match=r"the zstd stream is cut short \(an interrupted download\?\)"):
            list(record_blocks(read_header(path)))
    plain = write_dbn(tmp_path / "p.trades.dbn", dbn.Schema.TRADES, [trade(T), trade(T + S)], start=T, compress=False)
    plain.write_bytes(plain.read_bytes()[:-10])
    with pytest.raises(InputError, match=r"p.trades.dbn: the file ends inside a record \(after record 0, 38 bytes of record 1\)"):
        list(record_blocks(read_header(plain)))


# A Globex evening: CME's pre-open (17:00-18:00 New York) may cross; trading from 18:00 is the next day's.

XMAS_PRE_OPEN = ns("2023-12-25T22:39:55")  # 17:39:55 New York on Christmas Day 2023, a holiday
XMAS_REOPEN = ns("2023-12-25T23:00:00")  # 18:00 New York: trading for 26 December starts
P4800 = 4_800_000_000_000


def globex_evening(tmp_path: Path, pre_open: int, reopen: int) -> list[Path]:
    """A pre-open with a crossed book (bid 4805 >= ask 4799.5), then 40 minutes of trading from `reopen`."""
    books = [book(pre_open - 600 * S, P4800), book(pre_open, 4_805_000_000_000, ask=4_799_500_000_000)]
    books += [book(reopen + k * 60 * S, P4800 + (k % 3) * TICK) for k in range(40)]
    trades = [trade(reopen + k * 20 * S + S, P4800 + (k % 3) * TICK, size=1 + k % 4) for k in range(117)]
    start = pre_open - 3600 * S
    symbols = {"ESH4": 5002}
    return [
        write_dbn(tmp_path / "evening.mbp-10.dbn.zst", dbn.Schema.MBP_10, [_iid(r, 5002) for r in books], start=start, symbols=symbols),
        write_dbn(tmp_path / "evening.trades.dbn.zst", dbn.Schema.TRADES, [_iid(r, 5002) for r in trades], start=start, symbols=symbols),
    ]


def _iid(record, iid: int):
    record.instrument_id = iid
    return record


def test_a_holiday_evening_reopen_with_a_crossed_pre_open_imports_as_the_next_trading_day(tmp_path):
    files = globex_evening(tmp_path, XMAS_PRE_OPEN, XMAS_REOPEN)
    result = import_market(files, tmp_path / "es.h5")
    assert result.rows == {"2023-12-26": {"bars": 39, "mbp10": 42, "trades": 117}}
    with MarketStore(tmp_path / "es.h5") as store:
        day = store.read_day("2023-12-26")
    assert day.trades.ts_event.size == 117 and day.mbp10.bid_px[1, 0] > day.mbp10.ask_px[1, 0]
    rebuilt = bars_from_trades(day.trades)
    for name in ("ts_event", "open", "high", "low", "close", "volume"):
        np.testing.assert_array_equal(getattr(day.bars, name), getattr(rebuilt, name))
    # The old reading (the day rolling at 18:00, no holiday calendar) puts the pre-open into the 25th, after
    # its 09:30 open; the error says which option changes that.
    with pytest.raises(InputError) as info:
        import_market(files, tmp_path / "old.h5", overrides={"day_roll": "18:00", "calendar": "weekdays"})
    e = info.value
    assert (e.path, e.group, e.field, e.row) == (str(files[0]), "mbp-10 ESH4 2023-12-25", "bid_px_00", 1)
    assert e.reason == (
        "crossed book after the session open: bid 4805 >= ask 4799.5 at 2023-12-25 17:39:55.000000 America/New_York "
        "(it is after the 16:00 close, and the day rolls only at 18:00: an earlier --day-roll (CME Globex: 17:00 "
        "New York) makes it the next trading day's pre-open)"
    )
    assert not (tmp_path / "old.h5").exists()


def regular_hours(tmp_path: Path, opens: list[int], minutes: int = 30) -> list[Path]:
    """A book and trades over the first `minutes` of each regular session opening at `opens` (UTC ns)."""
    books = [book(o + k * 60 * S, PX + (k % 3 + 3 * j) * TICK) for j, o in enumerate(opens) for k in range(minutes + 1)]
    trades = [trade(o + k * 60 * S + S, PX + (k % 3 + 3 * j) * TICK) for j, o in enumerate(opens) for k in range(minutes)]
    start = opens[0] - 3600 * S
    return [
        write_dbn(tmp_path / "days.mbp-10.dbn.zst", dbn.Schema.MBP_10, books, start=start),
        write_dbn(tmp_path / "days.trades.dbn.zst", dbn.Schema.TRADES, trades, start=start),
    ]


def test_a_session_on_a_holiday_is_refused_naming_the_date_and_the_file(tmp_path):
    """Good Friday 2024 (29 March) and Easter Monday: under the `us` calendar Friday's session would join
    Monday's trading day (two sessions and a 2.7-day gap in one day); it is refused, and `--calendar
    weekdays` keeps Friday a day of its own."""
    files = regular_hours(tmp_path, [ns("2024-03-29T13:30:00"), ns("2024-04-01T13:30:00")])
    with pytest.raises(InputError) as info:
        import_market(files, tmp_path / "es.h5")
    e = info.value
    assert (e.path, e.group, e.field, e.row) == (str(files[0]), "mbp-10 ESU4 2024-04-01", "ts_event", 0)
    assert e.reason == (
        "2024-03-29 09:30:00.000000 America/New_York is in the regular hours of 2024-03-29, Good Friday, not a "
        "trading day of the 'us' calendar: its session would be folded into trading day 2024-04-01 (--calendar "
        "weekdays keeps 2024-03-29 a day of its own)"
    )
    assert "\n" not in str(e) and not (tmp_path / "es.h5").exists()
    result = import_market(files, tmp_path / "es.h5", overrides={"calendar": "weekdays"})
    assert result.rows == {d: {"bars": 30, "mbp10": 31, "trades": 30} for d in ("2024-03-29", "2024-04-01")}
    # A session on a Saturday is refused under `weekdays` too, pointing at `all-days`.
    saturday = regular_hours(tmp_path, [ns("2024-03-30T13:30:00"), ns("2024-04-01T13:30:00")])
    with pytest.raises(InputError, match=r"2024-03-30, a Saturday, .*--calendar all-days keeps 2024-03-30"):
        import_market(saturday, tmp_path / "sat.h5", overrides={"calendar": "weekdays"})


def test_an_ordinary_evening_pre_open_belongs_to_the_next_day(tmp_path):
    files = globex_evening(tmp_path, ns("2024-07-09T21:45:00"), ns("2024-07-09T22:00:00"))  # Tuesday 17:45 EDT
    assert list(import_market(files, tmp_path / "es.h5").rows) == ["2024-07-10"]
    with pytest.raises(InputError, match=r"2024-07-09 17:45:00.000000 America/New_York \(it is after the 16:00 close.*--day-roll"):
        import_market(files, tmp_path / "old.h5", overrides={"day_roll": "18:00"})


def test_children_of_a_parent_symbol_are_named_by_id_with_the_parent_root(tmp_path):
    records = [trade(OPEN + S, iid=118), trade(OPEN + 2 * S, iid=999), trade(OPEN + 3 * S, iid=118)]
    path = write_dbn(tmp_path / "p.trades.dbn.zst", dbn.Schema.TRADES, records, start=T, symbols={"ES.FUT": [118, 999]})
    source, days = all_days([path])
    assert (source.name, source.symbol) == ("118", "ES") and days[0].trades.ts_event.size == 2
    source, days = all_days([path], "999")
    assert (source.name, source.symbol) == ("999", "ES") and days[0].trades.ts_event.size == 1


# Damaged files: every decoder failure is one line naming the file; a plain file cut short is flagged.


def trades_file(tmp_path: Path, name: str, n: int, *, compress: bool, end: int | None = None) -> Path:
    """`n` trades, one a second from the open (23,400 cover the regular session)."""
    records = [trade(OPEN + k * S, PX + (k % 3) * TICK, size=1 + k % 5) for k in range(n)]
    return write_dbn(tmp_path / name, dbn.Schema.TRADES, records, start=OPEN, compress=compress, end=end)


def test_bit_flips_in_a_zstd_file_are_one_line_errors_naming_it(tmp_path):
    good = trades_file(tmp_path, "good.trades.dbn.zst", 23_400, compress=True).read_bytes()  # 200 KB
    reasons = set()
    for pos in range(60, len(good), 1499):  # past the frame header: data, block headers or the checksum
        flipped = bytearray(good)
        flipped[pos] ^= 1 << (pos % 8)
        path = tmp_path / "flip.trades.dbn.zst"
        path.write_bytes(bytes(flipped))
        with pytest.raises(InputError) as info:
            all_days([path])
        message = str(info.value)
        assert message.startswith(f"{path}: ") and "\n" not in message, message
        reasons.add(info.value.reason.split(" (")[0].split(" after")[0])
    # The metadata is decoded from the first 64 KiB (a flip there: not readable), the records after it.
    assert {"not a readable DBN file", "DBN decoding failed"} <= reasons


@pytest.mark.parametrize("chunk", [databento._CHUNK, 1000])  # 1000: 20 trade records a block
def test_a_corrupted_record_length_in_a_plain_file_names_the_record_and_its_offset(tmp_path, monkeypatch, chunk):
    monkeypatch.setattr(databento, "_CHUNK", chunk)
    good = trades_file(tmp_path, "good.trades.dbn", 300, compress=False).read_bytes()
    first = len(good) - 300 * 48
    for value in (0, 1, 6, 13, 200, 255):  # 6 words (24 bytes) made the Rust decoder panic
        damaged = bytearray(good)
        damaged[first + 48 * 250] = value
        path = tmp_path / "bad.trades.dbn"
        path.write_bytes(bytes(damaged))
        with pytest.raises(InputError) as info:
            all_days([path])
        e = info.value
        assert (e.path, e.field, e.row) == (str(path), "length", 250)
        assert e.reason == (
            f"record at byte {first + 48 * 250:,} declares a length of {value * 4} bytes, expected 48 for trades: "
            "the file is damaged"
        )


def test_damaged_files_through_the_cli_are_one_line_without_a_panic_or_traceback(tmp_path):
    good = trades_file(tmp_path, "good.trades.dbn", 300, compress=False).read_bytes()
    damaged = bytearray(good)
    damaged[len(good) - 50 * 48] = 6
    plain = tmp_path / "bad.trades.dbn"
    plain.write_bytes(bytes(damaged))
    zipped = bytearray(trades_file(tmp_path, "good.trades.dbn.zst", 2000, compress=True).read_bytes())
    zipped[len(zipped) // 2] ^= 0x10
    flipped = tmp_path / "flip.trades.dbn.zst"
    flipped.write_bytes(bytes(zipped))
    for path in (plain, flipped):
        proc = subprocess.run(
            [sys.executable, "-m", "fox_numba", "data", "import", str(path), "--out", str(tmp_path / "es.h5")],
            check=False, capture_output=True, text=True, timeout=120, env={**os.environ, "RUST_BACKTRACE": "1"},
        )  # fmt: skip
        assert proc.returncode == 1
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"fox: error: {path}"), proc.stderr
        assert not (tmp_path / "es.h5").exists()


def test_a_plain_file_cut_at_a_record_boundary_is_flagged(tmp_path):
    close = OPEN + 23_400 * S
    whole = trades_file(tmp_path, "whole.trades.dbn", 23_400, compress=False, end=close)
    source, days = all_days([whole])
    assert days[0].trades.ts_event.size == 23_400 and source.warnings == []
    assert source.summary()[1] == (
        "1 plain .dbn file(s) (whole.trades.dbn): no checksum or frame, so a file cut at a record boundary shows "
        "only as a last record far before the metadata's end (checked)"
    )
    cut = tmp_path / "cut.trades.dbn"
    raw = whole.read_bytes()
    cut.write_bytes(raw[: len(raw) - (23_400 - 12_000) * 48])
    result = import_market([cut], tmp_path / "es.h5")
    assert result.rows["2024-07-02"]["trades"] == 12_000
    assert result.warnings == [
        (
            "cut.trades.dbn: its last record (2024-07-02 12:49:59) is 190 minutes of open market before the end its "
            "metadata gives (2024-07-02 16:00:00 America/New_York): was the file cut short? Compare it with the download"
        )
    ]
    assert "  warning: " + result.warnings[0] in result.lines()


@pytest.mark.parametrize("chunk", [databento._CHUNK, 200])  # 200: 4 plain trade records a block
def test_records_past_the_metadata_end_are_refused(tmp_path, monkeypatch, chunk):
    monkeypatch.setattr(databento, "_CHUNK", chunk)
    for compress in (True, False):
        path = trades_file(tmp_path, "late.trades.dbn" + ".zst" * compress, 10, compress=compress, end=OPEN + 5 * S)
        reason = "ts_recv 2024-07-02 13:30:05.000000 UTC is at or past the end of the file's metadata"
        rejects([path], path, None, "ts_recv", 5, reason)


def test_errors_name_the_record_of_the_file_across_blocks(tmp_path, monkeypatch):
    """Read 2 MBP-10 records a block, with another instrument's records between: the record numbers stay the
    file's."""
    monkeypatch.setattr(databento, "_CHUNK", 2 * 368)
    records = [book(OPEN + k * S, PX + (k % 2) * TICK, iid=118 if k % 3 else 999) for k in range(9)]
    records[7] = book(OPEN + 7 * S, PX + 2 * TICK, ask=PX + TICK)  # crossed after the open
    symbols = {"ESU4": 118, "ESZ4": 999}
    path = write_dbn(tmp_path / "x.mbp-10.dbn", dbn.Schema.MBP_10, records, start=T, symbols=symbols, compress=False)
    rejects([path], path, "mbp-10 ESU4 2024-07-02", "bid_px_00", 7, "crossed book after the session open")
    records[7] = trade(OPEN + 7 * S)  # a trade record in an MBP-10 file, padded to the MBP-10 length
    raw = bytearray(bytes(records[7]).ljust(368, b"\0"))
    raw[0] = 368 // 4
    data = bytearray(path.read_bytes())
    data[len(data) - 2 * 368 : len(data) - 368] = raw
    path.write_bytes(bytes(data))
    rejects([path], path, None, "rtype", 7, "record type 0x0 in a mbp-10 file")


def test_a_store_following_two_contracts_records_the_roll(tmp_path):
    """ESZ4 days imported into a store of ESU4 days: kept, each day's contract recorded, the roll noted."""
    files = []
    for day, symbol, iid in (("2024-07-02", "ESU4", 118), ("2024-07-03", "ESZ4", 999)):
        open_ns = ns(f"{day}T13:30:00")
        books = [book(open_ns - S, iid=iid), book(open_ns + 60 * S, PX + TICK, iid=iid)]
        trades = [trade(open_ns + k * S, iid=iid) for k in range(1, 50)]
        for schema, records in ((dbn.Schema.MBP_10, books), (dbn.Schema.TRADES, trades)):
            name = f"{symbol}.{schema.value}.dbn.zst"
            files.append(write_dbn(tmp_path / name, schema, records, start=open_ns - 60 * S, symbols={symbol: iid}))
    out = tmp_path / "es.h5"
    first = import_market(files[:2], out)
    assert first.notes == [f"instrument ESU4: 2 records in {files[0].name}, the most"]
    second = import_market(files[2:], out)
    assert second.notes[-1] == (
        "the contract changes from ESU4 (last day 2024-07-02) to ESZ4 (first day 2024-07-03): a roll; prices jump "
        "by the spread between the two contracts there"
    )
    with MarketStore(out) as store:
        assert store.instrument.symbol == "ES" and store.contracts() == {"2024-07-02": "ESU4", "2024-07-03": "ESZ4"}
    summary = summarize(out)
    assert [(d["day"], d["contract"]) for d in summary["days"]] == [("2024-07-02", "ESU4"), ("2024-07-03", "ESZ4")]
    table = CliRunner().invoke(app, ["data", "inspect", str(out)])
    assert table.exit_code == 0 and "contract" in table.output and "ESZ4" in table.output
    assert import_market(files[2:], out).notes[-1] == second.notes[-1]  # re-importing the roll day says it again


# The bad-input battery through the command line's entry point: one line, exit 1, the store kept.


def fox_main(args: list[str]) -> int:
    """Run `fox ARGS` in this process through `cli.main` (restoring the signal handlers it installs)."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    old_argv = sys.argv
    sys.argv = ["fox", *args]
    try:
        cli_main()
    except SystemExit as e:
        return int(e.code or 0)
    finally:
        sys.argv = old_argv
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    return 0


def test_every_bad_input_ends_in_one_line_and_keeps_the_store(tmp_path, capfd):
    store = tmp_path / "es.h5"
    good = trades_file(tmp_path, "good.trades.dbn.zst", 600, compress=True)
    import_market([good], store)
    corrupt = single_file(import_market([good], tmp_path / "corrupt.h5").path, digests=False)  # validated again
    with h5py.File(corrupt, "r+") as f:
        f["trades/2024-07-02/price"][7] = 0
    aapl = tmp_path / "aapl.h5"
    import_market([Path(__file__).parents[1] / "fixtures" / "lobster_aapl_head"], aapl)
    zipped = trades_file(tmp_path, "flip.trades.dbn.zst", 23_400, compress=True)
    damaged = bytearray(zipped.read_bytes())
    damaged[len(damaged) // 2] ^= 0x10
    zipped.write_bytes(bytes(damaged))
    plain = trades_file(tmp_path, "length.trades.dbn", 300, compress=False)
    damaged = bytearray(plain.read_bytes())
    damaged[len(damaged) - 100 * 48] = 6
    plain.write_bytes(bytes(damaged))
    cut = trades_file(tmp_path, "cut.trades.dbn.zst", 23_400, compress=True)
    cut.write_bytes(cut.read_bytes()[: cut.stat().st_size // 2])
    late = trades_file(tmp_path, "late.trades.dbn.zst", 10, compress=True, end=OPEN + 5 * S)
    junk = tmp_path / "junk.dbn"
    junk.write_bytes(b"not dbn at all" * 10)
    evening = tmp_path / "evening"
    evening.mkdir()
    globex = globex_evening(evening, XMAS_PRE_OPEN, XMAS_REOPEN)
    lobster = tmp_path / "lobster"
    lobster.mkdir()
    name = "AAPL_2012-06-21_34200000_57600000_{}_1.csv"
    (lobster / name.format("message")).write_text("34200.5,1,1,100,nan,1\n")
    (lobster / name.format("orderbook")).write_text("1001000,5,1000000,7\n")
    cases = [
        ([zipped], store, "DBN decoding failed"),
        ([plain], store, "declares a length of 24 bytes, expected 48"),
        ([cut], store, "the zstd stream is cut short"),
        ([late], store, "is at or past the end of the file's metadata"),
        ([junk], store, "not a readable DBN file"),
        ([STUBS / "test_data.definition.dbn.zst"], store, "DBN schema definition is not imported"),
        ([*globex, "--day-roll", "18:00", "--calendar", "weekdays"], store, "the store holds another instrument"),
        ([*globex, "--day-roll", "18:00", "--calendar", "weekdays"], tmp_path / "new.h5", "an earlier --day-roll"),
        ([*globex, "--day-roll", "25:00"], store, "time '25:00' is not a time of day"),
        ([*globex, "--out", str(tmp_path)], store, "is a folder; --out names the store file"),
        ([lobster], aapl, "field price, row 0: NaN or infinite value"),
        ([good], corrupt, "row 7: non-positive price (the store fails validation on 2024-07-02, so it is not extended"),
    ]
    for args, out, words in cases:
        before = out.read_bytes() if out.exists() else None
        status = fox_main(["data", "import", *map(str, args), *(["--out", str(out)] if "--out" not in args else [])])
        captured = capfd.readouterr()
        lines = captured.err.strip().splitlines()
        assert status == 1 and len(lines) == 1 and lines[0].startswith("fox: error: "), (args, captured.err)
        assert words in lines[0], lines[0]
        assert (out.read_bytes() if out.exists() else None) == before
    assert sorted(p.name for p in tmp_path.glob(".*")) == []


# The same store from the same files: every value the importer writes, pinned, so a rewrite of the import path
# (issue 22: block decoding) must reproduce today's stores bit for bit.


def mixed_files(tmp_path: Path) -> list[Path]:
    """Three trading days of ESU4 with ESZ4 interleaved: a snapshot run at each day's start, bad-book,
    bad-ts_recv and unchanged records, snapshot trades, sides B/A/N, a day split over two book files (one
    plain), crossing the 17:00 roll. No random numbers: the inputs are the same on every numpy."""
    books, trades = [], []
    for day, start in enumerate((ns("2024-07-08T12:00:00"), ns("2024-07-09T12:00:00"), ns("2024-07-10T12:00:00"))):
        snap = [book(start - 3 * S, PX - TICK, flags=dbn.F_SNAPSHOT), book(start - 2 * S, PX, flags=dbn.F_SNAPSHOT | dbn.F_LAST)]
        books += snap
        for k in range(400):
            ts, bid = start + k * 7 * S + day, PX + ((k * 7919) % 11 - 5) * TICK
            flags = dbn.F_LAST | (dbn.F_MAYBE_BAD_BOOK if k % 89 == 88 else 0) | (dbn.F_BAD_TS_RECV if k % 53 == 52 else 0)
            books.append(book(ts, bid, size=1 + (k * 31) % 17, flags=flags))
            if k % 97 == 96:  # a trade record that leaves the book as it was
                books.append(book(ts + 1, bid, size=1 + (k * 31) % 17, action=dbn.Action.TRADE))
            if k % 5 == 0:
                books.append(book(ts, PX + 40 * TICK, iid=999))
            if k % 3 == 1:
                side = (dbn.Side.BID, dbn.Side.ASK, dbn.Side.NONE)[k % 9 // 3]
                trades.append(trade(ts + 2, bid + TICK * (k % 2), size=1 + k % 4, side=side, flags=dbn.F_SNAPSHOT * (k % 41 == 40)))
                if k % 7 == 0:
                    trades.append(trade(ts + 3, bid, size=2, iid=999))
        roll = start + 9 * 3600 * S  # 17:00 New York: the last record is the next trading day's
        books += [book(roll - S, PX + 3 * TICK, size=3), book(roll, PX + 2 * TICK, size=4)]
    symbols = {"ESU4": 118, "ESZ4": 999}
    cut = len(books) // 2
    return [
        write_dbn(tmp_path / "a.mbp-10.dbn.zst", dbn.Schema.MBP_10, books[:cut], start=books[0].ts_event, symbols=symbols),
        write_dbn(tmp_path / "b.mbp-10.dbn", dbn.Schema.MBP_10, books[cut:], start=books[cut].ts_event, symbols=symbols, compress=False),
        write_dbn(tmp_path / "c.trades.dbn.zst", dbn.Schema.TRADES, trades, start=books[0].ts_event, symbols=symbols),
    ]


def store_digests(path: Path) -> dict[str, str]:
    """sha256 (first 16 hex digits) of every day group's datasets (dtype, shape, bytes) and contract."""
    out = {}
    with h5py.File(path, "r") as f:
        for schema in sorted(f):
            for day in sorted(f[schema]):
                group, h = f[f"{schema}/{day}"], hashlib.sha256(str(f[f"{schema}/{day}"].attrs["contract"]).encode())
                for name in sorted(group):
                    values = group[name][()]
                    h.update(f"{name} {values.dtype.str} {values.shape}".encode() + values.tobytes())
                out[f"{schema}/{day}"] = h.hexdigest()[:16]
    return out


@pytest.mark.parametrize("chunk", [databento._CHUNK, 368, 4096])
def test_the_same_files_give_the_same_store_bit_for_bit(tmp_path, monkeypatch, chunk):
    """Pinned from the importer that read each file whole; read in blocks of `chunk` input bytes (records, snapshot
    runs and unchanged books cut across blocks; 368: one MBP-10 record a block, so some blocks hold only ESZ4's) the
    store is the same."""
    monkeypatch.setattr(databento, "_CHUNK", chunk)
    files = mixed_files(tmp_path)
    result = import_market(files, tmp_path / "mixed.h5")
    assert result.rows == {
        "2024-07-08": {"bars": 47, "mbp10": 398, "trades": 130},
        "2024-07-09": {"bars": 47, "mbp10": 399, "trades": 130},
        "2024-07-10": {"bars": 47, "mbp10": 399, "trades": 130},
        "2024-07-11": {"mbp10": 1},
    }
    assert result.notes[2:] == [
        "12 MBP-10 records flagged F_MAYBE_BAD_BOOK dropped",
        "12 snapshot records dropped (last state of each snapshot kept)",
        "12 MBP-10 records that left the 10-level book unchanged dropped",
        "21 records flagged F_BAD_TS_RECV kept (ts_event is used)",
    ]
    assert store_digests(tmp_path / "mixed.h5") == {
        "bars/2024-07-08": "d7a1321c5342bf3c",
        "bars/2024-07-09": "271ff2080502da2d",
        "bars/2024-07-10": "5586ffdd21c8ff98",
        "mbp10/2024-07-08": "2f078a5c5f9a673f",
        "mbp10/2024-07-09": "4cd77cb523243ca7",
        "mbp10/2024-07-10": "61557679b862bcd9",
        "mbp10/2024-07-11": "9f196bd204e1c51d",
        "trades/2024-07-08": "2357913bca579d41",
        "trades/2024-07-09": "3f9a257a975bf2a4",
        "trades/2024-07-10": "aa3b82c026d2397a",
    }
    real = [next(ESU4.glob("futures_trades_*")), next(ESU4.glob("futures_ohlcv-1m_*"))]
    import_market(real, tmp_path / "esu4.h5")
    import_market([STUBS / "test_data.mbp-10.dbn.zst"], tmp_path / "stub.h5")
    assert store_digests(tmp_path / "esu4.h5") | store_digests(tmp_path / "stub.h5") == {
        "bars/2024-07-02": "f70d2756afd053a6",
        "trades/2024-07-02": "112010850a51434d",
        "mbp10/2020-12-28": "fe96b008489eb6cc",
    }
