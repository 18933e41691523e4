"""The per-day feature cache: what `build.day_features` makes of a stored trading day, kept beside the store.

Training needs per bar only the features and the raw-market rows (bars, the close book, order-flow and trade
sums), but building them reads the day's every book row. The cache keeps them, one `.npz` file per day, under a
name made of the day, its content digest (`MarketStore.day_digest`) and `feature_key` (everything `day_features`
depends on besides the day: its column names, so features.tw_imbalance, the feature config fields it reads, the
session, the instrument, the code's `FEATURE_LAYOUT_VERSION`), so a rewritten day or a changed setting misses and is
built afresh. A file is written under a temporary name and renamed, and records its digest, key and a sha256 of its
arrays: one that does not load, does not match or does not hold exactly a day's arrays is ignored (logged) and
rebuilt, never trusted.
Files of old digests or keys are left in the folder (delete it to reclaim the space).
"""

from __future__ import annotations

import hashlib
import json
import logging
import zipfile
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from dataclasses import fields
from pathlib import Path

import numpy as np

from fox_numba.config import FeatureConfig
from fox_numba.errors import OutputError
from fox_numba.features.build import DAY_CONFIG_FIELDS, FEATURE_LAYOUT_VERSION, DayFeatures
from fox_numba.features.feature_set import RawMarket
from fox_numba.features.names import feature_names
from fox_numba.features.stored import stored_day_features
from fox_numba.io import atomic_path
from fox_numba.market.day_workers import outcome, read_workers, start_pool
from fox_numba.market.schema import Instrument
from fox_numba.market.select import instrument_key, mark_validated
from fox_numba.market.staging import READ_ROWS, check_stored_day
from fox_numba.market.store import MarketStore

log = logging.getLogger(__name__)

SUFFIX = ".features.npz"
VALUES = "values"
META = "meta"
RAW_FIELDS = tuple(
    f.name for f in fields(RawMarket) if f.name not in ("day_index", "day_start", "tick_size", "point_value")
)
"""The raw-market columns a day contributes (the rest `assemble_features` derives)."""


