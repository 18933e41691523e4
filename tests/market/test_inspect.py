"""`fox data inspect`: exact per-day numbers on a store built here, the table, and --json."""

import json

import numpy as np
from typer.testing import CliRunner

from fox_numba.cli import app
from fox_numba.market import inspect as inspect_module
from fox_numba.market.bars import bars_from_trades
from fox_numba.market.calendar import session_bounds
from fox_numba.market.inspect import summarize
from fox_numba.market.schema import UNDEF_PRICE, Instrument, MarketDay, Mbp10, Trades, to_fixed
from fox_numba.market.store import write_store

INST = Instrument()
DAY = "2024-07-02"
OPEN = session_bounds(DAY, INST)[0]
S = 10**9
TICK = INST.tick_fixed


def make_store(path):
    # Five book rows: spreads 1, 1, 2, 3 ticks and one row with an empty ask (one-sided).
    ts = np.array([OPEN - 10 * S, OPEN, OPEN + 2 * S, OPEN + 65 * S, OPEN + 70 * S], dtype=np.uint64)
    bid = to_fixed(4000.0) + np.zeros(5, dtype=np.int64)
    spread = np.array([1, 1, 2, 3, 1]) * TICK
    depth = np.arange(10) * TICK
    sz = np.tile(np.arange(1, 11, dtype=np.uint32), (5, 1))
    bid_px, ask_px = bid[:, None] - depth, (bid + spread)[:, None] + depth
    ask_sz = sz * 3
    ask_px[4], ask_sz[4] = UNDEF_PRICE, 0
    book = Mbp10(ts, bid_px, ask_px, sz, ask_sz, sz, np.where(ask_sz > 0, 1, 0).astype(np.uint32))
    trades = Trades(ts[[1, 2, 3]] + 5, bid[[1, 2, 3]], np.array([2, 3, 4], dtype=np.uint32), np.array([1, -1, 1], dtype=np.int8))
    write_store(path, INST, [MarketDay(DAY, bars_from_trades(trades), book, trades)], attrs={"seed": 3})
    return path


def test_summary_numbers(tmp_path):
    summary = summarize(make_store(tmp_path / "s.h5"))
    assert summary["attrs"] == {"seed": 3} and summary["schemas"] == {"bars": 1, "mbp10": 1, "trades": 1}
    (day,) = summary["days"]
    assert day["rows"] == {"bars": 2, "mbp10": 5, "trades": 3}
    assert day["first"] == "2024-07-02 09:29:50.000000" and day["last"] == "2024-07-02 09:31:10.000000"
    assert day["median_spread_ticks"] == 1.5  # rows with both sides: 1, 1, 2, 3
    assert day["mean_top_depth"] == 2.0  # (1 + 3) / 2 on every two-sided row
    assert day["one_sided_rows"] == 1
    assert (day["trades"], day["volume"]) == (3, 9)
    assert day["missing_minutes"] == 390 - 2
    assert day["longest_book_gap_s"] == 63.0


def test_cli_table_and_json(tmp_path):
    path = make_store(tmp_path / "s.h5")
    runner = CliRunner()
    result = runner.invoke(app, ["data", "inspect", str(path)])
    assert result.exit_code == 0, result.output
    assert "ES (tick 0.25, $50/point, session 09:30-16:00 America/New_York)" in result.output
    assert "2024-07-02" in result.output and "1.50" in result.output and "63.000" in result.output
    result = runner.invoke(app, ["data", "inspect", str(path), "--json"])
    assert result.exit_code == 0
    assert json.loads(result.output) == json.loads(json.dumps(summarize(path)))


def test_a_day_read_a_chunk_at_a_time_gives_the_whole_days_numbers(four_day_market, tmp_path, monkeypatch):
    """At 37 rows a chunk (180 chunks a day), every number is the one the whole day's arrays give: the median
    spread exactly (from the spreads' counts), the mean top depth to rounding (an integer sum against np.mean's)."""
    m = four_day_market
    path = write_store(tmp_path / "four.h5", m.instrument, m.days[:2])
    monkeypatch.setattr(inspect_module, "READ_ROWS", 37)
    seen = []
    summary = summarize(path, seen.append)
    assert seen == [f"reading {d.day} ({k + 1} of 2)" for k, d in enumerate(m.days[:2])]
    for got, day in zip(summary["days"], m.days[:2], strict=True):
        book, trades = day.mbp10, day.trades
        bid, ask = book.bid_px[:, 0], book.ask_px[:, 0]
        both = (bid != UNDEF_PRICE) & (ask != UNDEF_PRICE)
        assert got["rows"] == {"bars": day.bars.ts_event.size, "mbp10": bid.size, "trades": trades.ts_event.size}
        assert got["median_spread_ticks"] == float(np.median((ask[both] - bid[both]) / INST.tick_fixed))
        depth = np.mean((book.bid_sz[both, 0].astype(np.float64) + book.ask_sz[both, 0]) / 2)
        assert abs(got["mean_top_depth"] - depth) <= 1e-12 * depth
        assert got["longest_book_gap_s"] == float(np.diff(book.ts_event).max()) / 1e9
        assert (got["trades"], got["volume"]) == (trades.ts_event.size, int(trades.size.sum()))
        open_ns, close_ns = session_bounds(day.day, INST)
        in_session = (book.ts_event >= np.uint64(open_ns)) & (book.ts_event < np.uint64(close_ns))
        assert got["one_sided_rows"] == int(np.count_nonzero(in_session & ~both))


def test_the_median_of_an_even_count_is_the_mean_of_the_middle_two(tmp_path, monkeypatch):
    """The store above, two rows a chunk: two-sided spreads 1, 1, 2, 3 ticks over three chunks."""
    monkeypatch.setattr(inspect_module, "READ_ROWS", 2)
    (day,) = summarize(make_store(tmp_path / "s.h5"))["days"]
    assert day["median_spread_ticks"] == 1.5 and day["mean_top_depth"] == 2.0 and day["longest_book_gap_s"] == 63.0
