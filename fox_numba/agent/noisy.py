"""NoisyNet heads (network.noisy_sigma0 > 0): the sigma entries of the parameter layout, their initialisation,
and the noisy head a Network composes (formulas and kernels: kernels/noisy.py).

    ParamLayout.build(obs_dim, cfg)         with noisy_sigma0 > 0: head.weight_sigma, head.bias_sigma after head.bias
    init_params(layout, seed)               sigma = noisy_sigma0 / sqrt(fan_in), 0 on the auxiliary column
    Network(layout, rows, noise=NoiseKey(counter, seed, stream_id))   the head reads mu + sigma * noise
    Network(layout, rows)                   the head reads mu alone: noise off (evaluation, the direction signal)

head.weight and head.bias stay the mu of the noisy layer, so the off layout is the on layout's prefix and
everything that reads the head's weights by name (evaluation, checkpoints' consumers) reads mu. The sigma
entries do not decay (weight decay would pull the exploration towards 0 regardless of the loss).

Who draws when (every draw on the device, inside the step's graph; `tick_noise` advances a counter and the
draw is a function of (seed, counter, stream_id)):
- the learner: one counter (Learner.noise_step, carried across folds), ticked first in every gradient step;
  the online network draws stream 0 and the target network stream 1, independent noises (as the paper's
  Double DQN variant);
- the collector: its own counter (Collector.noise_step, per fold), ticked every collect step; every
  environment of a collect step shares that step's draw (one network sample per step, as a batch of actors
  sharing one weight sample; per-environment noise would need a GEMM per environment);
- evaluation: no noise (mu only), so a validation backtest stays a deterministic function of the parameters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from fox_numba.device.memory import device_empty
from fox_numba.kernels.heads import N_STREAMS
from fox_numba.kernels.noisy import draw_noise, noise_len, noisy_grads, noisy_weights

if TYPE_CHECKING:
    from fox_numba.agent.network import ParamLayout

WEIGHT_SIGMA, BIAS_SIGMA = "head.weight_sigma", "head.bias_sigma"
STREAM_ONLINE, STREAM_TARGET, STREAM_COLLECT = 0, 1, 2
"""stream_id of each network's draws (kernels/noisy.py)."""


def sigma_entries(width: int, head_out: int) -> list[tuple[str, tuple[int, ...], bool]]:
    """(name, shape, decay) of the sigma entries of a head of `width` inputs and `head_out` columns."""
    return [(WEIGHT_SIGMA, (width, head_out), False), (BIAS_SIGMA, (head_out,), False)]


def init_sigma(flat: np.ndarray, layout: ParamLayout) -> None:
    """sigma_W and sigma_b = noisy_sigma0 / sqrt(fan_in) on the stream columns, 0 on the auxiliary column."""
    w, b = layout.entry(WEIGHT_SIGMA), layout.entry(BIAS_SIGMA)
    fan_in, head_out = w.shape
    sigma = np.zeros(head_out, np.float32)
    sigma[: N_STREAMS * layout.n_atoms] = layout.noisy_sigma0 / math.sqrt(fan_in)
    flat[w.offset : w.stop] = np.tile(sigma, fan_in)
    flat[b.offset : b.stop] = sigma


@dataclass(frozen=True)
class NoiseKey:
    """What a network's draws are a function of: the device counter int64 [1], the seed and the stream id."""

    counter: Any
    seed: int
    stream_id: int


class NoisyHead:
    """The noise draw and the effective head weights of one network (module header), its buffers allocated once."""

    def __init__(self, layout: ParamLayout, key: NoiseKey) -> None:
        if not layout.noisy:
            raise ValueError("NoisyHead: the layout has no sigma entries (network.noisy_sigma0 = 0)")
        self.key = key
        w = layout.entry("head.weight")
        self.n_in, self.n_out = w.shape
        self.f_eps = device_empty(noise_len(self.n_in, self.n_out), np.float32)
        self.weight = device_empty(w.shape, np.float32)
        self.bias = device_empty(self.n_out, np.float32)

    def forward(self, p: dict[str, Any], *, stream: Any) -> tuple[Any, Any]:
        """Draw this step's noise and write the effective (weight, bias) of the head from the views `p`."""
        k = self.key
        draw_noise(self.f_eps, k.counter, k.seed, k.stream_id, self.n_in, self.n_out, stream=stream)
        noisy_weights(p["head.weight"], p[WEIGHT_SIGMA], p["head.bias"], p[BIAS_SIGMA], self.f_eps, self.weight,
                      self.bias, stream=stream)
        return self.weight, self.bias

    def backward(self, g: dict[str, Any], *, stream: Any) -> None:
        """The sigma gradients in the views `g` from the head's weight and bias gradients (mu's, as they are)."""
        noisy_grads(g["head.weight"], g["head.bias"], self.f_eps, g[WEIGHT_SIGMA], g[BIAS_SIGMA], stream=stream)
