"""fox_numba keeps the host's BLAS at one thread unless the environment sets it (host_threads.py), at its import,
before numpy loads: N runs on one host otherwise each start a BLAS thread per core."""

from __future__ import annotations

import os
import subprocess
import sys

from fox_numba.host_threads import HOST_THREADS, THREAD_VARIABLES, limit_host_threads

PROBE = "import os, fox_numba, numpy; print(' '.join(os.environ.get(v, '-') for v in {names!r}))"


def test_unset_or_empty_variables_get_the_default_and_set_ones_stay():
    env = {"OPENBLAS_NUM_THREADS": "", "MKL_NUM_THREADS": "6"}
    chosen = limit_host_threads(env)
    assert chosen == {"OPENBLAS_NUM_THREADS": str(HOST_THREADS), "OMP_NUM_THREADS": str(HOST_THREADS)}
    assert env == {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "6"}


def run_import(**overrides: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES} | overrides
    out = subprocess.run([sys.executable, "-c", PROBE.format(names=THREAD_VARIABLES)], env=env, check=True,
                         capture_output=True, text=True).stdout
    return out.split()


def test_importing_the_package_sets_them_before_numpy_loads_and_keeps_the_users():
    assert run_import() == ["1", "1", "1"]
    assert run_import(OPENBLAS_NUM_THREADS="3") == ["3", "1", "1"]
