"""Read HEALTH_DIAG lines: turn a log into JSON lines, or aggregate several runs (seeds) per fold.

    python3 tools/health_diag.py parse runs/NAME/health_diag.log [--out diag.jsonl]
    python3 tools/health_diag.py aggregate runs/seed0 runs/seed1 runs/seed2 [--stat last|mean] [--json]

`parse` writes one JSON object per HEALTH_DIAG line (fields in layout order; other lines are skipped).
`aggregate` reads `health_diag.log` of every run folder given and prints per fold and field the mean,
standard deviation, minimum and maximum across runs (fox_numba/diag/aggregate.py: `--stat last`, the
default, takes each fold's final snapshot; `mean` the mean over its snapshots). A line of another layout
stops with its file and line number.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fox_numba.diag.aggregate import STATS, aggregate, read_log  # noqa: E402
from fox_numba.diag.layout import ParseError  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("parse", help="HEALTH_DIAG lines of a log as JSON lines")
    p.add_argument("log", type=Path)
    p.add_argument("--out", type=Path, help="file to write (default: stdout)")
    a = sub.add_parser("aggregate", help="mean and spread per field per fold across runs")
    a.add_argument("runs", type=Path, nargs="+", help="run folders (or health_diag.log files)")
    a.add_argument("--stat", choices=STATS, default="last")
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
