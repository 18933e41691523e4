"""The agent's direction signal: E[Q(long)] - E[Q(short)] of the direction branch at every bar of a fold, read
from a flat portfolio (no position, no resting order, a whole episode ahead).

What it is for (tools/signal_probe.py): traded by the oracle's rule after a one-column fit on the training rows,
as the probe trades its forecast (walkforward/probe.py), it separates what the agent knows from how it trades.
A signal that earns about the probe's figure while the policy does not points at the trading (sizing, order
type, urgency, costs); a signal that does not points at the estimate itself.

On the device, `chunk` rows at a time (so any fold fits one allocation):

    gather_obs(market_obs, rows, flat_port, obs)      the market row of each bar beside a flat portfolio
    net.forward(params, obs, logits)                  the network the backtests trade with
    expected_q(logits, supports, q)                   E[Q] of every head
    (iqn.run(params, head input)                      network.iqn_quantiles > 0 only: E_IQN of the directions
                                                      over the midpoint levels, agent/iqn.py IqnActor)
    (mean.run(params, head input)                     network.mean_head only: the directions' mean values,
                                                      agent/mean_head.py MeanActor)
    signal = q[:, LONG] - q[:, SHORT]                 downloaded once per chunk, float64 on the host

With the IQN head the signal is the difference of the joint values evaluation acts on, e_d = (E_C51[d] +
E_IQN[d]) / 2 (kernels/action_select.py): e_long - e_short; with the mean head, the difference of its values,
m_long - m_short, which evaluation acts on.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fox_numba.actions import DIR_OFFSET, LONG, N_DIRECTIONS, N_HEADS, SHORT
from fox_numba.agent.iqn import IqnActor
from fox_numba.agent.mean_head import MeanActor
from fox_numba.agent.network import Network, ParamLayout
from fox_numba.agent.spectral import read_only
from fox_numba.device.memory import device_empty
from fox_numba.device.rng import xoroshiro_states
from fox_numba.device.staging import Stager
from fox_numba.kernels.action_select import IQN_MIX
from fox_numba.kernels.distributional import expected_q
from fox_numba.kernels.env import gather_obs
from fox_numba.kernels.heads import broadcast_supports
from fox_numba.observation import N_PORTFOLIO, PORT_BARS_LEFT

SIGNAL_CHUNK = 4096
"""Rows per forward pass."""


def flat_portfolio() -> np.ndarray:
    """float32 [N_PORTFOLIO]: the portfolio part of a flat environment at an episode's first bar."""
    port = np.zeros(N_PORTFOLIO, np.float32)
    port[PORT_BARS_LEFT] = 1.0
    return port


class DirectionSignal:
    """Computes the direction signal of every row of a fold's market_obs (module docstring)."""

    def __init__(
        self, layout: ParamLayout, *, stager: Stager, chunk: int = SIGNAL_CHUNK, iqn_quantiles: int = 0,
        spectral_uv: Any = None,
    ) -> None:
        """`iqn_quantiles` (network.iqn_quantiles): E_IQN's midpoint levels when the layout has an IQN head;
        `spectral_uv` the spectral-norm vectors, read as they are (network.spectral_norm)."""
        if chunk < 1:
            raise ValueError(f"DirectionSignal: chunk must be at least 1, got {chunk}")
        self.layout, self.stager, self.chunk, self.stream = layout, stager, chunk, stager.stream
        z = layout.n_atoms
        self.net = Network(layout, chunk, stream=self.stream, spectral=read_only(spectral_uv))
        self.port = stager.upload_new(np.tile(flat_portfolio(), (chunk, 1)))
        self.obs = device_empty((chunk, layout.obs_dim), np.float32)
        self.logits = device_empty((chunk, N_HEADS, z), np.float32)
        self.support_rows = device_empty((chunk, N_HEADS, 3), np.float32)
        self.q = device_empty((chunk, N_HEADS), np.float32)
        self.entropy = device_empty((chunk, N_HEADS), np.float32)
        self.iqn = (IqnActor(layout, chunk, iqn_quantiles, explore=False)
                    if layout.iqn else None)
        self.rng_states = xoroshiro_states(chunk, 0, stager) if layout.iqn else None  # the midpoints draw nothing
        self.mean = MeanActor(layout, chunk, dense="auto") if layout.mean_head else None

    def compute(self, market_obs: Any, params: Any, supports: Any, day_first: Any = None,
                book_obs: Any = None) -> np.ndarray:
        """float64 [n]: the signal of every row of market_obs [n, M] (device) under `params` and the per-head
        `supports` [N_HEADS, 3]; `day_first` [n] (device, FoldMarketDevice.day_first): where the encoders' windows
        stop, needed with network.mamba2_window or tlob_window; `book_obs` [n, BOOK_FEATURES] (device,
        FoldMarketDevice.book_obs): the TLOB encoder's snapshots, needed with network.tlob_window."""
        n, c, s = int(market_obs.shape[0]), self.chunk, self.stream
        if self.layout.windowed:
            if day_first is None:
                raise ValueError("DirectionSignal.compute: the Mamba2 or TLOB encoder (network.mamba2_window, "
                                 "tlob_window) needs day_first")
            self.net.bind_market(market_obs, day_first, book_obs)
        broadcast_supports(supports, self.support_rows, stream=s)
        out = np.empty(n, np.float64)
        for start in range(0, n, c):
            stop = min(start + c, n)
            rows = np.minimum(np.arange(start, start + c), n - 1).astype(np.int32)  # the tail repeats the last row
            rows_dev = self.stager.upload_new(rows)
            gather_obs(market_obs, rows_dev, self.port, self.obs, stream=s)
            self.net.forward(params, self.obs, self.logits, stream=s, rows=rows_dev)
            expected_q(self.logits, self.support_rows, self.q, self.entropy, stream=s)
            q = self.stager.download(self.q).astype(np.float64)
            if self.iqn is not None:
                self.iqn.run(params, self.net.head_input(c), self.rng_states, stream=s)
                e_iqn = self.stager.download(self.iqn.values)[:, 0].astype(np.float64)
                q = float(IQN_MIX) * (q[:, DIR_OFFSET : DIR_OFFSET + N_DIRECTIONS] + e_iqn)  # the joint values
            if self.mean is not None:
                self.mean.run(params, self.net.mean_input(c), stream=s)
                q = self.stager.download(self.mean.values)[:, 0].astype(np.float64)  # the values evaluation reads
            out[start:stop] = (q[:, LONG] - q[:, SHORT])[: stop - start]
        return out
