"""Every bad-input class the store rejects, each checked for the file, group, field and row it names."""

import time
from dataclasses import replace

import numpy as np
import pytest

from fox_numba.errors import InputError
from fox_numba.market.bars import bars_from_trades
from fox_numba.market.calendar import day_bounds, session_bounds
from fox_numba.market.schema import NS_PER_MINUTE, UNDEF_PRICE, Instrument, MarketDay, Mbp10, Trades, to_fixed
from fox_numba.market.validate import (
    UNDEF_TIMESTAMP,
    RowWhere,
    _check_levels,
    _levels_faulty,
    equals_previous,
    validate_day,
    validate_instrument,
)

INST = Instrument()
DAY = "2024-07-02"
OPEN = session_bounds(DAY, INST)[0]
TICK = INST.tick_fixed
SEC = 1_000_000_000


def make_day(n: int = 40) -> MarketDay:
    """A valid ES day: a book updated every 30 s from 5 minutes before the open, a trade after every
    other update, and bars built from the trades."""
    ts = (OPEN - 5 * NS_PER_MINUTE + np.arange(n) * 30 * SEC).astype(np.uint64)
    bid0 = to_fixed(5500.0) + (np.arange(n) % 3) * TICK
    depth = np.arange(10) * TICK
    sizes = (10 + np.arange(n)[:, None] + np.arange(10)).astype(np.uint32)
    book = Mbp10(ts, bid0[:, None] - depth, bid0[:, None] + TICK + depth, sizes, sizes + 1, sizes // 5 + 1, sizes // 5 + 1)
    k = np.arange(1, n - 1, 2)
    trades = Trades(ts[k] + 1000, bid0[k], (k % 7 + 1).astype(np.uint32), np.where(k % 4 == 1, 1, -1).astype(np.int8))
    return MarketDay(DAY, bars_from_trades(trades), book, trades)


def rejects(day: MarketDay, group: str, field: str | None, row: int | None, words: str) -> InputError:
    with pytest.raises(InputError) as info:
        validate_day(day, INST, "m.h5")
    e = info.value
    assert (e.path, e.group, e.field, e.row) == ("m.h5", group, field, row), str(e)
    assert words in e.reason
    where = ", ".join(["m.h5", f"group {group}"] + ([f"field {field}"] if field else []) + ([f"row {row}"] if row is not None else []))
    assert str(e).startswith(where + ": ")
    return e


BOOK, TRADES, BARS = f"/mbp10/{DAY}", f"/trades/{DAY}", f"/bars/{DAY}"


def test_a_valid_day_passes_and_is_cast_to_store_dtypes():
    day = make_day()
    day.trades.size = day.trades.size.astype(np.int64)
    day.mbp10.bid_px = day.mbp10.bid_px.astype(np.float64)
    out = validate_day(day, INST, "m.h5")
    assert out.trades.size.dtype == np.uint32 and out.mbp10.bid_px.dtype == np.int64
    np.testing.assert_array_equal(out.mbp10.bid_px, make_day().mbp10.bid_px)


def test_unsorted_timestamps():
    day = make_day()
    day.mbp10.ts_event[7] = day.mbp10.ts_event[5]
    rejects(day, BOOK, "ts_event", 7, "ts_event decreases")
    day = make_day()
    day.trades.ts_event[3], day.trades.ts_event[4] = day.trades.ts_event[4], day.trades.ts_event[3]
    rejects(day, TRADES, "ts_event", 4, "ts_event decreases")


def test_duplicate_bar_minute():
    day = make_day()
    day.trades = None
    day.bars.ts_event[2] = day.bars.ts_event[1]
    rejects(day, BARS, "ts_event", 2, "duplicate minute")


def test_duplicate_book_row_but_equal_timestamps_with_a_change_are_fine():
    day = make_day()
    day.mbp10.ts_event[6] = day.mbp10.ts_event[5]
    validate_day(day, INST, "m.h5")  # same instant, different book: one packet, two changes
    for name in ("bid_px", "ask_px", "bid_sz", "ask_sz", "bid_ct", "ask_ct"):
        getattr(day.mbp10, name)[6] = getattr(day.mbp10, name)[5]
    rejects(day, BOOK, "ts_event", 6, "duplicate row")


def test_a_row_equals_the_one_before_only_in_every_level_of_every_column():
    """`equals_previous`, which the duplicate check and the importer's unchanged-book rule use: rows 1 and 2 repeat
    row 0 but for the deepest ask count of row 2; one differing element of any column makes a row differ."""
    px = np.tile(np.arange(10, dtype=np.int64), (4, 1))
    ct = np.ones((4, 10), dtype=np.uint32)
    ct[2, 9] = 2
    px[3, 0] = -1
    assert equals_previous([px, ct]).tolist() == [True, False, False]
    assert equals_previous([px[:1], ct[:1]]).tolist() == []


def test_identical_trades_at_one_instant_are_allowed():
    day = make_day()
    t = day.trades
    day.trades = Trades(np.repeat(t.ts_event, 2), np.repeat(t.price, 2), np.repeat(t.size, 2), np.repeat(t.side, 2))
    day.bars = bars_from_trades(day.trades)
    assert validate_day(day, INST, "m.h5").trades.ts_event.size == 2 * t.ts_event.size


def test_bar_not_on_a_minute_start():
    day = make_day()
    day.trades = None
    day.bars.ts_event[3] += 1
    rejects(day, BARS, "ts_event", 3, "not the start of a minute")


def test_timestamp_outside_the_trading_day_and_undefined():
    day = make_day()
    day.mbp10.ts_event[0] = day_bounds(DAY, INST)[0] - 1
    e = rejects(day, BOOK, "ts_event", 0, "outside trading day 2024-07-02")
    assert e.reason.startswith("2024-07-01 16:59:59.999999 America/New_York is outside")
    assert e.reason.endswith("set by --day-roll 17:00 and --calendar us)")
    day = make_day()
    day.mbp10.ts_event[0] = UNDEF_TIMESTAMP
    rejects(day, BOOK, "ts_event", 0, "undefined timestamp")


def test_crossed_and_locked_book_after_the_open():
    day = make_day()
    row = 20  # 5 minutes after the open
    day.mbp10.bid_px[row, 0] = day.mbp10.ask_px[row, 0] + TICK
    e = rejects(day, BOOK, "bid_px_00", row, "crossed book after the session open")
    assert "bid 5501 >= ask 5500.75 at 2024-07-02 09:35:00.000000 America/New_York" in e.reason
    assert e.reason.endswith("(a crossed book is allowed only before the session open, --session-open 09:30)")
    day = make_day()
    day.mbp10.bid_px[row, 0] = day.mbp10.ask_px[row, 0]
    rejects(day, BOOK, "bid_px_00", row, "locked book")


def test_crossed_book_in_the_pre_open_is_allowed():
    day = make_day()
    day.mbp10.bid_px[3, 0] = day.mbp10.ask_px[3, 0] + TICK  # 3.5 minutes before the open
    validate_day(day, INST, "m.h5")


def test_empty_levels():
    day = make_day()
    day.mbp10.ask_px[4, 7:] = UNDEF_PRICE  # sizes left non-zero
    rejects(day, BOOK, "ask_sz_07", 4, "empty level (UNDEF_PRICE) with a non-zero size")
    day = make_day()
    day.mbp10.bid_px[4, 7:] = UNDEF_PRICE
    day.mbp10.bid_sz[4, 7:] = 0
    rejects(day, BOOK, "bid_ct_07", 4, "non-zero order count")
    day = make_day()
    day.mbp10.bid_px[9, 3] = UNDEF_PRICE
    day.mbp10.bid_sz[9, 3] = day.mbp10.bid_ct[9, 3] = 0
    rejects(day, BOOK, "bid_px_04", 9, "priced level below an empty level")


def test_one_sided_book_is_allowed():
    day = make_day()
    day.mbp10.ask_px[25:27] = UNDEF_PRICE
    day.mbp10.ask_sz[25:27] = day.mbp10.ask_ct[25:27] = 0
    validate_day(day, INST, "m.h5")


def test_priced_level_with_zero_size_and_misordered_levels():
    day = make_day()
    day.mbp10.ask_sz[11, 2] = 0
    rejects(day, BOOK, "ask_sz_02", 11, "priced level with zero size")
    day = make_day()
    day.mbp10.bid_px[12, 5] = day.mbp10.bid_px[12, 4]
    rejects(day, BOOK, "bid_px_05", 12, "bid prices are not strictly falling")
    day = make_day()
    day.mbp10.ask_px[12, 1] = day.mbp10.ask_px[12, 0] - TICK
    rejects(day, BOOK, "ask_px_01", 12, "ask prices are not strictly rising")


def test_nan_negative_and_fractional_values():
    day = make_day()
    day.trades.price = day.trades.price.astype(np.float64)
    day.trades.price[5] = np.nan
    rejects(day, TRADES, "price", 5, "NaN or infinite value")
    day = make_day()
    day.mbp10.bid_sz = day.mbp10.bid_sz.astype(np.int64)
    day.mbp10.bid_sz[8, 2] = -3
    rejects(day, BOOK, "bid_sz_02", 8, "negative value")
    day = make_day()
    day.trades.size = day.trades.size.astype(np.float64)
    day.trades.size[2] = 1.5
    rejects(day, TRADES, "size", 2, "fractional value")


def test_non_positive_and_undefined_prices():
    day = make_day()
    day.trades.price[6] = -to_fixed(1.0)
    rejects(day, TRADES, "price", 6, "non-positive price")
    day = make_day()
    day.mbp10.ask_px[2, 9] = 0
    rejects(day, BOOK, "ask_px_09", 2, "non-positive price")
    day = make_day()
    day.trades = None
    day.bars.low[1] = UNDEF_PRICE
    rejects(day, BARS, "low", 1, "undefined price")


def test_trade_size_and_side():
    day = make_day()
    day.trades.size[4] = 0
    rejects(day, TRADES, "size", 4, "zero size")
    day = make_day()
    day.trades.side[1] = 2
    rejects(day, TRADES, "side", 1, "side must be -1, 0 or +1")


def test_trades_outside_the_book_time_range():
    day = make_day()
    day.trades.ts_event[0] = day.mbp10.ts_event[0] - 1
    day.bars = None
    e = rejects(day, TRADES, "ts_event", 0, "outside the book's time range")
    assert "(2024-07-02 09:25:00.000000 America/New_York to 2024-07-02 09:44:30.000000 America/New_York)" in e.reason
    day = make_day()
    day.trades.ts_event[-1] = day.mbp10.ts_event[-1] + 1
    day.bars = None
    rejects(day, TRADES, "ts_event", len(day.trades.ts_event) - 1, "outside the book's time range")


def test_bars_inconsistent_with_trades():
    day = make_day()
    day.bars.high[4] += TICK
    e = rejects(day, BARS, "high", 4, "bar high 5500.25 differs from the trades' 5500")
    assert e.reason.endswith("(minute 2024-07-02 09:29:00.000000 America/New_York)")
    day = make_day()
    day.bars.volume[3] += 1
    rejects(day, BARS, "volume", 3, "bar volume 2 differs from the trades' 1")
    day = make_day()
    keep = np.arange(len(day.bars.ts_event)) != 5
    day.bars = type(day.bars)(**{k: v[keep] for k, v in vars(day.bars).items()})
    rejects(day, BARS, "ts_event", 5, "no bar for minute")


def test_bar_with_volume_in_a_minute_without_trades():
    day = make_day()
    minute = day.bars.ts_event[4]
    keep = day.trades.ts_event - day.trades.ts_event % np.uint64(NS_PER_MINUTE) != minute
    day.trades = Trades(**{k: v[keep] for k, v in vars(day.trades).items()})
    rejects(day, BARS, "volume", 4, "bar has volume 3 but its minute has no trades")
    day.bars.volume[4] = 0
    validate_day(day, INST, "m.h5")  # an empty bar in a minute without trades is fine


def test_bar_high_below_close():
    day = make_day()
    day.trades = None
    day.bars.high[2] = day.bars.close[2] - TICK
    rejects(day, BARS, "high", 2, "high below open or close")


def test_shapes_and_day_name():
    day = make_day()
    day.mbp10.ask_sz = day.mbp10.ask_sz[:, :5]
    rejects(day, BOOK, "ask_sz", None, "shape (40, 5), expected (40, 10)")
    day = make_day()
    day.day = "2024-7-2"
    with pytest.raises(InputError, match="m.h5: trading day '2024-7-2' is not a YYYY-MM-DD date"):
        validate_day(day, INST, "m.h5")
    day.day = "2024-07-04"
    with pytest.raises(InputError, match=r"m.h5: 2024-07-04 is Independence Day, not a trading day of the 'us' "
                       r"calendar \(--calendar weekdays, all-days would count it\)"):
        validate_day(day, INST, "m.h5")


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"tick_size": 0.0}, "tick_size", "tick_size must be a positive number"),
        ({"timezone": "Mars/Olympus"}, "timezone", "unknown time zone"),
        ({"session_open": "9h30"}, "session_open", "is not HH:MM"),
        ({"session_open": "17:00"}, "session_open", "before session_close"),
        ({"day_roll": "15:00"}, "session_close", "the regular session must end by the day roll"),
        ({"day_open": "16:30"}, "day_roll", "day_open (the reopen after the daily break) must not be before day_roll"),
        ({"calendar": "nyse"}, "calendar", "calendar 'nyse' is not one of us, weekdays, all-days"),
    ],
)
def test_bad_instrument(change, field, words):
    with pytest.raises(InputError) as info:
        validate_instrument(replace(INST, **change), "m.h5")
    assert (info.value.group, info.value.field) == ("/", field)
    assert words in info.value.reason


