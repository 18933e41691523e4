"""Dense layers of at most COLS (8) output columns on the GPU: the mean head, a mixture's or VSN's gate.

    narrow_forward(x, w, b, y, relu=True, stream=s)              y = relu(x @ w + b)    (relu=False: no ReLU)
    narrow_weight_grad_splits(x, dy, pw, pb, chunk, stream=s)    pw[s] = x[rows of s].T @ dy[rows of s],
                                                                 pb[s] = dy[rows of s] summed, rows [s*chunk, +chunk)
    (kernels.gemm.wgrad_reduce then adds the splits in order, as for the tiled weight gradient)

Why: a tensor-core tile is 128 output columns, so a 4-column layer pays for 128, and one thread per output element
reading x straight from global memory (kernels/dense_strided.py) was slower still on an H100: its warps each read 8
rows at every reduction step (67 us for the mean head's online forward at 16,384 rows, against 38 us on the tf32
tile; tools/results/bench_learner_narrow_h100.md). Here every operand is staged through shared memory with loads
whose lanes run along the contiguous axis.

Forward: a block owns ROWS rows; per reduction tile of KC it stages x[ROWS, KC] and w[KC, COLS] (zero past the
edges), and thread (r, j) of its ROWS x COLS adds the tile's products to its accumulator, k in order from 0.
Weight gradient: a block owns (KC reduction indices, one split); per tile of RC rows of the split it stages
x[RC, KC] and dy[RC, COLS], and thread (k, j) adds the tile's products, rows in order. The bias gradient is the
column k = K of an x extended by a column of ones (1 * dy[i, j] is dy[i, j] exactly, so its chain is the plain sum).
Either way each output element is one thread's chain of multiply-adds in index order, the chain of every fp32
dense kernel here (kernels/gemm.py's tiled ones, dense_strided's), so the bits are theirs (the weight gradient's at
the same split plan): tests/kernels/test_dense_narrow.py.
Launch: forward grid (ceil(B / ROWS),), weight gradient (ceil((K + 1) / KC), splits), blocks of THREADS = 256.
"""

from __future__ import annotations

from typing import Any

from numba import cuda, float32, int32

from fox_numba.device.launch import check_array, i32, launch_tiles
from fox_numba.device.registry import register

COLS = 8  # the widest output these kernels serve
ROWS = 32  # forward: rows of one block
KC = 32  # reduction indices of one staged tile (forward) or of one block (weight gradient)
RC = 32  # weight gradient: rows of one staged tile
THREADS = ROWS * COLS  # 256: a thread per output element of a block (also KC * COLS)
X_TILE = (ROWS, KC + 1)  # a staged x tile, rows x reduction (padded: the loads' stores fall in distinct banks)
W_TILE = (KC, COLS)  # forward: a staged w tile; weight gradient: a staged dy tile (RC = KC rows)
X_LOADS = ROWS * KC // THREADS  # elements of a staged x tile each thread loads (RC = ROWS = KC: one shape)

_F1 = float32[::1]
_F2 = float32[:, ::1]
_F3 = float32[:, :, ::1]


@register((_F2, _F2, _F1, _F2, int32))
@cuda.jit
def narrow_fwd(x, w, b, y, relu):
    """y[r, j] = x[r, :] @ w[:, j] + b[j] (then max(., 0) when relu != 0) for the block's ROWS rows (module header)."""
    xs = cuda.shared.array(X_TILE, float32)
    ws = cuda.shared.array(W_TILE, float32)
    n_rows, n_k = x.shape
    n_cols = y.shape[1]
    tid = cuda.threadIdx.x
    r0 = cuda.blockIdx.x * ROWS
    r = tid // COLS
    j = tid - r * COLS
    acc = float32(0.0)
    for k0 in range(0, n_k, KC):
        for q in range(X_LOADS):
            e = tid + q * THREADS
            rr = e // KC
            kk = e - rr * KC
            v = float32(0.0)
            if r0 + rr < n_rows and k0 + kk < n_k:
                v = x[r0 + rr, k0 + kk]
            xs[rr, kk] = v
        kk = tid // COLS
        v = float32(0.0)
        if k0 + kk < n_k and j < n_cols:
            v = w[k0 + kk, j]
        ws[kk, j] = v
        cuda.syncthreads()
        for kk in range(min(KC, n_k - k0)):
            acc += xs[r, kk] * ws[kk, j]
        cuda.syncthreads()
    if j < n_cols and r0 + r < n_rows:
        v = acc + b[j]
        if relu != 0 and v < float32(0.0):
            v = float32(0.0)
        y[r0 + r, j] = v


