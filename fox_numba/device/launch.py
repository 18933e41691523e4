"""Kernel launches: grid sizes from element counts, the stream always explicit, arguments checked.

Every kernel launch in the package goes through `launch` (1-D, one thread per element), `launch_strided`
(1-D grid-stride kernels: one thread per element on the GPU, one small block under the simulator),
`launch_2d` (one thread per element of a 2-D range), `launch_rows` (one block per row, for block
reductions and single-thread producers) or `launch_tiles` (one block per output tile, for register-tiled
kernels). They
- compute the grid, so no stage sizes grids by hand;
- take the stream as a required keyword: the legacy default stream cannot be captured into a graph;
- refuse plain numpy arrays (numba would copy them to the device and back at every launch, and the
  simulator does so without a warning), unregistered kernels (they would escape the sm_90 compile
  check) and argument types that match none of the kernel's registered signatures (a Python float makes
  the GPU compute in float64);
- append each launch to the active `LaunchTrace` (a `StepGraph` records one per replay), and time it
  under the active kernel timer of `fox_numba.device.timing`.
A step body launches on its stream or on a side stream forked from it (`device/fork.py`), whose launches a
captured graph runs beside the step stream's; the trace records each launch's lane and refuses a side stream
that was not forked, or that is launched on after its join.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numba import typeof, types
from numba.np.numpy_support import as_dtype

from fox_numba.device import timing
from fox_numba.device.registry import KERNELS, kernel_name
from fox_numba.device.runtime import SIMULATOR, device_address, is_device_array, is_host_array

DEFAULT_BLOCK = 256
DEFAULT_BLOCK_2D = (32, 8)
# The simulator runs each CUDA thread as a Python thread: creating one costs ~100 us, one loop iteration
# of a kernel ~2 us. A grid-stride kernel therefore runs under it as one block of this many threads.
SIM_STRIDE_THREADS = 4
_MAX_GRID_YZ = 65535
_INT32_MAX = 2**31 - 1


class LaunchError(RuntimeError):
    """A launch the GPU would run differently from the simulator, or not at all."""


@dataclass(frozen=True)
class LaunchRecord:
    """One launch as a graph freezes it: kernel, grid, block, and one key per argument.

    An array's key is ("array", device address, shape, dtype), a numpy scalar's (dtype, value bytes), a
    Python scalar's ("python", repr).
    """

    kernel: str
    grid: tuple[int, ...]
    block: tuple[int, ...]
    args: tuple[tuple[Any, ...], ...]
    lane: int = 0  # 0: the step's stream; k: the k-th side stream forked in the step (device/fork.py)

    @property
    def addresses(self) -> tuple[int, ...]:
        return tuple(a[1] for a in self.args if a[0] == "array")

    def shown(self, pos: int) -> str:
        """Argument `pos` in words, for error messages."""
        key = self.args[pos]
        if key[0] == "array":
            return f"{key[3]}{key[2]} array at {key[1]:#x}"
        if key[0] == "python":
            return f"Python {key[1]}"
        return f"{np.dtype(key[0]).name} {np.frombuffer(key[1], key[0])[0]!r}"


@dataclass
class LaunchTrace:
    """The launches of one run of a step body, in order; `capturing` while a CUDA graph records them."""

    stream: Any
    capturing: bool = False
    launches: list[LaunchRecord] = field(default_factory=list)
    arrays: list[Any] = field(default_factory=list)  # kept alive while a graph holds their addresses
    notes: list[tuple[int, Any]] = field(default_factory=list)  # (launch position, object) e.g. uploads
    sides: list[Any] = field(default_factory=list)  # side streams forked from `stream`, lane k at k - 1
    forked: set[int] = field(default_factory=set)  # lanes forked and not yet joined

    def note(self, obj: Any) -> None:
        """Mark that `obj` (a control block upload, say) happened before the next launch."""
        self.notes.append((len(self.launches), obj))

    def fork(self, side: Any) -> None:
        """`side` now follows the step's stream: its launches belong to the step until `join`."""
        if not any(side is s for s in self.sides):
            self.sides.append(side)
        self.forked.add(self._lane(side))

    def join(self, side: Any) -> None:
        """The step's stream waits for `side` from here on: no launch on it until the next fork."""
        self.forked.discard(self._lane(side))

    def _lane(self, stream: Any) -> int:
        """0 for the step's stream, k for its k-th side stream, -1 for any other stream."""
        if stream is self.stream:
            return 0
        return next((k + 1 for k, s in enumerate(self.sides) if s is stream), -1)

    def lane(self, stream: Any, kernel: str) -> int:
        """The lane of a launch of `kernel` on `stream`; LaunchError where a graph would not capture it."""
        lane = self._lane(stream)
        if lane == 0 or lane in self.forked:
            return lane
        if lane < 0:
            raise LaunchError(f"{kernel}: launched on another stream than its step's (not captured)")
        raise LaunchError(f"{kernel}: launched on side stream {lane} after its join (not ordered before the step's "
                          "end): fork it again first")


