"""Issue 26's speed set on one GPU machine, each file named by the card (`speed_set_h100f.json` and the files it names).

    python3 tools/speed_set.py --out OUT --suffix h200 [--pytest] [--warm] [--cprofile] [--scratch /tmp/fox_speed_set]
        [--dry-run]

In order, each a child process as a user runs it, with the kernel cache (FOX_KERNEL_CACHE) and, but for the test
suite, the default market's build (FOX_DATA_DIR) in SCRATCH, emptied first, so the cold run is a fresh machine's first:
1. `fox train` on the default preset with the cache empty (cold: the market built, its features, the kernels
   compiled), then again (warm): OUT/train_{cold,warm}_SUFFIX.txt
   hold the run's last lines, its wall and its peak RSS (os.wait4), and whether the two runs' checkpoints hold the
   same arrays (`checkpoints_equal`), and the size of each run folder (`run_folder_bytes`);
2. tools/bench_learner.py, the default step (the crossed mean head, mirror) and the 2 x 256 trunk, tf32; then eight
   default learners sharing the card (`--concurrent 8`: ms per round of eight steps, the card's learner throughput
   that eight runs at once wait on; learner_ablation_h200.md section 93), steadier than step 5's walls;
3. tools/bench_collect.py at 16,384 and 4,096 environments;
4. `fox profile` (OUT/profile_SUFFIX.txt): one epoch's stages and kernels on the GPU, against which the console's
   seconds show the host's share;
5. tools/bench_runs.py, eight default runs at once under MPS against one alone (the cache warm from 1);
6. with --pytest, the whole test suite on the GPU (15 workers): OUT/pytest_full_gpu_SUFFIX.txt;
7. with --cprofile, a warm `fox train` under cProfile: OUT/train_cprofile_SUFFIX.prof and its top functions by
   cumulative and own time in OUT/train_cprofile_top_SUFFIX.txt (what found the kernels that missed the cache);
8. with --warm, `fox cache warm` into a second empty cache, then `fox train` on it (`cache_warm`, `train_prewarmed`):
   what a run costs after the kernels are compiled ahead in parallel (fox_numba/kernels/warm_cache.py).
A step that fails is recorded (its exit status in OUT/speed_set_SUFFIX.json) and the next one runs; the exit status
is 1 if any failed. --dry-run prints the commands and runs nothing.
"""

from __future__ import annotations

import argparse
import json
import io
import os
import pstats
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PY = sys.executable
PREWARMED = ("cache_warm", "train_prewarmed")

from fox_numba.io import atomic_write_text  # noqa: E402


def steps(out: Path, suffix: str, scratch: Path, pytest: bool, warm: bool = False,
          cprofile: bool = False) -> list[tuple[str, list[str]]]:
    """(name, argv) of every step, in order."""
    train = [PY, "-m", "fox_numba", "train", "--set"]
    learner = [PY, "tools/bench_learner.py", "--precision", "tf32", "--live-branches", "1"]
    found = [
        ("train_cold", [*train, f'run.out_dir="{scratch / "cold"}"']),
        ("train_warm", [*train, f'run.out_dir="{scratch / "warm"}"']),
        ("bench_learner_mirror", [*learner, "--mean-cross", "--mirror", "--out",
                                  str(out / f"bench_learner_tw_mirror_tf32_{suffix}")]),
        ("bench_learner_trunk", [*learner, "--steps", "100", "--windows", "2", "--layers", "2", "--out",
                                 str(out / f"bench_learner_tw_trunk_tf32_{suffix}")]),
        ("bench_learner_shared", [*learner, "--mean-cross", "--mirror", "--steps", "200", "--windows", "3",
                                  "--kernel-steps", "2", "--concurrent", "8", "--out",
                                  str(out / f"bench_learner_shared8_tf32_{suffix}")]),
        ("bench_collect", [PY, "tools/bench_collect.py", "--out", str(out / f"bench_collect_tw_{suffix}"),
                           "--envs", "16384", "4096"]),
        ("profile", [PY, "-m", "fox_numba", "profile", "--set", f'run.out_dir="{scratch / "profile"}"']),
        ("bench_runs", [PY, "tools/bench_runs.py", "--runs", "8", "--mps", "--no-warmup", "--out",
                        str(out / f"many_runs_tw_{suffix}"), "--folder", str(scratch / "bench_runs")]),
    ]
    if pytest:
        found.append(("pytest", [PY, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-o", "addopts=",
                                 "-n", "15", "tests"]))
    if cprofile:
        found.append(("train_cprofile", [PY, "-m", "cProfile", "-o", str(out / f"train_cprofile_{suffix}.prof"), "-m",
                                         *train[2:], f'run.out_dir="{scratch / "cprofile"}"']))
    if warm:
        found += [("cache_warm", [PY, "-m", "fox_numba", "cache", "warm"]),
                  ("train_prewarmed", [*train, f'run.out_dir="{scratch / "prewarmed"}"'])]
    return found


def cache_for(name: str, scratch: Path) -> Path:
    """The kernel cache a step uses: the prewarmed steps' own, else the one the cold run fills."""
    return scratch / ("kernel_cache_prewarmed" if name in PREWARMED else "kernel_cache")


