"""Run a sweep's trials as Ray tasks, one `python -m fox_numba train` subprocess each.

Ray schedules; this module only submits one task per unfinished trial and collects outcomes as they
arrive. A task asks for 1 / per_gpu of a GPU when the cluster has any (`fox sweep --per-gpu`, 1 by default;
Ray sets CUDA_VISIBLE_DEVICES to the GPU it grants, so each trial sees one device) and one CPU otherwise; a
trial granted a GPU runs its kernels there (NUMBA_ENABLE_CUDASIM=0), one granted a CPU under the CUDA
simulator (=1). A subprocess per trial
keeps a crash, a CUDA context or numba state of one trial out of the worker and the next trial; it is
the same code path as `fox train`, and an interrupted trial continues with `fox train --resume`.

The market store reaches the trials as a path: the driver resolves it (building the embedded default
market once, as `fox train` would) and every trial opens that same HDF5 file read-only. That is right
on one host or a shared file system, where copying a store into every task (Ray's object store) would
cost memory per trial for nothing; the sweep folder must be on the same shared file system, since the
trials write their run folders there and the driver reads them.

`--address` joins an existing cluster (Ray's conventions: `auto`, `HOST:PORT`, `ray://HOST:PORT`);
without it a local cluster is started with this machine's CPUs and GPUs (none under the simulator).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fox_numba.accelerator import SIM_VARIABLE, cuda_gpu_count
from fox_numba.errors import INTERRUPTS, FoxError, Interrupted
from fox_numba.sweep.folder import SweepFolder, TrialRecord
from fox_numba.walkforward.run_folder import CONFIG

RAY_MISSING = 'fox sweep needs Ray: pip install -e ".[ray]"'
ERROR_TAIL_LINES = 20  # lines of a failed trial's stderr kept in its record and summary.json
OBJECT_STORE_BYTES = 256 << 20  # a local cluster's object store: tasks pass a few small dicts, nothing more
PR_SET_PDEATHSIG = 1  # prctl(2): a signal for the child when the thread that started it exits
WAIT_S = 1.0  # the driver wakes at least this often, so Ctrl-C stops a sweep while its trials run
LIBC = ctypes.CDLL(None, use_errno=True)  # loaded here: between fork and exec the child only calls prctl

Log = Callable[[str], None]


class RayMissing(FoxError):
    """`fox sweep` without the `ray` extra installed."""

    exit_code = 2


@dataclass(frozen=True)
class TrialJob:
    """What a Ray task needs to run one trial (plain data: it is pickled to the worker)."""

    id: str
    train_args: tuple[str, ...]
    """`fox train` arguments of a fresh start (the run folder is named by run.out_dir and run.name)."""
    run_dir: str
    stdout: str
    stderr: str
    cwd: str


def _die_with_parent() -> None:
    """In the trial's child process: SIGTERM when the Ray worker dies (Linux), so no orphaned `fox train`
    keeps its run folder locked after a sweep is stopped; `fox train` stops cleanly on SIGTERM."""
    LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def stderr_tail(path: Path, offset: int, lines: int = ERROR_TAIL_LINES) -> str:
    """The last `lines` non-empty lines written to `path` after byte `offset` (progress redraws split)."""
    with open(path, "rb") as fh:
        fh.seek(offset)
        text = fh.read().decode("utf-8", errors="replace")
    kept = [ln.rstrip() for ln in text.replace("\r", "\n").splitlines() if ln.strip()]
    return "\n".join(kept[-lines:])


def signal_note(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"exit {returncode}, killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"exit {returncode}"
    return f"exit {returncode}"


def run_trial(job: TrialJob, use_gpu: bool) -> dict[str, Any]:
    """Run one trial to its end (in a Ray worker): `fox train` fresh, or `--resume` when its run folder
    exists. Returns the exit code, whether it resumed, wall seconds and, on failure, the stderr tail."""
    run = Path(job.run_dir)
    resume = (run / CONFIG).is_file()
    argv = [sys.executable, "-m", "fox_numba", "train", *(("--resume", str(run)) if resume else job.train_args)]
    env = {**os.environ, SIM_VARIABLE: "0" if use_gpu else "1"}
    Path(job.stderr).parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(job.stdout, "ab") as out, open(job.stderr, "ab") as err:
        offset = err.tell()
        proc = subprocess.run(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, cwd=job.cwd, env=env,
                              preexec_fn=_die_with_parent, check=False)
    wall = time.perf_counter() - start
    error = None
    if proc.returncode != 0:
        error = f"{signal_note(proc.returncode)}:\n{stderr_tail(Path(job.stderr), offset)}"
    return {"returncode": proc.returncode, "resumed": resume, "wall_s": wall, "error": error}


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RayMissing(RAY_MISSING) from None
    return ray


def connect(ray: Any, address: str | None, *, simulator: bool) -> None:
    """Join the cluster at `address`, or start a local one sized to this machine."""
    quiet = {"log_to_driver": False, "logging_level": "ERROR"}
    if address:
        ray.init(address=address, **quiet)
    else:
        ray.init(num_cpus=len(os.sched_getaffinity(0)), num_gpus=0 if simulator else cuda_gpu_count(),
                 object_store_memory=OBJECT_STORE_BYTES, include_dashboard=False, **quiet)


def run_jobs(jobs: Sequence[TrialJob], folder: SweepFolder, *, address: str | None, simulator: bool,
             on_done: Callable[[TrialJob, TrialRecord, bool], None], per_gpu: int = 1) -> None:
    """Run every job on Ray, recording each outcome in the sweep folder as it arrives (`on_done(job,
    record, resumed)`); a failed trial is recorded and the others go on. On a cluster with GPUs each trial is
    granted 1 / per_gpu of one, so up to per_gpu trials share each GPU at once."""
    ray = import_ray()
    connect(ray, address, simulator=simulator)
    # A signal handler that raises inside Ray's wait would surface as a SystemError: note the signal, and
    # raise Interrupted between waits instead (the finally below then stops the trials: PR_SET_PDEATHSIG).
    caught: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: caught.append(signum)) for sig in INTERRUPTS}
    try:
        use_gpu = ray.cluster_resources().get("GPU", 0) >= 1
        task = ray.remote(run_trial).options(num_gpus=1 / per_gpu if use_gpu else 0, num_cpus=1, max_retries=0)
        pending = {task.remote(job, use_gpu): job for job in jobs}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=WAIT_S)
            if caught:
                raise Interrupted(caught[0])
            if not ready:
                continue
            job = pending.pop(ready[0])
            try:
                result = ray.get(ready[0])
            except Exception as e:  # the task itself failed (its worker died, a lost node): recorded, not raised
                result = {"returncode": None, "resumed": False, "wall_s": 0.0, "error": f"Ray task failed: {e}"}
            before = folder.record(job.id)
            record = TrialRecord(
                returncode=result["returncode"], error=result["error"], attempts=(before.attempts if before else 0) + 1,
                wall_s=(before.wall_s if before else 0.0) + result["wall_s"],
            )
            folder.save_record(job.id, record)
            on_done(job, record, result["resumed"])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        ray.shutdown()
