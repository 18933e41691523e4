"""Time `fox data import` on folders of generated DBN+zstd files, against the rate of the decoders alone.

    python tools/gen_dbn.py /tmp/dbn_1m --rows 1000000 --days 3
    python tools/bench_import.py /tmp/dbn_0.1m /tmp/dbn_1m --out tools/results/import_scale_cpu.md [--ray]
        [--compression lzf|gzip|none]

Per folder:
- import: `fox data import FOLDER --out STORE [--compression C]` (C given unless it is the default) in a child
  process, as a user runs it: wall time and records/s (MBP-10 + trades records in the files); its CPU time (user +
  system, `os.wait4`: what one core spent, which other work on a shared machine inflates less than the wall time;
  the system share beside it, the page cache and file system's part)
  and records per CPU second, the process's start excluded (Python and the CLI's imports: the CPU time of
  `fox data import --help`); peak RSS of that process (`MEASURE`); store size; the 1-minute load average before
  and after.
  With `--ray` also the same with `--ray` (a local Ray cluster started by the command, its start included; the
  peak RSS is the driver's, the Ray workers' is not counted);
- databento-dbn's own decode rate: `DBNDecoder(compression=ZSTD)` fed 4 MiB chunks, records decoded to its
  Python objects, one core, per CPU second of this process; the ratio import / decoder (both per CPU second; the
  import's with and without its start);
- zstd alone: `zstandard` decompressing the files in 4 MiB blocks, per CPU second, the first step of the importer's
  block path (no numpy work, no validation, no store);
- zstd + store writes alone: that, plus the store's columns of every record written chunked and compressed as the
  store writes them and hashed a chunk at a time (`store_floor_seconds`): what any importer of these files into
  this store format pays, the rest being its own work; the ratio of the import (start excluded) to it.
Writes OUT (markdown, with the command and the machine).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path

import databento_dbn as dbn
import h5py
import numpy as np
import zstandard

from fox_numba.market.databento import find_files, read_header, record_blocks
from fox_numba.market.store import CHUNK_ROWS, COMPRESSIONS, DEFAULT_COMPRESSION, store_bytes
from fox_numba.market.validate import BOOK_FIELDS

CHUNK = 1 << 22


def run_import(folder: Path, store: Path, *options: str) -> tuple[float, float, float, float]:
    """`run` of `fox data import folder --out store [options]`."""
    command = [sys.executable, "-m", "fox_numba", "data", "import", str(folder), "--out", str(store), *options]
    if "--ray" not in options:
        command += ["--workers", "1"]  # the rate of one process on one core, which the decoder's is read against
    return run(command)


MEASURE = """
import os, subprocess, sys
child = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)
_, status, usage = os.wait4(child.pid, 0)
print(os.waitstatus_to_exitcode(status), usage.ru_utime + usage.ru_stime, usage.ru_maxrss, usage.ru_stime)
"""
"""Runs a command and prints its exit status, CPU seconds, peak RSS (KiB) and the system share of its CPU seconds. Started from this small process: a
process started straight from the benchmark's (which has read whole files) would report the benchmark's own peak
RSS, as Linux carries the high-water mark of the process that execs into the one it becomes."""


def run(command: list[str]) -> tuple[float, float, float, float]:
    """Wall seconds, CPU seconds (user + system), peak RSS (MiB) and system CPU seconds (the kernel's share: page
    cache and file system) of `command` in a child process (its exit status must be 0)."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", MEASURE, *command], capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    status, cpu, rss, system = done.stdout.split()
    if int(status) != 0:
        raise SystemExit(f"{' '.join(command[1:])} failed: {done.stderr}")
    return wall, float(cpu), int(rss) / 1024, float(system)


def decoder_rate(paths: list[Path]) -> tuple[dict[Path, int], float]:
    """Records per file and CPU seconds for databento-dbn to decode `paths` to its record objects."""
    n, seconds = {}, 0.0
    for path in paths:
        raw = path.read_bytes()
        start = time.process_time()
        decoder = dbn.DBNDecoder(compression=dbn.Compression.ZSTD)
        n[path] = 0
        for k in range(0, len(raw), CHUNK):
            decoder.write(raw[k : k + CHUNK])
            n[path] += sum(1 for r in decoder.decode() if not isinstance(r, dbn.Metadata))
        seconds += time.process_time() - start
    return n, seconds


def zstd_seconds(paths: list[Path]) -> float:
    """CPU seconds for `zstandard` to decompress `paths` in `CHUNK` blocks."""
    seconds = 0.0
    for path in paths:
        raw = path.read_bytes()
        start = time.process_time()
        reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
        while reader.read(CHUNK):
            pass
        seconds += time.process_time() - start
    return seconds


