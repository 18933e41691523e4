"""The trainer: every stage of one run on one GPU stream, bound to one fold at a time.

Run-wide (built once): the stream and its Stager, the ISV bus, the parameter layout, the replay buffer and
the learner (parameters, target, Adam state, supports). Per fold (`bind_fold`): the fold's market tensors
on the device, the collect environments and their collector, the evaluator and, with selection days, a
second evaluator over them (the selector); the learner is pointed at the fold's observations. Per epoch
(`collect`, `train`, `evaluate`): the three stages in order, each a replay loop of captured StepGraphs with
one synchronisation at its end.

    trainer = Trainer(cfg)
    trainer.bind_fold(FoldMarket.build(features, fold, cfg.features, cfg.env), fold.index)
    rollout = trainer.collect(); learning = trainer.train(); days = trainer.evaluate()

Fold-boundary resets are not done here: the walk-forward driver runs them through the StateResetRegistry
(walkforward/trainer_state.py registers every piece of this class's state with its reset).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from fox_numba.agent.collector import Collector
from fox_numba.agent.dense import precision_dense
from fox_numba.agent.environment import VecEnv
from fox_numba.agent.evaluator import Evaluator, eval_network, fixed_bins
from fox_numba.agent.fold_market import FoldMarket, FoldMarketDevice, aux_forecast_target
from fox_numba.agent.health import HealthDiag
from fox_numba.agent.learner import Learner, run_layout
from fox_numba.agent.replay import STORED as REPLAY_FIELDS
from fox_numba.agent.replay import ReplayBuffer
from fox_numba.config import FoxConfig
from fox_numba.device.isv import IsvBus
from fox_numba.device.memory import Mapped
from fox_numba.device.runtime import new_stream
from fox_numba.device.staging import Stager
from fox_numba.kernels.drift import update_q_drift_rate

# Seed streams of the run, each its own (seed, stream) pair so no two share draws.
SEED_ENV, SEED_COLLECT, SEED_LEARNER = 1, 2, 3

PER_FOLD_STATE = ("env.states", "collector.rng_states", "collector.noise_step")
"""`device_state` entries that bind_fold seeds afresh for each fold: a checkpoint that ended its fold does not
carry them into the next one."""

RING_STATE = tuple(f"replay.{k}" for k in (*REPLAY_FIELDS, "meta"))
"""`device_state` entries of the replay ring. The fold reset empties the ring, so a checkpoint that ends its fold
leaves them out, and so does best.h5, which only evaluation reads: at the default 2**20 transitions they are 88 MiB
of each checkpoint's 89, downloaded and written every epoch."""


def stream_seed(seed: int, stream: int, fold: int = 0) -> int:
    """A seed for one random stream of one fold, distinct for every (seed, stream, fold)."""
    return (seed * 1_000_003 + stream * 10_007 + fold) % 2**63


