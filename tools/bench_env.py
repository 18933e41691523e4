"""Benchmark the environment side of a collect step on the GPU: gather, env step, replay writes, rollout ISV.

    python3 tools/bench_env.py --out tools/results/bench_env_h200 [--envs 16384 4096] [--replays 300]

A fold of random books (18 days of 390 bars, the shape of the default market's folds; tests/reference_env.py
makes them) is uploaded once; for each N the collect step's environment kernels are captured into one
StepGraph (observe -> random actions -> replay put_obs -> env step -> replay put_result + advance -> rollout
ISV: everything of a collect step except the network forward and action selection) and replayed; each
kernel is also captured alone, and so is the learner step's replay part (replay sample + gather of B
transitions + one gather_obs of the 2B rows, s then s', as agent/learner.py runs it). Times are the best of --windows windows of --replays graph replays between
CUDA events, per step. Writes OUT.md and OUT.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from numba import cuda

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "tests"))

from bench_device import machine, results_header  # noqa: E402
from reference_env import Windows, random_feature_set  # noqa: E402

from fox_numba.agent.environment import VecEnv  # noqa: E402
from fox_numba.agent.fold_market import FoldMarket  # noqa: E402
from fox_numba.agent.replay import ReplayBatch, ReplayBuffer  # noqa: E402
from fox_numba.config import EnvConfig, FeatureConfig  # noqa: E402
from fox_numba.device.graphs import StepGraph  # noqa: E402
from fox_numba.device.isv import IsvBus  # noqa: E402
from fox_numba.device.memory import device_empty, device_zeros  # noqa: E402
from fox_numba.device.rng import xoroshiro_states  # noqa: E402
from fox_numba.device.runtime import new_stream  # noqa: E402
from fox_numba.device.staging import Stager  # noqa: E402
from fox_numba.io import atomic_write_text  # noqa: E402
from fox_numba.kernels.env import gather_obs, random_actions  # noqa: E402
from fox_numba.observation import obs_dim  # noqa: E402


def time_graph(name: str, body: Any, stream: Any, args: argparse.Namespace) -> float:
    """Best us per replay of `body` captured as a graph."""
    graph = StepGraph(name, body, stream, use_graph=True)
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
        best = min(best, cuda.event_elapsed_time(start, end) * 1e3 / args.replays)
    return best


def bench_n(n: int, market: Any, env_cfg: EnvConfig, stager: Stager, args: argparse.Namespace) -> dict[str, Any]:
    stream = stager.stream
    bus = IsvBus(stager)
    features = FeatureConfig()
    env = VecEnv(market, env_cfg, features, bus.values, stager=stager, n_envs=n, seed=1)
    replay = ReplayBuffer(args.capacity, stream=stream)
    states = xoroshiro_states(max(n, args.batch), 2, stager)
    actions = device_zeros((n, 4), np.int32, stream=stream)
    obs = device_empty((n, obs_dim(features)), np.float32)
    batch = ReplayBatch(args.batch, stream=stream)
    batch_obs = device_empty((2 * args.batch, obs_dim(features)), np.float32)  # s rows, then s' rows

    def collect(s: Any) -> None:
        env.observe(obs, stream=s)
        random_actions(states, actions, stream=s)
        replay.put_obs(env.row, env.port, actions, env.entry, stream=s)
        env.step(actions, stream=s)
        replay.put_result(env.reward, env.done, env.next_row, env.next_port, stream=s)
        env.rollout_stats(actions, stream=s)

    def learner_gather(s: Any) -> None:  # the learner step's replay part (agent/learner.py)
        replay.sample(states, batch.idx, stream=s)
        replay.gather(batch, stride=n, gamma=0.95, stream=s)
        gather_obs(market.market_obs, batch.rows, batch.port, batch_obs, stream=s)

    parts = {
        "collect step (7 kernels)": collect,
        "observe (gather_obs)": lambda s: env.observe(obs, stream=s),
        "random_actions": lambda s: random_actions(states, actions, stream=s),
        "env_step": lambda s: env.step(actions, stream=s),
        "replay put_obs + put_result + advance": lambda s: (
            replay.put_obs(env.row, env.port, actions, env.entry, stream=s),
            replay.put_result(env.reward, env.done, env.next_row, env.next_port, stream=s),
        ),
        "rollout_isv": lambda s: env.rollout_stats(actions, stream=s),
        f"learner: sample + gather + gather_obs of 2B rows (B = {args.batch})": learner_gather,
    }
    times = {}
    for name, body in parts.items():
        times[name] = time_graph(name, body, stream, args)
    env.reset(stream=stream)
    env.clear_metrics(stream=stream)
    time_graph("metrics", collect, stream, args)
    metrics = env.read_metrics(stream=stream)
    collect_us = times["collect step (7 kernels)"]
    return {
        "n_envs": n,
        "us": times,
        "env_steps_per_s_env_part": n / (collect_us * 1e-6),
        "metrics": {k: metrics[k] for k in ("steps", "episodes", "turnover", "fill_rate", "reward_mean")},
    }


def markdown(command: str, info: dict[str, Any], results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = results_header("Environment kernels of a collect step", command, info)
    lines += [
        "",
        (
            f"Fold: {args.days} days x {args.bars} bars of random books, episodes of {args.episode_bars} bars; "
            f"replay capacity {args.capacity}. Best of {args.windows} windows of {args.replays} graph replays "
            "(us per replay)."
        ),
        "",
    ]
    names = list(results[0]["us"])
    lines.append("| stage | " + " | ".join(f"N = {r['n_envs']}" for r in results) + " |")
    lines.append("| --- | " + " | ".join("---:" for _ in results) + " |")
    for name in names:
        lines.append(f"| {name} | " + " | ".join(f"{r['us'][name]:.1f}" for r in results) + " |")
    lines.append(
        "| env steps/s, environment part only | "
        + " | ".join(f"{r['env_steps_per_s_env_part'] / 1e6:.1f} M" for r in results)
        + " |"
    )
    lines += ["", "Metrics of one window (sanity): " + "; ".join(f"N = {r['n_envs']}: {r['metrics']}" for r in results)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="output path without extension")
    parser.add_argument("--envs", type=int, nargs="+", default=[16384, 4096])
    parser.add_argument("--days", type=int, default=18)
    parser.add_argument("--bars", type=int, default=390)
    parser.add_argument("--episode-bars", type=int, default=240)
    parser.add_argument("--capacity", type=int, default=1 << 20)
    parser.add_argument("--batch", type=int, default=8192)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--replays", type=int, default=300)
    parser.add_argument("--windows", type=int, default=3)
    args = parser.parse_args(argv)
    command = "python3 tools/bench_env.py " + " ".join(argv if argv is not None else sys.argv[1:])
    stream = new_stream()
    stager = Stager(stream)
    fs = random_feature_set(np.random.default_rng(0), [args.bars] * args.days, size_hi=40)
    env_cfg = EnvConfig(episode_bars=args.episode_bars, w_timing=0.1, w_persist=0.1, w_regime=0.1, w_novelty=0.1,
                        w_stable=0.1)  # fmt: skip
    purge = min(30, args.bars // 4)
    host = FoldMarket.build(fs, Windows(0, args.days - 4, args.days - 4, args.days, purge), FeatureConfig(), env_cfg)
    market = host.upload(stager)
    results = [bench_n(n, market, env_cfg, stager, args) for n in args.envs]
    info = {"date_utc": datetime.now(UTC).strftime("%Y-%m-%d %H:%M"), **machine()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out.with_suffix(".md"), markdown(command, info, results, args))
    atomic_write_text(
        args.out.with_suffix(".json"), json.dumps({"command": command, "machine": info, "results": results}, indent=1)
    )
    print(markdown(command, info, results, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
