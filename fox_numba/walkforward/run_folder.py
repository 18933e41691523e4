"""The run folder: everything a walk-forward run writes, in an order that lets a killed run resume exactly.

    runs/<name>/
      config.toml                  the resolved config (config.write_config; `--config` reads it back)
      folds.json                   the fold windows (Fold.as_dict) and the run's trading days
      metrics.jsonl                one line per epoch per fold (`epoch_line`), appended and fsynced
      fold_00/last.h5              the trainer's state after the fold's latest epoch (a checkpoint; once the
                                   fold has ended, without the replay ring, which the next fold empties)
      fold_00/best.h5              the state of the fold's chosen epoch without the replay ring, the checkpoint
                                   to deploy (`BestEpoch`: the best daily Sharpe on the selection days, or
                                   without them the last epoch the kill criteria passed; never chosen on the
                                   validation days)
      fold_00/best_validation.npz  that epoch's validation days (per-bar PnL and positions)
      train.log                    every line the run printed, in full (the fold resets' entries; `fox train
                                   --verbose` prints them, and HEALTH_DIAG lines, on the console too)
      summary.json                 per fold: the chosen epoch, its figures and baselines, the in-sample best
                                   epoch by validation Sharpe (labelled, never deployed), kill; across folds
      .lock                        held (flock) by the process running the folder, deleted when it closes the
                                   folder; one left by a SIGKILL is taken over by the next run, which says so

Per epoch the driver calls `end_epoch`, which writes, in this order: the metrics line; when the epoch is the
fold's best so far, best_validation.npz and best.h5; then last.h5. Every file but metrics.jsonl is written
atomically (temporary name, fsync, rename). So after a kill -9 at any moment, last.h5 of the highest fold
holds a whole epoch's state, anything written after it belongs to an epoch that will run again, and a
deterministic driver rewrites it identically.

Resume (`fox train --resume RUN`): `RunFolder.open(path)` takes the lock and deletes stale temporary files;
`resume_point()` loads the latest last.h5, cuts metrics.jsonl back to the lines of epochs up to it (a torn
last line included) and says where to continue: the next epoch of that fold, or epoch 0 of the next fold
after a fold reset when the checkpoint ended its fold (last epoch, or a kill). The driver then uploads the
checkpoint's arrays, calls `registry.load_host_state(point.checkpoint.registry_state)`, runs
`registry.reset(FoldReset, ...)` if `point.fold_boundary`, and goes on as if never stopped.

Which epoch is chosen is registry state (`BestEpoch`, FoldReset), so a resumed fold compares against the
same best as an uninterrupted one. An epoch that fired a kill criterion is never chosen. The validation days
never choose: they score the chosen epoch, so its figure is out of sample (the headline of `fox train`,
summary.json and the report). The epoch with the best validation Sharpe is reported beside it as the
in-sample figure, labelled so.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fox_numba.checkpoint import (
    Checkpoint,
    Layout,
    fsync_dir,
    load_checkpoint,
    remove_stale_temporaries,
    save_checkpoint,
)
from fox_numba.config import FoxConfig, load_run_config, write_config
from fox_numba.errors import ConfigError, InputError
from fox_numba.io import atomic_path, atomic_write_text
from fox_numba.walkforward.folds import Fold
from fox_numba.walkforward.kill import Kill
from fox_numba.walkforward.metrics import DaySeries, Metrics, across_folds, json_number
from fox_numba.walkforward.reset_registry import FoldReset, StateResetRegistry

CONFIG, FOLDS, METRICS, SUMMARY, LOCK = "config.toml", "folds.json", "metrics.jsonl", "summary.json", ".lock"
TRAIN_LOG = "train.log"
LAST, BEST, BEST_VALIDATION = "last.h5", "best.h5", "best_validation.npz"
SELECT_BY = "sharpe_daily"  # the selection days' figure the chosen epoch is picked by (folds.select_days > 0)
CHOSEN_BY = {"selection": "the best daily Sharpe on the selection days held out of training",
             "last": "the last epoch that passed the kill criteria (the end of the fixed schedule)"}
"""BestEpoch rules, with what each means for summary.json and the report."""


class BestEpoch:
    """The fold's chosen epoch so far (registry state, FoldReset), by `rule` (CHOSEN_BY): 'selection' keeps
    the best daily Sharpe on the selection days, 'last' the latest epoch that passed the kill criteria."""

    NOT_STATE = ("rule",)

    def __init__(self, rule: str = "last") -> None:
        if rule not in CHOSEN_BY:
            raise ValueError(f"BestEpoch: rule must be one of {sorted(CHOSEN_BY)}, got {rule!r}")
        self.rule = rule
        self.epoch: int | None = None
        self.sharpe: float | None = None

    @classmethod
    def for_config(cls, select_days: int) -> BestEpoch:
        """'selection' when the fold holds selection days out of training (folds.select_days > 0), else 'last'."""
        return cls("selection" if select_days > 0 else "last")

    def register_state(self, registry: StateResetRegistry) -> None:
        r = registry.owner(self, "run.best")
        r.field("epoch", FoldReset, None, "best epoch of this fold by selection (else validation) Sharpe")
        r.field("sharpe", FoldReset, None, "the daily Sharpe it was chosen by")

    def update(self, epoch: int, sharpe: float | None, eligible: bool = True) -> bool:
        """Record the epoch if the rule chooses it: under 'last' every eligible epoch, under 'selection' one
        whose selection Sharpe beats the best so far (strictly; a NaN or ineligible epoch never does)."""
        if not eligible:
            return False
        if self.rule == "last":
            self.epoch, self.sharpe = epoch, None if sharpe is None or not math.isfinite(sharpe) else float(sharpe)
            return True
        if sharpe is None or not math.isfinite(sharpe):
            return False
        if self.sharpe is not None and sharpe <= self.sharpe:
            return False
        self.epoch, self.sharpe = epoch, float(sharpe)
        return True


def epoch_line(
    fold: int, epoch: int, *, val: Metrics, report: Mapping[str, Any] | None = None,
    train: Mapping[str, Any] | None = None, kill: Kill | None = None, resets: Sequence[str] | None = None,
    select: Metrics | None = None,
) -> dict[str, Any]:
    """One metrics.jsonl line: the validation figures, the selection days' figures (when the fold has them),
    the fold report (baselines, oracle and probe fractions), training figures, the kill (None if none) and,
    on a fold's first epoch, the entries the fold reset ran."""
    line: dict[str, Any] = {"fold": fold, "epoch": epoch, "val": val.as_dict()}
    if select is not None:
        line["select"] = select.as_dict()
    if report is not None:
        line["baselines"] = {k: v for k, v in report.items() if k != "agent"}
    line["train"] = {k: json_number(v) for k, v in (train or {}).items()}
    line["kill"] = kill.as_dict() if kill is not None else None
    if resets is not None:
        line["resets"] = list(resets)
    return line


