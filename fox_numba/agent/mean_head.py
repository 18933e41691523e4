"""The direction mean head (network.mean_head): a squared-error value of each direction beside its C51 heads.

    ParamLayout.build(obs_dim, cfg)   with mean_head: mean.head.weight [W, 4], mean.head.bias [4] after every other
                                      entry (init_params: Xavier-uniform, as the C51 head; the bias 0)
    MeanStep(layout, B, weight, ...)  in the learner's step, after the C51 loss: the online head on s and s', the
                                      target head on s', the loss (kernels/mean_head.py), the backward into the
                                      gradient's mean entries and (a trunk) into `dx`, the trunk's input_grad
    MeanActor(layout, n, dense=...)   collect, evaluation and the direction signal: `values` [n, 1, 4], what
                                      select_actions' mean= reads

The head is one dense layer m(x) = x @ W_m + b_m on the C51 heads' input x (the trunk's last layer, or the
observation when n_layers = 0), on the same dense kernels as the rest of the network (agent/dense.py). With
network.mean_cross (the default) x is the observation beside its position x market columns, which the C51 heads do
not read; then Network.mean_input is the observation (beside a Mamba2 or TLOB encoder's columns, which the head's
gradient then reaches, as a trunk's) and the fused kernels of kernels/mean_cross.py form the crossed columns of the
observation's market part as they read it (exact float32 at every run.precision: four outputs fill no GEMM tile).
Its target network is the same entries of the target buffer, so Polyak, shrink-and-perturb, Adam, the clip and
checkpoints treat it as any other parameters, and it holds no other state (no fold-boundary entry).

Why: on the direction branch's own problem (tools/td_probe.py, learner_ablation_h200.md section 32) a C51 head per
direction, read by its E[Q], fitted the forward move about half as well as a squared error on the same inputs, and
the agent's C51 direction values differ by about 0.02 under per-step TD errors of 0.13 (section 31): the
cross-entropy spends its gradient on the return distribution's shape, of which the mean is a small part. The mean
head gives the acting values the squared error's estimator while the C51 heads keep the shape collect's Thompson
draw reads (kernels/action_select.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from fox_numba.actions import N_DIRECTIONS
from fox_numba.agent.dense import WeightGrad, dense_backward_input, dense_forward, dense_kind
from fox_numba.device.memory import device_empty
from fox_numba.device.runtime import device_address
from fox_numba.kernels.learner import BranchRows
from fox_numba.kernels.mean_cross import MeanCrossWeightGrad, mean_cross_forward
from fox_numba.kernels.mean_head import mean_loss, mean_loss_partials_shape
from fox_numba.observation import mirror_parity

if TYPE_CHECKING:
    from fox_numba.agent.network import ParamLayout
    from fox_numba.config import FoxConfig

MEAN_W, MEAN_B = "mean.head.weight", "mean.head.bias"
MEAN_HEAD_PREFIX = "mean.head."  # entries initialised Xavier-uniform, as the C51 head


def mean_entries(width: int) -> list[tuple[str, tuple[int, ...], bool]]:
    """(name, shape, decay) of the mean head's entries over a heads' input of `width` columns."""
    return [(MEAN_W, (width, N_DIRECTIONS), True), (MEAN_B, (N_DIRECTIONS,), False)]


def mean_head_parity(cfg: FoxConfig, layout: ParamLayout) -> np.ndarray:
    """float32 [rows of mean.head.weight]: the market mirror's parity of each input column of the mean head
    (network.mirror, kernels/mirror.py): the observation's (observation.mirror_parity), then its position x market
    columns', each the product of the position's (-1) and the market column's."""
    _check(layout, "network.mirror")
    obs = mirror_parity(cfg.features)
    rows = layout.entry(MEAN_W).shape[0]
    if len(obs) != layout.obs_dim or rows != layout.obs_dim + layout.cross:
        raise ValueError(f"network.mirror: the mean head reads {rows} columns, not the {len(obs)} observation "
                         f"columns and {layout.cross} crossed ones")
    return np.concatenate([obs, -obs[: layout.cross]]).astype(np.float32)


def _check(layout: ParamLayout, owner: str) -> None:
    if not layout.mean_head:
        raise ValueError(f"{owner}: the layout has no mean head (network.mean_head = false)")


