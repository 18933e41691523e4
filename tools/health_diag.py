"""Read HEALTH_DIAG lines: turn a log into JSON lines, or aggregate several runs (seeds) per fold.

    python3 tools/health_diag.py parse runs/NAME/health_diag.log [--out diag.jsonl]
    python3 tools/health_diag.py aggregate runs/seed0 runs/seed1 runs/seed2 [--stat last|mean] [--json]

`parse` writes one JSON object per HEALTH_DIAG line (fields in layout order; other lines are skipped).
`aggregate` reads `health_diag.log` of every run folder given, reduces each run's lines per fold to one
value per field (`last`: the fold's final snapshot, the default, right for EMAs and counters; `mean`: the
mean over the fold's snapshots), then prints per fold and field the mean, standard deviation (ddof 0),
minimum and maximum across runs. A line of another layout stops with its file and line number.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fox_numba.diag.layout import FIELDS, PREFIX, ParseError, parse_line  # noqa: E402

LOG_NAME = "health_diag.log"


def read_log(path: Path) -> list[dict[str, float | int]]:
    """Every HEALTH_DIAG line of `path`, parsed; an unparsable one raises naming file and line."""
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


def aggregate(runs: list[Path], stat: str) -> dict[int, dict[str, dict[str, float]]]:
    """{fold: {field: {mean, std, min, max, n}}} across the runs that reached the fold."""
    reduced = [per_fold(read_log(run / LOG_NAME if run.is_dir() else run), stat) for run in runs]
    folds = sorted({fold for r in reduced for fold in r})
    out: dict[int, dict[str, dict[str, float]]] = {}
    for fold in folds:
        present = [r[fold] for r in reduced if fold in r]
        out[fold] = {}
        for f in FIELDS:
            values = [p[f.name] for p in present]
            mean = math.fsum(values) / len(values)
            std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / len(values))
            out[fold][f.name] = {"mean": mean, "std": std, "min": min(values), "max": max(values), "n": len(values)}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("parse", help="HEALTH_DIAG lines of a log as JSON lines")
    p.add_argument("log", type=Path)
    p.add_argument("--out", type=Path, help="file to write (default: stdout)")
    a = sub.add_parser("aggregate", help="mean and spread per field per fold across runs")
    a.add_argument("runs", type=Path, nargs="+", help="run folders (or health_diag.log files)")
    a.add_argument("--stat", choices=("last", "mean"), default="last")
    a.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    try:
        if args.command == "parse":
            text = "".join(json.dumps(row) + "\n" for row in read_log(args.log))
            if args.out:
                args.out.write_text(text, encoding="utf-8")
            else:
                sys.stdout.write(text)
            return 0
        result = aggregate(args.runs, args.stat)
    except (OSError, ParseError) as e:
        print(f"health_diag: error: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    for fold, fields in result.items():
        print(f"fold {fold} ({next(iter(fields.values()))['n']} runs)")
        print(f"  {'field':<24} {'mean':>14} {'std':>12} {'min':>14} {'max':>14}")
        for name, s in fields.items():
            print(f"  {name:<24} {s['mean']:>14.6g} {s['std']:>12.4g} {s['min']:>14.6g} {s['max']:>14.6g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
