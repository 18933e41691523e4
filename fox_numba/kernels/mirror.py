"""The direction mean head made mirror-symmetric (network.mirror): a projection of its weights after each step.

    mirror_project(params, parity, w_offset=o_w, b_offset=o_b, stream=s)    in place on the flat parameters

The market's mirror (every price reflected about a level: observation.py MIRROR_EVEN) maps a state (x, q) to
(P x, -q) and the direction Short to Long and back (Hold and Flat to themselves), and a symmetric market prices the
mirrored state's directions as the state's: m(P x, -q, sigma d) = m(x, q, d). For the linear head m = x' W + b on
its input x' (the observation and its position x market columns, kernels/mean_cross.py) with each input column's
parity p_i (+1 kept, -1 negated by the mirror), that holds when W[i, d] = p_i W[i, sigma d] and b[d] = b[sigma d].
The projection onto those weights is the mean of W and its mirror image:

    W[i, S], W[i, L] <- (W[i, S] + p_i W[i, L]) / 2, (W[i, L] + p_i W[i, S]) / 2
    W[i, H], W[i, F] <- W[i, H] (1 + p_i) / 2, W[i, F] (1 + p_i) / 2         (0 on a negated column)
    b as a row of parity +1

With a strength s < 1 (network.mirror_strength) each value moves the fraction s of the way, v <- v + s (proj - v):
the part of the head that breaks the symmetry shrinks by (1 - s) a step, a weight decay on the asymmetry alone,
which the gradient can hold up where the training data keep asking for it. s = 1 writes the projection itself.

Why: in the agent's linear replica the symmetry raised 11 of the suite's 14 folds (tools/results/
learner_ablation_h200.md section 61); on the suite, at strength 0.01, the seen markets gained +0.46 (SE 0.11) and
the held-out ones +1.68 (0.20) over ten seeds (section 64), the default since. A projection costs one small launch
a step, where training on mirrored batches as well would double the step. Launch: one thread per weight row and one
for the bias (`launch`); each writes its own four values from its own four: no order to fix, the same bits on every
run.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import cuda, float32, int32

from fox_numba.actions import N_DIRECTIONS, Direction
from fox_numba.device.launch import check_array, i32, launch
from fox_numba.device.registry import register
from fox_numba.device.runtime import u32

_S, _H, _L, _F = int(Direction.SHORT), int(Direction.HOLD), int(Direction.LONG), int(Direction.FLAT)
_HALF = float32(0.5)


@cuda.jit(device=True)
def toward(v, target, strength):
    """v moved the fraction `strength` of the way to target; the target itself at strength 1 (the same bits)."""
    if strength >= float32(1.0):
        return target
    return v + strength * (target - v)


@register((float32[::1], float32[::1], int32, int32, float32))
@cuda.jit
def mirror_project_kernel(params, parity, w_offset, b_offset, strength):
    """Row i < len(parity) of the weights at w_offset ([rows, 4], row-major), row len(parity) the bias at b_offset;
    each moved toward its projection as the module header says."""
    i = u32(cuda.grid(1))
    rows = u32(parity.shape[0])
    if i > rows:
        return
    p = parity[i] if i < rows else float32(1.0)
    base = u32(w_offset) + i * u32(N_DIRECTIONS) if i < rows else u32(b_offset)
    s, h, lo, f = params[base + u32(_S)], params[base + u32(_H)], params[base + u32(_L)], params[base + u32(_F)]
    params[base + u32(_S)] = toward(s, _HALF * (s + p * lo), strength)
    params[base + u32(_L)] = toward(lo, _HALF * (lo + p * s), strength)
    params[base + u32(_H)] = toward(h, _HALF * (h + p * h), strength)
    params[base + u32(_F)] = toward(f, _HALF * (f + p * f), strength)


def mirror_project(params: Any, parity: Any, *, w_offset: int, b_offset: int, strength: float = 1.0,
                   stream: Any) -> None:
    """The mean head's weights [rows, 4] at w_offset and bias [4] at b_offset of the flat params moved the fraction
    `strength` (0, 1] of the way to their mirror-symmetric projection for the input columns' parity [rows]
    (module header)."""
    rows = int(parity.shape[0])
    check_array("parity", parity, "[rows]", (rows,))
    n = int(params.shape[0])
    check_array("params", params, "[n]", (n,))
    if not (0 <= w_offset and w_offset + rows * N_DIRECTIONS <= n and 0 <= b_offset <= n - N_DIRECTIONS):
        raise ValueError(f"mirror_project: weights [{rows}, {N_DIRECTIONS}] at {w_offset} or the bias at {b_offset} "
                         f"outside the {n} parameters")
    if not 0.0 < strength <= 1.0:
        raise ValueError(f"mirror_project: strength {strength} outside (0, 1]")
    launch(mirror_project_kernel, rows + 1, params, parity, i32(w_offset), i32(b_offset), np.float32(strength),
           stream=stream)

