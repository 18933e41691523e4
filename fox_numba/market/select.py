"""The market a stage runs on: the store named by the config and the trading days it selects.

Every stage command starts here, so a bad store, a day range outside it, a store without the mandatory
MBP-10 and trades, or a selected day that fails validation stops the command before any work, with a
message saying what to do. Every selected day is read and validated here, as `fox data inspect` does,
so a stage refuses a store that inspect refuses, with the same message.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fox_numba.config import MarketConfig
from fox_numba.errors import ConfigError, InputError
from fox_numba.market.calendar import SESSIONS, bars_in_session
from fox_numba.market.default import ensure_default_store
from fox_numba.market.store import MarketStore, require_schemas


@dataclass(frozen=True)
class MarketSelection:
    """A checked store and the trading days (YYYY-MM-DD, in order) a run uses from it: the days of the
    chosen range that hold a bar in the chosen session."""

    path: Path
    days: tuple[str, ...]
    session: str = "regular"
    """`market.session`: the bars features and episodes use (`calendar.SESSIONS`)."""
    notes: tuple[str, ...] = ()
    """Selected days left out and why (no bar in the session)."""


def _day(key: str, text: str) -> str:
    try:
        return dt.date.fromisoformat(text).isoformat()
    except ValueError:
        raise ConfigError(f"{key}: {text!r} is not a date of the form YYYY-MM-DD") from None


def select_market(cfg: MarketConfig, progress: Callable[[str], None] | None = None) -> MarketSelection:
    """Resolve `cfg.store` ('default': the embedded market, built or reused), pick the days between
    `first_day` and `last_day` (inclusive; empty: the store's first / last), check that each selected
    day holds MBP-10 and trades (MissingDataError, saying how to import them, otherwise), and validate
    each selected day (InputError naming the group, field and row, as `fox data inspect` reports it).
    Days without a bar in `cfg.session` are left out with a note; none left is a ConfigError."""
    path = ensure_default_store(progress) if cfg.store == "default" else Path(cfg.store)
    if not path.is_file():
        raise InputError(path, "market store not found (build one with `fox data synth` or `fox data import`)")
    if cfg.session not in SESSIONS:
        raise ConfigError(f"market.session: {cfg.session!r} is not one of {', '.join(SESSIONS)}")
    first = _day("market.first_day", cfg.first_day) if cfg.first_day else ""
    last = _day("market.last_day", cfg.last_day) if cfg.last_day else ""
    if first and last and first > last:
        raise ConfigError(f"market.first_day {first} is after market.last_day {last}")
    with MarketStore(path) as store:
        available = store.days()
    days = tuple(d for d in available if (not first or d >= first) and (not last or d <= last))
    if not days:
        span = f"{available[0]} to {available[-1]}" if available else "no days"
        raise ConfigError(f"{path}: no trading day between {first or 'the start'} and {last or 'the end'} ({span})")
    require_schemas(path, days=days)
    kept, notes = [], []
    with MarketStore(path) as store:
        for k, day in enumerate(days):
            if progress is not None:
                progress(f"checking {day} ({k + 1} of {len(days)})")
            bars = store.read_day(day).bars
            if bars is None or bars_in_session(bars.ts_event, day, store.instrument, cfg.session).size == 0:
                notes.append(f"{day} skipped: no bar in its {cfg.session} session (market.session)")
            else:
                kept.append(day)
    if not kept:
        raise ConfigError(f"{path}: none of the {len(days)} selected trading days has a bar in the {cfg.session} session")
    return MarketSelection(path, tuple(kept), cfg.session, tuple(notes))
