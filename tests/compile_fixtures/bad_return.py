"""A kernel the CUDA simulator runs happily and the GPU compiler rejects: kernels cannot return values."""

from numba import cuda, float32, int32

from fox_numba.device.registry import register


@register((float32[:], int32))
@cuda.jit
def scale_and_return(x, n):
    i = cuda.grid(1)
    if i < n:
        x[i] = x[i] * float32(2.0)
    return x[0]