_ACTIVE_TRACE: ContextVar[LaunchTrace | None] = ContextVar("fox_launch_trace", default=None)


def active_trace() -> LaunchTrace | None:
    """The trace being recorded by a step body, or None outside one."""
    return _ACTIVE_TRACE.get()


@contextlib.contextmanager
def tracing(trace: LaunchTrace) -> Iterator[LaunchTrace]:
    """Record every launch made inside the block into `trace`."""
    if _ACTIVE_TRACE.get() is not None:
        raise LaunchError("a step body cannot run another step body (traces do not nest)")
    token = _ACTIVE_TRACE.set(trace)
    try:
        yield trace
    finally:
        _ACTIVE_TRACE.reset(token)


def _dtype_key(numba_type: Any) -> tuple[Any, ...]:
    """(kind, numpy dtype, ndim) of a registered argument type: what a launch can check cheaply."""
    if isinstance(numba_type, types.Array):
        return ("array", as_dtype(numba_type.dtype), numba_type.ndim)
    return ("scalar", as_dtype(numba_type), 0)


def _arg_dtype_key(arg: Any) -> tuple[Any, ...]:
    if is_device_array(arg):
        return ("array", arg.dtype, arg.ndim)
    if isinstance(arg, np.generic):
        return ("scalar", arg.dtype, 0)
    return ("python", type(arg).__name__, 0)


@dataclass
class _Kernel:
    """What a launch needs to know about a registered kernel, looked up once per kernel."""

    name: str
    short: str  # `elementwise.fill_f32` for `fox_numba.device.elementwise.fill_f32`: the timer's name
    signatures: tuple[tuple[Any, ...], ...]
    dtype_keys: frozenset[tuple[tuple[Any, ...], ...]]


_KNOWN: dict[Any, _Kernel] = {}


def _kernel(kernel: Any) -> _Kernel:
    known = _KNOWN.get(kernel)
    if known is None:
        name = kernel_name(kernel)
        spec = KERNELS.get(name)
        if spec is None:
            raise LaunchError(f"{name} is not in the kernel registry: add @register(...) with its signatures")
        keys = frozenset(tuple(_dtype_key(t) for t in sig) for sig in spec.signatures)
        known = _KNOWN[kernel] = _Kernel(name, short_kernel_name(name), spec.signatures, keys)
    return known


def short_kernel_name(name: str) -> str:
    """`module.kernel` of a kernel's full name (`fox_numba.kernels.gemm.wgrad_reduce` -> `gemm.wgrad_reduce`)."""
    return ".".join(name.split(".")[-2:])


def _check_args(k: _Kernel, args: tuple[Any, ...]) -> None:
    """Refuse host arrays and arguments whose types match no registered signature.

    Every launch compares dtypes and dimensions (cheap); the simulator, which compiles nothing and
    checks no types, also compares the exact numba types (layouts included).
    """
    for pos, arg in enumerate(args):
        if is_host_array(arg):
            raise LaunchError(
                f"{k.name}: argument {pos} is a plain numpy array, which numba copies to the device and "
                "back at every launch; stage it with Stager.upload or pass a Mapped buffer's .device"
            )
    if tuple(_arg_dtype_key(a) for a in args) not in k.dtype_keys or (
        SIMULATOR and tuple(typeof(a) for a in args) not in k.signatures
    ):
        registered = "; ".join("(" + ", ".join(map(str, sig)) + ")" for sig in k.signatures)
        given = ", ".join(str(typeof(a)) if not is_host_array(a) else "ndarray" for a in args)
        raise LaunchError(
            f"{k.name}: argument types ({given}) match no registered signature ({registered}); "
            "pass numpy scalars of the registered dtypes (np.float32, np.int32)"
        )


def _arg_key(arg: Any) -> tuple[Any, ...]:
    if is_device_array(arg):
        return ("array", device_address(arg), tuple(arg.shape), arg.dtype)
    if isinstance(arg, np.generic):
        return (arg.dtype.str, arg.tobytes())
    return ("python", repr(arg))


def _launch(
    kernel: Any, grid: tuple[int, ...], block: tuple[int, ...], args: tuple[Any, ...], stream: Any
) -> None:
    k = _kernel(kernel)
    if stream is None:
        raise LaunchError(f"{k.name}: launches need an explicit stream")
    _check_args(k, args)
    trace = _ACTIVE_TRACE.get()
    if trace is not None:
        lane = trace.lane(stream, k.name)
        trace.launches.append(LaunchRecord(k.name, grid, block, tuple(_arg_key(a) for a in args), lane))
        trace.arrays.extend(a for a in args if is_device_array(a))
    timer = timing.active_kernel_timer()
    if timer is not None and not (trace is not None and trace.capturing):
        with timer.region(f"{k.short} {'x'.join(map(str, grid))}" if timer.by_grid else k.short, stream):
            kernel[grid, block, stream](*args)
    else:
        kernel[grid, block, stream](*args)


