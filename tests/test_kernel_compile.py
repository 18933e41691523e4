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


@pytest.fixture(scope="module")
def checked() -> subprocess.CompletedProcess[str]:
    """One compile check of the package and the three fixtures (each run compiles and assembles every package
    kernel, ~70 s here): exactly the three fixture kernels fail, so every package kernel compiled and assembled."""
    return run_compile_check(FIXTURES / "bad_return.py", FIXTURES / "unregistered.py", FIXTURES / "bad_ptx.py")


def test_every_package_kernel_compiles_for_sm90(checked):
    assert checked.returncode == 1, checked.stdout + checked.stderr
    failed = [ln for ln in checked.stdout.splitlines() if ln.startswith("FAILED")]
    assert len(failed) == 3 and "sm_90: 3 failed" in checked.stdout, checked.stdout
    assert all(any(k in ln for k in ("scale_and_return", "double_in_place", "misassembled_mma")) for ln in failed)


@pytest.mark.skipif(not SIMULATOR, reason="shows what the simulator accepts; a real GPU rejects the kernel")
def test_the_simulator_runs_the_bad_kernel(monkeypatch):
    monkeypatch.setattr(registry, "KERNELS", dict(registry.KERNELS))  # keep the fixture out of the registry
    spec = importlib.util.spec_from_file_location("bad_return", FIXTURES / "bad_return.py")
    bad = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bad)
    x = cuda.to_device(np.arange(4, dtype=np.float32))
    bad.scale_and_return[1, 4](x, np.int32(4))
    np.testing.assert_array_equal(x.copy_to_host(), [0, 2, 4, 6])


def test_the_gpu_compiler_rejects_the_kernel_the_simulator_accepts(checked):
    line = next(ln for ln in checked.stdout.splitlines() if "scale_and_return" in ln)
    assert line.startswith("FAILED") and "void return type" in line


def test_kernel_missing_from_the_registry_fails(checked):
    line = next(ln for ln in checked.stdout.splitlines() if "double_in_place" in ln)
    assert line.startswith("FAILED")
    assert line.endswith("double_in_place: not in the kernel registry (add @register(...))")


def test_ptxas_refuses_the_inline_ptx_nvvm_passed(checked):
    """The fixture's mma names an accumulator type PTX does not define: NVVM emits it, the assembly refuses it."""
    line = next(ln for ln in checked.stdout.splitlines() if "misassembled_mma" in ln)
    assert line.startswith("FAILED") and "ptxas" in line and "mma" in line, line
