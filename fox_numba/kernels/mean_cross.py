"""The direction mean head on the observation beside its position x market columns (network.mean_cross), fused:
its forward and weight gradient read the observation and form the crossed columns on the fly.

    mean_cross_forward(obs, w, b, m, n_cross=M, pos_col=p, stream=s)    m [R, 4]
    MeanCrossWeightGrad(rows, obs_dim, n_cross)(obs, dm, dw, db, pos_col=p, stream=s)   dw [D + M, 4], db [4]

With x = [obs | q obs[:, :M]] (q = obs[:, p], the held position; kernels/position_cross.py) the head is
m = x @ W + b, so for row i and direction d

    m[i, d]   = b[d] + sum_c obs[i, c] W[c, d] + q_i sum_(j < M) obs[i, j] W[D + j, d]
    dw[c, d]  = sum_i obs[i, c] dm[i, d],  dw[D + j, d] = sum_i q_i obs[i, j] dm[i, d],  db[d] = sum_i dm[i, d]

Why not the dense layers: the head has four outputs, and a GEMM launch tiles 64 or 128 of them, so on an H100 its
two forwards, their position x market staging and its weight gradient took 0.15 ms of the 0.45-ms default learner
step (tools/results/live_branches_h100.md). Here each thread reads one row's observation once for all its terms,
and the crossed columns are never written. There is no input gradient: network.mean_cross needs a linear network,
whose input is data.

Arithmetic: exact float32 (no tensor cores at any run.precision; four columns fill no tile), summed over the columns
in order (the plain and the crossed sum apart, then b + plain + q crossed); the weight gradient sums each split of
SPLIT_ROWS rows in order into a float32 partial, then the splits in order: the same bits on every run of a shape.
Launch shapes: the forward one thread per (row, direction), grid-stride; the gradient one thread per (input column
or the bias, split), then one per output element.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import cuda, float32, int32

from fox_numba.actions import N_DIRECTIONS
from fox_numba.device.launch import check_array, i32, launch, launch_2d, launch_strided
from fox_numba.device.memory import device_empty
from fox_numba.device.registry import register

SPLIT_ROWS = 128
"""Rows each weight-gradient thread sums before the splits are added (8,192 rows: 64 splits)."""
_F1 = float32[::1]
_F2 = float32[:, ::1]


@register((_F2, _F2, _F1, _F2, int32, int32))
@cuda.jit
def mean_cross_forward_kernel(obs, w, b, m, n_cross, pos_col):
    """m[i, d] of the module header, one (row, direction) per thread, grid-stride."""
    d_obs = obs.shape[1]
    n = m.shape[0] * m.shape[1]
    k = cuda.grid(1)
    while k < n:
        i = k // m.shape[1]
        d = k - i * m.shape[1]
        plain = float32(0.0)
        crossed = float32(0.0)
        for c in range(d_obs):
            v = obs[i, c]
            plain += v * w[c, d]
            if c < n_cross:
                crossed += v * w[d_obs + c, d]
        m[i, d] = b[d] + plain + obs[i, pos_col] * crossed
        k += cuda.gridsize(1)


@register((_F2, _F2, float32[:, :, ::1], int32, int32))
@cuda.jit
def mean_cross_wgrad_partials(obs, dm, partials, n_cross, pos_col):
    """partials[s, c, d]: split s's sum over its rows of column c of [obs | q obs[:, :M] | 1] times dm[:, d]."""
    c, s = cuda.grid(2)
    d_obs = obs.shape[1]
    if c < partials.shape[1] and s < partials.shape[0]:
        a0 = float32(0.0)
        a1 = float32(0.0)
        a2 = float32(0.0)
        a3 = float32(0.0)
        end = min(obs.shape[0], (s + 1) * SPLIT_ROWS)
        for i in range(s * SPLIT_ROWS, end):
            if c < d_obs:
                v = obs[i, c]
            elif c < d_obs + n_cross:
                v = obs[i, pos_col] * obs[i, c - d_obs]
            else:
                v = float32(1.0)
            a0 += v * dm[i, 0]
            a1 += v * dm[i, 1]
            a2 += v * dm[i, 2]
            a3 += v * dm[i, 3]
        partials[s, c, 0] = a0
        partials[s, c, 1] = a1
        partials[s, c, 2] = a2
        partials[s, c, 3] = a3


