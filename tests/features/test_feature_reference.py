"""Every feature and raw column against float64 references: a hand-worked two-day book, and a plain-Python
reference implementation on random books.

The hand market, prices in ticks of 0.25 (400 = 100.00); a ladder `best x [sizes]` has one level per
size, one tick apart, going away from the spread; levels past the sizes are empty (UNDEF_PRICE).

Day 1, 2024-03-08 (EST, session open T0 = 14:30 UTC), bars at T0, T0+60 s, T0+120 s:
  r0 T0-0.5s  bid 400 x [10..19]                 ask 402 x [20..29]        snapshot before the first bar
  r1 T0+15s   bid 400 x [14, 11..19]                                       bid queue +4
  r2 T0+30s   bid 401 x [5, 14, 11..18]                                    new best bid: every level shifts
  r3 T0+45s                                      ask 403 x [21..29]        best ask cancelled: shift, l10 empty
  (bar T0+60 s: no book events, no trades)
  r4 T0+130s                                     ask 402 x [7, 21..29]     new best ask: shift, l10 refilled
  r5 T0+150s  bid 401 x [5, 14, 11..17]                                    bid level 10 cancelled (empty)
  r6 T0+170s  bid 401 x [2, 14, 11..17]                                    best bid queue -3
  r7 T0+180s  bid 401 x [9, ...]                                           after the last bar: ignored
  trades: buy 3 @T0+5s, sell 2 @T0+20s, unknown 1 @T0+40s, sell 3 @T0+165s, buy 7 @T0+180s (ignored)

Day 2, 2024-03-11 (EDT, T1 = 13:30 UTC), bars at T1, T1+60 s; the book starts inside the first bar:
  r0 T1+20s   bid 410 x [10]*5 (5 levels)        ask 412 x [8]*10          the first bar's entering state
  r1 T1+40s   bid 410 x [10]*5 + [4] (6 levels)  ask 411 x [3] + [8]*9     bid l6 appears, new best ask
  r2 T1+60s   bid 409 x [10]*4 + [4] (5 levels)                            best bid cancelled (next bar)
  trades: sell 9 @T1-5s (before the session, ignored), buy 4 @T1+10s, buy 2 @T1+61s, sell 2 @T1+62s
"""

from __future__ import annotations

import gc
import math
import weakref
from datetime import UTC, date, datetime, timedelta
from fractions import Fraction
from zoneinfo import ZoneInfo

import numpy as np
import pytest

from fox_numba.config import FeatureConfig
from fox_numba.errors import ConfigError, MissingDataError
from fox_numba.features import FEATURE_NAMES, build_features
from fox_numba.market.schema import (
    DTYPES,
    N_LEVELS,
    NS_PER_MINUTE,
    PRICE_SCALE,
    UNDEF_PRICE,
    Bars,
    Instrument,
    MarketDay,
    Mbp10,
    Trades,
)

ES = Instrument()
TICK = ES.tick_fixed
S = 1_000_000_000
T0 = int(datetime(2024, 3, 8, 14, 30, tzinfo=UTC).timestamp()) * S
T1 = int(datetime(2024, 3, 11, 13, 30, tzinfo=UTC).timestamp()) * S


def ladder(best: int, sizes: list[int], side: int) -> tuple[list[int], list[int]]:
    """Prices (fixed point) and sizes of one side; side -1 bids (prices fall), +1 asks (prices rise)."""
    px = [(best + side * k) * TICK for k in range(len(sizes))] + [int(UNDEF_PRICE)] * (N_LEVELS - len(sizes))
    return px, list(sizes) + [0] * (N_LEVELS - len(sizes))


