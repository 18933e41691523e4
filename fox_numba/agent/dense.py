"""Dense layers of every network part, on one of three kernel kinds chosen in one place.

    kind = dense_kind("auto", "Network")                       'tiled' on the GPU, 'strided' under the simulator
    kind = dense_kind(precision_dense("tf32"), "Network")      'tf32' on the GPU, 'strided' under the simulator
                                                               (and 'bf16' likewise)
    dense_forward(kind, x, w, b, y, relu=True, stream=s)       y = x @ w + b (then ReLU; cols=: the leading columns
                                                               alone on the GPU, the others zero by their weights)
    dense_backward_input(kind, dy, w, dx, act=a, stream=s)     dx = (dy @ w.T) * (a > 0)  (act=None: no mask;
                                                               cols=: the leading reduction columns alone)
    WeightGrad(kind, rows, n_in, n_out)(x, dy, dw, db, stream=s)   dw = x.T @ dy, db = dy summed over rows

'tiled' runs the register-tiled GEMMs (kernels/nn.py; the weight gradient's split plan is built once per shape,
hence the WeightGrad object), 'tf32' and 'bf16' the tensor-core GEMMs behind the same launchers
(kernels/gemm_tensor.py; run.precision = "tf32" or "bf16"), 'strided' the grid-stride kernels
(kernels/dense_strided.py: the same arithmetic per element as 'tiled', cheap under the simulator, which pays per
thread). The simulator cannot run tensor-core instructions, so there 'auto', 'tf32' and 'bf16' all mean 'strided':
the exact fp32 path.
"""

from __future__ import annotations

from typing import Any

from fox_numba.device.runtime import SIMULATOR
from fox_numba.kernels.dense_strided import (
    strided_linear_backward_input,
    strided_linear_forward,
    strided_linear_weight_grad,
)
from fox_numba.kernels.nn import PRECISIONS, LinearWeightGrad, linear_backward_input, linear_forward

DENSE_KINDS = ("tiled", "tf32", "bf16", "strided")
_PRECISION = {"tiled": "fp32", "tf32": "tf32", "bf16": "bf16"}  # the GEMM launchers' precision of a GPU kind
_TENSOR = ("tf32", "bf16")  # kinds on tensor cores: the exact fp32 'strided' under the simulator


def precision_dense(precision: str) -> str:
    """The `dense` argument of run.precision: 'auto' (fp32), 'tf32' or 'bf16'."""
    if precision not in PRECISIONS:
        raise ValueError(f"run.precision must be one of {PRECISIONS}, got {precision!r}")
    return "auto" if precision == "fp32" else precision


def dense_kind(dense: str, owner: str) -> str:
    """The kind `dense` names ('auto': tiled on the GPU; 'auto', 'tf32' and 'bf16' are strided under the simulator);
    `owner` names the caller."""
    if dense not in (*DENSE_KINDS, "auto"):
        raise ValueError(f"{owner}: dense must be 'auto' or one of {DENSE_KINDS}, got {dense!r}")
    if (dense == "auto" or dense in _TENSOR) and SIMULATOR:
        return "strided"
    return "tiled" if dense == "auto" else dense


def dense_forward(kind: str, x: Any, w: Any, b: Any, y: Any, *, relu: bool, stream: Any, cols: int | None = None
                  ) -> None:
    """y = x @ w + b, then ReLU when `relu`. `cols`: the caller's promise that w's and b's columns past the first
    `cols` are zero and y's there hold their output (zero, or its ReLU); the GPU kinds then launch only the column
    tiles before `cols`, 'strided' computes every column (the same numbers)."""
    if kind != "strided":
        linear_forward(x, w, b, y, relu=relu, stream=stream, precision=_PRECISION[kind], cols=cols)
    else:
        strided_linear_forward(x, w, b, y, relu=relu, stream=stream)


def dense_backward_input(kind: str, dy: Any, w: Any, dx: Any, *, act: Any, stream: Any, cols: int | None = None
                         ) -> None:
    """dx = dy @ w.T, zeroed where act <= 0 when the layer's input activation `act` is given. `cols`: the caller's
    promise that dy is 0 past its first `cols` columns; the GPU kinds then reduce over those alone, 'strided' over
    every column (the same numbers)."""
    if kind != "strided":
        linear_backward_input(dy, w, dx, act=act, stream=stream, precision=_PRECISION[kind], cols=cols)
    else:
        strided_linear_backward_input(dy, w, dx, act=act, stream=stream)


class WeightGrad:
    """dw = x.T @ dy and db = dy summed over the rows, for one layer shape (rows, n_in -> n_out). `cols`: the
    caller's promise that dy is zero past its first `cols` columns and dw and db hold 0 there; the GPU kinds then
    compute and write only the first `cols` columns, 'strided' computes them all (the same numbers)."""

    def __init__(self, kind: str, rows: int, n_in: int, n_out: int, *, cols: int | None = None) -> None:
        self._tiled = (
            LinearWeightGrad(rows, n_in, n_out, precision=_PRECISION[kind], cols=cols) if kind != "strided" else None
        )

    def __call__(self, x: Any, dy: Any, dw: Any, db: Any, *, stream: Any) -> None:
        if self._tiled is not None:
            self._tiled(x, dy, dw, db, stream=stream)
        else:
            strided_linear_weight_grad(x, dy, dw, db, stream=stream)
