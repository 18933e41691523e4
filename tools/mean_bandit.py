"""A skewed bandit with a known answer: does the direction mean head rank what C51's E[Q] misranks? (CPU)

    NUMBA_ENABLE_CUDASIM=1 python3 tools/mean_bandit.py --seeds 0 1 2 3 4 --out tools/results/mean_bandit_cpu

One state, every transition terminal (a bandit), 16 of them in the replay, equally often drawn: Long pays --high
(+4.0) once in four and -0.4 otherwise (mean +0.7 at the default, a rare large gain), Short pays +0.1 always, Hold
and Flat -0.2 always. The answer is Long. A C51 head on a fixed support [-1, 1] (network.support_max_scale = 1)
projects Long's +4.0 onto +1.0, so its E[Q] of Long tends to 0.25 - 0.3 = -0.05, below Short's +0.1: it ranks Short
first. The mean head (network.mean_head) regresses the rewards themselves and should rank Long first. The real
learner runs (a linear network on one constant feature, 11 atoms, batch 8, learner.lr --lr (0.03) to 0.05 of it,
--steps steps), then the trained network's C51 E[Q] and mean-head values of the four directions are read at the
state; per seed the table gives both and which direction each ranks first.

What it shows and what it does not: the C51 estimate of a mean is biased where the return falls outside the support,
and a squared error is not. The agent's support is adaptive (up to network.support_max_scale = 10 times the base),
so on its markets only returns beyond that scale are clipped; the bandit isolates the estimator, not the market.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fox_numba.actions import N_DIRECTIONS, N_HEADS, Direction  # noqa: E402
from fox_numba.agent.learner import Learner  # noqa: E402
from fox_numba.agent.mean_head import MeanActor  # noqa: E402
from fox_numba.agent.network import Network, ParamLayout  # noqa: E402
from fox_numba.agent.replay import ReplayBuffer  # noqa: E402
from fox_numba.config import FoxConfig  # noqa: E402
from fox_numba.device.isv import bootstrap_values  # noqa: E402
from fox_numba.device.staging import Stager  # noqa: E402
from fox_numba.io import atomic_write_text  # noqa: E402
from fox_numba.kernels.distributional import expected_q  # noqa: E402
from fox_numba.kernels.heads import base_support  # noqa: E402

ATOMS = 11
HIGH = 4.0
"""Long's rare reward (--high)."""


def bandit_rewards(high: float = HIGH) -> dict[Direction, list[float]]:
    """The replay's transitions, four per direction: their rewards, Long's rare one `high`."""
    return {Direction.LONG: [high, -0.4, -0.4, -0.4], Direction.SHORT: [0.1] * 4, Direction.HOLD: [-0.2] * 4,
            Direction.FLAT: [-0.2] * 4}


def bandit_replay(high: float = HIGH) -> dict[str, np.ndarray]:
    """The host arrays of the bandit's replay (ReplayBuffer.upload's keys)."""
    table = bandit_rewards(high)
    directions = [int(d) for d, r in table.items() for _ in r]
    rewards = [x for r in table.values() for x in r]
    c = len(directions)
    actions = np.zeros((c, 4), np.int32)
    actions[:, 0] = directions
    return {"row": np.zeros(c, np.int32), "port": np.zeros((c, 1), np.float32), "action": actions,
            "reward": np.array(rewards, np.float32), "done": np.ones(c, np.float32),
            "next_row": np.zeros(c, np.int32), "next_port": np.zeros((c, 1), np.float32), "entry": np.zeros(c),
            "meta": np.array([0, c], np.int32)}


def bandit_config(steps: int, lr: float) -> FoxConfig:
    cfg = FoxConfig()
    cfg.network.n_layers, cfg.network.n_atoms, cfg.network.mean_head = 0, ATOMS, True
    cfg.network.mean_cross = cfg.network.mirror = False  # a bandit: no portfolio columns to cross, no mirror
    cfg.learner.counterfactual = cfg.learner.counterfactual_held = False  # its rewards are given, not priced
    cfg.network.support_max_scale = 1.0
    cfg.learner.batch_size, cfg.learner.lr, cfg.learner.lr_min_frac = 8, lr, 0.05
    cfg.learner.epochs, cfg.learner.steps_per_epoch = 1, steps
    cfg.run.diag_every, cfg.run.graphs = 10**6, False
    cfg.env.n_envs = 1  # a bandit: no chain to follow
    return cfg


