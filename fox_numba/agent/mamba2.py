"""Mamba2 block (Dao & Gu 2024, the SSD layer): a selective state-space encoder over windows of the last T bars,
composed from its kernels on given parameter arrays (formulas, launch shapes and the scan's design:
kernels/mamba2.py; the block read at one bar: kernels/mamba2_last.py), and the encoder a network composes from it
(network.mamba2_window; agent/network.py).

    dims = Mamba2Dims(seq_len=T, n_features=F, n_heads=H, head_dim=P, state_dim=N, d_out=E)
    p = {name: array for name, shape, decays in mamba2_entries(dims)}     init_params(dims, seed): host values
    block = Mamba2Block(dims, samples, dense="auto", stream=s)
    out = block.forward(p, u, stream=s)          u [S T, F] -> out [S T, E]  (row s T + t: window s, bar t)
    du = block.backward(p, u, dout, g, stream=s)  dL/d(params) into the views g, returns du = dL/du [S T, F]
                                                 (grad_samples=G: the backward covers the first G windows)
    last = Mamba2LastBlock(dims, samples, G, dense="auto", stream=s)   the same block's output at the last bar only
    out = last.forward(p, u, stream=s)           u [S T, F] -> out [S, E]
    last.backward(p, u, dout, g, stream=s)       dout [G, E] -> dL/d(params) into the views g
    enc = Mamba2Encoder(dims, batch, G, dense=d, stream=s)   the encoder of a network's input (a Mamba2LastBlock)
    enc.bind_market(market_obs, day_first)       per fold: the FoldMarketDevice's (agent/fold_market.py)
    out = enc.encode(p, rows, stream=s)          out [B, E] = the block at the last bar of the windows ending at
                                                 rows [B]: the network reads nothing else
    enc.backward(p, g, stream=s)                 the block's gradients from enc.dx [G, E]; the windows take none

The network reads the block at each window's last bar only, so the encoder runs the last-bar form: the same output
and gradients as the full block with dL/d(out) zero at the other bars (tests/agent/test_mamba2.py), without the
scan's [P, N] state (kernels/mamba2_last.py). Mamba2Block keeps the sequence output [S T, E] and its scan, for a
caller that reads every bar (tools/bench_encoders.py times both against PyTorch).

The block, per window (no causal conv1d and no gated RMSNorm: the paper's block has both; this increment is the
projections, the scan and the gate):

    z | x | B | C | dt_raw = u W_in                                  (in-projection, no bias: [F, 2HP + 2N + H])
    y = SSD(x, B, C, dt_raw; a_log, D, dt_bias)                      (per head; B, C shared by the heads)
    out = (y * silu(z)) W_out                                        (out-projection, no bias: [HP, E])

Parameters (`mamba2_entries`, in order): mamba2.in_proj.weight [F, 2HP + 2N + H] and mamba2.out_proj.weight [HP, E]
(weight-decayed), mamba2.heads [3, H] = a_log, D, dt_bias (not decayed: the decay rates, the skip and the step
offset are scales, not weights). Initialisation (`init_params`, Mamba2's defaults): projections uniform in
+-1/sqrt(fan_in); A = -exp(a_log) with -A uniform in [1, 16]; D = 1; dt_bias = softplus^-1(dt) with dt log-uniform
in [1e-3, 1e-1], so the first steps see decays between exp(-1.6) and ~1 per bar.

Which kernels: the two projections (forward, input gradient, weight gradient) run on the project's dense layers
(agent/dense.py: the tiled GEMMs of kernels/nn.py on the GPU, kernels/dense_strided.py under the simulator), given a
zero bias vector that is not a parameter (its gradient goes to a scratch vector); the scan, the gate and the
per-head parameter reduction are kernels/mamba2.py. Every buffer is allocated once here, so a StepGraph can capture
forward and backward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from fox_numba.agent.dense import WeightGrad, dense_backward_input, dense_forward, dense_kind
from fox_numba.config import NetworkConfig
from fox_numba.device.launch import check_array
from fox_numba.device.memory import device_empty, device_zeros
from fox_numba.errors import ConfigError
from fox_numba.kernels.mamba2 import (
    A_LOG,
    D_SKIP,
    DT_BIAS,
    MAX_HEAD_DIM,
    MAX_STATE_DIM,
    N_HEAD_PARAMS,
    in_width,
    mamba2_dt_grad,
    mamba2_gate_backward,
    mamba2_gate_forward,
    mamba2_head_grad,
    mamba2_scan_backward,
    mamba2_scan_forward,
)
from fox_numba.kernels.mamba2_last import mamba2_last_backward, mamba2_last_readout, mamba2_last_weights
from fox_numba.kernels.windows import gather_windows

MAMBA2_PREFIX = "mamba2."
IN_W, HEADS, OUT_W = f"{MAMBA2_PREFIX}in_proj.weight", f"{MAMBA2_PREFIX}heads", f"{MAMBA2_PREFIX}out_proj.weight"
A_RANGE = (1.0, 16.0)
"""-A is drawn uniformly from this range at initialisation."""
DT_RANGE = (1e-3, 1e-1)
"""dt = softplus(dt_bias) is drawn log-uniformly from this range at initialisation."""


@dataclass(frozen=True)
class Mamba2Dims:
    """The block's sizes: windows of `seq_len` bars of `n_features` columns, `n_heads` heads of `head_dim` channels
    with a `state_dim`-wide state, `d_out` output columns per bar."""

    seq_len: int
    n_features: int
    n_heads: int
    head_dim: int
    state_dim: int
    d_out: int

    def __post_init__(self) -> None:
        if (min(self.seq_len, self.n_features, self.n_heads, self.head_dim, self.state_dim, self.d_out) < 1
                or self.head_dim > MAX_HEAD_DIM or self.state_dim > MAX_STATE_DIM):
            raise ValueError(f"Mamba2Dims: every size must be >= 1, head_dim <= {MAX_HEAD_DIM} and state_dim <= "
                             f"{MAX_STATE_DIM}; got {self}")

    @property
    def inner(self) -> int:
        """Channels of all heads, H P."""
        return self.n_heads * self.head_dim

    @property
    def width(self) -> int:
        """Columns of the in-projection's output, 2HP + 2N + H."""
        return in_width(self.n_heads, self.head_dim, self.state_dim)