def feature_key(config: FeatureConfig, session: str, instrument: Instrument) -> str:
    """sha256 (hex) of everything a day's features depend on besides the day's rows."""
    parts = {
        "layout": FEATURE_LAYOUT_VERSION,
        "names": feature_names(config),
        "config": {name: getattr(config, name) for name in DAY_CONFIG_FIELDS},
        "session": session,
        "instrument": instrument_key(instrument),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def arrays_digest(arrays: dict[str, np.ndarray]) -> str:
    """sha256 (hex) of named arrays: each name, dtype, shape and bytes, in name order."""
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"|{name}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


class FeatureCache:
    """The features of `config` over `session` of `instrument`'s days, cached in `folder` (None: no cache, every
    day is read and built, and no digest asked for)."""

    def __init__(self, folder: Path | None, instrument: Instrument, config: FeatureConfig, session: str) -> None:
        self.folder, self.instrument, self.config, self.session = folder, instrument, config, session
        self.key = feature_key(config, session, instrument)

    def path(self, day: str, digest: str) -> Path:
        """The cache file of `day` with content `digest` (only for a cache with a folder)."""
        if self.folder is None:
            raise ValueError("this feature cache has no folder (market.cache = 'off')")
        return self.folder / f"{day}.{digest[:32]}.{self.key[:16]}{SUFFIX}"

    def load(self, day: str, digest: str) -> DayFeatures | None:
        """The cached features of `day` with content `digest`, or None (absent; damaged or mismatched: logged)."""
        path = self.path(day, digest)
        if not path.is_file():
            return None
        try:
            with np.load(path, allow_pickle=False) as npz:
                arrays = {name: npz[name] for name in npz.files}
            meta = json.loads(arrays.pop(META).tobytes().decode())
            problem = _check(arrays, meta, digest, self.key, len(feature_names(self.config)))
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, UnicodeDecodeError) as e:
            problem = f"does not load ({type(e).__name__}: {e})"
        if problem:
            log.warning("%s: feature cache file ignored and rebuilt: %s", path, problem)
            return None
        values = arrays.pop(VALUES)
        return values, {name: arrays[name] for name in RAW_FIELDS}

    def save(self, day: str, digest: str, part: DayFeatures) -> None:
        """Write the features of `day` (temporary name, then renamed); a folder that cannot be written is logged."""
        arrays = {VALUES: part[0], **part[1]}
        meta = {"day": day, "digest": digest, "key": self.key, "arrays": arrays_digest(arrays)}
        target = self.path(day, digest)
        try:
            with atomic_path(target) as tmp, open(tmp, "wb") as fh:
                np.savez(fh, **arrays, **{META: np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)})
        except OutputError as e:
            log.warning("feature cache file not written (market.cache): %s", e)

    def parts(
        self, store: MarketStore, days: Sequence[str], digests: Sequence[str] = (), unchecked: Sequence[str] = (),
        workers: int = 1,
    ) -> Iterator[tuple[str, DayFeatures | None]]:
        """(day, features) of each of `days`: cached, else read from `store`, built and cached; a chunk of one day's
        book in memory at a time (`features/stored.py`). `digests`: the days' `MarketStore.day_digest` (empty: asked
        of the store, and only with a cache folder: a store without digests pays a read of the day for each).
        `unchecked`: days not yet validated (`MarketSelection.unchecked`): each is read in full once, cached features
        or not, which validates it (InputError as `fox data inspect` words it), and its validated-day record is
        written. `workers`: `market.read_workers` (market/day_workers.py); where it comes to 2 or more, processes
        build the missing days after the first (`build_day`) while this one builds the first (compiling the feature
        functions into numba's cache once, before any worker calls them), and this one caches and hands out the days
        in order; the features are the same bit for bit."""
        pending = set(unchecked)
        if self.folder is not None:
            digests = list(digests) or [store.day_digest(day) for day in days]
            missing = [k for k, day in enumerate(days) if not self.path(day, digests[k]).is_file()]
        else:
            missing = list(range(len(days)))
        pool = start_pool(min(read_workers(workers, len(missing), "market.read_workers"), len(missing) - 1))
        ahead: dict[str, Future[tuple[DayFeatures | None] | None]] = {}
        try:
            for k, day in enumerate(days):
                digest = digests[k] if self.folder is not None else ""
                done = outcome(ahead.pop(day), None) if day in ahead else None
                if done is not None:  # built and validated by a worker's read
                    part, fresh = done[0], True
                else:
                    part = self.load(day, digest) if self.folder is not None else None
                    fresh = part is None
                    if fresh:  # a worker's failure is raised here, by this process's own read
                        part = self._build(store, day)
                        if pool is not None and not ahead:
                            ahead = {days[j]: pool.submit(build_day, store.path, days[j], self.instrument, self.config,
                                                          self.session) for j in missing if j > k}
                    elif day in pending:
                        check_stored_day(store, day, READ_ROWS)  # validation: the day's one full read in this run
                if self.folder is not None:
                    if fresh and part is not None:
                        self.save(day, digest, part)
                    if day in pending:
                        mark_validated(self.folder, day, digest, self.instrument)
                yield day, part
        finally:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)

    def _build(self, store: MarketStore, day: str) -> DayFeatures | None:
        """`day_features` of `day` read from `store`, a chunk of its book at a time (`features/stored.py`)."""
        return stored_day_features(store, day, self.instrument, self.config, self.session)


def build_day(path: Path, day: str, instrument: Instrument, config: FeatureConfig,
              session: str) -> tuple[DayFeatures | None] | None:
    """`(features,)` of `day` of the store at `path`, read and validated (a worker of `FeatureCache.parts`; None
    inside for a day without a bar in the session); None where it fails: the caller reads the day again, and its
    error names file, group, field and row."""
    try:
        with MarketStore(path) as store:
            return (stored_day_features(store, day, instrument, config, session),)
    except Exception:  # noqa: BLE001
        return None


def _check(arrays: dict[str, np.ndarray], meta: object, digest: str, key: str, width: int) -> str:
    """What is wrong with a loaded cache file ('' if nothing): its digest, key, arrays (values of `width` columns) and
    their checksum."""
    if not isinstance(meta, dict) or meta.get("digest") != digest or meta.get("key") != key:
        return "it was written for another day digest or feature key"
    if set(arrays) != {VALUES, *RAW_FIELDS}:
        return f"arrays {sorted(arrays)} are not {sorted({VALUES, *RAW_FIELDS})}"
    n = arrays[VALUES].shape[0]
    if arrays[VALUES].shape != (n, width) or n == 0:
        return f"values have shape {arrays[VALUES].shape}, not (bars > 0, {width})"
    short = [name for name in RAW_FIELDS if arrays[name].shape[:1] != (n,)]
    if short:
        return f"raw column {short[0]} does not have the {n} rows of the values"
    if arrays_digest(arrays) != meta["arrays"]:
        return "the arrays do not match their checksum"
    return ""
