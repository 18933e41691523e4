"""Configs against a baseline on the market suite, paired by seed: one markdown table from tools/suite.py JSONs.

    python3 tools/suite_compare.py [--by-fold] tools/results/suite_default_h200.json \
        NAME=tools/results/suite_X.json [...]
    python3 tools/suite_compare.py BASE_0_4.json,BASE_5_9.json NAME=X_0_4.json,X_5_9.json   # ten seeds

Per market (and pooled over the seen and over the held-out markets, a seed's pooled figure being its mean over
the group's markets; where a config ran only some of the baseline's markets (tools/suite.py --markets), every
column pools the markets all of them ran, and the row says how many of the group's that is): the baseline's honest
mean, then for each config its mean and its difference from the
baseline paired by seed, with the standard error of that difference. Pairing by seed removes what the seed
does to both runs alike (the same collect streams and initial weights), so the paired standard error is the
one that says whether a config differs; a difference inside two of them is noise. --by-fold gives a row per market
and fold instead (each fold's honest checkpoint, the runs' `folds` entries), no pooled rows: where a config's
difference comes from.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any


def per_seed(suite: dict[str, Any], pools: dict[str, list[str]]) -> dict[str, dict[int, float]]:
    """{market: {seed: honest}} of the runs that finished with a figure, then a pooled row per `pools` entry
    ({row name: its markets}, which the suite must all have)."""
    table: dict[str, dict[int, float]] = {}
    for market, entry in suite["markets"].items():
        table[market] = {int(s): r["honest"] for s, r in entry["runs"].items()
                         if r.get("honest") is not None and math.isfinite(r["honest"])}  # fmt: skip
    for row, markets in pools.items():
        seeds = set.intersection(*(set(table[m]) for m in markets))
        table[row] = {s: statistics.mean(table[m][s] for m in markets) for s in sorted(seeds)}
    return table


def common_pools(base: dict[str, Any], others: list[dict[str, Any]]) -> dict[str, list[str]]:
    """{row name: markets} of the baseline's pooled groups, each cut to the markets every config ran too, so that
    all columns of a pooled row average the same markets; a cut group's name says how many of its markets it
    keeps, and a group none of whose markets every config ran has no row."""
    pools: dict[str, list[str]] = {}
    for role, pooled in base["pooled"].items():
        markets = [m for m in pooled["markets"] if all(m in other["markets"] for other in others)]
        name = f"{role.replace('_', ' ')}, pooled"
        if markets and len(markets) < len(pooled["markets"]):
            name += f" ({len(markets)} of {len(pooled['markets'])} markets)"
        if markets:
            pools[name] = markets
    return pools


def per_seed_fold(suite: dict[str, Any]) -> dict[str, dict[int, float]]:
    """{"MARKET fold K": {seed: that fold's honest figure}} of the runs' fold rows with a finite figure, in the
    suite's market order, then by fold."""
    table: dict[str, dict[int, float]] = {}
    for market, entry in suite["markets"].items():
        folds: dict[int, dict[int, float]] = {}
        for s, run in entry["runs"].items():
            for row in run.get("folds") or []:
                value = row.get("agent")
                if value is not None and math.isfinite(value):
                    folds.setdefault(int(row["fold"]), {})[int(s)] = value
        table |= {f"{market} fold {k}": folds[k] for k in sorted(folds)}
    return table


def paired(base: dict[int, float], other: dict[int, float]) -> str:
    seeds = sorted(set(base) & set(other))
    if len(seeds) < 2:
        return "n/a"
    diff = [other[s] - base[s] for s in seeds]
    return f"{statistics.mean(diff):+.2f} ({statistics.stdev(diff) / math.sqrt(len(diff)):.2f})"


def mean(values: dict[int, float]) -> str:
    return f"{statistics.mean(values.values()):+.2f}" if values else "n/a"


def merge(suites: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    """One suite of several draws of the same config (for instance seeds 0-4 and seeds 5-9), their runs side by
    side per market; the suites must have the same markets, and a seed in two of them the same figures there."""
    merged = json.loads(json.dumps(suites[0]))
    for suite, name in zip(suites[1:], names[1:], strict=True):
        if set(suite["markets"]) != set(merged["markets"]):
            raise ValueError(f"{name}: markets {sorted(suite['markets'])} differ from {names[0]}'s "
                             f"{sorted(merged['markets'])}")
        for market, entry in suite["markets"].items():
            runs = merged["markets"][market]["runs"]
            for seed, run in entry["runs"].items():
                if seed in runs and runs[seed].get("honest") != run.get("honest"):
                    raise ValueError(f"{name}: market {market} seed {seed} differs from an earlier file's run")
                runs[seed] = run
    return merged


def load(spec: str) -> dict[str, Any]:
    """A suite JSON, or several joined by commas merged into one (`merge`)."""
    paths = spec.split(",")
    return merge([json.loads(Path(p).read_text()) for p in paths], paths)


def compare(base: dict[str, Any], others: list[tuple[str, dict[str, Any]]], by_fold: bool = False) -> str:
    """The markdown table (module docstring)."""
    if by_fold:
        b, tables = per_seed_fold(base), [(name, per_seed_fold(s)) for name, s in others]
    else:
        pools = common_pools(base, [s for _, s in others])
        b, tables = per_seed(base, pools), [(name, per_seed(s, pools)) for name, s in others]
    roles = {m: e.get("role", "") for m, e in base["markets"].items()}
    roles |= {row: roles[row.rsplit(" fold ", 1)[0]] for row in b if " fold " in row}
    head = "| market | role | baseline | " + " | ".join(f"{n} | paired" for n, _ in tables) + " |"
    rows = [head, "| --- | --- | ---: | " + " | ".join("---: | ---:" for _ in tables) + " |"]
    for market in b:
        cells = [f"{mean(t.get(market, {}))} | {paired(b[market], t.get(market, {}))}" for _, t in tables]
        rows.append(f"| {market} | {roles.get(market, '').replace('_', ' ')} | {mean(b[market])} | "
                    + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--by-fold", action="store_true", help="a row per market and fold (module docstring)")
    parser.add_argument("baseline", help="the baseline's tools/suite.py JSON (several, comma-separated: one suite "
                        "of their runs, e.g. seeds 0-4 and 5-9)")
    parser.add_argument("configs", nargs="+", help="NAME=PATH of each config's tools/suite.py JSON (PATH as the "
                        "baseline's)")
    args = parser.parse_args(argv)
    others = []
    for item in args.configs:
        name, sep, path = item.partition("=")
        if not sep:
            parser.error(f"expected NAME=PATH, got {item!r}")
        others.append((name, path))
    try:
        base, others = load(args.baseline), [(name, load(path)) for name, path in others]
    except (OSError, ValueError) as exc:
        parser.error(str(exc))
    print(compare(base, others, args.by_fold), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
