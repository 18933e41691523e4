"""N `fox train` runs sharing one GPU against one run alone (issue 26 item 3: N runs in at most 1.5 x one's wall).

    python3 tools/bench_runs.py --runs 8 --out tools/results/many_runs_NAME [--folder runs/bench_runs]
        [--no-warmup] [--mps] [-- extra fox train arguments, e.g. --preset default --set learner.epochs=5]

In order, each a `python -m fox_numba train` with the extra arguments and `run.seed`, `run.name` and `run.out_dir`
set by the tool (tools/train_seeds.py's command):
1. a warm-up run (seed 0), unless --no-warmup: it fills the kernel cache (fox_numba/device/kernel_cache.py) and
   numba's CPU cache, so that what follows measures runs as a user's second command meets them;
2. seed 0 alone;
3. seeds 0 .. N-1 all at once.
The wall times are measured around each process (Python's start included). OUT.md and OUT.json hold the three
walls, N at once over one alone, each run's own `done in` figure and exit status, the mean seconds of its epochs'
phases (its console lines "seconds: collect C train T evaluate E epoch P"; the first epoch of a run apart, since it
loads the kernels and captures the graphs), where a run's time goes (the walls less `done in`: Python's start and
imports; its folds' set-up, each fold line's "set up in": the fold's tensors, state resets and baselines; its epochs;
the rest of `done in`: the store, the features, the report), and whether seed 0 alone and seed 0 among the N wrote
the same summary.json (they must: the same seed gives the same numbers however many runs share the GPU). Exit
status 1 if a run failed or the two summaries differ.

--threads-per-run K sets the CPU threads of every run's numerical libraries (OpenBLAS, OpenMP, MKL and numba's
CPU pool: THREAD_VARIABLES) to K, for every phase. Without it a run keeps fox_numba's own default (host_threads.py:
one BLAS thread unless set), or what the caller's environment sets.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from bench_device import machine, results_header  # noqa: E402
from train_seeds import MPS_HELP, Job, run_jobs, train_command  # noqa: E402

from fox_numba.device.mps import mps_for_children, mps_problem  # noqa: E402
from fox_numba.host_threads import THREAD_VARIABLES as HOST_THREAD_VARIABLES  # noqa: E402
from fox_numba.io import atomic_write_text  # noqa: E402
from fox_numba.walkforward.driver import SETUP_PARTS  # noqa: E402

PHASES = ("collect", "train", "evaluate", "epoch")
EPOCH_LINE = re.compile(r"seconds: collect ([\d.]+) train ([\d.]+) evaluate ([\d.]+) epoch ([\d.]+)")
DONE_LINE = re.compile(r"done in (\d+) s")
SETUP_LINE = re.compile(r"; set up in ([\d.]+) s(?:: " + ", ".join(rf"{p} ([\d.]+)" for p in SETUP_PARTS) + ")?")
THREAD_VARIABLES = (*HOST_THREAD_VARIABLES, "NUMBA_NUM_THREADS")


def log_figures(log: Path) -> dict[str, Any]:
    """{done_s, first_epoch, later_epochs, epochs, epochs_s, setup_s, setup_parts} of one run's console output: its
    `done in` seconds (None when it printed none), its epochs' phase seconds (the first epoch's as it is, the mean of
    the later ones'), their number and their total, the total of its folds' set-up seconds and of each set-up part
    (SETUP_PARTS; None where a fold line gave no parts)."""
    text = log.read_text(encoding="utf-8", errors="replace") if log.is_file() else ""
    rows = [dict(zip(PHASES, map(float, m.groups()), strict=True)) for m in EPOCH_LINE.finditer(text)]
    done = DONE_LINE.findall(text)
    later = {p: statistics.fmean(r[p] for r in rows[1:]) for p in PHASES} if len(rows) > 1 else None
    setups = SETUP_LINE.findall(text)
    parts = ({p: sum(float(s[1 + i]) for s in setups) for i, p in enumerate(SETUP_PARTS)}
             if setups and all(s[1] for s in setups) else None)
    return {"done_s": int(done[-1]) if done else None, "first_epoch": rows[0] if rows else None,
            "later_epochs": later, "epochs": len(rows), "epochs_s": sum(r["epoch"] for r in rows),
            "setup_s": sum(float(s[0]) for s in setups), "setup_parts": parts}


def same_summary(a: Path, b: Path) -> bool | None:
    """Whether two summary.json files hold the same figures (None when either is missing)."""
    if not (a.is_file() and b.is_file()):
        return None
    return json.loads(a.read_text(encoding="utf-8")) == json.loads(b.read_text(encoding="utf-8"))


def timed(jobs: Sequence[Job]) -> tuple[float, dict[Any, dict[str, Any]]]:
    """(wall seconds of all the jobs run at once, run_jobs' results)."""
    t0 = time.perf_counter()
    done = run_jobs(jobs, parallel=len(jobs), poll_s=0.2)
    return time.perf_counter() - t0, done


def bench(n: int, extra: Sequence[str], folder: Path, warmup: bool) -> dict[str, Any]:
    """The three phases of the module header; the record OUT.json holds."""
    def job(name: str, seed: int) -> Job:
        return Job(name, train_command(extra, seed, folder / name), folder / f"{name}.log")

    record: dict[str, Any] = {"n": n, "extra": list(extra), "folder": str(folder), "runs": {}}
    phases = ([("warmup", [job("warmup", 0)])] if warmup else []) + [
        ("alone", [job("alone", 0)]), ("together", [job(f"together_{s}", s) for s in range(n)])]
    for phase, jobs in phases:
        wall, done = timed(jobs)
        record[f"{phase}_wall_s"] = wall
        for j in jobs:
            record["runs"][j.key] = {"phase": phase, **done[j.key], **log_figures(j.log)}
    record["same_seed_same_summary"] = same_summary(folder / "alone" / "seed_0" / "summary.json",
                                                    folder / "together_0" / "seed_0" / "summary.json")
    record["ratio"] = record["together_wall_s"] / record["alone_wall_s"]
    return record


def phase_means(runs: dict[str, dict[str, Any]], phase: str, part: str) -> dict[str, float] | None:
    """The mean over the phase's runs of their `part` ('first_epoch' or 'later_epochs') phase seconds."""
    rows = [r[part] for r in runs.values() if r["phase"] == phase and r[part] is not None]
    return {p: statistics.fmean(r[p] for r in rows) for p in PHASES} if rows else None


def time_split(runs: dict[str, dict[str, Any]], phase: str) -> tuple[float | None, ...]:
    """(wall, wall - done in, folds' set-up, epochs, done in - set-up - epochs): the phase's means over its runs
    that printed `done in` (all None when none did)."""
    rows = [r for r in runs.values() if r["phase"] == phase and r["done_s"] is not None]
    if not rows:
        return (None,) * 5
    m = {k: statistics.fmean(r[k] for r in rows) for k in ("wall_s", "done_s", "setup_s", "epochs_s")}
    return (m["wall_s"], m["wall_s"] - m["done_s"], m["setup_s"], m["epochs_s"],
            m["done_s"] - m["setup_s"] - m["epochs_s"])


def setup_table(runs: dict[str, dict[str, Any]], n: int) -> list[str]:
    """The folds' set-up by part (each run's parts summed over its folds, the mean over the phase's runs), for the
    phases whose every run printed them: which part grows when N runs share the host and the GPU."""
    lines = []
    for phase, label in (("alone", "one alone"), ("together", f"{n} at once")):
        rows = [r["setup_parts"] for r in runs.values() if r["phase"] == phase]
        if rows and all(rows):
            lines.append(f"| {label} | " + " | ".join(f"{statistics.fmean(r[p] for r in rows):.2f}"
                                                      for p in SETUP_PARTS) + " |")
    if not lines:
        return []
    return ["", "The folds' set-up by part (seconds over a run's folds, the mean over the phase's runs; "
            "fox_numba/walkforward/driver.py SETUP_PARTS):", "",
            "| runs | " + " | ".join(SETUP_PARTS) + " |", "| --- |" + " ---: |" * len(SETUP_PARTS), *lines]


def markdown(record: dict[str, Any], command: str, info: dict[str, Any]) -> str:
    n, runs = record["n"], record["runs"]
    lines = results_header(f"{n} fox train runs at once on one GPU against one alone", command, info)
    threads = record.get("threads_per_run")
    lines += ["", f"fox train arguments: `{' '.join(record['extra']) or '(none: the default preset on a GPU)'}`; "
              f"run folders in `{record['folder']}`. Walls measured around the processes (Python's start included). "
              + (f"CPU threads of each run's numerical libraries: {threads} (--threads-per-run)." if threads
                 else "CPU threads of each run's numerical libraries: fox_numba's default (host_threads.py) or the "
                      "environment's."),
              "", "| what | wall s | / one alone |", "| --- | ---: | ---: |"]
    alone = record["alone_wall_s"]
    if "warmup_wall_s" in record:
        lines.append(f"| warm-up run (fills the kernel cache) | {record['warmup_wall_s']:.1f} | "
                     f"{record['warmup_wall_s'] / alone:.2f} |")
    lines += [f"| one run alone (seed 0) | {alone:.1f} | 1.00 |",
              f"| **{n} runs at once (seeds 0-{n - 1})** | {record['together_wall_s']:.1f} | "
              f"**{record['ratio']:.2f}** |",
              "", "Mean seconds of an epoch's phases (each run's console lines; the first epoch apart):", "",
              "| runs | epochs | collect | train | evaluate | epoch |", "| --- | --- | ---: | ---: | ---: | ---: |"]
    for phase, label in (("alone", "one alone"), ("together", f"{n} at once")):
        for part, which in (("first_epoch", "first"), ("later_epochs", "later, mean")):
            m = phase_means(runs, phase, part)
            cells = " | ".join(f"{m[p]:.2f}" for p in PHASES) if m else "n/a | n/a | n/a | n/a"
            lines.append(f"| {label} | {which} | {cells} |")
    lines += ["", "Where a run's time goes (seconds, the mean over the phase's runs; module header):", "",
              "| runs | wall | Python's start (wall - done in) | folds' set-up | epochs | the rest of done in |",
              "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for phase, label in (("alone", "one alone"), ("together", f"{n} at once")):
        lines.append(f"| {label} | " + " | ".join(f"{v:.1f}" if v is not None else "n/a"
                                                  for v in time_split(runs, phase)) + " |")
    lines += setup_table(runs, n)
    lines += ["", "| run | exit | wall s | done in s |", "| --- | ---: | ---: | ---: |"]
    lines += [f"| {k} | {r['returncode']} | {r['wall_s']:.1f} | {r['done_s'] if r['done_s'] is not None else 'n/a'} |"
              for k, r in runs.items()]
    same = record["same_seed_same_summary"]
    lines += ["", "Seed 0 alone and seed 0 among the runs at once wrote " + (
        "the same summary.json." if same else "different summary.json files." if same is False
        else "no summary.json to compare (a run failed).")]
    failed = [f"{k} (exit {r['returncode']}: {r.get('error', '')})" for k, r in runs.items() if r["returncode"] != 0]
    if failed:
        lines += ["", "Failed: " + "; ".join(failed)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=8, help="runs at once (seeds 0 .. N-1)")
    parser.add_argument("--out", type=Path, required=True, help="results path without suffix (.md and .json)")
    parser.add_argument("--folder", type=Path, default=Path("runs/bench_runs"), help="folder of the run folders")
    parser.add_argument("--no-warmup", action="store_true", help="skip the warm-up run (the caches are warm)")
    parser.add_argument("--mps", action="store_true", help=MPS_HELP + " (every phase, the warm-up included)")
    parser.add_argument("--threads-per-run", type=int, default=None, metavar="K",
                        help="cap each run's numerical libraries at K CPU threads (module header)")
    args = parser.parse_args(own)
    if args.mps and (problem := mps_problem()) is not None:
        parser.error(problem)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if args.threads_per_run is not None:
        if args.threads_per_run < 1:
            parser.error("--threads-per-run must be at least 1")
        os.environ.update({v: str(args.threads_per_run) for v in THREAD_VARIABLES})
    command = "python3 tools/bench_runs.py " + " ".join(argv)
    info = {"date_utc": datetime.now(UTC).strftime("%Y-%m-%d %H:%M"), **machine()}
    with mps_for_children(args.mps):
        record = bench(args.runs, extra, args.folder, not args.no_warmup)
    record["threads_per_run"] = args.threads_per_run
    out_md, out_json = args.out.with_name(args.out.name + ".md"), args.out.with_name(args.out.name + ".json")
    atomic_write_text(out_md, markdown(record, command, info))
    atomic_write_text(out_json, json.dumps({"command": command, "machine": info, **record}, indent=1) + "\n")
    print(out_md.read_text(encoding="utf-8"))
    bad = any(r["returncode"] != 0 for r in record["runs"].values()) or not record["same_seed_same_summary"]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
