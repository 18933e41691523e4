"""Elementwise kernels the runtime and every stage use: fill, scale, axpy, word copy, scatter.

Launch shape: 1-D grid-stride (`for i in range(cuda.grid(1), n, cuda.gridsize(1))`), through
`fox_numba.device.launch.launch_strided(kernel, n, ...)`: one thread per element on the GPU, one small block that
walks the array under the simulator, where a Python thread per element made a fold reset of a network's parameters
take seconds.
Constraints: arrays are C-contiguous and 1-D; `n` (int32) is the number of elements processed, a prefix
of the arrays; scalars arrive as float32 / uint32 / int32 (a Python float would make the GPU compute in
float64, and the launch helper refuses it). Record and 8-byte dtypes are copied or filled as uint32
words (`copy_u32`, `fill_u32` on a `.view(np.uint32)` of the arrays).
"""

from numba import cuda, float32, int32, uint32

from fox_numba.device.registry import register


@register((float32[::1], float32, int32))
@cuda.jit
def fill_f32(x, value, n):
    """x[i] = value."""
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        x[i] = value


@register((uint32[::1], uint32, int32))
@cuda.jit
def fill_u32(x, value, n):
    """x[i] = value, on the 32-bit words of any array (zeroing records, int64, uint64 arrays)."""
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        x[i] = value


@register((float32[::1], float32, int32))
@cuda.jit
def scale_f32(x, alpha, n):
    """x[i] *= alpha (the seed's Adam shrink at a fold boundary: m *= 0.1, v *= 0.01)."""
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        x[i] = x[i] * alpha


@register((float32[::1], float32, float32[::1], int32))
@cuda.jit
def axpy_f32(y, alpha, x, n):
    """y[i] += alpha * x[i]."""
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        y[i] = y[i] + alpha * x[i]


@register((uint32[::1], uint32[::1], int32))
@cuda.jit
def copy_u32(dst, src, n):
    """dst[i] = src[i] on 32-bit words; a kernel rather than a memcpy so it is captured like any step."""
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        dst[i] = src[i]


@register((float32[::1], int32[::1], float32[::1], int32))
@cuda.jit
def scatter_f32(dst, index, values, n):
    """dst[index[i]] = values[i] (the indices must be distinct: fold resets of named ISV slots)."""
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        dst[index[i]] = values[i]
