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
from fox_numba.kernels.compile_check import EXIT_NO_TOOLKIT, resident_blocks

FIXTURES = Path(__file__).parent / "compile_fixtures"


def run_compile_check(*extra: Path) -> subprocess.CompletedProcess[str]:
    # 0, not unset: unset, the package picks the simulator here; no kernel cache: the check compiles PTX itself and
    # would only leave an empty cache folder in the user's home
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0", "FOX_KERNEL_CACHE": "0"}
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


FIXTURE_KERNELS = ("scale_and_return", "double_in_place", "misassembled_mma", "crowded_copy", "drifting_key")


@pytest.fixture(scope="module")
def checked() -> subprocess.CompletedProcess[str]:
    """One compile check of the package and the five fixtures (each run compiles and assembles every package
    kernel, ~70 s here): exactly the fixture kernels fail, so every package kernel compiled and assembled, and every
    package kernel whose launch bounds ask for a residency gets it."""
    return run_compile_check(*(FIXTURES / f for f in ("bad_return.py", "unregistered.py", "bad_ptx.py", "crowded.py",
                                                      "key_drift.py")))


def test_every_package_kernel_compiles_for_sm90(checked):
    assert checked.returncode == 1, checked.stdout + checked.stderr
    failed = [ln for ln in checked.stdout.splitlines() if ln.startswith("FAILED")]
    assert len(failed) == 5 and "sm_90: 5 failed" in checked.stdout, checked.stdout
    assert all(any(k in ln for k in FIXTURE_KERNELS) for ln in failed)


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


def test_shared_memory_that_crowds_out_the_asked_residency_fails(checked):
    line = next(ln for ln in checked.stdout.splitlines() if "crowded_copy" in ln)
    assert line.startswith("FAILED") and "ask for 8 blocks of 128 threads per SM, 6 fit" in line, line
    assert "33792 B of shared memory" in line, line


def test_a_kernel_whose_cache_key_changes_when_compiled_fails(checked):
    """Saved under one key and looked up under another, it would be compiled again by every process."""
    line = next(ln for ln in checked.stdout.splitlines() if "drifting_key" in ln)
    assert line.startswith("FAILED") and "kernel-cache key changed when kernels were compiled" in line, line


@pytest.mark.parametrize(
    ("threads", "registers", "shared", "blocks"),
    [
        (104, 63, 29_440, 7),  # select_q_rows with stride-52 staging: shared memory holds it to 7
        (104, 63, 28_896, 8),  # its staging sized for Z = 51: 8 (registers: 4 warps x 2,048 = 8,192 a block)
        (104, 65, 28_896, 7),  # one register over 64: 2,304 a warp, 9,216 a block
        (256, 118, 17_920, 2),  # gemm 128x8: registers (3,840 a warp x 8 warps)
        (1024, 16, 0, 2),  # warps: 64 a SM
        (32, 16, 0, 32),  # the block limit
    ],
)
def test_resident_blocks_takes_the_tightest_sm90_limit(threads, registers, shared, blocks):
    assert resident_blocks(threads, registers, shared) == blocks
