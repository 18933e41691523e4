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
step (tools/results/live_branches_h100.md). Here blocks stage tiles of the observation in shared memory, read from
global memory once and coalesced, and the crossed columns are never written. There is no input gradient:
network.mean_cross needs a linear network, whose input is data.

Arithmetic: exact float32 (no tensor cores at any run.precision; four columns fill no tile). The forward sums the
plain and the crossed terms apart, each over the columns in order, then b + plain + q crossed; the weight gradient
sums each split of SPLIT_ROWS rows in order into a float32 partial, then the splits in order: the same bits on every
run of a shape. Launch shapes: the forward a block of TILE_ROWS x 4 threads per TILE_ROWS rows, one thread per
(row, direction), walking the columns TILE_COLS at a time; the gradient a block of TILE_COLS x 4 threads per
(column tile, split), one per (column, direction), walking the split's rows TILE_ROWS at a time, then a grid-stride
pass over the outputs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import cuda, float32, int32

from fox_numba.actions import N_DIRECTIONS
from fox_numba.device.launch import check_array, i32, launch_strided, launch_tiles
from fox_numba.device.memory import device_empty
from fox_numba.device.registry import register
from fox_numba.device.runtime import u32

TILE_ROWS = 32
"""Rows of the observation each block stages in shared memory at a time (both kernels)."""
TILE_COLS = 64
"""Observation columns per staged tile: the forward walks the columns tile by tile; the gradient's blocks each own one
tile of columns (grid x)."""
SPLIT_ROWS = 128
"""Rows each weight-gradient block sums before the splits are added (8,192 rows: 64 splits)."""
_PAD = TILE_COLS + 1  # a tile row's stride in shared memory: rows land in different banks
_FWD_THREADS = TILE_ROWS * N_DIRECTIONS  # the forward's block: one thread per (row, direction) of a row tile
_GRAD_THREADS = TILE_COLS * N_DIRECTIONS  # the gradient's block: one thread per (column, direction) of its tile
# uint32 walks (kernels/head_rows.py's header): numba's int64 indices cost a negative-index wrap and 64-bit arithmetic
# per access, which made the first tiled forward as slow as an untiled one (28 us a launch on an H100).
_ND, _TC, _TR, _PD = (np.uint32(n) for n in (N_DIRECTIONS, TILE_COLS, TILE_ROWS, _PAD))
_TILE, _FT, _GT = (np.uint32(n) for n in (TILE_ROWS * TILE_COLS, _FWD_THREADS, _GRAD_THREADS))
_ONE = np.uint32(1)
_SH_TILE, _SH_W, _SH_DM = TILE_ROWS * _PAD, TILE_COLS * N_DIRECTIONS, TILE_ROWS * N_DIRECTIONS  # shared sizes
_F1 = float32[::1]
_F2 = float32[:, ::1]


