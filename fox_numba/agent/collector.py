"""The collect stage: the environments step with the current online network and fill the replay buffer.

One collect step is one StepGraph (captured on the GPU, eager under the simulator), kernels in order:

    env.observe(obs)                                      obs [N, obs_dim] = market row + portfolio part
    (tick_noise(noise_step)                               network.noisy_sigma0 > 0 only: this step's noise)
    net.forward(params, obs, logits)                      online network, logits [N, 13, Z]
    select_actions(logits, supports, explore=True)        Thompson direction, Boltzmann magnitude/order/urgency
    replay.put_obs(row, port, actions)                    the transition's s and a
    env.step(actions)                                     fills, marks, reward, done, auto-reset
    replay.put_result(reward, done, next_row, next_port)  the transition's r, done and s'; cursor advance
    env.rollout_stats(actions)                            rollout ISV slots (action shares, reward split ...)

The per-head supports [13, 3] are the learner's online supports, refreshed once per epoch; `refresh`
broadcasts them to the per-sample layout action selection reads, outside the graph (the graph keeps the
array's address, not its values). Metrics are reduced on the device and read once per epoch.
With NoisyNet heads the network draws one factorised noise per collect step, shared by every environment,
from the collector's counter `noise_step` (per fold, zero at construction; agent/noisy.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fox_numba.actions import N_BRANCHES, N_HEADS
from fox_numba.agent.environment import VecEnv
from fox_numba.agent.health import HealthDiag
from fox_numba.agent.network import Network, ParamLayout
from fox_numba.agent.noisy import STREAM_COLLECT, NoiseKey
from fox_numba.agent.replay import ReplayBuffer
from fox_numba.device.graphs import StepGraph
from fox_numba.device.memory import device_empty, device_zeros
from fox_numba.device.rng import xoroshiro_states
from fox_numba.device.staging import Stager
from fox_numba.kernels.action_select import select_actions
from fox_numba.kernels.heads import broadcast_supports
from fox_numba.kernels.noisy import tick_noise


class Collector:
    """Collect steps of one fold's collect-mode VecEnv into its replay buffer with the online `params`."""

    def __init__(
        self, env: VecEnv, replay: ReplayBuffer, layout: ParamLayout, params: Any, supports: Any, *,
        stager: Stager, seed: int, use_graph: bool, health: HealthDiag, spread: float = 1.0, tau_mult: float = 1.0,
    ) -> None:
        n, z = env.n, layout.n_atoms
        self.env, self.replay, self.params, self.supports, self.health = env, replay, params, supports, health
        self.stream = stager.stream
        self.spread, self.tau_mult = spread, tau_mult
        self.noise_step = device_zeros(1, np.int64, stream=self.stream) if layout.noisy else None
        noise = NoiseKey(self.noise_step, seed, STREAM_COLLECT) if self.noise_step is not None else None
        self.net = Network(layout, n, stream=self.stream, noise=noise)
        self.obs = device_empty((n, layout.obs_dim), np.float32)
        self.logits = device_empty((n, N_HEADS, z), np.float32)
        self.support_rows = device_empty((n, N_HEADS, 3), np.float32)
        self.actions = device_empty((n, N_BRANCHES), np.int32)
        self.conviction = device_empty(n, np.float32)
        self.rng_states = xoroshiro_states(n, seed, stager)
        self.graph = StepGraph("collect.step", self._step, self.stream, use_graph=use_graph)

    def _step(self, s: Any) -> None:
        env, replay = self.env, self.replay
        env.observe(self.obs, stream=s)
        if self.noise_step is not None:
            tick_noise(self.noise_step, stream=s)
        self.net.forward(self.params, self.obs, self.logits, stream=s)
        select_actions(self.logits, self.support_rows, self.rng_states, self.actions, self.conviction,
                       explore=True, stream=s, spread=self.spread, tau_mult=self.tau_mult)  # fmt: skip
        replay.put_obs(env.row, env.port, self.actions, stream=s)
        env.step(self.actions, stream=s)
        replay.put_result(env.reward, env.done, env.next_row, env.next_port, stream=s)
        env.rollout_stats(self.actions, stream=s)

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
