"""Test setup: the CUDA simulator is switched on here, before anything imports numba.

Set NUMBA_ENABLE_CUDASIM=0 in the environment to run the same tests on a real GPU; tests that need one
are marked `gpu_only` and skipped under the simulator with the reason.
"""

import os
import sys

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
# The simulator runs each CUDA thread as a Python thread; a shorter switch interval makes barrier-heavy
# kernels about 5x faster (1e-6 races, see TOOLCHAIN.md).
sys.setswitchinterval(1e-4)

import pytest  # noqa: E402

ON_SIMULATOR = os.environ["NUMBA_ENABLE_CUDASIM"] not in ("", "0")


def gpu_only(reason: str) -> pytest.MarkDecorator:
    """Skip a test under the simulator, saying what the simulator cannot do that the test needs."""
    return pytest.mark.skipif(ON_SIMULATOR, reason=f"needs a real GPU: {reason}")
