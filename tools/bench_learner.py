"""Benchmark the learner's gradient step on the GPU: eager vs graph, queued vs fenced, per-kernel times.

    python3 tools/bench_learner.py --out tools/results/bench_learner_h200 [--batch 8192 1024 256] [--obs-dim 182]
    python3 tools/bench_learner.py --out /tmp/bench_learner_sim --tiny     # exercises the script anywhere
    python3 tools/bench_learner.py --out tools/results/bench_learner_per_h200 --priority-alpha 0.5  # prioritised
    python3 tools/bench_learner.py --out tools/results/bench_learner_noisy_h200 --noisy-sigma0 0.5  # NoisyNet heads
    python3 tools/bench_learner.py --out tools/results/bench_learner_iqn_h200 --iqn-quantiles 32  # IQN beside C51
    python3 tools/bench_learner.py --out /tmp/bench_sn --layers 3 --spectral-norm --stochastic-depth 0.2  # trunk parts
    python3 tools/bench_learner.py --out /tmp/bench_vsn --vsn  # the variable-selection gate on the observation
    python3 tools/bench_learner.py --out tools/results/bench_learner_moe4_h200 --moe-experts 4  # MoE heads
    python3 tools/bench_learner.py --out /tmp/bench_mamba2 --mamba2-window 32  # the Mamba2 encoder, 32 bars
    python3 tools/bench_learner.py --out /tmp/bench_tlob --tlob-window 32  # the TLOB encoder, 32 book snapshots
    python3 tools/bench_learner.py --out /tmp/bench_cross --position-cross  # the heads read position x market too
    python3 tools/bench_learner.py --out /tmp/bench_mean --mean-head  # the direction mean head beside C51
    python3 tools/bench_learner.py --out /tmp/bench_mean_cross --mean-cross  # the mean head reads position x market
    python3 tools/bench_learner.py --out /tmp/bench_live --mean-cross --mirror --precision tf32 --live-branches 1  # the
        # default network's step: the head computes the direction branch's columns alone (agent/network.py)
    python3 tools/bench_learner.py --out /tmp/bench_conc --concurrent 8 ...  # 8 learners on 8 streams in one process

One gradient step of the default network (obs_dim -> 256 -> 256 -> 13 dueling C51 heads x 51 atoms,
network.* of the default config), at each batch of --batch (default 8192, then smaller ones where the
host's per-step work matters more), on a synthetic replay (uniform random transitions over a
random market_obs of --bars rows; with --priority-alpha > 0 prioritised replay, every slot starting at the
priority the collector gives a new transition; with --noisy-sigma0 > 0 NoisyNet heads; with --iqn-quantiles > 0
the IQN head beside C51, network.iqn_embed cosine features; with --moe-experts K > 0 mixture-of-experts heads, the
controller's lambda at its base weight). Without --mean-head / --mean-cross the C51 heads act on the directions,
and counterfactual targets are off: the default learner since section 43 of learner_ablation_h200.md prices them
from a fold's book, which the synthetic replay has not (its step is timed inside `fox train`). Measured as:
- eager: every kernel launched from Python each step (RunConfig.graphs = false);
- graph, queued: the step captured once and replayed back to back with no host sync (the learner's
  train_epoch: per-step values live on the device, nothing is written from the host per step);
- graph, fenced: the same replays, each waiting for the previous step to finish before it is queued (the
  former pattern, where the host wrote the step counter and tau into a control block every step and
  ControlBlock.set waited on a fence after each replay);
- epoch graph: --epoch-steps steps captured into one graph, one launch per --epoch-steps steps.
Each mode: --warmup steps, then the best of --windows windows of --steps steps between CUDA events (on the
simulator: the wall clock). Per-kernel: one eager step under device/timing.py's kernel timer after a spin
kernel that keeps the GPU busy while the host queues the step, so each kernel's events bracket its GPU time
only, averaged over --kernel-steps steps; the table lists each kernel's mean ms per step.
Checks: no step skipped, the loss finite, graph and eager steps equal bit for bit on the same start.
Writes OUT.md and OUT.json (the numbers, the command, the machine).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numba
import numpy as np
from numba import cuda

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_device import machine, results_header

from fox_numba.actions import N_BRANCHES
from fox_numba.agent.learner import Learner
from fox_numba.agent.network import ParamLayout
from fox_numba.agent.replay import ReplayBuffer
from fox_numba.config import FeatureConfig, FoxConfig
from fox_numba.device.graphs import StepGraph
from fox_numba.device.isv import Isv, bootstrap_values
from fox_numba.device.launch import launch_rows
from fox_numba.device.registry import register
from fox_numba.device.runtime import SIMULATOR, new_stream, sync_event
from fox_numba.device.staging import Stager
from fox_numba.device.timing import Timings
from fox_numba.features.book import BOOK_FEATURES
from fox_numba.io import atomic_write_text
from fox_numba.kernels.nn import PRECISIONS
from fox_numba.kernels.priority import PRIORITY_START
from fox_numba.observation import N_MARKET, obs_dim

N_PORT = 6
BENCH_DAY_BARS = 390  # the random market's days, where the Mamba2 windows stop (a regular ES session)


@register((numba.float32[::1], numba.int32))
@cuda.jit
def spin(x, n):  # type: ignore[no-untyped-def]
    """One thread runs n dependent multiply-adds (keeps the GPU busy while the host queues a step)."""
    acc = x[0]
    for _ in range(n):
        acc = acc * numba.float32(0.9999999) + numba.float32(1e-7)
    x[0] = acc


def make_learner(args: argparse.Namespace, stager: Stager, stream: Any, graphs: bool) -> tuple[Learner, Any]:
    cfg = FoxConfig()
    if args.tiny:
        cfg.network.hidden, cfg.network.n_layers, cfg.network.n_atoms = 4, 2, 5
    cfg.learner.batch_size = args.batch
    cfg.learner.steps_per_epoch = args.steps
    cfg.learner.n_step = args.n_step
    cfg.learner.priority_alpha = args.priority_alpha
    cfg.network.noisy_sigma0 = args.noisy_sigma0
    cfg.network.iqn_quantiles = args.iqn_quantiles
    cfg.network.spectral_norm, cfg.network.stochastic_depth = args.spectral_norm, args.stochastic_depth
    cfg.network.vsn, cfg.network.moe_experts = args.vsn, args.moe_experts
    cfg.network.mamba2_window, cfg.network.tlob_window = args.mamba2_window, args.tlob_window
    cfg.network.position_cross = args.position_cross
    cfg.network.mean_head = args.mean_head or args.mean_cross
    cfg.network.mean_cross = args.mean_cross
    cfg.network.mirror = args.mirror
    # the synthetic replay has no fold book to price counterfactual targets from (the default learner since
    # section 43 of learner_ablation_h200.md): this step is the one-step C51 step the flags above extend
    cfg.learner.counterfactual = cfg.learner.counterfactual_held = False
    if args.layers is not None:
        cfg.network.n_layers, cfg.network.hidden = args.layers, args.hidden
    cfg.run.precision = args.precision
    cfg.env.n_envs = min(cfg.env.n_envs, args.capacity)
    cfg.run.graphs = graphs
    rng = np.random.default_rng(0)
    cap, bars, m = args.capacity, args.bars, args.obs_dim - N_PORT
    host = {
        "row": rng.integers(0, bars, cap).astype(np.int32),
        "port": rng.standard_normal((cap, N_PORT)).astype(np.float32),
        "action": np.stack([rng.integers(0, 4, cap)] + [rng.integers(0, 3, cap) for _ in range(3)], 1).astype(
            np.int32),
        "reward": (0.2 * rng.standard_normal(cap)).astype(np.float32),
        "done": (rng.random(cap) < 0.01).astype(np.float32),
        "next_row": rng.integers(0, bars, cap).astype(np.int32),
        "next_port": rng.standard_normal((cap, N_PORT)).astype(np.float32),
        "entry": np.zeros(cap),
        "meta": np.array([0, cap], np.int32),
    }
    stride = cfg.env.n_envs  # each transition continues into its environment's next slot (n-step chains)
    host["next_row"][: cap - stride] = host["row"][stride:]
    replay = ReplayBuffer(cap, stream=stream, n_port=N_PORT)
    replay.upload(host, stager)
    market = stager.upload_new(rng.standard_normal((bars, m)).astype(np.float32))
    isv = stager.upload_new(bootstrap_values())
    if args.obs_dim == obs_dim(cfg.features):  # the default observation: its VSN groups and Mamba2 inputs
        layout = ParamLayout.build(args.obs_dim, cfg.network, features=cfg.features, live_branches=args.live_branches)
    else:  # another width (--tiny, --obs-dim): the gate's groups are market | portfolio
        layout = ParamLayout.build(args.obs_dim, cfg.network, vsn_groups=((0, m), (m, args.obs_dim)),
                                   market_features=min(m, N_MARKET), live_branches=args.live_branches)
    aux_target = stager.upload_new(rng.standard_normal(bars).astype(np.float32))
    day_first = stager.upload_new((np.arange(bars) // BENCH_DAY_BARS * BENCH_DAY_BARS).astype(np.int32))
    book_obs = stager.upload_new(rng.standard_normal((bars, BOOK_FEATURES)).astype(np.float32))  # normalised snapshots
    learner = Learner(cfg, layout, replay, market, aux_target, isv=isv, stager=stager, stream=stream, seed=0,
                      day_first=day_first, book_obs=book_obs)  # fmt: skip
    if replay.priorities is not None:  # as collected: every slot at the running max priority
        replay.priorities.upload(np.full(cap, PRIORITY_START), float(PRIORITY_START), stager)
    return learner, isv


def timed_window(run: Callable[[], None], stream: Any, count: int) -> float:
    """ms per step of `run()` (which queues `count` steps), between CUDA events (wall clock on the simulator)."""
    if SIMULATOR:
        stream.synchronize()
        t0 = time.perf_counter()
        run()
        stream.synchronize()
        return (time.perf_counter() - t0) * 1e3 / count
    start, end = cuda.event(timing=True), cuda.event(timing=True)
    start.record(stream)
    run()
    end.record(stream)
    end.synchronize()
    return cuda.event_elapsed_time(start, end) / count


def best_of(run: Callable[[], None], stream: Any, count: int, args: argparse.Namespace) -> float:
    return min(timed_window(run, stream, count) for _ in range(args.windows))


def bench_modes(args: argparse.Namespace) -> dict[str, Any]:
    stream = new_stream()
    stager = Stager(stream, chunk_bytes=16 << 20)
    res: dict[str, Any] = {}

    eager, _ = make_learner(args, stager, stream, graphs=False)
    eager.train_epoch(args.warmup)
    res["eager_ms"] = best_of(lambda: eager.train_epoch(args.steps), stream, args.steps, args)

    learner, isv = make_learner(args, stager, stream, graphs=True)
    learner.train_epoch(args.warmup)  # eager first replay, then the capture
    res["graph_mode"] = learner.graph.mode
    res["graph_nodes"] = learner.graph.graph_nodes or len(learner.graph.launches)
    res["graph_queued_ms"] = best_of(lambda: learner.train_epoch(args.steps), stream, args.steps, args)
    stream.synchronize()
    t0 = time.perf_counter()
    learner.train_epoch(args.steps)  # the host's share: queue the epoch, then it is free until the read
    res["host_queue_ms"] = (time.perf_counter() - t0) * 1e3 / args.steps
    stream.synchronize()

    fence = sync_event()

    def fenced() -> None:
        for _ in range(args.steps):
            learner.graph.replay()
            fence.record(stream)
            fence.synchronize()  # the host waits for the step before it may queue the next

    res["graph_fenced_ms"] = best_of(fenced, stream, args.steps, args)

    k = args.epoch_steps
    epoch = StepGraph("learner.epoch", lambda s: [learner._step(s) for _ in range(k)], stream, use_graph=True)
    epoch.replay()
    epoch.replay()
    res["epoch_graph_steps"] = k
    res["epoch_graph_ms"] = best_of(lambda: [epoch.replay() for _ in range(max(1, args.steps // k))], stream,
                                    k * max(1, args.steps // k), args)
    stream.synchronize()
    stats = learner.epoch_stats()
    res["steps_run"] = stats["steps"]
    res["skipped_steps"] = stats["skipped_steps"]
    res["loss"] = stats["loss"]
    res["grad_norm"] = stats["grad_norm"]
    res["nonfinite_steps_isv"] = float(stager.download(isv)[Isv.NONFINITE_STEPS])
    res["param_count"] = learner.layout.size
    res["gemm_path"] = learner.online.dense

    # graph vs eager on the same start: identical parameters after the same steps
    a, _ = make_learner(args, stager, stream, graphs=True)
    b, _ = make_learner(args, stager, stream, graphs=False)
    a.train_epoch(3)
    b.train_epoch(3)
    res["graph_equals_eager_bitwise"] = bool(
        np.array_equal(stager.download(a.params).view(np.uint32), stager.download(b.params).view(np.uint32))
    )
    return res


def bench_concurrent(args: argparse.Namespace) -> dict[str, Any]:
    """--concurrent N learners in one process, each with its own stream, replay and captured step graph, their
    steps queued round-robin a step at a time (no host sync): whether the GPU overlaps independent runs' kernels,
    as separate processes do not (issue 26 item 3; many_runs_meanx_h100.md). Wall clock around the queued
    rounds, every stream synchronised before and after: ms per round of N steps (one step of each learner)."""
    streams = [new_stream() for _ in range(args.concurrent)]
    learners = []
    for stream in streams:
        learner, _ = make_learner(args, Stager(stream, chunk_bytes=16 << 20), stream, graphs=True)
        learner.train_epoch(args.warmup)  # eager first replay, then the capture
        learners.append(learner)

    def window() -> float:
        for stream in streams:
            stream.synchronize()
        t0 = time.perf_counter()
        for _ in range(args.steps):
            for learner in learners:
                learner.graph.replay()
        for stream in streams:
            stream.synchronize()
        return (time.perf_counter() - t0) * 1e3 / args.steps

    skipped = 0.0
    ms = min(window() for _ in range(args.windows))
    for learner in learners:
        skipped += learner.epoch_stats()["skipped_steps"]
    return {"runs": args.concurrent, "ms_per_round": ms, "skipped_steps": skipped}


def bench_kernels(args: argparse.Namespace) -> dict[str, Any]:
    """Mean GPU ms per step of each kernel of an eager step, queued behind a spin kernel, the step's side streams
    run in line."""
    stream = new_stream()
    stager = Stager(stream, chunk_bytes=16 << 20)
    learner, _ = make_learner(args, stager, stream, graphs=False)
    learner.train_epoch(2)
    busy = stager.upload_new(np.ones(1, np.float32))
    timings = Timings(by_grid=True)
    for _ in range(args.kernel_steps):
        if not SIMULATOR:
            launch_rows(spin, 1, 1, busy, np.int32(args.spin), stream=stream)
        with timings.kernels():  # the step body outside its graph's trace: side-stream work runs in line
            learner.graph.body(stream)  # (device/fork.py), so each kernel is timed alone
        stream.synchronize()
    by_grid = sorted(timings.stats().items(), key=lambda kv: -kv[1].total_ms)
    per_name: dict[str, list[float]] = {}  # kernel -> [launches, total ms] over its grids
    for name, stat in by_grid:
        acc = per_name.setdefault(name.rsplit(" ", 1)[0], [0.0, 0.0])
        acc[0], acc[1] = acc[0] + stat.count, acc[1] + stat.total_ms

    def row(name: str, count: float, total_ms: float) -> dict[str, Any]:
        return {"kernel": name, "launches_per_step": count / args.kernel_steps,
                "ms_per_step": total_ms / args.kernel_steps, "ms_per_launch": total_ms / count}

    rows = sorted((row(name, *acc) for name, acc in per_name.items()), key=lambda r: -r["ms_per_step"])
    grids = [row(name, stat.count, stat.total_ms) for name, stat in by_grid]
    return {"kernels": rows, "launch_shapes": grids, "sum_ms_per_step": sum(r["ms_per_step"] for r in rows),
            "clock": "CUDA events" if timings.use_events else "wall clock (simulator)"}


def markdown_batch(modes: dict[str, Any], kernels: dict[str, Any], args: argparse.Namespace) -> list[str]:
    lines = ["", f"## Batch {args.batch}"]
    shape = ("tiny network (--tiny)" if args.tiny else f"{args.layers} x {args.hidden} trunk" if args.layers
             else "default network")
    intro = (
        f"One gradient step, batch {args.batch}, obs_dim {args.obs_dim}, {shape}: {modes['param_count']} "
        f"parameters; dense layers: {modes['gemm_path']} kernels; learner.n_step {args.n_step}, learner.priority_alpha "
        f"{args.priority_alpha} ({'prioritised' if args.priority_alpha > 0 else 'uniform'} replay), "
        f"network.noisy_sigma0 {args.noisy_sigma0} ({'NoisyNet' if args.noisy_sigma0 > 0 else 'plain'} heads), "
        f"network.iqn_quantiles {args.iqn_quantiles} "
        f"({'an IQN head beside C51' if args.iqn_quantiles > 0 else 'no IQN head'}), "
        f"network.spectral_norm {args.spectral_norm}, network.stochastic_depth {args.stochastic_depth}, "
        f"network.vsn {args.vsn}, network.moe_experts {args.moe_experts}, network.mamba2_window "
        f"{args.mamba2_window}, network.tlob_window {args.tlob_window}, network.position_cross "
        f"{args.position_cross}, network.mean_head {args.mean_head or args.mean_cross}, network.mean_cross "
        f"{args.mean_cross}, network.mirror {args.mirror}, live branches {args.live_branches} (4: every head column "
        "computed; 1: the direction branch's alone). "
        f"Replay of {args.capacity} random transitions "
        f"over {args.bars} market rows. Best of {args.windows} windows of {args.steps} steps after "
        f"{args.warmup} warm-up steps."
    )
    graph_row = (
        f"| graph ({modes['graph_mode']}, {modes['graph_nodes']} nodes), replays queued back to back "
        f"| {modes['graph_queued_ms']:.3f} |"
    )
    fenced_row = (
        "| graph, each replay waiting for the previous step (the former per-step host write + fence) "
        f"| {modes['graph_fenced_ms']:.3f} |"
    )
    host = (
        f"Host time to queue one step of an epoch (train_epoch, no sync): {modes['host_queue_ms']:.4f} ms, "
        f"so the host is free for {max(modes['graph_queued_ms'] - modes['host_queue_ms'], 0.0):.3f} ms of "
        "each step's GPU time instead of waiting on a fence; the fenced replays also leave the GPU idle between "
        f"steps: {1e3 * (modes['graph_fenced_ms'] - modes['graph_queued_ms']):.1f} us per step here."
    )
    target = (
        "Target: at most 3 ms per graphed step; a CUDA-graphed PyTorch fp32 version of the same step (no TF32) "
        "takes about 2.2 ms on an H200 (not measured here)."
    )
    checks = (
        f"Checks: {modes['steps_run']:.0f} steps counted, {modes['skipped_steps']:.0f} skipped (ISV "
        f"NONFINITE_STEPS {modes['nonfinite_steps_isv']:.0f}); mean loss {modes['loss']:.4f}, mean gradient "
        f"norm {modes['grad_norm']:.4f}; graph and eager parameters equal bit for bit after 3 steps: "
        f"{modes['graph_equals_eager_bitwise']}."
    )
    per_kernel = (
        f"### Per kernel, batch {args.batch} ({kernels['clock']}; an eager step queued behind a spin kernel, its "
        f"side streams in line, mean of {args.kernel_steps} steps)"
    )
    lines += [
        "",
        intro,
        "",
        "| mode | ms per step |",
        "| --- | ---: |",
        f"| eager (every kernel launched from Python) | {modes['eager_ms']:.3f} |",
        graph_row,
        fenced_row,
        f"| one graph of {modes['epoch_graph_steps']} steps | {modes['epoch_graph_ms']:.3f} |",
        "",
        host,
        target,
        checks,
        "",
        per_kernel,
        "",
        "| kernel | launches per step | ms per step | ms per launch |",
        "| --- | ---: | ---: | ---: |",
    ]
    for r in kernels["kernels"]:
        lines.append(f"| {r['kernel']} | {r['launches_per_step']:g} | {r['ms_per_step']:.4f} | {r['ms_per_launch']:.4f} |")
    lines += [f"| sum | | {kernels['sum_ms_per_step']:.4f} | |", "",
              "The same launches by grid (a kernel launched on several shapes, such as the GEMMs of different layers, "
              "gets a row per grid):", "", "| kernel | grid | launches per step | ms per step | ms per launch |",
              "| --- | --- | ---: | ---: | ---: |"]
    for r in kernels["launch_shapes"]:
        name, grid = r["kernel"].rsplit(" ", 1)
        lines.append(f"| {name} | {grid} | {r['launches_per_step']:g} | {r['ms_per_step']:.4f} | "
                     f"{r['ms_per_launch']:.4f} |")
    lines.append("")
    return lines


def build_parser() -> argparse.ArgumentParser:
    """The command line (also how tests build the options of a measured step)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="results path without suffix (.md, .json)")
    parser.add_argument("--batch", type=int, nargs="+", default=[8192], help="batch sizes, one section each")
    parser.add_argument("--obs-dim", type=int, default=obs_dim(FeatureConfig()),
                        help="observation width (market + 6 portfolio columns; default: the default observation's)")
    parser.add_argument("--capacity", type=int, default=1 << 18, help="replay transitions")
    parser.add_argument("--bars", type=int, default=20000, help="rows of market_obs")
    parser.add_argument("--steps", type=int, default=200, help="steps per timed window")
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--epoch-steps", type=int, default=10, help="steps captured into the one-graph mode")
    parser.add_argument("--kernel-steps", type=int, default=10, help="steps of the per-kernel timing")
    parser.add_argument("--spin", type=int, default=5_000_000, help="iterations of the spin kernel (~10 ms on an H200)")
    parser.add_argument("--tiny", action="store_true", help="a tiny size that runs under the simulator")
    parser.add_argument("--n-step", type=int, default=1, help="learner.n_step of the measured step")
    parser.add_argument("--priority-alpha", type=float, default=0.0,
                        help="learner.priority_alpha of the measured step (0: uniform replay)")
    parser.add_argument("--noisy-sigma0", type=float, default=0.0,
                        help="network.noisy_sigma0 of the measured step (0: no NoisyNet heads)")
    parser.add_argument("--iqn-quantiles", type=int, default=0,
                        help="network.iqn_quantiles of the measured step (0: no IQN head)")
    parser.add_argument("--spectral-norm", action="store_true", help="network.spectral_norm (needs a trunk)")
    parser.add_argument("--stochastic-depth", type=float, default=0.0,
                        help="network.stochastic_depth (0: off; needs >= 2 trunk layers)")
    parser.add_argument("--vsn", action="store_true", help="network.vsn (the variable-selection gate)")
    parser.add_argument("--moe-experts", type=int, default=0,
                        help="network.moe_experts of the measured step (0: one head; else 2 .. 8 experts)")
    parser.add_argument("--mamba2-window", type=int, default=0,
                        help="network.mamba2_window: the Mamba2 encoder over the last T bars (0: off)")
    parser.add_argument("--tlob-window", type=int, default=0,
                        help="network.tlob_window: the TLOB encoder over the last T book snapshots (0: off)")
    parser.add_argument("--position-cross", action="store_true",
                        help="network.position_cross: the first layer also reads the position x the market columns")
    parser.add_argument("--mean-head", action="store_true",
                        help="network.mean_head: the direction mean head's squared error beside the C51 loss")
    parser.add_argument("--mean-cross", action="store_true",
                        help="network.mean_cross (with mean_head): the mean head alone reads position x market")
    parser.add_argument("--mirror", action="store_true",
                        help="network.mirror (with --mean-cross): the mean head's projection after each step")
    parser.add_argument("--live-branches", type=int, default=N_BRANCHES,
                        help="the head's live branches (agent/network.py): 1 computes the direction branch's columns "
                             "alone, as the default counterfactual learner's network does (default: all 4)")
    parser.add_argument("--layers", type=int, default=None, help="network.n_layers (default: the config's)")
    parser.add_argument("--hidden", type=int, default=256, help="network.hidden with --layers")
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32", help="run.precision of the dense layers")
    parser.add_argument("--concurrent", type=int, default=0,
                        help="also time N learners in one process on N streams, their graphed steps queued "
                             "round-robin (0: off; bench_concurrent)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    command = "python3 tools/bench_learner.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.tiny:
        args.batch = [min(b, 4) for b in args.batch]
        args.obs_dim, args.capacity, args.bars = min(args.obs_dim, 10), 64, 16
        args.steps, args.windows, args.warmup = 1, 1, 1
        args.epoch_steps, args.kernel_steps = 1, 1
    if args.obs_dim <= N_PORT:
        parser.error(f"--obs-dim must exceed the {N_PORT} portfolio columns")
    info = {"date_utc": datetime.now(UTC).strftime("%Y-%m-%d %H:%M"), **machine()}
    results: dict[str, Any] = {"command": command, "machine": info, "batches": []}
    lines = results_header("Learner gradient step", command, info)
    ok = True
    for batch in args.batch:
        one = argparse.Namespace(**{**vars(args), "batch": batch})
        modes = bench_modes(one)
        print(json.dumps(modes), flush=True)
        kernels = bench_kernels(one)
        concurrent = bench_concurrent(one) if args.concurrent > 0 else None
        results["batches"].append({"batch": batch, "modes": modes, "per_kernel": kernels, "concurrent": concurrent})
        lines += markdown_batch(modes, kernels, one)
        if concurrent is not None:
            n, ms = concurrent["runs"], concurrent["ms_per_round"]
            lines += ["", f"{n} learners in one process, each on its own stream, their graphed steps queued "
                      f"round-robin: {ms:.3f} ms per round of {n} steps, {ms / modes['graph_queued_ms']:.2f} x one "
                      f"learner's step alone ({n:.0f} would be no overlap at all); steps skipped "
                      f"{concurrent['skipped_steps']:.0f}.", ""]
            ok = ok and concurrent["skipped_steps"] == 0
        ok = ok and modes["skipped_steps"] == 0 and bool(np.isfinite(modes["loss"])) and modes[
            "graph_equals_eager_bitwise"]
    atomic_write_text(args.out.with_suffix(".json"), json.dumps(results, indent=2) + "\n")
    text = "\n".join(lines)
    atomic_write_text(args.out.with_suffix(".md"), text)
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
