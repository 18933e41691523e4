"""Time the probe's ridge fit in N processes at once, by BLAS threads per process (fox_numba/host_threads.py).

    python tools/bench_host_threads.py --out tools/results/host_threads_cpu [--runs 1 2 4 8] [--threads default 1]

Each child process loads numpy with the thread variables (host_threads.THREAD_VARIABLES) set to K, or unset for
`default` (OpenBLAS then starts a thread per core), draws a seeded [rows, columns] observation (a default fold's
training rows and market columns) and times `features.forecast.fit_probe` on it --reps times. The children of a
row start together; the row gives the mean and the largest child's seconds, the wall, and the mean over the same
setting's one process alone. N runs sharing one host (`fox sweep`, tools/suite.py, tools/bench_runs.py) meet the
fold set-up's fits this way. Writes OUT.md and OUT.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def child(rows: int, columns: int, reps: int) -> None:
    """Print the seconds of `reps` probe fits (numpy is loaded first, under this process's thread variables)."""
    import numpy as np

    from fox_numba.features.forecast import fit_probe

    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, columns)).astype(np.float32)
    y = x[:, :4].sum(axis=1, dtype=np.float64) + rng.standard_normal(rows)
    t0 = time.perf_counter()
    for _ in range(reps):
        fit_probe(x, y, slice(0, rows), ridge=1e-3, horizon=15)
    print(time.perf_counter() - t0)


def run_row(n: int, threads: str, args: argparse.Namespace) -> dict[str, float]:
    """n children at once under `threads`: their mean and largest seconds and the wall."""
    from fox_numba.host_threads import THREAD_VARIABLES

    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES}
    if threads != "default":
        env.update({v: threads for v in THREAD_VARIABLES})
    cmd = [sys.executable, __file__, "--child", str(args.rows), str(args.columns), str(args.reps)]
    t0 = time.perf_counter()
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True) for _ in range(n)]
    seconds = [float(p.communicate()[0]) for p in procs]
    wall = time.perf_counter() - t0
    if any(p.returncode for p in procs):
        raise SystemExit(f"a child failed under threads={threads}")
    return {"processes": n, "threads": threads, "mean_s": statistics.fmean(seconds), "max_s": max(seconds),
            "wall_s": wall}


def markdown(rows: list[dict[str, float]], args: argparse.Namespace, command: str) -> str:
    alone = {r["threads"]: r["mean_s"] for r in rows if r["processes"] == 1}
    import numpy as np

    blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    lines = [
        "# The probe's ridge fit in N processes at once, by BLAS threads per process", "",
        f"Command: `{command}`", "", f"Date (UTC): {datetime.now(UTC):%Y-%m-%d %H:%M}", "",
        f"Machine: {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, numpy "
        f"{np.__version__}, BLAS {blas.get('name')} {blas.get('version')}; 1-minute load average before: "
        f"{args.load_before:.2f}.", "",
        f"Each process: `fit_probe` on a seeded [{args.rows:,}, {args.columns}] float32 observation, {args.reps} "
        "times. `default`: the thread variables unset (OpenBLAS starts a thread per core).", "",
        "| BLAS threads per process | processes at once | mean s per process | largest | wall s "
        "| mean / one process alone |", "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        ratio = r["mean_s"] / alone[r["threads"]] if r["threads"] in alone else float("nan")
        lines.append(f"| {r['threads']} | {r['processes']} | {r['mean_s']:.2f} | {r['max_s']:.2f} | "
                     f"{r['wall_s']:.2f} | {ratio:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        child(int(argv[1]), int(argv[2]), int(argv[3]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="results path without suffix (.md, .json)")
    parser.add_argument("--runs", type=int, nargs="+", default=[1, 2, 4, 8], help="processes at once, a row each")
    parser.add_argument("--threads", nargs="+", default=["default", "1"], help="BLAS threads per process, or default")
    parser.add_argument("--rows", type=int, default=23_400, help="training rows (60 days of 390 bars)")
    parser.add_argument("--columns", type=int, default=182, help="market columns of the default observation")
    parser.add_argument("--reps", type=int, default=6, help="fits per process")
    args = parser.parse_args(argv)
    args.load_before = os.getloadavg()[0]
    rows = [run_row(n, threads, args) for threads in args.threads for n in args.runs]
    command = "python tools/bench_host_threads.py " + " ".join(argv)
    from fox_numba.io import atomic_write_text

    atomic_write_text(args.out.with_name(args.out.name + ".md"), markdown(rows, args, command))
    atomic_write_text(args.out.with_name(args.out.name + ".json"),
                      json.dumps({"command": command, "rows": rows}, indent=1) + "\n")
    print(markdown(rows, args, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
