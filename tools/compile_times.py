"""Time numba-cuda's compile of registered kernels to PTX, no GPU needed: what a run without the kernel cache pays.

    NUMBA_ENABLE_CUDASIM=0 FOX_KERNEL_CACHE=0 python tools/compile_times.py --out tools/results/compile_times_cpu \
        [--cc 9.0] [KERNEL ...]

Compiles each named kernel (its registered signatures, with its launch bounds, as the compile check does), or every
registered kernel, in the order given and in one process, as a run compiles them: a kernel whose device functions
an earlier one typed already pays less. Writes OUT.md (a row per kernel, seconds) and OUT.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fox_numba.io import atomic_write_text  # noqa: E402
from fox_numba.kernels.compile_check import _prepare_compiler, import_package  # noqa: E402


def compile_seconds(names: list[str], cc: tuple[int, int]) -> dict[str, float]:
    """Seconds to compile each kernel's signatures to PTX, in order."""
    from numba import cuda

    from fox_numba.device.registry import KERNELS

    seconds = {}
    for name in names:
        spec = KERNELS[name]
        t0 = time.perf_counter()
        for sig in spec.signatures:
            cuda.compile_ptx(spec.py_func, sig, cc=cc, launch_bounds=spec.kernel.targetoptions.get("launch_bounds"))
        seconds[name] = time.perf_counter() - t0
    return seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kernels", nargs="*", help="registered kernel names (default: every one)")
    ap.add_argument("--out", type=Path, required=True, help="output path without suffix (.md and .json written)")
    ap.add_argument("--cc", default="9.0", help="compute capability to compile for")
    args = ap.parse_args()
    cc = tuple(int(x) for x in args.cc.split("."))
    import_package()
    problem = _prepare_compiler(cc)
    if problem is not None:
        print(f"no CUDA toolkit: {problem}", file=sys.stderr)
        return 3
    from fox_numba.device.registry import KERNELS

    names = args.kernels or sorted(KERNELS)
    seconds = compile_seconds(names, cc)
    command = "NUMBA_ENABLE_CUDASIM=0 FOX_KERNEL_CACHE=0 python " + " ".join(sys.argv)
    rows = [f"| `{n.removeprefix('fox_numba.kernels.')}` | {s:.2f} |" for n, s in seconds.items()]
    md = [f"# Kernel compile times to sm_{cc[0]}{cc[1]} PTX", "", f"Command: `{command}`", "",
          f"Date (UTC): {datetime.now(UTC):%Y-%m-%d %H:%M}; {platform.processor() or platform.machine()}, "
          f"Python {platform.python_version()}; one process, in the order below.", "",
          "| kernel | seconds |", "| --- | ---: |", *rows, f"| **all** | **{sum(seconds.values()):.2f}** |", ""]
    atomic_write_text(args.out.with_suffix(".md"), "\n".join(md))
    atomic_write_text(args.out.with_suffix(".json"), json.dumps({"command": command, "seconds": seconds}, indent=1))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