@dataclass(frozen=True)
class ResumePoint:
    """Where a resumed run continues, and the state to continue from."""

    fold: int
    epoch: int
    checkpoint: Checkpoint
    fold_boundary: bool
    """The checkpoint ended its fold: run registry.reset(FoldReset) for `fold` before its epoch 0."""
    run_done: bool
    """Every fold has finished: only the summary is left."""


def fold_dir(run: Path, fold: int) -> Path:
    """The folder of fold `fold` inside run folder `run` (checkpoints, best_validation.npz, baselines.npz)."""
    return run / f"fold_{fold:02d}"


class RunFolder:
    """One run's folder, locked by this process while it is open."""

    def __init__(self, path: Path, lock: tuple[int, bool]) -> None:
        self.path = path
        self._lock_fd: int | None = lock[0]
        self.stale_lock = lock[1]
        """A .lock was there that no process held (left by a run killed with SIGKILL); this one took it over."""

    # ---- opening -----------------------------------------------------------------------------------
    @staticmethod
    def _lock(path: Path) -> tuple[int, bool]:
        """(descriptor holding the flock of path/.lock, whether a lock file was there unheld). close() deletes
        the file while holding the lock, so a lock taken on a file since unlinked is retried on the new one."""
        while True:
            try:
                fd, stale = os.open(path / LOCK, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644), False
            except FileExistsError:
                try:
                    fd, stale = os.open(path / LOCK, os.O_RDWR), True
                except FileNotFoundError:  # deleted by its holder's close() in between
                    continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                raise ConfigError(f"{path}: the run folder is in use by another process") from None
            try:
                same = os.stat(path / LOCK).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                return fd, stale
            os.close(fd)  # locked a file its holder deleted on close: lock the current one

    @classmethod
    def create(cls, cfg: FoxConfig, folds: Sequence[Fold], *, name: str | None = None) -> RunFolder:
        """A new folder `cfg.run.out_dir/<name>` (name: cfg.run.name, else a timestamp) with config.toml and
        folds.json; refuses a folder that already holds a run."""
        name = name or cfg.run.name or time.strftime("%Y%m%d-%H%M%S")
        path = Path(cfg.run.out_dir) / name
        if (path / CONFIG).exists():
            raise ConfigError(f"{path}: a run already lives there; resume it (fox train --resume {path}) or choose "
                              "another run.name")
        path.mkdir(parents=True, exist_ok=True)
        run = cls(path, cls._lock(path))
        days = list(folds[0].days) if folds else []
        atomic_write_text(path / FOLDS, json.dumps({"days": days, "folds": [f.as_dict() for f in folds]}, indent=1) + "\n")
        write_config(cfg, path / CONFIG)  # last: its presence marks the folder as a run
        fsync_dir(path)
        return run

    @staticmethod
    def config_path(path: str | Path) -> Path:
        """The config.toml of the run folder `path`; an InputError when the folder or its config is missing."""
        path = Path(path)
        if not path.is_dir():
            raise InputError(path, "run folder not found")
        if not (path / CONFIG).is_file():
            raise InputError(path, f"not a run folder (no {CONFIG})")
        return path / CONFIG

    @classmethod
    def open(cls, path: str | Path) -> RunFolder:
        """An existing run folder, locked, stale temporary files of interrupted writes deleted."""
        path = Path(path)
        cls.config_path(path)
        run = cls(path, cls._lock(path))
        remove_stale_temporaries(path)
        return run

    def lock_note(self) -> str | None:
        """The line a run prints when it took over a stale .lock (None when there was none)."""
        if not self.stale_lock:
            return None
        return (f"{self.path / LOCK}: left by a run that did not exit cleanly (killed?); no process held it, so "
                "this run took it over")

    def close(self) -> None:
        """Delete .lock and release it (a clean exit, an error or Ctrl-C leaves no lock file behind)."""
        if self._lock_fd is not None:
            (self.path / LOCK).unlink(missing_ok=True)  # while still held: see _lock
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    def __enter__(self) -> RunFolder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- contents ----------------------------------------------------------------------------------
    def config(self) -> FoxConfig:
        """The run's resolved config, as written at creation."""
        return load_run_config(self.path / CONFIG)

    def config_toml(self) -> str:
        return (self.path / CONFIG).read_text(encoding="utf-8")

    def folds(self) -> list[dict[str, Any]]:
        return json.loads((self.path / FOLDS).read_text(encoding="utf-8"))["folds"]

    def fold_dir(self, fold: int) -> Path:
        return fold_dir(self.path, fold)

    def append_metrics(self, line: Mapping[str, Any]) -> None:
        """Append one JSON line with a single write, then fsync (a kill leaves at most a torn last line)."""
        data = (json.dumps(line, sort_keys=True, allow_nan=False) + "\n").encode()
        fd = os.open(self.path / METRICS, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)

    def read_metrics(self) -> list[dict[str, Any]]:
        """Every whole line of metrics.jsonl (a torn last line, left by a kill, is skipped)."""
        path = self.path / METRICS
        if not path.is_file():
            return []
        lines = []
        for text in path.read_text(encoding="utf-8").splitlines(keepends=True):
            if not text.endswith("\n"):
                break
            try:
                lines.append(json.loads(text))
            except ValueError:
                raise InputError(path, "a metrics line is not JSON (damaged file)", row=len(lines)) from None
        return lines

    def _truncate_metrics(self, upto: tuple[int, int] | None) -> None:
        keep = [ln for ln in self.read_metrics() if upto is not None and (ln["fold"], ln["epoch"]) <= upto]
        text = "".join(json.dumps(ln, sort_keys=True, allow_nan=False) + "\n" for ln in keep)
        with atomic_path(self.path / METRICS) as tmp:
            tmp.write_text(text, encoding="utf-8")
            with open(tmp, "rb+") as fh:
                os.fsync(fh.fileno())
        fsync_dir(self.path)

    # ---- one epoch ---------------------------------------------------------------------------------
    def end_epoch(
        self, line: Mapping[str, Any], *, arrays: Mapping[str, np.ndarray], registry: StateResetRegistry,
        best: BestEpoch, fold_done: bool, fingerprints: Mapping[str, str] | None = None,
        validation: Sequence[DaySeries] | None = None, meta: Mapping[str, Any] | None = None,
        best_arrays: Mapping[str, np.ndarray] | None = None,
    ) -> bool:
        """Record an epoch (module docstring: the order); returns whether it is the fold's best so far.
        `fold_done`: the fold ends with this epoch (its last, or a kill). `best_arrays`: what best.h5 holds, if
        not `arrays` (what evaluation reads, without the state only resuming needs)."""
        fold, epoch = int(line["fold"]), int(line["epoch"])
        chooser = line.get("select", {})
        improved = best.update(epoch, chooser.get(SELECT_BY), eligible=line.get("kill") is None)
        self.append_metrics({**line, "best": improved})
        ck_meta = {**(meta or {}), "fold": fold, "epoch": epoch, "fold_done": bool(fold_done)}
        state = registry.host_state()
        folder = self.fold_dir(fold)
        if improved:
            if validation is not None:
                self._save_validation(folder / BEST_VALIDATION, validation, epoch)
            save_checkpoint(folder / BEST, arrays if best_arrays is None else best_arrays, ck_meta, registry_state=state,
                            config_toml=self.config_toml(), fingerprints=fingerprints)
        save_checkpoint(folder / LAST, arrays, ck_meta, registry_state=state, config_toml=self.config_toml(),
                        fingerprints=fingerprints)
        return improved

    @staticmethod
    def _save_validation(path: Path, days: Sequence[DaySeries], epoch: int) -> None:
        lengths = np.array([len(d.pnl) for d in days], dtype=np.int64)
        with atomic_path(path) as tmp, open(tmp, "wb") as fh:
            np.savez(fh, epoch=np.int64(epoch), lengths=lengths,
                     pnl=np.concatenate([np.asarray(d.pnl, np.float64) for d in days]),
                     position=np.concatenate([np.asarray(d.position, np.float64) for d in days]))
            fh.flush()
            os.fsync(fh.fileno())

    def best_validation(self, fold: int) -> list[DaySeries] | None:
        """The validation days of the fold's best epoch (None if the fold recorded none)."""
        path = self.fold_dir(fold) / BEST_VALIDATION
        if not path.is_file():
            return None
        with np.load(path) as z:
            cuts = np.cumsum(z["lengths"])[:-1]
            return [DaySeries(p, q) for p, q in zip(np.split(z["pnl"], cuts), np.split(z["position"], cuts), strict=True)]

    # ---- resume ------------------------------------------------------------------------------------
    def latest_checkpoint(self, *, expected_layout: Layout | None = None,
                          expected_fingerprints: Mapping[str, str] | None = None) -> Checkpoint | None:
        """last.h5 of the highest fold that has one (folds run in order), or None."""
        dirs = sorted(self.path.glob("fold_*"), reverse=True)
        for d in dirs:
            if (d / LAST).is_file():
                return load_checkpoint(d / LAST, expected_layout=expected_layout,
                                       expected_fingerprints=expected_fingerprints)
        return None

    def resume_point(self, n_folds: int, *, expected_layout: Layout | None = None,
                     expected_fingerprints: Mapping[str, str] | None = None) -> ResumePoint | None:
        """Where to continue (module docstring); None: no epoch was recorded, start the run from the
        beginning. metrics.jsonl is cut back to the checkpoint's epoch either way."""
        ck = self.latest_checkpoint(expected_layout=expected_layout, expected_fingerprints=expected_fingerprints)
        if ck is None:
            self._truncate_metrics(None)
            return None
        fold, epoch, done = int(ck.meta["fold"]), int(ck.meta["epoch"]), bool(ck.meta["fold_done"])
        self._truncate_metrics((fold, epoch))
        if done:
            return ResumePoint(fold + 1, 0, ck, fold_boundary=True, run_done=fold + 1 >= n_folds)
        return ResumePoint(fold, epoch + 1, ck, fold_boundary=False, run_done=False)

    # ---- the end -----------------------------------------------------------------------------------
    def summarise(self, *, annualisation_days: int, chosen_by: str) -> dict[str, Any]:
        """summary.json from metrics.jsonl and each fold's chosen validation days (`chosen_by`: the BestEpoch
        rule); written atomically. The headline, `honest_sharpe_mean`, is the mean across folds of the chosen
        epochs' validation daily Sharpe; `in_sample_best_sharpe_mean` the same for the epoch each fold's
        validation days would have picked (in sample, reported beside it, never deployed)."""
        lines = self.read_metrics()
        folds: dict[int, list[dict[str, Any]]] = {}
        for ln in lines:
            folds.setdefault(int(ln["fold"]), []).append(ln)
        per_fold, best_days = [], []
        for k in sorted(folds):
            fl = folds[k]
            best = [ln for ln in fl if ln.get("best")]
            chosen = best[-1] if best else None
            kill = next((ln["kill"] for ln in fl if ln.get("kill")), None)
            peek = _in_sample_best(fl)
            per_fold.append({
                "fold": k, "epochs_run": len(fl), "best_epoch": chosen["epoch"] if chosen else None,
                "val": chosen["val"] if chosen else None, "baselines": chosen.get("baselines") if chosen else None,
                "kill": kill, "last_epoch": fl[-1]["epoch"], "last_val": fl[-1]["val"],
                "every_epoch_sharpe_mean": json_number(_mean_sharpe(fl)),
                "in_sample_best_epoch": peek["epoch"] if peek else None,
                "in_sample_best_val": peek["val"] if peek else None,
            })
            days = self.best_validation(k)
            if days is not None:
                best_days.append(days)
        summary = {
            "folds": per_fold,
            "across_folds": across_folds(best_days, annualisation_days=annualisation_days) if best_days else None,
            "honest_sharpe_mean": _fold_mean([f["val"] for f in per_fold]),
            "in_sample_best_sharpe_mean": _fold_mean([f["in_sample_best_val"] for f in per_fold]),
            "last_epoch_sharpe_mean": _fold_mean([f["last_val"] for f in per_fold]),
            "best_chosen_on": chosen_by,
            "note": f"each fold's checkpoint (best.h5, best_epoch, val) is chosen by {CHOSEN_BY[chosen_by]}, so "
                    "its validation figures are out of sample; honest_sharpe_mean is their mean daily Sharpe "
                    "across folds and across_folds chains their validation days. in_sample_best_* is the epoch "
                    "with the best validation daily Sharpe, chosen on the days that score it (in sample, never "
                    "deployed); last_epoch_sharpe_mean is each fold's last epoch; a fold's "
                    "every_epoch_sharpe_mean is the mean daily Sharpe of all its epochs",
        }
        atomic_write_text(self.path / SUMMARY, json.dumps(summary, indent=1, sort_keys=True, allow_nan=False) + "\n")
        return summary


def _in_sample_best(lines: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The fold's epoch with the best validation daily Sharpe among those no kill fired at (the first of ties;
    None when none has a finite one): what choosing on the validation days would have deployed."""
    ok = [ln for ln in lines if ln.get("kill") is None and ln["val"].get("sharpe_daily") is not None]
    return max(ok, key=lambda ln: ln["val"]["sharpe_daily"], default=None)


def _fold_mean(vals: Sequence[Mapping[str, Any] | None]) -> float | None:
    """Mean daily Sharpe over folds; None unless every fold has one (a missing fold would bias the mean)."""
    values = [(v or {}).get("sharpe_daily") for v in vals]
    return json_number(float(np.mean(values))) if values and None not in values else None


def _mean_sharpe(lines: Sequence[Mapping[str, Any]]) -> float:
    """Mean validation daily Sharpe over a fold's epochs (NaN when none has one)."""
    values = [ln["val"].get("sharpe_daily") for ln in lines]
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else math.nan