def test_validating_a_synthetic_sized_day_takes_well_under_a_second():
    n = 250_000
    rng = np.random.default_rng(0)
    open_ns, close_ns = session_bounds(DAY, INST)
    ts = np.sort(rng.integers(open_ns, close_ns, n)).astype(np.uint64)
    bid0 = to_fixed(5000.0) + np.cumsum(rng.integers(-1, 2, n)) * TICK
    depth = np.arange(10) * TICK
    sz = rng.integers(1, 100, (n, 10)).astype(np.uint32)
    day = MarketDay(DAY, mbp10=Mbp10(ts, bid0[:, None] - depth, bid0[:, None] + TICK + depth, sz, sz, sz, sz))
    started = time.perf_counter()
    validate_day(day, INST, "m.h5")
    assert time.perf_counter() - started < 1.0


def test_duplicate_rows_among_many_rows_at_one_instant():
    """Where most rows share their ts_event with the row before (the whole book compared), a repeated row is still
    the one named; a book whose rows at one instant all differ passes."""
    day = make_day()
    day.mbp10.ts_event[1::2] = day.mbp10.ts_event[0::2]
    validate_day(day, INST, "m.h5")
    for name in ("bid_px", "ask_px", "bid_sz", "ask_sz", "bid_ct", "ask_ct"):
        getattr(day.mbp10, name)[7] = getattr(day.mbp10, name)[6]
    rejects(day, BOOK, "ts_event", 7, "duplicate row")


