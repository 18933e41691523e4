"""Variable-selection network (network.vsn): a per-sample softmax gate over the observation's feature groups, the
part a Network composes in front of its trunk (formulas and kernels: kernels/vsn.py).

    groups = observation_groups(features)                      (name, begin, end) per group, from observation.py
    ParamLayout.build(obs_dim, cfg)                            cfg.vsn: entries vsn.weight [D, K], vsn.bias [K]
    Network(layout, rows, isv=bus)                             the gate runs in every forward; `isv`: its focus EMAs

The gate: logits g = x W_g + b_g (a dense layer [obs_dim -> K]), weights w = softmax(g) per row, and the gated
observation x'_c = K w_k(c) x_c for each column c of group k(c); the trunk (or, without one, the heads) reads x'.
The factor K makes a uniform gate the identity, and W_g, b_g start at 0 (`init_params`), so a fresh VSN network
computes the plain network's function and learns which groups to amplify or mute per sample; weight decay and the
fold boundary's shrink-and-perturb (fresh gate 0) pull the gate towards uniform. Backward: the gate's parameters
take their gradient through the softmax; the observation takes none (it is data). The IQN head's gradient reaches
the gate through a trunk only, so a VSN layout with an IQN head needs n_layers >= 1.

The groups are contiguous column ranges that tile the observation in order, defined from its one source of truth
(observation.py, features/names.py): the bar's own features split into `ofi` (ofi_l1 .. ofi_multi_sum5), `trade`
(trade imbalance, volume, trade count) and `bar` (returns, range, volatility, spread, book shape, time of day), then
`history` (every EMA column of the features), `tw_imbalance` (the time-weighted book imbalance block, z and EMAs,
with features.tw_imbalance), `forecast` (the forecast columns, when features.forecast_horizons has any) and
`portfolio`. The ranges are the seed's vsn_group_begins / vsn_group_ends buffers, held on the device.

Focus signals: the learner's online network (given the ISV bus) folds, after each forward, the batch mean of the
largest gate weight and of the normalised gate entropy over its s rows into ISV[VSN_FOCUS_MAX_EMA] (87) and
ISV[VSN_FOCUS_ENTROPY_EMA] (88), which HEALTH_DIAG mirrors (vsn_focus_max, vsn_focus_entropy). They are
diagnostics; nothing reads them in the step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from fox_numba.agent.dense import WeightGrad, dense_backward_input, dense_forward
from fox_numba.config import FeatureConfig
from fox_numba.device.elementwise import axpy_f32
from fox_numba.device.launch import check_array, i32, launch_strided
from fox_numba.device.memory import Mapped, copy_device, device_empty
from fox_numba.features.names import FEATURE_NAMES
from fox_numba.kernels.vsn import MAX_GROUPS, vsn_apply, vsn_focus, vsn_gate_grad, vsn_softmax
from fox_numba.observation import N_FEATURES, N_MARKET, N_PORTFOLIO, feature_columns, market_columns

if TYPE_CHECKING:
    from fox_numba.agent.network import ParamLayout

VSN_PREFIX = "vsn."
TRADE_FEATURES = ("trade_imbalance", "trade_imbalance_sum5", "log_volume", "log_trade_count")
"""The bar features of the `trade` group; the `ofi` group is every feature named ofi_*, `bar` the rest."""


@dataclass(frozen=True)
class VsnGroup:
    """One gate group: its name and its observation columns [begin, end)."""

    name: str
    begin: int
    end: int


def _feature_group(name: str) -> str:
    return "ofi" if name.startswith("ofi_") else "trade" if name in TRADE_FEATURES else "bar"


def observation_groups(features: FeatureConfig) -> tuple[VsnGroup, ...]:
    """The gate groups of the observation under `features` (module header)."""
    groups: list[VsnGroup] = []
    for c, name in enumerate(FEATURE_NAMES):
        kind = _feature_group(name)
        if groups and groups[-1].name == kind:
            groups[-1] = VsnGroup(kind, groups[-1].begin, c + 1)
        elif any(g.name == kind for g in groups):
            raise ValueError(f"feature {name!r} (column {c}) splits the VSN group {kind!r}: its columns must be "
                             "contiguous in features/names.py")
        else:
            groups.append(VsnGroup(kind, c, c + 1))
    groups.append(VsnGroup("history", N_FEATURES, N_MARKET))
    features_end, market_end = feature_columns(features), market_columns(features)
    if features_end > N_MARKET:
        groups.append(VsnGroup("tw_imbalance", N_MARKET, features_end))
    if market_end > features_end:
        groups.append(VsnGroup("forecast", features_end, market_end))
    groups.append(VsnGroup("portfolio", market_end, market_end + N_PORTFOLIO))
    return tuple(groups)


def check_groups(bounds: tuple[tuple[int, int], ...], obs_dim: int) -> None:
    """Refuse column ranges that do not tile [0, obs_dim) in order with 2 .. MAX_GROUPS non-empty groups."""
    starts = [0] + [end for _, end in bounds[:-1]]
    if (not 2 <= len(bounds) <= MAX_GROUPS or [b for b, _ in bounds] != starts or bounds[-1][1] != obs_dim
            or any(end <= begin for begin, end in bounds)):
        raise ValueError(f"VSN groups {bounds} must be 2 .. {MAX_GROUPS} non-empty column ranges that tile "
                         f"[0, {obs_dim}) in order")


def vsn_entries(obs_dim: int, n_groups: int) -> list[tuple[str, tuple[int, ...], bool]]:
    """(name, shape, decays) of the gate's layout entries: its dense layer [obs_dim -> n_groups]."""
    return [(f"{VSN_PREFIX}weight", (obs_dim, n_groups), True), (f"{VSN_PREFIX}bias", (n_groups,), False)]


