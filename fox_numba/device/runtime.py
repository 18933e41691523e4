"""What the rest of `device` asks of numba-cuda: simulator or GPU, streams, array addresses.

The CUDA simulator (NUMBA_ENABLE_CUDASIM=1, read once when numba is imported) runs kernels as Python
threads; it has no graphs and no timing events, so the modules here branch on `SIMULATOR` in one place
each, and the same code runs eagerly on the CPU with the same results.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import cuda, uint32
from numba.cuda import config

SIMULATOR: bool = bool(config.ENABLE_CUDASIM)


def _same(x: Any) -> Any:
    return x


u32: Any = _same if SIMULATOR else uint32
"""Index arithmetic in kernels: `u32(a + b)` is numba's uint32 cast on the GPU (no 64-bit arithmetic, no
negative-index wrap: kernels/head_rows.py's header) and the value itself under the simulator, where the cast is a
Python call of about 2 us that every staged element paid several times; the indices it wraps never leave uint32's
range, so both give the same values."""
# Control and producer kernels run on one block by design (the launch helpers size every grid), so
# numba's per-launch low-occupancy warning would only be noise, and a cost on the eager launch path.
config.CUDA_LOW_OCCUPANCY_WARNINGS = 0


def new_stream() -> Any:
    """A new non-default CUDA stream (the legacy default stream cannot be captured into a graph)."""
    return cuda.stream()


def atomic_simulator_shared_arrays() -> None:
    """Under the simulator, create each simulated block's static shared arrays under a lock.

    The simulator makes a block's shared array at the first call from each source line, check-then-insert
    without a lock; under load two threads of a block can each make one and then work on different memory
    (seen about once in 4,000 blocks of 256 threads on a loaded machine, and as a `fox train` whose validation
    figures differed from the same seed's). This keeps the simulator's keying (the caller's file and line) and
    only makes the creation atomic; dynamic shared memory (shape 0) and the alignment error go to the original.
    Installed once per process, when this module is imported under the simulator."""
    import sys
    import threading

    from numba.core import types
    from numba.cuda.simulator.kernelapi import FakeCUDAShared
    from numba.np import numpy_support

    original = FakeCUDAShared.array
    if getattr(original, "atomic", False):
        return
    lock = threading.Lock()

    def array(self: Any, shape: Any, dtype: Any, alignment: Any = None) -> Any:
        if shape == 0 or alignment is not None:
            return original(self, shape, dtype, alignment)
        if isinstance(dtype, types.Type):
            dtype = numpy_support.as_dtype(dtype)
        caller = sys._getframe(1)
        key = (caller.f_code.co_filename, caller.f_lineno)
        with lock:
            if key not in self._allocations:
                self._allocations[key] = np.empty(shape, dtype)
            return self._allocations[key]

    array.atomic = True  # type: ignore[attr-defined]
    FakeCUDAShared.array = array


if SIMULATOR:
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

    _DEVICE_ARRAY_TYPES: tuple[type, ...] = (FakeCUDAArray,)
    atomic_simulator_shared_arrays()
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
