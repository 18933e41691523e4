"""Compile every registered kernel into the on-disk kernel cache, in parallel processes (`fox cache warm`).

A cold `fox train` compiles each kernel at its first launch, one after another in its one process: on an H100 a
default run took 46 s with the cache empty and 23 s with it filled (tools/results/train_tw_h100d.md). Every kernel's
launch signatures are in the registry (device/registry.py; under the simulator each launch is checked to match one
exactly, device/launch.py), so they can be compiled ahead: each process takes a share of the kernels, compiles
their signatures (`Dispatcher.compile`: NVVM, then the cubin bound to the GPU) and numba-cuda writes them to the
folder later runs load from (device/kernel_cache.py). A kernel stays in one process, since numba keeps one index
file per kernel. It compiles every kernel of the package, those a given config never launches included, so it
pays on a machine with cores to spare: a machine image, a new checkout, an upgrade.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from fox_numba.accelerator import gpu_missing
from fox_numba.device.kernel_cache import cache_folder
from fox_numba.device.registry import KERNELS
from fox_numba.errors import FoxError
from fox_numba.kernels.compile_check import import_package


WORKER = (sys.executable, "-m", "fox_numba.kernels.warm_cache")
"""The command of one share's process; the kernels' names follow it."""


class CannotWarm(FoxError):
    """The cache cannot be filled here: under the simulator (nothing is compiled), without the GPU that
    NUMBA_ENABLE_CUDASIM=0 asks for, or with the cache off."""

    exit_code = 2


@dataclass(frozen=True)
class Warmed:
    """What `warm` did: kernels and signatures compiled, into which folder, with how many processes, how long, and
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


def warm(workers: int | None = None) -> Warmed:
    """Fill this code's kernel cache folder with every registered kernel, `workers` processes at once (default:
    the cores less one)."""
    from fox_numba.device.runtime import SIMULATOR

    if SIMULATOR:
        raise CannotWarm("the CUDA simulator compiles nothing: run `fox cache warm` on a machine with a GPU")
    if (problem := gpu_missing()) is not None:
        raise CannotWarm(problem)
    folder = cache_folder()
    if folder is None:
        raise CannotWarm("the kernel cache is off (FOX_KERNEL_CACHE=0) or its folder is not writable")
    kernels = load_all_kernels()
    plan = shares(kernels, workers or max(1, (os.cpu_count() or 2) - 1))
    t0 = time.perf_counter()
    procs = [subprocess.Popen([*WORKER, *share], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for share in plan]
    failures = []
    for share, proc in zip(plan, procs, strict=True):
        output = proc.communicate()[0]
        if proc.returncode != 0:
            tail = "\n".join(output.strip().splitlines()[-5:])
            failures.append(f"kernels {', '.join(share)}: exit {proc.returncode}\n{tail}")
    return Warmed(len(kernels), sum(kernels.values()), folder, len(plan), time.perf_counter() - t0, tuple(failures))


if __name__ == "__main__":
    compile_share(sys.argv[1:])