def book(rows: list[tuple[int, tuple[int, list[int]], tuple[int, list[int]]]]) -> Mbp10:
    bids = [ladder(b[0], b[1], -1) for _, b, _ in rows]
    asks = [ladder(a[0], a[1], +1) for _, _, a in rows]
    bid_sz = np.array([s for _, s in bids], dtype=np.uint32)
    ask_sz = np.array([s for _, s in asks], dtype=np.uint32)
    return Mbp10(
        ts_event=np.array([t for t, _, _ in rows], dtype=np.uint64),
        bid_px=np.array([p for p, _ in bids], dtype=np.int64),
        ask_px=np.array([p for p, _ in asks], dtype=np.int64),
        bid_sz=bid_sz,
        ask_sz=ask_sz,
        bid_ct=(bid_sz > 0).astype(np.uint32),
        ask_ct=(ask_sz > 0).astype(np.uint32),
    )


def trades(rows: list[tuple[int, int, int]]) -> Trades:
    """(ts, signed size, price ticks); the sign is the aggressor side, a 0 size marks no side."""
    return Trades(
        ts_event=np.array([t for t, _, _ in rows], dtype=np.uint64),
        price=np.array([p * TICK for _, _, p in rows], dtype=np.int64),
        size=np.array([abs(q) for _, q, _ in rows], dtype=np.uint32),
        side=np.array([int(np.sign(q)) for _, q, _ in rows], dtype=np.int8),
    )


def bars(start: int, ohlc: list[tuple[int, int, int, int]]) -> Bars:
    cols = np.array(ohlc, dtype=np.int64) * TICK
    return Bars(
        ts_event=np.array([start + i * NS_PER_MINUTE for i in range(len(ohlc))], dtype=np.uint64),
        open=cols[:, 0],
        high=cols[:, 1],
        low=cols[:, 2],
        close=cols[:, 3],
        volume=np.zeros(len(ohlc), dtype=np.uint64),
    )


