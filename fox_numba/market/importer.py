"""`fox data import`: files or folders of Databento DBN or LOBSTER data into one market store.

The format is told from the file names (`.dbn`, `.dbn.zst`; LOBSTER's `TICKER_DATE_..._message_L.csv`)
unless given. Folders are scanned (not recursively) for daily files. An existing store is extended: its
instrument is the starting point, the symbol comes from the data (contract root or ticker) unless
--symbol is given, and a store of another instrument is refused. Each schema of a trading day in the
import replaces that schema of that day in the store; bars come from the import's `ohlcv-1m` files,
else they are built from the day's trades. Only the imported days are written (`store.StoreWriter`: one
day file per schema and day, the store file renamed over the old one at the end), so a rejected import leaves
the store as it was.

Databento files are staged one by one (`databento.stage_file`: each file's days validated and written block by
block to a staging file beside the store), here or, with `ray`, as Ray tasks in parallel (one per file; `address`
joins a cluster, whose nodes must reach the input files and the store's folder under the same paths: a shared
file system); then this process takes the days in order, checks them across files and against the store, and
writes them (`staging.commit_day`). The same files give the same store either way.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
from collections import Counter
from concurrent.futures import Future
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import h5py

from fox_numba.errors import INTERRUPTS, ConfigError, FoxError, InputError, Interrupted, OutputError
from fox_numba.market.databento import (
    SUFFIXES,
    DatabentoImport,
    FileResult,
    FileTask,
    Rechoose,
    find_files,
    stage_file,
)
from fox_numba.market.day_workers import outcome, read_workers, start_pool
from fox_numba.market.lobster import NAME, LobsterPair, equity_instrument, find_pairs, read_pair
from fox_numba.market.schema import Instrument, MarketDay, n_rows
from fox_numba.market.staging import StagedDay, check_stored_day, commit_day, staging_folder
from fox_numba.market.store import DEFAULT_COMPRESSION, MarketStore, StoreWriter, write_store

FORMATS = ("auto", "databento", "lobster")
RAY_MISSING = 'fox data import --ray needs Ray: pip install -e ".[ray]"'


@dataclass
class ImportResult:
    """What an import wrote: rows per schema per trading day, notes on what was chosen or dropped, and
    warnings (signs of damaged input that did not stop the import)."""

    path: Path
    instrument: Instrument
    rows: dict[str, dict[str, int]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        days = sorted(self.rows)
        span = f"{days[0]} to {days[-1]}" if len(days) > 1 else (days[0] if days else "nothing")
        out = [f"wrote {self.path}: {self.instrument.symbol}, {len(days)} trading day(s), {span}"]
        for day in days:
            out.append(f"  {day}: " + ", ".join(f"{s} {n:,}" for s, n in self.rows[day].items()))
        return out + [f"  note: {n}" for n in self.notes] + [f"  warning: {w}" for w in self.warnings]


def import_market(
    paths: Sequence[Path],
    out: Path,
    *,
    fmt: str = "auto",
    instrument: str | None = None,
    overrides: Mapping[str, object] | None = None,
    progress: Callable[[str], None] | None = None,
    ray: bool = False,
    address: str | None = None,
    compression: str = DEFAULT_COMPRESSION,
    workers: int = 1,
) -> ImportResult:
    """Import `paths` into the store `out` (created or extended); `overrides` set Instrument fields. With `ray`
    Databento files are staged as Ray tasks, on the cluster at `address` or on a local one; else by `workers`
    processes of this machine (market/day_workers.py: 0 one per core, at most 8, for 8 files or more; 1 this one).
    The store is the same bit for bit either way. `compression` (a key of `store.COMPRESSIONS`) applies to the days
    written."""
    if out.is_dir():
        raise OutputError(f"{out}: is a folder; --out names the store file to write or extend, e.g. {out / 'es.h5'}")
    fmt = detect_format(paths) if fmt == "auto" else fmt
    if fmt not in FORMATS[1:]:
        raise ValueError(f"format {fmt!r} is not one of {FORMATS}")
    ray = ray or address is not None
    if ray and fmt != "databento":
        raise InputError(paths[0], "--ray stages Databento files; LOBSTER files are imported in this process")
    if ray and workers > 1:
        raise ConfigError("--workers sets the processes of an import on this machine; with --ray the cluster places "
                          "its tasks: drop one of them")
    existing = _existing_instrument(out)
    if fmt == "lobster":
        if instrument is not None:
            raise InputError(paths[0], "--instrument selects a Databento instrument; LOBSTER files hold one stock each")
        pairs = _lobster_pairs(paths)
        inst = _instrument(existing or equity_instrument(pairs[0].ticker), pairs[0].ticker, overrides)
        result = ImportResult(out, inst)
        days = _counted(_lobster_days(pairs, inst, progress), result)
        write_store(out, inst, days, extend=True, progress=progress, compression=compression)
    else:
        found = _expand(paths, find_files, "DBN files (.dbn, .dbn.zst)")
        found = [p.resolve() for p in found] if ray else found
        run = dict(base=existing or Instrument(), overrides=overrides, ray=ray, address=address, progress=progress,
                   workers=workers)
        try:
            result = _databento(DatabentoImport.open(found, instrument), out, compression, **run)
        except Rechoose as again:  # the earliest file's records choose another instrument than its first block did
            result = _databento(DatabentoImport.open(found, instrument, again.per_id), out, compression, **run)
    with MarketStore(out) as store:
        result.notes += contract_changes(store.contracts(), set(result.rows))
    return result


def _databento(
    source: DatabentoImport,
    out: Path,
    compression: str,
    *,
    base: Instrument,
    overrides: Mapping[str, object] | None,
    ray: bool,
    address: str | None,
    progress: Callable[[str], None] | None,
    workers: int,
) -> ImportResult:
    """Stage the files of `source` (here, in worker processes or as Ray tasks) and commit their days into the store
    `out`."""
    inst = _instrument(base, source.symbol, overrides)
    result = ImportResult(out, inst)
    with staging_folder(out) as folder:
        tasks = source.tasks(inst, folder.resolve(), compression=compression)
        with _staged(tasks, source, ray, address, progress, workers) as staged:
            _commit(out, inst, source.days(staged, inst), result, progress, compression)
    result.notes = source.summary()
    result.warnings = source.warnings
    return result


def contract_changes(contracts: Mapping[str, str], touched: set[str]) -> list[str]:
    """A note for each change of contract between consecutive days of a store that involves a day in
    `touched` (the days an import wrote): where a continuous series rolls from one contract to the next."""
    days = list(contracts)
    notes = []
    for before, after in itertools.pairwise(days):
        if contracts[before] != contracts[after] and {before, after} & touched:
            notes.append(
                f"the contract changes from {contracts[before]} (last day {before}) to {contracts[after]} (first "
                f"day {after}): a roll; prices jump by the spread between the two contracts there"
            )
    return notes


def detect_format(paths: Iterable[Path]) -> str:
    """'databento' or 'lobster' from the names of the files (and of the files in folders)."""
    names: list[str] = []
    for p in paths:
        if not p.exists():
            raise InputError(p, "no such file or folder")
        names.extend([q.name for q in p.iterdir()] if p.is_dir() else [p.name])
    found = {"databento" for n in names if n.endswith(SUFFIXES)} | {"lobster" for n in names if NAME.match(n)}
    if len(found) != 1:
        what = "both Databento and LOBSTER files" if found else "no Databento (.dbn, .dbn.zst) or LOBSTER files"
        raise InputError(next(iter(paths)), f"found {what}; name the format with --format")
    return found.pop()


def _instrument(base: Instrument, symbol: str, overrides: Mapping[str, object] | None) -> Instrument:
    """The base (the store's, else the format's defaults) with the data's symbol, then the options."""
    return replace(base, **{"symbol": symbol, **(overrides or {})})


