"""What the rest of `device` asks of numba-cuda: simulator or GPU, streams, array addresses.

The CUDA simulator (NUMBA_ENABLE_CUDASIM=1, read once when numba is imported) runs kernels as Python
threads; it has no graphs and no timing events, so the modules here branch on `SIMULATOR` in one place
each, and the same code runs eagerly on the CPU with the same results.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import cuda
from numba.cuda import config

SIMULATOR: bool = bool(config.ENABLE_CUDASIM)
# Control and producer kernels run on one block by design (the launch helpers size every grid), so
# numba's per-launch low-occupancy warning would only be noise, and a cost on the eager launch path.
config.CUDA_LOW_OCCUPANCY_WARNINGS = 0


def new_stream() -> Any:
    """A new non-default CUDA stream (the legacy default stream cannot be captured into a graph)."""
    return cuda.stream()


if SIMULATOR:
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

    _DEVICE_ARRAY_TYPES: tuple[type, ...] = (FakeCUDAArray,)
else:
    from numba.cuda.cudadrv.devicearray import DeviceNDArray, DeviceNDArrayBase

    _DEVICE_ARRAY_TYPES = (DeviceNDArrayBase,)  # mapped and managed arrays are numpy subclasses too


def mapped_device_view(raw: Any, host: np.ndarray) -> Any:
    """A device array over the bytes of the mapped array `raw`, with the dtype and shape of `host`.

    On the GPU this is a `DeviceNDArray` on the mapped allocation (numba's `MappedNDArray.view` and
    slicing do not keep the device pointer); in the simulator a reshaped view of the same numpy memory.
    """
    if SIMULATOR:
        return raw.view(host.dtype).reshape(host.shape)
    return DeviceNDArray(host.shape, host.strides, host.dtype, gpu_data=raw.gpu_data)


def sync_event() -> Any:
    """An event for ordering and waiting only (no timestamp: cheaper to record on the GPU)."""
    return cuda.event() if SIMULATOR else cuda.event(timing=False)


def is_device_array(obj: Any) -> bool:
    """True for a device array or a mapped buffer's device view (what kernels take)."""
    return isinstance(obj, _DEVICE_ARRAY_TYPES)


def is_host_array(obj: Any) -> bool:
    """True for a plain numpy array, which numba would copy to the device and back at every launch."""
    return isinstance(obj, np.ndarray) and not isinstance(obj, _DEVICE_ARRAY_TYPES)


def device_address(arr: Any) -> int:
    """The device address of a device (or mapped) array's first element; a graph freezes it."""
    if SIMULATOR:
        return int(arr.__array_interface__["data"][0])
    return int(arr.device_ctypes_pointer.value or 0)
