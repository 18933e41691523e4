"""Scale benchmark (issue 22 item 5): import a folder of generated daily files, then `fox train` on the store with
a cold and a warm per-day cache; time, CPU and peak RSS of each, and the time to the first collect.

    python tools/gen_dbn.py /tmp/scale/dbn_3m --rows 3000000 --days 20
    python tools/bench_scale.py /tmp/scale/dbn_3m [/tmp/scale/dbn_0.3m ...] --out tools/results/scale_cpu
        [--preset smoke] [--days N] [--set SECTION.FIELD=VALUE ...] [--work DIR] [--keep]

Per folder, each step a child process as a user runs it (`python -m fox_numba ...`), its wall time from the
start of the process, CPU time (user + system, `os.wait4`) and peak RSS (`ru_maxrss` of that child):
- import: `fox data import FOLDER --out WORK/store.h5`; records (MBP-10 + trades rows in the store), rows a
  day, records/s, the files' and the store's bytes;
- train cold, then warm: `fox train --preset P --store WORK/store.h5` with `market.cache` a folder under WORK
  (absent for cold; the one cold filled for warm), the run under WORK/runs, and a fold plan over the last
  `--days` days of the store (default: all of them): the preset's number of folds and step, one validation day,
  the rest training (`folds.train_days`). Its stdout lines are timestamped as they arrive, and at each of these
  the child's CPU time (/proc/PID/stat) and peak RSS so far are read (`VmHWM`, /proc/PID/status):
    run folder:    the line `run folder ...`: the store's days selected (only their bars read), the features of
                   every selected day loaded (cold: each day read in full, validated, its features built and
                   cached; warm: read from the cache) and the run folder written (cli.py train and
                   walkforward/driver.py train_run, as of 6e4ebbe);
    first collect: the line `fold 0: ...; baselines: ...`, printed just before the first epoch's collect. Between
                   the two: the trainer built, the fold's market built and uploaded, the trainer bound (the
                   learner's initialisation: the first kernel launches), the fold reset and the baselines, work
                   that does not grow with the rows a day. This is "the time to the first kernel" of the issue,
                   an upper bound by the binding's tail and the baselines;
    first epoch:   the line `fold 0 epoch 0: ...` (the first collect, train and validation done);
  and the cache folder's bytes after the run.
The 1-minute load average is recorded before and after each step. Writes OUT.md (tables, command, machine) and
OUT.json (the same figures).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fox_numba.config import load_config  # noqa: E402
from fox_numba.market.store import MarketStore, store_bytes  # noqa: E402

MARKERS = {
    "run_folder": re.compile(r"^run folder "),
    "first_collect": re.compile(r"^fold 0: .*baselines"),
    "first_epoch": re.compile(r"^fold 0 epoch 0: "),
}
"""Stdout lines of `fox train` that mark its stages (module docstring), by the first line each matches."""


def fox() -> list[str]:
    return [sys.executable, "-m", "fox_numba"]


def vm_hwm_mib(pid: int) -> float | None:
    """Peak RSS so far of a live process (MiB), None when it has gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system, all threads) a live process has spent so far, None when it has gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_child(command: list[str], *, markers: dict[str, re.Pattern] | None = None, log: Path | None = None,
              stop_at: str | None = None) -> dict:
    """Run `command`; wall and CPU seconds, peak RSS (MiB), load before / after and, per marker, the seconds from
    the start at which its first matching stdout line arrived, the child's CPU seconds and peak RSS then; the
    stderr line saying where the kernels run (`fox train`'s). Its stdout and stderr go to `log` (when given). With
    `stop_at` (a marker's name) the child is stopped (SIGTERM) when that marker arrives; otherwise its exit status
    must be 0."""
    markers = markers or {}
    load_before = os.getloadavg()[0]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    seen: dict[str, dict] = {}
    out: list[str] = []
    err: list[str] = []

    def read_out() -> None:
        for line in child.stdout:
            t = time.perf_counter() - start
            out.append(f"[{t:8.2f} s] {line}")
            for name, pattern in markers.items():
                if name not in seen and pattern.search(line):
                    seen[name] = {"s": t, "cpu_s": cpu_s(child.pid), "peak_rss_mib": vm_hwm_mib(child.pid)}
                    if name == stop_at:
                        child.terminate()

    def read_err() -> None:
        err.extend(child.stderr)

    readers = [threading.Thread(target=read_out), threading.Thread(target=read_err)]
    for r in readers:
        r.start()
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    for r in readers:
        r.join()
    if log is not None:
        log.write_text("".join(out) + "--- stderr ---\n" + "".join(err))
    stopped = stop_at is not None and seen.get(stop_at) is not None
    if os.waitstatus_to_exitcode(status) != 0 and not stopped:
        raise SystemExit(f"{' '.join(command[1:])} failed ({status}):\n{''.join(err)[-4000:]}")
    return {"command": " ".join(command), "wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime,
            "peak_rss_mib": usage.ru_maxrss / 1024, "load": [load_before, os.getloadavg()[0]],
            "markers": {name: seen.get(name) for name in markers}, "stopped_at": stop_at if stopped else None,
            "backend": next((ln.strip() for ln in err if "kernels run" in ln), None)}


