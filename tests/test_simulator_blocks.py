"""tests/simulator_blocks.py: installed for this numba-cuda, and a barrier kernel still computes what it must."""

import numpy as np
import pytest
import simulator_blocks
from numba import cuda

from fox_numba.device.runtime import SIMULATOR

pytestmark = pytest.mark.skipif(not SIMULATOR, reason="the simulator's block runner")


def test_the_waiting_runner_is_installed():
    from numba.cuda.simulator import kernel

    assert kernel.BlockManager.run is simulator_blocks.run


@cuda.jit
def _reverse_through_shared(x, out):
    buf = cuda.shared.array(64, np.float64)
    i = cuda.threadIdx.x
    buf[i] = x[i]
    cuda.syncthreads()
    out[i] = buf[63 - i] * 2.0
    cuda.syncthreads()
    buf[i] = out[i] + 1.0
    cuda.syncthreads()
    out[i] += buf[(i + 1) % 64]


def test_barriers_order_the_blocks_threads():
    """Each of three barriers must hold every thread until all have written: out[i] = 2 x[63 - i] + 2 x[62 - i] + 1
    (index mod 64) on seeded random x, every element."""
    x = np.random.default_rng(5).standard_normal(64)
    out = np.zeros(64)
    _reverse_through_shared[1, 64](x, out)
    i = np.arange(64)
    np.testing.assert_array_equal(out, 2.0 * x[63 - i] + (2.0 * x[63 - (i + 1) % 64] + 1.0))


def test_an_exception_in_a_thread_reaches_the_caller():
    @cuda.jit
    def fails(out):
        if cuda.threadIdx.x == 3:
            out[100] = 1.0  # out of bounds: the simulator raises IndexError in that thread
        cuda.syncthreads()

    with pytest.raises(IndexError):
        fails[1, 8](np.zeros(8))
