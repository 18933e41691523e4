"""Stager: chunked, double-buffered uploads and downloads through mapped memory, every element checked."""

import numpy as np
import pytest

from fox_numba.device import staging
from fox_numba.device.elementwise import fill_f32
from fox_numba.device.graphs import StepGraph
from fox_numba.device.launch import LaunchError, i32, launch_strided
from fox_numba.device.memory import copy_device, device_empty
from fox_numba.device.runtime import new_stream
from fox_numba.device.staging import Stager

RECORD = np.dtype([("s0", np.uint64), ("s1", np.uint64), ("x", np.float32)], align=True)


def seeded(dtype, shape, seed):
    """Seeded non-zero values: normal floats for float32, random bytes for every other dtype."""
    rng = np.random.default_rng(seed)
    if np.dtype(dtype) == np.float32:
        return rng.standard_normal(shape).astype(np.float32)
    raw = rng.integers(1, 256, int(np.prod(shape)) * np.dtype(dtype).itemsize, dtype=np.uint8)
    return raw.view(dtype).reshape(shape)


@pytest.mark.parametrize(
    "dtype, shape",
    [
        (np.float32, (1000,)),
        (np.int32, (37, 11)),
        (np.uint32, (5, 6, 7)),
        (np.uint64, (101,)),
        (RECORD, (53,)),
    ],
    ids=["f32", "i32", "u32", "u64", "record"],
)
@pytest.mark.parametrize("chunk_bytes", [4, 96, 1 << 20], ids=["4B", "96B", "1MiB"])
def test_upload_download_round_trip_every_element(dtype, shape, chunk_bytes, stream):
    stager = Stager(stream, chunk_bytes=chunk_bytes)
    values = seeded(dtype, shape, seed=chunk_bytes)
    dev = stager.upload_new(values)
    assert tuple(dev.shape) == values.shape and dev.dtype == values.dtype
    back = stager.download(dev)
    assert back.view(np.uint8).tobytes() == values.view(np.uint8).tobytes()

    out = np.zeros_like(values)
    assert stager.download(dev, out=out) is out
    np.testing.assert_array_equal(out.view(np.uint8), values.view(np.uint8))


def test_large_chunks_are_copied_by_several_host_threads(stream):
    stager = Stager(stream, chunk_bytes=16 << 20, host_threads=4)
    values = seeded(np.float32, (5 << 20) + 3, seed=9)  # 20 MiB: a threaded chunk and a short tail
    dev = stager.upload_new(values)
    np.testing.assert_array_equal(stager.download(dev), values)


def test_upload_overwrites_a_device_array_and_sees_kernel_writes(stream):
    stager = Stager(stream, chunk_bytes=64)
    dev = device_empty(300, np.float32)
    stager.upload(seeded(np.float32, (300,), seed=1), dev)
    launch_strided(fill_f32, 100, dev, np.float32(2.5), i32(100), stream=stream)
    expected = seeded(np.float32, (300,), seed=1)
    expected[:100] = 2.5
    np.testing.assert_array_equal(stager.download(dev), expected)


def test_layout_mismatch_is_refused(stream):
    stager = Stager(stream, chunk_bytes=64)
    dev = device_empty(10, np.float32)
    with pytest.raises(ValueError, match="differ"):
        stager.upload(np.ones(11, np.float32), dev)
    with pytest.raises(ValueError, match="differ"):
        stager.upload(np.ones(10, np.float64), dev)
    with pytest.raises(ValueError, match="differ"):
        stager.download(dev, out=np.empty(10, np.int32))
    with pytest.raises(ValueError, match="multiple of 4"):
        Stager(stream, chunk_bytes=6)


def test_staging_inside_a_step_body_is_refused(stream):
    stager = Stager(stream, chunk_bytes=64)
    dev = device_empty(8, np.float32)

    def body(s):
        launch_strided(fill_f32, 8, dev, np.float32(1.0), i32(8), stream=s)
        stager.upload(np.ones(8, np.float32), dev)

    with pytest.raises(LaunchError, match="staging inside a step body"):
        StepGraph("bad", body, stream, use_graph=True).replay()


