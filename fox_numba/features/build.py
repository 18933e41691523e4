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


def _check_close_books(close: np.ndarray, close_bid: np.ndarray, close_ask: np.ndarray, first_bar: int, source: str,
                       day: str) -> None:  # fmt: skip
    """Each bar needs a two-sided close book with a positive mid. `close`: the day rows of the bars' close books,
    `close_bid` / `close_ask` their best prices, the first being the day's bar `first_bar`."""
    group = f"day {day} mbp10"
    if close.size and close[0] < 0:
        raise InputError(
            source, "the first bar closes before the day's first MBP-10 row; the book must start by then", group=group
        )
    one_sided = (close_bid == UNDEF_PRICE) | (close_ask == UNDEF_PRICE)
    bad = np.flatnonzero(one_sided | (~one_sided & (close_bid + close_ask <= 0)))
    if bad.size:
        b = int(bad[0])
        raise InputError(
            source,
            f"the close book of bar {first_bar + b} is one-sided or has no positive mid (bid {close_bid[b]}, ask "
            f"{close_ask[b]})",
            group=group,
            field="bid_px/ask_px",
            row=int(close[b]),
        )


def _check_bar_prices(bars: Bars, source: str, day: str) -> None:
    """Defined open, high, low and close on every bar."""
    for field in ("open", "high", "low", "close"):
        undefined = np.flatnonzero(getattr(bars, field) == UNDEF_PRICE)
        if undefined.size:
            row = int(undefined[0])
            raise InputError(source, "undefined bar price", group=f"day {day} bars", field=field, row=row)


def session_bars(bars: Bars, day: str, instrument: Instrument, session: str, source: str) -> Bars | None:
    """The day's bars inside `session` (None without one), after checking that their times strictly increase."""
    _check_sorted(bars.ts_event.astype(np.int64), source, f"day {day} bars", strict=True)
    rows = bars_in_session(bars.ts_event, day, instrument, session)
    if rows.size == 0:
        return None
    return Bars(**{name: getattr(bars, name)[rows] for name in DTYPES["bars"]})


BOOK_COLUMNS = ("ts_event", "bid_px", "ask_px", "bid_sz", "ask_sz")
"""The MBP-10 columns the features read (the order counts are not read)."""
BarBook = dict[str, np.ndarray]
"""Per bar, what its book rows give (`bar_book`): the OFI sums, depth and event count, the close book's levels, the
time-weighted spread and (features.tw_imbalance) depth imbalances."""


def bar_book(
    book: dict[str, np.ndarray], bar_ts: np.ndarray, enter: np.ndarray, stop: np.ndarray, *, first_row: int,
    first_bar: int, tw_imbalance: bool, source: str, day: str,
) -> BarBook:  # fmt: skip
    """`BarBook` of consecutive bars whose book rows are rows enter[b] .. stop[b] - 1 of `book` (`BOOK_COLUMNS`;
    `book_windows`, counted from `book`'s first row, which is the day's row `first_row`; the first bar is the day's
    bar `first_bar`). Each bar reads only its own rows, so the bars of a day give the same values whether `book`
    holds the whole day or only their rows (`features/stored.py`)."""
    ts, bid_px, ask_px, bid_sz, ask_sz = (book[k] for k in BOOK_COLUMNS)
    ts = ts.astype(np.int64)
    close = stop - 1
    _check_close_books(close + first_row, bid_px[close, 0], ask_px[close, 0], first_bar, source, day)
    ofi, depth = bar_order_flow(bid_px, bid_sz, ask_px, ask_sz, enter, stop)
    out = {
        "ofi": ofi, "depth": depth, "n_events": stop - enter - 1,
        "bid_px": bid_px[close], "ask_px": ask_px[close], "bid_sz": bid_sz[close], "ask_sz": ask_sz[close],
        "spread_mean": mean_spread(ts, bid_px[:, 0], ask_px[:, 0], bar_ts, enter, stop),
    }  # fmt: skip
    if tw_imbalance:
        bid_q, ask_q = resting_sizes(bid_px, bid_sz), resting_sizes(ask_px, ask_sz)
        out["tw_imbalance"] = time_weighted_imbalance(ts, bid_q, ask_q, bar_ts, (enter, stop))
    return out


def day_features(
    day: MarketDay, instrument: Instrument, config: FeatureConfig, source: str, session: str
) -> DayFeatures | None:
    """One day's feature matrix [n_bars, len(feature_names(config))] and its raw-market columns, over the session's
    bars (None without one); the time-weighted imbalance is computed only with features.tw_imbalance. The day is
    held whole; `features/stored.py` builds the same from a store a chunk of the book at a time."""
    bars, book, trades = _require(day, source)
    bars = session_bars(bars, day.day, instrument, session, source)
    if bars is None:
        return None
    book_ts = book.ts_event.astype(np.int64)
    _check_sorted(book_ts, source, f"day {day.day} mbp10", strict=False)
    _check_sorted(trades.ts_event.astype(np.int64), source, f"day {day.day} trades", strict=False)
    bar_ts = bars.ts_event.astype(np.int64)
    enter, stop = book_windows(book_ts, bar_ts)
    rows = {k: getattr(book, k) for k in BOOK_COLUMNS}
    per_bar = bar_book(rows, bar_ts, enter, stop, first_row=0, first_bar=0, tw_imbalance=config.tw_imbalance,
                       source=source, day=day.day)  # fmt: skip
    return assemble_day(day.day, bars, trades, per_bar, instrument, config, source, session)


def assemble_day(
    day: str, bars: Bars, trades: Trades, per_bar: BarBook, instrument: Instrument, config: FeatureConfig,
    source: str, session: str,
) -> DayFeatures:  # fmt: skip
    """`DayFeatures` from the session's bars, the day's trades (in time order) and the bars' `BarBook`."""
    _check_bar_prices(bars, source, day)
    bar_ts = bars.ts_event.astype(np.int64)
    trade_ts = trades.ts_event.astype(np.int64)
    bid_px, ask_px, bid_sz, ask_sz = (per_bar[k] for k in ("bid_px", "ask_px", "bid_sz", "ask_sz"))
    mid = 0.5 * (bid_px[:, 0] + ask_px[:, 0])  # fixed-point units

    columns = ofi_features(per_bar["ofi"], per_bar["depth"], per_bar["n_events"], config.ofi_levels)
    columns |= trade_features(*trade_flow(trades.size, trades.side, *trade_windows(trade_ts, bar_ts)))
    columns |= return_features(mid)
    columns |= range_feature(bars.high, bars.low, mid)
    columns |= close_book_features(bid_px, bid_sz, ask_px, ask_sz, instrument.tick_fixed)
    columns["spread_mean_ticks"] = per_bar["spread_mean"] / instrument.tick_fixed
    try:
        columns |= session_features(bar_ts, day, instrument, session)
    except (ValueError, KeyError) as e:
        message = f"cannot place day {day} in the session hours of {instrument.symbol}: {e}"
        raise InputError(source, message) from None
    if config.tw_imbalance:
        columns |= dict(zip(TW_IMBALANCE_COLUMNS, per_bar["tw_imbalance"].T, strict=True))
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
