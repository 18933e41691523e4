"""Time `fox data import` on folders of generated DBN+zstd files, against the rate of the decoder alone.

    python tools/gen_dbn.py /tmp/dbn_1m --rows 1000000 --days 3
    python tools/bench_import.py /tmp/dbn_0.1m /tmp/dbn_1m --out tools/results/import_scale_cpu.md

Per folder:
- import: `fox data import FOLDER --out STORE` in a child process (as a user runs it): wall time, records/s
  (MBP-10 + trades records in the files), peak RSS of that process (`os.wait4`), store size;
- databento-dbn's own decode rate: `DBNDecoder(compression=ZSTD)` fed 4 MiB chunks, records decoded to its
  Python objects (what the importer pays before any numpy work), one core; the ratio import / decoder;
- where the optional `zstandard` module is importable: the rate of the block path issue 22 proposes,
  decompressed 4 MiB blocks viewed as numpy records (`databento.RECORD_FIELDS`) and split into the store's
  columns, with no Python object per record (a prototype figure: the importer does not use it).
Writes OUT (markdown, with the command and the machine).
"""

from __future__ import annotations

import argparse
import importlib.util
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

from fox_numba.market.databento import RECORD_FIELDS, find_files, read_header
from fox_numba.market.validate import BOOK_FIELDS

CHUNK = 1 << 22


def run_import(folder: Path, store: Path) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of `fox data import folder --out store` in a child process."""
    command = [sys.executable, "-m", "fox_numba", "data", "import", str(folder), "--out", str(store)]
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"import of {folder} failed: {child.stderr.read().decode()}")
    return wall, usage.ru_maxrss / 1024


def decoder_rate(paths: list[Path]) -> tuple[int, float]:
    """Records and seconds for databento-dbn to decode `paths` to its record objects."""
    n, seconds = 0, 0.0
    for path in paths:
        raw = path.read_bytes()
        start = time.perf_counter()
        decoder = dbn.DBNDecoder(compression=dbn.Compression.ZSTD)
        for k in range(0, len(raw), CHUNK):
            decoder.write(raw[k : k + CHUNK])
            n += sum(1 for r in decoder.decode() if not isinstance(r, dbn.Metadata))
        seconds += time.perf_counter() - start
    return n, seconds


def block_rate(paths: list[Path]) -> tuple[int, float]:
    """Records and seconds to decompress `paths` in blocks, view them as numpy records and split the columns."""
    import zstandard

    n, seconds = 0, 0.0
    for path in paths:
        f = read_header(path)
        dtype = np.dtype(RECORD_FIELDS[f.schema])
        start = time.perf_counter()
        with path.open("rb") as fh, zstandard.ZstdDecompressor().stream_reader(fh, read_across_frames=True) as z:
            head = z.read(8)
            z.read(int.from_bytes(head[4:8], "little"))
            rest = b""
            while block := z.read(CHUNK):
                data = rest + block
                whole = len(data) // dtype.itemsize * dtype.itemsize
                rec = np.frombuffer(data, dtype=dtype, count=whole // dtype.itemsize)
                rest = data[whole:]
                rec = rec[rec["instrument_id"] == rec["instrument_id"][0]]
                if f.schema == "mbp10":
                    [np.ascontiguousarray(rec["levels"][c]) for c in BOOK_FIELDS]
                n += rec.size
        seconds += time.perf_counter() - start
    return n, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", type=Path, nargs="+", help="folders written by tools/gen_dbn.py")
    parser.add_argument("--out", type=Path, required=True, help="markdown file to write")
    args = parser.parse_args()
    has_block = importlib.util.find_spec("zstandard") is not None
    rows = []
    for folder in args.folders:
        paths = find_files(folder)
        mbp = [p for p in paths if ".mbp-10." in p.name]
        with tempfile.TemporaryDirectory() as tmp:
            store = Path(tmp) / "store.h5"
            wall, rss = run_import(folder, store)
            size = store.stat().st_size / 1e6
        n_mbp, t_mbp = decoder_rate(mbp)
        n_all, t_all = decoder_rate(paths)
        block = block_rate(mbp) if has_block else None
        rows.append((folder, n_mbp // len(mbp), n_all, wall, rss, size, n_mbp / t_mbp, n_all / t_all, block))
        print(f"{folder}: {n_all:,} records, import {wall:.1f} s, {n_all / wall / 1e3:,.0f} k rec/s, {rss:,.0f} MiB")
    lines = [
        "# `fox data import` at scale, CPU",
        "",
        f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on {platform.node()}: {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, numpy {np.__version__}, databento-dbn {version('databento-dbn')}.",
        "",
        "    " + " ".join(["python tools/bench_import.py", *map(str, args.folders), "--out", str(args.out)]),
        "",
        "Files from `python tools/gen_dbn.py FOLDER --rows ROWS --days 3` (3 trading days of ROWS MBP-10 records",
        "and ROWS/4 trades each, one file per schema and day). Records: MBP-10 + trades in the files. Import: a",
        "child process running `fox data import FOLDER --out STORE` (Python start and imports included); peak RSS",
        "is that process's. Decoder: databento-dbn decoding the same files to its record objects, one core.",
        "",
        "| MBP-10 rows a day | records | import | import rec/s | peak RSS | store | decoder rec/s (MBP-10) "
        "| decoder rec/s (all) | import / decoder |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for _, per_day, n_all, wall, rss, size, r_mbp, r_all, _ in rows:
        lines.append(
            f"| {per_day:,} | {n_all:,} | {wall:.1f} s | {n_all / wall / 1e3:,.0f} k | {rss:,.0f} MiB | {size:,.0f} MB "
            f"| {r_mbp / 1e3:,.0f} k | {r_all / 1e3:,.0f} k | {n_all / wall / r_all:.2f} |"
        )
    if has_block:
        lines += [
            "",
            "Prototype of the block path (not what the importer runs): `zstandard` decompressing 4 MiB blocks, viewed",
            "as numpy records and split into the store's book columns, MBP-10 files only:",
            "",
            "| MBP-10 rows a day | block path rec/s | decoder rec/s | block / decoder |",
            "| ---: | ---: | ---: | ---: |",
        ]
        for _, per_day, _, _, _, _, r_mbp, _, (n_b, t_b) in rows:
            lines.append(f"| {per_day:,} | {n_b / t_b / 1e3:,.0f} k | {r_mbp / 1e3:,.0f} k | {n_b / t_b / r_mbp:.1f} |")
    args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
