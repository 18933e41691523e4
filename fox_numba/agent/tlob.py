"""TLOB encoder (Berti & Kasneci 2025): dual attention over the last T order-book snapshots, forward and backward on
given parameter arrays (kernels: kernels/tlob.py), and the encoder a network composes from it over windows of the
fold's close book (network.tlob_window; agent/network.py).

    layout = TlobLayout.build(TlobShape(seq=T, n_in=F, width=D, n_blocks=L, heads_time=Ht, heads_feature=Hf, n_out=O))
    flat = init_tlob_params(layout, seed)                      float32 [layout.size], for the caller to stage
    enc = TlobEncoder(layout, batch)                           buffers allocated once (capturable calls)
    out = enc.forward(layout.views(p_flat), x, stream=s)       x [B, T*F] (snapshot t at columns t*F ..), out [B, O]
    enc.backward(layout.views(p_flat), x, dout, layout.views(g_flat), stream=s)   every dL/dp from dout = dL/dout
                                                               (grad_samples=G: dout [G, O], the first G samples)
    win = TlobWindowEncoder(shape, batch, G, dense=d)          the encoder of a network's input
    win.bind_market(book_obs, day_first)                       per fold: FoldMarketDevice's (agent/fold_market.py)
    out = win.encode(p, rows, stream=s)                        out [B, O]: the encoder over the windows ending at
                                                               rows [B], which the network reads beside the obs
    win.backward(p, g, stream=s)                               every dL/dp from win.dx [G, O]; the book takes none

The encoder, per sample (x_t the snapshot t, rows of the time view [T, D]):
    h = x W_embed + b_embed                                     [T, D]   (a dense layer over each snapshot)
    L times:  h = Sub_time(h)                                   T tokens of width D, Ht heads of D / Ht columns
              h = Sub_feature(h^T)^T                            D tokens of width T, Hf heads of T / Hf columns
    out = vec(h^T) W_head + b_head                              the last feature view [D, T] flattened feature-major
Sub(h) = LayerNorm(h + Attn(h W_qkv + b_qkv) W_o + b_o) gamma + beta: fused Q/K/V projection, multi-head scaled
dot-product attention, output projection, residual, layer norm over the token width. Simplifications against the
paper, kept for the next increment to decide: no MLP after each attention and no positional encoding (the feature
view's projections act on the T time positions as columns, so the encoder is not blind to time order).

Parameter layout (flat float32, in this order; `tlob_entries`): tlob.embed.weight [F, D], tlob.embed.bias [D], then
per block l and view v in (time, feature) with width w (D, T): tlob.block{l}.{v}.qkv.weight [w, 3w], .qkv.bias [3w],
.out.weight [w, w], .out.bias [w], .norm.gamma [w], .norm.beta [w]; then tlob.head.weight [D*T, O], tlob.head.bias
[O]. Weights decay, biases and the norm parameters do not. Init: Xavier-uniform weights, gamma 1, biases and beta 0.

Which kernels are whose: attention forward/backward, the residual layer norm forward/backward and its parameter
gradient, and the per-sample transpose between the views are kernels/tlob.py's (new). Every dense product (the
embedding, Q/K/V, output and head projections, forward, input gradient and weight gradient) reuses agent/dense.py's
kernels (kernels/nn.py register-tiled on the GPU, kernels/dense_strided.py under the simulator); the residual's
gradient sum reuses device/elementwise.axpy_f32 and the layer-norm parameter reduction kernels/gemm.wgrad_reduce.

Device memory (float32, B samples): per block and view the forward keeps the input, qkv (3x), the attention output,
the projection and the layer-norm output, 7 arrays of B*T*D floats (256 MiB each at B = 16384, T = D = 64), plus lse
and stats; the backward's scratch (6 more per view) is shared by the blocks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from fox_numba.agent.dense import WeightGrad, dense_backward_input, dense_forward, dense_kind
from fox_numba.agent.param_entry import ParamEntry
from fox_numba.config import NetworkConfig
from fox_numba.device.elementwise import axpy_f32
from fox_numba.device.launch import check_array, i32, launch_strided
from fox_numba.device.memory import device_empty
from fox_numba.errors import ConfigError
from fox_numba.features.book import BOOK_FEATURES
from fox_numba.kernels.tlob import (
    MAX_HEAD,
    MAX_SEQ,
    TILE,
    LayerNormParamGrad,
    add_layer_norm_backward,
    add_layer_norm_forward,
    attention_backward,
    attention_forward,
    batch_transpose,
)
from fox_numba.kernels.windows import gather_windows

TLOB_PREFIX = "tlob."
VIEWS = ("time", "feature")
_SUBLAYER_PARAMS = ("qkv.weight", "qkv.bias", "out.weight", "out.bias", "norm.gamma", "norm.beta")


@dataclass(frozen=True)
class TlobShape:
    """The encoder's sizes: T snapshots of F features, model width D, L blocks, heads per view, O outputs."""

    seq: int
    n_in: int
    width: int
    n_blocks: int
    heads_time: int
    heads_feature: int
    n_out: int

    def check(self) -> None:
        """Refuse sizes the kernels cannot run (kernels/tlob.py: tokens <= MAX_SEQ, head width <= MAX_HEAD, tokens x
        head width <= TILE)."""
        for tokens, width, heads, view in ((self.seq, self.width, self.heads_time, "time"),
                                           (self.width, self.seq, self.heads_feature, "feature")):
            if (not 1 <= tokens <= MAX_SEQ or heads < 1 or width % heads or width // heads > MAX_HEAD
                    or tokens * (width // heads) > TILE):
                raise ValueError(f"TLOB {view} view: {tokens} tokens of width {width} in {heads} heads; need "
                                 f"tokens <= {MAX_SEQ} and the width a multiple of the heads, <= {MAX_HEAD} per head, "
                                 f"with tokens x head width <= {TILE}")
        if min(self.n_in, self.n_blocks, self.n_out) < 1:
            raise ValueError(f"TLOB: n_in={self.n_in}, n_blocks={self.n_blocks}, n_out={self.n_out} must be >= 1")


def tlob_shape(cfg: NetworkConfig) -> TlobShape | None:
    """The encoder's sizes of a network config (windows of cfg.tlob_window book snapshots of BOOK_FEATURES columns),
    None when it is off; a ConfigError for sizes out of range or a part it does not compose with."""
    if cfg.tlob_window == 0:
        return None
    if cfg.tlob_window < 2:
        raise ConfigError(f"network.tlob_window must be 0 (off) or a window of >= 2 bars, got {cfg.tlob_window}")
    others = {"vsn": cfg.vsn, "moe_experts": cfg.moe_experts > 0, "iqn_quantiles": cfg.iqn_quantiles > 0,
              "noisy_sigma0": cfg.noisy_sigma0 > 0, "mamba2_window": cfg.mamba2_window > 0}
    refused = [f"network.{name}" for name, on in others.items() if on]
    if refused:
        raise ConfigError(f"network.tlob_window does not combine with {', '.join(refused)} (not composed yet: each "
                          "reads, gates or widens the network's input or head, which the encoder widens)")
    shape = TlobShape(seq=cfg.tlob_window, n_in=BOOK_FEATURES, width=cfg.tlob_width, n_blocks=cfg.tlob_blocks,
                      heads_time=cfg.tlob_heads, heads_feature=cfg.tlob_heads, n_out=cfg.tlob_out)
    try:
        shape.check()
    except ValueError as err:
        raise ConfigError(f"network.tlob_*: {err}") from None
    return shape


def sublayer_name(block: int, view: str, param: str) -> str:
    """`tlob.block{block}.{view}.{param}`."""
    return f"{TLOB_PREFIX}block{block}.{view}.{param}"


def tlob_entries(shape: TlobShape) -> list[tuple[str, tuple[int, ...], bool]]:
    """(name, shape, decays) of every parameter, in layout order (module header)."""
    shape.check()
    d, t = shape.width, shape.seq
    entries = [(f"{TLOB_PREFIX}embed.weight", (shape.n_in, d), True), (f"{TLOB_PREFIX}embed.bias", (d,), False)]
    for block in range(shape.n_blocks):
        for view, w in zip(VIEWS, (d, t), strict=True):
            shapes = ((w, 3 * w), (3 * w,), (w, w), (w,), (w,), (w,))
            entries += [(sublayer_name(block, view, param), s, param.endswith(".weight"))
                        for param, s in zip(_SUBLAYER_PARAMS, shapes, strict=True)]
    return entries + [(f"{TLOB_PREFIX}head.weight", (d * t, shape.n_out), True),
                      (f"{TLOB_PREFIX}head.bias", (shape.n_out,), False)]


@dataclass(frozen=True)
class TlobLayout:
    """The flat parameter buffer of one encoder: entries in order and the total size."""

    shape: TlobShape
    entries: tuple[ParamEntry, ...]
    size: int

    @classmethod
    def build(cls, shape: TlobShape) -> TlobLayout:
        entries, offset = [], 0
        for name, s, decay in tlob_entries(shape):
            entries.append(ParamEntry(name, offset, s, decay))
            offset += math.prod(s)
        return cls(shape, tuple(entries), offset)

    def views(self, flat: Any) -> dict[str, Any]:
        """Device views {name: array of the entry's shape} of a flat device buffer (no copy)."""
        check_array("flat TLOB parameters", flat, "[layout.size]", (self.size,))
        return {e.name: flat[e.offset : e.stop].reshape(e.shape) for e in self.entries}


def init_tlob_params(layout: TlobLayout, seed: int, first: int = 0) -> np.ndarray:
    """Seeded float32 parameters [layout.size]: Xavier-uniform weights, norm gamma 1, biases and beta 0; entry k
    draws from default_rng([seed, first + k]) (`first`: the index of the encoder's first entry in a network's layout,
    so its draws are the layout's own)."""
    flat = np.zeros(layout.size, np.float32)
    for index, e in enumerate(layout.entries):
        if e.decay:
            bound = math.sqrt(6.0 / (e.shape[0] + e.shape[1]))
            rng = np.random.default_rng([seed % 2**63, first + index])
            flat[e.offset : e.stop] = rng.uniform(-bound, bound, e.size).astype(np.float32)
        elif e.name.endswith(".norm.gamma"):
            flat[e.offset : e.stop] = 1.0
    return flat


class _Saved:
    """One sublayer's forward buffers, kept for its backward: qkv, attention output, lse, projection, stats, y."""

    def __init__(self, rows: int, width: int, heads: int) -> None:
        self.qkv = device_empty((rows, 3 * width), np.float32)
        self.att = device_empty((rows, width), np.float32)
        self.lse = device_empty((rows, heads), np.float32)
        self.proj = device_empty((rows, width), np.float32)
        self.stats = device_empty((rows, 2), np.float32)
        self.y = device_empty((rows, width), np.float32)


class _View:
    """The attention sublayer of one view (seq tokens of `width`): its backward scratch and gradient plans, shared
    by every block."""

    def __init__(self, view: str, kind: str, batch: int, seq: int, width: int, heads: int, grad_samples: int) -> None:
        rows, grows = batch * seq, grad_samples * seq  # the backward's rows: the first grad_samples samples
        self.view, self.kind, self.seq, self.rows, self.width, self.heads = view, kind, seq, rows, width, heads
        self.grad_rows = grows
        self.dz = device_empty((grows, width), np.float32)
        self.datt = device_empty((grows, width), np.float32)
        self.dqkv = device_empty((grows, 3 * width), np.float32)
        self.dx = device_empty((grows, width), np.float32)
        self._wg_qkv = WeightGrad(kind, grows, width, 3 * width)
        self._wg_out = WeightGrad(kind, grows, width, width)
        self._ln_grad = LayerNormParamGrad(grows, width)

    def kept(self, arr: Any) -> Any:
        """The backward's rows of a forward buffer of this view."""
        return arr if self.grad_rows == self.rows else arr[: self.grad_rows]

    def saved(self) -> _Saved:
        return _Saved(self.rows, self.width, self.heads)

    def forward(self, p: dict[str, Any], block: int, x: Any, s: _Saved, *, stream: Any) -> Any:
        """s.y = LN(x + Attn(x W_qkv + b_qkv) W_o + b_o) gamma + beta; the intermediates stay in s."""
        n = {k: sublayer_name(block, self.view, k) for k in _SUBLAYER_PARAMS}
        dense_forward(self.kind, x, p[n["qkv.weight"]], p[n["qkv.bias"]], s.qkv, relu=False, stream=stream)
        attention_forward(s.qkv, s.att, s.lse, self.seq, stream=stream)
        dense_forward(self.kind, s.att, p[n["out.weight"]], p[n["out.bias"]], s.proj, relu=False, stream=stream)
        add_layer_norm_forward(x, s.proj, p[n["norm.gamma"]], p[n["norm.beta"]], s.y, s.stats, stream=stream)
        return s.y

    def backward(self, p: dict[str, Any], g: dict[str, Any], block: int, x: Any, s: _Saved, dy: Any, *,
                 stream: Any) -> Any:
        """The sublayer's parameter gradients into g and dL/dx (returned: self.dx) from dy = dL/dy of the first
        grad_samples samples (x and s: the forward's, all rows)."""
        n = {k: sublayer_name(block, self.view, k) for k in _SUBLAYER_PARAMS}
        x, qkv, att, lse, proj, stats = (self.kept(a) for a in (x, s.qkv, s.att, s.lse, s.proj, s.stats))
        add_layer_norm_backward(dy, x, proj, p[n["norm.gamma"]], stats, self.dz, stream=stream)
        self._ln_grad(dy, x, proj, stats, g[n["norm.gamma"]], g[n["norm.beta"]], stream=stream)
        self._wg_out(att, self.dz, g[n["out.weight"]], g[n["out.bias"]], stream=stream)
        dense_backward_input(self.kind, self.dz, p[n["out.weight"]], self.datt, act=None, stream=stream)
        attention_backward(qkv, att, self.datt, lse, self.dqkv, self.seq, stream=stream)
        self._wg_qkv(x, self.dqkv, g[n["qkv.weight"]], g[n["qkv.bias"]], stream=stream)
        dense_backward_input(self.kind, self.dqkv, p[n["qkv.weight"]], self.dx, act=None, stream=stream)
        size = self.grad_rows * self.width  # the residual: dL/dx += dL/dz
        launch_strided(axpy_f32, size, self.dx.reshape(size), np.float32(1.0), self.dz.reshape(size), i32(size),
               stream=stream)
        return self.dx


class TlobEncoder:
    """The encoder's forward and backward for `batch` samples (the backward over the first `grad_samples`, by default
    all; module header); every buffer is allocated here, so forward and backward allocate nothing and can run inside
    a captured step."""

    def __init__(self, layout: TlobLayout, batch: int, *, dense: str = "auto", grad_samples: int | None = None) -> None:
        grad_samples = batch if grad_samples is None else grad_samples
        if not 1 <= grad_samples <= batch:
            raise ValueError(f"TlobEncoder: need 1 <= grad_samples <= batch, got {grad_samples}, {batch}")
        sh = self.shape = layout.shape
        t, d = sh.seq, sh.width
        self.layout, self.batch, self.grad_samples = layout, batch, grad_samples
        kind = self.kind = dense_kind(dense, "TlobEncoder")
        self.time = _View("time", kind, batch, t, d, sh.heads_time, grad_samples)
        self.feature = _View("feature", kind, batch, d, t, sh.heads_feature, grad_samples)
        self.embedded = device_empty((batch * t, d), np.float32)
        # the time view's input of each block: the embedding, then the previous block's output transposed back
        self.time_in = [self.embedded] + [device_empty((batch * t, d), np.float32) for _ in range(sh.n_blocks - 1)]
        self.feature_in = [device_empty((batch * d, t), np.float32) for _ in range(sh.n_blocks)]
        self.saved = [(self.time.saved(), self.feature.saved()) for _ in range(sh.n_blocks)]
        self.out = device_empty((batch, sh.n_out), np.float32)
        self.dtime = device_empty((grad_samples * t, d), np.float32)
        self.dfeature = device_empty((grad_samples * d, t), np.float32)
        self._wg_embed = WeightGrad(kind, grad_samples * t, sh.n_in, d)
        self._wg_head = WeightGrad(kind, grad_samples, d * t, sh.n_out)

    def _rows(self, x: Any) -> Any:
        """x [B, T*F] as the time view's rows [B*T, F]."""
        sh = self.shape
        check_array("x", x, "[B, T*F]", (self.batch, sh.seq * sh.n_in))
        return x.reshape((self.batch * sh.seq, sh.n_in))

    def _head_input(self) -> Any:
        """The last block's feature-view output [B*D, T] as the head's rows [B, D*T]."""
        return self.saved[-1][1].y.reshape((self.batch, self.shape.width * self.shape.seq))

    def forward(self, p: dict[str, Any], x: Any, *, stream: Any) -> Any:
        """out [B, n_out] (self.out) of x [B, T*F] under the parameter views p; keeps what backward reads."""
        sh, pre = self.shape, TLOB_PREFIX
        dense_forward(self.kind, self._rows(x), p[f"{pre}embed.weight"], p[f"{pre}embed.bias"], self.embedded,
                      relu=False, stream=stream)
        for block, (s_time, s_feature) in enumerate(self.saved):
            if block:
                batch_transpose(self.saved[block - 1][1].y, self.time_in[block], sh.width, stream=stream)
            y = self.time.forward(p, block, self.time_in[block], s_time, stream=stream)
            batch_transpose(y, self.feature_in[block], sh.seq, stream=stream)
            self.feature.forward(p, block, self.feature_in[block], s_feature, stream=stream)
        dense_forward(self.kind, self._head_input(), p[f"{pre}head.weight"], p[f"{pre}head.bias"], self.out,
                      relu=False, stream=stream)
        return self.out

    def backward(self, p: dict[str, Any], x: Any, dout: Any, g: dict[str, Any], *, stream: Any) -> None:
        """Every parameter gradient into the views g from dout [G, n_out] = dL/dout of the first G = grad_samples
        samples, after forward(p, x); x is data, so it gets no gradient."""
        sh, pre, grad = self.shape, TLOB_PREFIX, self.grad_samples
        check_array("dout", dout, "[G, n_out]", (grad, sh.n_out))
        self._wg_head(self._head_input()[:grad], dout, g[f"{pre}head.weight"], g[f"{pre}head.bias"], stream=stream)
        dense_backward_input(self.kind, dout, p[f"{pre}head.weight"],
                             self.dfeature.reshape((grad, sh.width * sh.seq)), act=None, stream=stream)
        for block in reversed(range(sh.n_blocks)):
            s_time, s_feature = self.saved[block]
            dx = self.feature.backward(p, g, block, self.feature_in[block], s_feature, self.dfeature, stream=stream)
            batch_transpose(dx, self.dtime, sh.width, stream=stream)
            dx = self.time.backward(p, g, block, self.time_in[block], s_time, self.dtime, stream=stream)
            if block:
                batch_transpose(dx, self.dfeature, sh.seq, stream=stream)
        self._wg_embed(self._rows(x)[: grad * sh.seq], self.time.dx, g[f"{pre}embed.weight"], g[f"{pre}embed.bias"],
                       stream=stream)


class TlobWindowEncoder:
    """The encoder over each sample's window of the fold's book snapshots: the output a network's first layer reads
    beside the observation (network.tlob_window; composed by agent/network.py)."""


    def __init__(self, shape: TlobShape, batch: int, grad_rows: int, *, dense: str) -> None:
        self.shape, self.samples = shape, batch
        self.encoder = TlobEncoder(TlobLayout.build(shape), batch, dense=dense, grad_samples=grad_rows)
        self.out = self.encoder.out  # [batch, O]
        self.u = device_empty((batch * shape.seq, shape.n_in), np.float32)  # the windows, snapshot t of s at s T + t
        self.dx = device_empty((grad_rows, shape.n_out), np.float32)  # dL/d(the O columns), written by the network
        self._market: tuple[Any, Any] | None = None

    def bind_market(self, book_obs: Any, day_first: Any) -> None:
        """The fold's book snapshots the windows read: book_obs [R, n_in] and day_first [R] (fold_market.py)."""
        check_array("book_obs", book_obs, "[R, BOOK_FEATURES]", None)
        n_rows, n_cols = (int(d) for d in book_obs.shape)
        check_array("day_first", day_first, "[R]", (n_rows,), np.int32)
        if n_cols != self.shape.n_in:
            raise ValueError(f"book_obs has {n_cols} columns, the TLOB encoder reads {self.shape.n_in}")
        self._market = (book_obs, day_first)

    def encode(self, p: dict[str, Any], rows: Any, *, stream: Any) -> Any:
        """out [batch, O]: the encoder over the book windows ending at the samples' market rows `rows` [batch]
        (int32)."""
        if self._market is None:
            raise RuntimeError("the TLOB encoder (network.tlob_window) needs the fold's book: call "
                               "Network.bind_market(market_obs, day_first, book_obs) first")
        book_obs, day_first = self._market
        sh = self.shape
        gather_windows(book_obs, rows, day_first, self.u, seq_len=sh.seq, stream=stream)
        return self.encoder.forward(p, self.u.reshape((self.encoder.batch, sh.seq * sh.n_in)), stream=stream)

    def backward(self, p: dict[str, Any], g: dict[str, Any], *, stream: Any) -> None:
        """Every encoder parameter gradient into `g` from `dx` [grad_rows, O] (the book is data: no input gradient)."""
        sh = self.shape
        self.encoder.backward(p, self.u.reshape((self.encoder.batch, sh.seq * sh.n_in)), self.dx, g, stream=stream)
