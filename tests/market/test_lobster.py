"""LOBSTER import: the real AAPL sample (first 999 events of 2012-06-21) and small pairs written here."""

import csv
from datetime import UTC, datetime
from pathlib import Path

import pytest

from fox_numba.errors import InputError
from fox_numba.market.lobster import LobsterPair, equity_instrument, find_pairs, read_pair
from fox_numba.market.schema import UNDEF_PRICE

AAPL = Path(__file__).parents[1] / "fixtures" / "lobster_aapl_head"
INST = equity_instrument("AAPL")
NAME = "AAPL_2012-06-21_34200000_57600000_{kind}_{levels}.csv"
MIDNIGHT = int(datetime(2012, 6, 21, 4, tzinfo=UTC).timestamp()) * 10**9  # 00:00 EDT


def rows(path: Path) -> list[list[str]]:
    with path.open() as fh:
        return list(csv.reader(fh))


def test_real_sample():
    pairs = find_pairs(AAPL)
    assert len(pairs) == 1 and pairs[0].ticker == "AAPL" and pairs[0].levels == 10
    day = read_pair(pairs[0], INST)
    messages, books = rows(pairs[0].message), rows(pairs[0].orderbook)
    assert day.day == "2012-06-21" and len(messages) == len(books) == 999

    # Book: first row exactly, and one row per book change (unchanged rows, e.g. hidden executions, dropped).
    book = day.mbp10
    assert book.ts_event[0] == MIDNIGHT + 34200_004241176
    assert (book.ask_px[0, 0], book.ask_sz[0, 0], book.bid_px[0, 0], book.bid_sz[0, 0]) == (585_940_000_000, 200, 585_330_000_000, 18)
    assert book.bid_px[0, 9] == 584_270_000_000 and book.ask_px[0, 9] == 587_900_000_000
    changed = [i for i in range(len(books)) if i == 0 or books[i] != books[i - 1]]
    assert len(changed) == book.ts_event.size == 938
    assert not book.bid_ct.any() and not book.ask_ct.any()

    # Trades: executions (types 4, 5); the aggressor is opposite to the resting order's direction.
    executions = [m for m in messages if m[1] in ("4", "5")]
    assert day.trades.ts_event.size == len(executions) == 159
    assert day.trades.side.tolist() == [-int(m[5]) for m in executions]
    assert day.trades.price.tolist() == [int(m[4]) * 100_000 for m in executions]
    assert int(day.trades.size.sum()) == sum(int(m[3]) for m in executions) == 10_592
    prices = [int(m[4]) * 100_000 for m in executions]
    assert (day.bars.open[0], day.bars.high[0], day.bars.low[0], day.bars.close[0]) == (prices[0], max(prices), min(prices), prices[-1])


def write_pair(folder: Path, messages: list[list], books: list[list], levels: int = 2) -> LobsterPair:
    for kind, lines in (("message", messages), ("orderbook", books)):
        (folder / NAME.format(kind=kind, levels=levels)).write_text("".join(",".join(map(str, r)) + "\n" for r in lines))
    return LobsterPair.of(folder / NAME.format(kind="message", levels=levels))


OPEN = 34200.5
EMPTY_ASK, EMPTY_BID = 9999999999, -9999999999


def test_empty_levels_padding_and_side(tmp_path):
    pair = write_pair(
        tmp_path,
        [[OPEN, 1, 1, 100, 1000000, 1], [OPEN + 1, 4, 2, 30, 1001000, -1], [OPEN + 2, 5, 3, 10, 1000500, 1]],
        [
            [1001000, 50, 1000000, 100, EMPTY_ASK, 0, EMPTY_BID, 0],
            [1001000, 20, 1000000, 100, EMPTY_ASK, 0, EMPTY_BID, 0],
            [1001000, 20, 1000000, 100, EMPTY_ASK, 0, EMPTY_BID, 0],  # hidden execution: book unchanged
        ],
    )
    day = read_pair(pair, INST)
    assert day.mbp10.ask_px[0].tolist() == [100_100_000_000] + [UNDEF_PRICE] * 9
    assert day.mbp10.bid_sz[0].tolist() == [100] + [0] * 9
    assert day.mbp10.ts_event.tolist() == [MIDNIGHT + 34200_500000000, MIDNIGHT + 34201_500000000, MIDNIGHT + 34202_500000000]
    assert day.trades.side.tolist() == [1, -1] and day.trades.price.tolist() == [100_100_000_000, 100_050_000_000]


def rejects(pair_or_call, path: Path, group: str | None, field: str | None, row: int | None, words: str) -> None:
    with pytest.raises(InputError) as info:
        pair_or_call()
    e = info.value
    assert (e.path, e.group, e.field, e.row) == (str(path), group, field, row), str(e)
    assert words in e.reason, e.reason


BOOK = [1001000, 50, 1000000, 100, 1002000, 5, 999000, 7]


def test_crossed_book_names_the_orderbook_row(tmp_path):
    crossed = [1000000, 50, 1000000, 100, 1002000, 5, 999000, 7]
    pair = write_pair(tmp_path, [[OPEN, 1, 1, 1, 1, 1]] * 1 + [[OPEN + 1, 1, 2, 1, 1, 1]], [BOOK, crossed])
    rejects(lambda: read_pair(pair, INST), pair.orderbook, "orderbook 2012-06-21", "bid_px_00", 1, "locked book after the session open")


