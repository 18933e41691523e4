"""device/runtime.py under the simulator: the shared-array creation every `fox` process installs."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from numba import float32
from numba.cuda.simulator.kernelapi import FakeCUDAShared

from fox_numba.device.runtime import SIMULATOR, atomic_simulator_shared_arrays

pytestmark = pytest.mark.skipif(not SIMULATOR, reason="the simulator's shared arrays exist only under the simulator")


class Block:
    """The part of a simulated block FakeCUDAShared.array uses: its allocations by call site."""

    def __init__(self) -> None:
        self._allocations: dict = {}


def test_installed_once_and_one_array_per_call_site_across_threads():
    atomic_simulator_shared_arrays()  # a second install keeps the first
    assert getattr(FakeCUDAShared.array, "atomic", False)
    block, got, start = Block(), [], threading.Barrier(16)

    def thread() -> None:
        start.wait()
        got.append(FakeCUDAShared.array(block, (8,), float32))  # one source line: one array for every thread

    threads = [threading.Thread(target=thread) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 16 and all(a is got[0] for a in got) and got[0].dtype == np.float32
    assert len(block._allocations) == 1