class LoggedEvent:
    """A real event that logs its record and wait calls with the stream they name."""

    def __init__(self, log, event):
        self.log, self.event = log, event

    def record(self, stream=0):
        self.log.append(("record", stream))
        self.event.record(stream)

    def wait(self, stream=0):
        self.log.append(("wait", stream))
        self.event.wait(stream)

    def synchronize(self):
        self.event.synchronize()


def test_copies_wait_for_the_streams_named_after(stream, monkeypatch):
    """Before its first copy, a download or upload given after=streams records an event on each of them (not
    on its own stream, already in order) and makes its own stream wait for it; without after= it records and
    waits nothing before copying. (The simulator runs launches synchronously, so this order is what it can
    show; the GPU-only tests below show the effect.)"""
    log = []
    real_event, real_copy = staging.sync_event, staging.copy_device
    monkeypatch.setattr(staging, "sync_event", lambda: LoggedEvent(log, real_event()))

    def logged_copy(dst, src, *, stream):
        log.append(("copy", stream))
        real_copy(dst, src, stream=stream)

    monkeypatch.setattr(staging, "copy_device", logged_copy)
    stager = Stager(stream, chunk_bytes=64)
    producer, consumer = new_stream(), new_stream()
    values = seeded(np.float32, (100,), seed=3)
    dev = stager.upload_new(values)

    def before_first_copy(call):
        log.clear()
        result = call()
        return log[: log.index(("copy", stream))], result

    waits, back = before_first_copy(lambda: stager.download(dev, after=(producer, stream, consumer)))
    assert waits == [("record", producer), ("wait", stream), ("record", consumer), ("wait", stream)]
    np.testing.assert_array_equal(back, values)
    waits, _ = before_first_copy(lambda: stager.upload(values[::-1].copy(), dev, after=consumer))
    assert waits == [("record", consumer), ("wait", stream)]
    np.testing.assert_array_equal(stager.download(dev), values[::-1])
    waits, _ = before_first_copy(lambda: stager.download(dev))
    assert waits == []


BUSY = 1 << 26  # floats (256 MiB): 20 fills keep a stream busy for a few milliseconds on an H200


def keep_busy(stream, busy, value):
    for _ in range(20):
        launch_strided(fill_f32, BUSY, busy, np.float32(value), i32(BUSY), stream=stream)


@pytest.mark.gpu_only("the simulator runs every launch synchronously, so no copy can overtake a kernel")
def test_download_after_the_producing_stream_sees_its_kernels(stream):
    """A kernel on another stream writes a buffer behind milliseconds of queued work; a download issued at once
    with after=that stream returns what the kernel wrote, three times over."""
    stager = Stager(stream, chunk_bytes=1 << 16)
    producer = new_stream()
    busy = device_empty(BUSY, np.float32)
    result = stager.upload_new(np.zeros(1 << 16, np.float32))
    for trial in range(1, 4):
        keep_busy(producer, busy, trial)
        launch_strided(fill_f32, result.size, result, np.float32(trial), i32(result.size), stream=producer)
        got = stager.download(result, after=producer)
        assert np.all(got == trial), f"trial {trial}: {np.unique(got)}"


@pytest.mark.gpu_only("the simulator runs every launch synchronously, so no copy can overtake a kernel")
def test_upload_after_the_consuming_stream_does_not_overwrite_what_it_still_reads(stream):
    """A copy on another stream reads a buffer behind milliseconds of queued work; an upload into that buffer
    issued at once with after=that stream leaves the copy the old values."""
    stager = Stager(stream, chunk_bytes=1 << 16)
    consumer = new_stream()
    busy = device_empty(BUSY, np.float32)
    old, new = seeded(np.float32, (1 << 16,), seed=4), seeded(np.float32, (1 << 16,), seed=5)
    buffer, snapshot = stager.upload_new(old), device_empty(1 << 16, np.float32)
    keep_busy(consumer, busy, 1.0)
    copy_device(snapshot, buffer, stream=consumer)
    stager.upload(new, buffer, after=consumer)
    consumer.synchronize()
    np.testing.assert_array_equal(stager.download(snapshot), old)
    np.testing.assert_array_equal(stager.download(buffer), new)
