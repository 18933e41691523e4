"""Every registered kernel compiles to sm_90 PTX (in a subprocess without the simulator).

The simulator checks no types, so this is the test that catches kernels the GPU compiler rejects. It
fails rather than skips under CI when the CUDA toolkit (the `cu13` extra) is missing.
"""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from numba import cuda

from fox_numba.device import registry
from fox_numba.device.runtime import SIMULATOR
from fox_numba.kernels.compile_check import EXIT_NO_TOOLKIT

FIXTURES = Path(__file__).parent / "compile_fixtures"


def run_compile_check(*extra: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0"}  # 0, not unset: unset, the package picks the simulator here
    proc = subprocess.run(
        [sys.executable, "-m", "fox_numba.kernels.compile_check", *map(str, extra)],
        capture_output=True,
        text=True,
        env=env,
        timeout=1200,
    )
    if proc.returncode == EXIT_NO_TOOLKIT:
        if os.environ.get("CI"):
            pytest.fail(f"CUDA toolkit missing under CI: {proc.stdout}{proc.stderr}")
        pytest.skip(f"no CUDA toolkit here (pip install 'fox_numba[cu13]'): {proc.stdout.strip()}")
    return proc


def test_every_package_kernel_compiles_for_sm90():
    proc = run_compile_check()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "sm_90: OK" in proc.stdout


@pytest.mark.skipif(not SIMULATOR, reason="shows what the simulator accepts; a real GPU rejects the kernel")
def test_the_simulator_runs_the_bad_kernel(monkeypatch):
    monkeypatch.setattr(registry, "KERNELS", dict(registry.KERNELS))  # keep the fixture out of the registry
    spec = importlib.util.spec_from_file_location("bad_return", FIXTURES / "bad_return.py")
    bad = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bad)
    x = cuda.to_device(np.arange(4, dtype=np.float32))
    bad.scale_and_return[1, 4](x, np.int32(4))
    np.testing.assert_array_equal(x.copy_to_host(), [0, 2, 4, 6])


def test_the_gpu_compiler_rejects_the_kernel_the_simulator_accepts():
    proc = run_compile_check(FIXTURES / "bad_return.py")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAILED" in proc.stdout and "scale_and_return" in proc.stdout
    assert "void return type" in proc.stdout


def test_kernel_missing_from_the_registry_fails():
    proc = run_compile_check(FIXTURES / "unregistered.py")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "double_in_place: not in the kernel registry" in proc.stdout