class Trainer:
    """The stages of one run (module docstring)."""

    # Every attribute is wiring or a per-fold object rebuilt by bind_fold; the state lives in the learner,
    # the replay buffer and the ISV bus (walkforward/trainer_state.py).
    NOT_STATE = ("cfg", "stream", "stager", "bus", "layout", "replay", "learner", "market", "env", "collector",
                 "evaluator", "selector", "fold", "_q_epoch", "health")

    def __init__(self, cfg: FoxConfig) -> None:
        self.cfg = cfg
        self.stream = new_stream()
        self.stager = Stager(self.stream)
        self.bus = IsvBus(self.stager)
        self.layout = run_layout(cfg)
        self.replay = ReplayBuffer(cfg.learner.buffer_size, stream=self.stream)
        self.learner: Learner | None = None
        self.market: FoldMarketDevice | None = None
        self.env: VecEnv | None = None
        self.collector: Collector | None = None
        self.evaluator: Evaluator | None = None
        self.selector: Evaluator | None = None
        """The backtest of the selection days (folds.select_days > 0), else None."""
        self.fold: int | None = None
        self._q_epoch = Mapped(1, np.float32)
        self.health = HealthDiag(self.stager)

    def bind_fold(self, market: FoldMarket, fold: int) -> None:
        """Upload the fold's market and build its environments, collector and evaluator (the learner is
        built at the first fold and re-pointed at later ones)."""
        cfg, seed = self.cfg, self.cfg.run.seed
        dev = market.upload(self.stager)
        aux_target = self.stager.upload_new(aux_forecast_target(market, cfg.learner.aux_horizon_bars))
        if self.learner is None:
            self.learner = Learner(cfg, self.layout, self.replay, dev.market_obs, aux_target, isv=self.bus.values,
                                   stager=self.stager, stream=self.stream, seed=stream_seed(seed, SEED_LEARNER),
                                   day_first=dev.day_first, book=dev, book_obs=dev.book_obs)  # fmt: skip
        else:
            self.learner.set_market(dev.market_obs, aux_target, dev.day_first, dev, book_obs=dev.book_obs)
        lrn = self.learner
        lrn.lr_scale = 1.0 if fold == 0 else cfg.learner.refit_lr_scale
        self.market, self.fold = dev, fold
        self.env = VecEnv(dev, cfg.env, cfg.features, self.bus.values, stager=self.stager, mode="collect",
                          seed=stream_seed(seed, SEED_ENV, fold))  # fmt: skip
        self.collector = Collector(self.env, self.replay, self.layout, lrn.params, lrn.support_online,
                                   stager=self.stager, seed=stream_seed(seed, SEED_COLLECT, fold),
                                   use_graph=cfg.run.graphs, health=self.health, spread=cfg.env.explore_spread,
                                   tau_mult=cfg.env.explore_tau, hindsight_fraction=cfg.env.hindsight_fraction,
                                   hindsight_horizon=cfg.evaluation.probe_horizon_bars,
                                   commission=cfg.env.commission, iqn_quantiles=cfg.network.iqn_quantiles,
                                   spectral_uv=lrn.spectral_uv, fixed_bins=fixed_bins(cfg.env),
                                   dense=precision_dense(cfg.run.precision))  # fmt: skip
        state = lrn.state_arrays()
        params, supports = (state[name] for name in eval_network(cfg.evaluation.network))
        self.evaluator = Evaluator(dev, cfg, self.layout, params, supports, isv=self.bus.values,
                                   stager=self.stager, use_graph=cfg.run.graphs, health=self.health,
                                   spectral_uv=lrn.spectral_uv)  # fmt: skip
        self.selector = None if market.select_windows.shape[0] == 0 else Evaluator(
            dev.on_selection_days(self.stager), cfg, self.layout, params, supports, isv=self.bus.values,
            stager=self.stager, use_graph=cfg.run.graphs, spectral_uv=lrn.spectral_uv)

    def _bound(self) -> tuple[Learner, VecEnv, Collector, Evaluator]:
        if self.learner is None or self.env is None or self.collector is None or self.evaluator is None:
            raise RuntimeError("Trainer: bind a fold first (bind_fold)")
        return self.learner, self.env, self.collector, self.evaluator

    def collect(self) -> dict[str, float]:
        """The epoch's collect phase: supports refreshed from the ISV, the curriculum's reach from the fold's
        step counter (env.curriculum_epochs), environments started at fresh draws, env.collect_steps steps into
        the replay; the rollout metrics."""
        learner, env, collector, _ = self._bound()
        learner.refresh_supports()
        env.follow_curriculum(learner.optim_state, self.cfg.learner.steps_per_epoch, stream=self.stream)
        env.reset(stream=self.stream)
        return collector.collect(self.cfg.env.collect_steps)

    def train(self, diag: Callable[[], None]) -> dict[str, float]:
        """learner.steps_per_epoch gradient steps, with a HEALTH_DIAG snapshot every run.diag_every steps (and
        after the last): `diag()` is called after each snapshot, to read and log it; the epoch's figures."""
        learner, env, *_ = self._bound()
        total, every = self.cfg.learner.steps_per_epoch, max(1, self.cfg.run.diag_every)
        done = 0
        while done < total:
            steps = min(every, total - done)
            learner.train_epoch(steps)
            done += steps
            noisy = (self.layout, learner.params) if self.layout.noisy else None
            self.health.snapshot(self.bus.values, learner.optim_state, env.metrics.device,
                                 use_graph=self.cfg.run.graphs, noisy=noisy)
            diag()
        return learner.epoch_stats()

    def evaluate(self) -> tuple[list[tuple[np.ndarray, np.ndarray]], dict[str, float]]:
        """The validation backtest: per day (pnl dollars, position) per step, and the environment metrics."""
        *_, evaluator = self._bound()
        days = evaluator.run()
        return days, evaluator.metrics()

    def evaluate_selection(self) -> list[tuple[np.ndarray, np.ndarray]] | None:
        """The same backtest on the selection days (None without them): what picks the fold's best epoch."""
        self._bound()
        return None if self.selector is None else self.selector.run()

    def update_drift(self, q_epoch_mean: float) -> None:
        """ISV[Q_DRIFT_RATE] from this epoch's mean E[Q] (after the kill check; kernels/drift.py)."""
        self._q_epoch.host[0] = np.float32(q_epoch_mean)
        update_q_drift_rate(self.bus.values, self._q_epoch.device, stream=self.stream)

    def isv(self) -> np.ndarray:
        """A host copy of the ISV bus (synchronises)."""
        return self.bus.read()

    def device_state(self) -> dict[str, Any]:
        """Every device array a checkpoint holds to resume this run exactly, by name."""
        learner, env, collector, _ = self._bound()
        arrays = {f"learner.{k}": v for k, v in learner.state_arrays().items()}
        arrays |= {f"replay.{k}": getattr(self.replay, k) for k in (*REPLAY_FIELDS, "meta")}
        arrays["isv"] = self.bus.values
        arrays["env.states"] = env.states
        arrays["collector.rng_states"] = collector.rng_states
        if collector.noise_step is not None:  # NoisyNet heads
            arrays["collector.noise_step"] = collector.noise_step
        return arrays

    def download_state(self, *, ring: bool = True) -> dict[str, np.ndarray]:
        """Host copies of `device_state` (without RING_STATE unless `ring`) and of the HEALTH_DIAG record (its
        histograms span epochs); synchronises."""
        arrays = {name: self.stager.download(arr) for name, arr in self.device_state().items()
                  if ring or name not in RING_STATE}
        arrays["health.record"] = self.health.record.host.copy()
        return arrays

    def load_state(self, arrays: dict[str, np.ndarray], *, same_fold: bool) -> None:
        """Upload a checkpoint's arrays into `device_state` (names and shapes must match). `same_fold`: the
        checkpoint is of the bound fold; otherwise it ended the previous fold, and the bound fold keeps the
        PER_FOLD_STATE bind_fold seeded, as an uninterrupted run would, and the ring the fold reset empties
        (RING_STATE, which such a checkpoint leaves out)."""
        learner, *_ = self._bound()
        learner.load_state({k.removeprefix("learner."): v for k, v in arrays.items() if k.startswith("learner.")})
        for name, dev in self.device_state().items():
            if not name.startswith("learner.") and (same_fold or name not in (*PER_FOLD_STATE, *RING_STATE)):
                self.stager.upload(np.ascontiguousarray(arrays[name]), dev)
        self.health.record.host[:] = arrays["health.record"]
