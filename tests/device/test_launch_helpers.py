"""Launch helpers: grids from counts, explicit streams, refusal of host arrays and unregistered types."""

import numpy as np
import pytest
from numba import cuda, float32

from fox_numba.device.elementwise import fill_f32, scale_f32
from fox_numba.device.launch import (
    LaunchError,
    LaunchTrace,
    grid_1d,
    i32,
    launch,
    launch_2d,
    launch_rows,
    tracing,
)
from fox_numba.device.memory import device_empty
from fox_numba.device.runtime import SIMULATOR, new_stream
from fox_numba.device.staging import Stager
from fox_numba.device.timing import Timings


@pytest.fixture(scope="module")
def stager(stream):
    return Stager(stream, chunk_bytes=1024)


@cuda.jit
def unregistered_double(x, n):
    i = cuda.grid(1)
    if i < n:
        x[i] = x[i] * float32(2.0)


def test_grid_covers_the_elements():
    assert [grid_1d(n, 256) for n in (1, 255, 256, 257, 1000)] == [1, 1, 1, 2, 4]
    with pytest.raises(ValueError, match="nothing to launch"):
        grid_1d(0)


def test_launch_processes_exactly_n_elements(stream, stager):
    rng = np.random.default_rng(0)
    values = rng.standard_normal(300).astype(np.float32)
    x = stager.upload_new(values)
    launch(fill_f32, 257, x, np.float32(-3.5), i32(257), stream=stream, block=64)
    expected = values.copy()
    expected[:257] = -3.5
    np.testing.assert_array_equal(stager.download(x), expected)


def test_launch_rows_is_one_block_per_row(stream, stager):
    """3 blocks of 8 threads, as launched; fill_f32 strides over the grid, so its 24 threads write all 40 values and
    the 24 values past them stay."""
    x = stager.upload_new(np.arange(1, 65, dtype=np.float32))
    trace = LaunchTrace(stream)
    with tracing(trace):
        launch_rows(fill_f32, 3, 8, x, np.float32(0.0), i32(40), stream=stream)
    assert [(r.grid, r.block) for r in trace.launches] == [((3,), (8,))]
    expected = np.arange(1, 65, dtype=np.float32)
    expected[:40] = 0.0
    np.testing.assert_array_equal(stager.download(x), expected)
    with pytest.raises(ValueError):
        launch_rows(fill_f32, 0, 8, x, np.float32(0.0), i32(40), stream=stream)


def test_launch_shapes_as_a_trace_records_them(stream):
    x = device_empty(64, np.float32)
    trace = LaunchTrace(stream)
    with tracing(trace):
        launch(fill_f32, 1000, x, np.float32(1.0), i32(64), stream=stream)
        launch_2d(fill_f32, 70, 9, x, np.float32(1.0), i32(64), stream=stream)
        launch_2d(fill_f32, 5, 3, x, np.float32(1.0), i32(64), stream=stream, block=(4, 2))
        launch_rows(scale_f32, 1, 1, x, np.float32(2.0), i32(1), stream=stream)
    shapes = [(r.kernel.rsplit(".", 1)[1], r.grid, r.block) for r in trace.launches]
    assert shapes == [
        ("fill_f32", (4,), (256,)),
        ("fill_f32", (3, 2), (32, 8)),
        ("fill_f32", (2, 2), (4, 2)),
        ("scale_f32", (1,), (1,)),
    ]
    assert len(trace.arrays) == 4 and all(a is x for a in trace.arrays)
    with pytest.raises(ValueError, match="blocks in y"):
        launch_2d(fill_f32, 1, 70000 * 8, x, np.float32(1.0), i32(64), stream=stream)


def test_plain_numpy_arrays_are_refused(stream):
    with pytest.raises(LaunchError, match="plain numpy array"):
        launch(fill_f32, 4, np.zeros(4, np.float32), np.float32(1.0), i32(4), stream=stream)


def test_types_outside_the_registered_signatures_are_refused(stream):
    x = device_empty(4, np.float32)
    with pytest.raises(LaunchError, match="match no registered signature"):
        launch(fill_f32, 4, x, 1.0, i32(4), stream=stream)  # a Python float is float64 on the GPU
    with pytest.raises(LaunchError, match="match no registered signature"):
        launch(fill_f32, 4, x, np.float32(1.0), 4, stream=stream)  # a Python int is int64
    with pytest.raises(LaunchError, match="match no registered signature"):
        launch(fill_f32, 4, device_empty(4, np.float64), np.float32(1.0), i32(4), stream=stream)
    with pytest.raises(LaunchError, match="not in the kernel registry"):
        launch(unregistered_double, 4, x, i32(4), stream=stream)


@pytest.mark.skipif(not SIMULATOR, reason="the exact (layout) check runs where nothing is compiled")
def test_a_strided_view_is_refused_in_the_simulator(stream):
    x = device_empty(8, np.float32)
    with pytest.raises(LaunchError, match="array\\(float32, 1d, A\\)"):
        launch(fill_f32, 4, x[::2], np.float32(1.0), i32(4), stream=stream)


def test_stream_is_required_and_traces_stay_on_their_stream(stream):
    x = device_empty(4, np.float32)
    with pytest.raises(LaunchError, match="explicit stream"):
        launch(fill_f32, 4, x, np.float32(1.0), i32(4), stream=None)
    with tracing(LaunchTrace(stream)):
        with pytest.raises(LaunchError, match="another stream"):
            launch(fill_f32, 4, x, np.float32(1.0), i32(4), stream=new_stream())
        with pytest.raises(LaunchError, match="do not nest"), tracing(LaunchTrace(stream)):
            pass


def test_i32_refuses_counts_int32_cannot_hold():
    assert i32(2**31 - 1) == 2**31 - 1 and i32(0).dtype == np.int32
    with pytest.raises(ValueError):
        i32(2**31)
    with pytest.raises(ValueError):
        i32(-1)


def test_kernel_timer_times_each_launch_by_name(stream):
    x = device_empty(16, np.float32)
    timings = Timings()
    with timings.kernels():
        for _ in range(3):
            launch(fill_f32, 16, x, np.float32(1.0), i32(16), stream=stream)
        launch(scale_f32, 16, x, np.float32(2.0), i32(16), stream=stream)
    launch(scale_f32, 16, x, np.float32(2.0), i32(16), stream=stream)  # outside: not timed
    stats = timings.stats()
    assert set(stats) == {"elementwise.fill_f32", "elementwise.scale_f32"}
    assert stats["elementwise.fill_f32"].count == 3 and stats["elementwise.scale_f32"].count == 1
