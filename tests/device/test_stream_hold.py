"""The stream hold of eager kernel timing: its busy kernel against a numpy LCG, and what it removes."""

import numpy as np
import pytest

from fox_numba.device.elementwise import fill_f32
from fox_numba.device.hold import StreamHold, busy_lcg
from fox_numba.device.launch import i32, launch, launch_strided
from fox_numba.device.memory import device_empty
from fox_numba.device.runtime import new_stream
from fox_numba.device.timing import Stat, Timings


def lcg64(x: int, iters: int) -> int:
    """The same LCG in Python integers, reduced mod 2^32 at every round."""
    for _ in range(iters):
        x = (1664525 * x + 1013904223) % 2**32
    return x


@pytest.mark.parametrize("iters", [1, 37, 500])
def test_busy_lcg_matches_the_integer_reference(stager, stream, rng, iters):
    start = rng.integers(1, 2**32, size=1, dtype=np.uint64).astype(np.uint32)
    x = stager.upload_new(start)
    launch(busy_lcg, 1, x, i32(iters), stream=stream)
    assert int(stager.download(x)[0]) == lcg64(int(start[0]), iters) != int(start[0])


def test_merge_adds_counts_totals_and_extremes():
    a, b = Timings(use_events=False), Timings(use_events=False)
    a._stats["k"], b._stats["k"], b._stats["j"] = Stat(2, 3.0, 1.0, 2.0), Stat(1, 5.0, 5.0, 5.0), Stat(1, 1.0, 1.0, 1.0)
    a.merge(b)
    got = a.stats()
    assert (got["k"].count, got["k"].total_ms, got["k"].min_ms, got["k"].max_ms) == (3, 8.0, 1.0, 5.0)
    assert got["j"].count == 1


def test_timed_times_every_launch_of_the_body():
    stream, x = new_stream(), device_empty(64, np.float32)
    timings = Timings()

    def body(s):
        for _ in range(3):
            launch_strided(fill_f32, 64, x, np.float32(1.0), i32(64), stream=s)

    hold = StreamHold(stream, iters=1 << 10)
    for _ in range(2):
        hold.timed(body, timings)
    assert timings.stats()["elementwise.fill_f32"].count == 6


@pytest.mark.gpu_only("timing events do not exist in the simulator")
def test_a_held_stream_times_the_kernel_not_its_launch():
    """A 64-element fill runs in a few microseconds; timed on an idle stream its event pair also holds the
    host's launch (numba's ~0.05-0.2 ms). Behind the hold the mean is the kernel's, under 20 us, and at
    most half the idle-stream figure, which a hold that did nothing could not reach."""
    stream, x = new_stream(), device_empty(64, np.float32)

    def body(s):
        for _ in range(20):
            launch_strided(fill_f32, 64, x, np.float32(1.0), i32(64), stream=s)

    idle, held = Timings(), Timings()
    body(stream)  # compiled and loaded
    stream.synchronize()
    with idle.kernels():
        body(stream)
    StreamHold(stream).timed(body, held)
    idle_us = idle.stats()["elementwise.fill_f32"].mean_ms * 1e3
    held_us = held.stats()["elementwise.fill_f32"].mean_ms * 1e3
    assert held_us < 20.0 and held_us <= 0.5 * idle_us, (held_us, idle_us)