def encoder_dims(cfg: NetworkConfig, n_features: int) -> Mamba2Dims | None:
    """The encoder's sizes of a network config (windows of cfg.mamba2_window bars of the first `n_features` market
    columns), None when it is off; a ConfigError for sizes out of range or a part it does not compose with."""
    if cfg.mamba2_window == 0:
        return None
    if cfg.mamba2_window < 2:
        raise ConfigError(f"network.mamba2_window must be 0 (off) or a window of >= 2 bars, got {cfg.mamba2_window}")
    others = {"vsn": cfg.vsn, "moe_experts": cfg.moe_experts > 0, "iqn_quantiles": cfg.iqn_quantiles > 0,
              "noisy_sigma0": cfg.noisy_sigma0 > 0}
    refused = [f"network.{name}" for name, on in others.items() if on]
    if refused:
        raise ConfigError(f"network.mamba2_window does not combine with {', '.join(refused)} (not composed yet: each "
                          "reads or gates the network's input or head, which the encoder widens)")
    try:
        return Mamba2Dims(seq_len=cfg.mamba2_window, n_features=n_features, n_heads=cfg.mamba2_heads,
                          head_dim=cfg.mamba2_head_dim, state_dim=cfg.mamba2_state, d_out=cfg.mamba2_out)
    except ValueError as err:
        raise ConfigError(f"network.mamba2_*: {err}") from None


def mamba2_entries(dims: Mamba2Dims) -> list[tuple[str, tuple[int, ...], bool]]:
    """(name, shape, decays) of the block's parameters, in layout order (module header)."""
    return [(IN_W, (dims.n_features, dims.width), True), (HEADS, (N_HEAD_PARAMS, dims.n_heads), False),
            (OUT_W, (dims.inner, dims.d_out), True)]


def init_params(dims: Mamba2Dims, seed: int, first: int = 0) -> dict[str, np.ndarray]:
    """Seeded float32 initial values of every entry (module header); entry k draws from default_rng([seed, first + k])
    (`first`: the index of the block's first entry in a network's layout, so its draws are the layout's own)."""
    out: dict[str, np.ndarray] = {}
    for k, (name, shape, _) in enumerate(mamba2_entries(dims)):
        rng = np.random.default_rng([seed % 2**63, first + k])
        if name == HEADS:
            heads = np.empty(shape)
            heads[A_LOG] = np.log(rng.uniform(*A_RANGE, dims.n_heads))
            heads[D_SKIP] = 1.0
            dt = np.exp(rng.uniform(math.log(DT_RANGE[0]), math.log(DT_RANGE[1]), dims.n_heads))
            heads[DT_BIAS] = dt + np.log(-np.expm1(-dt))  # softplus^-1(dt) = log(e^dt - 1)
            out[name] = heads.astype(np.float32)
        else:
            bound = 1.0 / math.sqrt(shape[0])
            out[name] = rng.uniform(-bound, bound, shape).astype(np.float32)
    return out