@cuda.jit(device=True)
def _stage_tile(tile, obs, r0, c0, rows, d_obs, tid, threads):
    """tile[rr * _PAD + cc] = obs[r0 + rr, c0 + cc] for the TILE_ROWS x TILE_COLS tile, 0 outside obs."""
    e = tid
    while e < _TILE:
        rr = u32(e // _TC)
        cc = u32(e - rr * _TC)
        row = u32(r0 + rr)
        col = u32(c0 + cc)
        tile[u32(rr * _PD + cc)] = obs[row, col] if row < rows and col < d_obs else float32(0.0)
        e = u32(e + threads)


@register((_F2, _F2, _F1, _F2, int32, int32))
@cuda.jit
def mean_cross_forward_kernel(obs, w, b, m, n_cross, pos_col):
    """m[i, d] of the module header; block x holds rows TILE_ROWS x .. and walks the columns a tile at a time."""
    tile = cuda.shared.array(_SH_TILE, float32)
    w_plain = cuda.shared.array(_SH_W, float32)
    w_cross = cuda.shared.array(_SH_W, float32)
    tid = u32(cuda.threadIdx.x)
    r0 = u32(cuda.blockIdx.x * TILE_ROWS)
    rows, d_obs, n_c = u32(obs.shape[0]), u32(obs.shape[1]), u32(n_cross)
    r = u32(tid // _ND)
    d = u32(tid - r * _ND)
    base = u32(r * _PD)
    plain = float32(0.0)
    crossed = float32(0.0)
    c0 = u32(0)
    while c0 < d_obs:
        _stage_tile(tile, obs, r0, c0, rows, d_obs, tid, _FT)
        e = tid
        while e < u32(_TC * _ND):
            col = u32(c0 + u32(e // _ND))
            dd = u32(e - u32(e // _ND) * _ND)
            w_plain[e] = w[col, dd] if col < d_obs else float32(0.0)
            w_cross[e] = w[u32(d_obs + col), dd] if col < n_c else float32(0.0)
            e = u32(e + _FT)
        cuda.syncthreads()
        cc = u32(0)
        while cc < _TC:
            v = tile[u32(base + cc)]
            k = u32(cc * _ND + d)
            plain += v * w_plain[k]
            crossed += v * w_cross[k]
            cc = u32(cc + _ONE)
        cuda.syncthreads()
        c0 = u32(c0 + _TC)
    row = u32(r0 + r)
    if row < rows:
        m[row, d] = b[d] + plain + obs[row, pos_col] * crossed


@register((_F2, _F2, float32[:, :, ::1], int32, int32))
@cuda.jit
def mean_cross_wgrad_partials(obs, dm, partials, n_cross, pos_col):
    """partials[s, c, d]: split s's (grid y) sum over its rows of column c of [obs | q obs[:, :M] | 1] times
    dm[:, d], for the columns of tile grid x (their crossed columns, and the bias in tile 0)."""
    tile = cuda.shared.array(_SH_TILE, float32)
    dm_t = cuda.shared.array(_SH_DM, float32)
    q_t = cuda.shared.array(TILE_ROWS, float32)
    tid = u32(cuda.threadIdx.x)
    d = u32(tid // _TC)
    cc = u32(tid - d * _TC)
    c0 = u32(cuda.blockIdx.x * TILE_COLS)
    s = cuda.blockIdx.y
    rows, d_obs, n_c = u32(obs.shape[0]), u32(obs.shape[1]), u32(n_cross)
    plain = float32(0.0)
    crossed = float32(0.0)
    bias = float32(0.0)
    r0 = u32(s * SPLIT_ROWS)
    end = min(rows, u32(r0 + SPLIT_ROWS))
    while r0 < end:
        _stage_tile(tile, obs, r0, c0, rows, d_obs, tid, _GT)
        if tid < u32(_TR * _ND):
            row = u32(r0 + u32(tid // _ND))
            dm_t[tid] = dm[row, u32(tid - u32(tid // _ND) * _ND)] if row < rows else float32(0.0)
        if tid < _TR:
            row = u32(r0 + tid)
            q_t[tid] = obs[row, pos_col] if row < rows else float32(0.0)
        cuda.syncthreads()
        rr = u32(0)
        while rr < _TR:
            v = tile[u32(rr * _PD + cc)]
            g = dm_t[u32(rr * _ND + d)]
            plain += v * g
            crossed += (q_t[rr] * v) * g
            bias += g
            rr = u32(rr + _ONE)
        cuda.syncthreads()
        r0 = u32(r0 + _TR)
    c = u32(c0 + cc)
    if c < d_obs:
        partials[s, c, d] = plain
    if c < n_c:
        partials[s, u32(d_obs + c), d] = crossed
    if c0 == 0 and cc == 0:
        partials[s, u32(d_obs + n_c), d] = bias


@register((float32[:, :, ::1], _F2, _F1))
@cuda.jit
def mean_cross_wgrad_reduce(partials, dw, db):
    """dw[c, d] (c < D + M) and db[d] (the last column of the partials): the splits summed in order, grid-stride."""
    n = u32(partials.shape[1] * N_DIRECTIONS)
    n_splits, n_w = u32(partials.shape[0]), u32(dw.shape[0])
    k = u32(cuda.grid(1))
    while k < n:
        c = u32(k // _ND)
        d = u32(k - c * _ND)
        acc = float32(0.0)
        j = u32(0)
        while j < n_splits:
            acc += partials[j, c, d]
            j = u32(j + _ONE)
        if c < n_w:
            dw[c, d] = acc
        else:
            db[d] = acc
        k = u32(k + u32(cuda.gridsize(1)))


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
    launch_tiles(mean_cross_forward_kernel, (-(-rows // TILE_ROWS),), _FWD_THREADS, obs, w, b, m, i32(n_cross),
                 i32(pos_col), stream=stream)


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
        launch_tiles(mean_cross_wgrad_partials, (-(-d // TILE_COLS), self.splits), _GRAD_THREADS, obs, dm,
                     self.partials, i32(n_cross), i32(pos_col), stream=stream)
        launch_strided(mean_cross_wgrad_reduce, (d + n_cross + 1) * N_DIRECTIONS, self.partials, dw, db, stream=stream)
