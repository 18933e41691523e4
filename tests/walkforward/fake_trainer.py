"""A fake trainer driven through the fold driver's sequence, on host arrays, for the resume tests.

It has what the real one checkpoints: parameters, a target, Adam moments, a random generator, step
counters, the kill criteria's windows, the best epoch, and a fold reset that shrinks and perturbs. Its
`main` is the per-fold / per-epoch call sequence the real driver follows (see `run`), so the test proves
the sequence resumes exactly.

    python fake_trainer.py RUN_DIR [--resume] [--kill replace:N | metrics:N | torn:N]

--kill makes the process SIGKILL itself at the N-th os.replace (a temporary file complete, not yet renamed),
right after the N-th metrics line, or half-way through writing the N-th metrics line.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

import numpy as np

from fox_numba.config import load_config
from fox_numba.walkforward import run_folder as run_folder_module
from fox_numba.walkforward.folds import make_folds
from fox_numba.walkforward.kill import EpochHealth, KillCriteria
from fox_numba.walkforward.metrics import DaySeries, compute_metrics, flat_days, fold_report
from fox_numba.walkforward.reset_registry import FoldReset, ResetContext, StateResetRegistry
from fox_numba.walkforward.run_folder import BestEpoch, RunFolder, epoch_line

N = 24
STEPS = 30
DAYS = tuple(f"2024-03-{d:02d}" for d in range(1, 8))
OVERRIDES = ["folds.n_folds=3", "folds.train_days=2", "folds.val_days=1", "folds.step_days=1", "learner.epochs=4",
             "run.seed=7"]


class FakeLearner:
    NOT_STATE = ("n",)

    def __init__(self, seed: int) -> None:
        self.n = N
        self.params = np.random.default_rng(seed).standard_normal(N).astype(np.float32)
        self.target = self.params.copy()
        self.m = np.zeros(N, np.float32)
        self.v = np.zeros(N, np.float32)
        self.adam_step = 0
        self.fold_step = 0
        self.global_step = 0
        self.rng = np.random.default_rng(seed + 1)

    def arrays(self) -> dict[str, np.ndarray]:
        return {"params": self.params, "target": self.target, "adam_m": self.m, "adam_v": self.v}

    def load_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        self.params, self.target, self.m, self.v = (arrays[k].copy() for k in ("params", "target", "adam_m", "adam_v"))

    def _shrink_perturb(self, ctx: ResetContext) -> None:
        fresh = ctx.rng("learner.params").standard_normal(N).astype(np.float32)
        self.params = (np.float32(0.8) * self.params + np.float32(0.2) * fresh).astype(np.float32)

    def _shrink_moments(self, ctx: ResetContext) -> None:
        self.m *= np.float32(0.1)
        self.v *= np.float32(0.01)

    def register_state(self, registry: StateResetRegistry) -> None:
        r = registry.owner(self, "learner")
        r.action("adam_moments", FoldReset, "Adam m *= 0.1, v *= 0.01", fields=("m", "v"), action=self._shrink_moments)
        r.field("adam_step", FoldReset, 0, "Adam step counter")
        r.action("params", FoldReset, "theta = 0.8 theta + 0.2 theta_fresh (seeded)", fields=("params",),
                 action=self._shrink_perturb)
        r.action("target", FoldReset, "target re-synced", fields=("target",),
                 action=lambda ctx: setattr(self, "target", self.params.copy()))
        r.field("fold_step", FoldReset, 0, "per-fold step counter")
        r.per_run("global_step", "gradient steps of the run")
        r.per_run("rng", "the learner's random stream", codec=(
            lambda g: g.bit_generator.state, lambda s: _generator(s)))

    def train_epoch(self, fold: int) -> tuple[float, float]:
        """STEPS Adam steps on a noisy quadratic; returns (q mean, gradient norm of the last step)."""
        g = np.zeros(N, np.float32)
        for _ in range(STEPS):
            self.adam_step += 1
            self.fold_step += 1
            self.global_step += 1
            g = (self.params - 1.0 + 0.3 * self.rng.standard_normal(N)).astype(np.float32)
            self.m = (0.9 * self.m + 0.1 * g).astype(np.float32)
            self.v = (0.999 * self.v + 0.001 * g * g).astype(np.float32)
            mh, vh = self.m / (1 - 0.9**self.adam_step), self.v / (1 - 0.999**self.adam_step)
            self.params = (self.params - 0.01 * mh / (np.sqrt(vh) + 1e-8)).astype(np.float32)
            self.target = (0.95 * self.target + 0.05 * self.params).astype(np.float32)
        q = float(np.mean(self.params))
        if fold == 1:  # fold 1 runs away geometrically: the Q-drift criterion ends it at epoch 3
            q = 0.5 * 5.0 ** (self.fold_step // STEPS - 1)
        return q, float(np.linalg.norm(g))

    def validate(self, n_days: int = 2, bars: int = 16) -> list[DaySeries]:
        days = []
        for d in range(n_days):
            pos = np.sign(self.params[d : d + bars]).astype(np.float64)
            pos[-1] = 0.0
            pnl = np.concatenate(([0.0], pos[:-1] * np.diff(self.target[d : d + bars].astype(np.float64)) * 50.0))
            days.append(DaySeries(pnl - np.abs(np.diff(pos, prepend=0.0)) * 2.25, pos))
        return days


def _generator(state: dict) -> np.random.Generator:
    g = np.random.default_rng()
    g.bit_generator.state = state
    return g


def run(run_dir: Path, resume: bool) -> None:
    """The driver's sequence: per fold the reset, per epoch train -> kill checks -> validate -> end_epoch."""
    if resume:
        run = RunFolder.open(run_dir)
        cfg = run.config()
    else:
        cfg = load_config("smoke", overrides=OVERRIDES + [f"run.out_dir={run_dir.parent}", f"run.name={run_dir.name}"])
        run = RunFolder.create(cfg, make_folds(cfg.folds, DAYS))
    folds = make_folds(cfg.folds, DAYS)
    learner, kills, best = FakeLearner(cfg.run.seed), KillCriteria(), BestEpoch()
    registry = StateResetRegistry()
    for component in (learner, kills, best):
        component.register_state(registry)
    assert registry.audit(learner, *kills.components(), best) == []

    start_fold, start_epoch, reset_first = 0, 0, True
    point = run.resume_point(len(folds)) if resume else None
    if point is not None:
        learner.load_arrays(point.checkpoint.arrays)
        registry.load_host_state(point.checkpoint.registry_state)
        start_fold, start_epoch, reset_first = point.fold, point.epoch, point.fold_boundary

    for k in range(start_fold, len(folds)):
        resets = None
        if k > start_fold or reset_first:
            resets = [r.name for r in registry.reset(FoldReset, ResetContext(fold=k, seed=cfg.run.seed))]
        baseline = compute_metrics(flat_days([16, 16]), annualisation_days=cfg.evaluation.annualisation_days)
        for e in range(start_epoch if k == start_fold else 0, cfg.learner.epochs):
            q, grad = learner.train_epoch(k)
            kill = kills.check(EpochHealth(epoch=e, q_mean=q, loss=1.0, grad_norm=grad, q_abs_ref=0.05,
                                           q_dir_abs_ref=0.05, nonfinite_steps=0, steps=STEPS,
                                           fold_step=learner.fold_step))
            days = learner.validate()
            val = compute_metrics(days, annualisation_days=cfg.evaluation.annualisation_days)
            report = fold_report(val, flat=baseline, buy_and_hold=baseline, oracle_sharpe=10.0)
            line = epoch_line(k, e, val=val, report=report, kill=kill, resets=resets if e == 0 else None,
                              train={"q_mean": q, "grad_norm": grad, "global_step": learner.global_step})
            done = kill is not None or e == cfg.learner.epochs - 1
            run.end_epoch(line, arrays=learner.arrays(), registry=registry, best=best, fold_done=done,
                          validation=days, fingerprints={"params": "fake0000fake0000"})
            if done:
                break
    run.summarise(annualisation_days=cfg.evaluation.annualisation_days, chosen_by=best.rule)
    run.close()


def install_kill(spec: str) -> None:
    what, n = spec.split(":")
    target, count = int(n), [0]

    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    if what == "replace":
        real = os.replace

        def replace(src, dst):
            count[0] += 1
            if count[0] == target:
                die()
            real(src, dst)

        os.replace = replace
    elif what in ("metrics", "torn"):
        real_append = run_folder_module.RunFolder.append_metrics

        def append(self, line):
            count[0] += 1
            if count[0] == target and what == "torn":
                with open(self.path / run_folder_module.METRICS, "ab") as fh:
                    fh.write(b'{"fold": 0, "epo')
                    fh.flush()
                    os.fsync(fh.fileno())
                die()
            real_append(self, line)
            if count[0] == target:
                die()

        run_folder_module.RunFolder.append_metrics = append
    else:
        raise SystemExit(f"unknown kill spec {spec}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--kill", default=None)
    args = parser.parse_args(argv)
    if args.kill:
        install_kill(args.kill)
    run(args.run_dir, args.resume)
    return 0


if __name__ == "__main__":
    sys.exit(main())