def _projection_biases(dims: Mamba2Dims, stream: Any) -> tuple[Any, Any, Any, Any]:
    """The projections' zero biases (in, out) and their gradients' scratch (in, out): no bias is a parameter, the
    dense layers take one, and its gradient is discarded."""
    return (device_zeros(dims.width, np.float32, stream=stream), device_zeros(dims.d_out, np.float32, stream=stream),
            device_empty(dims.width, np.float32), device_empty(dims.d_out, np.float32))


class Mamba2Block:
    """Forward and backward of the block for `samples` windows (module header); buffers allocated once."""

    def __init__(self, dims: Mamba2Dims, samples: int, *, dense: str = "auto", stream: Any,
                 grad_samples: int | None = None) -> None:
        grad_samples = samples if grad_samples is None else grad_samples
        if not 1 <= grad_samples <= samples:
            raise ValueError(f"Mamba2Block: need 1 <= grad_samples <= samples, got {grad_samples}, {samples}")
        self.dims, self.samples, self.dense = dims, samples, dense_kind(dense, "Mamba2Block")
        rows, hp = samples * dims.seq_len, dims.inner
        grows = grad_samples * dims.seq_len  # the backward's rows: the first grad_samples windows
        self.rows, self.grad_rows = rows, grows
        self.zxbcdt = device_empty((rows, dims.width), np.float32)  # z | x | B | C | dt_raw
        self.y = device_empty((rows, hp), np.float32)  # the scan's output, before the gate
        self.gated = device_empty((rows, hp), np.float32)
        self.out = device_empty((rows, dims.d_out), np.float32)
        self.dgated = device_empty((grows, hp), np.float32)
        self.dy = device_empty((grows, hp), np.float32)
        self.carry = device_empty((grows, hp), np.float32)  # the scan backward's carried readout
        self.dzxbcdt = device_empty((grows, dims.width), np.float32)
        self.du = device_empty((grows, dims.n_features), np.float32)
        self.part = device_empty((grad_samples, N_HEAD_PARAMS * dims.n_heads), np.float32)  # per-sample head grads
        self._zero_in, self._zero_out, self._db_in, self._db_out = _projection_biases(dims, stream)
        self._wgrad_in = WeightGrad(self.dense, grows, dims.n_features, dims.width)
        self._wgrad_out = WeightGrad(self.dense, grows, hp, dims.d_out)

    def _kept(self, arr: Any) -> Any:
        """The backward's rows of a forward buffer."""
        return arr if self.grad_rows == self.rows else arr[: self.grad_rows]

    def forward(self, p: dict[str, Any], u: Any, *, stream: Any) -> Any:
        """out [S T, E] of the windows u [S T, F] (row s T + t: window s, bar t), kept in `out`; the intermediate
        zxbcdt, y and gated stay for the backward."""
        d = self.dims
        dense_forward(self.dense, u, p[IN_W], self._zero_in, self.zxbcdt, relu=False, stream=stream)
        mamba2_scan_forward(self.zxbcdt, p[HEADS], self.y, seq_len=d.seq_len, state_dim=d.state_dim, stream=stream)
        mamba2_gate_forward(self.zxbcdt, self.y, self.gated, stream=stream)
        dense_forward(self.dense, self.gated, p[OUT_W], self._zero_out, self.out, relu=False, stream=stream)
        return self.out

    def backward(self, p: dict[str, Any], u: Any, dout: Any, g: dict[str, Any], *, stream: Any,
                 input_grad: bool = True) -> Any:
        """After `forward(p, u)`: from dout [G T, E] = dL/d(out) of the first G = grad_samples windows, the parameter
        gradients into the views `g` (same names and shapes as `p`) and, with `input_grad`, du = dL/du [G T, F],
        returned (kept in `du`; else None). `u` is the forward's input, all its rows or the first G T."""
        d = self.dims
        zxbcdt, y, u = self._kept(self.zxbcdt), self._kept(self.y), u[: self.grad_rows]
        self._wgrad_out(self._kept(self.gated), dout, g[OUT_W], self._db_out, stream=stream)
        dense_backward_input(self.dense, dout, p[OUT_W], self.dgated, act=None, stream=stream)
        mamba2_gate_backward(zxbcdt, y, self.dgated, self.dy, self.dzxbcdt, stream=stream)
        mamba2_scan_backward(zxbcdt, p[HEADS], self.dy, self.carry, self.dzxbcdt, seq_len=d.seq_len,
                             state_dim=d.state_dim, stream=stream)
        mamba2_dt_grad(zxbcdt, p[HEADS], self.carry, self.dy, self.dzxbcdt, self.part, seq_len=d.seq_len,
                       state_dim=d.state_dim, stream=stream)
        mamba2_head_grad(self.part, g[HEADS], stream=stream)
        self._wgrad_in(u, self.dzxbcdt, g[IN_W], self._db_in, stream=stream)
        if not input_grad:
            return None
        dense_backward_input(self.dense, self.dzxbcdt, p[IN_W], self.du, act=None, stream=stream)
        return self.du