@register((_F2, _F2, _F3, _F2, int32))
@cuda.jit
def narrow_wgrad_splits(x, dy, pw, pb, chunk):
    """pw[s, k, j] = sum_i x[i, k] dy[i, j] and pb[s, j] = sum_i dy[i, j] over the rows of split s = blockIdx.y, in
    order, for the block's KC reduction indices (k = K is the bias; module header)."""
    xs = cuda.shared.array(X_TILE, float32)
    ds = cuda.shared.array(W_TILE, float32)
    n_rows, n_k = x.shape
    n_cols = dy.shape[1]
    tid = cuda.threadIdx.x
    k0 = cuda.blockIdx.x * KC
    s = cuda.blockIdx.y
    lo = s * chunk
    hi = min(lo + chunk, n_rows)
    kt = tid // COLS
    j = tid - kt * COLS
    acc = float32(0.0)
    for i0 in range(lo, hi, RC):
        for q in range(X_LOADS):
            e = tid + q * THREADS
            rr = e // KC
            kk = e - rr * KC
            v = float32(0.0)
            if i0 + rr < hi:
                if k0 + kk < n_k:
                    v = x[i0 + rr, k0 + kk]
                elif k0 + kk == n_k:
                    v = float32(1.0)
            xs[rr, kk] = v
        rr = tid // COLS
        v = float32(0.0)
        if i0 + rr < hi and j < n_cols:
            v = dy[i0 + rr, j]
        ds[rr, j] = v
        cuda.syncthreads()
        for rr in range(min(RC, hi - i0)):
            acc += xs[rr, kt] * ds[rr, j]
        cuda.syncthreads()
    k = k0 + kt
    if j < n_cols:
        if k < n_k:
            pw[s, k, j] = acc
        elif k == n_k:
            pb[s, j] = acc


def _shape(arr: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in arr.shape)


def _check(op: str, arrays: dict[str, Any], expected: dict[str, tuple[int, ...]], cols: int) -> None:
    if cols > COLS:
        raise ValueError(f"{op}: {cols} output columns, at most {COLS}")
    for name, arr in arrays.items():
        check_array(f"{op}: {name}", arr, "", None)
    got = {name: _shape(arr) for name, arr in arrays.items()}
    if got != expected or min(d for s in got.values() for d in s) < 1:
        shown = ", ".join(f"{name} {shape}" for name, shape in got.items())
        raise ValueError(f"{op}: shapes {shown} do not fit {expected}")


def narrow_forward(x: Any, w: Any, b: Any, y: Any, *, relu: bool, stream: Any) -> None:
    """y = x @ w + b, then ReLU when `relu`; y has at most COLS columns."""
    n_batch, k, n = _shape(x)[0], _shape(x)[-1], _shape(y)[-1]
    _check("narrow_forward", {"x": x, "w": w, "b": b, "y": y},
           {"x": (n_batch, k), "w": (k, n), "b": (n,), "y": (n_batch, n)}, n)
    launch_tiles(narrow_fwd, (-(-n_batch // ROWS),), THREADS, x, w, b, y, i32(int(relu)), stream=stream)


def narrow_weight_grad_splits(x: Any, dy: Any, pw: Any, pb: Any, chunk: int, *, stream: Any) -> None:
    """pw[s] and pb[s] for the S = len(pw) splits of `chunk` rows (the last one shorter); dy has at most COLS
    columns."""
    n_batch, k, n = _shape(x)[0], _shape(x)[-1], _shape(dy)[-1]
    splits = _shape(pw)[0]
    if chunk < 1 or -(-n_batch // chunk) != splits:
        raise ValueError(f"narrow_weight_grad_splits: {splits} splits of {chunk} rows do not cover {n_batch} rows")
    _check("narrow_weight_grad_splits", {"x": x, "dy": dy, "pw": pw, "pb": pb},
           {"x": (n_batch, k), "dy": (n_batch, n), "pw": (splits, k, n), "pb": (splits, n)}, n)
    launch_tiles(narrow_wgrad_splits, (-(-(k + 1) // KC), splits), THREADS, x, dy, pw, pb, i32(chunk), stream=stream)
