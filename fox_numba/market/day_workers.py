"""Processes that read a store's days side by side: a cold run's feature build (features/cache.py) and
`fox data inspect` (market/inspect.py).

Each day is read, validated and reduced (to its features, to its summary) independently of the others, so a pool of
spawned processes can take a day each while the calling process hands the results out in day order. A process costs
about 1.2 CPU-seconds to start (numpy, h5py, numba and the package), so the automatic count starts none for fewer
than MIN_AUTO_DAYS days (tools/results/scale_cpu.md, last section). A worker that fails on a day returns its `failed`
value instead of raising, and the caller reads that day itself: the error the user sees is the calling process's
own, naming file, group, field and row (exceptions do not all cross a process boundary intact).
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ProcessPoolExecutor
from multiprocessing import get_context
from typing import TypeVar

from fox_numba.errors import ConfigError

T = TypeVar("T")

MAX_READ_WORKERS = 8
"""Most processes the automatic count starts: each holds a block of one day's book (READ_ROWS rows) and its
reduction, about 0.3 GiB at 3 M rows a day (tools/results/scale_cpu.md)."""

MIN_AUTO_DAYS = 8
"""Fewest days for which the automatic count starts processes: four 1 M-row days took as long with two as without."""


def read_workers(setting: int, days: int, name: str) -> int:
    """Processes for `days` days: `setting` (the option `name`), where 0 is one per core, at most MAX_READ_WORKERS,
    for at least MIN_AUTO_DAYS days (else 1); 1 reads every day in the calling process."""
    if setting < 0:
        raise ConfigError(f"{name} is {setting}; it must be 0 (one per core) or more")
    if setting:
        return setting
    return max(1, min(MAX_READ_WORKERS, len(os.sched_getaffinity(0)))) if days >= MIN_AUTO_DAYS else 1


def start_pool(workers: int) -> ProcessPoolExecutor | None:
    """`workers` spawned processes (none for fewer than 2), each started and importing the package at once."""
    if workers < 2:
        return None
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn"))
    for _ in range(workers):
        pool.submit(_started)
    return pool


def _started() -> None:
    """A worker's first task: nothing, so that it starts while the caller works."""


def outcome(future: Future[T], failed: T) -> T:
    """A worker's result; `failed` where the pool broke (a worker killed, or a main module that a spawned process
    cannot import, such as a script read from stdin): the caller reads the day itself."""
    try:
        return future.result()
    except Exception:  # noqa: BLE001 - the caller's own read gives the error, if there is one
        return failed
