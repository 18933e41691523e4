"""tools/compile_times.py on two small kernels, in a subprocess without the simulator (its compiler needs
NUMBA_ENABLE_CUDASIM=0, read once per process): a row per kernel in the order given, the total, the command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[1] / "tools" / "compile_times.py"
KERNELS = ["fox_numba.device.elementwise.fill_u32", "fox_numba.device.elementwise.axpy_f32"]


def test_a_row_per_kernel_in_order_with_the_total(tmp_path):
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0", "FOX_KERNEL_CACHE": "0"}
    proc = subprocess.run([sys.executable, str(TOOL), "--out", str(tmp_path / "c"), *KERNELS], capture_output=True,
                          text=True, env=env, timeout=600)
    if proc.returncode == 3:
        if os.environ.get("CI"):
            pytest.fail(f"CUDA toolkit missing under CI: {proc.stderr}")
        pytest.skip(f"no CUDA toolkit here (pip install 'fox_numba[cu13]'): {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    seconds = json.loads((tmp_path / "c.json").read_text())["seconds"]
    assert list(seconds) == KERNELS and all(0 < s < 60 for s in seconds.values())
    text = (tmp_path / "c.md").read_text()
    rows = [ln for ln in text.splitlines() if ln.startswith("| `")]
    assert [r.split("`")[1] for r in rows] == KERNELS  # fox_numba.kernels. is cut from names, not other modules'
    assert f"| **all** | **{sum(seconds.values()):.2f}** |" in text and "tools/compile_times.py --out" in text