def hand_market() -> list[MarketDay]:
    r = list(range(10, 20))
    day1_trades = trades([(T0 + 5 * S, 3, 402), (T0 + 20 * S, -2, 400), (T0 + 40 * S, 1, 401),
                          (T0 + 165 * S, -3, 401), (T0 + 180 * S, 7, 402)])
    day1_trades.side[2] = 0  # the unknown-side trade
    day1 = MarketDay(
        day="2024-03-08",
        bars=bars(T0, [(400, 402, 400, 401), (401, 402, 401, 402), (402, 402, 401, 401)]),
        mbp10=book([
            (T0 - S // 2, (400, r), (402, list(range(20, 30)))),
            (T0 + 15 * S, (400, [14] + r[1:]), (402, list(range(20, 30)))),
            (T0 + 30 * S, (401, [5, 14] + r[1:9]), (402, list(range(20, 30)))),
            (T0 + 45 * S, (401, [5, 14] + r[1:9]), (403, list(range(21, 30)))),
            (T0 + 130 * S, (401, [5, 14] + r[1:9]), (402, [7] + list(range(21, 30)))),
            (T0 + 150 * S, (401, [5, 14] + r[1:8]), (402, [7] + list(range(21, 30)))),
            (T0 + 170 * S, (401, [2, 14] + r[1:8]), (402, [7] + list(range(21, 30)))),
            (T0 + 180 * S, (401, [9, 14] + r[1:8]), (402, [7] + list(range(21, 30)))),
        ]),
        trades=day1_trades,
    )
    day2 = MarketDay(
        day="2024-03-11",
        bars=bars(T1, [(410, 411, 410, 411), (411, 411, 409, 410)]),
        mbp10=book([
            (T1 + 20 * S, (410, [10] * 5), (412, [8] * 10)),
            (T1 + 40 * S, (410, [10] * 5 + [4]), (411, [3] + [8] * 9)),
            (T1 + 60 * S, (409, [10] * 4 + [4]), (411, [3] + [8] * 9)),
        ]),
        trades=trades([(T1 - 5 * S, -9, 410), (T1 + 10 * S, 4, 411), (T1 + 61 * S, 2, 411), (T1 + 62 * S, -2, 409)]),
    )
    return [day1, day2]


L = math.log
# Raw OFI per level (see tests/features/test_ofi.py for the rules), depth D per bar:
#   B0: r1 bid l1 +4; r2 new best bid, every bid level's price rises: +new size (5, 14, 11, ..., 18);
#       r3 best ask cancelled, every ask level's price rises: +old size (20, ..., 28), l10 empties: +29.
#       l1 = 4 + 5 + 20 = 29, lm = new bid size + old ask size for m >= 2.
#       D = mean over r0..r3 of (bid sum + ask sum) / 2 / 10 = (19.5 + 19.7 + 19.0 + 18.0) / 4 = 19.05
#   B1: no events: OFI 0, D = depth of r3 = (135 + 225) / 20 = 18.0
#   B2: r4 new best ask, ask prices fall: -new size (7, 21, ..., 29), l10 was empty: -29 all the same;
#       r5 bid l10 empties: -18; r6 bid l1 2 - 5 = -3.
#       D = (18.0 + 18.35 + 17.45 + 17.3) / 4 = 17.775
#   C0: entering r0 (the day's first row), r1: ask prices fall: l1 -3, l2..l10 -8; bid l6 appears: +4.
#       D = (6.5 + 6.45) / 2 = 6.475
#   C1: r2 best bid cancelled: bid l1..l5 -10, l6 (4 lots) empties: -4. D = (6.45 + 5.95) / 2 = 6.2
OFI = [
    ([29, 35, 33, 35, 37, 39, 41, 43, 45, 47], 19.05),
    ([0] * 10, 18.0),
    ([-10, -21, -22, -23, -24, -25, -26, -27, -28, -47], 17.775),
    ([-3, -8, -8, -8, -8, -4, -8, -8, -8, -8], 6.475),
    ([-10, -10, -10, -10, -10, -4, 0, 0, 0, 0], 6.2),
]
MULTI = [sum(o) / d for o, d in OFI]
MID = [402, 402, 401.5, 410.5, 410]  # close mid in ticks
R2, R5 = L(401.5 / 402), L(410 / 410.5)
HAND = {
    **{f"ofi_l{m + 1}": [o[m] / d for o, d in OFI] for m in range(10)},
    "ofi_multi": MULTI,
    "ofi_multi_sum5": [MULTI[0], MULTI[0] + MULTI[1], MULTI[0] + MULTI[1] + MULTI[2], MULTI[3], MULTI[3] + MULTI[4]],
    # trades (volume, signed): B0 (6, +1) B1 (0, 0) B2 (3, -3) C0 (4, +4) C1 (4, 0)
    "trade_imbalance": [1 / 6, 0, -1, 1, 0],
    "trade_imbalance_sum5": [1 / 6, 1 / 6, (1 - 3) / (6 + 3), 1, 4 / 8],
    "log_volume": [L(7), 0, L(4), L(5), L(5)],
    "log_trade_count": [L(4), 0, L(2), L(2), L(3)],
    "ret_1": [0, 0, R2, 0, R5],
    "ret_5": [0, 0, R2, 0, R5],
    "ret_15": [0, 0, R2, 0, R5],
    # high - low in ticks over the close mid in ticks
    "range_rel": [2 / 402, 1 / 402, 1 / 401.5, 1 / 410.5, 2 / 410],
    "realised_vol_15": [0, 0, math.sqrt(R2**2 / 2), 0, abs(R5)],
    "spread_close_ticks": [2, 2, 1, 1, 2],
    # B0: 15 s each at 2, 2, 1, 2 ticks; B2: 10 s at 2, then 50 s at 1; C0: 20 s at 2, 20 s at 1 (no book
    # before T1+20s); C1: r1 rests 0 s inside the bar, r2 60 s at 2.
    "spread_mean_ticks": [(30 + 30 + 15 + 30) / 60, 2, (20 + 50) / 60, 1.5, 2],
    # close books: B0/B1 bid [5,14,11..18] ask [21..29,-]; B2 bid [2,14,11..17,-] ask [7,21..29];
    # C0 bid [10]*5+[4] ask [3]+[8]*9; C1 bid [10]*4+[4] ask [3]+[8]*9
    "depth_imbalance_l1": [-16 / 26, -16 / 26, -5 / 9, 7 / 13, 7 / 13],
    "depth_imbalance_l5": [-60 / 170, -60 / 170, (52 - 97) / 149, 15 / 85, 9 / 79],
    "depth_imbalance_l10": [-90 / 360, -90 / 360, (114 - 232) / 346, -21 / 129, -31 / 119],
    # spread / 2 * l1 imbalance
    "microprice_offset_ticks": [-16 / 26, -16 / 26, -5 / 18, 3.5 / 13, 7 / 13],
    "log_depth": [L(1 + d) for _, d in OFI],
    "log_book_events": [L(4), 0, L(4), L(2), L(2)],
    "tod_sin": [math.sin(2 * math.pi * k / 390) for k in (1, 2, 3, 1, 2)],
    "tod_cos": [math.cos(2 * math.pi * k / 390) for k in (1, 2, 3, 1, 2)],
    "session_frac": [k / 390 for k in (1, 2, 3, 1, 2)],
}


def test_hand_table_covers_every_feature():
    assert tuple(HAND) == FEATURE_NAMES


@pytest.mark.parametrize("name", FEATURE_NAMES)
def test_feature_on_hand_book(name):
    fs = build_features(hand_market(), ES, FeatureConfig())
    np.testing.assert_allclose(fs.values[:, fs.names.index(name)], HAND[name], rtol=1e-12, atol=1e-15)


def test_ofi_multi_sums_the_configured_levels():
    fs = build_features(hand_market(), ES, FeatureConfig(ofi_levels=3))
    expected = [sum(o[:3]) / d for o, d in OFI]
    np.testing.assert_allclose(fs.values[:, FEATURE_NAMES.index("ofi_multi")], expected, rtol=1e-12)


def test_raw_market_on_hand_book():
    raw = build_features(hand_market(), ES, FeatureConfig()).raw
    nan = math.nan
    np.testing.assert_array_equal(raw.ts, [T0, T0 + 60 * S, T0 + 120 * S, T1, T1 + 60 * S])
    np.testing.assert_array_equal(raw.day_index, [0, 0, 0, 1, 1])
    np.testing.assert_array_equal(raw.day_start, [0, 3, 5])
    np.testing.assert_array_equal(raw.mid, [m * 0.25 for m in MID])
    np.testing.assert_array_equal(raw.best_bid, [100.25, 100.25, 100.25, 102.5, 102.25])
    np.testing.assert_array_equal(raw.best_ask, [100.75, 100.75, 100.5, 102.75, 102.75])
    np.testing.assert_array_equal(raw.ask_px[0], [100.75 + 0.25 * k for k in range(9)] + [nan])
    np.testing.assert_array_equal(raw.ask_sz[0], list(range(21, 30)) + [0])
    np.testing.assert_array_equal(raw.bid_px[2], [100.25 - 0.25 * k for k in range(9)] + [nan])
    np.testing.assert_array_equal(raw.bid_sz[2], [2, 14, 11, 12, 13, 14, 15, 16, 17, 0])
    np.testing.assert_array_equal(raw.bid_px[4], [102.25 - 0.25 * k for k in range(5)] + [nan] * 5)
    np.testing.assert_array_equal(raw.bid_sz[4], [10, 10, 10, 10, 4, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(raw.open, [100.0, 100.25, 100.5, 102.5, 102.75])
    np.testing.assert_array_equal(raw.high, [100.5, 100.5, 100.5, 102.75, 102.75])
    np.testing.assert_array_equal(raw.low, [100.0, 100.25, 100.25, 102.5, 102.25])
    np.testing.assert_array_equal(raw.close, [100.25, 100.5, 100.25, 102.75, 102.5])
    assert (raw.tick_size, raw.point_value) == (0.25, 50.0)
    assert raw.bid_sz.dtype == np.uint32 and raw.bid_px.dtype == np.float64 and raw.ts.dtype == np.uint64


def session_hours(day: str, instrument: Instrument, session: str) -> tuple[int, int]:
    """[open, close) in UTC ns: regular hours on the day, or from the reopen the evening before to the roll."""
    tz = ZoneInfo(instrument.timezone)

    def at(d: date, hhmm: str) -> int:
        hours, minutes = map(int, hhmm.split(":"))
        wall = datetime.combine(d, datetime.min.time()) + timedelta(hours=hours, minutes=minutes)
        return int(wall.replace(tzinfo=tz).timestamp()) * S

    d = date.fromisoformat(day)
    if session == "regular":
        return at(d, instrument.session_open), at(d, instrument.session_close)
    return at(d - timedelta(days=1), instrument.day_open), at(d, instrument.day_roll)


def reference_features(days: list[MarketDay], instrument: Instrument, ofi_levels: int, session: str = "regular") -> np.ndarray:
    """Plain-Python float64 features, bar by bar, straight from the definitions in `names.FEATURES`, over
    the bars that start and end inside `session`."""
    out = []
    tick = instrument.tick_fixed
    for day in days:
        open_ns, close_ns = session_hours(day.day, instrument, session)
        inside = [b for b, t in enumerate(day.bars.ts_event) if open_ns <= int(t) and int(t) + NS_PER_MINUTE <= close_ns]
        bk, tr = day.mbp10, day.trades
        br = Bars(**{k: v[inside] for k, v in vars(day.bars).items()})
        ts = [int(t) for t in bk.ts_event]

        def level(r: int, m: int, bk: Mbp10 = bk) -> tuple[float, float, float, float]:
            pb, pa = int(bk.bid_px[r, m]), int(bk.ask_px[r, m])
            qb = 0.0 if pb == UNDEF_PRICE else float(bk.bid_sz[r, m])
            qa = 0.0 if pa == UNDEF_PRICE else float(bk.ask_sz[r, m])
            return (-math.inf if pb == UNDEF_PRICE else pb), qb, (math.inf if pa == UNDEF_PRICE else pa), qa

        session_ns = close_ns - open_ns
        mids, multis, flows = [], [], []
        for b, t in enumerate(int(x) for x in br.ts_event):
            end = t + NS_PER_MINUTE
            before = [r for r in range(len(ts)) if ts[r] < t]
            enter = before[-1] if before else 0
            states = [enter] + [r for r in range(enter + 1, len(ts)) if ts[r] < end]
            close = states[-1]
            f: dict[str, float] = {}
            ofi = [0.0] * N_LEVELS
            for r in states[1:]:
                for m in range(N_LEVELS):
                    pb0, qb0, pa0, qa0 = level(r - 1, m)
                    pb1, qb1, pa1, qa1 = level(r, m)
                    ofi[m] += (qb1 if pb1 >= pb0 else 0) - (qb0 if pb1 <= pb0 else 0)
                    ofi[m] += -(qa1 if pa1 <= pa0 else 0) + (qa0 if pa1 >= pa0 else 0)
            depth = sum(sum(level(r, m)[1] + level(r, m)[3] for m in range(N_LEVELS)) / 2 / N_LEVELS for r in states)
            depth /= len(states)
            for m in range(N_LEVELS):
                f[f"ofi_l{m + 1}"] = ofi[m] / depth
            multis.append(sum(ofi[:ofi_levels]) / depth)
            f["ofi_multi"] = multis[-1]
            f["ofi_multi_sum5"] = sum(multis[max(0, b - 4):])
            in_bar = [k for k in range(len(tr.ts_event)) if t <= int(tr.ts_event[k]) < end]
            volume = sum(int(tr.size[k]) for k in in_bar)
            signed = sum(int(tr.size[k]) * int(tr.side[k]) for k in in_bar)
            flows.append((volume, signed))
            f["trade_imbalance"] = signed / volume if volume else 0.0
            vol5, signed5 = sum(v for v, _ in flows[max(0, b - 4):]), sum(s for _, s in flows[max(0, b - 4):])
            f["trade_imbalance_sum5"] = signed5 / vol5 if vol5 else 0.0
            f["log_volume"] = math.log(1 + volume)
            f["log_trade_count"] = math.log(1 + len(in_bar))
            bid, ask = int(bk.bid_px[close, 0]), int(bk.ask_px[close, 0])
            mids.append((bid + ask) / 2)
            for lag in (1, 5, 15):
                f[f"ret_{lag}"] = math.log(mids[b] / mids[max(0, b - lag)])
            f["range_rel"] = (int(br.high[b]) - int(br.low[b])) / mids[b]
            rets = [math.log(mids[s] / mids[s - 1]) for s in range(max(1, b - 14), b + 1)]
            f["realised_vol_15"] = math.sqrt(sum(x * x for x in rets) / len(rets)) if rets else 0.0
            f["spread_close_ticks"] = (ask - bid) / tick
            weighted = weight = 0.0
            for i, r in enumerate(states):
                if int(bk.bid_px[r, 0]) == UNDEF_PRICE or int(bk.ask_px[r, 0]) == UNDEF_PRICE:
                    continue
                w = (ts[states[i + 1]] if i + 1 < len(states) else end) - max(ts[r], t)
                weighted += w * (int(bk.ask_px[r, 0]) - int(bk.bid_px[r, 0])) / tick
                weight += w
            f["spread_mean_ticks"] = weighted / weight
            for n in (1, 5, 10):
                qb = sum(level(close, m)[1] for m in range(n))
                qa = sum(level(close, m)[3] for m in range(n))
                f[f"depth_imbalance_l{n}"] = (qb - qa) / (qb + qa) if qb + qa else 0.0
            qb, qa = int(level(close, 0)[1]), int(level(close, 0)[3])
            # exact rationals: the textbook formula cancels ~12 digits in float64 at ES prices
            micro = Fraction(bid * qa + ask * qb, qb + qa) if qb + qa else Fraction(bid + ask, 2)
            f["microprice_offset_ticks"] = float((micro - Fraction(bid + ask, 2)) / tick)
            f["log_depth"] = math.log(1 + depth)
            f["log_book_events"] = math.log(len(states))
            frac = (end - open_ns) / session_ns
            f["tod_sin"], f["tod_cos"] = math.sin(2 * math.pi * frac), math.cos(2 * math.pi * frac)
            f["session_frac"] = frac
            out.append([f[name] for name in FEATURE_NAMES])
    return np.array(out)


def test_reference_matches_the_hand_table():
    expected = np.array([HAND[name] for name in FEATURE_NAMES]).T
    np.testing.assert_allclose(reference_features(hand_market(), ES, 10), expected, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_builder_matches_reference_on_random_books(random_market, seed):
    days = random_market(seed, n_days=2, n_bars=12)
    fs = build_features(days, ES, FeatureConfig(ofi_levels=4))
    ref = reference_features(days, ES, 4)
    for col, name in enumerate(FEATURE_NAMES):
        np.testing.assert_allclose(fs.values[:, col], ref[:, col], rtol=1e-10, atol=1e-13, err_msg=name)
    bid_close = np.array([to_close(d, int(t)) for d in days for t in d.bars.ts_event])
    np.testing.assert_array_equal(fs.raw.bid_px, np.where(bid_close == UNDEF_PRICE, np.nan, bid_close * PRICE_SCALE))


def to_close(day: MarketDay, t: int) -> np.ndarray:
    """Bid prices of the last book row before the bar's end."""
    close = int(np.flatnonzero(day.mbp10.ts_event < t + NS_PER_MINUTE)[-1])
    return day.mbp10.bid_px[close]


def test_one_bar_days_without_events_or_trades_match_the_reference(random_market):
    """The smallest input: each day one bar, one book row (its entering state) and no trades."""
    days = random_market(4, n_days=2, n_bars=1, events=(0, 0))
    assert [(d.mbp10.ts_event.size, d.trades.ts_event.size) for d in days] == [(1, 0), (1, 0)]
    fs = build_features(days, ES, FeatureConfig())
    np.testing.assert_allclose(fs.values[:, : len(FEATURE_NAMES)], reference_features(days, ES, 10), rtol=1e-10,
                               atol=1e-13)  # the 32 features; tests/features/test_time_weighted_imbalance.py the rest
    zero = [n for n in FEATURE_NAMES if n.startswith(("ofi_", "trade_", "ret_", "realised_")) or "_count" in n]
    np.testing.assert_array_equal(fs.values[:, [FEATURE_NAMES.index(n) for n in zero]], 0.0)
    assert fs.raw.day_start.tolist() == [0, 1, 2]


@pytest.mark.parametrize("session", ["regular", "full"])
def test_builder_matches_reference_over_the_session_bars(random_market, session):
    """Bars from 20 minutes before the open to 10 after it: the regular session takes the last 10 of each
    day, the full (Globex) session all 30; look-backs restart at the session's first bar and the time of
    day is a fraction of the session's hours."""
    days = random_market(5, n_days=2, n_bars=30, start=-20)
    fs = build_features(days, ES, FeatureConfig(), session=session)
    ref = reference_features(days, ES, 10, session)
    assert fs.n_bars == ref.shape[0] == 2 * (10 if session == "regular" else 30)
    assert fs.session == session and fs.notes == ()
    for col, name in enumerate(FEATURE_NAMES):
        np.testing.assert_allclose(fs.values[:, col], ref[:, col], rtol=1e-10, atol=1e-13, err_msg=name)
    frac = fs.values[:, FEATURE_NAMES.index("session_frac")]
    if session == "regular":
        np.testing.assert_allclose(frac[:10], np.arange(1, 11) / 390, rtol=1e-12)
    else:  # 09:10 EST is 15 h 10 min after the 18:00 reopen, in a 23-hour Globex day
        np.testing.assert_allclose(frac[:30], (15 * 60 + 10 + np.arange(1, 31)) / (23 * 60), rtol=1e-12)
    assert 0 < frac.min() and frac.max() <= 1


def test_a_day_without_a_bar_in_the_session_is_skipped_with_a_note(random_market):
    early = random_market(6, n_days=1, n_bars=5, start=-30)[0]  # 2024-03-04, bars 09:00-09:05 only
    later = random_market(7, n_days=2, n_bars=5)[1]  # 2024-03-05, regular hours
    regular = build_features([early, later], ES, FeatureConfig())
    assert regular.days == ("2024-03-05",) and regular.raw.day_start.tolist() == [0, 5]
    assert regular.notes == ("2024-03-04 skipped: no bar in its regular session",)
    full = build_features([early, later], ES, FeatureConfig(), session="full")
    assert full.days == ("2024-03-04", "2024-03-05") and full.n_bars == 10 and full.notes == ()
    with pytest.raises(MissingDataError, match="es.h5: none of the 1 trading days has a bar in the regular session"):
        build_features([early], ES, FeatureConfig(), source="es.h5")
    with pytest.raises(ConfigError, match="market.session is 'night'; it must be one of regular, full"):
        build_features([later], ES, FeatureConfig(), session="night")


def test_a_generator_of_days_gives_the_same_features_one_day_at_a_time(random_market):
    """build_features over a generator equals build_features over the list, and keeps no day alive once it has
    moved on: when the generator makes day k, day k - 1 is already gone (a weak reference to its book array is
    dead), so the load holds one day's book rows at a time."""
    days = random_market(5, n_days=3, n_bars=8)
    whole = build_features(days, ES, FeatureConfig())
    books = [d.mbp10.bid_px.copy() for d in days]
    alive: list[weakref.ref] = []

    def one_at_a_time():
        for k, d in enumerate(days):
            gc.collect()
            assert all(ref() is None for ref in alive), f"day {k - 1} is still held when day {k} is read"
            fresh = MarketDay(d.day, d.bars, Mbp10(**{f: getattr(d.mbp10, f).copy() for f in DTYPES["mbp10"]}),
                              d.trades, d.contract)
            alive.append(weakref.ref(fresh.mbp10.bid_px))
            yield fresh
            del fresh

    streamed = build_features(one_at_a_time(), ES, FeatureConfig())
    np.testing.assert_array_equal(streamed.values, whole.values)
    for name in ("bid_px", "ask_sz", "mid", "close", "day_start"):
        np.testing.assert_array_equal(getattr(streamed.raw, name), getattr(whole.raw, name))
    assert streamed.days == whole.days and all(np.array_equal(b, d.mbp10.bid_px) for b, d in zip(books, days))