def _existing_instrument(out: Path) -> Instrument | None:
    if not out.exists():
        return None
    with MarketStore(out) as store:
        return store.instrument


def _expand(paths: Sequence[Path], scan: Callable[[Path], list], what: str) -> list:
    found = []
    for p in paths:
        if not p.exists():
            raise InputError(p, "no such file or folder")
        items = scan(p) if p.is_dir() else [p]
        if not items:
            raise InputError(p, f"the folder holds no {what}")
        found.extend(items)
    return found


def _lobster_pairs(paths: Sequence[Path]) -> list[LobsterPair]:
    found = _expand(paths, find_pairs, "LOBSTER message/orderbook pairs")
    pairs = sorted({p if isinstance(p, LobsterPair) else LobsterPair.of(p) for p in found}, key=lambda p: p.day)
    tickers = sorted({p.ticker for p in pairs})
    if len(tickers) > 1:
        raise InputError(pairs[0].message, f"one market per store, but the files hold {', '.join(tickers)}")
    days = [p.day for p in pairs]
    twice = sorted({d for d in days if days.count(d) > 1})
    if twice:
        raise InputError(pairs[0].message, f"more than one pair for {twice[0]}")
    return pairs


def _lobster_days(
    pairs: list[LobsterPair], inst: Instrument, progress: Callable[[str], None] | None
) -> Iterator[MarketDay]:
    for pair in pairs:
        if progress is not None:
            progress(f"reading {pair.message.name}")
        yield read_pair(pair, inst)


