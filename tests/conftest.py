"""Test setup: the CUDA simulator is switched on here, before anything imports numba.

Set NUMBA_ENABLE_CUDASIM=0 in the environment to run the same tests on a real GPU. A test that needs one
is marked `@pytest.mark.gpu_only("what the simulator cannot do")` and skipped under the simulator with
that reason. Test modules read `fox_numba.device.runtime.SIMULATOR`, never this file: pytest imports every
conftest.py as a module named `conftest`, so `from conftest import ...` finds whichever was loaded last.
"""

import os
import sys

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
# The simulator runs each CUDA thread as a Python thread; a shorter switch interval makes barrier-heavy
# kernels about 5x faster (1e-6 races, see TOOLCHAIN.md).
sys.setswitchinterval(1e-4)

import pytest  # noqa: E402

ON_SIMULATOR = os.environ["NUMBA_ENABLE_CUDASIM"] not in ("", "0")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu_only(reason): needs a real GPU; skipped under the CUDA simulator")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if not ON_SIMULATOR:
        return
    for item in items:
        marker = item.get_closest_marker("gpu_only")
        if marker is not None:
            item.add_marker(pytest.mark.skip(reason=f"needs a real GPU: {marker.args[0]}"))
