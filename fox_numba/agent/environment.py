"""VecEnv: N trading environments of one fold on the device, around the kernels of kernels/env.py.

Collect mode: `n_envs` environments, each running episodes of env.episode_bars bars from training starts
drawn with its own xoroshiro stream, reset at once when an episode ends (auto-reset). Evaluation mode: one
environment per validation window (a validation day), run from its first bar and then frozen.

Curriculum (env.curriculum_epochs > 0): the draws reach only the easiest share `reach` float64 [1] of the
fold's starts (ranked by FoldMarket); `follow_curriculum` sets it once per epoch on the device from the
learner's per-fold step counter, so it restarts with that counter at a fold boundary and resumes with it
from a checkpoint. Off, reach stays 1 (the uniform draw).

Everything is allocated in the constructor; every method that runs per step only launches graph-safe
kernels on the given stream, so a collect step (observe -> network + action selection -> replay put_obs
-> step -> replay put_result -> rollout_stats) can be captured as one StepGraph (agent/replay.py shows the
sequence). The arrays a step body passes around are attributes:
  row int32 [N]                current bar of each environment (a view of the state)
  entry float64 [N]            its position's average entry price (a view of the state; the replay keeps it)
  port float32 [N, P]          portfolio part of the current observation (P = observation.N_PORTFOLIO)
  reward, done float32 [N]     of the last step (done = 1 on an episode's terminal transition)
  next_row int32 [N], next_port float32 [N, P]   the transition's next observation (the terminal one when
                               done, even though a collect environment has already been reset)
  comps float32 [N_COMPS, N]   reward components (pnl, novelty, persist, regime, stable, timing)
  stats float32 [N_STATS, N]   per-step values for the rollout ISV reduction
  acc float64 [N_ACC, N]       per-environment sums since the last `clear_metrics`
The fold's tensors are bound at construction (a graph freezes their addresses): build one VecEnv per fold
and mode, and capture its step graphs per fold.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fox_numba.actions import MAGNITUDE_FRACTIONS
from fox_numba.agent.fold_market import FoldMarket, FoldMarketDevice
from fox_numba.config import EnvConfig, FeatureConfig
from fox_numba.device.elementwise import fill_u32
from fox_numba.device.launch import i32, launch_strided
from fox_numba.device.memory import Mapped, device_zeros, words
from fox_numba.device.rng import xoroshiro_states
from fox_numba.device.staging import Stager
from fox_numba.errors import ConfigError
from fox_numba.kernels.env import (
    MODE_COLLECT,
    MODE_EVAL,
    N_ACC,
    N_COMPS,
    N_PARAMS,
    N_SF,
    N_SI,
    N_STATS,
    PRM_BEYOND_TICKS,
    PRM_CLIP_SIGMA,
    PRM_COMMISSION,
    PRM_EPISODE_BARS,
    PRM_LIFE_0,
    PRM_MAX_POSITION,
    PRM_POINT_VALUE,
    PRM_POSITION_HISTORY,
    PRM_RISK_UNIT,
    PRM_TARGET_0,
    PRM_TICK,
    PRM_W_NOVELTY,
    PRM_W_PERSIST,
    PRM_W_REGIME,
    PRM_W_STABLE,
    PRM_W_TIMING,
    SF_AVG,
    SI_ROW,
    curriculum_reach,
    env_reset,
    env_step,
    gather_obs,
)
from fox_numba.kernels.env_stats import METRICS_DTYPE, N_METRICS, epoch_metrics, rollout_isv
from fox_numba.observation import N_PORTFOLIO

MODES = {"collect": MODE_COLLECT, "eval": MODE_EVAL}


def magnitude_targets(max_position: int) -> tuple[int, ...]:
    """Contracts of each magnitude: round(fraction x max_position) (halves up), at least 1."""
    return tuple(max(1, math.floor(f * max_position + 0.5)) for f in MAGNITUDE_FRACTIONS)


def env_params(market: FoldMarket, env: EnvConfig, features: FeatureConfig) -> np.ndarray:
    """The float64 [N_PARAMS] parameter array the environment kernels read (kernels/env.py PRM_*)."""
    lives = (env.limit_life_patient, env.limit_life_normal, env.limit_life_urgent)
    if min(lives) < 1:
        raise ConfigError(f"env.limit_life_* must be at least 1 bar, got {lives}")
    if env.beyond_depth_ticks < 0:
        raise ConfigError(f"env.beyond_depth_ticks must be >= 0, got {env.beyond_depth_ticks}")
    if env.commission < 0:
        raise ConfigError(f"env.commission must be >= 0, got {env.commission}")
    if env.max_position < 1:
        raise ConfigError(f"env.max_position must be at least 1, got {env.max_position}")
    p = np.zeros(N_PARAMS, np.float64)
    p[PRM_TICK] = market.tick_size
    p[PRM_POINT_VALUE] = market.point_value
    p[PRM_COMMISSION] = env.commission
    p[PRM_RISK_UNIT] = market.risk_unit
    p[PRM_MAX_POSITION] = env.max_position
    p[PRM_BEYOND_TICKS] = env.beyond_depth_ticks
    p[PRM_LIFE_0 : PRM_LIFE_0 + 3] = lives
    p[PRM_TARGET_0 : PRM_TARGET_0 + 3] = magnitude_targets(env.max_position)
    p[PRM_W_TIMING] = env.w_timing
    p[PRM_W_PERSIST] = env.w_persist
    p[PRM_W_REGIME] = env.w_regime
    p[PRM_W_NOVELTY] = env.w_novelty
    p[PRM_W_STABLE] = env.w_stable
    p[PRM_CLIP_SIGMA] = features.clip_sigma
    p[PRM_EPISODE_BARS] = market.episode_bars
    p[PRM_POSITION_HISTORY] = float(env.position_history)
    return p


class VecEnv:
    """N environments of one fold (module docstring). `isv` is the ISV bus's device array (read for the
    shaping caps, written by `rollout_stats`)."""

    def __init__(
        self,
        market: FoldMarketDevice,
        env: EnvConfig,
        features: FeatureConfig,
        isv: Any,
        *,
        stager: Stager,
        mode: str = "collect",
        n_envs: int | None = None,
        seed: int = 0,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {sorted(MODES)}, got {mode!r}")
        host = market.host
        if host.episode_bars != env.episode_bars:
            raise ConfigError(
                f"the fold market was built for episodes of {host.episode_bars} bars, env.episode_bars is "
                f"{env.episode_bars}"
            )
        n_windows = int(host.val_windows.shape[0])
        if mode == "eval":
            n = n_windows if n_envs is None else n_envs
            if not 1 <= n <= n_windows:
                raise ValueError(f"evaluation runs one environment per validation window: 1..{n_windows}, got {n}")
        else:
            n = env.n_envs if n_envs is None else n_envs
            if n < 1:
                raise ConfigError(f"env.n_envs must be at least 1, got {n}")
        if env.curriculum_epochs < 0 or not 0.0 < env.curriculum_reach <= 1.0:
            raise ConfigError(f"env.curriculum_epochs must be >= 0 and env.curriculum_reach in (0, 1], got "
                              f"{env.curriculum_epochs} and {env.curriculum_reach}")  # fmt: skip
        stream = stager.stream
        self.curriculum = env.curriculum_epochs, env.curriculum_reach
        self.mode = mode
        self._mode = MODES[mode]
        self.n = n
        self.market = market
        self.isv = isv
        self._stager = stager
        self.params = stager.upload_new(env_params(host, env, features))
        self.states = xoroshiro_states(n, seed, stager)
        self.reach = stager.upload_new(np.ones(1, np.float64))
        """float64 [1]: the share of the (ranked) starts the collect draws reach (module docstring)."""
        self.si = device_zeros((N_SI, n), np.int32, stream=stream)
        self.sf = device_zeros((N_SF, n), np.float64, stream=stream)
        self.dir_ema = device_zeros((4, n), np.float32, stream=stream)
        self.port = device_zeros((n, N_PORTFOLIO), np.float32, stream=stream)
        self.row = self.si[SI_ROW]
        self.entry = self.sf[SF_AVG]
        self.reward = device_zeros(n, np.float32, stream=stream)
        self.done = device_zeros(n, np.float32, stream=stream)
        self.next_row = device_zeros(n, np.int32, stream=stream)
        self.next_port = device_zeros((n, N_PORTFOLIO), np.float32, stream=stream)
        self.comps = device_zeros((N_COMPS, n), np.float32, stream=stream)
        self.stats = device_zeros((N_STATS, n), np.float32, stream=stream)
        self.acc = device_zeros((N_ACC, n), np.float64, stream=stream)
        self.metrics = Mapped(N_METRICS, np.float64)
        self._windows = host.val_windows[:n]
        self.eval_steps = int((self._windows[:, 1] - self._windows[:, 0]).max()) - 1 if mode == "eval" else 0
        """Steps after which every evaluation environment is done (0 in collect mode)."""
        self.reset(stream=stream)
        stream.synchronize()

    def eval_rows(self, steps: int) -> np.ndarray:
        """int32 [steps, N]: the row each evaluation environment observes at steps 0 .. steps - 1 after `reset`,
        known in advance (kernels/env.py: it starts at its window's first bar, moves one bar per step and stays
        frozen at the window's last, min(first + k, stop - 1)); the evaluator's encoder cache reads them."""
        if self.mode != "eval":
            raise ValueError("VecEnv.eval_rows: the rows are known in advance in eval mode only")
        first, stop = (self._windows[:, j].astype(np.int64) for j in (0, 1))
        return np.minimum(first[None, :] + np.arange(steps)[:, None], stop[None, :] - 1).astype(np.int32)

    def reset(self, *, stream: Any) -> None:
        """Start every environment flat: collect mode at freshly drawn starts, each first episode staggered
        to a drawn length (kernels/env.py env_reset_kernel), eval mode at its validation window's first bar.
        Accumulators are left alone. Called at each epoch's collect phase (starts drawn per epoch), it
        abandons the running episodes (their last transitions stay in the replay without a terminal);
        called once per fold, episodes run on across epochs."""
        m = self.market
        env_reset(self._mode, m.train_starts, self.reach, m.val_windows, m.row_stop, m.mid, self.params, self.states,
                  self.si, self.sf, self.dir_ema, self.port, stream=stream)  # fmt: skip

    def follow_curriculum(self, optim_state: Any, steps_per_epoch: int, *, stream: Any) -> None:
        """With the curriculum on, set `reach` from the learner's per-fold step counter (OPTIM_STATE_DTYPE [1]):
        env.curriculum_reach at the fold's first epoch, 1 from epoch env.curriculum_epochs on (kernels/env.py
        curriculum_reach); off, nothing (reach stays 1). Once per epoch, before `reset`."""
        epochs, reach0 = self.curriculum
        if epochs > 0:
            curriculum_reach(optim_state, reach0, epochs * steps_per_epoch, self.reach, stream=stream)

    def observe(self, obs: Any, *, stream: Any) -> None:
        """obs float32 [N, obs_dim] = each environment's current observation."""
        gather_obs(self.market.market_obs, self.row, self.port, obs, stream=stream)

    def step(self, actions: Any, *, stream: Any) -> None:
        """Apply actions int32 [N, 4] and advance every environment one bar (outputs in the attributes)."""
        env_step(self._mode, self.market, self.reach, self.params, self.isv, self.states, actions, self.si, self.sf,
                 self.dir_ema, self.port, self.reward, self.done, self.next_row, self.next_port, self.comps,
                 self.stats, self.acc, stream=stream)  # fmt: skip

    def rollout_stats(self, actions: Any, *, stream: Any) -> None:
        """Fold this step's means into the rollout ISV slots (after `step`, with the same actions)."""
        rollout_isv(actions, self.reward, self.comps, self.stats, self.isv, stream=stream)

    def clear_metrics(self, *, stream: Any) -> None:
        """Zero the per-environment accumulators."""
        w = words(self.acc)
        launch_strided(fill_u32, w.size, w, np.uint32(0), i32(w.size), stream=stream)

    def reduce_metrics(self, *, stream: Any) -> None:
        """Reduce the accumulators into the mapped metrics record (graph-safe; read it with `metrics_record`
        after synchronising)."""
        epoch_metrics(self.acc, self.metrics.device, stream=stream)

    def metrics_record(self) -> np.ndarray:
        """The mapped metrics as a METRICS_DTYPE record (a copy; valid after a synchronised reduce)."""
        return self.metrics.host.copy().view(METRICS_DTYPE)[0]

    def read_metrics(self, *, stream: Any, clear: bool = True) -> dict[str, float]:
        """Reduce, optionally clear the accumulators, synchronise and return the metrics by name (once per
        epoch: this waits for the stream)."""
        self.reduce_metrics(stream=stream)
        if clear:
            self.clear_metrics(stream=stream)
        stream.synchronize()
        rec = self.metrics_record()
        return {name: float(rec[name]) for name in METRICS_DTYPE.names}

    def per_env_metrics(self) -> np.ndarray:
        """Host copy of the accumulators float64 [N_ACC, N] (e.g. per validation day; kernels/env.py ACC_*)."""
        return self._stager.download(self.acc)

    def download_state(self) -> dict[str, np.ndarray]:
        """Host copies of the state and the last step's outputs (tests, diagnostics)."""
        names = ("si", "sf", "dir_ema", "port", "reward", "done", "next_row", "next_port", "comps", "stats", "acc",
                 "states")  # fmt: skip
        return {name: self._stager.download(getattr(self, name)) for name in names}
