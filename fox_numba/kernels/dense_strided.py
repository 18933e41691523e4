"""Dense layers for small shapes: one output element per thread, grid-stride (`launch_strided`).

    strided_linear_forward(x, w, b, y, relu=True, stream=s)      y  = relu(x @ w + b)
    strided_linear_backward_input(dy, w, dx, act=a, stream=s)    dx = (dy @ w.T) * (a > 0)  (act=None: no mask)
    strided_linear_weight_grad(x, dy, dw, db, stream=s)          dw = x.T @ dy, db = dy summed over the rows

The same operations as `fox_numba.kernels.nn` (same shapes, same argument checks), computed the plain way:
each output element is one thread's chain of multiply-adds over the reduction in index order from 0
(then + bias, then the ReLU or the mask), which is also what every output of the register-tiled kernels
is, so forward and backward-input give the tiled kernels' bits, and so does the weight gradient wherever
the tiled one runs the batch in one split (B <= its minimum split, 128 rows).

Why a second path: the tiled kernels start blocks of 256 threads with a barrier per reduction step. That
is right for the network's real sizes on the GPU, and ruinous under the CUDA simulator, which runs each
thread as a Python thread (~0.3 s per block): a tiny network's training step there would take seconds.
`Network` picks these kernels under the simulator (and on request), the tiled ones on the GPU.
Launch shape: 1-D grid-stride over the outputs; no shared memory, no barriers, no atomics.
"""

from __future__ import annotations

from typing import Any

from numba import cuda, float32, int32

from fox_numba.device.launch import check_array, i32, launch_strided
from fox_numba.device.registry import register

_F1 = float32[::1]
_F2 = float32[:, ::1]


@register((_F2, _F2, _F1, _F2, int32, int32))
@cuda.jit
def dense_fwd(x, w, b, y, relu, n):
    """y[i, j] = x[i, :] @ w[:, j] + b[j], then max(., 0) when relu != 0; n = B * N."""
    n_cols = y.shape[1]
    t = cuda.grid(1)
    while t < n:
        i = t // n_cols
        j = t - i * n_cols
        acc = float32(0.0)
        for k in range(x.shape[1]):
            acc += x[i, k] * w[k, j]
        v = acc + b[j]
        if relu != 0 and v < float32(0.0):
            v = float32(0.0)
        y[i, j] = v
        t += cuda.gridsize(1)


@register((_F2, _F2, _F2, _F2, int32, int32))
@cuda.jit
def dense_bwd_in(dy, w, act, dx, mask, n):
    """dx[i, k] = dy[i, :] @ w[k, :], zeroed where act[i, k] <= 0 when mask != 0; n = B * K."""
    n_cols = dx.shape[1]
    t = cuda.grid(1)
    while t < n:
        i = t // n_cols
        k = t - i * n_cols
        acc = float32(0.0)
        for j in range(dy.shape[1]):
            acc += dy[i, j] * w[k, j]
        if mask != 0 and not act[i, k] > float32(0.0):
            acc = float32(0.0)
        dx[i, k] = acc
        t += cuda.gridsize(1)


@register((_F2, _F2, _F2, _F1, int32))
@cuda.jit
def dense_wgrad(x, dy, dw, db, n):
    """dw[k, j] = sum_i x[i, k] dy[i, j] and db[j] = sum_i dy[i, j], rows in order; n = K * N + N."""
    n_k, n_cols = dw.shape
    n_w = n_k * n_cols
    t = cuda.grid(1)
    while t < n:
        acc = float32(0.0)
        if t < n_w:
            k = t // n_cols
            j = t - k * n_cols
            for i in range(x.shape[0]):
                acc += x[i, k] * dy[i, j]
            dw[k, j] = acc
        else:
            j = t - n_w
            for i in range(dy.shape[0]):
                acc += dy[i, j]
            db[j] = acc
        t += cuda.gridsize(1)


def _shape(arr: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in arr.shape)


def _check(op: str, arrays: dict[str, Any], expected: dict[str, tuple[int, ...]]) -> None:
    for name, arr in arrays.items():
        check_array(f"{op}: {name}", arr, "", None)
    got = {name: _shape(arr) for name, arr in arrays.items()}
    if got != expected or min(d for s in got.values() for d in s) < 1:
        shown = ", ".join(f"{name} {shape}" for name, shape in got.items())
        raise ValueError(f"{op}: shapes {shown} do not fit {expected}")


def strided_linear_forward(x: Any, w: Any, b: Any, y: Any, *, relu: bool, stream: Any) -> None:
    """y = x @ w + b, then ReLU when `relu`."""
    n_batch, k, n = _shape(x)[0], _shape(x)[-1], _shape(y)[-1]
    _check("strided_linear_forward", {"x": x, "w": w, "b": b, "y": y},
           {"x": (n_batch, k), "w": (k, n), "b": (n,), "y": (n_batch, n)})
    launch_strided(dense_fwd, n_batch * n, x, w, b, y, i32(int(relu)), i32(n_batch * n), stream=stream)


def strided_linear_backward_input(dy: Any, w: Any, dx: Any, *, act: Any = None, stream: Any) -> None:
    """dx = dy @ w.T, zeroed where the layer input activation `act` is <= 0 when it is given."""
    n_batch, n, k = _shape(dy)[0], _shape(dy)[-1], _shape(dx)[-1]
    arrays = {"dy": dy, "w": w, "dx": dx}
    expected = {"dy": (n_batch, n), "w": (k, n), "dx": (n_batch, k)}
    if act is not None:
        arrays["act"], expected["act"] = act, (n_batch, k)
    _check("strided_linear_backward_input", arrays, expected)
    mask_src = dx if act is None else act  # not read when the mask is off
    launch_strided(dense_bwd_in, n_batch * k, dy, w, mask_src, dx, i32(int(act is not None)), i32(n_batch * k),
                   stream=stream)


def strided_linear_weight_grad(x: Any, dy: Any, dw: Any, db: Any, *, stream: Any) -> None:
    """dw = x.T @ dy, db = dy summed over the batch."""
    n_batch, k, n = _shape(x)[0], _shape(x)[-1], _shape(dy)[-1]
    _check("strided_linear_weight_grad", {"x": x, "dy": dy, "dw": dw, "db": db},
           {"x": (n_batch, k), "dy": (n_batch, n), "dw": (k, n), "db": (n,)})
    launch_strided(dense_wgrad, k * n + n, x, dy, dw, db, i32(k * n + n), stream=stream)
