"""The host's numerical libraries at one thread each unless the user set them: decided once, before numpy loads.

A run's host linear algebra is small (the probe's and the forecast columns' ridge fits, a Gram matrix of the
market columns per fold), while a GPU run's host is often shared: by N runs at once (`fox sweep`, tools/suite.py,
tools/bench_runs.py) or by other work. OpenBLAS starts a thread per core in every process, and processes whose
threads together outnumber the cores slow each other's fits 10-50 times (tools/results/host_threads_cpu.md;
on one H100 host eight runs' fold set-up took 12.8 s a run against 1.2 s alone, learner_ablation_h200.md section
87). One thread per process was as fast alone there. A variable already set (by the user, or by a tool's
`--threads-per-run`) is left as it is. Like accelerator.py it acts at the package's import, so it reaches `fox`
and every process that imports fox_numba before numpy; a process that loaded numpy first keeps its threads.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
"""The thread counts of OpenBLAS (numpy's wheels), OpenMP builds and MKL, read once when the library loads."""
HOST_THREADS = 1
"""Threads per library unless set."""


def limit_host_threads(environ: MutableMapping[str, str] = os.environ) -> dict[str, str]:
    """Set each of THREAD_VARIABLES that is unset or empty to HOST_THREADS; return what it set."""
    chosen = {name: str(HOST_THREADS) for name in THREAD_VARIABLES if not environ.get(name)}
    environ.update(chosen)
    return chosen
