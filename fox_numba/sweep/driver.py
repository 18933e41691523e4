"""`fox sweep`: expand a spec into trials, run the unfinished ones on Ray, aggregate them.

    trials      spec.trials(): every grid combination x every seed, ordered by trial id
    identity    sweep.json: a rerun must describe the same trials with the same `fox train` arguments
    skip        trials whose run folder holds summary.json (one progress line each)
    run         the others as Ray tasks (sweep/runner.py): fresh, or `--resume` from their checkpoints
    aggregate   summary.json of the sweep folder (sweep/aggregate.py)

Each trial's `fox train` gets the base options (`--preset`, `--config`, `--set`, in that order), the
store as an absolute path, then the grid values and run.seed / run.out_dir / run.name of the trial as
`--set` overrides, which come last and so win.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fox_numba.config import toml_literal
from fox_numba.sweep.aggregate import sweep_summary
from fox_numba.sweep.folder import RUNS, SweepFolder, TrialRecord
from fox_numba.sweep.runner import TrialJob, run_jobs
from fox_numba.sweep.spec import SweepSpec, Trial

Log = Callable[[str], None]


@dataclass(frozen=True)
class BaseOptions:
    """The base config of every trial, as `fox train` options."""

    preset: str | None
    config: Path | None
    overrides: tuple[str, ...]
    store: Path
    """The market store every trial reads (absolute; the driver built the default one if needed)."""

    def args(self) -> list[str]:
        out = ["--preset", self.preset] if self.preset else []
        if self.config is not None:
            out += ["--config", str(self.config.resolve())]
        out += ["--store", str(self.store.resolve())]
        for text in self.overrides:
            out += ["--set", text]
        return out


def train_args(base: BaseOptions, trial: Trial, folder: SweepFolder) -> tuple[str, ...]:
    """The `fox train` arguments of a trial's fresh start (module docstring)."""
    own = [*trial.overrides(), f"run.seed={trial.seed}", f"run.out_dir={toml_literal(str(folder.path / RUNS))}",
           f"run.name={toml_literal(trial.id)}"]
    return (*base.args(), *(a for text in own for a in ("--set", text)))


def plan(trials: Sequence[Trial], base: BaseOptions, folder: SweepFolder, cwd: Path) -> list[TrialJob]:
    jobs = []
    for t in trials:
        out, err = folder.logs(t.id)
        run = str(folder.run_dir(t.id))
        jobs.append(TrialJob(t.id, train_args(base, t, folder), run, str(out), str(err), str(cwd)))
    return jobs


def identity(spec: SweepSpec, base: BaseOptions, jobs: Sequence[TrialJob]) -> dict[str, Any]:
    """What sweep.json records: the trials and their arguments, and the base config file's text."""
    config_text = base.config.read_text(encoding="utf-8") if base.config is not None else None
    by_id = {t.id: t for t in spec.trials()}
    return {
        "config_file_text": config_text,
        "trials": [{"id": j.id, "config": by_id[j.id].config, "seed": by_id[j.id].seed,
                    "values": {k: v for k, v in by_id[j.id].values}, "args": list(j.train_args)} for j in jobs],
    }


def run_sweep(spec: SweepSpec, base: BaseOptions, folder: SweepFolder, *, address: str | None, simulator: bool,
              log: Log, cwd: Path | None = None, per_gpu: int = 1) -> dict[str, Any]:
    """Run (or continue) the sweep in `folder`, up to `per_gpu` trials sharing a GPU; its summary (also written
    to summary.json)."""
    start = time.perf_counter()
    trials = spec.trials()
    jobs = plan(trials, base, folder, cwd or Path.cwd())
    folder.claim(identity(spec, base, jobs))
    finished = {j.id for j in jobs if folder.finished(j.id)}
    todo = [j for j in jobs if j.id not in finished]
    count = 0

    def line(trial: str, what: str) -> None:
        nonlocal count
        count += 1
        log(f"sweep: [{count}/{len(jobs)}] {trial} {what}")

    for j in jobs:
        if j.id in finished:
            line(j.id, f"skipped: finished before ({folder.run_dir(j.id)})")

    def done(job: TrialJob, record: TrialRecord, resumed: bool) -> None:
        how = "resumed and " if resumed else ""
        if record.returncode == 0:
            line(job.id, f"{how}done in {record.wall_s:.0f} s")
        else:
            last = (record.error or "").splitlines()
            line(job.id, f"failed ({last[0].rstrip(':') if last else 'no message'}): "
                         f"{last[-1] if len(last) > 1 else ''} (stderr: {job.stderr})")

    if todo:
        run_jobs(todo, folder, address=address, simulator=simulator, on_done=done, per_gpu=per_gpu)
    records = {t.id: folder.record(t.id) for t in trials}
    summary = sweep_summary(trials, folder, records, wall_s=time.perf_counter() - start)
    folder.save_summary(summary)
    return summary
