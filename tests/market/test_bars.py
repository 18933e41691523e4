"""Bars from trades: a worked example, and Databento's own ohlcv-1m on the minutes both files cover."""

from pathlib import Path

import databento_dbn as dbn
import numpy as np

from fox_numba.market.bars import bars_from_trades, minute_of
from fox_numba.market.schema import NS_PER_MINUTE, Trades

ESU4 = Path(__file__).parents[1] / "fixtures" / "databento_esu4_20240701"
M = NS_PER_MINUTE
T0 = 1_719_878_280 * 10**9  # 2024-07-01 23:58:00 UTC


def test_worked_example():
    # minute 0: 10 @ 100, 5 @ 103, 1 @ 99, 2 @ 101; minute 1: none; minute 2: 7 @ 98
    trades = Trades(
        ts_event=np.array([T0 + 1, T0 + 5, T0 + M - 1, T0 + M - 1, T0 + 2 * M], dtype=np.uint64),
        price=np.array([100, 103, 99, 101, 98], dtype=np.int64),
        size=np.array([10, 5, 1, 2, 7], dtype=np.uint32),
        side=np.array([1, 1, -1, 0, -1], dtype=np.int8),
    )
    bars = bars_from_trades(trades)
    assert bars.ts_event.tolist() == [T0, T0 + 2 * M]
    assert (bars.open.tolist(), bars.high.tolist(), bars.low.tolist(), bars.close.tolist()) == ([100, 98], [103, 98], [99, 98], [101, 98])
    assert bars.volume.tolist() == [18, 7] and bars.volume.dtype == np.uint64
    assert minute_of(np.array([T0 + M - 1], dtype=np.uint64)).tolist() == [T0]


def test_no_trades_no_bars():
    empty = Trades(*(np.zeros(0, dtype=d) for d in (np.uint64, np.int64, np.uint32, np.int8)))
    assert bars_from_trades(empty).ts_event.size == 0


def read(path: Path) -> tuple:
    decoder = dbn.DBNDecoder(compression=dbn.Compression.ZSTD)
    decoder.write(path.read_bytes())
    meta, *records = decoder.decode()
    return meta, [r for r in records if r.instrument_id == 118]  # ESU4


def test_bars_from_real_trades_equal_databentos_ohlcv_1m_on_the_overlapping_minutes():
    meta, raw = read(next(ESU4.glob("futures_trades_*")))
    _, ohlcv = read(next(ESU4.glob("futures_ohlcv-1m_*")))
    trades = Trades(
        ts_event=np.array([r.ts_event for r in raw], dtype=np.uint64),
        price=np.array([r.price for r in raw], dtype=np.int64),
        size=np.array([r.size for r in raw], dtype=np.uint32),
        side=np.zeros(len(raw), dtype=np.int8),
    )
    bars = bars_from_trades(trades)
    covered = [r for r in ohlcv if meta.start <= r.ts_event and r.ts_event + M <= meta.end]
    assert [r.ts_event for r in covered] == bars.ts_event.tolist() == [T0 + k * M for k in range(4)]
    for name in ("open", "high", "low", "close", "volume"):
        assert getattr(bars, name).tolist() == [getattr(r, name) for r in covered], name
    assert bars.volume.tolist() == [18, 23, 175, 37]
