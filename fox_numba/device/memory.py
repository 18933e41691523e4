"""Device and mapped pinned memory: the only host<->device path of the package.

A `Mapped` buffer is page-locked host memory mapped into the device's address space
(`cuda.mapped_array`): the host reads and writes `host` (a numpy view) in place and kernels take
`device` (a device-array view of the same bytes). Small control data lives there: a kernel reads what
the host wrote before the launch, and the host reads what a kernel wrote once the stream is
synchronised. Bulk data is staged through mapped buffers and copied device-to-device
(`fox_numba.device.staging.Stager`).

Rules kept here so no stage has to know them:
- a mapped buffer's raw storage is bytes, viewed as the requested dtype on both sides (the simulator's
  numpy view of a mapped record array is read-only; a byte view is not);
- arrays are whole 32-bit words, so any array can be zeroed or copied as uint32 words by a kernel;
- nothing outside `device/` calls `to_device`, `copy_to_host` or `copy_to_device`
  (tests/device/test_no_copy_rule.py enforces it).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import cuda

from fox_numba.device.elementwise import copy_u32, fill_u32
from fox_numba.device.launch import active_trace, i32, launch_strided
from fox_numba.device.runtime import SIMULATOR, is_device_array, mapped_device_view

Shape = int | tuple[int, ...]


def _layout(shape: Shape, dtype: Any) -> tuple[tuple[int, ...], np.dtype, int]:
    """(shape, dtype, nbytes), refusing empty arrays and sizes that are not whole 32-bit words."""
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)
    dtype = np.dtype(dtype)
    if not shape or math.prod(shape) < 1:
        raise ValueError(f"shape {shape} holds no elements")
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes % 4:
        raise ValueError(f"{dtype}{shape} is {nbytes} bytes, not whole 32-bit words (pad it, align=True)")
    return shape, dtype, nbytes


class Mapped:
    """A mapped pinned buffer: the host reads and writes `host` in place, kernels take `device`.

    Host writes made before a launch are seen by that kernel. Kernel writes are seen by the host after
    the stream is synchronised. Kernels that read a value many times per step should read a device
    copy (each read of mapped memory crosses PCIe): see `fox_numba.device.control.ControlBlock`.
    """

    def __init__(self, shape: Shape, dtype: Any) -> None:
        self.shape, self.dtype, self.nbytes = _layout(shape, dtype)
        raw = cuda.mapped_array(self.nbytes, np.uint8)
        self.host: np.ndarray = np.asarray(raw).view(self.dtype).reshape(self.shape)
        self.device: Any = mapped_device_view(raw, self.host)

    def __repr__(self) -> str:
        return f"Mapped(shape={self.shape}, dtype={self.dtype})"


def mapped_f32(shape: Shape) -> Mapped:
    return Mapped(shape, np.float32)


def mapped_i32(shape: Shape) -> Mapped:
    return Mapped(shape, np.int32)


def mapped_u32(shape: Shape) -> Mapped:
    return Mapped(shape, np.uint32)


def mapped_u64(shape: Shape) -> Mapped:
    return Mapped(shape, np.uint64)


def mapped_records(dtype: np.dtype, n: int = 1) -> Mapped:
    """`n` records of a structured dtype (a HEALTH_DIAG snapshot, the control block)."""
    if np.dtype(dtype).names is None:
        raise ValueError(f"{dtype} is not a record dtype")
    return Mapped(n, dtype)


def device_empty(shape: Shape, dtype: Any) -> Any:
    """An uninitialised device array."""
    shape, dtype, _ = _layout(shape, dtype)
    return cuda.device_array(shape, dtype)


def words(arr: Any) -> Any:
    """A flat uint32 view of a C-contiguous device (or mapped) array."""
    return arr.reshape(arr.size).view(np.uint32)


def device_zeros(shape: Shape, dtype: Any, *, stream: Any) -> Any:
    """A device array filled with zero bits on `stream` (zero_fill)."""
    arr = device_empty(shape, dtype)
    zero_fill(arr, stream=stream)
    return arr


def zero_fill(arr: Any, *, stream: Any) -> None:
    """Zero bits into a C-contiguous device array by a kernel on `stream` (no host copy). Under the simulator,
    outside a step body, a copy of host zeros instead: the simulator runs the fill kernel one Python thread per
    word (about 1.5 s for a parameter-sized buffer), and a copy has no cost there to avoid."""
    if SIMULATOR and active_trace() is None:
        arr.copy_to_device(np.zeros(arr.shape, arr.dtype), stream=stream)
        return
    w = words(arr)
    launch_strided(fill_u32, w.size, w, np.uint32(0), i32(w.size), stream=stream)


def _check_same_layout(dst: Any, src: Any) -> None:
    if tuple(dst.shape) != tuple(src.shape) or dst.dtype != src.dtype:
        raise ValueError(f"copy between {src.dtype}{tuple(src.shape)} and {dst.dtype}{tuple(dst.shape)}")


def copy_device(dst: Any, src: Any, *, stream: Any) -> None:
    """Copy device-to-device (either side may be a mapped buffer's `.device`), asynchronously on `stream`.

    Outside a step body this is a DMA copy. Inside one it launches `copy_u32` on the arrays' words, so a
    captured graph holds it like any kernel and the step's launch trace sees it. Both sides must be device
    arrays: given a numpy array, numba would make a pageable host copy (synchronous, outside the mapped
    path, and not capturable); host data goes through `Stager.upload` / `Stager.download`.
    """
    for name, arr in (("dst", dst), ("src", src)):
        if not is_device_array(arr):
            raise TypeError(
                f"copy_device: {name} is a {type(arr).__name__}, not a device array (or a Mapped buffer's .device); "
                "copy host data with Stager.upload / Stager.download"
            )
    _check_same_layout(dst, src)
    if active_trace() is not None:
        dw, sw = words(dst), words(src)
        launch_strided(copy_u32, dw.size, dw, sw, i32(dw.size), stream=stream)
    else:
        dst.copy_to_device(src, stream=stream)
