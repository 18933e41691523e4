"""features/stored.py: a stored day's features built a chunk of its book at a time are `day_features` of the whole
day bit for bit, whatever the chunk size; the rows held at once are bounded by a chunk and a bar's rows; faults
are refused with the whole-day path's words."""

import dataclasses

import h5py
import numpy as np
import pytest

from fox_numba.config import FeatureConfig
from fox_numba.errors import InputError, MissingDataError
from fox_numba.features import stored
from fox_numba.features.build import day_features
from fox_numba.features.stored import stored_day_features
from fox_numba.features.windows import book_windows
from fox_numba.market.schema import UNDEF_PRICE, MarketDay
from fox_numba.market.store import MarketStore, write_store


@pytest.fixture
def two_days(four_day_market, tmp_path):
    m = four_day_market
    return write_store(tmp_path / "es.h5", m.instrument, m.days[:2]), m


def chunked(monkeypatch, rows: int) -> None:
    """Read the store `rows` rows at a time (the validated chunks and the timestamps' pass)."""
    monkeypatch.setattr(stored, "READ_ROWS", rows)


def both(path, day, config, session):
    with MarketStore(path) as store:
        whole = day_features(store.read_day(day), store.instrument, config, str(store.path), session)
        return whole, stored_day_features(store, day, store.instrument, config, session)


@pytest.mark.parametrize("rows, days, sessions", [
    (7, 1, ("regular",)),  # a bar's rows over several chunks (17 a bar on average); slow, so one day
    (100, 2, ("regular", "full")),
    (16384, 2, ("regular", "full")),  # the whole day in one chunk
])  # fmt: skip
@pytest.mark.parametrize("tw_imbalance", [True, False])
def test_the_same_features_bit_for_bit_at_any_chunk_size(two_days, monkeypatch, rows, days, sessions, tw_imbalance):
    path, m = two_days
    chunked(monkeypatch, rows)
    config = dataclasses.replace(FeatureConfig(), tw_imbalance=tw_imbalance, ofi_levels=5)
    for day in (d.day for d in m.days[:days]):
        for session in sessions:
            (want_values, want_raw), (values, raw) = both(path, day, config, session)
            assert values.dtype == want_values.dtype and values.tobytes() == want_values.tobytes()
            assert values.shape[0] > 300 and np.isfinite(values).all()
            assert raw.keys() == want_raw.keys()
            for k in raw:
                assert (raw[k].dtype, raw[k].shape, raw[k].tobytes()) == (want_raw[k].dtype, want_raw[k].shape,
                                                                          want_raw[k].tobytes()), k  # fmt: skip


def test_the_rows_held_are_a_chunk_and_a_bar(two_days, monkeypatch):
    """At 100 rows a chunk, the stream never holds more than a chunk plus the longest bar's rows (and its entering
    row): a small share of the day's 6,651."""
    path, m = two_days
    chunked(monkeypatch, 100)
    held = []  # rows held while a chunk is built from, and after
    feed = stored._BookStream.feed
    build = stored.bar_book

    def recording(self, book):
        feed(self, book)
        held.append(self.rows["ts_event"].shape[0])

    def building(rows, *args, **kwargs):
        held.append(rows["ts_event"].shape[0])
        return build(rows, *args, **kwargs)

    monkeypatch.setattr(stored._BookStream, "feed", recording)
    monkeypatch.setattr(stored, "bar_book", building)
    day = m.days[0]
    with MarketStore(path) as store:
        stored_day_features(store, day.day, store.instrument, FeatureConfig(), "regular")
    enter, stop = book_windows(day.mbp10.ts_event.astype(np.int64), day.bars.ts_event.astype(np.int64))
    longest = int((stop - enter).max())
    assert len(held) > -(-day.mbp10.ts_event.shape[0] // 100)  # every chunk fed, and bars built along the way
    assert 100 <= max(held) <= longest + 100
    assert longest + 100 < day.mbp10.ts_event.shape[0] / 10


def test_a_one_sided_close_book_is_refused_as_the_whole_day_refuses_it(four_day_market, tmp_path, monkeypatch):
    m = four_day_market
    day = m.days[0]
    enter, stop = book_windows(day.mbp10.ts_event.astype(np.int64), day.bars.ts_event.astype(np.int64))
    row = int(stop[200] - 1)  # bar 200's close book
    book = {k: getattr(day.mbp10, k).copy() for k in ("ask_px", "ask_sz", "ask_ct")}
    book["ask_px"][row], book["ask_sz"][row], book["ask_ct"][row] = UNDEF_PRICE, 0, 0  # the ask side empty
    bad = dataclasses.replace(day, mbp10=dataclasses.replace(day.mbp10, **book))
    path = write_store(tmp_path / "bad.h5", m.instrument, [bad])
    chunked(monkeypatch, 64)
    errors = []
    with MarketStore(path) as store:
        for build in (lambda: day_features(store.read_day(day.day), store.instrument, FeatureConfig(), str(path),
                                           "regular"),  # fmt: skip
                      lambda: stored_day_features(store, day.day, store.instrument, FeatureConfig(), "regular")):
            with pytest.raises(InputError) as info:
                build()
            errors.append(info.value)
    whole, streamed = errors
    assert (streamed.reason, streamed.group, streamed.field, streamed.row) == (
        whole.reason, whole.group, whole.field, whole.row)  # fmt: skip
    assert "bar 200" in streamed.reason and streamed.row == row


def test_a_day_without_trades_is_missing_data(four_day_market, tmp_path):
    m = four_day_market
    day = m.days[0]
    path = write_store(tmp_path / "book_only.h5", m.instrument, [MarketDay(day.day, bars=day.bars, mbp10=day.mbp10)])
    with MarketStore(path) as store, pytest.raises(MissingDataError, match="has bars but no trade data"):
        stored_day_features(store, day.day, store.instrument, FeatureConfig(), "regular")


def test_a_book_out_of_time_order_is_refused_with_the_validations_row(two_days, monkeypatch):
    path, m = two_days
    chunked(monkeypatch, 50)
    day = m.days[1].day
    with h5py.File(path, "r+") as f:
        ts = f[f"mbp10/{day}/ts_event"]
        ts[300], ts[301] = ts[301], ts[300]
    with MarketStore(path) as store, pytest.raises(InputError, match=f"group /mbp10/{day}, field ts_event, row 301"):
        stored_day_features(store, day, store.instrument, FeatureConfig(), "regular")
