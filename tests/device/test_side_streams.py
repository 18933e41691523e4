"""Side streams (device/fork.py): a forked branch of a step is ordered by its fork and join, is recorded with its
lane, and is refused where a captured graph would leave it out or end before it.

Under the simulator the steps run eagerly; with NUMBA_ENABLE_CUDASIM=0 the same tests replay captured graphs with
the side branch beside the main chain.
"""

import numpy as np
import pytest

from fox_numba.device.elementwise import axpy_f32, scale_f32
from fox_numba.device.fork import SideStream
from fox_numba.device.graphs import GraphError, StepGraph
from fox_numba.device.launch import LaunchError, i32, launch_strided
from fox_numba.device.runtime import SIMULATOR, new_stream
from fox_numba.device.staging import Stager
from fox_numba.device.timing import Timings

N = 256  # one block a launch: the simulator runs each thread as a Python thread


@pytest.fixture()
def stream():
    return new_stream()


@pytest.fixture()
def stager(stream):
    return Stager(stream, chunk_bytes=1 << 14)


def seeded(seed):
    return np.random.default_rng(seed).standard_normal(N).astype(np.float32)


def forked_step(stager, stream, use_graph):
    """x *= 3 and y *= 0.5 on a side stream, beside x += 0.25 y0 on the main stream (y0 is y before the fork's
    scaling: the side must start after it), then x += y after the join."""
    x, y, y0 = (stager.upload_new(seeded(k)) for k in (1, 2, 3))
    side = SideStream()

    def body(s):
        launch_strided(axpy_f32, N, y0, np.float32(1.0), y, i32(N), stream=s)  # y0 += y, before the fork
        b = side.fork(s)
        launch_strided(scale_f32, N, y, np.float32(0.5), i32(N), stream=b)
        launch_strided(scale_f32, N, x, np.float32(3.0), i32(N), stream=s)
        launch_strided(axpy_f32, N, x, np.float32(0.25), y0, i32(N), stream=s)
        side.join(s)
        launch_strided(axpy_f32, N, x, np.float32(1.0), y, i32(N), stream=s)

    return StepGraph("forked", body, stream, use_graph=use_graph), x, y, y0


def reference(steps):
    x, y, y0 = (seeded(k).astype(np.float64) for k in (1, 2, 3))
    for _ in range(steps):
        y0 = y0 + y
        y = 0.5 * y
        x = 3.0 * x + 0.25 * y0
        x = x + y
    return x, y, y0


def test_a_forked_step_computes_the_ordered_result_and_replays_as_eager(stager, stream):
    """Three replays against the float64 recurrence (float32 rounding: 1e-5 relative, while skipping the join or
    the fork's ordering would move x by a whole y term, order 0.1), and graph replays equal eager ones bit for
    bit."""
    runs = {}
    for use_graph in (True, False):
        step, *arrays = forked_step(stager, stream, use_graph)
        for _ in range(3):
            step.replay()
        stream.synchronize()
        runs[use_graph] = [stager.download(a) for a in arrays], step.mode
        assert [r.lane for r in step.launches] == [0, 1, 0, 0, 0]
    for got, want in zip(runs[True][0], reference(3), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    for a, b in zip(runs[True][0], runs[False][0], strict=True):
        np.testing.assert_array_equal(a, b)
    assert runs[True][1] == ("eager" if SIMULATOR else "graph")


@pytest.mark.gpu_only("graphs are captured only on the GPU")
def test_fork_and_join_add_no_graph_node(stager, stream):
    step, *_ = forked_step(stager, stream, use_graph=True)
    step.replay()
    step.replay()
    assert step.mode == "graph" and step.graph_nodes == len(step.launches) == 5


def test_a_side_stream_that_was_not_forked_is_refused(stager, stream):
    x = stager.upload_new(seeded(4))
    side = SideStream()

    def body(s):
        launch_strided(scale_f32, N, x, np.float32(0.5), i32(N), stream=side.stream)

    with pytest.raises(LaunchError, match="another stream than its step's"):
        StepGraph("unforked", body, stream, use_graph=True).replay()


def test_a_launch_after_the_join_is_refused(stager, stream):
    x = stager.upload_new(seeded(5))
    side = SideStream()

    def body(s):
        b = side.fork(s)
        launch_strided(scale_f32, N, x, np.float32(0.5), i32(N), stream=b)
        side.join(s)
        launch_strided(scale_f32, N, x, np.float32(0.5), i32(N), stream=b)

    with pytest.raises(LaunchError, match="side stream 1 after its join"):
        StepGraph("late", body, stream, use_graph=True).replay()


def test_a_side_stream_left_unjoined_is_refused(stager, stream):
    x = stager.upload_new(seeded(6))
    side = SideStream()

    def body(s):
        launch_strided(scale_f32, N, x, np.float32(0.5), i32(N), stream=side.fork(s))

    with pytest.raises(GraphError, match=r"side stream\(s\) \[1\] forked and not joined"):
        StepGraph("unjoined", body, stream, use_graph=True).replay()


def test_a_launch_that_changes_lane_between_replays_is_refused(stager, stream):
    x = stager.upload_new(seeded(7))
    side = SideStream()
    on_side = [True]

    def body(s):
        b = side.fork(s)
        launch_strided(scale_f32, N, x, np.float32(0.5), i32(N), stream=b if on_side[0] else s)
        side.join(s)

    step = StepGraph("lanes", body, stream, use_graph=True)
    step.replay()
    on_side[0] = False
    with pytest.raises(GraphError, match="lane 0 where the first replay used lane 1"):
        step.replay()


def test_under_the_kernel_timer_a_fork_stays_on_the_main_stream(stream):
    """Outside a step body the per-kernel timer times each kernel alone: the side work runs on the main stream."""
    side = SideStream()
    with Timings().kernels():
        assert side.fork(stream) is stream
        side.join(stream)
    assert side.fork(stream) is side.stream
    side.join(stream)