@register((float32[:, :, ::1], _F2, _F1))
@cuda.jit
def mean_cross_wgrad_reduce(partials, dw, db):
    """dw[c, d] (c < D + M) and db[d] (the last column of the partials): the splits summed in order."""
    k = cuda.grid(1)
    cols = partials.shape[1]
    if k < cols * N_DIRECTIONS:
        c = k // N_DIRECTIONS
        d = k - c * N_DIRECTIONS
        s = float32(0.0)
        for j in range(partials.shape[0]):
            s += partials[j, c, d]
        if c < dw.shape[0]:
            dw[c, d] = s
        else:
            db[d] = s


def _check_columns(d_obs: int, n_cross: int, pos_col: int) -> None:
    if not (0 < n_cross <= d_obs and 0 <= pos_col < d_obs):
        raise ValueError(f"mean_cross: need 0 < n_cross <= D and 0 <= pos_col < D; got n_cross = {n_cross}, "
                         f"pos_col = {pos_col}, D = {d_obs}")


def mean_cross_forward(obs: Any, w: Any, b: Any, m: Any, *, n_cross: int, pos_col: int, stream: Any) -> None:
    """m [R, 4] = [obs | obs[:, pos_col] obs[:, :n_cross]] @ w + b from obs [R, D], w [D + n_cross, 4], b [4]."""
    rows, d_obs = (int(n) for n in obs.shape)
    _check_columns(d_obs, n_cross, pos_col)
    check_array("obs", obs, "[R, D]", (rows, d_obs))
    check_array("w", w, "[D + M, 4]", (d_obs + n_cross, N_DIRECTIONS))
    check_array("b", b, "[4]", (N_DIRECTIONS,))
    check_array("m", m, "[R, 4]", (rows, N_DIRECTIONS))
    launch_strided(mean_cross_forward_kernel, rows * N_DIRECTIONS, obs, w, b, m, i32(n_cross), i32(pos_col),
                   stream=stream, block=128)


class MeanCrossWeightGrad:
    """dw = [obs | q obs[:, :M]].T @ dm and db = dm summed over rows, for `rows` rows of a D-column observation;
    holds the splits' float32 partials (module header)."""

    def __init__(self, rows: int, obs_dim: int, n_cross: int) -> None:
        _check_columns(obs_dim, n_cross, 0)
        self.rows, self.obs_dim, self.n_cross = rows, obs_dim, n_cross
        self.splits = -(-rows // SPLIT_ROWS)
        self.partials = device_empty((self.splits, obs_dim + n_cross + 1, N_DIRECTIONS), np.float32)

    def __call__(self, obs: Any, dm: Any, dw: Any, db: Any, *, pos_col: int, stream: Any) -> None:
        d, n_cross = self.obs_dim, self.n_cross
        _check_columns(d, n_cross, pos_col)
        check_array("obs", obs, "[rows, D]", (self.rows, d))
        check_array("dm", dm, "[rows, 4]", (self.rows, N_DIRECTIONS))
        check_array("dw", dw, "[D + M, 4]", (d + n_cross, N_DIRECTIONS))
        check_array("db", db, "[4]", (N_DIRECTIONS,))
        launch_2d(mean_cross_wgrad_partials, d + n_cross + 1, self.splits, obs, dm, self.partials, i32(n_cross),
                  i32(pos_col), stream=stream, block=(64, 1))
        launch(mean_cross_wgrad_reduce, (d + n_cross + 1) * N_DIRECTIONS, self.partials, dw, db, stream=stream)
