"""A correct kernel that was never added to the kernel registry: the compile check must refuse it."""

from numba import cuda, float32


@cuda.jit
def double_in_place(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] = x[i] * float32(2.0)
