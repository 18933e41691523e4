"""Several runs' kernels at once on one GPU: a private CUDA MPS (Multi-Process Service) control daemon.

Without MPS, the CUDA contexts of separate processes take turns on a GPU: the learner steps of 8 `fox train` runs
ran one after another, 8 runs at once took 2.59 x one run's wall on an H100 (tools/results/many_runs_meanx_h100.md).
Under an MPS daemon the processes' kernels share the GPU as one context's streams would (1.59 x there,
many_runs_mps2_h100.md), and each run's numbers stay the same bit for bit (the kernels and their order in a run do
not change).

    with mps_daemon() as env:        # starts `nvidia-cuda-mps-control -d` with pipes in a temporary folder
        run children with env         # {CUDA_MPS_PIPE_DIRECTORY, CUDA_MPS_LOG_DIRECTORY}: they connect to it
                                      # on exit: `quit` to the daemon, the folder removed
    with mps_for_children(on):       # the same, the variables in os.environ for the block: every process it
        ...                           # starts connects (tools/train_seeds.py's jobs, a local Ray cluster's workers)

The daemon is this user's and this folder's only: nothing of the GPU's settings changes (its compute mode stays
as it is), another user's or a system MPS daemon is not touched, and clients without these variables run as
before. It needs the CUDA driver's `nvidia-cuda-mps-control` on PATH (Linux); its absence is a clear error.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

from fox_numba.errors import FoxError

CONTROL = "nvidia-cuda-mps-control"
PIPE_VARIABLE = "CUDA_MPS_PIPE_DIRECTORY"
LOG_VARIABLE = "CUDA_MPS_LOG_DIRECTORY"
CONTROL_TIMEOUT_S = 30.0  # starting or stopping the daemon returns at once; this bounds a hung driver


class MpsUnavailable(FoxError):
    """`--mps` where no MPS control daemon can be started."""


def mps_problem() -> str | None:
    """Why no MPS daemon can be started here (None when the control program is on PATH): for a command's
    argument check, before it starts any work."""
    if shutil.which(CONTROL) is None:
        return (f"--mps: {CONTROL} is not on PATH (it comes with the NVIDIA driver on Linux); run without --mps, "
                "or add the driver's utilities to PATH")
    return None


@contextmanager
def mps_daemon() -> Iterator[dict[str, str]]:
    """Run a private MPS control daemon for the duration of the block; yields the environment variables that
    connect a child process to it (module header). Raises MpsUnavailable when the control program is missing or
    the daemon does not start, with the program's own message."""
    if (problem := mps_problem()) is not None:
        raise MpsUnavailable(problem)
    control = shutil.which(CONTROL)
    folder = tempfile.mkdtemp(prefix="fox_mps_")
    env = {PIPE_VARIABLE: os.path.join(folder, "pipe"), LOG_VARIABLE: os.path.join(folder, "log")}
    for path in env.values():
        os.mkdir(path)
    child_env = {**os.environ, **env}
    try:
        started = subprocess.run([control, "-d"], env=child_env, capture_output=True, text=True,
                                 timeout=CONTROL_TIMEOUT_S, check=False)
        if started.returncode != 0:
            said = (started.stderr or started.stdout).strip() or "no message"
            raise MpsUnavailable(f"--mps: `{CONTROL} -d` exited {started.returncode}: {said}")
        try:
            yield env
        finally:
            subprocess.run([control], input="quit\n", env=child_env, capture_output=True, text=True,
                           timeout=CONTROL_TIMEOUT_S, check=False)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def mps_for_children(on: bool) -> Iterator[None]:
    """With `on`, run the block under a private daemon with its variables in os.environ, so that every process
    started in it connects (module header); the variables are restored on exit. Without `on`, nothing."""
    if not on:
        yield
        return
    with mps_daemon() as env:
        before = {name: os.environ.get(name) for name in env}
        os.environ.update(env)
        try:
            yield
        finally:
            for name, value in before.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
