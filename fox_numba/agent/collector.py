"""The collect stage: the environments step with the current online network and fill the replay buffer.

One collect step is one StepGraph (captured on the GPU, eager under the simulator), kernels in order:

    env.observe(obs)                                      obs [N, obs_dim] = market row + portfolio part
    (tick_noise(noise_step)                               network.noisy_sigma0 > 0 only: this step's noise)
    net.forward(params, obs)                              online network: the head GEMM's rows [N, head_width(Z)]
    (iqn.run(head input, rng_states)                      network.iqn_quantiles > 0 only: E_IQN and one drawn
                                                          quantile per direction, agent/iqn.py IqnActor)
    (mean.run(head input)                                 network.mean_head only: the directions' mean values,
                                                          agent/mean_head.py MeanActor)
    select_actions(head rows, supports, explore=True)     the dueling combine formed in shared memory, then
                                                          Thompson direction (joint with IQN, or moved to the mean
                                                          head's values, when on), Boltzmann
                                                          magnitude/order/urgency
    (relabel_directions(labels, row, port, actions)       env.hindsight_fraction > 0 only: the first
                                                          n_relabel environments take the hindsight direction)
    replay.put_obs(row, port, actions, entry)             the transition's s and a (and the entry price)
    env.step(actions)                                     fills, marks, reward, done, auto-reset
    replay.put_result(reward, done, next_row, next_port)  the transition's r, done and s'; cursor advance
    env.rollout_stats(actions)                            rollout ISV slots (action shares, reward split ...)

The per-head supports [13, 3] are the learner's online supports, refreshed once per epoch; `refresh`
broadcasts them to the per-sample layout action selection reads, outside the graph (the graph keeps the
array's address, not its values). Metrics are reduced on the device and read once per epoch.
With NoisyNet heads the network draws one factorised noise per collect step, shared by every environment,
from the collector's counter `noise_step` (per fold, zero at construction; agent/noisy.py).
With hindsight relabelling the fold's per-row labels are built once, at construction, on the device from the
fold's mid and row_stop (kernels/hindsight.py: the seed is silent on its rule; ours is the oracle's with the
realised move); the relabel step reads them and the environments' rows and positions, so nothing is written
from the host per step. The labels are a function of the fold's market and the config: no state to reset or
to checkpoint.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fox_numba.actions import N_BRANCHES, N_HEADS
from fox_numba.agent.environment import VecEnv
from fox_numba.agent.health import HealthDiag
from fox_numba.agent.iqn import IqnActor
from fox_numba.agent.mean_head import MeanActor
from fox_numba.agent.network import Network, ParamLayout
from fox_numba.agent.noisy import STREAM_COLLECT, NoiseKey
from fox_numba.agent.replay import ReplayBuffer
from fox_numba.agent.spectral import read_only
from fox_numba.device.graphs import StepGraph
from fox_numba.device.memory import device_empty, device_zeros
from fox_numba.device.rng import xoroshiro_states
from fox_numba.device.staging import Stager
from fox_numba.errors import ConfigError
from fox_numba.kernels.action_select import FREE_BINS, check_fixed_bins, select_actions
from fox_numba.kernels.heads import broadcast_supports
from fox_numba.kernels.hindsight import hindsight_labels, relabel_directions
from fox_numba.kernels.noisy import tick_noise
from fox_numba.market.synthetic_oracle import oracle_threshold


def relabel_count(fraction: float, n_envs: int) -> int:
    """Environments relabelled per step: round(fraction x n_envs), halves up (ConfigError outside [0, 1])."""
    if not 0.0 <= fraction <= 1.0:
        raise ConfigError(f"env.hindsight_fraction is {fraction}; it must be in [0, 1]")
    return math.floor(fraction * n_envs + 0.5)


class Collector:
    """Collect steps of one fold's collect-mode VecEnv into its replay buffer with the online `params`."""

    def __init__(
        self, env: VecEnv, replay: ReplayBuffer, layout: ParamLayout, params: Any, supports: Any, *,
        stager: Stager, seed: int, use_graph: bool, health: HealthDiag, spread: float = 1.0, tau_mult: float = 1.0,
        hindsight_fraction: float = 0.0, hindsight_horizon: int = 15, commission: float = 0.0, iqn_quantiles: int = 0,
        spectral_uv: Any = None, dense: str = "auto", fixed_bins: tuple[int, ...] = FREE_BINS,
    ) -> None:
        """`hindsight_fraction`, `hindsight_horizon` (bars) and `commission` (dollars per contract per side) set
        the relabelling (env.hindsight_fraction, evaluation.probe_horizon_bars, env.commission); `iqn_quantiles`
        (network.iqn_quantiles) the midpoint levels of E_IQN when the layout has an IQN head; `spectral_uv` the
        learner's spectral-norm vectors, read as they are (network.spectral_norm; agent/spectral.py); `dense` the dense
        layers' kernels (agent/dense.py; run.precision); `fixed_bins` the bins of the branches after direction that
        every step takes, -1 where the policy chooses (env.fixed_bins; kernels/action_select.py)."""
        n = env.n
        self.env, self.replay, self.params, self.supports, self.health = env, replay, params, supports, health
        self.stream = stager.stream
        self.spread, self.tau_mult, self.fixed_bins = spread, tau_mult, check_fixed_bins(fixed_bins)
        self.noise_step = device_zeros(1, np.int64, stream=self.stream) if layout.noisy else None
        noise = NoiseKey(self.noise_step, seed, STREAM_COLLECT) if self.noise_step is not None else None
        self.net = Network(layout, n, stream=self.stream, noise=noise, spectral=read_only(spectral_uv), dense=dense)
        if layout.windowed:  # the encoder's windows end at each environment's row
            self.net.bind_market(env.market.market_obs, env.market.day_first, env.market.book_obs)
        self.obs = device_empty((n, layout.obs_dim), np.float32)
        self.support_rows = device_empty((n, N_HEADS, 3), np.float32)
        self.actions = device_empty((n, N_BRANCHES), np.int32)
        self.conviction = device_empty(n, np.float32)
        self.rng_states = xoroshiro_states(n, seed, stager)
        self.iqn = IqnActor(layout, n, iqn_quantiles, explore=True) if layout.iqn else None
        self.mean = MeanActor(layout, n, dense=dense) if layout.mean_head else None
        self.n_relabel = relabel_count(hindsight_fraction, n)
        self.labels = self._hindsight_labels(hindsight_horizon, commission) if self.n_relabel > 0 else None
        """int32 [fold rows]: the hindsight label of every row (kernels/hindsight.py), None when off."""
        self.graph = StepGraph("collect.step", self._step, self.stream, use_graph=use_graph)

    def _step(self, s: Any) -> None:
        env, replay = self.env, self.replay
        env.observe(self.obs, stream=s)
        if self.noise_step is not None:
            tick_noise(self.noise_step, stream=s)
        self.net.forward(self.params, self.obs, None, stream=s, rows=env.row)
        if self.iqn is not None:
            self.iqn.run(self.params, self.net.head_input(env.n), self.rng_states, stream=s)
        if self.mean is not None:
            self.mean.run(self.params, self.net.mean_input(env.n), stream=s)
        select_actions(self.net.head_out, self.support_rows, self.rng_states, self.actions, self.conviction,
                       explore=True, stream=s, spread=self.spread, tau_mult=self.tau_mult, fixed=self.fixed_bins,
                       iqn=None if self.iqn is None else self.iqn.values,
                       mean=None if self.mean is None else self.mean.values)  # fmt: skip
        if self.labels is not None:
            relabel_directions(self.labels, env.row, env.port, self.actions, self.n_relabel, stream=s)
        replay.put_obs(env.row, env.port, self.actions, env.entry, stream=s)
        env.step(self.actions, stream=s)
        replay.put_result(env.reward, env.done, env.next_row, env.next_port, stream=s)
        env.rollout_stats(self.actions, stream=s)

    def _hindsight_labels(self, horizon: int, commission: float) -> Any:
        """The fold's labels, built on the device from its uploaded mid and row_stop (once per fold)."""
        market = self.env.market
        host = market.host
        if horizon < 1 or commission < 0:
            raise ConfigError(f"hindsight relabelling needs evaluation.probe_horizon_bars >= 1 and env.commission "
                              f">= 0, got {horizon} and {commission}")  # fmt: skip
        labels = device_empty(host.n_rows, np.int32)
        threshold = oracle_threshold(host.tick_size, host.point_value, commission)
        hindsight_labels(market.mid, market.row_stop, host.train_stop, horizon, threshold, labels, stream=self.stream)
        return labels

    def refresh(self) -> None:
        """Broadcast the current per-head supports to every environment's row (once per epoch)."""
        broadcast_supports(self.supports, self.support_rows, stream=self.stream)

    def collect(self, steps: int) -> dict[str, float]:
        """`steps` collect steps queued back to back, the last step's actions into HEALTH_DIAG, then the
        epoch's environment metrics (one sync)."""
        self.refresh()
        for _ in range(steps):
            self.graph.replay()
        self.health.collect_step(self.actions, self.env.reward, stream=self.stream)
        return self.env.read_metrics(stream=self.stream)
