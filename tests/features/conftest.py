"""Market builders for the feature tests: random-but-valid MBP-10 days and splicing two markets in time.

Valid means what the feature builder relies on: sorted timestamps, a book snapshot before the first bar,
both best levels present in every row, and bid < ask. Deeper levels are sometimes empty (UNDEF_PRICE).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from fox_numba.market.calendar import session_bounds, trading_days
from fox_numba.market.schema import (
    N_LEVELS,
    NS_PER_MINUTE,
    UNDEF_PRICE,
    Bars,
    Instrument,
    MarketDay,
    Mbp10,
    Trades,
)

ES = Instrument()


def _empty_tail(px: np.ndarray, sz: np.ndarray, n_levels: np.ndarray) -> None:
    empty = np.arange(N_LEVELS)[None, :] >= n_levels[:, None]
    px[empty] = UNDEF_PRICE
    sz[empty] = 0


def random_day(rng: np.random.Generator, day: str, n_bars: int, events: tuple[int, int], start: int = 0) -> MarketDay:
    """`n_bars` consecutive bars from `start` minutes after the regular session's open (negative: before)."""
    tick = ES.tick_fixed
    open_ns = session_bounds(day, ES)[0] + start * NS_PER_MINUTE
    bar_ts = open_ns + np.arange(n_bars, dtype=np.int64) * NS_PER_MINUTE

    counts = rng.integers(events[0], events[1] + 1, n_bars)
    book_ts = np.sort(np.repeat(bar_ts, counts) + rng.integers(0, NS_PER_MINUTE, counts.sum()))
    book_ts = np.concatenate(([open_ns - 1_000_000_000], book_ts))
    n = book_ts.shape[0]
    steps = rng.choice([-1, 0, 1], size=n, p=[0.05, 0.9, 0.05])
    best_bid = 20_000 + np.cumsum(steps)
    best_ask = best_bid + 1 + (rng.random(n) < 0.2)
    depth = np.arange(N_LEVELS)[None, :]
    bid_px = (best_bid[:, None] - depth) * tick
    ask_px = (best_ask[:, None] + depth) * tick
    bid_sz = rng.integers(1, 300, (n, N_LEVELS)).astype(np.uint32)
    ask_sz = rng.integers(1, 300, (n, N_LEVELS)).astype(np.uint32)
    for px, sz in ((bid_px, bid_sz), (ask_px, ask_sz)):
        _empty_tail(px, sz, np.where(rng.random(n) < 0.1, rng.integers(1, N_LEVELS, n), N_LEVELS))
    book = Mbp10(
        ts_event=book_ts.astype(np.uint64),
        bid_px=bid_px.astype(np.int64),
        ask_px=ask_px.astype(np.int64),
        bid_sz=bid_sz,
        ask_sz=ask_sz,
        bid_ct=(bid_sz > 0).astype(np.uint32),
        ask_ct=(ask_sz > 0).astype(np.uint32),
    )

    trade_counts = rng.integers(events[0], events[1] + 1, n_bars)
    n_trades = trade_counts.sum()
    trade_ts = np.sort(np.repeat(bar_ts, trade_counts) + rng.integers(0, NS_PER_MINUTE, n_trades))
    trades = Trades(
        ts_event=trade_ts.astype(np.uint64),
        price=(20_000 + rng.integers(-3, 4, n_trades)) * tick,
        size=rng.integers(1, 20, n_trades).astype(np.uint32),
        side=rng.choice(np.array([-1, 0, 1], dtype=np.int8), n_trades, p=[0.45, 0.1, 0.45]),
    )

    o, c = (20_000 + rng.integers(-4, 5, n_bars) for _ in range(2))
    bars = Bars(
        ts_event=bar_ts.astype(np.uint64),
        open=o * tick,
        high=(np.maximum(o, c) + rng.integers(0, 3, n_bars)) * tick,
        low=(np.minimum(o, c) - rng.integers(0, 3, n_bars)) * tick,
        close=c * tick,
        volume=np.zeros(n_bars, dtype=np.uint64),
    )
    return MarketDay(day=day, bars=bars, mbp10=book, trades=trades)


def make_random_market(
    seed: int, n_days: int = 2, n_bars: int = 20, events: tuple[int, int] = (5, 30), start: int = 0
) -> list[MarketDay]:
    rng = np.random.default_rng(seed)
    return [random_day(rng, day, n_bars, events, start) for day in trading_days("2024-03-04", n_days, ES.calendar)]


def _take(record: Bars | Mbp10 | Trades, keep: np.ndarray) -> Bars | Mbp10 | Trades:
    return type(record)(**{k: v[keep] for k, v in vars(record).items()})


def _join(a: Bars | Mbp10 | Trades, b: Bars | Mbp10 | Trades, from_a: np.ndarray, from_b: np.ndarray):
    return type(a)(**{k: np.concatenate((va[from_a], vars(b)[k][from_b])) for k, va in vars(a).items()})


def splice_markets(a: list[MarketDay], b: list[MarketDay], cut_ns: int) -> list[MarketDay]:
    """Market `a` up to `cut_ns` (book rows and trades before it, bars that close by it), `b` after it."""
    out = []
    for da, db in zip(a, b, strict=True):
        parts = {}
        for schema in ("mbp10", "trades"):
            ra, rb = getattr(da, schema), getattr(db, schema)
            parts[schema] = _join(ra, rb, ra.ts_event < cut_ns, rb.ts_event >= cut_ns)
        ba, bb = da.bars, db.bars
        parts["bars"] = _join(ba, bb, ba.ts_event + NS_PER_MINUTE <= cut_ns, bb.ts_event + NS_PER_MINUTE > cut_ns)
        out.append(MarketDay(day=da.day, **parts))
    return out


@pytest.fixture
def random_market() -> Callable[..., list[MarketDay]]:
    """Factory: random_market(seed, n_days=2, n_bars=20, events=(5, 30), start=0) -> list[MarketDay]."""
    return make_random_market


@pytest.fixture
def splice() -> Callable[[list[MarketDay], list[MarketDay], int], list[MarketDay]]:
    """splice(a, b, cut_ns): `a` before the cut, `b` from it on."""
    return splice_markets
