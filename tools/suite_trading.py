"""How the agent trades beside the probe, per market and fold, from a suite's run folders: one markdown table.

    python3 tools/suite_trading.py --runs RUNS --out tools/results/suite_trading_NAME [--markets default,high_cost]

RUNS is a folder of RUNS/MARKET/seed_S/summary.json (tools/suite.py's --runs) or a runs archive that tools/suite.py
--pack wrote (tools/results/runs_suite_*.tgz), read as it is. Per market and fold, the mean over the seeds (and its
standard error) of each fold's chosen checkpoint's validation figures against the probe's on the same days
(summary.json's `val` and `baselines.probe`): daily Sharpe, trades, bars in the market (active fraction), hit rate of
the round trips, and the mean and standard deviation of the daily P&L. Why: a Sharpe below the probe's says only that
the agent trails; these say whether it trades too often or too rarely, is in the market too much or too little, or
picks its side worse. Writes OUT.md and OUT.json.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tarfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fox_numba.io import atomic_write_text  # noqa: E402

FIELDS = ("sharpe_daily", "trades", "active_fraction", "hit_rate", "mean_daily_pnl", "std_daily_pnl")
"""The validation figures compared, in the table's order (walkforward/metrics.py names)."""


def summaries(runs: Path) -> dict[str, list[dict[str, Any]]]:
    """{market: [summary.json of each seed, in seed folder order]} of a runs folder or of a packed runs archive (its
    members TOP/MARKET/seed_S/summary.json)."""
    found: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    if runs.is_dir():
        for path in runs.glob("*/seed_*/summary.json"):
            found.setdefault(path.parent.parent.name, []).append(
                (path.parent.name, json.loads(path.read_text(encoding="utf-8"))))
    else:
        with tarfile.open(runs, "r:*") as tar:
            for member in tar.getmembers():
                parts = member.name.split("/")
                if member.isfile() and len(parts) == 4 and parts[2].startswith("seed_") and parts[3] == "summary.json":
                    data = tar.extractfile(member).read()  # type: ignore[union-attr] (a file member)
                    found.setdefault(parts[1], []).append((parts[2], json.loads(data.decode("utf-8"))))
    return {market: [summary for _, summary in sorted(seeds, key=lambda x: x[0])] for market, seeds in found.items()}


def fold_figures(seeds: list[dict[str, Any]]) -> dict[int, dict[str, dict[str, list[float]]]]:
    """{fold: {"agent" | "probe": {field: [one value per seed]}}} of one market's summaries (finite values)."""
    out: dict[int, dict[str, dict[str, list[float]]]] = {}
    for summary in seeds:
        for fold in summary.get("folds", []):
            sides = {"agent": fold.get("val") or {}, "probe": (fold.get("baselines") or {}).get("probe") or {}}
            entry = out.setdefault(int(fold["fold"]), {side: {f: [] for f in FIELDS} for side in sides})
            for side, figures in sides.items():
                for field in FIELDS:
                    value = figures.get(field)
                    if value is not None and math.isfinite(value):
                        entry[side][field].append(float(value))
    return out


def mean_se(values: list[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None
    return statistics.mean(values), se


def cell(values: list[float], digits: int) -> str:
    m, se = mean_se(values)
    if m is None:
        return "n/a"
    return f"{m:.{digits}f}" + ("" if se is None else f" ({se:.{digits}f})")


def table(runs: dict[str, list[dict[str, Any]]], markets: list[str]) -> tuple[str, dict[str, Any]]:
    """The markdown table and its numbers ({market: {fold: {side: {field: [mean, se, n]}}}})."""
    digits = {"sharpe_daily": 2, "trades": 0, "active_fraction": 2, "hit_rate": 2, "mean_daily_pnl": 0,
              "std_daily_pnl": 0}
    head = "| market | fold | seeds | " + " | ".join(f"{f}: agent | probe" for f in FIELDS) + " |"
    rows = [head, "| --- | ---: | ---: | " + " | ".join("---: | ---:" for _ in FIELDS) + " |"]
    numbers: dict[str, Any] = {}
    for market in markets:
        for fold, sides in sorted(fold_figures(runs[market]).items()):
            n = len(sides["agent"]["sharpe_daily"])
            rows.append(f"| {market} | {fold} | {n} | " + " | ".join(
                f"{cell(sides['agent'][f], digits[f])} | {cell(sides['probe'][f], digits[f])}" for f in FIELDS) + " |")
            numbers.setdefault(market, {})[str(fold)] = {
                side: {f: [*mean_se(v), len(v)] for f, v in figures.items()} for side, figures in sides.items()}
    return "\n".join(rows) + "\n", numbers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, required=True,
                        help="folder of RUNS/MARKET/seed_S/summary.json, or a runs archive of tools/suite.py --pack")
    parser.add_argument("--out", type=Path, required=True, help="results path without suffix (.md and .json)")
    parser.add_argument("--markets", help="comma-separated markets (default: every folder under --runs)")
    args = parser.parse_args(argv)
    if not args.runs.exists():
        parser.error(f"--runs {args.runs}: no such folder or archive")
    try:
        runs = summaries(args.runs)
    except (tarfile.TarError, OSError, ValueError) as e:
        parser.error(f"--runs {args.runs}: not a runs folder or a readable runs archive ({e})")
    markets = args.markets.split(",") if args.markets else sorted(runs)
    missing = [m for m in markets if m not in runs]
    if missing or not markets:
        parser.error(f"--runs {args.runs}: no seed_*/summary.json for {', '.join(missing) or 'any market'}")
    text, numbers = table(runs, markets)
    command = "python3 tools/suite_trading.py " + " ".join(argv if argv is not None else sys.argv[1:])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out.with_name(args.out.name + ".md"),
                      f"# The agent's trading beside the probe's, per market and fold\n\nCommand: `{command}`\n\nMean "
                      "over the seeds (standard error) of each fold's chosen checkpoint's validation figures and the "
                      "probe's on the same days.\n\n" + text)
    atomic_write_text(args.out.with_name(args.out.name + ".json"),
                      json.dumps({"command": command, "markets": numbers}, indent=1))
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
