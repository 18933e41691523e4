"""Benchmark the whole collect step on the GPU: observe -> network forward -> action selection -> env step ->
replay writes -> rollout ISV, in environment steps per second, eager vs captured graph.

    python3 tools/bench_collect.py --out tools/results/bench_collect_h200 [--envs 16384 4096] [--steps 200]
        [--hindsight-fraction 0.25] [--set env.curriculum_epochs=3 ...]

The fold is fold 0 of the embedded default market (built on first use), the network the default preset's
(network.n_layers = 0: obs 134 -> 13 heads x 51 atoms, linear), freshly initialised. For each N: --warmup steps, then
--windows windows of --steps collect steps between CUDA events, graph replays (use_graph) or eager launches;
throughput = N x steps / seconds of the best window. One eager step is also timed per kernel (CUDA events
around each launch, so the eager figures include no host wait). --hindsight-fraction sets env.hindsight_fraction
(the relabel kernel joins the step; kernels/hindsight.py); --set overrides any other setting of the default preset
(env.curriculum_epochs: the environments' starts are drawn from the curriculum's first reach, as the trainer sets it
at a fold's first epoch). Writes OUT.md and OUT.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from numba import cuda

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from bench_device import machine, results_header  # noqa: E402

from fox_numba.agent.fold_market import FoldMarket  # noqa: E402
from fox_numba.agent.trainer import Trainer  # noqa: E402
from fox_numba.config import load_config  # noqa: E402
from fox_numba.device.graphs import StepGraph  # noqa: E402
from fox_numba.device.timing import Timings  # noqa: E402
from fox_numba.io import atomic_write_text  # noqa: E402
from fox_numba.market.select import select_market  # noqa: E402
from fox_numba.walkforward.driver import load_features  # noqa: E402
from fox_numba.walkforward.folds import make_folds  # noqa: E402


def time_steps(graph: StepGraph, stream: Any, args: argparse.Namespace) -> float:
    """Best seconds per step of `graph` over the windows."""
    for _ in range(args.warmup):
        graph.replay()
    stream.synchronize()
    best = float("inf")
    for _ in range(args.windows):
        start, end = cuda.event(timing=True), cuda.event(timing=True)
        start.record(stream)
        for _ in range(args.steps):
            graph.replay()
        end.record(stream)
        end.synchronize()
        best = min(best, cuda.event_elapsed_time(start, end) / 1e3 / args.steps)
    return best


def bench_n(n: int, args: argparse.Namespace) -> dict[str, Any]:
    cfg = load_config("default", overrides=[f"env.n_envs={n}", f"env.hindsight_fraction={args.hindsight_fraction}",
                                            *args.set])  # fmt: skip
    selection = select_market(cfg.market)
    features = load_features(cfg, selection)
    fold = make_folds(cfg.folds, selection.days)[0]
    trainer = Trainer(cfg)
    trainer.bind_fold(FoldMarket.build(features, fold, cfg.features, cfg.env), fold.index)
    collector, stream = trainer.collector, trainer.stream
    trainer.learner.refresh_supports()
    trainer.env.follow_curriculum(trainer.learner.optim_state, cfg.learner.steps_per_epoch, stream=stream)
    trainer.env.reset(stream=stream)
    collector.refresh()
    out: dict[str, Any] = {"n_envs": n, "hindsight_fraction": args.hindsight_fraction, "set": args.set,
                           "relabelled_envs": collector.n_relabel}
    for mode, use_graph in (("eager", False), ("graph", True)):
        graph = StepGraph(f"collect.{mode}", collector._step, stream, use_graph=use_graph)
        seconds = time_steps(graph, stream, args)
        out[mode] = {"us_per_step": seconds * 1e6, "env_steps_per_s": n / seconds, "graph_nodes": graph.graph_nodes}
    timings = Timings()
    with timings.kernels():
        for _ in range(args.kernel_steps):
            collector._step(stream)
    stats = timings.stats()
    out["kernels_us_per_step"] = {k: s.total_ms * 1e3 / args.kernel_steps for k, s in
                                  sorted(stats.items(), key=lambda kv: -kv[1].total_ms)}  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="results path without suffix (.md and .json)")
    parser.add_argument("--envs", type=int, nargs="+", default=[16384, 4096, 1024])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--kernel-steps", type=int, default=20)
    parser.add_argument("--hindsight-fraction", type=float, default=0.0,
                        help="env.hindsight_fraction of the collect step (default 0: relabelling off)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                        help="a config override of the default preset (repeatable)")
    args = parser.parse_args(argv)
    info = {"date_utc": datetime.now(UTC).strftime("%Y-%m-%d %H:%M"), **machine()}
    results = [bench_n(n, args) for n in args.envs]
    command = "python3 tools/bench_collect.py " + " ".join(argv if argv is not None else sys.argv[1:])
    relabel = f" + hindsight relabel of {args.hindsight_fraction:g} of the envs" if args.hindsight_fraction else ""
    settings = f" ({', '.join(args.set)})" if args.set else ""
    title = f"Collect step: forward + action selection{relabel} + env step + replay + rollout ISV{settings}"
    lines = results_header(title, command, info)
    lines += ["", "| N envs | eager us/step | eager env steps/s | graph us/step | graph env steps/s | graph nodes |",
              "| ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in results:
        e, g = r["eager"], r["graph"]
        lines.append(f"| {r['n_envs']} | {e['us_per_step']:.1f} | {e['env_steps_per_s'] / 1e6:.2f} M | "
                     f"{g['us_per_step']:.1f} | {g['env_steps_per_s'] / 1e6:.2f} M | {g['graph_nodes']} |")
    for r in results:
        lines += ["", f"Kernels of one eager step at N = {r['n_envs']} (CUDA events per launch):", "",
                  "| kernel | us |", "| --- | ---: |"]
        lines += [f"| {k} | {us:.1f} |" for k, us in r["kernels_us_per_step"].items()]
    atomic_write_text(args.out.with_suffix(".md"), "\n".join(lines) + "\n")
    atomic_write_text(args.out.with_suffix(".json"),
                      json.dumps({"command": command, "machine": info, "results": results}, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