def test_empty_level_with_a_size(tmp_path):
    pair = write_pair(tmp_path, [[OPEN, 1, 1, 1, 1, 1]], [[1001000, 50, 1000000, 100, EMPTY_ASK, 3, 999000, 7]])
    rejects(lambda: read_pair(pair, INST), pair.orderbook, "orderbook 2012-06-21", "ask_sz_01", 0, "empty level (UNDEF_PRICE) with a non-zero size")


def test_bad_message_fields(tmp_path):
    pair = write_pair(tmp_path, [[OPEN, 1, 1, 1, 1, 1], [OPEN + 1, 4, 2, 10, 1001000, 0]], [BOOK, BOOK])
    rejects(lambda: read_pair(pair, INST), pair.message, None, "direction", 1, "direction 0 is not +1 or -1")
    pair = write_pair(tmp_path, [[OPEN + 1, 1, 1, 1, 1, 1], [OPEN, 1, 2, 10, 1001000, 1]], [BOOK, BOOK])
    rejects(lambda: read_pair(pair, INST), pair.message, None, "time", 1, "time decreases")
    pair = write_pair(tmp_path, [[OPEN, 1, 1, 1, 1, 1], [90000, 1, 2, 10, 1001000, 1]], [BOOK, BOOK])
    rejects(lambda: read_pair(pair, INST), pair.message, None, "time", 1, "not seconds after midnight")
    pair = write_pair(tmp_path, [[OPEN, 1, 1, 1, 1, 1], [OPEN + 1, 4, 2, 0, 1001000, 1]], [BOOK, BOOK])
    rejects(lambda: read_pair(pair, INST), pair.message, "executions 2012-06-21", "size", 1, "zero size")
    pair = write_pair(tmp_path, [[OPEN, 1, 1, 1, 1, 1], [OPEN + 1, 4, 2, 2.5, 1001000, 1]], [BOOK, BOOK])
    rejects(lambda: read_pair(pair, INST), pair.message, "executions 2012-06-21", "size", 1, "fractional value")


def test_bad_files(tmp_path):
    pair = write_pair(tmp_path, [[OPEN, 1, 1, 1, 1, 1]], [BOOK, BOOK])
    rejects(lambda: read_pair(pair, INST), pair.orderbook, None, None, None, "2 rows, but the message file has 1")
    pair = write_pair(tmp_path, [[OPEN, 1, 1, 1, 1, 1]], [BOOK[:6]])
    rejects(lambda: read_pair(pair, INST), pair.orderbook, None, None, 0, "6 fields, expected 8")
    pair = write_pair(tmp_path, [[OPEN, 1, 1, 1, 1, 1]], [["x"] + BOOK[1:]])
    rejects(lambda: read_pair(pair, INST), pair.orderbook, None, "ask_price_1", 0, "'x' is not an integer")
    pair = write_pair(tmp_path, [[OPEN, 1, 1, 1, 1, 1]], [[1001000, -5, 1000000, 100, 1002000, 5, 999000, 7]])
    rejects(lambda: read_pair(pair, INST), pair.orderbook, "orderbook 2012-06-21", "ask_sz_00", 0, "negative value")
    pair = write_pair(tmp_path, [], [])
    rejects(lambda: read_pair(pair, INST), pair.message, None, None, None, "the file holds no rows")
    pair.orderbook.unlink()
    rejects(lambda: LobsterPair.of(pair.message), pair.message, None, None, None, "its orderbook file AAPL_2012-06-21_34200000_57600000_orderbook_2.csv is missing")
    odd = tmp_path / "AAPL_message.csv"
    odd.write_text("")
    rejects(lambda: LobsterPair.of(odd), odd, None, None, None, "not a LOBSTER file name")


def test_malformed_rows_are_named_in_our_words_with_0_based_rows(tmp_path):
    messages = [[OPEN, 1, 1, 1, 1, 1], [OPEN + 1, 1, 2, 10, 1001000, 1], [OPEN + 2, 1, 3, 10, 1001000]]
    pair = write_pair(tmp_path, messages, [BOOK] * 3)  # numpy: "the number of columns changed ... at row 3; use `usecols`"
    rejects(lambda: read_pair(pair, INST), pair.message, None, None, 2, "5 fields, expected 6")
    with pytest.raises(InputError) as info:
        read_pair(pair, INST)
    assert str(info.value) == f"{pair.message}, row 2: 5 fields, expected 6"
    pair = write_pair(tmp_path, [[OPEN, 1, 1, 1, 1, 1], [OPEN + 1, 4, 2, 10, "nan", 1]], [BOOK, BOOK])
    rejects(lambda: read_pair(pair, INST), pair.message, None, "price", 1, "NaN or infinite value")  # was "non-positive price"
    pair = write_pair(tmp_path, [[OPEN, 1, 1, 1, 1, 1]] * 2, [BOOK, [*BOOK[:6], "nan", 7]])
    rejects(lambda: read_pair(pair, INST), pair.orderbook, None, "bid_price_2", 1, "'nan' is not an integer")
    pair.message.write_bytes(b"\xff\xfe" + bytes(range(200)))
    rejects(lambda: read_pair(pair, INST), pair.message, None, None, None, "not a LOBSTER CSV (not UTF-8 text)")
