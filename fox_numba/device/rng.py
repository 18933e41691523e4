"""Random-number states and draws for kernels: numba's xoroshiro128+ generators, built on the host.

Kernels draw with this module's `xoroshiro128p_next` / `xoroshiro128p_uniform_float32` / `..._float64`
(bit-exact between the simulator and the GPU): numba.cuda.random's device functions themselves on a GPU.
Under the simulator they run in object mode on numpy uint64 scalars, and the generator's output
`s0 + s1` (xoroshiro128plus.c: a uint64_t sum, modulo 2**64 by definition) makes numpy warn
"overflow encountered in scalar add" whenever the sum passes 2**64, about every other draw: the wrap
is the algorithm's arithmetic, the same the GPU does silently (tests/device/test_rng_states.py checks the
draws against Python integers modulo 2**64). So the simulator's draws run under
`np.errstate(over="ignore")`, set inside each call because numpy's error state is per thread and the
simulator runs each CUDA thread in its own; no other operation's warnings are touched.

numba's own `create_xoroshiro128p_states` runs its host initialisation in object mode under the simulator (about 5 ms
per state) and copies with `to_device`; this module computes the same states (SplitMix64 seeding, then one 2**64-step
jump per state) in a CPU-compiled loop and uploads them through the `Stager`, identical bits either way.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
from numba import njit
from numba.cuda import random as cuda_random
from numba.cuda.random import xoroshiro128p_dtype

from fox_numba.device.kernel_cache import stable_identity
from fox_numba.device.runtime import SIMULATOR
from fox_numba.device.staging import Stager

XOROSHIRO_DTYPE = xoroshiro128p_dtype

_U = np.uint64
_JUMP = (_U(0xBEAC0467EBA5FACB), _U(0xD86B048B86AA9922))


@njit
def _rotl(x: np.uint64, k: int) -> np.uint64:
    return (x << _U(k)) | (x >> _U(64 - k))


@njit
def _fill_states(s0: np.ndarray, s1: np.ndarray, seed: np.uint64, subsequence_start: int) -> None:
    z = seed + _U(0x9E3779B97F4A7C15)
    z = (z ^ (z >> _U(30))) * _U(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> _U(27))) * _U(0x94D049BB133111EB)
    z = z ^ (z >> _U(31))
    a, b = z, z
    for k in range(subsequence_start + s0.size):
        if k >= subsequence_start:
            s0[k - subsequence_start] = a
            s1[k - subsequence_start] = b
        j0, j1 = _U(0), _U(0)
        for word in _JUMP:
            for bit in range(64):
                if word & (_U(1) << _U(bit)):
                    j0 ^= a
                    j1 ^= b
                b ^= a
                a = _rotl(a, 55) ^ b ^ (b << _U(14))
                b = _rotl(b, 36)
        a, b = j0, j1


def xoroshiro_states_host(n: int, seed: int, subsequence_start: int = 0) -> np.ndarray:
    """`n` generator states, each 2**64 draws after the previous one (numba's layout and values)."""
    if n < 1:
        raise ValueError(f"need at least one generator, got {n}")
    s0, s1 = np.empty(n, np.uint64), np.empty(n, np.uint64)
    _fill_states(s0, s1, _U(seed % 2**64), int(subsequence_start))
    states = np.empty(n, XOROSHIRO_DTYPE)
    states["s0"], states["s1"] = s0, s1
    return states


def xoroshiro_states(n: int, seed: int, stager: Stager, subsequence_start: int = 0) -> Any:
    """A device array of `n` generator states for `numba.cuda.random` draws."""
    return stager.upload_new(xoroshiro_states_host(n, seed, subsequence_start))


def modular(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A device function whose unsigned arithmetic wraps by design (modulo 2**32 or 2**64, as C's does): `fn`
    itself on the GPU; under the simulator, `fn` with numpy's overflow warning off for the call (module
    docstring), so the simulator says nothing about a wrap the algorithm intends and the GPU does silently."""
    if not SIMULATOR:
        return fn

    @functools.wraps(fn)
    def wrapped(*args: Any) -> Any:
        with np.errstate(over="ignore"):
            return fn(*args)

    return wrapped


def fix_generator_identities() -> None:
    """Fixed identities for numba.cuda.random's jit functions (on the GPU; kernel_cache.stable_identity): they pickle
    by value, each with an identity drawn per process, into the cache key of every kernel that reaches one from a
    factory."""
    if SIMULATOR:
        return
    for name, fn in sorted(vars(cuda_random).items()):
        if hasattr(fn, "_set_uuid") and not isinstance(fn, type):  # its jit functions, not a class
            stable_identity(fn, f"numba.cuda.random.{name}")


fix_generator_identities()

xoroshiro128p_next = modular(cuda_random.xoroshiro128p_next)
xoroshiro128p_uniform_float32 = modular(cuda_random.xoroshiro128p_uniform_float32)
xoroshiro128p_uniform_float64 = modular(cuda_random.xoroshiro128p_uniform_float64)
