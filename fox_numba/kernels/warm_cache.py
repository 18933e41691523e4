"""Compile every registered kernel into the on-disk kernel cache, in parallel processes: `fox cache warm`, and
`fox train` itself when it finds this code's cache cold.

A cold `fox train` compiles each kernel at its first launch, one after another in its one process: on an H100 a
default run took 46 s with the cache empty and 23 s with it filled (tools/results/train_tw_h100d.md). Every kernel's
launch signatures are in the registry (device/registry.py; under the simulator each launch is checked to match one
exactly, device/launch.py), so they can be compiled ahead: each process takes a share of the kernels, compiles
their signatures (`Dispatcher.compile`: NVVM, then the cubin bound to the GPU) and numba-cuda writes them to the
folder later runs load from (device/kernel_cache.py). A kernel stays in one process, since numba keeps one index
file per kernel. It compiles every kernel of the package, those a given config never launches included, so it
pays on a machine with cores to spare: `Prewarm` starts it only with at least MIN_BACKGROUND_WORKERS processes.

One process fills a folder at a time (an exclusive lock on its LOCK file); a process that finds the lock held
waits for it before its first launch. A completed fill leaves a marker per GPU architecture (`warmed-sm90`),
so later runs skip the check. No process launches a kernel while a fill runs, so numba-cuda's index files,
which two processes saving the same kernel could overwrite with mismatched entries, have one writer at a time.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from fox_numba.accelerator import gpu_missing
from fox_numba.device.kernel_cache import cache_folder
from fox_numba.device.registry import KERNELS
from fox_numba.errors import ConfigError, FoxError
from fox_numba.kernels.compile_check import import_package


WORKER = (sys.executable, "-m", "fox_numba.kernels.warm_cache")
"""The command of one share's process; the kernels' names follow it."""

WORKERS_ENV = "FOX_COMPILE_WORKERS"
"""Environment variable: processes a stage fills a cold cache with before its first launch (0: none, the stage
compiles each kernel at its first launch)."""

MIN_BACKGROUND_WORKERS = 7
"""Fewest processes worth filling the whole cache with ahead of a stage: 154 kernels took 13.5-17.5 s with 15
processes on an H100 host (about 250 CPU-seconds), a cold default run compiles the kernels it uses in 30-42 s
in its one process (tools/results/learner_ablation_h200.md section 94)."""

LOCK = "warm.lock"
"""File in the cache folder whose exclusive lock the filling process holds."""


class CannotWarm(FoxError):
    """The cache cannot be filled here: under the simulator (nothing is compiled), without the GPU that
    NUMBA_ENABLE_CUDASIM=0 asks for, or with the cache off."""

    exit_code = 2


@dataclass(frozen=True)
class Warmed:
    """What a fill did: kernels and signatures compiled, into which folder, with how many processes, how long, and
    each failed share's command and output tail."""

    kernels: int
    signatures: int
    folder: Path
    workers: int
    seconds: float
    failures: tuple[str, ...]


def load_all_kernels() -> dict[str, int]:
    """{name: signatures} of every registered kernel the disk cache keeps (one that links external code is compiled
    at its launch instead), after importing the whole package."""
    import_package()
    return {name: len(spec.signatures) for name, spec in sorted(KERNELS.items())
            if not getattr(spec.kernel, "targetoptions", {}).get("link")}


def shares(kernels: dict[str, int], n: int) -> list[list[str]]:
    """The kernels in at most n shares of near-equal signature counts (the largest first into the lightest share;
    ties by name), none empty."""
    bins: list[list[str]] = [[] for _ in range(max(1, min(n, len(kernels))))]
    load = [0] * len(bins)
    for name in sorted(kernels, key=lambda k: (-kernels[k], k)):
        k = load.index(min(load))
        bins[k].append(name)
        load[k] += kernels[name]
    return [b for b in bins if b]


def compile_share(names: list[str]) -> None:
    """Compile each named kernel's registered signatures (in this process: the worker's side of `warm`)."""
    load_all_kernels()
    for name in names:
        spec = KERNELS[name]
        for sig in spec.signatures:
            spec.kernel.compile(sig)


def default_workers() -> int:
    """The cores less one."""
    return max(1, (os.cpu_count() or 2) - 1)


def background_workers(environ: dict[str, str] | os._Environ[str] = os.environ) -> int:
    """Processes a stage fills a cold cache with: FOX_COMPILE_WORKERS, else the cores less one where that is at
    least MIN_BACKGROUND_WORKERS, else 0 (the stage compiles what it launches, as it goes)."""
    setting = environ.get(WORKERS_ENV, "").strip()
    if setting:
        if not setting.isdigit():
            raise ConfigError(f"{WORKERS_ENV}={setting!r}: expected a whole number of processes (0: none)")
        return int(setting)
    n = default_workers()
    return n if n >= MIN_BACKGROUND_WORKERS else 0