class Mamba2LastBlock:
    """The block's output at each window's last bar only, out [S, E] (kernels/mamba2_last.py: the scan read at one
    bar is a weighted sum of the window's inputs, with no state); forward and parameter gradients, buffers allocated
    once. The in-projection still runs over every bar: x, B and dt enter from all of them."""

    def __init__(self, dims: Mamba2Dims, samples: int, grad_samples: int, *, dense: str, stream: Any) -> None:
        if not 1 <= grad_samples <= samples:
            raise ValueError(f"Mamba2LastBlock: need 1 <= grad_samples <= samples, got {grad_samples}, {samples}")
        self.dims, self.dense = dims, dense_kind(dense, "Mamba2LastBlock")
        rows, hp, grows = samples * dims.seq_len, dims.inner, grad_samples * dims.seq_len
        self.zxbcdt = device_empty((rows, dims.width), np.float32)  # z | x | B | C | dt_raw
        self.kappa = device_empty((rows, dims.n_heads), np.float32)  # each bar's weight in the last bar's output
        self.alpha = device_empty((rows, dims.n_heads), np.float32)  # its decay to the last bar
        self.y = device_empty((samples, hp), np.float32)
        self.gated = device_empty((samples, hp), np.float32)
        self.out = device_empty((samples, dims.d_out), np.float32)
        self.dgated = device_empty((grad_samples, hp), np.float32)
        self.dy = device_empty((grad_samples, hp), np.float32)
        self.w = device_empty((grows, dims.n_heads), np.float32)
        self.dc = device_empty(grows, np.float32)
        self.dzxbcdt = device_empty((grows, dims.width), np.float32)
        self.part = device_empty((grad_samples, N_HEAD_PARAMS * dims.n_heads), np.float32)
        self._zero_in, self._zero_out, self._db_in, self._db_out = _projection_biases(dims, stream)
        self._wgrad_in = WeightGrad(self.dense, grows, dims.n_features, dims.width)
        self._wgrad_out = WeightGrad(self.dense, grad_samples, hp, dims.d_out)
        self.grad_samples, self.grad_rows = grad_samples, grows

    def forward(self, p: dict[str, Any], u: Any, *, stream: Any) -> Any:
        """out [S, E] of the windows u [S T, F] (row s T + t: window s, bar t), kept in `out`."""
        dense_forward(self.dense, u, p[IN_W], self._zero_in, self.zxbcdt, relu=False, stream=stream)
        return self.readout(p, stream=stream)

    def project(self, p: dict[str, Any], x: Any, zx: Any, *, stream: Any) -> None:
        """zx [R, W] = x [R, F] W_in: the in-projection of rows a caller gathers windows from into `zxbcdt`."""
        dense_forward(self.dense, x, p[IN_W], self._zero_in, zx, relu=False, stream=stream)

    def readout(self, p: dict[str, Any], *, stream: Any) -> Any:
        """out [S, E] from the projected windows in `zxbcdt` (forward's second half)."""
        d = self.dims
        mamba2_last_weights(self.zxbcdt, p[HEADS], self.kappa, self.alpha, seq_len=d.seq_len, state_dim=d.state_dim,
                            stream=stream)
        mamba2_last_readout(self.zxbcdt, p[HEADS], self.kappa, self.y, self.gated, seq_len=d.seq_len,
                            state_dim=d.state_dim, stream=stream)
        dense_forward(self.dense, self.gated, p[OUT_W], self._zero_out, self.out, relu=False, stream=stream)
        return self.out

    def backward(self, p: dict[str, Any], u: Any, dout: Any, g: dict[str, Any], *, stream: Any) -> None:
        """After `forward(p, u)` (or `readout` of the same windows' projection): the parameter gradients into the
        views `g` (the names and shapes of `p`) from dout [G, E] = dL/d(out) of the first G = grad_samples windows
        (u: at least their rows)."""
        d = self.dims
        gated = self.gated if self.grad_samples == self.gated.shape[0] else self.gated[: self.grad_samples]
        self._wgrad_out(gated, dout, g[OUT_W], self._db_out, stream=stream)
        dense_backward_input(self.dense, dout, p[OUT_W], self.dgated, act=None, stream=stream)
        mamba2_last_backward(self.zxbcdt, p[HEADS], self.kappa, self.alpha, self.y, self.dgated, self.dy, self.w,
                             self.dc, self.dzxbcdt, self.part, seq_len=d.seq_len, state_dim=d.state_dim,
                             stream=stream)
        mamba2_head_grad(self.part, g[HEADS], stream=stream)
        self._wgrad_in(u[: self.grad_rows], self.dzxbcdt, g[IN_W], self._db_in, stream=stream)


