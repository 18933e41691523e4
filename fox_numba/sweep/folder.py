"""The sweep folder: what `fox sweep` writes, and what a rerun reads to skip finished trials.

    sweeps/<name>/
      sweep.json            the trials (id, config, seed, grid values, `fox train` arguments); a rerun must match
      runs/<trial>/         each trial's run folder, exactly as `fox train` writes it
      logs/<trial>.out      the trial's stdout (epoch lines, HEALTH_DIAG), appended per attempt
      logs/<trial>.err      its stderr, appended per attempt
      trials/<trial>.json   the trial's latest outcome: exit code, error (tail of stderr), attempts, wall seconds
      summary.json          the aggregate (sweep/aggregate.py)

A trial is finished when its run folder holds summary.json (`fox train` writes it last); a rerun skips it.
Any other trial whose run folder holds config.toml was interrupted and continues with `fox train --resume`.
Every file here is written atomically (fox_numba/io.py); the trials' run folders are locked by their `fox
train`, so two sweeps on one folder cannot run a trial twice at once.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fox_numba.errors import ConfigError, InputError
from fox_numba.io import atomic_write_text
from fox_numba.walkforward.run_folder import SUMMARY

IDENTITY, SWEEP_SUMMARY = "sweep.json", "summary.json"
RUNS, LOGS, TRIALS = "runs", "logs", "trials"
DEFAULT_ROOT = "sweeps"


@dataclass(frozen=True)
class TrialRecord:
    """A trial's outcome as the sweep last saw it (trials/<id>.json)."""

    returncode: int | None
    """Exit status of the latest attempt (negative: killed by that signal; None: the Ray task itself failed)."""
    error: str | None
    """Tail of the latest failed attempt's stderr (None when it succeeded)."""
    attempts: int
    wall_s: float
    """Wall seconds of every attempt together."""


class SweepFolder:
    """Paths of one sweep folder (module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path.resolve()

    def run_dir(self, trial: str) -> Path:
        return self.path / RUNS / trial

    def logs(self, trial: str) -> tuple[Path, Path]:
        return self.path / LOGS / f"{trial}.out", self.path / LOGS / f"{trial}.err"

    def finished(self, trial: str) -> bool:
        return (self.run_dir(trial) / SUMMARY).is_file()

    def claim(self, identity: dict[str, Any]) -> None:
        """Write sweep.json, or check that the one there describes the same trials: a folder holds one sweep."""
        path = self.path / IDENTITY
        if path.is_file():
            stored = self._read_json(path)
            if stored != identity:
                ids = {t["id"]: t for t in stored.get("trials", [])}
                diff = next((t["id"] for t in identity["trials"] if ids.get(t["id"]) != t), "the list of trials")
                raise ConfigError(f"{path}: this folder holds another sweep (differs at {diff}): rerun it with its "
                                  "own spec and options, or choose another --out / --name")
            return
        atomic_write_text(path, json.dumps(identity, indent=1, sort_keys=True) + "\n")

    def record(self, trial: str) -> TrialRecord | None:
        path = self.path / TRIALS / f"{trial}.json"
        if not path.is_file():
            return None
        data = self._read_json(path)
        try:
            return TrialRecord(**data)
        except TypeError:
            raise InputError(path, f"not a trial record (fields: {', '.join(sorted(data))})") from None

    def save_record(self, trial: str, record: TrialRecord) -> None:
        atomic_write_text(self.path / TRIALS / f"{trial}.json", json.dumps(asdict(record), indent=1) + "\n")

    def save_summary(self, summary: dict[str, Any]) -> Path:
        return atomic_write_text(self.path / SWEEP_SUMMARY,
                                 json.dumps(summary, indent=1, sort_keys=True, allow_nan=False) + "\n")

    @staticmethod
    def _read_json(path: Path) -> Any:
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except ValueError as e:
            raise InputError(path, f"not JSON ({e})") from None
