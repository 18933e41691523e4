"""Compile every registered kernel to PTX for a real GPU (sm_90 by default), without needing one.

The CUDA simulator runs kernels as Python and checks no types, so code that passes every simulator test
can still be rejected by the GPU compiler (a kernel returning a value, a list in a kernel, a float64
literal where a signature says float32...). This check imports every module of the package (and any
extra files named on the command line), finds every `@cuda.jit` kernel, fails on kernels missing from
`fox_numba.device.registry`, compiles each registered signature with NVVM to PTX, and assembles that PTX for the
target with nvJitLink (ptxas inside it): the inline PTX of the tensor-core intrinsics (kernels/tensor_core.py),
which NVVM passes through unread, is checked there, operand types and instruction shapes included. Kernels are
compiled with their own launch bounds; where the bounds ask for a residency (threads, blocks per SM), the check
also reads ptxas' registers and shared memory and fails a kernel of which fewer blocks fit one SM (sm_90's limits,
`resident_blocks`): the bounds cap registers but not shared memory, and a kernel sized to fill one wave loses
half its speed to a second one when a shared array grows. Last, it fails a kernel whose on-disk cache key
(numba-cuda's, from its closure's pickled contents) is not the same after every kernel was compiled as before:
numba-cuda looks a kernel up under the key before compiling and saves it under the key after, so such a kernel is
saved where no fresh process looks (device/kernel_cache.py).

    NUMBA_ENABLE_CUDASIM=0 python -m fox_numba.kernels.compile_check [--cc 9.0] [extra_module.py ...]

Exit codes: 0 all compiled; 1 a kernel failed to compile or is unregistered; 3 no CUDA toolkit (NVVM)
or nvJitLink is installed (`pip install 'fox_numba[cu13]'`); 4 run under the simulator, where nothing is compiled.
Must run with NUMBA_ENABLE_CUDASIM=0 (the simulator switch is read once per process; left unset on a machine
without a GPU, importing fox_numba turns the simulator on, see fox_numba/accelerator.py).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import pkgutil
import re
import sys
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

from fox_numba.device.registry import KERNELS, kernel_name

# numba is imported inside the functions, after the simulator check: under NUMBA_ENABLE_CUDASIM,
# `numba.cuda` is the simulator, which has neither the dispatcher nor NVVM this check needs.

EXIT_OK, EXIT_FAILED, EXIT_NO_TOOLKIT, EXIT_SIMULATOR = 0, 1, 3, 4

# Per-SM limits of compute capability 9.0 (CUDA C++ Programming Guide, the occupancy calculator's figures).
SM90_REGISTERS = 65536
SM90_REGISTER_UNIT = 256  # registers are allocated per warp in units of 256
SM90_SHARED_BYTES = 233_472  # 228 KiB; ptxas' smem of a kernel includes the 1 KiB the driver reserves per block
SM90_WARPS = 64
SM90_BLOCKS = 32


class _ComputeCapability:
    """Answers the driver's compute-capability query on a machine with no GPU."""

    def __init__(self, cc: tuple[int, int]) -> None:
        self.compute_capability = cc


def _prepare_compiler(cc: tuple[int, int]) -> str | None:
    """Point numba at a fake device when no GPU is present; return an error text if NVVM is missing."""
    from numba import cuda
    from numba.cuda import dispatcher

    if not cuda.is_available():
        dispatcher.get_current_device = lambda: _ComputeCapability(cc)  # type: ignore[assignment]
    try:
        from numba.cuda.cudadrv.nvvm import NVVM

        NVVM()
        from cuda.bindings import nvjitlink

        nvjitlink.version()  # loads the library
    except Exception as e:  # the toolkit's absence surfaces as several exception types
        return f"{type(e).__name__}: {e}"
    return None


def assemble(ptx: str, cc: tuple[int, int]) -> str | None:
    """None when nvJitLink assembles `ptx` for sm_<cc>, else its error log on one line."""
    from cuda.bindings import nvjitlink

    handle = nvjitlink.create(1, [f"-arch=sm_{cc[0]}{cc[1]}"])
    try:
        data = ptx.encode()
        nvjitlink.add_data(handle, nvjitlink.InputType.PTX, data, len(data), "kernel.ptx")
        nvjitlink.complete(handle)
        return None
    except nvjitlink.nvJitLinkError as e:
        log = bytearray(nvjitlink.get_error_log_size(handle))
        nvjitlink.get_error_log(handle, log)
        lines = log.decode(errors="replace").replace("\x00", "").splitlines()
        return f"{e}: " + " | ".join(ln.strip() for ln in lines if ln.strip())
    finally:
        nvjitlink.destroy(handle)


