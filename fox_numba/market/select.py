"""The market a stage runs on: the store named by the config and the trading days it selects.

Every stage command starts here, so a bad store, a day range outside it, a store without the mandatory
MBP-10 and trades, or a selected day that fails validation stops the command before any work, with a
message saying what to do. Every selected day is validated as `fox data inspect` does, so a stage refuses a store
that inspect refuses, with the same message: once per store version, as each validated day leaves a record keyed
by its content digest (`MarketStore.day_digest`) and the instrument in the cache folder (`market.cache`), and a
day with its record is not read again here (only its bars, for the session).

Where the validation reads a day: by default here (`select_market`). A stage that reads the selected days in full
next anyway (the feature build, `walkforward.driver.load_features`) asks `defer=True`: days without a record are
then read here for their bars only and listed in `MarketSelection.unchecked`, and the feature build validates
each of them on the one full read it makes (`MarketStore.read_day` validates what it reads) and records it
(`mark_validated`), so a cold run reads every day once, not twice.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from fox_numba.config import MarketConfig
from fox_numba.errors import ConfigError, InputError, OutputError
from fox_numba.io import atomic_write_text
from fox_numba.market.calendar import SESSIONS, bars_in_session
from fox_numba.market.default import ensure_default_store
from fox_numba.market.staging import READ_ROWS, check_stored_day
from fox_numba.market.schema import Bars, Instrument
from fox_numba.market.store import MarketStore, require_schemas

CACHE_SUFFIX = ".cache"
"""`market.cache = "auto"`: the cache folder is the store's path with this appended."""
VALIDATED_SUFFIX = ".valid"
VALIDATION_VERSION = 1
"""Part of every validated-day record's key: raise it when `validate.py` checks more, so every day is checked again."""


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
    digests: tuple[str, ...] = ()
    """`MarketStore.day_digest` of each of `days` (empty: not asked for, as `market.cache` is 'off', or not known)."""
    unchecked: tuple[str, ...] = ()
    """Days of `days` not yet validated (`select_market(defer=True)`): whoever reads them in full next validates
    them (module docstring)."""


def cache_folder(cfg: MarketConfig, store: Path) -> Path | None:
    """The per-day cache folder of `store` (`market.cache`: 'auto' beside it, 'off' None, else that folder)."""
    if cfg.cache == "off":
        return None
    return store.with_name(store.name + CACHE_SUFFIX) if cfg.cache == "auto" else Path(cfg.cache)


def instrument_key(instrument: Instrument) -> str:
    """sha256 (hex) of every instrument field: validation and features depend on them."""
    return hashlib.sha256(json.dumps(asdict(instrument), sort_keys=True).encode()).hexdigest()


def validated_record(folder: Path, day: str, digest: str, instrument: Instrument) -> Path:
    """The file whose presence says `day` with content `digest` passed validation for `instrument`."""
    key = hashlib.sha256(f"{digest}|{instrument_key(instrument)}|{VALIDATION_VERSION}".encode()).hexdigest()
    return folder / f"{day}.{key[:32]}{VALIDATED_SUFFIX}"


def _day(key: str, text: str) -> str:
    try:
        return dt.date.fromisoformat(text).isoformat()
    except ValueError:
        raise ConfigError(f"{key}: {text!r} is not a date of the form YYYY-MM-DD") from None


def select_market(
    cfg: MarketConfig, progress: Callable[[str], None] | None = None, *, defer: bool = False
) -> MarketSelection:
    """Resolve `cfg.store` ('default': the embedded market, built or reused), pick the days between
    `first_day` and `last_day` (inclusive; empty: the store's first / last), check that each selected
    day holds MBP-10 and trades (MissingDataError, saying how to import them, otherwise), and validate
    each selected day (InputError naming the group, field and row, as `fox data inspect` reports it) unless
    the cache folder holds its validated record, or, with `defer`, leave that to the caller's full read and list
    the day in `unchecked` (module docstring); keep each day's digest. Days without a bar in `cfg.session` are
    left out with a note; none left is a ConfigError."""
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
    kept, digests, unchecked, notes = [], [], [], []
    folder = cache_folder(cfg, path)
    with MarketStore(path) as store:
        for k, day in enumerate(days):
            if progress is not None:
                progress(f"checking {day} ({k + 1} of {len(days)})")
            bars, digest, checked = _checked_bars(store, day, folder, defer)
            if bars is None or bars_in_session(bars.ts_event, day, store.instrument, cfg.session).size == 0:
                notes.append(f"{day} skipped: no bar in its {cfg.session} session (market.session)")
                continue
            kept.append(day)
            digests.append(digest)
            if not checked:
                unchecked.append(day)
    if not kept:
        raise ConfigError(f"{path}: none of the {len(days)} selected trading days has a bar in the {cfg.session} session")
    return MarketSelection(path, tuple(kept), cfg.session, tuple(notes), () if folder is None else tuple(digests),
                           tuple(unchecked))


def _checked_bars(store: MarketStore, day: str, folder: Path | None, defer: bool) -> tuple[Bars | None, str, bool]:
    """`day`'s bars, its digest ('' without a cache folder: not asked for) and whether it is validated: by its
    record in `folder` or by a full read here; with `defer` a day without a record is not read in full (only its
    bars) and comes back not validated."""
    digest = "" if folder is None else store.day_digest(day)
    if folder is not None and validated_record(folder, day, digest, store.instrument).is_file():
        return store.read_day(day, ("bars",)).bars, digest, True
    if defer:
        return store.read_day(day, ("bars",)).bars, digest, False
    check_stored_day(store, day, READ_ROWS)
    bars = store.read_day(day, ("bars",)).bars
    if folder is not None:
        mark_validated(folder, day, digest, store.instrument)
    return bars, digest, True


def mark_validated(folder: Path, day: str, digest: str, instrument: Instrument) -> None:
    """Record that `day` with content `digest` passed validation for `instrument` (a full read of the day did);
    a cache folder that cannot be written costs only the next check (logged)."""
    try:
        atomic_write_text(validated_record(folder, day, digest, instrument), f"{day} {digest}\n")
    except OutputError as e:
        logging.getLogger(__name__).warning("validated-day record not written (market.cache): %s", e)
