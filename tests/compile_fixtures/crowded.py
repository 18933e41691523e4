"""A kernel whose launch bounds ask for 8 resident blocks per SM while its 32 KiB shared array lets 6 fit an sm_90
SM (233,472 B / (32,768 + 1,024) B): the compile check must refuse it."""

import numpy as np
from numba import cuda, float32

from fox_numba.device.registry import register

WORDS = 8192  # 32 KiB of float32


@register((float32[::1],))
@cuda.jit(launch_bounds=(128, 8))
def crowded_copy(x):
    buf = cuda.shared.array(WORDS, float32)
    t = cuda.threadIdx.x
    for k in range(t, WORDS, cuda.blockDim.x):
        buf[k] = x[k]
    cuda.syncthreads()
    for k in range(t, WORDS, cuda.blockDim.x):
        x[k] = buf[WORDS - 1 - k] * np.float32(2.0)
