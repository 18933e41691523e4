"""xoroshiro128+ states built on the host: bit-exact with numba's initialisation, uploaded intact."""

import warnings

import numpy as np
import pytest
from numba.cuda.random import init_xoroshiro128p_states_cpu

from fox_numba.device.rng import XOROSHIRO_DTYPE, xoroshiro_states, xoroshiro_states_host
from fox_numba.device.runtime import new_stream
from fox_numba.device.staging import Stager


@pytest.mark.parametrize("seed, start", [(0, 0), (12345, 3), (2**62 + 99, 1)])
def test_states_match_numba_bit_for_bit(seed, start):
    ours = xoroshiro_states_host(4, seed, start)
    theirs = np.empty(4, XOROSHIRO_DTYPE)
    with warnings.catch_warnings():  # numba's host init falls back to object mode under the simulator
        warnings.simplefilter("ignore")
        init_xoroshiro128p_states_cpu(theirs, seed, start)
    np.testing.assert_array_equal(ours["s0"], theirs["s0"])
    np.testing.assert_array_equal(ours["s1"], theirs["s1"])
    assert len(set(ours["s0"].tolist())) == 4


def test_subsequence_start_continues_the_same_sequence():
    full = xoroshiro_states_host(10, 77)
    np.testing.assert_array_equal(xoroshiro_states_host(4, 77, subsequence_start=6), full[6:])


def test_upload_keeps_every_state():
    stream = new_stream()
    stager = Stager(stream, chunk_bytes=512)
    host = xoroshiro_states_host(300, 9)
    dev = xoroshiro_states(300, 9, stager)
    assert dev.dtype == XOROSHIRO_DTYPE
    np.testing.assert_array_equal(stager.download(dev), host)
    with pytest.raises(ValueError):
        xoroshiro_states_host(0, 1)