class Mamba2Encoder:
    """The block over each sample's window of the market, read at the window's last bar: the output a network's first
    layer reads beside the observation (network.mamba2_window; composed by agent/network.py).

    The in-projection is linear in each bar's row, so when the batch's windows hold more bars than the fold has rows
    (the learner: 2B + B windows of T bars, 786 k bars at B = 8192, T = 32, against the 23.4 k rows of a fold of 60
    regular-session days: about 34x) and the market part is exactly the encoder's F columns, the encoder projects
    the fold's R rows once per call and gathers the windows from that projection ("projected"); otherwise it
    projects the S T bars of the gathered windows. A row's projection is the same dense layer on the same row either
    way, so the two give the same bits (tests/agent/test_mamba2.py). The windows `u` are gathered in both modes (the
    weight gradient reads them; a copy, against the GEMM it saves)."""

    def __init__(self, dims: Mamba2Dims, batch: int, grad_rows: int, *, dense: str, stream: Any) -> None:
        self.dims = dims
        self.samples = batch
        self.block = Mamba2LastBlock(dims, batch, grad_rows, dense=dense, stream=stream)
        self.out = self.block.out  # [batch, E]
        self.u = device_empty((batch * dims.seq_len, dims.n_features), np.float32)  # the windows
        self.dx = device_empty((grad_rows, dims.d_out), np.float32)  # dL/d(the E columns), written by the network
        self._market: tuple[Any, Any] | None = None
        self._projected: Any = None  # [R, W]: the fold's rows projected, in the projected mode

    def bind_market(self, market_obs: Any, day_first: Any) -> None:
        """The fold's market rows the windows read: market_obs [R, C >= F] and day_first [R] (fold_market.py)."""
        check_array("market_obs", market_obs, "[R, C]", None)
        n_rows, n_cols = (int(d) for d in market_obs.shape)
        check_array("day_first", day_first, "[R]", (n_rows,), np.int32)
        if n_cols < self.dims.n_features:
            raise ValueError(f"market_obs has {n_cols} columns, the encoder reads the first {self.dims.n_features}")
        self._market = (market_obs, day_first)
        projected = n_cols == self.dims.n_features and self.samples * self.dims.seq_len > n_rows
        self._projected = device_empty((n_rows, self.dims.width), np.float32) if projected else None

    @property
    def projected(self) -> bool:
        """The bound fold is encoded from its rows' projection (class docstring)."""
        return self._projected is not None

    def encode(self, p: dict[str, Any], rows: Any, *, stream: Any) -> Any:
        """out [batch, E]: the block at the last bar of the windows ending at the samples' market rows `rows`
        [batch] (int32)."""
        if self._market is None:
            raise RuntimeError("the Mamba2 encoder (network.mamba2_window) needs the fold's market: call "
                               "Network.bind_market(market_obs, day_first) first")
        market_obs, day_first = self._market
        gather_windows(market_obs, rows, day_first, self.u, seq_len=self.dims.seq_len, stream=stream)
        if self._projected is None:
            return self.block.forward(p, self.u, stream=stream)
        self.block.project(p, market_obs, self._projected, stream=stream)
        gather_windows(self._projected, rows, day_first, self.block.zxbcdt, seq_len=self.dims.seq_len, stream=stream)
        return self.block.readout(p, stream=stream)

    def backward(self, p: dict[str, Any], g: dict[str, Any], *, stream: Any) -> None:
        """The block's parameter gradients into `g` from `dx` [grad_rows, E] (the windows are data: no input
        gradient)."""
        self.block.backward(p, self.u, self.dx, g, stream=stream)
