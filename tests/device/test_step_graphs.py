"""StepGraph: capture vs eager equality, per-step scalars seen under replay, refusal of frozen values.

Under the simulator every replay runs eagerly (same code path as RunConfig.graphs=False on the GPU);
with NUMBA_ENABLE_CUDASIM=0 the same tests replay captured CUDA graphs.
"""

import numpy as np
import pytest
from numba import cuda, float32, from_dtype, int32

from fox_numba.device.control import CONTROL_DTYPE, ControlBlock
from fox_numba.device.elementwise import axpy_f32, scale_f32
from fox_numba.device.graphs import GraphError, StepGraph
from fox_numba.device.launch import i32, launch, launch_strided
from fox_numba.device.memory import copy_device, device_empty, device_zeros
from fox_numba.device.registry import register
from fox_numba.device.runtime import SIMULATOR, new_stream
from fox_numba.device.staging import Stager

N = 256


@register((float32[::1], float32[::1], from_dtype(CONTROL_DTYPE)[::1], int32))
@cuda.jit
def lerp_by_control(target, online, ctl, n):
    """target[i] += ctl tau_eff * (online[i] - target[i]): a kernel that reads a control block."""
    i = cuda.grid(1)
    if i < n:
        target[i] = target[i] + ctl[0].tau_eff * (online[i] - target[i])


@pytest.fixture()
def stream():
    return new_stream()


@pytest.fixture()
def stager(stream):
    return Stager(stream, chunk_bytes=1 << 12)


def seeded(seed, n=N):
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


def make_step(stager, stream, use_graph):
    """A small training-like step: Polyak toward `online` at tau_eff, then online += 0.5 * scratch."""
    target, online = stager.upload_new(seeded(1)), stager.upload_new(seeded(2))
    scratch = device_empty(N, np.float32)
    ctl = ControlBlock()

    def body(s):
        ctl.upload(s)
        launch(lerp_by_control, N, target, online, ctl.device, i32(N), stream=s)
        copy_device(scratch, target, stream=s)
        launch_strided(scale_f32, N, scratch, np.float32(0.5), i32(N), stream=s)
        launch_strided(axpy_f32, N, online, np.float32(-0.25), scratch, i32(N), stream=s)

    return StepGraph("train", body, stream, use_graph=use_graph), ctl, target, online


TAUS = [0.5, 0.125, 0.25, 0.0625, 1.0]


def reference(taus):
    t, o = seeded(1).astype(np.float64), seeded(2).astype(np.float64)
    for tau in taus:
        t = t + tau * (o - t)
        o = o - 0.25 * (0.5 * t)
    return t, o


def test_graph_replay_equals_eager_replay(stager, stream):
    runs = {}
    for use_graph in (True, False):
        step, ctl, target, online = make_step(stager, stream, use_graph)
        for k, tau in enumerate(TAUS):
            ctl.set(step=k, tau_eff=np.float32(tau))
            step.replay()
        stream.synchronize()
        runs[use_graph] = (stager.download(target), stager.download(online), step.mode)
    assert runs[False][2] == "eager"
    assert runs[True][2] == ("eager" if SIMULATOR else "graph")
    np.testing.assert_array_equal(runs[True][0], runs[False][0])
    np.testing.assert_array_equal(runs[True][1], runs[False][1])