def resident_blocks(threads: int, registers: int, shared_bytes: int) -> int:
    """Blocks of `threads` threads that fit one sm_90 SM at once, given ptxas' registers per thread and shared
    bytes per block (the smaller of the warp, register, shared-memory and block limits)."""
    warps = -(-threads // 32)
    per_warp = -(-registers * 32 // SM90_REGISTER_UNIT) * SM90_REGISTER_UNIT
    by_shared = SM90_SHARED_BYTES // shared_bytes if shared_bytes else SM90_BLOCKS
    return min(SM90_BLOCKS, SM90_WARPS // warps, SM90_REGISTERS // (warps * per_warp), by_shared)


def resources(ptx: str, cc: tuple[int, int]) -> tuple[int, int]:
    """(registers per thread, shared bytes per block) of `ptx` as ptxas assembles it for sm_<cc>."""
    from cuda.bindings import nvjitlink

    handle = nvjitlink.create(2, [f"-arch=sm_{cc[0]}{cc[1]}", "-verbose"])
    try:
        data = ptx.encode()
        nvjitlink.add_data(handle, nvjitlink.InputType.PTX, data, len(data), "kernel.ptx")
        nvjitlink.complete(handle)
        log = bytearray(nvjitlink.get_info_log_size(handle))
        nvjitlink.get_info_log(handle, log)
    finally:
        nvjitlink.destroy(handle)
    text = log.decode(errors="replace")
    registers = re.search(r"used (\d+) registers", text)
    shared = re.search(r"(\d+) bytes smem", text)
    if registers is None or shared is None:
        raise ValueError(f"no register or shared-memory figure in ptxas' log: {text!r}")
    return int(registers.group(1)), int(shared.group(1))


def residency_shortfall(ptx: str, cc: tuple[int, int], bounds: Any) -> str | None:
    """None unless launch bounds (threads, blocks per SM) ask for more resident blocks than fit an sm_90 SM."""
    if cc != (9, 0) or not isinstance(bounds, tuple) or len(bounds) < 2:
        return None
    threads, wanted = bounds[0], bounds[1]
    registers, shared = resources(ptx, cc)
    fit = resident_blocks(threads, registers, shared)
    if fit >= wanted:
        return None
    return (f"launch bounds ask for {wanted} blocks of {threads} threads per SM, {fit} fit ({registers} registers "
            f"per thread, {shared} B of shared memory per block)")


def import_package(package: str = "fox_numba") -> list[ModuleType]:
    """Import every module of the package (its `__main__` apart), so that KERNELS holds every kernel; the modules."""
    root = importlib.import_module(package)
    modules = [root]
    for info in pkgutil.walk_packages(root.__path__, prefix=f"{package}."):
        if not info.name.endswith(".__main__"):
            modules.append(importlib.import_module(info.name))
    return modules


def _import_file(path: Path) -> ModuleType:
    name = f"_compile_check_extra_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _kernels_defined_in(module: ModuleType) -> list[Any]:
    """Global (non-device) CUDA kernels whose Python function is defined in `module`."""
    from numba.cuda.dispatcher import CUDADispatcher

    found = []
    for value in vars(module).values():
        is_kernel = isinstance(value, CUDADispatcher) and not value.targetoptions.get("device", False)
        if is_kernel and value.py_func.__module__ == module.__name__:
            found.append(value)
    return found


def cache_keys(cc: tuple[int, int]) -> dict[str, str]:
    """{name: digest of numba-cuda's cache keys of its signatures} of every registered kernel the disk cache keeps."""
    import hashlib

    from numba.cuda.dispatcher import CUDACache

    class Codegen:  # the GPU's part of the key, fixed: no GPU needed
        def magic_tuple(self) -> tuple[str]:
            return (f"sm_{cc[0]}{cc[1]}",)

    keys = {}
    for name, spec in sorted(KERNELS.items()):
        if not spec.kernel.targetoptions.get("link"):
            cache = CUDACache(spec.py_func)
            found = [cache._index_key(sig, Codegen()) for sig in spec.signatures]
            keys[name] = hashlib.sha256(repr(found).encode()).hexdigest()
    return keys


def run(cc: tuple[int, int], extra: list[Path], out: Any = sys.stdout) -> int:
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        print("compile_check: NUMBA_ENABLE_CUDASIM is set; the simulator compiles nothing", file=out)
        return EXIT_SIMULATOR
    missing = _prepare_compiler(cc)
    if missing is not None:
        print(
            "compile_check: no CUDA toolkit (NVVM, nvJitLink) found, install it with "
            f"pip install 'fox_numba[cu13]' ({missing})",
            file=out,
        )
        return EXIT_NO_TOOLKIT

    from numba import cuda

    modules = import_package("fox_numba") + [_import_file(p) for p in extra]
    failures: list[str] = []
    for module in modules:
        for kernel in _kernels_defined_in(module):
            if kernel_name(kernel) not in KERNELS:
                failures.append(f"{kernel_name(kernel)}: not in the kernel registry (add @register(...))")
    keys = cache_keys(cc)
    n_sigs = 0
    for name, spec in sorted(KERNELS.items()):
        bounds = spec.kernel.targetoptions.get("launch_bounds")
        for sig in spec.signatures:
            n_sigs += 1
            try:
                ptx, _ = cuda.compile_ptx(spec.py_func, sig, cc=cc, launch_bounds=bounds)
            except Exception as e:
                detail = traceback.format_exception_only(type(e), e)[-1].strip()
                failures.append(f"{name}{tuple(str(t) for t in sig)}: {detail}")
                continue
            error = assemble(ptx, cc)
            if error is not None:
                failures.append(f"{name}{tuple(str(t) for t in sig)}: ptxas: {error}")
                continue
            shortfall = residency_shortfall(ptx, cc, bounds)
            if shortfall is not None:
                failures.append(f"{name}{tuple(str(t) for t in sig)}: {shortfall}")
    failures += [f"{name}: its kernel-cache key changed when kernels were compiled (saved where no fresh process "
                 "looks it up: an object its closure reaches is changed by code generation)"
                 for name, key in cache_keys(cc).items() if keys.get(name, key) != key]
    for line in failures:
        print(f"FAILED {line}", file=out)
    print(
        f"compile_check: {len(KERNELS)} kernels, {n_sigs} signatures, compiled and assembled for sm_{cc[0]}{cc[1]}: "
        f"{'OK' if not failures else f'{len(failures)} failed'}",
        file=out,
    )
    return EXIT_FAILED if failures else EXIT_OK


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cc", default="9.0", help="compute capability to compile for (default 9.0)")
    parser.add_argument("extra", nargs="*", type=Path, help="extra module files whose kernels to check")
    args = parser.parse_args(argv)
    major, minor = (int(x) for x in args.cc.split("."))
    return run((major, minor), args.extra)


if __name__ == "__main__":
    sys.exit(main())
