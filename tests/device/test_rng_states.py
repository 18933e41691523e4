"""xoroshiro128+ states built on the host: bit-exact with numba's initialisation, uploaded intact."""

import warnings

import numpy as np
import pytest
from numba import cuda, uint64
from numba.cuda import random as cuda_random
from numba.cuda.random import init_xoroshiro128p_states_cpu

from fox_numba.device import rng
from fox_numba.device.memory import device_empty
from fox_numba.device.rng import XOROSHIRO_DTYPE, xoroshiro_states, xoroshiro_states_host
from fox_numba.device.runtime import SIMULATOR, new_stream
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


DRAWS = 16
MASK = 2**64 - 1


def reference_draws(s0: int, s1: int, n: int) -> tuple[list[int], int]:
    """xoroshiro128plus.c's next() on Python integers, every sum and shift taken modulo 2**64; (the draws,
    how many sums passed 2**64)."""
    rotl = lambda x, k: ((x << k) | (x >> (64 - k))) & MASK  # noqa: E731
    out, wraps = [], 0
    for _ in range(n):
        out.append((s0 + s1) & MASK)
        wraps += s0 + s1 > MASK
        s1 ^= s0
        s0, s1 = rotl(s0, 55) ^ s1 ^ ((s1 << 14) & MASK), rotl(s1, 36)
    return out, wraps


def draw_kernel(draw):
    @cuda.jit
    def kernel(states, out):
        for k in range(out.size):
            out[k] = uint64(draw(states, 0))

    return kernel


@pytest.mark.parametrize("wrapped, warns", [(True, False), (False, SIMULATOR)], ids=["device.rng", "numba raw"])
def test_the_draws_wrap_modulo_2_64_and_the_simulator_says_nothing(wrapped, warns):
    """The sum s0 + s1 passes 2**64 on about every other draw: the result is the algorithm's (modulo 2**64,
    as on a GPU). device/rng.py's draws raise no warning for it; numba's own do under the simulator (which
    shows this test sees the warning where it is raised: in the simulator's per-thread kernel run)."""
    stream = new_stream()
    stager = Stager(stream)
    host = xoroshiro_states_host(1, 2024)
    states = xoroshiro_states(1, 2024, stager)
    out = device_empty(DRAWS, np.uint64)
    kernel = draw_kernel(rng.xoroshiro128p_next if wrapped else cuda_random.xoroshiro128p_next)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kernel[1, 1, stream](states, out)
        stream.synchronize()
    expected, wraps = reference_draws(int(host["s0"][0]), int(host["s1"][0]), DRAWS)
    assert stager.download(out).tolist() == expected
    assert wraps > 0
    overflow = [w for w in caught if "overflow encountered" in str(w.message)]
    assert bool(overflow) == warns, [str(w.message) for w in overflow]