class VsnGate:
    """The gate of one network (module header): its group ranges on the device and its buffers, allocated once."""

    def __init__(self, layout: ParamLayout, batch: int, grad_rows: int, dense: str, *, isv: Any,
                 stream: Any) -> None:
        if not layout.vsn:
            raise ValueError("VsnGate: the layout has no variable-selection gate (network.vsn)")
        k, d = len(layout.vsn_groups), layout.obs_dim
        self.dense, self.isv, self.grad_rows = dense, isv, grad_rows
        # the seed's vsn_group_begins / ends: staged in mapped memory, copied to the device once
        self._staged = [Mapped(k, np.int32), Mapped(k, np.int32)]
        self.begins, self.ends = device_empty(k, np.int32), device_empty(k, np.int32)
        for column, staged, dev in zip((0, 1), self._staged, (self.begins, self.ends), strict=True):
            staged.host[:] = [bound[column] for bound in layout.vsn_groups]
            copy_device(dev, staged.device, stream=stream)
        self.weights = device_empty((batch, k), np.float32)  # the gate logits, then (in place) their softmax
        self.gated = device_empty((batch, d), np.float32)
        self.dgated = device_empty((grad_rows, d), np.float32)
        self.dlogits = device_empty((grad_rows, k), np.float32)
        self._wgrad = WeightGrad(dense, grad_rows, d, k)

    def forward(self, p: dict[str, Any], obs: Any, *, stream: Any) -> Any:
        """The gated observation of `obs` (kept in `gated`, the weights in `weights`), then the focus EMAs of the
        first grad_rows rows when the network was given the ISV."""
        dense_forward(self.dense, obs, p[f"{VSN_PREFIX}weight"], p[f"{VSN_PREFIX}bias"], self.weights, relu=False,
                      stream=stream)
        vsn_softmax(self.weights, stream=stream)
        vsn_apply(obs, self.weights, self.ends, self.gated, stream=stream)
        if self.isv is not None:
            vsn_focus(self.weights, self.isv, n_rows=self.grad_rows, stream=stream)
        return self.gated

    def backward(self, obs: Any, dy: Any, w_used: Any, g: dict[str, Any], *, stream: Any, extra: Any = None) -> None:
        """The gate's gradients in the views `g`, from dy [grad_rows, out] (the first layer's pre-activation gradient)
        and w_used [obs_dim, out] (the weights that layer read): dx' = dy w_used^T (+ `extra` [grad_rows, obs_dim]:
        the gradient of another layer reading x', the MoE gate without a trunk), then through the gate."""
        rows = self.grad_rows
        dense_backward_input(self.dense, dy, w_used, self.dgated, act=None, stream=stream)
        if extra is not None:
            check_array("extra", extra, "[grad_rows, obs_dim]", tuple(self.dgated.shape))
            flat = self.dgated.reshape(self.dgated.size)
            launch_strided(axpy_f32, flat.size, flat, np.float32(1.0), extra.reshape(flat.size), i32(flat.size),
                           stream=stream)
        x = obs if int(obs.shape[0]) == rows else obs[:rows]
        w = self.weights if int(self.weights.shape[0]) == rows else self.weights[:rows]
        vsn_gate_grad(self.dgated, x, w, self.begins, self.ends, self.dlogits, stream=stream)
        self._wgrad(x, self.dlogits, g[f"{VSN_PREFIX}weight"], g[f"{VSN_PREFIX}bias"], stream=stream)
