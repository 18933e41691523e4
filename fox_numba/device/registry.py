"""The registry of every `@cuda.jit` kernel in the package, with the signatures it is launched with.

The CUDA simulator checks no types, so each registered signature is compiled to sm_90 PTX by
`fox_numba.kernels.compile_check` in CI. A kernel defined in the package but missing here fails that
check. Register a kernel by stacking `@register(...)` above `@cuda.jit`:

    @register((float32[:], float32[:], int32))
    @cuda.jit
    def axpy(x, y, n): ...

Signatures are tuples of numba types (`numba.float32[:]`, `numba.from_dtype(record)[:]`, ...), written
once beside the kernel, in the dtypes the launching code uses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fox_numba.device.kernel_cache import enable_disk_cache


@dataclass(frozen=True)
class KernelSpec:
    """A kernel and the argument-type tuples it is launched with."""

    name: str
    kernel: Any
    signatures: tuple[tuple[Any, ...], ...]

    @property
    def py_func(self) -> Callable[..., Any]:
        return kernel_py_func(self.kernel)


KERNELS: dict[str, KernelSpec] = {}


def kernel_py_func(kernel: Any) -> Callable[..., Any]:
    """The Python function behind a CUDA kernel (the GPU dispatcher and the simulator's kernel both have
    `py_func`)."""
    try:
        return kernel.py_func
    except AttributeError:
        raise TypeError(f"{kernel!r} is not a numba CUDA kernel") from None


def kernel_name(kernel: Any) -> str:
    func = kernel_py_func(kernel)
    return f"{func.__module__}.{func.__qualname__}"


def register(*signatures: tuple[Any, ...]) -> Callable[[Any], Any]:
    """Record a kernel with the argument-type tuples it is launched with and turn on its on-disk cache
    (device/kernel_cache.py); returns the kernel."""
    if not signatures:
        raise ValueError("register() needs at least one signature")

    def deco(kernel: Any) -> Any:
        name = kernel_name(kernel)
        KERNELS[name] = KernelSpec(name, kernel, tuple(tuple(s) for s in signatures))
        enable_disk_cache(kernel)
        return kernel

    return deco
