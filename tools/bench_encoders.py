"""Benchmark the window encoders (Mamba2, TLOB) against PyTorch fp32 doing the same math on the same shapes, on the GPU.

    python3 tools/bench_encoders.py --out tools/results/bench_encoders_h200 [--samples 8192] [--window 32]
    NUMBA_ENABLE_CUDASIM=1 python3 tools/bench_encoders.py --out /tmp/bench_encoders_sim --tiny   # CPU, torch on CPU

Ours: agent/mamba2.py Mamba2Encoder (kernels/mamba2_last.py) and agent/tlob.py TlobWindowEncoder (kernels/tlob.py) at
the default network config's sizes (network.mamba2_* over the N_MARKET market columns; network.tlob_* over BOOK_FEATURES
book columns), windows of --window bars, run fp32 (dense layers: kernels/nn.py's tiled GEMMs). Each call includes the
gather of every sample's window from a random per-bar source (kernels/windows.py; the same clamped gather in torch).
Three cases per encoder, S = --samples (the learner's batch): the target network's forward over S windows; the
online network's forward over 2S (s and s'); and the online network's share of a gradient step, that forward plus
every parameter gradient from the first S windows' output gradient (the network reads each window's last bar).
PyTorch (torch.autograd for the backward; the step's s' forward under no_grad, the S-window forward with grad):
- Mamba2 "torch SSD": the chunked SSD form of the paper's minimal reference (ssd_minimal_discrete: exp of the
  segment sums within chunks of --chunk bars, 0 = the whole window, one chunk; states passed between chunks);
  "torch scan": the recurrence h_t = a_t h_{t-1} + dt_t x_t B_t^T as a loop over the T bars; both read at the last
  bar; "torch last-bar weights": the last bar's output alone as ours forms it, sum_t kappa_t x_t
  (kernels/mamba2_last.py). Every form and ours output the last bar only, the one the network reads.
- TLOB "torch SDPA": F.scaled_dot_product_attention; "torch softmax": softmax(Q K^T / sqrt(E)) V written out.
Both encoders project with F.linear (nn.Linear's op); TLOB normalises with F.layer_norm. fp32, TF32 off
(torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32 False).
Timing: each call captured once into a CUDA graph (ours: device/graphs.StepGraph; torch: torch.cuda.CUDAGraph after
a side-stream warm-up), --warmup replays, then the best of --windows windows of --replays replays between CUDA events
(torch on the CPU, and ours under the simulator: eager calls, the wall clock).
Check, before timing: on a seeded case at the same sizes (--check-samples S', forward 2S', gradients from S'; a short
source of days of 2T bars, so many windows clamp at a day's start) ours and every torch form against the float64
numpy references of tests/ (reference_mamba2.py block64 / block_backward64, reference_tlob.py encoder64 /
encoder_bwd64), and ours against each torch form, on every output element and every parameter gradient:
|a - b| <= RTOL |ref| + ATOL max|ref| per array (the tests' tolerance; twice that between ours and torch; Mamba2's
head gradient row by row, its rows differ in scale). A mismatch writes the check and exits 1 without timing.
Writes OUT.md and OUT.json (the numbers, the command, the machine).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from numba import cuda

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "tests"))

import reference_mamba2 as ref_mamba2
import reference_tlob as ref_tlob
from bench_device import machine, results_header

from fox_numba.agent.mamba2 import HEADS, IN_W, OUT_W, Mamba2Dims, Mamba2Encoder, encoder_dims, mamba2_entries
from fox_numba.agent.mamba2 import init_params as mamba2_init
from fox_numba.agent.tlob import TlobLayout, TlobShape, TlobWindowEncoder, init_tlob_params, tlob_shape
from fox_numba.config import NetworkConfig
from fox_numba.device.graphs import StepGraph
from fox_numba.device.runtime import SIMULATOR, new_stream
from fox_numba.device.staging import Stager
from fox_numba.io import atomic_write_text
from fox_numba.kernels.mamba2 import A_LOG, D_SKIP, DT_BIAS
from fox_numba.observation import N_MARKET

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # the numba half runs without torch (tests/test_bench_encoders.py); main() refuses
    torch = None

RTOL, ATOL = 1e-4, 2e-5
"""Check tolerance against float64: |got - ref| <= RTOL |ref| + ATOL max|ref| (tests/agent/test_tlob.py's)."""
DAY_BARS = 390  # the timed source's days (a regular ES session)
TINY_MAMBA2 = Mamba2Dims(seq_len=6, n_features=5, n_heads=2, head_dim=6, state_dim=5, d_out=3)
TINY_TLOB = TlobShape(seq=4, n_in=3, width=6, n_blocks=2, heads_time=2, heads_feature=2, n_out=3)
Params = dict[str, np.ndarray]
TorchForm = Callable[[dict[str, Any], Any], Any]  # (parameters, windows [N, T, F]) -> out [N, E] at the last bar


class Encoder(Protocol):
    """One encoder under test: its sizes, our implementation, the torch forms and the float64 reference."""

    name: str
    seq: int
    n_in: int
    n_out: int
    sizes: dict[str, int]  # for the results

    def entries(self) -> list[tuple[str, tuple[int, ...]]]: ...
    def params(self, seed: int) -> Params: ...
    def ours(self, samples: int, grad_rows: int, stream: Any) -> Any: ...
    def torch_forms(self) -> dict[str, TorchForm]: ...
    def reference(self, p: Params, windows: np.ndarray, dx: np.ndarray) -> tuple[np.ndarray, Params]: ...
    def named(self, grads: Params) -> Params: ...


class Mamba2Bench:
    """The Mamba2 encoder (agent/mamba2.py)."""

    name = "Mamba2"

    def __init__(self, dims: Mamba2Dims, chunk: int) -> None:
        if dims.seq_len % chunk:
            raise ValueError(f"--chunk {chunk} must divide the window of {dims.seq_len} bars")
        self.dims, self.chunk = dims, chunk
        self.seq, self.n_in, self.n_out = dims.seq_len, dims.n_features, dims.d_out
        self.sizes = {**dataclasses.asdict(dims), "chunk": chunk}

    def entries(self) -> list[tuple[str, tuple[int, ...]]]:
        return [(name, shape) for name, shape, _ in mamba2_entries(self.dims)]

    def params(self, seed: int) -> Params:
        """The initial values with D away from 1 and dt_bias raised by 2 (decays well below 1), as
        tests/agent/test_mamba2.py does."""
        p = mamba2_init(self.dims, seed)
        rng = np.random.default_rng([seed, 1])
        p[HEADS][D_SKIP] += rng.uniform(-0.5, 0.5, self.dims.n_heads).astype(np.float32)
        p[HEADS][DT_BIAS] += np.float32(2.0) + rng.uniform(-0.5, 0.5, self.dims.n_heads).astype(np.float32)
        return p

    def ours(self, samples: int, grad_rows: int, stream: Any) -> Mamba2Encoder:
        return Mamba2Encoder(self.dims, samples, grad_rows, dense="auto", stream=stream)

    def torch_forms(self) -> dict[str, TorchForm]:
        return {f"torch SSD (chunks of {self.chunk})": lambda p, u: self._torch(p, u, ssd="chunked"),
                "torch scan": lambda p, u: self._torch(p, u, ssd="scan"),
                "torch last-bar weights": lambda p, u: self._torch(p, u, ssd="last")}

    def _torch(self, p: dict[str, Any], u: Any, *, ssd: str) -> Any:
        """out [N, E] of the block on u [N, T, F] at the last bar (agent/mamba2.py's header): the SSD output of every
        bar (`ssd` "chunked" or "scan") read at the last, or the last bar's alone as kernels/mamba2_last.py forms it
        ("last")."""
        d = self.dims
        n, t = u.shape[:2]
        z, x, b, c, dt_raw = torch.split(F.linear(u, p[IN_W].T), [d.inner, d.inner, d.state_dim, d.state_dim,
                                                                  d.n_heads], dim=-1)
        a_log, d_skip, dt_bias = p[HEADS]
        dt = F.softplus(dt_raw + dt_bias)  # [N, T, H]
        log_a = dt * -torch.exp(a_log)  # log a_t = dt_t A
        x = x.reshape(n, t, d.n_heads, d.head_dim)
        if ssd == "last":
            y = ssd_last(x, dt, log_a, b, c)
        else:
            xdt = x * dt[..., None]
            y = ssd_chunked(xdt, log_a, b, c, self.chunk) if ssd == "chunked" else ssd_scan(xdt, log_a, b, c)
            y = y[:, -1]
        y = y + d_skip[:, None] * x[:, -1]
        return F.linear(y.reshape(n, d.inner) * F.silu(z[:, -1]), p[OUT_W].T)

    def reference(self, p: Params, windows: np.ndarray, dx: np.ndarray) -> tuple[np.ndarray, Params]:
        d = self.dims
        n, t = windows.shape[:2]
        u = windows.reshape(n * t, d.n_features)
        sizes = (d.seq_len, d.n_heads, d.head_dim, d.state_dim)
        out = ref_mamba2.block64(u, p[IN_W], p[OUT_W], p[HEADS], *sizes)[0].reshape(n, t, d.d_out)[:, -1]
        grad = dx.shape[0]
        dout = np.zeros((grad * t, d.d_out))
        dout[t - 1 :: t] = dx  # the network reads each window's last bar
        _, d_in, d_out, d_heads = ref_mamba2.block_backward64(u[: grad * t], p[IN_W], p[OUT_W], p[HEADS], dout, *sizes)
        return out, {IN_W: d_in, HEADS: d_heads, OUT_W: d_out}

    def named(self, grads: Params) -> Params:
        """The head gradient's rows as arrays of their own (d a_log, dD, d dt_bias differ in scale by up to 1e3)."""
        out = {k: v for k, v in grads.items() if k != HEADS}
        for row, label in ((A_LOG, "a_log"), (D_SKIP, "D"), (DT_BIAS, "dt_bias")):
            out[f"{HEADS}[{label}]"] = grads[HEADS][row]
        return out


class TlobBench:
    """The TLOB encoder (agent/tlob.py)."""

    name = "TLOB"

    def __init__(self, shape: TlobShape) -> None:
        self.shape, self.layout = shape, TlobLayout.build(shape)
        self.seq, self.n_in, self.n_out = shape.seq, shape.n_in, shape.n_out
        self.sizes = dataclasses.asdict(shape)

    def entries(self) -> list[tuple[str, tuple[int, ...]]]:
        return [(e.name, e.shape) for e in self.layout.entries]

    def params(self, seed: int) -> Params:
        """The initial values (Xavier weights) with gamma 1 + 0.3 N(0, 1), biases and beta 0.3 N(0, 1)."""
        flat = init_tlob_params(self.layout, seed)
        rng = np.random.default_rng([seed, 1])
        out: Params = {}
        for e in self.layout.entries:
            v = flat[e.offset : e.stop].reshape(e.shape)
            out[e.name] = v if e.decay else v + (0.3 * rng.standard_normal(e.shape)).astype(np.float32)
        return out

    def ours(self, samples: int, grad_rows: int, stream: Any) -> TlobWindowEncoder:
        return TlobWindowEncoder(self.shape, samples, grad_rows, dense="auto")

    def torch_forms(self) -> dict[str, TorchForm]:
        return {"torch SDPA": lambda p, u: self._torch(p, u, F.scaled_dot_product_attention),
                "torch softmax": lambda p, u: self._torch(p, u, softmax_attention)}

    def _torch(self, p: dict[str, Any], u: Any, attend: Callable[[Any, Any, Any], Any]) -> Any:
        """out [N, O] of the encoder on u [N, T, F] (agent/tlob.py's header)."""
        sh = self.shape
        n = u.shape[0]
        h = F.linear(u, p["tlob.embed.weight"].T, p["tlob.embed.bias"])  # the time view [N, T, D]
        for block in range(sh.n_blocks):
            h = self._sublayer(p, f"tlob.block{block}.time.", h, sh.heads_time, attend)
            feature = self._sublayer(p, f"tlob.block{block}.feature.", h.transpose(1, 2), sh.heads_feature, attend)
            h = feature.transpose(1, 2)  # [N, D, T] -> the next block's time view
        head_in = feature.reshape(n, sh.width * sh.seq)  # the last feature view, flattened feature-major
        return F.linear(head_in, p["tlob.head.weight"].T, p["tlob.head.bias"])

    @staticmethod
    def _sublayer(p: dict[str, Any], pre: str, h: Any, heads: int, attend: Callable[[Any, Any, Any], Any]) -> Any:
        """LayerNorm(h + Attn(h W_qkv + b_qkv) W_o + b_o) gamma + beta over h [N, S, W]."""
        n, s, w = h.shape
        qkv = F.linear(h, p[pre + "qkv.weight"].T, p[pre + "qkv.bias"])
        q, k, v = qkv.view(n, s, 3, heads, w // heads).permute(2, 0, 3, 1, 4)  # each [N, heads, S, E]
        att = attend(q, k, v).transpose(1, 2).reshape(n, s, w)
        a = F.linear(att, p[pre + "out.weight"].T, p[pre + "out.bias"])
        return F.layer_norm(h + a, (w,), p[pre + "norm.gamma"], p[pre + "norm.beta"], eps=ref_tlob.LN_EPS)

    def reference(self, p: Params, windows: np.ndarray, dx: np.ndarray) -> tuple[np.ndarray, Params]:
        sh = self.shape
        x = windows.reshape(windows.shape[0], sh.seq * sh.n_in)
        sizes = (sh.seq, sh.width, sh.n_blocks, sh.heads_time, sh.heads_feature)
        out, _ = ref_tlob.encoder64(p, x, *sizes)
        _, cache = ref_tlob.encoder64(p, x[: dx.shape[0]], *sizes)
        return out, ref_tlob.encoder_bwd64(p, x[: dx.shape[0]], cache, dx, sh.seq, sh.width)

    def named(self, grads: Params) -> Params:
        return grads


def segsum(x: Any) -> Any:
    """[..., L] -> [..., L, L]: entry (t, s) = x[s+1] + .. + x[t] for s <= t, -inf above the diagonal (the SSD
    reference's stable segment sum: masked cumulative sums, not differences of running sums)."""
    length = x.shape[-1]
    x = x[..., None].expand(*x.shape, length)
    strict = torch.tril(torch.ones(length, length, dtype=torch.bool, device=x.device), diagonal=-1)
    sums = torch.cumsum(x.masked_fill(~strict, 0.0), dim=-2)
    lower = torch.tril(torch.ones(length, length, dtype=torch.bool, device=x.device))
    return sums.masked_fill(~lower, -torch.inf)


def ssd_chunked(xdt: Any, log_a: Any, b: Any, c: Any, chunk: int) -> Any:
    """y [N, T, H, P] (without D x) of xdt = dt x [N, T, H, P], log a = dt A [N, T, H], B, C [N, T, St] in chunks of
    `chunk` bars: within a chunk y_t = sum_{s <= t} (C_t . B_s) exp(l_t - l_s) dt_s x_s (l: the running sum of log a);
    each chunk's end state, carried into the later chunks and read there through exp(l_t) C_t."""
    n, t, h, p = xdt.shape
    k = t // chunk
    xs = xdt.reshape(n, k, chunk, h, p).transpose(2, 3)  # [N, K, H, L, P]
    la = log_a.reshape(n, k, chunk, h).transpose(2, 3)  # [N, K, H, L]
    bs, cs = b.reshape(n, k, chunk, -1), c.reshape(n, k, chunk, -1)  # [N, K, L, St]
    cum = torch.cumsum(la, dim=-1)
    y = ((cs @ bs.transpose(-1, -2))[:, :, None] * torch.exp(segsum(la))) @ xs  # [N, K, H, L, P]
    to_end = torch.exp(cum[..., -1:] - cum)
    states = (xs * to_end[..., None]).transpose(-1, -2) @ bs[:, :, None]  # [N, K, H, P, St]: each chunk's own
    states = torch.cat([torch.zeros_like(states[:, :1]), states], dim=1)
    carry = torch.exp(segsum(F.pad(cum[..., -1].transpose(1, 2), (1, 0))))  # [N, H, K + 1, K + 1]
    entering = torch.einsum("nhzc,nchps->nzhps", carry, states)[:, :-1]  # the state entering each chunk
    y = y + (cs[:, :, None] @ entering.transpose(-1, -2)) * torch.exp(cum)[..., None]
    return y.transpose(2, 3).reshape(n, t, h, p)


def ssd_scan(xdt: Any, log_a: Any, b: Any, c: Any) -> Any:
    """The same y by the recurrence h_t = a_t h_{t-1} + dt_t x_t B_t^T, y_t = h_t C_t, a loop over the bars."""
    n, t, h, p = xdt.shape
    decay = torch.exp(log_a)
    state = xdt.new_zeros(n, h, p, b.shape[-1])
    ys = []
    for step in range(t):
        state = decay[:, step, :, None, None] * state + xdt[:, step, :, :, None] * b[:, step, None, None, :]
        ys.append(state @ c[:, step, None, :, None])  # [N, H, P, 1]
    return torch.stack(ys, dim=1)[..., 0]


def ssd_last(x: Any, dt: Any, log_a: Any, b: Any, c: Any) -> Any:
    """y [N, H, P] (without D x) of the last bar alone, x [N, T, H, P], dt and log a = dt A [N, T, H], B, C
    [N, T, St]: sum_t dt_t exp(sum_{u>t} log a_u) (B_t . C_last) x_t (kernels/mamba2_last.py's weights)."""
    after = torch.flip(torch.cumsum(torch.flip(log_a, [1]), dim=1), [1]) - log_a  # sum over the later bars
    kappa = dt * torch.exp(after) * (b @ c[:, -1, :, None])  # [N, T, H]
    return torch.einsum("nth,nthp->nhp", kappa, x)


def softmax_attention(q: Any, k: Any, v: Any) -> Any:
    """softmax(Q K^T / sqrt(E)) V, written out."""
    return torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1) @ v


@dataclasses.dataclass(frozen=True)
class Inputs:
    """A random per-bar source, its days, the windows' last rows and the output gradient of the first windows."""

    source: np.ndarray  # [R, F] float32
    day_first: np.ndarray  # [R] int32: the first row of each row's day
    rows: np.ndarray  # [N] int32
    dx: np.ndarray  # [G, E] float32: dL/d(the last output row of each of the first G windows)

    def windows(self, seq: int) -> np.ndarray:
        """float64 [N, T, F]: kernels/windows.py's gather (a bar before the day's first reads the first)."""
        idx = np.maximum(self.rows[:, None] - seq + 1 + np.arange(seq), self.day_first[self.rows][:, None])
        return self.source[idx].astype(np.float64)


def make_inputs(enc: Encoder, bars: int, day_bars: int, samples: int, grad: int, seed: int) -> Inputs:
    rng = np.random.default_rng(seed)
    return Inputs(rng.standard_normal((bars, enc.n_in)).astype(np.float32),
                  (np.arange(bars) // day_bars * day_bars).astype(np.int32),
                  rng.integers(0, bars, samples).astype(np.int32),
                  rng.standard_normal((grad, enc.n_out)).astype(np.float32))


def split(flat: Any, entries: list[tuple[str, tuple[int, ...]]]) -> dict[str, Any]:
    """Views {name: array of its shape} of a flat host or device buffer holding the entries in order."""
    out, offset = {}, 0
    for name, shape in entries:
        size = int(np.prod(shape))
        out[name] = flat[offset : offset + size].reshape(shape)
        offset += size
    return out


class Ours:
    """Our encoder over the first `samples` of the inputs' windows, gradients from the first `grad`, on a flat
    parameter buffer and a flat gradient buffer."""

    def __init__(self, enc: Encoder, params: Params, inputs: Inputs, samples: int, grad: int, *, backward: bool,
                 stager: Stager, stream: Any) -> None:
        self.enc, self.backward, self.stager = enc, backward, stager
        flat = np.concatenate([params[name].ravel() for name, _ in enc.entries()])
        self.flat, self.gflat = stager.upload_new(flat), stager.upload_new(np.full_like(flat, np.nan))
        self.p, self.g = split(self.flat, enc.entries()), split(self.gflat, enc.entries())
        self.model = enc.ours(samples, grad, stream)
        self.model.bind_market(stager.upload_new(inputs.source), stager.upload_new(inputs.day_first))
        self.rows = stager.upload_new(inputs.rows[:samples])
        stager.upload(inputs.dx[:grad], self.model.dx)

    def step(self, stream: Any) -> None:
        """The forward and, with `backward`, every parameter gradient (a StepGraph body)."""
        self.model.encode(self.p, self.rows, stream=stream)
        if self.backward:
            self.model.backward(self.p, self.g, stream=stream)

    def results(self) -> Params:
        """out [N, E] and every parameter gradient, on the host."""
        out = self.stager.download(self.model.out)
        return {"out": out, **split(self.stager.download(self.gflat), self.enc.entries())}


class TorchRun:
    """The torch forms on the inputs, on `device`: a forward over the first windows, or the learner's step (the
    first G windows with gradients, the rest under no_grad)."""

    def __init__(self, enc: Encoder, params: Params, inputs: Inputs, device: str) -> None:
        def put(a: np.ndarray) -> Any:
            return torch.from_numpy(a).to(device)

        self.source, self.dx = put(inputs.source), put(inputs.dx)
        self.day_first, self.rows = put(inputs.day_first).long(), put(inputs.rows).long()
        self.offsets = torch.arange(1 - enc.seq, 1, device=device)
        self.p = {k: put(v).requires_grad_() for k, v in params.items()}

    def windows(self, rows: Any) -> Any:
        """[N, T, F]: the same clamped gather as ours."""
        return self.source[torch.maximum(rows[:, None] + self.offsets, self.day_first[rows][:, None])]

    def forward(self, form: TorchForm, samples: int) -> Any:
        with torch.no_grad():
            return form(self.p, self.windows(self.rows[:samples]))

    def step(self, form: TorchForm, grad: int) -> tuple[Any, Any, dict[str, Any]]:
        """(out of the first `grad` windows, out of the rest, every parameter gradient from dx at their last rows)."""
        out = form(self.p, self.windows(self.rows[:grad]))
        with torch.no_grad():
            rest = form(self.p, self.windows(self.rows[grad:]))
        grads = torch.autograd.grad(out, list(self.p.values()), self.dx)
        return out, rest, dict(zip(self.p, grads, strict=True))


def ours_check(enc: Encoder, params: Params, inputs: Inputs, stager: Stager, stream: Any) -> Params:
    """Our outputs over every window of `inputs` and gradients from the first len(dx), one eager step."""
    ours = Ours(enc, params, inputs, len(inputs.rows), len(inputs.dx), backward=True, stager=stager, stream=stream)
    ours.step(stream)
    stream.synchronize()
    res = ours.results()
    return {"out": res.pop("out"), **enc.named(res)}


def reference_check(enc: Encoder, params: Params, inputs: Inputs) -> Params:
    """The float64 reference's outputs and gradients (tests/reference_*.py)."""
    p64 = {k: v.astype(np.float64) for k, v in params.items()}
    out, grads = enc.reference(p64, inputs.windows(enc.seq), inputs.dx.astype(np.float64))
    return {"out": out, **enc.named(grads)}


def torch_check(enc: Encoder, form: TorchForm, params: Params, inputs: Inputs, device: str) -> Params:
    run = TorchRun(enc, params, inputs, device)
    out, rest, grads = run.step(form, len(inputs.dx))
    host = {k: v.detach().cpu().numpy() for k, v in grads.items()}
    return {"out": torch.cat([out, rest]).detach().cpu().numpy(), **enc.named(host)}


def worst(got: np.ndarray, other: np.ndarray, ref: np.ndarray, factor: float) -> float:
    """The largest |got - other| as a fraction of factor (RTOL |ref| + ATOL max|ref|) (> 1: outside)."""
    bound = factor * (RTOL * np.abs(ref) + ATOL * np.abs(ref).max())
    return float(np.max(np.abs(got.astype(np.float64) - other) / np.maximum(bound, np.finfo(np.float64).tiny)))


def compare(ref: Params, impls: dict[str, Params]) -> dict[str, Any]:
    """Every implementation against the float64 reference, and ours against each torch form (twice the bound), per
    array; ok when every worst fraction is <= 1."""
    rows = []
    for name, want in ref.items():
        row: dict[str, Any] = {"array": name}
        for impl, got in impls.items():
            row[f"{impl} vs float64"] = worst(got[name], want, want, 1.0)
            if impl != "ours" and "ours" in impls:
                row[f"ours vs {impl}"] = worst(impls["ours"][name], got[name], want, 2.0)
        rows.append(row)
    ok = all(v <= 1.0 for r in rows for k, v in r.items() if k != "array")
    return {"ok": ok, "arrays": rows}


CASES = (
    ("forward, S windows (the target network's s')", 1, False),
    ("forward, 2S windows (the online network's s and s')", 2, False),
    ("forward 2S + gradients from S (the online network's share of a step)", 2, True),
)
"""(label, windows forward as a multiple of S, gradients from the first S)."""


Timer = Callable[[Callable[[], None]], float]  # ms of one call of its argument


def best_ms(replay: Callable[[], None], timer: Timer, args: argparse.Namespace) -> float:
    """ms per replay: the best of --windows windows of --replays replays, each window timed by `timer` (ms)."""

    def window() -> None:
        for _ in range(args.replays):
            replay()

    return min(timer(window) for _ in range(args.windows)) / args.replays


def wall_ms(run: Callable[[], None], sync: Callable[[], None]) -> float:
    sync()
    t0 = time.perf_counter()
    run()
    sync()
    return (time.perf_counter() - t0) * 1e3


def time_ours(step: Callable[[Any], None], stream: Any, args: argparse.Namespace) -> float:
    """ms per call of `step`, captured in a StepGraph (eager replays, wall clock, under the simulator)."""
    graph = StepGraph("bench_encoders", step, stream, use_graph=True)
    for _ in range(args.warmup):  # the first replay runs eagerly, the second captures
        graph.replay()

    def events(run: Callable[[], None]) -> float:
        start, end = cuda.event(timing=True), cuda.event(timing=True)
        start.record(stream)
        run()
        end.record(stream)
        end.synchronize()
        return cuda.event_elapsed_time(start, end)

    timer = (lambda run: wall_ms(run, stream.synchronize)) if SIMULATOR else events
    return best_ms(graph.replay, timer, args)


def time_torch(fn: Callable[[], Any], args: argparse.Namespace) -> float:
    """ms per call of `fn`, captured in a torch.cuda.CUDAGraph (eager calls, wall clock, on the CPU)."""
    if not torch.cuda.is_available():
        for _ in range(args.warmup):
            fn()
        return best_ms(fn, lambda run: wall_ms(run, lambda: None), args)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(args.warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(args.warmup):
        graph.replay()

    def events(run: Callable[[], None]) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    return best_ms(graph.replay, events, args)


def bench(enc: Encoder, params: Params, args: argparse.Namespace, stager: Stager, stream: Any,
          device: str) -> list[dict[str, Any]]:
    """ms per call of ours and of each torch form in every case (CASES)."""
    s = args.samples
    inputs = make_inputs(enc, args.bars, DAY_BARS, 2 * s, s, args.seed)
    run = TorchRun(enc, params, inputs, device)
    rows = []
    for label, mult, backward in CASES:
        ours = Ours(enc, params, inputs, mult * s, s if backward else 1, backward=backward, stager=stager,
                    stream=stream)
        row: dict[str, Any] = {"case": label, "windows_forward": mult * s, "windows_gradient": s if backward else 0,
                               "ours_ms": time_ours(ours.step, stream, args)}
        for name, form in enc.torch_forms().items():
            call = ((lambda f=form: run.step(f, s)) if backward else (lambda f=form, n=mult * s: run.forward(f, n)))
            row[f"{name} ms"] = time_torch(call, args)
        rows.append(row)
        print(json.dumps({"encoder": enc.name, **row}), flush=True)
    return rows


def encoders(args: argparse.Namespace) -> list[Encoder]:
    """The encoders at the default network config's sizes over --window bars (--tiny: the tests' small shapes)."""
    if args.tiny:
        return [Mamba2Bench(TINY_MAMBA2, args.chunk or TINY_MAMBA2.seq_len // 2), TlobBench(TINY_TLOB)]
    cfg = dataclasses.replace(NetworkConfig(), mamba2_window=args.window)
    mamba2 = encoder_dims(cfg, N_MARKET)
    tlob = tlob_shape(dataclasses.replace(NetworkConfig(), tlob_window=args.window))
    assert mamba2 is not None and tlob is not None  # a window >= 2 turns each on
    return [Mamba2Bench(mamba2, args.chunk or args.window), TlobBench(tlob)]


def check_markdown(name: str, check: dict[str, Any], samples: int) -> list[str]:
    keys = [k for k in check["arrays"][0] if k != "array"]
    lines = ["", f"Check: {2 * samples} windows forward, gradients from the first {samples}; worst |a - b| as a "
             "fraction of its bound (<= 1 passes): "
             f"{'all within' if check['ok'] else 'FAILED'}.", "",
             f"| {name} array | " + " | ".join(keys) + " |", "| --- |" + " ---: |" * len(keys)]
    lines += [f"| {r['array']} | " + " | ".join(f"{r[k]:.3f}" for k in keys) + " |" for r in check["arrays"]]
    return lines


def timing_markdown(rows: list[dict[str, Any]], forms: list[str]) -> list[str]:
    head = "| case | windows forward | windows with gradients | ours ms | " + " | ".join(
        f"{f} ms | {f} time / ours" for f in forms) + " |"
    lines = ["", head, "| --- |" + " ---: |" * (3 + 2 * len(forms))]
    for r in rows:
        cells = " | ".join(f"{r[f + ' ms']:.4f} | {r[f + ' ms'] / r['ours_ms']:.2f}" for f in forms)
        lines.append(f"| {r['case']} | {r['windows_forward']} | {r['windows_gradient']} | {r['ours_ms']:.4f} | "
                     f"{cells} |")
    return lines


def markdown(results: dict[str, Any], args: argparse.Namespace) -> str:
    info, clocks = results["machine"], results["clocks"]
    lines = [*results_header("Window encoders (Mamba2, TLOB) vs PyTorch, fp32", results["command"], info), ""]
    lines.append(
        f"S = {args.samples} (the learner's batch); torch on {info['torch_device']}, fp32, TF32 off. Every call "
        f"gathers its windows from a random source of {args.bars} rows, then runs the encoder. Timing: "
        f"{args.warmup} warm-up replays, then the best of {args.windows} windows of {args.replays} replays; ours: "
        f"{clocks['ours']}; torch: {clocks['torch']}. Ours: kernels/mamba2.py, kernels/tlob.py and the fp32 "
        "dense layers of agent/dense.py. torch SSD: the chunked form (ssd_minimal_discrete); torch scan: a loop "
        "over the bars; torch SDPA: F.scaled_dot_product_attention; torch softmax: the attention written out "
        "(tools/bench_encoders.py's header). Check bound: |a - b| <= "
        f"{RTOL:g} |ref| + {ATOL:g} max|ref| per array against float64, twice that between ours and torch.")
    for entry in results["encoders"]:
        sizes = ", ".join(f"{k} {v}" for k, v in entry["sizes"].items())
        lines += ["", f"## {entry['encoder']} ({sizes})"]
        lines += check_markdown(entry["encoder"], entry["check"], args.check_samples)
        if "timings" in entry:
            lines += timing_markdown(entry["timings"], entry["torch_forms"])
    return "\n".join(lines) + "\n"

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="results path without suffix (.md, .json)")
    parser.add_argument("--samples", type=int, default=8192, help="S: the learner's batch (forward over 2S)")
    parser.add_argument("--window", type=int, default=32, help="T: bars per window of both encoders")
    parser.add_argument("--chunk", type=int, default=0,
                        help="bars per chunk of torch's SSD form (0: the whole window; --tiny: half of it)")
    parser.add_argument("--bars", type=int, default=20000, help="rows of the timed windows' random source")
    parser.add_argument("--check-samples", type=int, default=16, help="S' of the check (forward over 2S')")
    parser.add_argument("--warmup", type=int, default=3, help="replays before timing (>= 2: ours captures on its 2nd)")
    parser.add_argument("--replays", type=int, default=20, help="replays per timed window")
    parser.add_argument("--windows", type=int, default=5, help="timed windows (the best counts)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tiny", action="store_true",
                        help="the tests' small shapes, S = S' = 2, one window of one replay (runs under the simulator)")
    return parser


def parse(argv: list[str] | None) -> tuple[argparse.Namespace, str]:
    """The options (--tiny's sizes applied) and the command line that gave them."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.warmup < 2:
        parser.error("--warmup must be >= 2 (ours captures its graph on the second replay)")
    command = "python3 tools/bench_encoders.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.tiny:
        args.samples, args.check_samples, args.bars = 2, 2, 16
        args.replays, args.windows, args.warmup = 1, 1, 2
    return args, command


def main(argv: list[str] | None = None) -> int:
    args, command = parse(argv)
    if torch is None:
        sys.exit("tools/bench_encoders.py needs torch (its PyTorch side); python3 on the GPU machine has it")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = "cuda" if torch.cuda.is_available() else "cpu"
    info = {"date_utc": datetime.now(UTC).strftime("%Y-%m-%d %H:%M"), **machine(), "torch": torch.__version__,
            "torch_device": device, "torch_tf32": False}
    clocks = {"ours": "wall clock, eager replays (simulator)" if SIMULATOR else "CUDA events, StepGraph replays",
              "torch": "CUDA events, CUDAGraph replays" if device == "cuda" else "wall clock, eager calls (CPU)"}
    settings = {k: getattr(args, k) for k in ("samples", "window", "chunk", "bars", "check_samples", "warmup",
                                              "replays", "windows", "seed", "tiny")}
    results: dict[str, Any] = {"command": command, "machine": info, "settings": settings | {"rtol": RTOL, "atol": ATOL},
                               "clocks": clocks, "encoders": []}
    stream = new_stream()
    stager = Stager(stream, chunk_bytes=16 << 20)
    benches = encoders(args)
    for enc in benches:
        params = enc.params(args.seed)
        c = args.check_samples
        inputs = make_inputs(enc, 8 * enc.seq, 2 * enc.seq, 2 * c, c, args.seed + 1)  # many windows clamp at a day
        impls = {"ours": ours_check(enc, params, inputs, stager, stream)}
        impls |= {name: torch_check(enc, form, params, inputs, device) for name, form in enc.torch_forms().items()}
        results["encoders"].append({"encoder": enc.name, "sizes": enc.sizes, "torch_forms": list(enc.torch_forms()),
                                    "check": compare(reference_check(enc, params, inputs), impls)})
    ok = all(e["check"]["ok"] for e in results["encoders"])
    if ok:
        for enc, entry in zip(benches, results["encoders"], strict=True):
            entry["timings"] = bench(enc, enc.params(args.seed), args, stager, stream, device)
    atomic_write_text(args.out.with_suffix(".json"), json.dumps(results, indent=2) + "\n")
    text = markdown(results, args)
    atomic_write_text(args.out.with_suffix(".md"), text)
    print(text)
    return 0 if ok else 1

if __name__ == "__main__":
    sys.exit(main())
