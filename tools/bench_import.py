"""Time `fox data import` on folders of generated DBN+zstd files, against the rate of the decoders alone.

    python tools/gen_dbn.py /tmp/dbn_1m --rows 1000000 --days 3
    python tools/bench_import.py /tmp/dbn_0.1m /tmp/dbn_1m --out tools/results/import_scale_cpu.md [--ray]

Per folder:
- import: `fox data import FOLDER --out STORE` in a child process (as a user runs it): wall time, records/s
  (MBP-10 + trades records in the files), peak RSS of that process (`os.wait4`), store size; with `--ray` also
  `fox data import FOLDER --out STORE --ray` (a local Ray cluster started by the command, its start included; the
  peak RSS is the driver's, the Ray workers' is not counted);
- databento-dbn's own decode rate: `DBNDecoder(compression=ZSTD)` fed 4 MiB chunks, records decoded to its
  Python objects, one core; the ratio import / decoder;
- zstd alone: `zstandard` decompressing the files in 4 MiB blocks, the first step of the importer's block path
  (no numpy work, no validation, no store).
Writes OUT (markdown, with the command and the machine).
"""

from __future__ import annotations

import argparse
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
import numpy as np
import zstandard

from fox_numba.market.databento import find_files
from fox_numba.market.store import store_bytes

CHUNK = 1 << 22


def run_import(folder: Path, store: Path, *options: str) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of `fox data import folder --out store [options]` in a child process."""
    command = [sys.executable, "-m", "fox_numba", "data", "import", str(folder), "--out", str(store), *options]
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"import of {folder} failed: {child.stderr.read().decode()}")
    return wall, usage.ru_maxrss / 1024


def decoder_rate(paths: list[Path]) -> tuple[dict[Path, int], float]:
    """Records per file and seconds for databento-dbn to decode `paths` to its record objects."""
    n, seconds = {}, 0.0
    for path in paths:
        raw = path.read_bytes()
        start = time.perf_counter()
        decoder = dbn.DBNDecoder(compression=dbn.Compression.ZSTD)
        n[path] = 0
        for k in range(0, len(raw), CHUNK):
            decoder.write(raw[k : k + CHUNK])
            n[path] += sum(1 for r in decoder.decode() if not isinstance(r, dbn.Metadata))
        seconds += time.perf_counter() - start
    return n, seconds


def zstd_seconds(paths: list[Path]) -> float:
    """Seconds for `zstandard` to decompress `paths` in `CHUNK` blocks."""
    seconds = 0.0
    for path in paths:
        raw = path.read_bytes()
        start = time.perf_counter()
        reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
        while reader.read(CHUNK):
            pass
        seconds += time.perf_counter() - start
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", type=Path, nargs="+", help="folders written by tools/gen_dbn.py")
    parser.add_argument("--out", type=Path, required=True, help="markdown file to write")
    parser.add_argument("--ray", action="store_true", help="also time the import with --ray (a local cluster)")
    args = parser.parse_args()
    rows = []
    for folder in args.folders:
        paths = find_files(folder)
        with tempfile.TemporaryDirectory(dir=folder.parent) as tmp:
            wall, rss = run_import(folder, Path(tmp) / "store.h5")
            size = store_bytes(Path(tmp) / "store.h5") / 1e6
            ray = run_import(folder, Path(tmp) / "ray.h5", "--ray") if args.ray else None
        per_file, t_all = decoder_rate(paths)
        n_all, mbp = sum(per_file.values()), [n for p, n in per_file.items() if ".mbp-10." in p.name]
        rows.append((sum(mbp) // len(mbp), n_all, wall, rss, size, n_all / t_all, n_all / zstd_seconds(paths), ray))
        print(f"{folder}: {n_all:,} records, import {wall:.1f} s, {n_all / wall / 1e3:,.0f} k rec/s, {rss:,.0f} MiB"
              + (f"; --ray {ray[0]:.1f} s, {ray[1]:,.0f} MiB" if ray else ""))
    lines = [
        "| MBP-10 rows a day | records | import | import rec/s | peak RSS | store | decoder rec/s | import / decoder "
        "| zstd alone rec/s |" + (" import --ray | --ray rec/s | --ray driver RSS |" if args.ray else ""),
        "|" + " ---: |" * (12 if args.ray else 9),
    ]
    for per_day, n_all, wall, rss, size, r_all, r_zstd, ray in rows:
        line = (
            f"| {per_day:,} | {n_all:,} | {wall:.1f} s | {n_all / wall / 1e3:,.0f} k | {rss:,.0f} MiB | {size:,.0f} MB "
            f"| {r_all / 1e3:,.0f} k | {n_all / wall / r_all:.2f} | {r_zstd / 1e3:,.0f} k |"
        )
        if ray:
            line += f" {ray[0]:.1f} s | {n_all / ray[0] / 1e3:,.0f} k | {ray[1]:,.0f} MiB |"
        lines.append(line)
    header = [
        f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on {platform.node()}: {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, numpy {np.__version__}, databento-dbn {version('databento-dbn')}, zstandard "
        f"{version('zstandard')}.",
        "",
        "    " + " ".join(["python tools/bench_import.py", *map(str, args.folders), "--out", str(args.out)]
                          + (["--ray"] if args.ray else [])),
        "",
    ]
    args.out.write_text("\n".join(header + lines) + "\n")


if __name__ == "__main__":
    main()