def store_floor_seconds(paths: list[Path], compression: str) -> float:
    """CPU seconds of what any importer writing the store pays on top of zstd: the store's columns of every record
    (MBP-10: ts_event and the book; trades: ts_event, price, size, side) written a whole chunk at a time, chunked and
    filtered as the store writes them (`store.COMPRESSIONS`), and each chunk hashed (sha256, the digests). Only the
    writes and the hashing are timed (not the decoding, nor the gathering of the columns into chunks)."""
    seconds = 0.0
    with tempfile.TemporaryDirectory(dir=paths[0].parent.parent) as tmp, h5py.File(Path(tmp) / "f.h5", "w") as h5:
        for k, path in enumerate(paths):
            f = read_header(path)
            names = ("ts_event", *BOOK_FIELDS) if f.schema == "mbp10" else ("ts_event", "price", "size", "side")
            pending: dict[str, list[np.ndarray]] = {name: [] for name in names}
            datasets: dict[str, h5py.Dataset] = {}
            held = rows = 0
            for block in [*record_blocks(f), None]:  # None: the file's end, where the last chunk is written
                if block is not None:
                    levels = block["levels"] if f.schema == "mbp10" else block
                    for name in names:
                        pending[name].append(block[name] if name in block.dtype.names else levels[name])
                    held += len(block)
                while held >= CHUNK_ROWS or (block is None and held):
                    count = min(held, CHUNK_ROWS)
                    cols = {name: np.concatenate(parts) for name, parts in pending.items()}
                    pending = {name: [values[count:]] for name, values in cols.items()}
                    start = time.process_time()
                    for name, values in cols.items():
                        chunk = values[:count]
                        if name not in datasets:
                            tail = chunk.shape[1:]
                            datasets[name] = h5.create_dataset(
                                f"{k}/{name}", shape=(0, *tail), maxshape=(None, *tail), dtype=chunk.dtype,
                                chunks=(CHUNK_ROWS, *tail), **COMPRESSIONS[compression],
                            )  # fmt: skip
                        datasets[name].resize(rows + count, axis=0)
                        datasets[name][rows:] = chunk
                        hashlib.sha256(chunk).digest()
                    seconds += time.process_time() - start
                    held, rows = held - count, rows + count
            start = time.process_time()
            h5.flush()  # the chunks still in the datasets' caches compressed and written
            seconds += time.process_time() - start
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", type=Path, nargs="+", help="folders written by tools/gen_dbn.py")
    parser.add_argument("--out", type=Path, required=True, help="markdown file to write")
    parser.add_argument("--ray", action="store_true", help="also time the import with --ray (a local cluster)")
    parser.add_argument("--compression", default=DEFAULT_COMPRESSION, choices=list(COMPRESSIONS),
                        help="the store's compression (fox data import --compression)")  # fmt: skip
    args = parser.parse_args()
    start = run([sys.executable, "-m", "fox_numba", "data", "import", "--help"])[1]
    rows = []
    for folder in args.folders:
        paths = find_files(folder)
        load = os.getloadavg()[0]
        chosen = ("--compression", args.compression) if args.compression != DEFAULT_COMPRESSION else ()
        with tempfile.TemporaryDirectory(dir=folder.parent) as tmp:
            wall, cpu, rss, system = run_import(folder, Path(tmp) / "store.h5", *chosen)
            size = store_bytes(Path(tmp) / "store.h5") / 1e6
            load = f"{load:.1f} / {os.getloadavg()[0]:.1f}"
            ray = run_import(folder, Path(tmp) / "ray.h5", "--ray", *chosen) if args.ray else None
        per_file, t_all = decoder_rate(paths)
        n_all, mbp = sum(per_file.values()), [n for p, n in per_file.items() if ".mbp-10." in p.name]
        t_zstd = zstd_seconds(paths)
        t_floor = t_zstd + store_floor_seconds(paths, args.compression)
        rows.append((sum(mbp) // len(mbp), n_all, wall, cpu, system, rss, size, load, n_all / t_all, n_all / t_zstd,
                     n_all / t_floor, ray))  # fmt: skip
        print(f"{folder}: {n_all:,} records, import {wall:.1f} s ({cpu:.1f} s CPU), {n_all / wall / 1e3:,.0f} k rec/s, "
              f"{rss:,.0f} MiB" + (f"; --ray {ray[0]:.1f} s, {ray[2]:,.0f} MiB" if ray else "") + f"; load {load}")
    lines = [
        "| MBP-10 rows a day | records | import | import rec/s | CPU (of it system) | rec / CPU s, start excluded | peak RSS | store "
        "| load before / after | decoder rec / CPU s | import / decoder | import, start excluded / decoder "
        "| zstd alone rec / CPU s | zstd + store writes alone rec / CPU s | import, start excluded / that |"
        + (" import --ray | --ray rec/s | --ray driver RSS |" if args.ray else ""),
        "|" + " ---: |" * (18 if args.ray else 15),
    ]
    for per_day, n_all, wall, cpu, system, rss, size, load, r_all, r_zstd, r_floor, ray in rows:
        rate = n_all / (cpu - start)
        line = (
            f"| {per_day:,} | {n_all:,} | {wall:.1f} s | {n_all / wall / 1e3:,.0f} k | {cpu:.1f} s ({system:.1f} s) "
            f"| {rate / 1e3:,.0f} k | {rss:,.0f} MiB | {size:,.0f} MB | {load} | {r_all / 1e3:,.0f} k "
            f"| {n_all / cpu / r_all:.2f} | {rate / r_all:.2f} | {r_zstd / 1e3:,.0f} k | {r_floor / 1e3:,.0f} k "
            f"| {rate / r_floor:.2f} |"
        )
        if ray:
            line += f" {ray[0]:.1f} s | {n_all / ray[0] / 1e3:,.0f} k | {ray[2]:,.0f} MiB |"
        lines.append(line)
    header = [
        f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on {platform.node()}: {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, numpy {np.__version__}, databento-dbn {version('databento-dbn')}, zstandard "
        f"{version('zstandard')}. The process's start (`fox data import --help`): {start:.2f} s CPU.",
        "",
        "    " + " ".join(["python tools/bench_import.py", *map(str, args.folders), "--out", str(args.out)]
                          + (["--ray"] if args.ray else []) + ["--compression", args.compression]),
        "",
    ]
    args.out.write_text("\n".join(header + lines) + "\n")


if __name__ == "__main__":
    main()