def store_rows(store: Path) -> dict:
    """Days and rows per schema of a store."""
    rows: dict[str, list[int]] = {}
    with MarketStore(store) as s:
        days = s.days()
        for schema in s.file:
            for day in s.days(schema):
                group = s.group(schema, day)
                rows.setdefault(schema, []).append(int(next(iter(group.values())).shape[0]))
    return {"days": days, "rows": {k: sum(v) for k, v in rows.items()},
            "rows_a_day": {k: sum(v) // len(v) for k, v in rows.items()}}


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def fold_plan(preset: str, overrides: list[str], days: int) -> list[str]:
    """`--set` overrides of a fold plan spanning `days` days: the preset's folds and step, one validation day."""
    folds = load_config(preset, overrides=overrides).folds
    train = days - 1 - (folds.n_folds - 1) * folds.step_days
    if train < 1:
        raise SystemExit(f"{days} days cannot hold {folds.n_folds} folds advancing {folds.step_days} days")
    return [f"folds.train_days={train}", "folds.val_days=1"]


def bench_folder(folder: Path, work: Path, args: argparse.Namespace) -> dict:
    store, cache, runs = work / "store.h5", work / "cache", work / "runs"
    dbn_bytes = folder_bytes(folder)
    workers = ["--workers", str(args.workers)]
    imp = run_child([*fox(), "data", "import", str(folder), "--out", str(store), *workers], log=work / "import.log")
    imp["command"] = f"fox data import {folder} --out {store} {' '.join(workers)}"
    content = store_rows(store)
    n_records = sum(content["rows"].get(s, 0) for s in ("mbp10", "trades"))
    imp.update(records=n_records, records_per_s=n_records / imp["wall_s"], records_per_cpu_s=n_records / imp["cpu_s"],
               dbn_bytes=dbn_bytes, store_bytes=store_bytes(store))
    days = args.days or len(content["days"])
    chosen = [*(["market.first_day=" + json.dumps(content["days"][-days])] if days < len(content["days"]) else []),
              *fold_plan(args.preset, args.set, days), *args.set]
    print(f"{folder}: {n_records:,} records over {len(content['days'])} days, import {imp['wall_s']:.1f} s, "
          f"{imp['peak_rss_mib']:,.0f} MiB; load {imp['load'][0]:.1f} / {imp['load'][1]:.1f}", flush=True)
    train = {}
    for case in ("cold", "warm"):
        if case == "cold" and cache.exists():
            shutil.rmtree(cache)
        sets = [*chosen, f"market.cache={json.dumps(str(cache))}", f"market.read_workers={args.workers}",
                f"run.out_dir={json.dumps(str(runs))}", f"run.name={json.dumps(case)}"]
        command = ["train", "--preset", args.preset, "--store", str(store), *[a for s in sets for a in ("--set", s)]]
        r = run_child([*fox(), *command], markers=MARKERS, log=work / f"train_{case}.log", stop_at=args.stop_at)
        r["command"] = " ".join(["fox", *command])
        r["cache_bytes"] = folder_bytes(cache)
        train[case] = r
        first = r["markers"]["first_collect"] or {"s": float("nan"), "peak_rss_mib": float("nan")}
        print(f"  train {case}: first collect at {first['s']:.1f} s "
              f"({first['peak_rss_mib']:,.0f} MiB), whole run {r['wall_s']:.1f} s, "
              f"{r['peak_rss_mib']:,.0f} MiB; load {r['load'][0]:.1f} / {r['load'][1]:.1f}", flush=True)
    return {"folder": str(folder), "days": len(content["days"]), "days_trained": days,
            "rows_a_day": content["rows_a_day"], "fold_plan": chosen, "import": imp, "train": train}


def machine() -> dict:
    from importlib.metadata import version

    mem = next(int(ln.split()[1]) for ln in Path("/proc/meminfo").read_text().splitlines()
               if ln.startswith("MemTotal:"))  # fmt: skip
    return {"host": platform.node(), "nproc": os.cpu_count(), "memory_gib": round(mem / 2**20, 1),
            "python": platform.python_version(), "numpy": np.__version__, "h5py": version("h5py"),
            "numba": version("numba"), "simulator": os.environ.get("NUMBA_ENABLE_CUDASIM", "")}


def mib(x: float | None) -> str:
    return "n/a" if x is None else f"{x:,.0f} MiB"


def markdown(report: dict) -> str:
    m = report["machine"]
    lines = [
        f"Measured {report['started']} to {report['finished']} UTC on {m['host']}: {m['nproc']} cores, "
        f"{m['memory_gib']} GiB, Python {m['python']}, numpy {m['numpy']}, h5py {m['h5py']}, numba {m['numba']}.",
        "",
        "    " + report["command"],
        "",
        "Import (`fox data import FOLDER --out STORE`):",
        "",
        "| folder | days | MBP-10 rows a day | records | DBN files | store | wall | CPU | records/s | peak RSS "
        "| load before / after |",
        "| --- |" + " ---: |" * 10,
    ]
    for f in report["folders"]:
        i = f["import"]
        lines.append(
            f"| {f['folder']} | {f['days']} | {f['rows_a_day'].get('mbp10', 0):,} | {i['records']:,} "
            f"| {i['dbn_bytes'] / 1e6:,.0f} MB | {i['store_bytes'] / 1e6:,.0f} MB | {i['wall_s']:.1f} s "
            f"| {i['cpu_s']:.1f} s | {i['records_per_s'] / 1e3:,.0f} k | {mib(i['peak_rss_mib'])} "
            f"| {i['load'][0]:.1f} / {i['load'][1]:.1f} |"
        )
    lines += [
        "",
        f"Train (`fox train --preset {report['preset']} --store STORE` with the fold plan shown; seconds from the "
        "process's start, wall (CPU); RSS: the child's peak up to that point):",
        "",
        "| folder | days trained | cache | run folder | peak RSS then | first collect | peak RSS then | first epoch "
        "| whole run | its CPU | peak RSS | cache on disk | load before / after |",
        "| --- | ---: | --- |" + " ---: |" * 10,
    ]
    for f in report["folders"]:
        for case, r in f["train"].items():
            k = r["markers"]
            at = {n: (f"{v['s']:.1f} s ({v.get('cpu_s') or 0:.1f} s)", mib(v["peak_rss_mib"])) if v else ("n/a", "n/a")
                  for n, v in k.items()}
            lines.append(
                f"| {f['folder']} | {f['days_trained']} | {case} | {at['run_folder'][0]} | {at['run_folder'][1]} "
                f"| {at['first_collect'][0]} | {at['first_collect'][1]} | {at['first_epoch'][0]} "
                f"| {r['wall_s']:.1f} s{' (stopped)' if r.get('stopped_at') else ''} "
                f"| {r['cpu_s']:.1f} s | {mib(r['peak_rss_mib'])} | {r['cache_bytes'] / 1e6:,.1f} MB "
                f"| {r['load'][0]:.1f} / {r['load'][1]:.1f} |"
            )
    backends = sorted({r.get("backend") or "" for f in report["folders"] for r in f["train"].values()} - {""})
    lines += ["", "Fold plans (`--set`): " + "; ".join(f"{f['folder']}: {' '.join(f['fold_plan'])}"
                                                     for f in report["folders"])]
    lines += [f"`fox train` said: {b}" for b in backends]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", type=Path, nargs="+", help="folders of daily files (tools/gen_dbn.py)")
    parser.add_argument("--out", type=Path, required=True, help="writes OUT.md and OUT.json")
    parser.add_argument("--preset", default="smoke", help="fox train --preset (default smoke)")
    parser.add_argument("--days", type=int, help="train on the store's last DAYS days (default: all)")
    parser.add_argument("--set", action="append", default=[], help="more fox train --set overrides (applied last)")
    parser.add_argument("--workers", type=int, default=1,
                        help="processes that stage the files and build the cold run's features (fox data import "
                             "--workers, market.read_workers; default 1: one process, the one-core figures)")
    parser.add_argument("--work", type=Path, help="folder for the stores, caches and runs (default: a temporary "
                        "folder beside each input folder, removed at the end unless --keep)")  # fmt: skip
    parser.add_argument("--keep", action="store_true", help="keep the work folders")
    parser.add_argument("--stop-at", choices=list(MARKERS), help="stop each fox train (SIGTERM) at this marker: "
                        "its whole-run figures are then up to that point")  # fmt: skip
    args = parser.parse_args(argv)
    report = {"started": f"{datetime.now(UTC):%Y-%m-%d %H:%M}", "machine": machine(), "preset": args.preset,
              "command": " ".join(["python tools/bench_scale.py", *sys.argv[1:]] if argv is None
                                  else ["python tools/bench_scale.py", *argv]),
              "folders": []}  # fmt: skip
    for folder in args.folders:
        parent = args.work or folder.parent
        parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f"scale-{folder.name}-", dir=parent))
        try:
            report["folders"].append(bench_folder(folder, work, args))
        finally:
            if not args.keep:
                shutil.rmtree(work, ignore_errors=True)
            else:
                print(f"  kept {work}")
    report["finished"] = f"{datetime.now(UTC):%Y-%m-%d %H:%M}"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{args.out}.json").write_text(json.dumps(report, indent=1) + "\n")
    Path(f"{args.out}.md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
