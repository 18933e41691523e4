"""Generate daily Databento DBN+zstd files (MBP-10 and trades of one ES contract) for import benchmarks.

    python tools/gen_dbn.py OUT_FOLDER --rows 1000000 --days 3 [--seed 0]

Per trading day (weekdays from 2024-07-08): `--rows` MBP-10 records over the regular session (09:30-16:00
New York), a one-tick spread on a random walk with fresh sizes and order counts on every record, and
`--rows / 4` trades at the touch inside the book's time range; files `glbx-mdp3-YYYYMMDD.{mbp-10,trades}.dbn.zst`
as a batch download split by day writes them. Records are built as numpy structured arrays with the
importer's own record layouts (`databento.RECORD_FIELDS`, checked against databento-dbn's decoder in
tests/market/test_databento.py) and compressed by databento-dbn's encoder. The same arguments give the
same bytes.
"""

from __future__ import annotations

import argparse
from datetime import date, timedelta
from pathlib import Path
from types import SimpleNamespace

import databento_dbn as dbn
import numpy as np

from fox_numba.market.calendar import session_bounds, trading_days
from fox_numba.market.databento import RECORD_FIELDS, RTYPES
from fox_numba.market.schema import N_LEVELS, Instrument

ES = Instrument()
SYMBOL, INSTRUMENT_ID = "ESU4", 118
FIRST_DAY = "2024-07-08"
PX = 5_500_000_000_000
"""5500.00 in fixed-point units: the walk's start."""
TRADES_PER_ROW = 0.25


def records(schema: str, n: int) -> np.ndarray:
    """`n` zeroed records of `schema` with their header filled (length in 4-byte words, rtype, ids)."""
    rec = np.zeros(n, dtype=np.dtype(RECORD_FIELDS[schema]))
    rec["length"] = rec.dtype.itemsize // 4
    rec["rtype"] = RTYPES[schema]
    rec["publisher_id"] = 1
    rec["instrument_id"] = INSTRUMENT_ID
    return rec


def day_records(day: str, rows: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """MBP-10 and trade records of one trading day's regular session."""
    open_ns, close_ns = session_bounds(day, ES)
    ts = np.uint64(open_ns) + (np.arange(rows, dtype=np.uint64) * np.uint64((close_ns - open_ns) // rows))
    tick = ES.tick_fixed
    bid0 = PX + tick * np.cumsum(rng.choice(np.array([-1, 0, 0, 0, 0, 0, 0, 1]), rows))
    book = records("mbp10", rows)
    book["ts_event"], book["ts_recv"] = ts, ts + np.uint64(500)
    book["price"], book["size"], book["action"], book["side"] = bid0, 1, b"A", b"B"
    book["flags"], book["sequence"] = dbn.F_LAST, np.arange(rows, dtype=np.uint32)
    depth = np.arange(N_LEVELS, dtype=np.int64) * tick
    lv = book["levels"]
    lv["bid_px"], lv["ask_px"] = bid0[:, None] - depth, bid0[:, None] + tick + depth
    for name, high in (("bid_sz", 200), ("ask_sz", 200), ("bid_ct", 20), ("ask_ct", 20)):
        lv[name] = rng.integers(1, high + 1, size=(rows, N_LEVELS), dtype=np.uint32)
    n_trades = int(rows * TRADES_PER_ROW)
    at = np.sort(rng.integers(0, rows - 1, size=n_trades))  # a trade falls before the last book record
    buy = rng.random(n_trades) < 0.5
    trades = records("trades", n_trades)
    trades["ts_event"] = ts[at] + np.uint64(1)
    trades["ts_recv"] = trades["ts_event"] + np.uint64(500)
    trades["price"] = np.where(buy, bid0[at] + tick, bid0[at])
    trades["size"] = rng.integers(1, 11, size=n_trades, dtype=np.uint32)
    trades["action"], trades["side"] = b"T", np.where(buy, b"B", b"A")
    return book, trades


def write_dbn(path: Path, schema: dbn.Schema, rec: np.ndarray, start: int) -> None:
    """A DBN+zstd file: metadata mapping ESU4 to its instrument_id (end: a minute after the last record), then
    the records."""
    first = date(1970, 1, 1) + timedelta(days=start // 86_400_000_000_000)
    interval = SimpleNamespace(start_date=first, end_date=first + timedelta(days=1), symbol=str(INSTRUMENT_ID))
    meta = dbn.Metadata(
        dataset="GLBX.MDP3", start=start, stype_in=dbn.SType.RAW_SYMBOL, stype_out=dbn.SType.INSTRUMENT_ID,
        schema=schema, symbols=[SYMBOL], end=int(rec["ts_recv"].max()) + 60 * 10**9,
        mappings=[SimpleNamespace(raw_symbol=SYMBOL, intervals=[interval])],
    )  # fmt: skip
    with path.open("wb") as fh, dbn.Transcoder(fh, dbn.Encoding.DBN, dbn.Compression.ZSTD) as out:
        out.write(bytes(meta.encode()))
        step = 1 << 16
        for k in range(0, rec.size, step):
            out.write(rec[k : k + step].tobytes())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder to write the daily files into")
    parser.add_argument("--rows", type=int, default=100_000, help="MBP-10 records per day")
    parser.add_argument("--days", type=int, default=3, help="trading days")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    for day in trading_days(FIRST_DAY, args.days, ES.calendar):
        book, trades = day_records(day, args.rows, rng)
        start = session_bounds(day, ES)[0] - 3600 * 10**9
        stem = f"glbx-mdp3-{day.replace('-', '')}"
        write_dbn(args.out / f"{stem}.mbp-10.dbn.zst", dbn.Schema.MBP_10, book, start)
        write_dbn(args.out / f"{stem}.trades.dbn.zst", dbn.Schema.TRADES, trades, start)
        print(f"{day}: {book.size:,} mbp-10, {trades.size:,} trades")


if __name__ == "__main__":
    main()
