"""The implicit-quantile (IQN) head beside the C51 heads (network.iqn_quantiles > 0): its parameter entries, the
head of one network, and the learner's part of the step (formulas and kernels: kernels/iqn.py).

    ParamLayout.build(obs_dim, cfg)   with iqn_quantiles > 0: iqn.embed.weight [E, W], iqn.embed.bias [W],
                                      iqn.head.weight [W, 13], iqn.head.bias [13] after every other entry
    init_params(layout, seed)         the embedding Kaiming-uniform (a ReLU follows), the head Xavier-uniform, biases 0
    IqnStep(layout, B, N, ...)        in the learner's step, after the C51 loss: draw the levels, run the online head
                                      on s and the target head on s', the loss and its signal, the backward
    IqnActor(layout, n, N, explore=e) collect (e), evaluation and the direction signal: each direction's E_IQN over N
                                      midpoint levels and (collect) one quantile at a drawn level (select_actions' iqn=)

Why beside C51: the seed trained "C51+IQN" heads and specified acting on both ("Training: argmax of (sample_C51 +
sample_IQN) per direction (Thompson); Eval: argmax of (E_C51 + E_IQN) per direction"). The quantile loss needs no
support, so the IQN head sees the returns the adaptive C51 support clips. The direction branch acts on the joint
values (kernels/action_select.py) and the direction signal reads them (agent/direction_signal.py); magnitude, order
type and urgency act on C51 alone.

The head reads the same input x as the C51 heads (the trunk's last layer, or the observation when n_layers = 0,
the default), one quantile value per action head (no dueling): Z(x, tau) = (x * phi(tau)) @ W_q + b_q. Its
gradient reaches a trunk through x (Network.backward's input_grad). The target network's head is the same entries
of the target buffer, so Polyak, shrink-and-perturb, Adam, the clip and checkpoints treat the IQN parameters as
any others; the head holds no other state (its levels are drawn from the learner's generators), so it adds no
fold-boundary entry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from fox_numba.actions import N_BRANCHES, N_DIRECTIONS, N_HEADS
from fox_numba.device.memory import device_empty
from fox_numba.device.runtime import device_address
from fox_numba.kernels.iqn import (
    act_levels,
    act_values,
    backward_blocks,
    check_head,
    draw_taus,
    head_backward,
    head_forward,
    loss_signal,
    quantile_loss,
)
from fox_numba.kernels.learner import BranchRows

if TYPE_CHECKING:
    from fox_numba.agent.network import ParamLayout

EMBED_W, EMBED_B = "iqn.embed.weight", "iqn.embed.bias"
HEAD_W, HEAD_B = "iqn.head.weight", "iqn.head.bias"
IQN_HEAD_PREFIX = "iqn.head."  # entries initialised Xavier-uniform (as the C51 head), the embedding Kaiming


def iqn_entries(n_embed: int, width: int) -> list[tuple[str, tuple[int, ...], bool]]:
    """(name, shape, decay) of the IQN entries: n_embed cosine features, heads' input of `width` columns."""
    return [(EMBED_W, (n_embed, width), True), (EMBED_B, (width,), False),
            (HEAD_W, (width, N_HEADS), True), (HEAD_B, (N_HEADS,), False)]


class IqnHead:
    """The IQN head of one network over `batch` samples x `n_taus` levels (rows r = i * n_taus + k), one fused
    kernel each way (kernels/iqn.py); with `grad`, also its backward's buffers: dx and the blocks' partial sums.
    Buffers are allocated once (the step is a captured graph)."""

    def __init__(self, layout: ParamLayout, batch: int, n_taus: int, *, grad: bool) -> None:
        if not layout.iqn:
            raise ValueError("IqnHead: the layout has no IQN entries (network.iqn_quantiles = 0)")
        check_head(layout.iqn_embed, n_taus)
        rows, width, embed = batch * n_taus, layout.head_in, layout.iqn_embed
        self.rows = rows
        self.z = device_empty((rows, N_HEADS), np.float32)
        self._x: Any = None
        self._taus: Any = None
        if grad:
            self.dx = device_empty((batch, width), np.float32)
            size = embed * width + width + width * N_HEADS + N_HEADS  # the four IQN entries, in layout order
            self.part = device_empty((backward_blocks(batch, n_taus), size), np.float32)

    def forward(self, p: dict[str, Any], x: Any, taus: Any, *, stream: Any) -> None:
        """self.z [rows, 13] = Z(x_i, tau_ik) from the parameter views `p`, x [batch, W], taus [batch, n_taus]."""
        self._x, self._taus = x, taus.reshape(self.rows)
        head_forward(self._taus, x, p[EMBED_W], p[EMBED_B], p[HEAD_W], p[HEAD_B], self.z, stream=stream)

    def backward(self, p: dict[str, Any], g: dict[str, Any], dz: Any, *, mask_input: bool, stream: Any) -> None:
        """The IQN entries of the gradient views `g` from dz [rows, 13] = dL/dz of the last forward, and self.dx
        [batch, W] = dL/dx (0 where x <= 0 when `mask_input`: x is a plain trunk layer's ReLU output)."""
        if self._x is None:
            raise RuntimeError("IqnHead.backward needs a forward first")
        head_backward(self._taus, self._x, p[EMBED_W], p[EMBED_B], p[HEAD_W], dz, self.part, self.dx,
                      (g[EMBED_W], g[EMBED_B], g[HEAD_W], g[HEAD_B]), mask=mask_input, stream=stream)