def check_array(name: str, arr: Any, dims: str, shape: tuple[int, ...] | None, dtype: Any = np.float32) -> None:
    """The one argument check of every kernel wrapper: `arr` must be a C-contiguous device array of `dtype`
    and, unless `shape` is None, of `shape` (described by `dims`, e.g. "[B, A, Z]").

    TypeError for a host array (numba would copy it at every launch), ValueError for a wrong dtype,
    layout or shape; both name the argument.
    """
    if not is_device_array(arr):
        raise TypeError(f"{name} is a {type(arr).__name__}, not a device array")
    got = tuple(int(d) for d in arr.shape)
    contiguous = arr.flags["C_CONTIGUOUS"]
    if arr.dtype != np.dtype(dtype) or not contiguous or (shape is not None and got != tuple(shape)):
        want = f"{np.dtype(dtype).name} array" + ("" if shape is None else f" {dims} = {tuple(shape)}")
        raise ValueError(
            f"{name} must be a C-contiguous {want}, got {arr.dtype}{got}{'' if contiguous else ' (not C-contiguous)'}"
        )


def i32(n: int) -> np.int32:
    """An element count or index as the int32 kernels take, refusing values int32 cannot hold."""
    if not 0 <= n <= _INT32_MAX:
        raise ValueError(f"{n} does not fit the int32 kernel argument")
    return np.int32(n)


def grid_1d(n: int, block: int = DEFAULT_BLOCK) -> int:
    """Blocks of `block` threads that cover `n` elements."""
    if n < 1:
        raise ValueError(f"nothing to launch: {n} elements")
    return (n + block - 1) // block


def launch(kernel: Any, n: int, *args: Any, stream: Any, block: int = DEFAULT_BLOCK) -> None:
    """Launch `kernel` with one thread per element of `n` (the kernel guards `i < n`)."""
    _launch(kernel, (grid_1d(n, block),), (block,), args, stream)


def strided_blocks(n: int, block: int = DEFAULT_BLOCK) -> int:
    """Blocks `launch_strided` starts for `n` elements (1 under the simulator)."""
    return 1 if SIMULATOR else grid_1d(n, block)


def strided_threads(block: int = DEFAULT_BLOCK) -> int:
    """Threads per block of `launch_strided` (min(block, SIM_STRIDE_THREADS) under the simulator); also
    the block a single-block reduction launches with (`launch_rows(kernel, 1, strided_threads(b), ...)`)."""
    return min(block, SIM_STRIDE_THREADS) if SIMULATOR else block


def launch_strided(kernel: Any, n: int, *args: Any, stream: Any, block: int = DEFAULT_BLOCK) -> None:
    """Launch a grid-stride kernel over `n` elements (`for i in range(cuda.grid(1), n, cuda.gridsize(1))`):
    one thread per element on the GPU (blocks of `block`), one block of min(block, SIM_STRIDE_THREADS)
    threads under the simulator. A kernel whose blocks reduce in shared memory sizes its tree from
    `cuda.blockDim.x` (a power of two when `block` is)."""
    _launch(kernel, (strided_blocks(n, block),), (strided_threads(block),), args, stream)


def launch_2d(
    kernel: Any, nx: int, ny: int, *args: Any, stream: Any, block: tuple[int, int] = DEFAULT_BLOCK_2D
) -> None:
    """One thread per element of an `nx` x `ny` range; `x, y = cuda.grid(2)`, x the contiguous axis."""
    grid = (grid_1d(nx, block[0]), grid_1d(ny, block[1]))
    if grid[1] > _MAX_GRID_YZ:
        raise ValueError(f"ny={ny} needs {grid[1]} blocks in y, more than CUDA's {_MAX_GRID_YZ}")
    _launch(kernel, grid, tuple(block), args, stream)


def launch_tiles(kernel: Any, tiles: tuple[int, ...], threads: int, *args: Any, stream: Any) -> None:
    """One block of `threads` threads per tile of a 1-3-D grid of output tiles (register-tiled kernels,
    whose wrappers count the tiles from the shapes and the tile size beside their kernels)."""
    if not 1 <= len(tiles) <= 3 or min(tiles) < 1 or threads < 1:
        raise ValueError(f"nothing to launch: tiles {tiles} of {threads} threads")
    if max(tiles[1:], default=1) > _MAX_GRID_YZ:
        raise ValueError(f"tiles {tiles} exceed CUDA's {_MAX_GRID_YZ} blocks in y or z")
    _launch(kernel, tuple(tiles), (threads,), args, stream)


def launch_rows(kernel: Any, n_rows: int, threads: int, *args: Any, stream: Any) -> None:
    """One block of `threads` threads per row (`cuda.blockIdx.x` is the row); (1, 1) for a producer."""
    if n_rows < 1 or threads < 1:
        raise ValueError(f"nothing to launch: {n_rows} rows of {threads} threads")
    _launch(kernel, (n_rows,), (threads,), args, stream)
