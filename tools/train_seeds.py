"""Run `fox train` for several seeds (in parallel on one GPU or one after another) and tabulate the results.

    python3 tools/train_seeds.py --seeds 0 1 2 --out tools/results/train_default_h200 [--parallel 3]
        [--runs runs/seeds] [--mps] [-- extra fox train arguments, e.g. --preset default --set learner.epochs=5]

Each seed runs `python -m fox_numba train --set run.seed=S --set run.name=seed_S --set run.out_dir=RUNS ...`,
its output kept in RUNS/seed_S.log. When all are done, OUT.md and OUT.json hold per seed the wall time and
per fold the best epoch's validation daily Sharpe beside the probe, buy-and-hold and the oracle (from each
run's summary.json, read by fox_numba/sweep/aggregate.py as `fox sweep` reads it), then the mean across folds
per seed and across seeds, beside the last epoch's and the every-epoch mean (chosen by nothing). The note
says which days chose the best epoch: the validation days themselves (in sample) or, with
folds.select_days > 0, the held-out selection days. Exit status 1 if any run failed.

    python3 tools/train_seeds.py --tabulate OUT.json --runs RUNS --out OUT

rewrites OUT.md and OUT.json from the run folders in RUNS and the command, machine and wall times recorded
in OUT.json (after the summary gained a field, or on run folders copied back from a GPU machine).

`fox sweep` runs seeds x configs on Ray; this script keeps the parallel-on-one-GPU measurement of
tools/results/train_default_h200.md. With --mps (here, in tools/suite.py and tools/bench_runs.py) the runs start
under a private CUDA MPS daemon (fox_numba/device/mps.py), so their kernels share the GPU at once.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Hashable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from bench_device import machine, results_header  # noqa: E402

from fox_numba.device.mps import mps_for_children, mps_problem  # noqa: E402
from fox_numba.io import atomic_write_text  # noqa: E402
from fox_numba.sweep.aggregate import fmt, fold_rows, mean  # noqa: E402

MPS_HELP = ("run the runs under a private CUDA MPS daemon (fox_numba/device/mps.py), so that their kernels share the "
            "GPU at once instead of taking turns; needs nvidia-cuda-mps-control")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, required=True, help="results path without suffix (.md and .json)")
    parser.add_argument("--runs", type=Path, default=Path("runs/seeds"), help="folder of the seeds' run folders")
    parser.add_argument("--parallel", type=int, default=1, help="runs at a time (they share the GPU)")
    parser.add_argument("--tabulate", type=Path, help="an earlier OUT.json: re-tabulate its runs, train nothing")
    parser.add_argument("--mps", action="store_true", help=MPS_HELP)
    args = parser.parse_args(own)
    if args.mps and (problem := mps_problem()) is not None:
        parser.error(problem)
    if args.tabulate is not None:
        old = json.loads(args.tabulate.read_text(encoding="utf-8"))
        seeds = sorted(int(k) for k in old["seeds"])
        results = {seed: {**old["seeds"][str(seed)], **run_figures(args.runs, seed)} for seed in seeds}
        parallel = int(old.get("parallel", len(seeds)))
        return write_tables(args.out, seeds, parallel, results, old["command"], old["machine"], old["wall_s"])
    args.runs.mkdir(parents=True, exist_ok=True)
    start_all = time.perf_counter()
    with mps_for_children(args.mps):
        done = run_jobs([Job(seed, train_command(extra, seed, args.runs), args.runs / f"seed_{seed}.log")
                         for seed in args.seeds], args.parallel)
    results = {seed: {**done[seed], **run_figures(args.runs, seed)} for seed in args.seeds}
    wall_all = time.perf_counter() - start_all
    info = {"date_utc": datetime.now(UTC).strftime("%Y-%m-%d %H:%M"), **machine()}
    command = "python3 tools/train_seeds.py " + " ".join(argv)
    return write_tables(args.out, args.seeds, args.parallel, results, command, info, wall_all)


class Job(NamedTuple):
    """One subprocess of `run_jobs`: its key in the results, its command and the file for its output."""

    key: Hashable
    cmd: list[str]
    log: Path


def run_jobs(jobs: Sequence[Job], parallel: int, poll_s: float = 1.0) -> dict[Hashable, dict[str, Any]]:
    """Run the jobs in order from the repository root, at most `parallel` at a time (they share the GPU), each
    with stdout and stderr in its log; {key: {returncode, wall_s}} once all have ended, and for a job that failed
    `error`, its log's last line (the exception, as a rule), so the tables say why without the log at hand."""
    pending = list(jobs)
    running: dict[Hashable, tuple[subprocess.Popen, float, IO[str]]] = {}
    done: dict[Hashable, dict[str, Any]] = {}
    while pending or running:
        while pending and len(running) < parallel:
            job = pending.pop(0)
            job.log.parent.mkdir(parents=True, exist_ok=True)
            log = open(job.log, "w", encoding="utf-8")  # noqa: SIM115 (closed when the job ends)
            proc = subprocess.Popen(job.cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
            running[job.key] = (proc, time.perf_counter(), log)
        time.sleep(poll_s)
        for key, (proc, t0, log) in list(running.items()):
            if proc.poll() is not None:
                log.close()
                done[key] = {"returncode": proc.returncode, "wall_s": time.perf_counter() - t0}
                if proc.returncode != 0:
                    done[key]["error"] = last_line(log.name)
                del running[key]
    return done


def last_line(path: str | Path, width: int = 200) -> str:
    """The last non-blank line of a text file, at most `width` characters ('' when it has none)."""
    lines = [line.strip() for line in Path(path).read_text(encoding="utf-8", errors="replace").splitlines()]
    return next((line[:width] for line in reversed(lines) if line), "")


def train_command(args: Sequence[str], seed: int, runs: Path) -> list[str]:
    """`fox train` with `args`, then the run's seed, its name seed_S and RUNS as its out_dir (these win)."""
    return [sys.executable, "-m", "fox_numba", "train", *args, "--set", f"run.seed={seed}",
            "--set", f'run.name="seed_{seed}"', "--set", f'run.out_dir="{runs}"']


def run_figures(runs: Path, seed: int) -> dict[str, Any]:
    """{chosen_on, folds} of the seed's summary.json (no folds when the run wrote none)."""
    path = runs / f"seed_{seed}" / "summary.json"
    summary = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    return {"chosen_on": summary.get("best_chosen_on", "validation"), "folds": fold_rows(summary)}


def write_tables(out: Path, seeds: list[int], parallel: int, results: dict[int, dict[str, Any]], command: str,
                 info: dict[str, Any], wall_all: float) -> int:
    """OUT.md and OUT.json from the per-seed results; prints the tables; 1 if any run failed."""
    title = "fox train over seeds: validation daily Sharpe per fold against the baselines"
    lines = results_header(title, command, info)
    on_selection = all(r.get("chosen_on") == "selection" for r in results.values())
    lines += ["", f"{len(seeds)} seeds, {parallel} at a time on one GPU; all done in {wall_all:.0f} s wall "
              "(compilation included).", "",
              ("Each fold's checkpoint is chosen on the selection days held out of its training window "
               "(folds.select_days), so 'agent' is out of sample."
               if on_selection else
               "Each fold's checkpoint is its last epoch (the kill criteria passing), so 'agent' is out of sample."),
              "'in sample' is the epoch with the best validation Sharpe, chosen on the days that score it (never "
              "deployed); 'last' is the fold's last epoch and 'every' the mean over all its epochs; metrics.jsonl in "
              "each run folder holds every epoch's figures.", ""]
    keys = ("agent", "in_sample", "last", "every", "probe", "buy_and_hold", "oracle")
    per_seed_means = []
    for seed in seeds:
        r = results[seed]
        rows = r["folds"]
        lines += [f"## seed {seed}: exit {r['returncode']}, {r['wall_s']:.0f} s wall", "",
                  "| fold | chosen epoch | agent | agent (bar) | return $ | active | in sample | last | every | "
                  "probe | buy-and-hold | oracle | agent / oracle | kill |",
                  "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
        for row in rows:
            frac = row["agent"] / row["oracle"] if row["agent"] is not None and row["oracle"] else None
            lines.append(f"| {row['fold']} | {row['best_epoch']} | {fmt(row['agent'])} | {fmt(row['agent_bar'])} | "
                         f"{fmt(row['return'], ',.0f')} | {fmt(row['active'], '.2f')} | {fmt(row.get('in_sample'))} | "
                         f"{fmt(row['last'])} | "
                         f"{fmt(row['every'])} | {fmt(row['probe'])} | {fmt(row['buy_and_hold'])} | "
                         f"{fmt(row['oracle'])} | {fmt(frac, '.2f')} | {row['kill'] or ''} |")
        m = {k: mean([row[k] for row in rows]) for k in keys}
        per_seed_means.append(m)
        lines += [f"| mean | | {fmt(m['agent'])} | | | | {fmt(m['in_sample'])} | {fmt(m['last'])} | "
                  f"{fmt(m['every'])} | {fmt(m['probe'])} | "
                  f"{fmt(m['buy_and_hold'])} | {fmt(m['oracle'])} | "
                  f"{fmt(m['agent'] / m['oracle'] if m['oracle'] else None, '.2f')} | |", ""]
    overall = {k: mean([m[k] for m in per_seed_means]) for k in keys}
    lines += ["## across seeds (mean of the per-seed means across folds)", "",
              "| agent | in sample | last | every | probe | buy-and-hold | flat | oracle | agent / oracle |",
              "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
              f"| {fmt(overall['agent'])} | {fmt(overall['in_sample'])} | {fmt(overall['last'])} | "
              f"{fmt(overall['every'])} | "
              f"{fmt(overall['probe'])} | {fmt(overall['buy_and_hold'])} | +0.00 | {fmt(overall['oracle'])} | "
              f"{fmt(overall['agent'] / overall['oracle'] if overall['oracle'] else None, '.2f')} |"]
    atomic_write_text(out.with_suffix(".md"), "\n".join(lines) + "\n")
    atomic_write_text(out.with_suffix(".json"), json.dumps(
        {"command": command, "machine": info, "wall_s": wall_all, "parallel": parallel,
         "seeds": {str(k): v for k, v in results.items()}, "across_seeds": overall}, indent=1))
    print("\n".join(lines))
    return 0 if all(r["returncode"] == 0 for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
