"""Mapped pinned buffers and device arrays: every typed helper round-trips every element, both ways."""

import numpy as np
import pytest

from fox_numba.device import memory
from fox_numba.device.elementwise import copy_u32
from fox_numba.device.launch import i32, launch_strided
from fox_numba.device.memory import (
    Mapped,
    copy_device,
    device_empty,
    device_zeros,
    mapped_f32,
    mapped_i32,
    mapped_records,
    mapped_u32,
    mapped_u64,
    words,
)
from fox_numba.device.staging import Stager

RECORD = np.dtype([("step", np.int64), ("value", np.float32), ("flag", np.uint32)], align=True)


@pytest.fixture(scope="module")
def stager(stream):
    return Stager(stream, chunk_bytes=256)


def random_values(dtype, shape, seed):
    """Seeded values that are never all zeros, for any of the dtypes the helpers make."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    if np.dtype(dtype).names:
        out = np.zeros(n, dtype)
        out["step"] = rng.integers(-(2**40), 2**40, n)
        out["value"] = rng.standard_normal(n).astype(np.float32)
        out["flag"] = rng.integers(1, 2**32, n, dtype=np.uint64).astype(np.uint32)
        return out.reshape(shape)
    if np.dtype(dtype) == np.float32:
        return rng.standard_normal(n).astype(np.float32).reshape(shape)
    bits = rng.integers(1, 2**63, n, dtype=np.int64).view(np.uint64)
    return bits.astype(dtype).reshape(shape)


def host_to_device_words(m, stream):
    """A kernel copies the mapped buffer's words into a device array (a kernel reading mapped memory)."""
    dev = device_empty(m.shape, m.dtype)
    dst, src = words(dev), words(m.device)
    launch_strided(copy_u32, dst.size, dst, src, i32(dst.size), stream=stream)
    return dev


def device_words_to_mapped(dev, m, stream):
    """A kernel writes a device array's words into a mapped buffer (a kernel writing mapped memory)."""
    dst, src = words(m.device), words(dev)
    launch_strided(copy_u32, dst.size, dst, src, i32(dst.size), stream=stream)
    stream.synchronize()


@pytest.mark.parametrize(
    "make, dtype, shape",
    [
        (mapped_f32, np.float32, (7, 50)),
        (mapped_i32, np.int32, 333),
        (mapped_u32, np.uint32, 333),
        (mapped_u64, np.uint64, 129),
        (lambda n: mapped_records(RECORD, n), RECORD, 77),
    ],
    ids=["f32", "i32", "u32", "u64", "record"],
)
def test_mapped_round_trip_through_kernels(make, dtype, shape, stream, stager):
    m = make(shape)
    assert m.host.dtype == np.dtype(dtype) and m.host.shape == m.shape
    values = random_values(dtype, m.shape, seed=1)
    m.host[...] = values

    dev = host_to_device_words(m, stream)  # host wrote in place, a kernel read it
    np.testing.assert_array_equal(stager.download(dev), values)

    back = random_values(dtype, m.shape, seed=2)
    src = stager.upload_new(back)
    device_words_to_mapped(src, m, stream)  # a kernel wrote, the host reads in place after a sync
    np.testing.assert_array_equal(m.host, back)


def test_mapped_record_fields_are_named_on_the_host(stream):
    m = mapped_records(RECORD, 3)
    m.host["step"] = [5, -7, 2**40]
    m.host["value"] = [0.5, -1.25, 3.0]
    m.host["flag"] = [1, 2, 3]
    dev = host_to_device_words(m, stream)
    m2 = mapped_records(RECORD, 3)
    device_words_to_mapped(dev, m2, stream)
    assert m2.host["step"].tolist() == [5, -7, 2**40]
    assert m2.host["value"].tolist() == [0.5, -1.25, 3.0]
    assert m2.host["flag"].tolist() == [1, 2, 3]


def test_sizes_must_be_whole_words_and_non_empty():
    with pytest.raises(ValueError, match="32-bit words"):
        Mapped(3, np.uint8)
    with pytest.raises(ValueError, match="no elements"):
        Mapped(0, np.float32)
    with pytest.raises(ValueError, match="not a record dtype"):
        mapped_records(np.float32)
    with pytest.raises(ValueError, match="32-bit words"):
        device_empty(5, np.int16)


@pytest.mark.parametrize("dtype", [np.float32, np.int64, RECORD], ids=["f32", "i64", "record"])
def test_device_zeros_clears_every_word(dtype, stream, stager, monkeypatch):
    """The fill kernel (the GPU's path, forced here under the simulator too) zeroes memory full of junk, so
    zeros cannot come from freshly allocated memory; the simulator's host-zeros path gives the same array."""
    junk = stager.upload_new(random_values(dtype, 100, seed=3))
    with monkeypatch.context() as patch:
        patch.setattr(memory, "SIMULATOR", False)
        patch.setattr(memory, "device_empty", lambda shape, dt: junk)
        arr = device_zeros(100, dtype, stream=stream)
    stream.synchronize()
    assert arr is junk
    out = stager.download(arr)
    assert out.dtype == np.dtype(dtype)
    assert not out.view(np.uint8).any()
    plain = stager.download(device_zeros((4, 25), dtype, stream=stream))
    assert plain.shape == (4, 25) and plain.dtype == np.dtype(dtype) and not plain.view(np.uint8).any()


def test_copy_device_copies_every_element_and_checks_layout(stream, stager):
    values = random_values(np.float32, (4, 25), seed=4)
    src = stager.upload_new(values)
    dst = device_empty((4, 25), np.float32)
    copy_device(dst, src, stream=stream)
    stream.synchronize()
    np.testing.assert_array_equal(stager.download(dst), values)
    with pytest.raises(ValueError, match="copy between"):
        copy_device(device_empty(100, np.float32), src, stream=stream)


def test_copy_device_refuses_host_arrays(stream, stager):
    """A numpy array on either side would be a pageable host copy made by numba: refused, naming the side.
    A mapped buffer's device view is a device array; its host view is not."""
    dev = device_empty(8, np.float32)
    with pytest.raises(TypeError, match="copy_device: src is a ndarray, not a device array"):
        copy_device(dev, np.ones(8, np.float32), stream=stream)
    with pytest.raises(TypeError, match="copy_device: dst is a ndarray, not a device array"):
        copy_device(np.ones(8, np.float32), dev, stream=stream)
    m = mapped_f32(8)
    m.host[:] = np.arange(8, dtype=np.float32) + 0.5
    with pytest.raises(TypeError, match="copy_device: src is a ndarray"):
        copy_device(dev, m.host, stream=stream)
    copy_device(dev, m.device, stream=stream)
    stream.synchronize()
    np.testing.assert_array_equal(stager.download(dev), m.host)
