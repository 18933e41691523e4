"""TensorBoard event files of a run (run.tensorboard = true; the optional extra `pip install -e ".[tensorboard]"`).

metrics.jsonl and health_diag.log stay the source of truth: the events are derived from the same records, as
they are written, into RUN/tensorboard/ (`tensorboard --logdir runs/` shows every run). Tags, per fold k:

    fold_KK/val/<metric>          each epoch's validation figures (x: the epoch)
    fold_KK/select/<metric>       the selection days' figures, when the run holds days out (folds.select_days)
    fold_KK/baselines/<name>      flat, buy-and-hold, probe daily Sharpe and the oracle's, beside the agent's
    fold_KK/train/<stat>          the epoch's learner and environment figures (losses, q, gradient norm, ...)
    fold_KK/health/<field>        every numeric HEALTH_DIAG field (x: the fold's gradient step)

A resumed run (`fox train --resume`) rebuilds the folder from the records its metrics.jsonl and
health_diag.log kept (both are cut back to the checkpoint), so the events never hold an epoch twice.
"""

from __future__ import annotations

import importlib.util
import math
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from fox_numba.diag.layout import PREFIX, parse_line
from fox_numba.errors import ConfigError

EVENTS_DIR = "tensorboard"
HEALTH_SKIP = ("fold", "epoch", "step")
"""HEALTH_DIAG fields that place a record rather than measure something."""


def _numbers(prefix: str, value: Any) -> Iterator[tuple[str, float]]:
    """(tag, value) of every finite number under `value`, nested mappings joined with '/' (booleans and text
    are left out: they are not curves)."""
    if isinstance(value, Mapping):
        for key, inner in value.items():
            yield from _numbers(f"{prefix}/{key}", inner)
    elif isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        yield prefix, float(value)


def epoch_scalars(line: Mapping[str, Any]) -> list[tuple[str, float]]:
    """The tags and values of one metrics.jsonl line (module header)."""
    fold = f"fold_{int(line['fold']):02d}"
    out = list(_numbers(f"{fold}/val", line.get("val") or {}))
    out += _numbers(f"{fold}/select", line.get("select") or {})
    baselines = line.get("baselines") or {}
    for name, figures in baselines.items():
        if isinstance(figures, Mapping):
            out += _numbers(f"{fold}/baselines/{name}", {"sharpe_daily": figures.get("sharpe_daily")})
        else:
            out += _numbers(f"{fold}/baselines/{name}", figures)
    out += _numbers(f"{fold}/train", line.get("train") or {})
    return out


def health_scalars(record: Mapping[str, float | int]) -> list[tuple[str, float]]:
    """The tags and values of one parsed HEALTH_DIAG record (module header)."""
    fold = f"fold_{int(record['fold']):02d}"
    return [(tag, v) for name, value in record.items() if name not in HEALTH_SKIP
            for tag, v in _numbers(f"{fold}/health/{name}", value)]


def require_extra() -> None:
    """A ConfigError unless tensorboardX (the optional extra) can be imported: `fox train` checks before any work."""
    if importlib.util.find_spec("tensorboardX") is None:
        raise ConfigError("run.tensorboard needs the optional extra: pip install -e \".[tensorboard]\" (tensorboardX)")


class EventLog:
    """The run's event writer: `epoch(line)` after each metrics line, `health(line)` after each HEALTH_DIAG
    line, `close()` at the end."""

    def __init__(self, run: Path) -> None:
        require_extra()
        from tensorboardX import SummaryWriter

        folder = run / EVENTS_DIR
        shutil.rmtree(folder, ignore_errors=True)  # a resumed run rebuilds it from the kept records
        self._writer = SummaryWriter(logdir=str(folder))

    @classmethod
    def rebuilt(cls, run: Path, metrics: list[dict[str, Any]], health_log: Path) -> EventLog:
        """A fresh event folder holding the records a (resumed) run has kept so far."""
        log = cls(run)
        for line in metrics:
            log.epoch(line)
        if health_log.is_file():
            for text in health_log.read_text(encoding="utf-8").splitlines():
                if text.startswith(PREFIX):
                    log.health(text)
        return log

    def epoch(self, line: Mapping[str, Any]) -> None:
        for tag, value in epoch_scalars(line):
            self._writer.add_scalar(tag, value, global_step=int(line["epoch"]))
        self._writer.flush()

    def health(self, text: str) -> None:
        record = parse_line(text)
        for tag, value in health_scalars(record):
            self._writer.add_scalar(tag, value, global_step=int(record["step"]))

    def close(self) -> None:
        self._writer.close()