def test_replayed_step_sees_per_step_values_changed_between_replays(stager, stream):
    step, ctl, target, online = make_step(stager, stream, use_graph=True)
    for k, tau in enumerate(TAUS):
        ctl.set(step=k, tau_eff=np.float32(tau))
        step.replay()
    t_ref, o_ref = reference(TAUS)
    np.testing.assert_allclose(stager.download(target), t_ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(stager.download(online), o_ref, rtol=1e-5, atol=1e-6)
    # a step that ignored the changes (frozen at the first tau) would land far away
    t_frozen, _ = reference([TAUS[0]] * len(TAUS))
    assert np.abs(stager.download(target) - t_frozen).max() > 1e-2


@pytest.mark.gpu_only("graphs are captured only on the GPU")
def test_graph_is_captured_with_one_node_per_launch(stager, stream):
    step, ctl, _, _ = make_step(stager, stream, use_graph=True)
    ctl.set(tau_eff=np.float32(0.5))
    step.replay()
    assert step.mode == "eager"
    step.replay()
    assert step.mode == "graph" and step.graph_nodes == len(step.launches) == 5


def test_a_scalar_argument_that_changes_is_refused(stager, stream):
    x = stager.upload_new(seeded(3))
    tau = [np.float32(0.5)]

    def body(s):
        launch_strided(scale_f32, N, x, tau[0], i32(N), stream=s)

    step = StepGraph("frozen", body, stream, use_graph=True)
    step.replay()
    tau[0] = np.float32(0.25)
    with pytest.raises(GraphError, match="argument 1 changed between replays.*ControlBlock"):
        step.replay()


def test_an_array_allocated_per_replay_is_refused(stream):
    def body(s):
        x = device_zeros(N, np.float32, stream=s)  # a new array every replay (zeros: no NaN from stale memory)
        launch_strided(scale_f32, N, x, np.float32(0.5), i32(N), stream=s)

    step = StepGraph("realloc", body, stream, use_graph=True)
    step.replay()
    with pytest.raises(GraphError, match="another array"):
        step.replay()


def test_a_changing_launch_sequence_is_refused(stager, stream):
    x = stager.upload_new(seeded(4))
    count = [1]

    def body(s):
        for _ in range(count[0]):
            launch_strided(scale_f32, N, x, np.float32(0.5), i32(N), stream=s)

    step = StepGraph("grows", body, stream, use_graph=True)
    step.replay()
    count[0] = 2
    with pytest.raises(GraphError, match="made 2 launches, the first made 1"):
        step.replay()


def test_reading_the_control_block_before_uploading_it_is_refused(stager, stream):
    target, online = stager.upload_new(seeded(5)), stager.upload_new(seeded(6))
    ctl = ControlBlock()

    def body(s):
        launch(lerp_by_control, N, target, online, ctl.device, i32(N), stream=s)
        ctl.upload(s)

    with pytest.raises(GraphError, match="has not uploaded yet"):
        StepGraph("late_upload", body, stream, use_graph=True).replay()


def test_an_empty_body_is_refused(stream):
    with pytest.raises(GraphError, match="launched no kernel"):
        StepGraph("empty", lambda s: None, stream, use_graph=False).replay()


def test_a_block_uploaded_outside_the_step_is_read_by_queued_replays(stager, stream):
    """The per-epoch pattern: set + upload once, then replays with no host write between them; the stream
    orders each upload between the replays queued before and after it."""
    target, online = stager.upload_new(seeded(1)), stager.upload_new(seeded(2))
    ctl = ControlBlock()

    def body(s):
        launch(lerp_by_control, N, target, online, ctl.device, i32(N), stream=s)

    step = StepGraph("epochs", body, stream, use_graph=True)
    taus = [0.5, 0.5, 0.5, 0.125, 0.125]
    for epoch_taus in (taus[:3], taus[3:]):
        ctl.set(tau_eff=np.float32(epoch_taus[0]))
        ctl.upload(stream)
        assert not ctl.pending
        for _ in epoch_taus:
            step.replay()
    t = seeded(1).astype(np.float64)
    for tau in taus:
        t = t + tau * (seeded(2) - t)
    np.testing.assert_allclose(stager.download(target), t, rtol=1e-5, atol=1e-6)
    assert step._controls == [] and step._read_controls == [ctl]  # no per-replay fence


def test_a_block_set_after_its_upload_is_refused(stager, stream):
    target, online = stager.upload_new(seeded(1)), stager.upload_new(seeded(2))
    ctl = ControlBlock()

    def body(s):
        launch(lerp_by_control, N, target, online, ctl.device, i32(N), stream=s)

    step = StepGraph("stale", body, stream, use_graph=True)
    with pytest.raises(GraphError, match="never uploaded"):
        step.replay()  # a new block: the device copy holds nothing yet
    ctl.upload(stream)
    step.replay()
    ctl.set(tau_eff=np.float32(0.25))
    assert ctl.pending
    with pytest.raises(GraphError, match="set after its last upload"):
        step.replay()
    ctl.upload(stream)
    step.replay()
