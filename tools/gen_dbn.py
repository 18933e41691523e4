"""Generate daily Databento DBN+zstd files (MBP-10 and trades of one ES contract) for import benchmarks.

    python tools/gen_dbn.py OUT_FOLDER --rows 1000000 --days 3 [--seed 0]

Per trading day (weekdays from 2024-07-08): `--rows` MBP-10 records over the regular session (09:30-16:00
New York) of a one-tick-spread book, and `--rows / 4` trades at the touch inside the book's time range. `--book`
chooses how the book moves from one record to the next:
- `events` (the default): one book change per record, as a real MBP-10 feed has. A share `--shift` of the records
  moves the book one tick (one side gains a new top level, the other loses its top, every level after shifts); the
  others change the size (and order count) of one level of one side.
- `fresh`: every size and order count of every record drawn anew, and the touch a random walk moving on a quarter
  of the records: the worst case for compression, kept to compare with the figures measured on it.
Files are `glbx-mdp3-YYYYMMDD.{mbp-10,trades}.dbn.zst`, as a batch download split by day writes them. Records are
built as numpy structured arrays with the importer's own record layouts (`databento.RECORD_FIELDS`, checked against
databento-dbn's decoder in tests/market/test_databento.py) and compressed by databento-dbn's encoder. The same
arguments give the same bytes.
"""

from __future__ import annotations

import argparse
from datetime import date, timedelta
from pathlib import Path
from types import SimpleNamespace

import databento_dbn as dbn
import numpy as np
from numba import njit

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


SHIFT_SHARE = 0.037
"""`--shift` by default: the share of records that move a top price in real ESU4 MBP-1 (Databento, 2024-07-01
23:58-00:02 UTC, 2,288 records, tests/fixtures/databento_esu4_mbp1; 91 % change only a top size). An MBP-10 feed
adds the events of levels 2-10, none of which moves the touch, so its share is lower: this errs towards a book that
compresses worse."""
SIZES, COUNTS = 200, 20
"""Sizes and order counts are drawn from 1..SIZES and 1..COUNTS."""