def run_step(argv: list[str], log: Path, env: dict[str, str]) -> dict[str, float | int]:
    """Run argv with its output in `log`: exit status, wall seconds, peak RSS in KiB."""
    t0 = time.perf_counter()
    with open(log, "w", encoding="utf-8") as fh:
        child = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
        _, status, usage = os.wait4(child.pid, 0)
    return {"returncode": os.waitstatus_to_exitcode(status), "wall_s": time.perf_counter() - t0,
            "peak_rss_kib": usage.ru_maxrss}


def checkpoint_arrays(run_parent: Path) -> dict[str, dict[str, np.ndarray]]:
    """Every numeric dataset of every checkpoint under the one run folder in `run_parent`, by relative path."""
    import h5py

    found: dict[str, dict[str, np.ndarray]] = {}
    for path in sorted(run_parent.glob("*/fold_*/*.h5")):
        with h5py.File(path, "r") as f:
            arrays: dict[str, np.ndarray] = {}
            f.visititems(lambda name, obj: arrays.__setitem__(name, obj[()])
                         if isinstance(obj, h5py.Dataset) else None)
        found[str(path.relative_to(path.parents[1]))] = arrays
    return found


def same_arrays(a: dict[str, dict[str, np.ndarray]], b: dict[str, dict[str, np.ndarray]]) -> bool:
    """Whether two runs' checkpoints hold the same arrays (NaN equal to NaN: fields not yet defined)."""
    def equal(x: np.ndarray, y: np.ndarray) -> bool:
        if x.dtype.names:
            return x.dtype == y.dtype and all(equal(x[n], y[n]) for n in x.dtype.names)
        return np.array_equal(x, y, equal_nan=x.dtype.kind in "fc")
    return bool(a) and a.keys() == b.keys() and all(
        a[k].keys() == b[k].keys() and all(equal(a[k][n], b[k][n]) for n in a[k]) for k in a)


def folder_bytes(path: Path) -> int:
    """Bytes of the files under `path` (0 if it does not exist)."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def profile_top(prof: Path, lines: int = 80) -> str:
    """The functions of a cProfile file by cumulative time, then by own time, as pstats prints them."""
    buffer = io.StringIO()
    stats = pstats.Stats(str(prof), stream=buffer)
    stats.sort_stats("cumulative").print_stats(lines)
    stats.sort_stats("tottime").print_stats(lines // 2)
    return buffer.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder of the results files")
    parser.add_argument("--suffix", required=True, help="the card's name in the file names (h200, h100d, ...)")
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/fox_speed_set"),
                        help="run folders and the kernel cache; emptied first")
    parser.add_argument("--pytest", action="store_true", help="also the whole test suite on the GPU")
    parser.add_argument("--warm", action="store_true", help="also `fox cache warm` then `fox train` on a second cache")
    parser.add_argument("--cprofile", action="store_true", help="also a warm `fox train` under cProfile")
    parser.add_argument("--skip", nargs="+", default=[], metavar="STEP",
                        help="steps to leave out (train_cold, bench_runs, ...: --dry-run lists them), for a "
                             "machine lent for less time than the whole set takes")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = parser.parse_args(argv)
    plan = steps(args.out.resolve(), args.suffix, args.scratch.resolve(), args.pytest, args.warm, args.cprofile)
    unknown = sorted(set(args.skip) - {name for name, _ in plan})
    if unknown:
        parser.error(f"--skip: no step named {', '.join(unknown)} (steps: {', '.join(n for n, _ in plan)})")
    plan = [(name, step) for name, step in plan if name not in args.skip]
    if args.dry_run:
        print("\n".join(f"{name}: {' '.join(a)}" for name, a in plan))
        return 0
    shutil.rmtree(args.scratch, ignore_errors=True)
    args.scratch.mkdir(parents=True)
    args.out.mkdir(parents=True, exist_ok=True)
    done: dict[str, dict[str, object]] = {}
    for name, step in plan:
        log = args.out / (f"pytest_full_gpu_{args.suffix}.txt" if name == "pytest" else f"{name}_{args.suffix}.txt")
        env = {**os.environ, "FOX_KERNEL_CACHE": str(cache_for(name, args.scratch.resolve())),
               "NUMBA_ENABLE_CUDASIM": "0"}
        if name != "pytest":  # the tests build their own markets
            env["FOX_DATA_DIR"] = str(args.scratch.resolve() / "data")
        done[name] = {"argv": step, **run_step(step, log, env)}
        print(name, {k: v for k, v in done[name].items() if k != "argv"}, flush=True)
    equal = same_arrays(checkpoint_arrays(args.scratch / "cold"), checkpoint_arrays(args.scratch / "warm"))
    command = "python3 tools/speed_set.py " + " ".join(sys.argv[1:] if argv is None else argv)
    prof = args.out / f"train_cprofile_{args.suffix}.prof"
    if prof.is_file():
        atomic_write_text(args.out / f"train_cprofile_top_{args.suffix}.txt", profile_top(prof))
    sizes = {run: folder_bytes(args.scratch / run) for run in ("cold", "warm")}
    record = {"command": command, "steps": done, "checkpoints_equal": equal, "run_folder_bytes": sizes}
    atomic_write_text(args.out / f"speed_set_{args.suffix}.json", json.dumps(record, indent=1) + "\n")
    print("cold and warm checkpoints hold the same arrays:", equal)
    return int(any(s["returncode"] != 0 for s in done.values()))


if __name__ == "__main__":
    sys.exit(main())
