"""Run `fox train` for several seeds (in parallel on one GPU or one after another) and tabulate the results.

    python3 tools/train_seeds.py --seeds 0 1 2 --out tools/results/train_default_h200 [--parallel 3]
        [--runs runs/seeds] [-- extra fox train arguments, e.g. --preset default --set learner.epochs=5]

Each seed runs `python -m fox_numba train --set run.seed=S --set run.name=seed_S --set run.out_dir=RUNS ...`,
its output kept in RUNS/seed_S.log. When all are done, OUT.md and OUT.json hold per seed the wall time and
per fold the best epoch's validation daily Sharpe beside the probe, buy-and-hold and the oracle (from each
run's summary.json, read by fox_numba/sweep/aggregate.py as `fox sweep` reads it), then the mean across folds
per seed and across seeds. Exit status 1 if any run failed. `fox sweep` runs seeds x configs on Ray, one trial
per GPU; this script keeps the parallel-on-one-GPU measurement of tools/results/train_default_h200.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from bench_device import machine, results_header  # noqa: E402

from fox_numba.io import atomic_write_text  # noqa: E402
from fox_numba.sweep.aggregate import fmt, fold_rows, mean  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, required=True, help="results path without suffix (.md and .json)")
    parser.add_argument("--runs", type=Path, default=Path("runs/seeds"), help="folder of the seeds' run folders")
    parser.add_argument("--parallel", type=int, default=1, help="runs at a time (they share the GPU)")
    args = parser.parse_args(own)
    args.runs.mkdir(parents=True, exist_ok=True)
    pending = list(args.seeds)
    running: dict[int, tuple[subprocess.Popen, float, Any]] = {}
    results: dict[int, dict[str, Any]] = {}
    start_all = time.perf_counter()
    while pending or running:
        while pending and len(running) < args.parallel:
            seed = pending.pop(0)
            cmd = [sys.executable, "-m", "fox_numba", "train", *extra, "--set", f"run.seed={seed}",
                   "--set", f'run.name="seed_{seed}"', "--set", f'run.out_dir="{args.runs}"']
            log = open(args.runs / f"seed_{seed}.log", "w", encoding="utf-8")  # noqa: SIM115 (closed below)
            running[seed] = (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT), time.perf_counter(),
                             log)
        time.sleep(1.0)
        for seed, (proc, t0, log) in list(running.items()):
            if proc.poll() is not None:
                log.close()
                summary_path = args.runs / f"seed_{seed}" / "summary.json"
                summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
                results[seed] = {"returncode": proc.returncode, "wall_s": time.perf_counter() - t0,
                                 "folds": fold_rows(summary)}
                del running[seed]
    wall_all = time.perf_counter() - start_all
    info = {"date_utc": datetime.now(UTC).strftime("%Y-%m-%d %H:%M"), **machine()}
    command = "python3 tools/train_seeds.py " + " ".join(argv)
    lines = results_header("fox train over seeds: validation daily Sharpe per fold against the baselines", command, info)
    lines += ["", f"{len(args.seeds)} seeds, {args.parallel} at a time on one GPU; all done in {wall_all:.0f} s wall "
              "(compilation included).", "",
              "The best epoch of each fold is chosen on that fold's validation days, so 'agent' is optimistic; "
              "metrics.jsonl in each run folder holds every epoch's figures, unselected.", ""]
    per_seed_means = []
    for seed in args.seeds:
        r = results[seed]
        rows = r["folds"]
        lines += [f"## seed {seed}: exit {r['returncode']}, {r['wall_s']:.0f} s wall", "",
                  "| fold | best epoch | agent | agent (bar) | return $ | active | probe | buy-and-hold | oracle | "
                  "agent / oracle | kill |", "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
        for row in rows:
            frac = row["agent"] / row["oracle"] if row["agent"] is not None and row["oracle"] else None
            lines.append(f"| {row['fold']} | {row['best_epoch']} | {fmt(row['agent'])} | {fmt(row['agent_bar'])} | "
                         f"{fmt(row['return'], ',.0f')} | {fmt(row['active'], '.2f')} | {fmt(row['probe'])} | "
                         f"{fmt(row['buy_and_hold'])} | {fmt(row['oracle'])} | {fmt(frac, '.2f')} | {row['kill'] or ''} |")
        m = {k: mean([row[k] for row in rows]) for k in ("agent", "probe", "buy_and_hold", "oracle")}
        per_seed_means.append(m)
        lines += [f"| mean | | {fmt(m['agent'])} | | | | {fmt(m['probe'])} | {fmt(m['buy_and_hold'])} | "
                  f"{fmt(m['oracle'])} | {fmt(m['agent'] / m['oracle'] if m['oracle'] else None, '.2f')} | |", ""]
    overall = {k: mean([m[k] for m in per_seed_means]) for k in ("agent", "probe", "buy_and_hold", "oracle")}
    lines += ["## across seeds (mean of the per-seed means across folds)", "",
              "| agent | probe | buy-and-hold | flat | oracle | agent / oracle |", "| ---: | ---: | ---: | ---: | ---: | ---: |",
              f"| {fmt(overall['agent'])} | {fmt(overall['probe'])} | {fmt(overall['buy_and_hold'])} | +0.00 | "
              f"{fmt(overall['oracle'])} | {fmt(overall['agent'] / overall['oracle'] if overall['oracle'] else None, '.2f')} |"]
    atomic_write_text(args.out.with_suffix(".md"), "\n".join(lines) + "\n")
    atomic_write_text(args.out.with_suffix(".json"), json.dumps(
        {"command": command, "machine": info, "wall_s": wall_all, "seeds": results, "across_seeds": overall}, indent=1))
    print("\n".join(lines))
    return 0 if all(r["returncode"] == 0 for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
