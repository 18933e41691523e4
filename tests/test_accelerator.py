"""GPU or simulator (accelerator.py): NUMBA_ENABLE_CUDASIM=0 on a machine whose driver reports no GPU is refused in
one line by every stage that launches kernels, instead of failing inside numba at the first launch."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fox_numba import accelerator
from fox_numba.cli import require_backend
from fox_numba.errors import FoxError
from fox_numba.kernels import warm_cache


@pytest.mark.parametrize(("setting", "gpus", "refused"), [("0", 0, True), ("", 0, True), ("0", 1, False),
                                                           ("1", 0, False)])
def test_a_gpu_asked_for_and_missing_is_named(monkeypatch, setting, gpus, refused):
    monkeypatch.setenv(accelerator.SIM_VARIABLE, setting)
    monkeypatch.setattr(accelerator, "cuda_gpu_count", lambda: gpus)
    problem = accelerator.gpu_missing()
    assert (problem is not None) == refused
    if refused:
        assert problem.startswith("NUMBA_ENABLE_CUDASIM=0 asks for a CUDA GPU and the driver reports none")
        with pytest.raises(FoxError, match="driver reports none"):
            require_backend()
        from fox_numba.device import runtime

        monkeypatch.setattr(runtime, "SIMULATOR", False)
        with pytest.raises(warm_cache.CannotWarm, match="driver reports none"):
            warm_cache.warm(1)
    else:
        require_backend()


@pytest.mark.skipif(accelerator.cuda_gpu_count() > 0, reason="tests a machine without a GPU")
@pytest.mark.parametrize("command", [["train", "--preset", "smoke"], ["collect", "--preset", "smoke"],
                                     ["evaluate", "missing.h5"], ["cache", "warm"]], ids=" ".join)
def test_the_cli_refuses_in_one_line(command):
    env = {**os.environ, accelerator.SIM_VARIABLE: "0"}
    proc = subprocess.run([sys.executable, "-m", "fox_numba", *command], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode in (1, 2) and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "fox: error: NUMBA_ENABLE_CUDASIM=0 asks for a CUDA GPU and the driver reports none; unset it to run the "
        "kernels under numba's CUDA simulator"]