class MeanStep:
    """The mean head's part of the learner's step over a batch of B samples (module header), bound to the learner's
    flat parameter, target and gradient buffers; `dense` the dense kernels' kind (agent/dense.py)."""

    def __init__(self, layout: ParamLayout, batch: int, weight: float, *, params: Any, target: Any, grads: Any,
                 dense: str) -> None:
        _check(layout, "MeanStep")
        self.layout, self.weight, self.batch = layout, weight, batch
        self.kind = dense_kind(dense, "MeanStep")
        self._p, self._t, self._g = layout.views(params), layout.views(target), layout.views(grads)
        self.m = device_empty((2 * batch, N_DIRECTIONS), np.float32)  # online: s rows, then s' rows
        self.m_tgt = device_empty((batch, N_DIRECTIONS), np.float32)
        self.dm = device_empty((batch, N_DIRECTIONS), np.float32)
        self.partials = device_empty(mean_loss_partials_shape(batch), np.float64)
        # The gradient into what feeds the head's input: the trunk's last layer, or an encoder's columns of it.
        self._dx_rows = (slice(0, layout.head_in) if layout.n_layers
                         else slice(layout.encoder_col, layout.in_dim) if layout.windowed else None)
        self.dx = (device_empty((batch, self._dx_rows.stop - self._dx_rows.start), np.float32)
                   if self._dx_rows is not None else None)
        self._wgrad = (MeanCrossWeightGrad(batch, layout.head_in, layout.cross) if layout.mean_cross
                       else WeightGrad(self.kind, batch, layout.mean_in, N_DIRECTIONS))

    def run(self, x: Any, x_next: Any, actions: Any, rows: BranchRows, epoch: Any, *, stream: Any) -> None:
        """The forwards, the loss and the backward: x [2B, W] the online network's mean_input on s then s', x_next
        [B, W] the target's on s', `rows` this step's C51 rows (rewards, discounts, weights). With a trunk, self.dx
        is the loss's gradient with respect to the s rows of x (masked by the ReLU of a plain last trunk layer);
        without one, beside an encoder, with respect to the encoder's columns of them."""
        b, p, t, g = self.batch, self._p, self._t, self._g
        _forward(self.layout, self.kind, x, p, self.m, stream)
        _forward(self.layout, self.kind, x_next, t, self.m_tgt, stream)
        mean_loss(self.m, self.m_tgt, actions, rows, self.weight, self.dm, self.partials, epoch, stream=stream)
        x_s = x[:b]
        if self.layout.mean_cross:
            self._wgrad(x_s, self.dm, g[MEAN_W], g[MEAN_B], pos_col=self.layout.position_col, stream=stream)
        else:
            self._wgrad(x_s, self.dm, g[MEAN_W], g[MEAN_B], stream=stream)
        if self.dx is not None:
            act = x_s if self.layout.head_input_relu else None
            dense_backward_input(self.kind, self.dm, p[MEAN_W][self._dx_rows], self.dx, act=act, stream=stream)


class MeanActor:
    """The mean head's direction values for acting on `n` environments: `values` [n, 1, 4] (select_actions'
    mean=), one launch from the acting network's mean_input."""

    def __init__(self, layout: ParamLayout, n: int, *, dense: str) -> None:
        _check(layout, "MeanActor")
        self.layout, self.kind = layout, dense_kind(dense, "MeanActor")
        self.values = device_empty((n, 1, N_DIRECTIONS), np.float32)
        self._out = self.values.reshape(n, N_DIRECTIONS)
        self._views: dict[int, dict[str, Any]] = {}

    def run(self, params: Any, x: Any, *, stream: Any) -> None:
        """self.values of the flat parameters `params` from Network.mean_input x [n, W]."""
        key = device_address(params)
        if key not in self._views:
            self._views[key] = self.layout.views(params)
        _forward(self.layout, self.kind, x, self._views[key], self._out, stream)


def _forward(layout: ParamLayout, kind: str, x: Any, p: dict[str, Any], m: Any, stream: Any) -> None:
    """m = the mean head of the parameter views `p` on its input x (Network.mean_input): the dense layer, or with
    network.mean_cross the fused kernel over the observation x."""
    if layout.mean_cross:
        mean_cross_forward(x, p[MEAN_W], p[MEAN_B], m, n_cross=layout.cross, pos_col=layout.position_col,
                           stream=stream)
    else:
        dense_forward(kind, x, p[MEAN_W], p[MEAN_B], m, relu=False, stream=stream)