def trained_values(seed: int, steps: int, lr: float, high: float, stager: Stager) -> tuple[np.ndarray, np.ndarray]:
    """(C51 E[Q] [4], mean-head values [4]) of the directions at the bandit's state after `steps` learner steps at
    learning rate `lr`, Long's rare reward `high`."""
    stream = stager.stream
    cfg = bandit_config(steps, lr)
    host = bandit_replay(high)
    replay = ReplayBuffer(len(host["row"]), stream=stream, n_port=1)
    replay.upload(host, stager)
    market = np.ones((1, 1), np.float32)
    layout = ParamLayout.build(2, cfg.network)
    learner = Learner(cfg, layout, replay, stager.upload_new(market), stager.upload_new(np.full(1, np.nan, np.float32)),
                      isv=stager.upload_new(bootstrap_values()), stager=stager, stream=stream, seed=seed)
    learner.train_epoch()
    net = Network(layout, 1, stream=stream)
    logits = stager.upload_new(np.zeros((1, N_HEADS, ATOMS), np.float32))
    q, entropy = (stager.upload_new(np.zeros((1, N_HEADS), np.float32)) for _ in range(2))
    net.forward(learner.params, stager.upload_new(np.array([[1.0, 0.0]], np.float32)), logits, stream=stream)
    support = np.broadcast_to(base_support(-1.0, 1.0, ATOMS), (1, N_HEADS, 3)).copy()
    expected_q(logits, stager.upload_new(support), q, entropy, stream=stream)
    actor = MeanActor(layout, 1, dense="auto")
    actor.run(learner.params, net.head_input(1), stream=stream)
    return stager.download(q)[0, :N_DIRECTIONS].astype(np.float64), stager.download(actor.values)[0, 0].astype(float)


def table(rows: list[tuple[int, np.ndarray, np.ndarray]], high: float) -> str:
    true_mean = {d: float(np.mean(r)) for d, r in bandit_rewards(high).items()}
    names = [Direction(d).name.title() for d in range(N_DIRECTIONS)]
    head = ("| seed | " + " | ".join(f"C51 E[Q] {n}" for n in names) + " | " + " | ".join(f"mean {n}" for n in names)
            + " | C51 ranks first | mean head ranks first |")
    lines = [head, "| ---: " * (1 + 2 * N_DIRECTIONS) + "| --- | --- |"]
    truth = [f"{true_mean[Direction(d)]:+.3f}" for d in range(N_DIRECTIONS)]
    lines.append("| true mean | " + " | ".join(truth * 2) + " | Long | Long |")
    for seed, c51, mean in rows:
        cells = [f"{v:+.3f}" for v in (*c51, *mean)]
        lines.append(f"| {seed} | " + " | ".join(cells) + f" | {names[int(np.argmax(c51))]} | "
                     f"{names[int(np.argmax(mean))]} |")
    values = np.array([np.concatenate([c51, mean]) for _, c51, mean in rows])
    se = values.std(axis=0, ddof=1) / np.sqrt(len(rows)) if len(rows) > 1 else np.full(values.shape[1], np.nan)
    long_first = [sum(int(np.argmax(v)) == Direction.LONG for v in col) for col in ([r[1] for r in rows],
                                                                                   [r[2] for r in rows])]
    lines.append("| mean (SE) | " + " | ".join(f"{m:+.3f} ({e:.3f})" for m, e in zip(values.mean(0), se, strict=True))
                 + f" | Long in {long_first[0]} of {len(rows)} | Long in {long_first[1]} of {len(rows)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4], help="learner seeds")
    parser.add_argument("--steps", type=int, default=60, help="learner steps per seed")
    parser.add_argument("--lr", type=float, default=0.03, help="learner.lr (the cosine schedule ends at 0.05 of it)")
    parser.add_argument("--high", type=float, default=HIGH, help="Long's rare reward (once in four; else -0.4)")
    parser.add_argument("--out", type=Path, required=True, help="results path without suffix (.md is written)")
    args = parser.parse_args(argv)
    from numba import cuda

    stager = Stager(cuda.stream())
    rows = []
    for seed in args.seeds:
        c51, mean = trained_values(seed, args.steps, args.lr, args.high, stager)
        rows.append((seed, c51, mean))
        print(f"seed {seed}: C51 {np.round(c51, 3)}, mean head {np.round(mean, 3)}", flush=True)
    command = "python3 tools/mean_bandit.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = (f"# The skewed bandit: C51 E[Q] against the direction mean head (CPU)\n\nCommand: `{command}`\n\n"
            f"{__doc__.split(chr(10) + chr(10), 2)[2]}\n{table(rows, args.high)}")
    atomic_write_text(args.out.with_suffix(".md"), text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
