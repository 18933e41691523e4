"""Dropout of the trunk's hidden units in training (learner.dropout): inverted, with a counter-based mask.

    dropout(act, state, seed, layer, rate, stream=s)    act [rows, H] in place: 0 or act / (1 - rate)

Element (r, c) of hidden layer `layer` at gradient step `state[0].step` is dropped when u < rate, where
u = the top 24 bits of splitmix64(key) / 2**24 and

    key = seed * 0x9E3779B97F4A7C15 + step * 0xBF58476D1CE4E5B9 + layer * 0x94D049BB133111EB + r * H + c  (mod 2**64)

so the mask needs no random state: it is a function of (seed, step, layer, element), the same in the forward
and in a re-run of the step, and a captured graph draws a new one every step (the step is read on the
device). Kept units are scaled by 1 / (1 - rate), so collect and evaluation, which run without dropout,
see activations of the same expected size. The backward needs no mask of its own: a dropped unit's output
is 0, so the ReLU mask of the next layer's input-gradient (`act > 0`) removes it, and the kept units'
factor 1 / (1 - rate) is one scale of that gradient (agent/network.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import cuda, float32, from_dtype, int32, uint64

from fox_numba.device.launch import check_array, launch
from fox_numba.device.registry import register
from fox_numba.device.rng import modular
from fox_numba.kernels.optim import OPTIM_STATE_DTYPE, check_state

_STATE = from_dtype(OPTIM_STATE_DTYPE)
GOLDEN, MIX_STEP, MIX_LAYER = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
"""The key's multipliers (splitmix64's constants)."""


@modular
@cuda.jit(device=True)
def hash_uniform(seed, step, layer, i):  # type: ignore[no-untyped-def]
    """The element's u in [0, 1): splitmix64 of the key seed * GOLDEN + step * MIX_STEP + layer * MIX_LAYER + i,
    all modulo 2**64 (the hash wraps by design)."""
    z = seed * uint64(GOLDEN) + uint64(step) * uint64(MIX_STEP) + uint64(layer) * uint64(MIX_LAYER) + uint64(i)
    z = (z ^ (z >> uint64(30))) * uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> uint64(27))) * uint64(0x94D049BB133111EB)
    return float32((z ^ (z >> uint64(31))) >> uint64(40)) * float32(1.0 / (1 << 24))


@register((float32[:, ::1], _STATE[::1], uint64, int32, float32, float32))
@cuda.jit
def dropout_kernel(act, state, seed, layer, rate, keep_scale):
    """act[r, c] = 0 where the element's u < rate, else act[r, c] * keep_scale (module docstring)."""
    i = cuda.grid(1)
    hidden = act.shape[1]
    if i >= act.shape[0] * hidden:
        return
    u = hash_uniform(seed, state[0].step, layer, i)
    r, c = i // hidden, i % hidden
    if u < rate:
        act[r, c] = float32(0.0)
    else:
        act[r, c] *= keep_scale


def keep_scale(rate: float) -> np.float32:
    """1 / (1 - rate): the factor of every kept unit (and of the gradient through it)."""
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"learner.dropout must be in [0, 1), got {rate}")
    return np.float32(1.0 / (1.0 - rate))


def dropout(act: Any, state: Any, seed: int, layer: int, rate: float, *, stream: Any) -> None:
    """Drop and rescale act [rows, H] in place for gradient step state[0].step (module docstring)."""
    rows, hidden = (int(d) for d in act.shape)
    check_array("act", act, "[rows, H]", (rows, hidden))
    check_state(state)
    launch(dropout_kernel, rows * hidden, act, state, np.uint64(seed % 2**64), np.int32(layer), np.float32(rate),
           keep_scale(rate), stream=stream)  # fmt: skip
