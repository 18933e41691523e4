"""Build the per-bar features and the raw market of a run of trading days, over the bars of one session."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from fox_numba.config import FeatureConfig
from fox_numba.errors import ConfigError, InputError, MissingDataError
from fox_numba.features.bar_features import range_feature, return_features, session_features
from fox_numba.features.book_features import close_book_features, mean_spread, resting_sizes, time_weighted_imbalance
from fox_numba.features.feature_set import FeatureSet, RawMarket
from fox_numba.features.names import TW_IMBALANCE_COLUMNS, check_feature_config, feature_names
from fox_numba.features.ofi import bar_order_flow, ofi_features
from fox_numba.features.trade_features import trade_features, trade_flow
from fox_numba.features.trade_summary import trade_summary
from fox_numba.features.windows import book_windows, trade_windows
from fox_numba.market.calendar import SESSIONS, bars_in_session
from fox_numba.market.schema import (
    DTYPES,
    PRICE_SCALE,
    UNDEF_PRICE,
    Bars,
    Instrument,
    MarketDay,
    Mbp10,
    Trades,
    to_price,
)


DayFeatures = tuple[np.ndarray, dict[str, np.ndarray]]
"""One day's features (float64 [n_bars, len(feature_names(config))]) and raw-market columns (`RawMarket` less the day
index, day starts and instrument scalars), as `day_features` builds them and `features/cache.py` keeps them."""
FEATURE_LAYOUT_VERSION = 1
"""Raise it whenever `day_features` computes anything differently: cached days built before are then rebuilt."""
DAY_CONFIG_FIELDS = ("ofi_levels",)
"""The `FeatureConfig` fields `day_features` reads (part of the feature cache's key) besides features.tw_imbalance,
which enters the key through the day's column names (`names.feature_names`)."""


def build_features(
    days: Iterable[MarketDay],
    instrument: Instrument,
    config: FeatureConfig,
    source: str = "market data",
    session: str = "regular",
) -> FeatureSet:
    """Features and raw market of the bars of `days` inside `session` (in time order).

    `session` is "regular" (the instrument's regular hours) or "full" (the whole trading day from its
    reopen, `calendar.session_bounds`): a bar is used when it starts and ends inside it, and look-backs
    restart at the day's first such bar. A day without one is left out, with a note in `FeatureSet.notes`.
    Every day needs bars, MBP-10 and trades (MissingDataError otherwise); `source` names the data in
    error messages (e.g. the store's path). Bad rows raise InputError naming the day, schema and row.
    `days` may be a generator: each day is reduced to its per-bar features and raw-market rows and then let
    go, so memory holds one day's book rows at a time and the bars of all of them.
    """

    def parts() -> Iterator[tuple[str, DayFeatures | None]]:
        for day in days:
            name, part = day.day, day_features(day, instrument, config, source, session)
            del day  # let the day's book go before the next one is read
            yield name, part

    return assemble_features(parts(), instrument, config, source, session)


def assemble_features(
    parts: Iterable[tuple[str, DayFeatures | None]],
    instrument: Instrument,
    config: FeatureConfig,
    source: str = "market data",
    session: str = "regular",
) -> FeatureSet:
    """The `FeatureSet` of per-day parts (trading day, `day_features` of it) in time order, built or cached
    (walkforward/driver.py `load_features`); a None part is a day without a bar in `session`, left out with a
    note. The config and session are checked before the first part is asked for."""
    check_feature_config(config)
    if session not in SESSIONS:
        raise ConfigError(f"market.session is {session!r}; it must be one of {', '.join(SESSIONS)}")
    kept_parts, kept, notes, seen = [], [], [], 0
    for day, part in parts:
        seen += 1
        if part is None:
            notes.append(f"{day} skipped: no bar in its {session} session")
        else:
            kept_parts.append(part)
            kept.append(day)
    if not seen:
        raise MissingDataError(f"{source}: no trading days to build features from")
    if not kept_parts:
        raise MissingDataError(f"{source}: none of the {seen} trading days has a bar in the {session} session")
    _check_day_order(kept, [p[1]["ts"] for p in kept_parts], source)
    n_per_day = np.array([p[0].shape[0] for p in kept_parts], dtype=np.int64)
    raw = {key: np.concatenate([p[1][key] for p in kept_parts]) for key in kept_parts[0][1]}
    return FeatureSet(
        values=np.concatenate([p[0] for p in kept_parts]),
        names=feature_names(config),
        days=tuple(kept),
        raw=RawMarket(
            **raw,
            day_index=np.repeat(np.arange(len(kept), dtype=np.int32), n_per_day),
            day_start=np.concatenate(([0], np.cumsum(n_per_day))),
            tick_size=instrument.tick_size,
            point_value=instrument.point_value,
        ),
        session=session,
        notes=tuple(notes),
    )


def _require(day: MarketDay, source: str) -> tuple[Bars, Mbp10, Trades]:
    """The day's three schemas; a day without trades in it is quiet, a day without a book row is missing data."""
    if day.bars is None or day.bars.ts_event.shape[0] == 0:
        raise MissingDataError(f"{source}: day {day.day} has no bars; features are built on the 1-minute bars")
    for schema, name in (("mbp10", "MBP-10"), ("trades", "trade")):
        record = getattr(day, schema)
        if record is None or (schema == "mbp10" and record.ts_event.shape[0] == 0):
            raise MissingDataError(
                f"{source}: day {day.day} has bars but no {name} data; MBP-10 and trades are mandatory "
                "(import them with `fox data import`)"
            )
    return day.bars, day.mbp10, day.trades


def _check_sorted(ts: np.ndarray, source: str, group: str, *, strict: bool) -> None:
    step = np.diff(ts)
    bad = np.flatnonzero(step <= 0 if strict else step < 0)
    if bad.size:
        order = "strictly increasing" if strict else "in time order"
        raise InputError(source, f"timestamps are not {order}", group=group, field="ts_event", row=int(bad[0]) + 1)


def _check_day_order(days: Sequence[str], bar_ts: list[np.ndarray], source: str) -> None:
    for d in range(1, len(days)):
        if bar_ts[d][0] <= bar_ts[d - 1][-1]:
            raise InputError(
                source,
                f"day {days[d]} does not start after day {days[d - 1]} ends; days must be in time order",
                group=f"day {days[d]} bars",
                field="ts_event",
                row=0,
            )


def _check_close_books(close: np.ndarray, book: Mbp10, bars: Bars, source: str, day: str) -> None:
    """Each bar needs a two-sided close book with a positive mid, and defined OHLC."""
    group = f"day {day} mbp10"
    if close[0] < 0:
        raise InputError(
            source, "the first bar closes before the day's first MBP-10 row; the book must start by then", group=group
        )
    bid, ask = book.bid_px[close, 0], book.ask_px[close, 0]
    one_sided = (bid == UNDEF_PRICE) | (ask == UNDEF_PRICE)
    bad = np.flatnonzero(one_sided | (~one_sided & (bid + ask <= 0)))
    if bad.size:
        b = int(bad[0])
        raise InputError(
            source,
            f"the close book of bar {b} is one-sided or has no positive mid (bid {bid[b]}, ask {ask[b]})",
            group=group,
            field="bid_px/ask_px",
            row=int(close[b]),
        )
    for field in ("open", "high", "low", "close"):
        undefined = np.flatnonzero(getattr(bars, field) == UNDEF_PRICE)
        if undefined.size:
            row = int(undefined[0])
            raise InputError(source, "undefined bar price", group=f"day {day} bars", field=field, row=row)


def day_features(
    day: MarketDay, instrument: Instrument, config: FeatureConfig, source: str, session: str
) -> DayFeatures | None:
    """One day's feature matrix [n_bars, len(feature_names(config))] and its raw-market columns, over the session's
    bars (None without one); the time-weighted imbalance is computed only with features.tw_imbalance."""
    bars, book, trades = _require(day, source)
    _check_sorted(bars.ts_event.astype(np.int64), source, f"day {day.day} bars", strict=True)
    rows = bars_in_session(bars.ts_event, day.day, instrument, session)
    if rows.size == 0:
        return None
    bars = Bars(**{name: getattr(bars, name)[rows] for name in DTYPES["bars"]})
    bar_ts = bars.ts_event.astype(np.int64)
    book_ts = book.ts_event.astype(np.int64)
    trade_ts = trades.ts_event.astype(np.int64)
    _check_sorted(book_ts, source, f"day {day.day} mbp10", strict=False)
    _check_sorted(trade_ts, source, f"day {day.day} trades", strict=False)

    enter, stop = book_windows(book_ts, bar_ts)
    close = stop - 1
    _check_close_books(close, book, bars, source, day.day)
    bid_px, ask_px = book.bid_px[close], book.ask_px[close]
    bid_sz, ask_sz = book.bid_sz[close], book.ask_sz[close]
    mid = 0.5 * (bid_px[:, 0] + ask_px[:, 0])  # fixed-point units

    ofi, depth = bar_order_flow(book.bid_px, book.bid_sz, book.ask_px, book.ask_sz, enter, stop)
    columns = ofi_features(ofi, depth, stop - enter - 1, config.ofi_levels)
    columns |= trade_features(*trade_flow(trades.size, trades.side, *trade_windows(trade_ts, bar_ts)))
    columns |= return_features(mid)
    columns |= range_feature(bars.high, bars.low, mid)
    columns |= close_book_features(bid_px, bid_sz, ask_px, ask_sz, instrument.tick_fixed)
    spread = mean_spread(book_ts, book.bid_px[:, 0], book.ask_px[:, 0], bar_ts, enter, stop)
    columns["spread_mean_ticks"] = spread / instrument.tick_fixed
    try:
        columns |= session_features(bar_ts, day.day, instrument, session)
    except (ValueError, KeyError) as e:
        message = f"cannot place day {day.day} in the session hours of {instrument.symbol}: {e}"
        raise InputError(source, message) from None
    if config.tw_imbalance:
        tw = time_weighted_imbalance(book_ts, resting_sizes(book.bid_px, book.bid_sz),
                                     resting_sizes(book.ask_px, book.ask_sz), bar_ts)
        columns |= dict(zip(TW_IMBALANCE_COLUMNS, tw.T, strict=True))
    values = np.column_stack([columns[name] for name in feature_names(config)])

    raw = {
        "ts": bars.ts_event.astype(np.uint64),
        "bid_px": to_price(bid_px),
        "ask_px": to_price(ask_px),
        "bid_sz": np.where(bid_px == UNDEF_PRICE, 0, bid_sz).astype(np.uint32),
        "ask_sz": np.where(ask_px == UNDEF_PRICE, 0, ask_sz).astype(np.uint32),
        "mid": mid * PRICE_SCALE,
        **{field: to_price(getattr(bars, field)) for field in ("open", "high", "low", "close")},
        **trade_summary(trades.price, trades.size, *trade_windows(trade_ts, bar_ts)),
    }
    return values, raw
