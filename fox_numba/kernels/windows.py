"""Windows of the last T bars for the network's encoders (agent/mamba2.py over the market part, network.mamba2_window;
agent/tlob.py over the book snapshots, network.tlob_window): the gather of each sample's window from a per-bar source
tensor, the concat of the encoder's last-bar output onto the observation, and that concat's backward.

    gather_windows(source, rows, day_first, u, seq_len=T, stream=s)        u [S T, F] = the windows of S samples
    concat_last(obs, enc, x, seq_len=T, stream=s)                          x [B, D + E] = [obs | enc's last bars]
    scatter_last(dx, dout, seq_len=T, stream=s)                            dout [G T, E]: dx at last bars, else 0

Window s holds bars t = 0 .. T - 1 of the fold rows r_s - T + 1 + t (r_s = rows[s], the sample's own bar last),
the first F = u.shape[1] columns of source [R, C] (the market part market_obs, or the book snapshots book_obs):
u[s T + t, c] = source[max(r_s - T + 1 + t, day_first[r_s]), c]. A bar before its day's first bar reads the day's
first bar instead: the window neither looks across days nor ahead (day_first [R]: the first row of each row's day).
The encoder's output enc [B T, E] is read at each window's last bar: x[b] = [obs[b] | enc[b T + T - 1]] (an encoder
with one output row per sample, TLOB's, passes T = 1); the backward sends dx [G, E] (the E columns' input gradient)
to those bars and zero to the others.

Launch shapes: one thread per output element. Plain copies: the outputs equal their inputs bit for bit.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import cuda, float32, int32

from fox_numba.device.launch import check_array, i32, launch
from fox_numba.device.registry import register

_F2 = float32[:, ::1]
_I1 = int32[::1]


@register((_F2, _I1, _I1, int32, _F2))
@cuda.jit
def gather_windows_kernel(source, rows, day_first, seq_len, u):
    """u[s T + t, c] = source[max(rows[s] - T + 1 + t, day_first[rows[s]]), c]; one thread per element of u."""
    i = cuda.grid(1)
    cols = u.shape[1]
    if i < u.shape[0] * cols:
        r = i // cols
        c = i - r * cols
        s = r // seq_len
        last = rows[s]
        src = max(last - seq_len + 1 + (r - s * seq_len), day_first[last])
        u[r, c] = source[src, c]


@register((_F2, _F2, _F2, int32))
@cuda.jit
def concat_last_kernel(obs, enc, x, seq_len):
    """x[b, :D] = obs[b], x[b, D + e] = enc[b T + T - 1, e]; one thread per element of x."""
    i = cuda.grid(1)
    cols = x.shape[1]
    if i < x.shape[0] * cols:
        b = i // cols
        c = i - b * cols
        d = obs.shape[1]
        x[b, c] = obs[b, c] if c < d else enc[b * seq_len + seq_len - 1, c - d]


@register((_F2, _F2, int32))
@cuda.jit
def scatter_last_kernel(dx, dout, seq_len):
    """dout[s T + t, e] = dx[s, e] at the last bar t = T - 1, else 0; one thread per element of dout."""
    i = cuda.grid(1)
    cols = dout.shape[1]
    if i < dout.shape[0] * cols:
        r = i // cols
        e = i - r * cols
        s = r // seq_len
        dout[r, e] = dx[s, e] if r - s * seq_len == seq_len - 1 else float32(0.0)


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
    launch(gather_windows_kernel, samples * seq_len * width, source, rows, day_first, i32(seq_len), u,
           stream=stream)


def concat_last(obs: Any, enc: Any, x: Any, *, seq_len: int, stream: Any) -> None:
    """x [B, D + E] = obs [B, D] beside enc [B T, E] at each window's last bar."""
    batch, d = (int(n) for n in obs.shape)
    check_array("obs", obs, "[B, D]", (batch, d))
    e = int(enc.shape[1])
    check_array("enc", enc, "[B T, E]", (batch * seq_len, e))
    check_array("x", x, "[B, D + E]", (batch, d + e))
    launch(concat_last_kernel, batch * (d + e), obs, enc, x, i32(seq_len), stream=stream)


def scatter_last(dx: Any, dout: Any, *, seq_len: int, stream: Any) -> None:
    """dout [G T, E] = dx [G, E] at each window's last bar, 0 at the others (concat_last's backward)."""
    grad, e = (int(n) for n in dx.shape)
    check_array("dx", dx, "[G, E]", (grad, e))
    check_array("dout", dout, "[G T, E]", (grad * seq_len, e))
    launch(scatter_last_kernel, grad * seq_len * e, dx, dout, i32(seq_len), stream=stream)
