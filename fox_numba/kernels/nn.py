"""Dense layers on the GPU: the launchers of the register-tiled kernels in `fox_numba.kernels.gemm` (fp32) and
`fox_numba.kernels.gemm_tensor` (tensor cores, `precision="tf32"` or `"bf16"`).

    linear_forward(x, w, b, y, relu=True, stream=s)      y  = relu(x @ w + b)     (relu=False: no ReLU)
    linear_backward_input(dy, w, dx, act=a, stream=s)    dx = (dy @ w.T) * (a > 0) (act=None: no mask)
    grads = LinearWeightGrad(batch, k, n)                the split-batch scratch, allocated once
    grads(x, dy, dw, db, stream=s)                       dw = x.T @ dy, db = dy summed over the batch

Shapes: x[B,K], w[K,N] (y = x @ w), b[N], y[B,N]; `act` is the layer's input activation (the output of
the previous ReLU), so a ReLU MLP's backward pass needs no separate mask kernel. All arrays are float32
C-contiguous device arrays, outputs never overlap inputs; any sizes from 1 up work.

The wrappers check shapes, compute the grid and allocate nothing, so they run inside a StepGraph body.
The kernel configuration and the weight gradient's batch splits are chosen from the shapes alone, never
from the device, so a shape gives the same bits on every GPU and every run (forward and backward-input
give the same bits under either configuration; the weight gradient's bits depend on its splits):
- 128x8 when it pads the output little and gives most SMs of an H200 a block (batch splits counted)
  that reduces over at least LONG_REDUCTION rows; otherwise 64x4. The thresholds come from the H200
  sweep in tools/results/bench_nn_h200.md (B = 8192 and 1024).
- the weight gradient splits the batch into chunks of whole BK-row steps: enough splits to fill one wave
  of resident blocks, none shorter than MIN_SPLIT_ROWS (shorter ones measured slower).
- `precision="tf32"` or `"bf16"` takes that format's tensor-core kernels (forward and backward-input: pick_tensor,
  128 x 128 tiles where they fill the GPU, else 64 x 64; the weight gradient: 128 x 128 and the 128x8 split plan,
  which fills the GPU with splits): their operands are rounded to 10 (TF32) or 7 (bf16) mantissa bits, so their bits
  differ from the fp32 kernels'.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fox_numba.config import CHOICES
from fox_numba.device.launch import check_array, i32, launch, launch_tiles
from fox_numba.device.memory import device_empty
from fox_numba.kernels import gemm_tensor as tc
from fox_numba.kernels.gemm import BK, CONFIGS, GEMMS, Config, GemmKernels, wgrad_reduce

SMS = 132  # multiprocessors of an H200, the wave the choices fill: a constant, so no result depends on the GPU
MAX_PAD = 1.25  # 128x8 may pad the output at most this much more than a 64 tile
MIN_BLOCKS_128 = 3 * SMS // 4  # 128x8 needs this many blocks
LONG_REDUCTION = 16 * BK  # ... each reducing over this many rows at least
MIN_SPLIT_ROWS = 16 * BK  # batch rows per weight-gradient split at least

_FLAG = {False: np.int32(0), True: np.int32(1)}



def _tensor_config(fmt: str, geom: tc.Geometry) -> Config:
    return Config(geom.tile, geom.tile // 16, geom.blocks_per_sm, fmt)  # 256 threads


def _tensor_sets() -> dict[str, GemmKernels]:
    """The tensor-core kernels of each format and geometry, by configuration name."""
    return {_tensor_config(fmt, geom).name: GemmKernels(_tensor_config(fmt, geom), *tc.KERNELS[fmt, geom.tile])
            for fmt in ("tf32", "bf16") for geom in tc.GEOMETRIES}


TENSOR = _tensor_sets()
KERNEL_SETS = {**GEMMS, **TENSOR}  # every configuration a launcher may be asked for
PRECISIONS = CHOICES["run.precision"]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _tiles(rows: int, cols: int, tile: int) -> int:
    return _cdiv(rows, tile) * _cdiv(cols, tile)


def pick_config(rows: int, cols: int, reduction: int, splits: int = 1) -> str:
    """The configuration for a rows x cols output reduced over `reduction` rows per block, in `splits`
    batch splits (the weight gradient)."""
    pads_little = _tiles(rows, cols, 128) * 128 * 128 <= MAX_PAD * _tiles(rows, cols, 64) * 64 * 64
    fills = _tiles(rows, cols, 128) * splits >= MIN_BLOCKS_128
    return "128x8" if pads_little and fills and reduction >= LONG_REDUCTION else "64x4"


def pick_tensor(precision: str, rows: int, cols: int) -> str:
    """The tensor-core configuration of `precision` for a rows x cols output: TILE 128 where its blocks give every
    SM one and pad the output at most MAX_PAD times TILE 64's, else TILE 64, whose 4x as many blocks hide more of
    the global loads' latency and which computes less padding on narrow outputs (an encoder's 32 or 64 columns).
    H100, tools/results/gemm_tiles_h100.md: 8192 x 256 outputs (128 blocks of 128) 0.034 -> 0.033 ms forward and
    0.060 -> 0.044 backward-input at TILE 64, but 16384 x 256 (256 blocks) 0.047 -> 0.059 forward."""
    big, small = tc.GEOMETRIES
    fills = _tiles(rows, cols, big.tile) >= SMS
    pads_little = _tiles(rows, cols, big.tile) * big.tile**2 <= MAX_PAD * _tiles(rows, cols, small.tile) * small.tile**2
    return _tensor_config(precision, big if fills and pads_little else small).name


def split_rows(batch: int, tiles: int, cfg: Config) -> tuple[int, int]:
    """(splits, rows per split) of the weight gradient's batch: one wave of resident blocks at most."""
    want = max(1, SMS * cfg.blocks_per_sm // tiles)
    chunk = max(MIN_SPLIT_ROWS, _cdiv(_cdiv(batch, want), BK) * BK)
    return _cdiv(batch, chunk), chunk


def _gemm(name: str) -> GemmKernels:
    if name not in KERNEL_SETS:
        raise ValueError(f"configuration {name!r} is not built; built: {sorted(KERNEL_SETS)}")
    return KERNEL_SETS[name]


def _config(precision: str, config: str | None, rows: int, cols: int, reduction: int) -> str:
    """The configuration: `config` when given, the tensor-core kernels of precision 'tf32' or 'bf16', else the
    shapes' pick."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if config:
        return config
    return pick_tensor(precision, rows, cols) if precision in tc.UNIT_ROUNDOFF else pick_config(rows, cols, reduction)


def _shape(arr: Any) -> tuple[int, ...]:
    """The shape as a tuple (the simulator's shape object takes no negative index)."""
    return tuple(int(d) for d in arr.shape)


def _check(op: str, layout: str, arrays: dict[str, Any], expected: dict[str, tuple[int, ...]]) -> None:
    """Refuse arrays that are not float32 C-contiguous device arrays of the expected shapes."""
    for name, arr in arrays.items():
        check_array(f"{op}: {name}", arr, "", None)
    got = {name: _shape(arr) for name, arr in arrays.items()}
    if got != expected or min(d for s in got.values() for d in s) < 1:
        shown = ", ".join(f"{name} {shape}" for name, shape in got.items())
        raise ValueError(f"{op}: shapes {shown} do not fit {layout}")


def _live(cols: int | None, n: int, op: str) -> int:
    """The leading output columns a launch covers: `cols`, or all n."""
    if cols is None:
        return n
    if not 1 <= cols <= n:
        raise ValueError(f"{op}: cols = {cols} must be in 1..{n}")
    return cols


def linear_forward(
    x: Any, w: Any, b: Any, y: Any, *, relu: bool, stream: Any, config: str | None = None, precision: str = "fp32",
    cols: int | None = None,
) -> None:
    """y = x @ w + b, then ReLU when `relu`; `config` forces a kernel configuration (tests, benchmarks). With `cols`
    only the column tiles holding y's first `cols` columns are launched: the rest of y is not written (the caller
    keeps it; a whole tile past `cols` may be, from w's and b's columns there)."""
    n_batch, k, n = _shape(x)[0], _shape(x)[-1], _shape(y)[-1]
    _check(
        "linear_forward",
        "x[B,K] @ w[K,N] + b[N] -> y[B,N]",
        {"x": x, "w": w, "b": b, "y": y},
        {"x": (n_batch, k), "w": (k, n), "b": (n,), "y": (n_batch, n)},
    )
    live = _live(cols, n, "linear_forward")
    g = _gemm(_config(precision, config, n_batch, live, k))  # the launched columns' shape (the same bits either way)
    grid = (_cdiv(live, g.config.tile), _cdiv(n_batch, g.config.tile))
    launch_tiles(g.fwd, grid, g.config.threads, x, w, b, y, _FLAG[relu], stream=stream)


def linear_backward_input(
    dy: Any, w: Any, dx: Any, *, act: Any = None, stream: Any, config: str | None = None, precision: str = "fp32",
    cols: int | None = None,
) -> None:
    """dx = dy @ w.T, zeroed where act <= 0 when the layer input activation `act` is given. With `cols` the
    reduction runs over the first `cols` columns of dy and w alone: the caller's promise that the rest of dy is 0
    (a head's columns past its live branches), so the sum is the same, in the same order."""
    n_batch, n, k = _shape(dy)[0], _shape(dy)[-1], _shape(dx)[-1]
    arrays = {"dy": dy, "w": w, "dx": dx}
    expected = {"dy": (n_batch, n), "w": (k, n), "dx": (n_batch, k)}
    if act is not None:
        arrays["act"], expected["act"] = act, (n_batch, k)
    _check("linear_backward_input", "dy[B,N] @ w[K,N].T -> dx[B,K], act[B,K]", arrays, expected)
    g = _gemm(_config(precision, config, n_batch, k, n))
    grid = (_cdiv(k, g.config.tile), _cdiv(n_batch, g.config.tile))
    mask_src = dx if act is None else act  # not read when the mask is off
    k_len = _live(cols, n, "linear_backward_input")
    launch_tiles(g.bwd_in, grid, g.config.threads, dy, w, mask_src, dx, _FLAG[act is not None], i32(k_len),
                 stream=stream)


class LinearWeightGrad:
    """dw = x.T @ dy and db = sum of dy over the batch for a fixed (batch, k, n), deterministically.

    The batch is cut into `splits` chunks of `chunk` rows; each block sums its chunk for one output
    tile into `partial_w[s]` (and the first row of tiles into `partial_b[s]`), then `wgrad_reduce` adds
    the splits in order. The partial buffers are allocated here, once, so calls can be captured.
    With `cols` only the column tiles holding the first `cols` columns are launched and only those columns of dw and
    db are written (the caller keeps the rest 0: the gradient of columns whose dy is 0).
    """

    def __init__(
        self, batch: int, k: int, n: int, *, config: str | None = None, chunk: int | None = None,
        precision: str = "fp32", cols: int | None = None,
    ) -> None:
        """`config` and `chunk` (rows per split, a multiple of BK) override the choices from the shapes."""
        if min(batch, k, n) < 1:
            raise ValueError(f"LinearWeightGrad: batch={batch}, k={k}, n={n} must be positive")
        if chunk is not None and (chunk < BK or chunk % BK):
            raise ValueError(f"LinearWeightGrad: chunk={chunk} must be a positive multiple of {BK}")
        if config is None and precision != "fp32":
            # TILE 128 (the configuration named by the format; _config refuses an unknown one): its split plan
            # fills the GPU already, and its bits are those every committed tf32 result was trained with
            config = _config(precision, precision, k, n, batch)
        if config is None:
            splits_128, chunk_128 = split_rows(batch, _tiles(k, n, 128), CONFIGS["128x8"])
            config = pick_config(k, n, chunk_128, splits_128)
        self.batch, self.k, self.n = batch, k, n
        self.live = live = _live(cols, n, "LinearWeightGrad")
        self.gemm = _gemm(config)
        tile = self.gemm.config.tile
        self.grid_tiles = (_cdiv(live, tile), _cdiv(k, tile))
        if chunk is None:  # the whole width's plan, so the first `cols` columns sum their splits as it does (same bits)
            self.splits, self.chunk = split_rows(batch, _tiles(k, n, tile), self.gemm.config)
        else:
            self.splits, self.chunk = _cdiv(batch, chunk), chunk
        self.partial_w = device_empty((self.splits, k, n), np.float32)
        self.partial_b = device_empty((self.splits, n), np.float32)

    def __call__(self, x: Any, dy: Any, dw: Any, db: Any, *, stream: Any) -> None:
        """dw = x.T @ dy, db = dy summed over the batch."""
        b, k, n = self.batch, self.k, self.n
        _check(
            "LinearWeightGrad",
            f"x[B,K].T @ dy[B,N] -> dw[K,N], db[N] with (B, K, N) = {(b, k, n)}",
            {"x": x, "dy": dy, "dw": dw, "db": db},
            {"x": (b, k), "dy": (b, n), "dw": (k, n), "db": (n,)},
        )
        g = self.gemm
        grid = (*self.grid_tiles, self.splits)
        pw, pb = self.partial_w, self.partial_b
        launch_tiles(g.wgrad, grid, g.config.threads, x, dy, pw, pb, i32(self.chunk), stream=stream)
        launch(wgrad_reduce, (k + 1) * self.live, pw, pb, dw, db, i32(self.splits), i32(self.live), stream=stream)