def fresh_book(rows: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The touch (bid price per record) and [rows, 2, N_LEVELS] sizes and counts (bid, ask), all drawn anew."""
    bid0 = PX + ES.tick_fixed * np.cumsum(rng.choice(np.array([-1, 0, 0, 0, 0, 0, 0, 1]), rows))
    bid_sz, ask_sz, bid_ct, ask_ct = (
        rng.integers(1, high + 1, size=(rows, N_LEVELS), dtype=np.uint32) for high in (SIZES, SIZES, COUNTS, COUNTS)
    )
    return bid0, np.stack([bid_sz, ask_sz], axis=1), np.stack([bid_ct, ask_ct], axis=1)


def event_book(rows: int, shift: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
    """As `fresh_book`, with one book change per record (`--book events`), and each record's event: the side
    (0 bid, 1 ask), level, size and whether it adds (an add or a new level) or cancels."""
    draws = {
        "shift": rng.random(rows) < shift, "up": rng.random(rows) < 0.5, "side": rng.integers(0, 2, rows),
        "level": rng.integers(0, N_LEVELS, rows), "delta": rng.integers(1, 11, rows) * rng.choice([-1, 1], rows),
        "sz": rng.integers(1, SIZES + 1, (rows, 2, N_LEVELS)).astype(np.uint32),
        "ct": rng.integers(1, COUNTS + 1, (rows, 2, N_LEVELS)).astype(np.uint32),
    }  # fmt: skip
    moves, event_size = _evolve(**draws)
    event = {"side": draws["side"], "level": draws["level"], "size": np.abs(event_size).astype(np.uint32),
             "add": event_size > 0}  # fmt: skip
    return PX + ES.tick_fixed * np.cumsum(moves), draws["sz"], draws["ct"], event


@njit
def _evolve(shift, up, side, level, delta, sz, ct):  # noqa: ANN001, ANN202 (numba)
    """Evolve the book over `sz` / `ct` in place. They hold fresh draws: row 0 keeps them all (the opening book), a
    shift row only for the level it opens. A change row adds `delta` to one level's size and one order to its count,
    or cancels `-delta` and one order (a cancel larger than the level adds instead), so every record differs from
    the one before. Returns the touch's move per record (-1, 0, +1) and the size each record adds (> 0) or cancels
    (< 0); `side` and `level` are set to a shift row's new level."""
    rows, n = sz.shape[0], sz.shape[2]
    moves, event_size = np.zeros(rows, np.int64), np.zeros(rows, np.int64)
    for r in range(1, rows):
        if shift[r]:
            gain, lose = (0, 1) if up[r] else (1, 0)  # an up-tick: the bid gains a level, the ask loses its top
            moves[r] = 1 if up[r] else -1
            for k in range(1, n):
                sz[r, gain, k], ct[r, gain, k] = sz[r - 1, gain, k - 1], ct[r - 1, gain, k - 1]
            for k in range(n - 1):
                sz[r, lose, k], ct[r, lose, k] = sz[r - 1, lose, k + 1], ct[r - 1, lose, k + 1]
            side[r], level[r], event_size[r] = gain, 0, sz[r, gain, 0]
        else:
            s, k = side[r], level[r]
            sz[r], ct[r] = sz[r - 1], ct[r - 1]
            d = delta[r] if np.int64(sz[r, s, k]) + delta[r] >= 1 else -delta[r]
            sz[r, s, k] = np.int64(sz[r, s, k]) + d
            ct[r, s, k] = np.int64(ct[r, s, k]) + 1 if d > 0 else max(np.int64(ct[r, s, k]) - 1, 1)
            event_size[r] = d
    return moves, event_size


def day_records(
    day: str, rows: int, rng: np.random.Generator, book_kind: str = "events", shift: float = SHIFT_SHARE
) -> tuple[np.ndarray, np.ndarray]:
    """MBP-10 and trade records of one trading day's regular session. With `events`, each record also says what
    changed (action, side, depth, price, size), the records arrive at uneven times and after uneven delays."""
    open_ns, close_ns = session_bounds(day, ES)
    tick = ES.tick_fixed
    book = records("mbp10", rows)
    book["flags"], book["sequence"] = dbn.F_LAST, np.arange(rows, dtype=np.uint32)
    if book_kind == "fresh":
        ts = np.uint64(open_ns) + (np.arange(rows, dtype=np.uint64) * np.uint64((close_ns - open_ns) // rows))
        bid0, sz, ct = fresh_book(rows, rng)
        book["ts_event"], book["ts_recv"] = ts, ts + np.uint64(500)
        book["price"], book["size"], book["action"], book["side"] = bid0, 1, b"A", b"B"
    else:
        bid0, sz, ct, event = event_book(rows, shift, rng)
        ts = np.sort(rng.integers(open_ns, close_ns, rows, dtype=np.int64)).astype(np.uint64)
        book["ts_event"] = ts
        book["ts_recv"] = ts + rng.integers(200, 5_000, rows).astype(np.uint64)
        book["ts_in_delta"] = rng.integers(5_000, 50_000, rows)
        ask = event["side"] == 1
        book["side"], book["action"] = np.where(ask, b"A", b"B"), np.where(event["add"], b"A", b"C")
        book["depth"], book["size"] = event["level"], event["size"]
        book["price"] = np.where(ask, bid0 + tick, bid0) + np.where(ask, 1, -1) * event["level"] * tick
    depth = np.arange(N_LEVELS, dtype=np.int64) * tick
    lv = book["levels"]
    lv["bid_px"], lv["ask_px"] = bid0[:, None] - depth, bid0[:, None] + tick + depth
    lv["bid_sz"], lv["ask_sz"], lv["bid_ct"], lv["ask_ct"] = sz[:, 0], sz[:, 1], ct[:, 0], ct[:, 1]
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder to write the daily files into")
    parser.add_argument("--rows", type=int, default=100_000, help="MBP-10 records per day")
    parser.add_argument("--days", type=int, default=3, help="trading days")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--book", choices=("events", "fresh"), default="events",
                        help="one book change per record (events) or every size drawn anew on every record (fresh)")
    parser.add_argument("--shift", type=float, default=SHIFT_SHARE,
                        help="share of records that move the book one tick (--book events)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    for day in trading_days(FIRST_DAY, args.days, ES.calendar):
        book, trades = day_records(day, args.rows, rng, args.book, args.shift)
        start = session_bounds(day, ES)[0] - 3600 * 10**9
        stem = f"glbx-mdp3-{day.replace('-', '')}"
        write_dbn(args.out / f"{stem}.mbp-10.dbn.zst", dbn.Schema.MBP_10, book, start)
        write_dbn(args.out / f"{stem}.trades.dbn.zst", dbn.Schema.TRADES, trades, start)
        print(f"{day}: {book.size:,} mbp-10, {trades.size:,} trades")


if __name__ == "__main__":
    main()
