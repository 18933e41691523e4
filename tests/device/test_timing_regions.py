"""Timings: named regions accumulate count/total/min/max (CUDA events on the GPU, wall clock here)."""

import time

import numpy as np
import pytest

from fox_numba.device.elementwise import fill_f32, scale_f32
from fox_numba.device.graphs import StepGraph
from fox_numba.device.launch import i32, launch
from fox_numba.device.memory import device_empty
from fox_numba.device.runtime import SIMULATOR, new_stream
from fox_numba.device.timing import Stat, Timings


def test_stat_accumulates():
    s = Stat()
    for ms in (3.0, 1.0, 2.0):
        s.add(ms)
    assert (s.count, s.total_ms, s.min_ms, s.max_ms, s.mean_ms) == (3, 6.0, 1.0, 3.0, 2.0)


@pytest.mark.skipif(not SIMULATOR, reason="wall-clock regions are what the simulator uses")
def test_wall_clock_regions_measure_the_block():
    stream = new_stream()
    timings = Timings()
    assert not timings.use_events
    for delay in (0.002, 0.02):
        with timings.region("sleep", stream):
            time.sleep(delay)
    s = timings.stats()["sleep"]
    assert s.count == 2 and 2.0 <= s.min_ms < 20.0 <= s.max_ms < 200.0
    assert "| sleep | 2 |" in timings.markdown()
    with pytest.raises(ValueError, match="no timing events"):
        Timings(use_events=True)


def test_kernels_inside_a_captured_step_are_not_timed_but_the_replay_region_is():
    stream = new_stream()
    x = device_empty(64, np.float32)

    def body(s):
        launch(fill_f32, 64, x, np.float32(1.0), i32(64), stream=s)
        launch(scale_f32, 64, x, np.float32(2.0), i32(64), stream=s)

    step = StepGraph("step", body, stream, use_graph=True)
    timings = Timings()
    with timings.kernels():
        for _ in range(3):
            with timings.region("step", stream):
                step.replay()
    stats = timings.stats()
    assert stats["step"].count == 3
    expected_kernel_count = 3 if SIMULATOR else 1  # on the GPU replays 2 and 3 are graph launches
    assert stats["elementwise.fill_f32"].count == expected_kernel_count


def test_kernels_by_grid_get_a_row_per_launch_shape():
    stream = new_stream()
    x = device_empty(600, np.float32)
    timings = Timings(by_grid=True)
    with timings.kernels():
        for n in (64, 600, 64):
            launch(fill_f32, n, x, np.float32(1.0), i32(n), stream=stream)
    stats = timings.stats()
    assert {name: s.count for name, s in stats.items()} == {"elementwise.fill_f32 1": 2, "elementwise.fill_f32 3": 1}


@pytest.mark.gpu_only("timing events do not exist in the simulator")
def test_event_regions_time_gpu_work():
    stream = new_stream()
    n = 1 << 24
    x = device_empty(n, np.float32)
    timings = Timings()
    assert timings.use_events
    for _ in range(5):
        with timings.region("fill_16M", stream):
            launch(fill_f32, n, x, np.float32(1.0), i32(n), stream=stream)
    s = timings.stats()["fill_16M"]
    assert s.count == 5 and 0.0 < s.min_ms <= s.max_ms < 100.0
