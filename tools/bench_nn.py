"""Benchmark the dense-layer kernels against cuBLAS fp32 (torch.matmul, TF32 off) on the GPU.

    python3 tools/bench_nn.py --out tools/results/bench_nn_h200 [--batch 8192 1024] [--sweep]
    python3 tools/bench_nn.py --out tools/results/bench_nn_tf32_h200 --precision tf32 [--shapes 134x868 ...]

--precision tf32 (bf16) times the tensor-core kernels (kernels/gemm_tensor.py) against cuBLAS with TF32 on (against
cuBLAS's bf16 GEMM on bf16 copies of the operands), and checks them with tests/kernels/test_gemm_tensor.py's bound
(gemm_tensor.product_error per product, 2^-10 for TF32 and 2^-7 for bf16, on top of the fp32 accumulation's).

For each batch B (default 8192) and each (K, N): forward (y = relu(x @ w + b), bias and ReLU fused), backward to the
input (dx = (dy @ w.T) * (a > 0), mask fused) and backward to the weights (dw = x.T @ dy with db fused:
split-batch GEMM + the deterministic reduction, both kernels timed). cuBLAS runs the bare GEMM of each
(torch.matmul into a preallocated output; no bias, ReLU, mask or db). TFLOP/s count 2*B*K*N per op.

Timing: each op is captured --reps times into one CUDA graph (StepGraph for ours, torch.cuda.CUDAGraph
for cuBLAS), so host launch cost is not measured; after --warmup replays, --windows windows each time
--replays replays between two CUDA events; ms per op is the best window's mean. Every result is
checked against float64 (torch on the GPU) with the tolerance of tests/kernels/test_nn_kernels.py, and
every op is run twice and compared bit for bit. --sweep also times each op with every kernel
configuration forced and the weight gradient at several split lengths.

Writes OUT.md and OUT.json (the numbers, the command, the machine).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from numba import cuda

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_device import machine, results_header

from fox_numba.device.graphs import StepGraph
from fox_numba.device.runtime import new_stream
from fox_numba.io import atomic_write_text
from fox_numba.kernels.gemm import BK, CONFIGS
from fox_numba.kernels.gemm_tensor import product_error
from fox_numba.kernels.nn import (
    PRECISIONS,
    TENSOR,
    LinearWeightGrad,
    linear_backward_input,
    linear_forward,
    pick_config,
    pick_tensor,
)

SHAPES = [(32, 256), (256, 256), (512, 512), (256, 64)]
CUBLAS = {"fp32": "torch.matmul fp32 with TF32 off", "tf32": "torch.matmul fp32 with TF32 on",
          "bf16": "torch.matmul on bf16 copies of the operands into bf16 outputs"}
U = 2.0**-24


def gamma(n: int) -> float:
    return (n + 1) * U / (1 - (n + 1) * U)


def time_numba(body: Callable[[Any], None], reps: int, args: argparse.Namespace) -> float:
    """ms per op of `body` (one op) captured `reps` times into a graph."""
    stream = new_stream()

    def step(s: Any) -> None:
        for _ in range(reps):
            body(s)

    graph = StepGraph("bench", step, stream, use_graph=True)
    for _ in range(args.warmup):
        graph.replay()
    stream.synchronize()
    best = float("inf")
    for _ in range(args.windows):
        start, end = cuda.event(timing=True), cuda.event(timing=True)
        start.record(stream)
        for _ in range(args.replays):
            graph.replay()
        end.record(stream)
        end.synchronize()
        best = min(best, cuda.event_elapsed_time(start, end) / (args.replays * reps))
    return best


def time_torch(fn: Callable[[], None], reps: int, args: argparse.Namespace) -> float:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    for _ in range(args.warmup):
        graph.replay()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(args.windows):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(args.replays):
            graph.replay()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / (args.replays * reps))
    return best


def nb(t: torch.Tensor) -> Any:
    """A numba device view of a torch tensor (no copy)."""
    return cuda.as_cuda_array(t.detach())


def within(got: torch.Tensor, ref: torch.Tensor, bound: torch.Tensor) -> dict[str, Any]:
    """Every element inside the tolerance; the worst error as a fraction of its bound."""
    err = (got.double() - ref).abs()
    return {"ok": bool((err <= bound).all()), "worst_err_over_bound": float((err / bound).max())}


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(torch.equal(a.view(torch.int32), b.view(torch.int32)))


def tflops(flops: float, ms: float) -> float:
    return flops / (ms * 1e-3) / 1e12


def bench_shape(batch: int, k: int, n: int, args: argparse.Namespace) -> dict[str, Any]:
    gen = torch.Generator(device="cuda").manual_seed(1000 * k + n)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", generator=gen, dtype=torch.float32)

    x, w, b, dy = randn(batch, k), randn(k, n), randn(n), randn(batch, n)
    act = torch.relu(randn(batch, k))
    y, dx, dw, db = (torch.empty(*s, device="cuda") for s in ((batch, n), (batch, k), (k, n), (n,)))
    y2, dx2, dw2, db2 = (torch.empty_like(t) for t in (y, dx, dw, db))
    theirs = torch.bfloat16 if args.precision == "bf16" else torch.float32  # cuBLAS's operands and outputs
    xt, wt, dyt = (t.to(theirs) for t in (x, w, dy))
    yt, dxt, dwt = (t.to(theirs) for t in (y2, dx2, dw2))
    torch.cuda.synchronize()
    x_, w_, b_, dy_, act_ = (nb(t) for t in (x, w, b, dy, act))
    flops = 2.0 * batch * k * n
    precision = args.precision
    grads = LinearWeightGrad(batch, k, n, precision=precision)
    res: dict[str, Any] = {"B": batch, "K": k, "N": n, "gflop": flops / 1e9}

    def fwd(out: torch.Tensor, config: str | None = None) -> Callable[[Any], None]:
        o = nb(out)
        return lambda s: linear_forward(x_, w_, b_, o, relu=True, stream=s, config=config, precision=precision)

    def bwd(out: torch.Tensor, config: str | None = None) -> Callable[[Any], None]:
        o = nb(out)
        return lambda s: linear_backward_input(dy_, w_, o, act=act_, stream=s, config=config, precision=precision)

    def wgrad(out_w: torch.Tensor, out_b: torch.Tensor, g: LinearWeightGrad = grads) -> Callable[[Any], None]:
        ow, ob = nb(out_w), nb(out_b)
        return lambda s: g(x_, dy_, ow, ob, stream=s)

    ops = {
        "forward": (fwd(y), fwd(y2), lambda: torch.matmul(xt, wt, out=yt), pick_tensor(precision, batch, n) if
                    precision != "fp32" else pick_config(batch, n, k)),
        "backward_input": (bwd(dx), bwd(dx2), lambda: torch.matmul(dyt, wt.T, out=dxt), pick_tensor(precision,
                           batch, k) if precision != "fp32" else pick_config(batch, k, n)),
        "backward_weight": (
            wgrad(dw, db),
            wgrad(dw2, db2),
            lambda: torch.matmul(xt.T, dyt, out=dwt),
            grads.gemm.config.name,
        ),
    }
    for name, (ours, again, theirs, config) in ops.items():
        ms = time_numba(ours, args.reps, args)
        ms_cublas = time_torch(theirs, args.reps, args)
        res[name] = {
            "ms": ms,
            "tflops": tflops(flops, ms),
            "config": config,
            "cublas_ms": ms_cublas,
            "cublas_tflops": tflops(flops, ms_cublas),
            "cublas_over_ours": ms_cublas / ms,
        }
        stream = new_stream()
        again(stream)  # one more run into the second outputs, for the bitwise comparison
        stream.synchronize()
    res["backward_weight"]["splits"] = grads.splits
    res["backward_weight"]["chunk"] = grads.chunk

    x64, w64, dy64 = x.double(), w.double(), dy.double()
    product = product_error(precision)
    res["forward"]["check"] = within(
        y, torch.relu(x64 @ w64 + b.double()), (gamma(k + 1) + product) * (x64.abs() @ w64.abs() + b.double().abs())
    )
    res["backward_input"]["check"] = within(
        dx, (dy64 @ w64.T) * (act > 0), (gamma(n) + product) * (dy64.abs() @ w64.abs().T)
    )
    g = gamma(batch + grads.splits)
    check_w = within(dw, x64.T @ dy64, (g + product) * (x64.abs().T @ dy64.abs()))
    check_b = within(db, dy64.sum(0), g * dy64.abs().sum(0))
    res["backward_weight"]["check"] = {
        "ok": check_w["ok"] and check_b["ok"],
        "worst_err_over_bound": max(check_w["worst_err_over_bound"], check_b["worst_err_over_bound"]),
    }
    res["forward"]["bitwise_repeatable"] = bits_equal(y, y2)
    res["backward_input"]["bitwise_repeatable"] = bits_equal(dx, dx2)
    res["backward_weight"]["bitwise_repeatable"] = bits_equal(dw, dw2) and bits_equal(db, db2)

    if args.sweep:
        sweep: dict[str, float] = {}
        same_bits = True  # every configuration gives the default's bits (forward, backward-input)
        built = CONFIGS if precision == "fp32" else [c for c, g in TENSOR.items() if g.config.precision == precision]
        for config in built:
            sweep[f"forward_{config}_ms"] = time_numba(fwd(y2, config), args.reps, args)
            sweep[f"backward_input_{config}_ms"] = time_numba(bwd(dx2, config), args.reps, args)
            same_bits = same_bits and bits_equal(y, y2) and bits_equal(dx, dx2)
            g_c = LinearWeightGrad(batch, k, n, config=config)
            sweep[f"backward_weight_{config}_splits{g_c.splits}_ms"] = time_numba(wgrad(dw2, db2, g_c), args.reps, args)
        for chunk in (8 * BK, 32 * BK, 64 * BK, 128 * BK):
            g_c = LinearWeightGrad(batch, k, n, chunk=chunk, precision=precision)
            sweep[f"backward_weight_chunk{chunk}_splits{g_c.splits}_ms"] = time_numba(
                wgrad(dw2, db2, g_c), args.reps, args
            )
        res["sweep_ms"] = sweep
        res["configs_same_bits"] = same_bits
    return res


def markdown(command: str, info: dict[str, Any], shapes: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        *results_header(f"Dense-layer kernels vs cuBLAS ({args.precision})", command, info),
        "",
        (
            f"B in {args.batch}; each op captured {args.reps} times in one CUDA graph; {args.warmup} warm-up "
            f"replays, then the best of {args.windows} windows of {args.replays} replays between CUDA events. "
            f"Our kernels' precision: {args.precision}. "
            f"cuBLAS: {CUBLAS[args.precision]}, the bare GEMM (ours also adds bias + ReLU, the ReLU mask, "
            "or db and the split reduction). TFLOP/s = 2*B*K*N / time."
        ),
        "",
        (
            "| op | B | K | N | ours ms | ours TFLOP/s | config | cuBLAS ms | cuBLAS TFLOP/s | cuBLAS time / ours | "
            "check | repeatable |"
        ),
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for r in shapes:
        for op in ("forward", "backward_input", "backward_weight"):
            o = r[op]
            config = o["config"] + (f", {o['splits']} splits" if op == "backward_weight" else "")
            lines.append(
                f"| {op} | {r['B']} | {r['K']} | {r['N']} | {o['ms']:.4f} | {o['tflops']:.1f} | {config} | {o['cublas_ms']:.4f} | "
                f"{o['cublas_tflops']:.1f} | {o['cublas_over_ours']:.2f} | "
                f"{'ok' if o['check']['ok'] else 'FAILED'} ({o['check']['worst_err_over_bound']:.3f} of bound) | "
                f"{o['bitwise_repeatable']} |"
            )
    lines += [
        "",
        (
            "check: every element within gamma(n) * (|A| @ |B|) of the float64 result (the tests' tolerance; with "
            "tf32 or bf16, (gamma(n) + product_error) * (|A| @ |B|), product_error = 2u + u^2: 2^-10 + 2^-22 for "
            "tf32, 2^-7 + 2^-16 for bf16); "
            "the number is the worst error as a fraction of its bound. repeatable: a second run gave identical bits."
        ),
        "",
    ]
    if args.sweep:
        lines += ["## Sweep (ms per op)", "", "| B | K | N | variant | ms |", "| ---: | ---: | ---: | --- | ---: |"]
        for r in shapes:
            shape = f"| {r['B']} | {r['K']} | {r['N']} |"
            lines += [f"{shape} {name} | {ms:.4f} |" for name, ms in r["sweep_ms"].items()]
            lines.append(f"{shape} every configuration gave the default's bits | {r['configs_same_bits']} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="results path without suffix (.md, .json)")
    parser.add_argument("--batch", type=int, nargs="+", default=[8192], help="batch sizes B")
    parser.add_argument("--reps", type=int, default=20, help="ops captured per graph")
    parser.add_argument("--warmup", type=int, default=3, help="graph replays before timing")
    parser.add_argument("--replays", type=int, default=10, help="graph replays per timed window")
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--sweep", action="store_true",
                        help="also time every configuration of the precision and several split lengths")
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32",
                        help="our kernels' precision; tf32 also lets cuBLAS use TF32, bf16 times cuBLAS's bf16 GEMM")
    parser.add_argument("--shapes", nargs="+", default=None, metavar="KxN",
                        help=f"layer shapes (in x out) instead of {' '.join(f'{k}x{n}' for k, n in SHAPES)}")
    args = parser.parse_args(argv)
    command = "python3 tools/bench_nn.py " + " ".join(argv if argv is not None else sys.argv[1:])
    torch.backends.cuda.matmul.allow_tf32 = args.precision == "tf32"
    torch.backends.cudnn.allow_tf32 = args.precision == "tf32"

    info = {
        "date_utc": datetime.now(UTC).strftime("%Y-%m-%d %H:%M"),
        **machine(),
        "torch": torch.__version__,
        "cublas_tf32": torch.backends.cuda.matmul.allow_tf32,
    }
    shapes = []
    layer_shapes = [tuple(int(d) for d in s.split("x")) for s in args.shapes] if args.shapes else SHAPES
    for k, n in layer_shapes:
        for batch in args.batch:
            shapes.append(bench_shape(batch, k, n, args))
        print(json.dumps(shapes[-1]), flush=True)
    results = {"command": command, "machine": info, "shapes": shapes}
    atomic_write_text(args.out.with_suffix(".json"), json.dumps(results, indent=2) + "\n")
    text = markdown(command, info, shapes, args)
    atomic_write_text(args.out.with_suffix(".md"), text)
    print(text)
    ok = all(
        r[op]["check"]["ok"] and r[op]["bitwise_repeatable"]
        for r in shapes
        for op in ("forward", "backward_input", "backward_weight")
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
