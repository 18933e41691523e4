"""The position x market input of network.position_cross: each observation row beside its held position times each
of its market columns.

    position_cross(obs, x, n_cross=M, pos_col=p, stream=s)      x [B, D + M] = [obs | obs[:, p] * obs[:, :M]]

A linear head on the observation gives each action a value w . x + u . portfolio: the market and the held position
never multiply, yet the value of holding is q x . beta, bilinear in them (tools/results/learner_ablation_h200.md
section 27). The M crossed columns are the observation's market part (its first M columns), p its position column;
the result is what layer 0 (or the heads, without a trunk) reads. The observation is data, so no gradient flows
back through it.

Launch shape: one thread per element of x. The products are single float32 multiplies and the copies are exact, so
the output equals its float64 reference rounded once.
"""

from __future__ import annotations

from typing import Any

from numba import cuda, float32, int32

from fox_numba.device.launch import check_array, i32, launch
from fox_numba.device.registry import register

_F2 = float32[:, ::1]


@register((_F2, _F2, int32, int32))
@cuda.jit
def position_cross_kernel(obs, x, n_cross, pos_col):
    """x[b, c] = obs[b, c] for c < D, x[b, D + j] = obs[b, pos_col] * obs[b, j] for j < n_cross."""
    i = cuda.grid(1)
    cols = x.shape[1]
    if i < x.shape[0] * cols:
        b = i // cols
        c = i - b * cols
        d = obs.shape[1]
        x[b, c] = obs[b, c] if c < d else obs[b, pos_col] * obs[b, c - d]


def position_cross(obs: Any, x: Any, *, n_cross: int, pos_col: int, stream: Any) -> None:
    """x [B, D + n_cross] = obs [B, D] beside obs[:, pos_col] times its first n_cross columns (module header)."""
    batch, d = (int(n) for n in obs.shape)
    check_array("obs", obs, "[B, D]", (batch, d))
    check_array("x", x, "[B, D + M]", (batch, d + n_cross))
    if not (0 < n_cross <= d and 0 <= pos_col < d):
        raise ValueError(f"position_cross: need 0 < n_cross <= D and 0 <= pos_col < D; got n_cross = {n_cross}, "
                         f"pos_col = {pos_col}, D = {d}")
    launch(position_cross_kernel, batch * (d + n_cross), obs, x, i32(n_cross), i32(pos_col), stream=stream)
