"""Windows of the last T bars for the network's encoders (agent/mamba2.py over the market part, network.mamba2_window;
agent/tlob.py over the book snapshots, network.tlob_window): the gather of each sample's window from a per-bar source
tensor, and the concat of the encoder's output (one row per sample, its window's last bar) onto the observation.

    gather_windows(source, rows, day_first, u, seq_len=T, stream=s)        u [S T, F] = the windows of S samples
    concat_columns(obs, enc, x, stream=s)                                  x [B, D + E] = [obs | enc]

Window s holds bars t = 0 .. T - 1 of the fold rows r_s - T + 1 + t (r_s = rows[s], the sample's own bar last),
the first F = u.shape[1] columns of source [R, C] (the market part market_obs, or the book snapshots book_obs):
u[s T + t, c] = source[max(r_s - T + 1 + t, day_first[r_s]), c]. A bar before its day's first bar reads the day's
first bar instead: the window neither looks across days nor ahead (day_first [R]: the first row of each row's day).
The concat's backward is a column slice: the network's input gradient of the E columns goes to the encoder as it is.

Launch shapes: the gather one block per window (GATHER_WARPS warps, each a bar at a time, its lanes along the
columns: 128-byte rows read and written whole, the source row found once per bar and no division at all); the
concat one thread per output element. One thread per element with two divisions each took 0.27 ms a launch at
8,192 windows of 32 x 128 on an H100 in uint32, 0.39 ms in int64 (windows_u32_h100.md). Plain copies: the outputs
equal their inputs bit for bit.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import cuda, float32, int32

from fox_numba.device.launch import check_array, i32, launch, launch_rows
from fox_numba.device.registry import register
from fox_numba.device.runtime import u32

_F2 = float32[:, ::1]
_I1 = int32[::1]
GATHER_WARPS = 8  # warps of a gather block: each copies every 8th bar of its sample's window


@register((_F2, _I1, _I1, int32, _F2))
@cuda.jit
def gather_windows_kernel(source, rows, day_first, seq_len, u):
    """u[s T + t, c] = source[max(rows[s] - T + 1 + t, day_first[rows[s]]), c]; block s copies window s, warp w
    its bars t = w, w + GATHER_WARPS, ..., lane l its columns c = l, l + 32, ..., four loaded before they are
    stored (a store may alias a later load, so the compiler keeps them in order)."""
    s = u32(cuda.blockIdx.x)
    lane = u32(cuda.threadIdx.x) & u32(31)
    warp = u32(cuda.threadIdx.x) >> u32(5)
    cols = u32(u.shape[1])
    t_len = u32(seq_len)
    last = rows[s]
    first = day_first[u32(last)]
    base = s * t_len
    for t in range(warp, t_len, u32(GATHER_WARPS)):
        src = u32(max(last - seq_len + 1 + int32(t), first))
        out = base + u32(t)
        for c in range(lane, cols, u32(128)):  # four loads in flight before their stores
            c1, c2, c3 = c + u32(32), c + u32(64), c + u32(96)
            v0 = source[src, c]
            v1 = source[src, c1] if c1 < cols else float32(0)
            v2 = source[src, c2] if c2 < cols else float32(0)
            v3 = source[src, c3] if c3 < cols else float32(0)
            u[out, c] = v0
            if c1 < cols:
                u[out, c1] = v1
            if c2 < cols:
                u[out, c2] = v2
            if c3 < cols:
                u[out, c3] = v3


@register((_F2, _F2, _F2))
@cuda.jit
def concat_columns_kernel(obs, enc, x):
    """x[b, :D] = obs[b], x[b, D + e] = enc[b, e]; one thread per element of x."""
    i = cuda.grid(1)
    cols = x.shape[1]
    if i < x.shape[0] * cols:
        b = i // cols
        c = i - b * cols
        d = obs.shape[1]
        x[b, c] = obs[b, c] if c < d else enc[b, c - d]


def gather_windows(source: Any, rows: Any, day_first: Any, u: Any, *, seq_len: int, stream: Any) -> None:
    """u [S T, F] = the windows of T bars of source [R, C] ending at the fold rows `rows` [S] (module header)."""
    n_rows, n_cols = (int(d) for d in source.shape)
    check_array("source", source, "[R, C]", (n_rows, n_cols))
    check_array("day_first", day_first, "[R]", (n_rows,), np.int32)
    samples = int(rows.shape[0])
    check_array("rows", rows, "[S]", (samples,), np.int32)
    width = int(u.shape[1])
    if seq_len < 1 or not 1 <= width <= n_cols:
        raise ValueError(f"gather_windows: need T = {seq_len} >= 1 and 1 <= F = {width} <= C = {n_cols}")
    check_array("u", u, "[S T, F]", (samples * seq_len, width))
    launch_rows(gather_windows_kernel, samples, GATHER_WARPS * 32, source, rows, day_first, i32(seq_len), u,
                stream=stream)


def concat_columns(obs: Any, enc: Any, x: Any, *, stream: Any) -> None:
    """x [B, D + E] = obs [B, D] beside enc [B, E]."""
    batch, d = (int(n) for n in obs.shape)
    check_array("obs", obs, "[B, D]", (batch, d))
    e = int(enc.shape[1])
    check_array("enc", enc, "[B, E]", (batch, e))
    check_array("x", x, "[B, D + E]", (batch, d + e))
    launch(concat_columns_kernel, batch * (d + e), obs, enc, x, stream=stream)
