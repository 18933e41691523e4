"""GPU or CUDA simulator: decided once, before numba is imported, so every entry point agrees.

numba reads NUMBA_ENABLE_CUDASIM once, when it is first imported. When the variable is unset, the package
looks for a CUDA GPU through the driver library itself (ctypes: `cuInit`, `cuDeviceGetCount`), without
importing numba; with none, it sets NUMBA_ENABLE_CUDASIM=1, so `fox` runs its kernels on the CPU under
numba's simulator instead of failing at the first launch. An explicit NUMBA_ENABLE_CUDASIM (tests, a
user forcing either mode) is left as it is; where it asks for the GPU and the driver reports none, the stages
refuse in one line (`gpu_missing`) instead of failing inside numba.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

SIM_VARIABLE = "NUMBA_ENABLE_CUDASIM"


def cuda_gpu_count() -> int:
    """CUDA devices the driver reports (0 without a driver library, without a GPU, or on any driver error)."""
    names = ["libcuda.so.1", "libcuda.so", ctypes.util.find_library("cuda") or ""]
    for name in filter(None, names):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        count = ctypes.c_int(0)
        if lib.cuInit(0) != 0 or lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
            return 0
        return count.value
    return 0


def choose_backend() -> bool:
    """Set NUMBA_ENABLE_CUDASIM=1 when it is unset and no GPU is present; True when the simulator is on."""
    if SIM_VARIABLE not in os.environ and cuda_gpu_count() == 0:
        os.environ[SIM_VARIABLE] = "1"
    return os.environ.get(SIM_VARIABLE, "") not in ("", "0")


def gpu_missing() -> str | None:
    """Why kernels cannot run here, or None: NUMBA_ENABLE_CUDASIM=0 (set by the user) asks for a GPU and the driver
    reports none, so the first launch would fail deep inside numba."""
    if os.environ.get(SIM_VARIABLE, "") in ("", "0") and cuda_gpu_count() == 0:
        return (f"{SIM_VARIABLE}=0 asks for a CUDA GPU and the driver reports none; unset it to run the kernels under "
                "numba's CUDA simulator")
    return None
