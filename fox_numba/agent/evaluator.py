"""The evaluate stage: a backtest of the deterministic policy over the fold's validation days, on the device.

One evaluation environment per validation day (VecEnv in eval mode: it starts flat at the day's first bar,
trades with the same fill model as training, is closed at market on the day's last bar, then stays
frozen). Every step, for all days at once:

    env.observe(obs)                                   the portfolio part exact at every step
    net.forward(params, obs)                           the online network's head GEMM rows (with an encoder over
                                                       past bars, Mamba2 or TLOB: encoded= the step's rows of the
                                                       chunk's cache, below)
    (iqn.run(head input)                               network.iqn_quantiles > 0 only: E_IQN per direction over
                                                       fixed midpoint levels, agent/iqn.py IqnActor)
    (mean.run(head input)                              network.mean_head only: the directions' mean values,
                                                       agent/mean_head.py MeanActor)
    select_actions(head rows, supports, explore=False) the dueling combine in shared memory, then argmax E[Q] in
                                                       every branch (no RNG; the direction's
                                                       joint with E_IQN, or the mean head's value, when on;
                                                       env.fixed_bins fix branches)
    env.step(actions)
    record_eval_step(...)                              PnL (dollars) and position of the step, per day
    health.eval_step(actions, counts)                  HEALTH_DIAG's per-day action tallies (optional)

The network is the online one or, with evaluation.network = 'target', the target (a Polyak average of the
online weights): `eval_network` names the learner state arrays (and checkpoint arrays) it reads.

The steps run in chunks of `evaluation.chunk_bars`: one StepGraph holds a whole chunk of steps (a second
one the remainder), so a validation pass is a few dozen graph launches and one download of the per-step records at
the end; the step index the records are written at lives in a device counter. A StepGraph's first replay runs eagerly
and its second captures, both launching every kernel from Python: a fold's evaluator is built per fold and the
default trains two epochs, so a chunk as long as the day would never be replayed as a graph. Short chunks make those
two passes cheap: the first pass replays the chunk's graph from its third chunk on. The records become one
`walkforward.metrics.DaySeries`-shaped (pnl, position) pair per day for the metrics.

A network with an encoder over past bars (network.mamba2_window, network.tlob_window) encodes each chunk's rows
once, as the seed's backtest does: an environment's encoder output depends only on its row, and the row of day d at
step k is known in advance (min(first_d + k, last_d): one bar per step, then frozen; VecEnv.eval_rows). The rows of
every chunk, step-major [chunk steps x days] (the last chunk's padded with the frozen rows), are uploaded once at
construction; each chunk's graph first runs the encoder alone over its chunk_bars x days rows (Network.encode into
the network's encoder cache), then its steps join their slice of the cache (forward(..., encoded=net.encoded(k))):
the same numbers, bit for bit, as encoding each step's rows. The chunks' rows differ, so each chunk is a StepGraph
of its own (replayed once per pass). The cache's buffers grow with chunk_bars x days (the encoder's activations of
that many windows): evaluation.chunk_bars bounds them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fox_numba.actions import N_BRANCHES, N_HEADS
from fox_numba.agent.dense import precision_dense
from fox_numba.agent.environment import VecEnv
from fox_numba.agent.fold_market import FoldMarketDevice
from fox_numba.agent.health import HealthDiag
from fox_numba.agent.iqn import IqnActor
from fox_numba.agent.mean_head import MeanActor
from fox_numba.agent.network import Network, ParamLayout
from fox_numba.agent.spectral import read_only
from fox_numba.config import EnvConfig, FoxConfig
from fox_numba.device.elementwise import fill_u32
from fox_numba.errors import ConfigError
from fox_numba.device.graphs import StepGraph
from fox_numba.device.launch import i32, launch_strided
from fox_numba.device.memory import device_empty, device_zeros, words
from fox_numba.device.rng import xoroshiro_states
from fox_numba.device.staging import Stager
from fox_numba.kernels.action_select import check_fixed_bins, select_actions
from fox_numba.kernels.evaluation import record_eval_step
from fox_numba.kernels.heads import broadcast_supports


EVAL_NETWORKS: dict[str, tuple[str, str]] = {
    "online": ("params", "support_online"),
    "target": ("target_params", "support_target"),
    "average": ("average_params", "support_average"),
}
"""evaluation.network -> (parameters, supports): names of Learner.state_arrays, and of checkpoint arrays
under "learner."."""


def fixed_bins(env: EnvConfig) -> tuple[int, ...]:
    """env.fixed_bins checked: the bins collect and evaluation fix after direction (ConfigError naming the key)."""
    try:
        return check_fixed_bins(env.fixed_bins)
    except ValueError as e:
        raise ConfigError(f"env.fixed_bins: {e}") from None


def eval_network(name: str) -> tuple[str, str]:
    """The state names of the parameters and supports evaluation.network = `name` trades with."""
    if name not in EVAL_NETWORKS:
        raise ConfigError(f"evaluation.network is {name!r}; choose one of {', '.join(map(repr, EVAL_NETWORKS))}")
    return EVAL_NETWORKS[name]


class Evaluator:
    """The validation backtest of one fold (module docstring)."""

    def __init__(
        self, market: FoldMarketDevice, cfg: FoxConfig, layout: ParamLayout, params: Any, supports: Any, *,
        isv: Any, stager: Stager, use_graph: bool, health: HealthDiag | None = None, spectral_uv: Any = None,
    ) -> None:
        """`spectral_uv`: the spectral-norm vectors the network reads as they are (network.spectral_norm)."""
        if cfg.evaluation.chunk_bars < 1:
            raise ValueError(f"evaluation.chunk_bars must be at least 1, got {cfg.evaluation.chunk_bars}")
        if not cfg.evaluation.hold_margin >= 0:
            raise ValueError(f"evaluation.hold_margin must be >= 0, got {cfg.evaluation.hold_margin}")
        self.env = VecEnv(market, cfg.env, cfg.features, isv, stager=stager, mode="eval")
        n = self.env.n
        self.steps = self.env.eval_steps
        windows = market.host.val_windows[:n]
        self.day_steps = (windows[:, 1] - windows[:, 0] - 1).astype(int)
        """Steps of each validation day (one per bar but the last, where the day is closed)."""
        self.params, self.supports, self.health = params, supports, health
        self.stager, self.stream = stager, stager.stream
        chunk = min(cfg.evaluation.chunk_bars, self.steps)
        starts = range(0, self.steps, chunk)
        self.net = Network(layout, n, stream=self.stream, spectral=read_only(spectral_uv),
                           dense=precision_dense(cfg.run.precision), cache_samples=chunk * n if layout.windowed else 0)
        self.chunk_rows: Any = None
        """int32 [chunks, chunk x days]: each chunk's rows, step-major (a layout with an encoder only)."""
        if layout.windowed:  # the encoder's windows end at each environment's row
            self.net.bind_market(market.market_obs, market.day_first, market.book_obs)
            rows = self.env.eval_rows(len(starts) * chunk)
            self.chunk_rows = stager.upload_new(rows.reshape(len(starts), chunk * n))
        self.obs = device_empty((n, layout.obs_dim), np.float32)
        self.support_rows = device_empty((n, N_HEADS, 3), np.float32)
        self.actions = device_empty((n, N_BRANCHES), np.int32)
        self.conviction = device_empty(n, np.float32)
        self.rng_states = xoroshiro_states(n, 0, stager)  # argmax draws nothing; the kernel takes states
        self.fixed_bins = fixed_bins(cfg.env)
        self.hold_margin = cfg.evaluation.hold_margin
        self.iqn = (IqnActor(layout, n, cfg.network.iqn_quantiles, explore=False)
                    if layout.iqn else None)
        self.mean = MeanActor(layout, n, dense=precision_dense(cfg.run.precision)) if layout.mean_head else None
        self.pnl = device_zeros((self.steps, n), np.float32, stream=self.stream)
        self.pos = device_zeros((self.steps, n), np.int32, stream=self.stream)
        self.counter = device_zeros(1, np.int32, stream=self.stream)
        self.counts = HealthDiag.eval_counts(n, stream=self.stream) if health is not None else None
        if layout.windowed:  # each chunk encodes its own rows first: one graph per chunk
            self.chunks = [(StepGraph(f"evaluate.chunk{c}", self._steps(min(chunk, self.steps - k0), c), self.stream,
                                      use_graph=use_graph), 1) for c, k0 in enumerate(starts)]
        else:  # the same steps every chunk: one graph replayed, a second for the remainder
            full, rest = divmod(self.steps, chunk)
            self.chunks = [(StepGraph("evaluate.chunk", self._steps(chunk), self.stream, use_graph=use_graph), full)]
            if rest:
                self.chunks.append((StepGraph("evaluate.rest", self._steps(rest), self.stream, use_graph=use_graph),
                                    1))

    def _forward(self, s: Any, k: int) -> None:
        """The head rows of the observations of step `k` of a chunk (the encoder's part from the chunk's cache)."""
        encoded = self.net.encoded(k) if self.chunk_rows is not None else None
        self.net.forward(self.params, self.obs, None, stream=s, encoded=encoded)

    def _step(self, s: Any, k: int) -> None:
        """Step `k` of its chunk."""
        env = self.env
        env.observe(self.obs, stream=s)
        self._forward(s, k)
        if self.iqn is not None:
            self.iqn.run(self.params, self.net.head_input(env.n), self.rng_states, stream=s)
        if self.mean is not None:
            self.mean.run(self.params, self.net.mean_input(env.n), stream=s)
        select_actions(self.net.head_out, self.support_rows, self.rng_states, self.actions, self.conviction,
                       explore=False, stream=s, fixed=self.fixed_bins, hold_margin=self.hold_margin,
                       iqn=None if self.iqn is None else self.iqn.values,
                       mean=None if self.mean is None else self.mean.values)  # fmt: skip
        env.step(self.actions, stream=s)
        record_eval_step(env.comps, env.si, env.params, self.counter, self.pnl, self.pos, stream=s)
        if self.health is not None:
            self.health.eval_step(self.actions, self.counts, stream=s)

    def _steps(self, n: int, chunk: int | None = None) -> Any:
        """A step body of `n` evaluation steps (one captured graph); with `chunk` (a layout with an encoder), the
        encoder over that chunk's rows first."""

        def body(s: Any) -> None:
            if chunk is not None:
                self.net.encode(self.params, self.chunk_rows[chunk], stream=s)
            for k in range(n):
                self._step(s, k)

        return body

    def run(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Backtest every validation day with the current parameters: [(pnl dollars float64 [steps_d],
        position int32 [steps_d])] per day, in day order."""
        s = self.stream
        self.env.reset(stream=s)
        self.env.clear_metrics(stream=s)
        w = words(self.counter)
        launch_strided(fill_u32, w.size, w, np.uint32(0), i32(w.size), stream=s)
        broadcast_supports(self.supports, self.support_rows, stream=s)
        for graph, replays in self.chunks:
            for _ in range(replays):
                graph.replay()
        if self.health is not None:
            self.health.eval_done(self.counts, stream=s)
        pnl = self.stager.download(self.pnl).astype(np.float64)
        pos = self.stager.download(self.pos)
        return [(pnl[:k, d], pos[:k, d]) for d, k in enumerate(self.day_steps)]

    def metrics(self) -> dict[str, float]:
        """The environment metrics of the last `run` (turnover, fill rate, mean |position| ...)."""
        return self.env.read_metrics(stream=self.stream)
