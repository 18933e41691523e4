"""Residual trunk blocks and stochastic depth (network.residual, network.stochastic_depth): the part a Network
composes (formulas and kernels: kernels/depth.py).

    ParamLayout.build(obs_dim, cfg)      cfg.residual or cfg.stochastic_depth > 0: layout.residual (n_layers >= 2)
    Network(layout, rows, depth=StochasticDepth(rate, state, seed))   training: per-row drops of each block
    Network(layout, rows)                every block kept (d = 1): acting, evaluation, the target network

Trunk layer 0 maps the observation to `hidden` units as a plain Linear+ReLU layer; every later layer (in == out ==
hidden) becomes the residual block x_(l+1) = x_l + d_l * relu(x_l W_l + b_l). The parameters are the plain trunk's
(the layout's entries do not change), so the architecture is told apart by ParamLayout.fingerprint.

Stochastic depth (Huang et al. 2016): in the learner's online network each row r drops block l with probability
p_l = stochastic_depth * l / (n_layers - 1) (the last block at stochastic_depth), d_l[r] = 0, and scales a kept
branch by 1 / (1 - p_l), so every network that does not drop (d = 1) sees the branch's expected value. The draw
is a hash of (seed, the optimiser's step counter, layer, row) on the device (kernels/depth.py): no state of its
own, new every step, the same in a re-run. residual = True with stochastic_depth = 0 gives the residual trunk
without drops (an ablation of the architecture alone).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from fox_numba.device.elementwise import fill_f32
from fox_numba.device.launch import i32, launch_strided
from fox_numba.device.memory import device_empty
from fox_numba.kernels.depth import depth_factors, drop_rate, residual_add, residual_branch_grad, residual_skip_grad

if TYPE_CHECKING:
    from fox_numba.agent.network import ParamLayout


@dataclass(frozen=True)
class StochasticDepth:
    """Training drops of the residual blocks: the last block's drop probability, the optimiser state whose step
    keys the draw (read on the device), and the seed."""

    rate: float
    state: Any
    seed: int


class ResidualTrunk:
    """The residual blocks' buffers of one network (module header): branch outputs and per-row keep factors of
    trunk layers 1 .. n_layers - 1, allocated once."""

    def __init__(self, layout: ParamLayout, batch: int, grad_rows: int, depth: StochasticDepth | None, *,
                 stream: Any) -> None:
        if not layout.residual:
            raise ValueError("ResidualTrunk: the layout has no residual blocks (network.residual)")
        self.n_layers, self.depth = layout.n_layers, depth if depth is not None and depth.rate > 0 else None
        blocks = layout.n_layers - 1
        self.branch = device_empty((blocks, batch, layout.hidden), np.float32)  # relu(x W + b) of each block
        self.factors = device_empty((blocks, batch), np.float32)
        flat = self.factors.reshape(self.factors.size)
        launch_strided(fill_f32, flat.size, flat, np.float32(1.0), i32(flat.size), stream=stream)  # kept: d = 1
        self.dz = device_empty((grad_rows, layout.hidden), np.float32)

    def output(self, layer: int) -> Any:
        """The buffer trunk layer `layer`'s dense kernel writes relu(x W + b) into (its branch)."""
        return self.branch[layer - 1]

    def forward(self, layer: int, x: Any, y: Any, *, stream: Any) -> None:
        """y = x + d * branch of trunk layer `layer`, drawing this step's d first in training."""
        d = self.factors[layer - 1]
        if self.depth is not None:
            s = self.depth
            depth_factors(d, s.state, s.seed, layer, drop_rate(s.rate, layer, self.n_layers), stream=stream)
        residual_add(x, self.branch[layer - 1], d, y, stream=stream)

    def branch_grad(self, layer: int, g: Any, *, stream: Any) -> Any:
        """The branch's pre-activation gradient dz = g * d * (branch > 0) from g = dL/d(the block's output)."""
        residual_branch_grad(g, self.factors[layer - 1], self.branch[layer - 1], self.dz, stream=stream)
        return self.dz

    @staticmethod
    def skip_grad(dx: Any, g: Any, x: Any, *, mask: bool, stream: Any) -> None:
        """dL/dx = dz W^T (in dx) + g, masked by x > 0 when x is a plain ReLU layer's output."""
        residual_skip_grad(dx, g, x, mask=mask, stream=stream)