def marker(folder: Path) -> Path:
    """The file that says `folder` holds every cacheable kernel compiled for this machine's GPU architecture."""
    from numba import cuda

    major, minor = cuda.get_current_device().compute_capability
    return folder / f"warmed-sm{major}{minor}"


class Fill:
    """Share processes compiling every cacheable kernel into `folder`, started at construction; `wait` collects
    them and marks the folder when all succeeded, `stop` kills those still running."""

    def __init__(self, folder: Path, workers: int) -> None:
        self.folder = folder
        self.kernels = load_all_kernels()
        self.plan = shares(self.kernels, workers)
        self.t0 = time.perf_counter()
        self.logs: list[IO[Any]] = [tempfile.TemporaryFile(mode="w+") for _ in self.plan]
        self.procs = [subprocess.Popen([*WORKER, *share], stdout=log, stderr=subprocess.STDOUT, text=True)
                      for share, log in zip(self.plan, self.logs, strict=True)]

    def wait(self) -> Warmed:
        failures = []
        for share, proc, log in zip(self.plan, self.procs, self.logs, strict=True):
            if proc.wait() != 0:
                log.seek(0)
                tail = "\n".join(log.read().strip().splitlines()[-5:])
                failures.append(f"kernels {', '.join(share)}: exit {proc.returncode}\n{tail}")
            log.close()
        if not failures:
            marker(self.folder).touch()
        return Warmed(len(self.kernels), sum(self.kernels.values()), self.folder, len(self.plan),
                      time.perf_counter() - self.t0, tuple(failures))

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for log in self.logs:
            log.close()


def lock(folder: Path, wait: bool) -> IO[Any] | None:
    """The folder's fill lock, held (close the file to release it); None when another process holds it and
    `wait` is False."""
    handle = open(folder / LOCK, "a")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        handle.close()
        return None
    return handle


def usable_folder() -> Path:
    """This code's cache folder; CannotWarm where nothing can be compiled into it."""
    from fox_numba.device.runtime import SIMULATOR

    if SIMULATOR:
        raise CannotWarm("the CUDA simulator compiles nothing: run `fox cache warm` on a machine with a GPU")
    if (problem := gpu_missing()) is not None:
        raise CannotWarm(problem)
    folder = cache_folder()
    if folder is None:
        raise CannotWarm("the kernel cache is off (FOX_KERNEL_CACHE=0) or its folder is not writable")
    return folder


def warm(workers: int | None = None) -> Warmed:
    """Fill this code's kernel cache folder with every registered kernel, `workers` processes at once (default:
    the cores less one), after any fill another process runs."""
    folder = usable_folder()
    held = lock(folder, wait=True)
    fill = Fill(folder, workers or default_workers())
    try:
        return fill.wait()
    finally:
        fill.stop()
        if held is not None:
            held.close()


class Prewarm:
    """A stage's fill of a cold cache while it reads its market (`with Prewarm(log) as prewarm: ...;
    prewarm.ready()`, `ready` before the first kernel launch). Nothing to do under the simulator, with the cache
    off, with too few cores (background_workers) or where the folder is marked for this GPU; where another
    process fills the folder, `ready` waits for it. Leaving the block early kills the share processes: the
    kernels compiled so far stay cached, the rest compile at their launch or in the next fill."""

    def __init__(self, log: Callable[[str], None]) -> None:
        self.log = log
        self.fill: Fill | None = None
        self.held: IO[Any] | None = None
        self.folder: Path | None = None

    def __enter__(self) -> Prewarm:
        workers = background_workers()
        try:
            folder = usable_folder() if workers else None
        except CannotWarm:
            folder = None
        if folder is None or marker(folder).exists():
            return self
        self.folder, self.held = folder, lock(folder, wait=False)
        if self.held is None:
            self.log(f"another process compiles the kernels into {folder}: this one waits for it before its first "
                     "launch")
        elif marker(folder).exists():  # filled between the look and the lock
            self.release()
        else:
            self.fill = Fill(folder, workers)
            self.log(f"kernel cache cold: compiling {len(self.fill.kernels)} kernels in {len(self.fill.plan)} "
                     f"processes while the market loads ({WORKERS_ENV}=0 turns this off)")
        return self

    def ready(self) -> None:
        """Wait for the fill (this process's or another's); log what it did."""
        if self.fill is not None:
            t0 = time.perf_counter()
            done, self.fill = self.fill.wait(), None
            self.log(f"compiled {done.kernels} kernels in {done.seconds:.1f} s (waited {time.perf_counter() - t0:.1f}"
                     " s for them)" + "".join(f"; failed, compiled at launch instead: {f}" for f in done.failures))
        elif self.folder is not None and self.held is None:
            self.held = lock(self.folder, wait=True)
        self.release()

    def release(self) -> None:
        if self.fill is not None:
            self.fill.stop()
            self.fill = None
        if self.held is not None:
            self.held.close()
            self.held = None
        self.folder = None

    def __exit__(self, *exc: object) -> None:
        self.release()


if __name__ == "__main__":
    compile_share(sys.argv[1:])
