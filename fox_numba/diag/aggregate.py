"""HEALTH_DIAG across runs: read a run's log, reduce it per fold, and aggregate several runs (seeds).

Each run's lines are reduced per fold to one value per field (`last`: the fold's final snapshot, right
for EMAs and counters; `mean`: the mean over the fold's snapshots); then, per fold and field, the mean,
standard deviation (ddof 0), minimum and maximum across the runs that reached the fold. Used by
`tools/health_diag.py aggregate` and by `fox sweep` (across the seeds of a config).
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

from fox_numba.diag.layout import FIELDS, PREFIX, ParseError, parse_line

HEALTH_LOG = "health_diag.log"
"""The HEALTH_DIAG log of a run folder: one line per snapshot (walkforward/driver.py writes it)."""
STATS = ("last", "mean")

Stats = dict[str, float]
"""{mean, std, min, max, n} of one field across runs."""


def spread(values: list[float]) -> Stats:
    """{mean, std (ddof 0), min, max, n} of a non-empty list (NaN values propagate into mean and std)."""
    mean = math.fsum(values) / len(values)
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / len(values))
    return {"mean": mean, "std": std, "min": min(values), "max": max(values), "n": len(values)}


def read_log(path: Path) -> list[dict[str, float | int]]:
    """Every HEALTH_DIAG line of `path`, parsed; an unparsable one raises ParseError naming file and line."""
    out = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.startswith(PREFIX):
                continue
            try:
                out.append(parse_line(line))
            except ParseError as e:
                raise ParseError(f"{path}:{number}: {e}") from None
    return out


def per_fold(rows: list[dict[str, float | int]], stat: str) -> dict[int, dict[str, float]]:
    """{fold: {field: value}} of one run, by `stat` ('last' or 'mean') over the fold's snapshots."""
    if stat not in STATS:
        raise ValueError(f"stat must be one of {', '.join(STATS)}, got {stat!r}")
    folds: dict[int, list[dict[str, float | int]]] = defaultdict(list)
    for row in rows:
        folds[int(row["fold"])].append(row)
    out = {}
    for fold, snaps in sorted(folds.items()):
        if stat == "last":
            out[fold] = {k: float(v) for k, v in snaps[-1].items()}
        else:
            out[fold] = {f.name: math.fsum(float(s[f.name]) for s in snaps) / len(snaps) for f in FIELDS}
    return out


def aggregate(runs: list[Path], stat: str = "last") -> dict[int, dict[str, Stats]]:
    """{fold: {field: {mean, std, min, max, n}}} across the runs (run folders or log files) that reached the
    fold."""
    reduced = [per_fold(read_log(run / HEALTH_LOG if run.is_dir() else run), stat) for run in runs]
    folds = sorted({fold for r in reduced for fold in r})
    out: dict[int, dict[str, Stats]] = {}
    for fold in folds:
        present = [r[fold] for r in reduced if fold in r]
        out[fold] = {f.name: spread([p[f.name] for p in present]) for f in FIELDS}
    return out
