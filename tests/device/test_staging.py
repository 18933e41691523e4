"""Stager: chunked, double-buffered uploads and downloads through mapped memory, every element checked."""

import numpy as np
import pytest

from fox_numba.device.elementwise import fill_f32
from fox_numba.device.graphs import StepGraph
from fox_numba.device.launch import LaunchError, i32, launch
from fox_numba.device.memory import device_empty
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
    launch(fill_f32, 100, dev, np.float32(2.5), i32(100), stream=stream)
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
        launch(fill_f32, 8, dev, np.float32(1.0), i32(8), stream=s)
        stager.upload(np.ones(8, np.float32), dev)

    with pytest.raises(LaunchError, match="staging inside a step body"):
        StepGraph("bad", body, stream, use_graph=True).replay()