class IqnStep:
    """The IQN part of the learner's step over a batch of B samples and N levels (module header), bound to the
    learner's flat parameter, target and gradient buffers."""

    def __init__(self, layout: ParamLayout, batch: int, n_taus: int, weight: float, *, params: Any, target: Any,
                 grads: Any) -> None:
        self.layout, self.weight = layout, weight
        self._p, self._t, self._g = layout.views(params), layout.views(target), layout.views(grads)
        self.taus = device_empty((2, batch, n_taus), np.float32)  # online levels, then target levels
        self.online = IqnHead(layout, batch, n_taus, grad=True)
        self.target = IqnHead(layout, batch, n_taus, grad=False)
        self.loss = device_empty(N_BRANCHES * batch, np.float32)
        self.dz = device_empty((batch * n_taus, N_HEADS), np.float32)

    def run(self, x: Any, x_next: Any, q: Any, actions: Any, rows: BranchRows, rng_states: Any, isv: Any,
            epoch: Any, *, bootstrap: str, stream: Any) -> None:
        """Levels, both heads, the loss, its signal and the backward into the gradient's IQN entries and
        self.online.dx: x [B, W] the online heads' input on s, x_next [B, W] the target's on s', q [2B, 13] the
        online E[Q] of s then s', `rows` the C51 rows of this step (rewards, discounts, weights)."""
        draw_taus(rng_states, self.taus, stream=stream)
        self.online.forward(self._p, x, self.taus[0], stream=stream)
        self.target.forward(self._t, x_next, self.taus[1], stream=stream)
        quantile_loss(self.online.z, self.target.z, self.taus[0], q, actions, rows, self.weight, self.loss, self.dz,
                      bootstrap=bootstrap, stream=stream)
        loss_signal(self.loss, rows.weights, isv, epoch, stream=stream)
        self.online.backward(self._p, self._g, self.dz, mask_input=self.layout.head_input_relu, stream=stream)


class IqnActor:
    """The IQN head's direction values for acting on `batch` environments: E_IQN over `n_mid` midpoint levels and,
    exploring (collect), one quantile per direction at a level drawn from the environments' generators, by one
    fused kernel that computes only the 4 direction outputs (kernels/iqn.py). `values` [batch, 2, 4] is what
    select_actions' `iqn=` reads."""

    def __init__(self, layout: ParamLayout, batch: int, n_mid: int, *, explore: bool) -> None:
        if n_mid < 1:
            raise ValueError(f"IqnActor: network.iqn_quantiles must be >= 1, got {n_mid}")
        levels = n_mid + (N_DIRECTIONS if explore else 0)
        check_head(layout.iqn_embed, n_mid, levels)
        self.layout, self.n_mid, self.explore = layout, n_mid, explore
        self.taus = device_empty((batch, levels), np.float32)
        self.values = device_empty((batch, 2, N_DIRECTIONS), np.float32)
        self._views: dict[int, dict[str, Any]] = {}

    def run(self, params: Any, x: Any, states: Any, *, stream: Any) -> None:
        """self.values of the flat parameters `params` from the heads' input x [batch, W] (the acting network's
        `head_input`); `states` [>= batch] xoroshiro, read only when exploring."""
        key = device_address(params)
        if key not in self._views:
            self._views[key] = self.layout.views(params)
        p = self._views[key]
        act_levels(states, self.taus, self.n_mid, explore=self.explore, stream=stream)
        act_values(self.taus, x, p[EMBED_W], p[EMBED_B], p[HEAD_W], p[HEAD_B], self.values, self.n_mid,
                   stream=stream)