def _counted(days: Iterable[MarketDay], result: ImportResult) -> Iterator[MarketDay]:
    for day in days:
        result.rows[day.day] = {s: n_rows(getattr(day, s)) for s in day.present()}
        yield day
        del day  # released before `days` makes the next one


@contextlib.contextmanager
def _staged(
    tasks: list[FileTask],
    source: DatabentoImport,
    ray: bool,
    address: str | None,
    progress: Callable[[str], None] | None,
    workers: int,
) -> Iterator[Iterator[FileResult]]:
    """The tasks' results in their order: staged here one by one as they are asked for (each told the rows of its
    days that `source` took from the files before it: `FileTask.offsets`), or submitted at once to `workers`
    processes (`read_workers`) or as Ray tasks (a local cluster sized to this machine, or the one at `address`)."""
    if not ray:
        pool = start_pool(min(read_workers(workers, len(tasks), "--workers"), len(tasks)))
        if pool is None:
            yield (_local(replace(task, offsets=source.staged_rows(task.file.schema)), progress) for task in tasks)
            return
        try:
            futures = [pool.submit(stage_file, task) for task in tasks]
            yield (_pooled(task, future, progress) for task, future in zip(tasks, futures, strict=True))
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        return
    from fox_numba.sweep.runner import OBJECT_STORE_BYTES  # here: the sweep package imports the training stack

    ray_module = _import_ray()
    if address:
        ray_module.init(address=address, log_to_driver=False, logging_level="ERROR")
    else:
        ray_module.init(num_cpus=len(os.sched_getaffinity(0)), num_gpus=0, object_store_memory=OBJECT_STORE_BYTES,
                        include_dashboard=False, log_to_driver=False, logging_level="ERROR")  # fmt: skip
    # A signal handler that raises inside Ray's wait would surface as a SystemError: note the signal and raise
    # Interrupted between waits (as `sweep.runner` does).
    caught: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: caught.append(signum)) for sig in INTERRUPTS}
    try:
        remote = ray_module.remote(stage_file).options(num_cpus=1, max_retries=0)
        yield _gathered(ray_module, tasks, [remote.remote(task) for task in tasks], caught, progress)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        ray_module.shutdown()


def _local(task: FileTask, progress: Callable[[str], None] | None) -> FileResult:
    if progress is not None:
        progress(f"reading {task.file.path.name}")
    return stage_file(task)


def _pooled(task: FileTask, future: Future[FileResult], progress: Callable[[str], None] | None) -> FileResult:
    """A worker's staging of `task`; staged here again where the pool broke (a worker killed)."""
    result = outcome(future, None)
    if result is None:
        return _local(task, progress)
    if progress is not None:
        progress(f"staged {task.file.path.name}")
    return result


def _gathered(
    ray: Any, tasks: list[FileTask], refs: list, caught: list[int], progress: Callable[[str], None] | None
) -> Iterator[FileResult]:
    """Each task's result in order, waking every `WAIT_S` to stop on a signal."""
    from fox_numba.sweep.runner import WAIT_S

    for task, ref in zip(tasks, refs, strict=True):
        while not ray.wait([ref], timeout=WAIT_S)[0]:
            if caught:
                raise Interrupted(caught[0])
        if caught:
            raise Interrupted(caught[0])
        try:
            result = ray.get(ref)
        except Exception as e:  # the task itself failed (its worker died, a lost node)
            reason = str(e).strip().splitlines()[0]
            raise FoxError(f"{task.file.path}: the Ray task staging it failed ({reason})") from None
        if progress is not None:
            progress(f"staged {task.file.path.name}")
        yield result


def _import_ray() -> Any:
    from fox_numba.sweep.runner import RayMissing

    try:
        import ray
    except ImportError:
        raise RayMissing(RAY_MISSING) from None
    return ray


def _commit(
    out: Path,
    inst: Instrument,
    days: Iterable[StagedDay],
    result: ImportResult,
    progress: Callable[[str], None] | None,
    compression: str,
) -> None:
    """Write the staged days, in order, into the store `out` (extended if it exists); a staging file is removed
    once all its days are written."""
    opened: dict[Path, h5py.File] = {}
    committed: Counter = Counter()
    with StoreWriter.open(out, inst, extend=True, check_day=check_stored_day, compression=compression) as writer:
        try:
            for day in days:
                result.rows[day.day] = commit_day(writer, day, inst, opened)
                for part in (p for parts in day.parts.values() for p in parts):
                    committed[part.staged] += 1
                    if committed[part.staged] == part.siblings:
                        opened.pop(part.staged).close()
                        part.staged.unlink()
                if progress is not None:
                    progress(f"wrote {day.day}: " + ", ".join(f"{s} {n:,}" for s, n in result.rows[day.day].items()))
        finally:
            for h5 in opened.values():
                h5.close()