def test_the_joined_level_check_finds_every_book_the_level_checks_reject():
    """`_levels_faulty` (one pass, deciding whether `_check_levels` runs) flags a book exactly when the checks that
    name the fault reject it: books with random faults (empty, zero, negative or out-of-order values, one to three
    per book) and valid ones, one-sided and partly empty books included."""
    rng = np.random.default_rng(7)
    where = RowWhere("m.h5", "mbp10", DAY, INST.timezone)
    rejected = 0
    for trial in range(600):
        book = make_day(6).mbp10
        if trial % 5 == 0:  # the deeper levels of a side empty
            side, depth = ("bid", "ask")[trial % 2], int(rng.integers(0, 10))
            getattr(book, f"{side}_px")[:, depth:] = UNDEF_PRICE
            getattr(book, f"{side}_sz")[:, depth:] = 0
            getattr(book, f"{side}_ct")[:, depth:] = 0
        for _ in range(int(rng.integers(0, 4))):
            name = ("bid_px", "ask_px", "bid_sz", "ask_sz", "bid_ct", "ask_ct")[int(rng.integers(0, 6))]
            column, row, level = getattr(book, name), int(rng.integers(0, 6)), int(rng.integers(0, 10))
            if name.endswith("px"):
                other = int(column[row, int(rng.integers(0, 10))])
                column[row, level] = rng.choice([UNDEF_PRICE, 0, -TICK, other, min(other + TICK, UNDEF_PRICE)])
            else:
                column[row, level] = rng.choice([0, 1, 7])
        try:
            _check_levels(book, where)
            faulty = False
        except InputError:
            faulty = True
        rejected += faulty
        assert _levels_faulty(book) == faulty, trial
    assert 100 < rejected < 500
