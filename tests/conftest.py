"""Test setup: the CUDA simulator is switched on here, before anything imports numba.

Set NUMBA_ENABLE_CUDASIM=0 in the environment to run the same tests on a real GPU. A test that needs one
is marked `@pytest.mark.gpu_only("what the simulator cannot do")` and skipped under the simulator with
that reason. Test modules read `fox_numba.device.runtime.SIMULATOR`, never this file: pytest imports every
conftest.py as a module named `conftest`, so `from conftest import ...` finds whichever was loaded last.
"""

import dataclasses
import os
import sys
import zlib
from pathlib import Path

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
# On a GPU, a stage that finds the kernel cache cold fills it in a process per core (kernels/warm_cache.py): tests
# running stages side by side (pytest -n) would each start them. Tests of that fill set the variable themselves.
os.environ.setdefault("FOX_COMPILE_WORKERS", "0")
# The simulator runs each CUDA thread as a Python thread; a shorter switch interval makes barrier-heavy
# kernels about 5x faster (1e-6 races, see ../shared/TOOLCHAIN.md).
sys.setswitchinterval(1e-4)

import numpy as np
import pytest

from fox_numba.device.runtime import new_stream
from fox_numba.device.staging import Stager
from fox_numba.market import default
from fox_numba.market.store import write_store
from fox_numba.market.synthetic import generate
from fox_numba.market.synthetic_definition import load_definition

ON_SIMULATOR = os.environ["NUMBA_ENABLE_CUDASIM"] not in ("", "0")
if ON_SIMULATOR:
    import simulator_blocks

    simulator_blocks.install()  # a block runner that waits instead of spinning (tests/simulator_blocks.py)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu_only(reason): needs a real GPU; skipped under the CUDA simulator")
    config.addinivalue_line("markers", "no_gpu_only(reason): tests the path without a GPU; skipped on a real GPU")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    marker_name, why = ("gpu_only", "needs a real GPU") if ON_SIMULATOR else ("no_gpu_only", "tests the machine without a GPU")
    for item in items:
        marker = item.get_closest_marker(marker_name)
        if marker is not None:
            item.add_marker(pytest.mark.skip(reason=f"{why}: {marker.args[0]}"))


@pytest.fixture(scope="module")
def stream():
    """A stream per test module (kernels launch on an explicit stream, as inside a captured graph)."""
    return new_stream()


@pytest.fixture(scope="module")
def stager(stream):
    """Uploads and downloads through 64 KiB mapped chunks, so multi-chunk staging is exercised too."""
    return Stager(stream, chunk_bytes=1 << 16)


@pytest.fixture()
def rng(request):
    """A generator seeded by the test's name (crc32: str hashes change from one process to the next)."""
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


@pytest.fixture(scope="module")
def long_switch_interval():
    """For kernels without barriers: a longer GIL switch interval than the 1e-4 s set above stops a
    simulated block's threads from thrashing the GIL (about 5x faster, measured). Modules opt in with
    `pytestmark = pytest.mark.usefixtures("long_switch_interval")`."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(5e-3)
    yield
    sys.setswitchinterval(old)


@pytest.fixture(scope="session")
def four_day_market():
    """Four days of the default synthetic market: the smoke preset's 2 folds of 2 training + 1 validation
    days span them."""
    return generate(load_definition(default.default_definition_path()).with_overrides(days=4))


@pytest.fixture(scope="session")
def four_day_store(four_day_market, tmp_path_factory):
    """`four_day_market` as a store."""
    m = four_day_market
    return write_store(tmp_path_factory.mktemp("store") / "four.h5", m.instrument, m.days)


@pytest.fixture(scope="session")
def half_hour_store(four_day_market, tmp_path_factory):
    """`four_day_market` with a regular session of half an hour (30 bars), so a validation day is 29
    backtest steps rather than 389: the simulator pays for every one."""
    instrument = dataclasses.replace(four_day_market.instrument, session_close="10:00")
    return write_store(tmp_path_factory.mktemp("short") / "half_hour.h5", instrument, four_day_market.days)


@pytest.fixture(scope="module")
def small_synth_store(tmp_path_factory) -> Path:
    """16 days of the default synthetic market with its oracle and latent sidecars (`fox data synth`): the store of
    the tools that read the latent truth (tests/test_latent_probe.py, tests/test_feature_read.py)."""
    from typer.testing import CliRunner

    from fox_numba.cli import app

    store = tmp_path_factory.mktemp("latent") / "small.h5"
    result = CliRunner().invoke(app, ["data", "synth", "--days", "16", "--out", str(store)])
    assert result.exit_code == 0, result.output
    return store
