"""The Q network: a ReLU trunk over the observation (none by default), then one dueling C51 head per action.

    layout = ParamLayout.build(obs_dim, cfg.network)       # .size, .entries, .fingerprint
    params = stager.upload_new(init_params(layout, seed))  # one flat float32 buffer [layout.size]
    net = Network(layout, batch, stream=s)                 # activation buffers, allocated once
    net.forward(params, obs, logits, stream=s)             # obs [batch, D] -> logits [batch, 13, Z]
                                                           # (logits None: the head GEMM's output net.head_out
                                                           # only, for a caller that combines it itself)
                                                           # (Mamba2, TLOB: net.bind_market(...) per fold, rows=,
                                                           # or encoded= of a cache: net.encode(...), net.encoded(k))
    net.backward(params, dlogits, grads, stream=s)         # dlogits [G, 13, Z] -> grads [layout.size]
    net.backward_from_head(params, grads, stream=s)        # the same from net.dhead's stream columns, written
                                                           # by the caller (the learner's fused C51 loss)

Architecture: `n_layers` Linear+ReLU layers of width `hidden` (the trunk; with n_layers = 0, the default,
the network is linear and the head reads the observation: the 2 x 256 trunk memorised the default market's
training window, tools/results/learner_ablation_h200.md sections 7-9), then one head GEMM
[H, (N_BRANCHES + N_HEADS) * Z + 1] whose output holds, branch by branch, each branch's value stream and its
heads' advantage streams (4 + 13 streams, `fox_numba.kernels.heads`), and one auxiliary forecast column, then
the dueling combine into logits [B, 13, Z]: for each bin a of branch b, logits = V_b + (A_a - mean of the
branch's A). 13 heads (fox_numba.actions), Z = network.n_atoms. The forecast column
(`head_out[:, aux_column(Z)]`) is the learner's auxiliary regression of the forward mid change
(agent/learner.py); acting reads the logits only.

Live branches: a layout built with `live_branches` = n < 4 (the default counterfactual learner trains the
direction branch alone and the policy takes fixed bins in the others: agent/learner.py `live_branches`) computes
the head GEMM's first `live_cols` columns only, the first n branches' streams (their own prefix since the streams
run branch by branch): the forward launches only their column tiles and the weight gradient only theirs, a
third of the default's 868 columns (5 of 17 streams). The other columns of the head output stay at the zeros
they are allocated with, and their weights and biases are 0 from `init_params` on (no gradient reaches them, so
Adam, decay, shrink-and-perturb and Polyak keep them 0): the logits of those branches are exactly what a full
GEMM over zero weights gives, so the numbers are the full computation's bit for bit (the simulator's strided
kernels compute every column; tests/agent/test_live_branches.py).

Parameters live in one flat float32 buffer; `ParamLayout` is its table of (name, offset, shape), in the
order trunk.0.weight, trunk.0.bias, ..., head.weight, head.bias, each entry starting on a 32-float
(128-byte) boundary; the gaps hold zeros and receive zero gradient. Weights are [in, out] (y = x @ W + b).
Adam, clipping, the weight-decay mask (weights decay, biases do not), shrink-and-perturb, Polyak and
checkpoints all use this one table; the target network is a second buffer of the same layout. The
fingerprint hashes the table and the sizes it came from; a checkpoint stores it.

Initialisation (`init_params`, host, float32, deterministic in (layout, seed)): each entry draws from its
own generator numpy.random.default_rng([seed, entry index]); trunk weights Kaiming-uniform for ReLU
(U(+-sqrt(6 / fan_in))), head weights Xavier-uniform (U(+-sqrt(6 / (fan_in + fan_out)))), so fresh logits
have unit scale and every head starts near a smooth distribution (with MoE heads, fan_out is one expert's), times
`head_scale` (network.head_init_scale; 0 starts the heads at zero: uniform distributions, equal values); biases
and the VSN and MoE gates 0, but the MoE gate's weight drawn as a trunk layer's when the heads start at zero (equal
experts under a uniform gate would stay equal: agent/moe.py).

`Network(layout, batch, stream=s, grad_rows=G)` keeps the forward's activations so `backward` can follow;
backward uses the first G rows of the last forward (the learner runs s and s' through one forward of 2B rows
and backpropagates the s rows only) and takes the forecast column's gradient from `dhead[:, aux_column]`
(zero unless the learner's aux loss writes it). With `dropout=Dropout(rate, state, seed)` (the learner's
online network, learner.dropout > 0) the forward drops each hidden unit with probability `rate` and scales
the kept ones by 1 / (1 - rate) (kernels/dropout.py), and the backward scales each hidden layer's input
gradient by the same factor (the dropped units are already masked by their zero output). Dense layers run
on the register-tiled GEMMs (`kernels.nn`) on the GPU and on the grid-stride kernels (`kernels.dense_strided`,
same arithmetic per element) under the simulator, or as `dense=` says (agent/dense.py). With
`noise=NoiseKey(...)` (a layout built with network.noisy_sigma0 > 0: entries head.weight_sigma, head.bias_sigma
after head.bias, no decay) the head GEMM reads mu + sigma * factorised noise drawn on the device (agent/noisy.py,
kernels/noisy.py) and the backward adds sigma's gradients; without it the head reads mu (head.weight, head.bias)
alone. A layout built with
network.iqn_quantiles > 0 ends with the IQN head's entries (iqn.embed.*, iqn.head.*; agent/iqn.py): this class
neither reads nor writes them (the learner's IqnStep does, from `head_input`, and hands the trunk its input
gradient through backward's `input_grad`). So does a layout built with network.mean_head, whose entries
(mean.head.*; agent/mean_head.py) come last: the learner's MeanStep reads and writes them.

Two trunk parts, each off by default (then the network launches exactly the plain trunk's kernels) and refused
without the trunk they act on:
- Spectral normalisation (network.spectral_norm, n_layers >= 1; agent/spectral.py, kernels/spectral.py): with
  `spectral=SpectralKey(vectors, iters)` every trunk layer first runs `iters` power iterations on its persistent
  u [hidden], v [in] (the learner's online network: network.spectral_iters; every other network 0, reading the
  vectors as they are), takes sigma = v^T W u and reads W / sigma (written to a buffer of this network); the bias
  is not normalised. The backward turns the weight gradient G of W / sigma into (G - <G, W / sigma> v u^T) / sigma
  (u, v held constant) and backpropagates the input gradient through W / sigma. `spectral.sigma` [n_layers] holds
  the last forward's sigmas.
- Residual blocks (network.residual or network.stochastic_depth > 0, n_layers >= 2; agent/depth.py,
  kernels/depth.py): trunk layers 1 .. n_layers - 1 become x + d * relu(x W + b), layer 0 stays plain, the
  parameters are unchanged. With `depth=StochasticDepth(rate, state, seed)` (the learner's online network) each
  row drops block l (d = 0) with probability rate * l / (n_layers - 1) and scales a kept one by 1 / (1 - p_l),
  drawn on the device from the step counter; without it d = 1. The backward masks a block's branch by its own
  ReLU output and passes the skip gradient through unmasked; dropout of a residual trunk is refused.
Both are in ParamLayout.fingerprint (nothing is added when off).

Variable selection (network.vsn, off by default; agent/vsn.py, kernels/vsn.py): a layout built with it holds the
gate's entries vsn.weight [obs_dim, K], vsn.bias [K] after the C51 head's (before any IQN head's; K groups of
observation columns, their ranges in `vsn_groups` and the fingerprint; the gate starts at 0, a uniform gate). Every forward first gates the observation,
x'_c = K softmax(x W_g + b_g)_k(c) x_c, and layer 0 (or the head, without a trunk) reads x'; the backward turns layer
0's input gradient dy W^T (W: the weights that layer read) into the gate's gradients; the observation takes none.
With `isv=` (the learner's online network) each forward also folds the gate's focus over the first grad_rows rows
into ISV[VSN_FOCUS_MAX_EMA] and ISV[VSN_FOCUS_ENTROPY_EMA]. Off, the network launches none of its kernels.

Mixture-of-experts heads (network.moe_experts = K > 0, off by default; agent/moe.py, kernels/moe.py): head.weight
[H, K HW] and head.bias [K HW] hold K experts (a copy of the whole head each), and moe.weight [H, 4K], moe.bias [4K]
after the C51 head's (and VSN's) entries a per-branch softmax gate over them on the heads' input; the head output is
the gate-weighted sum of the experts' outputs per branch (the auxiliary column their mean), so the dueling combine
gives the gate-weighted sum of the experts' logits. With `isv=` (the learner's online network) the forward also
reduces the gate's usage over the first grad_rows rows, which the backward's load-balancing gradient (weight
ISV[MOE_LAMBDA_EFF]) and the learner's `moe.signals` read; the gate's input gradient joins the trunk's (or the VSN
gate's). Noisy heads are refused with it. Off, the layout and the launches are the single head's.

Mamba2 encoder (network.mamba2_window = T > 0, off by default; agent/mamba2.py, kernels/mamba2.py, kernels/windows.py):
a layout built with it holds the block's entries mamba2.in_proj.weight, mamba2.heads, mamba2.out_proj.weight after
the C51 head's, and its first layer (layer 0, or the head without a trunk) reads [obs | enc], obs_dim + E columns
(layout.in_dim; E = mamba2_out). enc is the block's output at the last bar of each sample's window: the feature
columns of the fold's market part (observation.feature_columns: N_MARKET, and the time-weighted imbalance's with
features.tw_imbalance) over the T bars ending at the sample's row (clamped to its day's first bar).
`bind_market(market_obs, day_first)` gives the network its fold's market once per fold and `forward(..., rows=)`
each observation's row (the block read at the last bar only: [batch, E], kernels/mamba2_last.py); the backward sends
the E columns' input gradient dy W^T (W: the weights layer 0 read) into the block's parameter gradients, and the
windows take none (market features are data). The window and the block's sizes are in the fingerprint. Refused with
VSN, MoE, IQN and NoisyNet heads (each reads or gates the input or the head the encoder widens; not composed yet); the
trunk parts act after layer 0 and compose. Off, the network launches none of its kernels.

TLOB encoder (network.tlob_window = T > 0, off by default; agent/tlob.py, kernels/tlob.py, kernels/windows.py,
features/book.py): the same composition over the fold's close-book snapshots instead of its market part. A layout
built with it holds the encoder's tlob.* entries after the C51 head's, and its first layer reads [obs | enc], obs_dim
+ O columns (O = tlob_out): enc is the encoder's output for the window of the T book snapshots (BOOK_FEATURES columns
each, FoldMarketDevice.book_obs) ending at the sample's row, clamped to its day's first bar.
`bind_market(market_obs, day_first, book_obs)` and `forward(..., rows=)` as with Mamba2; the backward sends the O
columns' input gradient dy W^T into every encoder parameter's gradient, and the book takes none. The window and the
encoder's sizes are in the fingerprint. Refused with VSN, MoE, IQN, NoisyNet heads and the Mamba2 encoder.

Position x market (network.position_cross, off by default; kernels/position_cross.py): layer 0 (the heads, without a
trunk) reads [obs | q obs[:, :M] | enc], q the observation's position column (layout.position_col) and M = layout.cross
its market columns (all columns before the portfolio part), so a linear head's value of holding can be q x . beta, the
bilinear form the plain observation cannot give it (tools/results/learner_ablation_h200.md section 27). The crossed
columns are data (no gradient flows back through them); an encoder's columns start at layout.encoder_col. Refused with
VSN. Off, the network launches none of its kernels. With network.mean_cross (layout.mean_cross) the direction mean
head alone reads [obs | q obs[:, :M]], and forms it on the fly from `mean_input`, the observation
(kernels/mean_cross.py, agent/mean_head.py); layer 0 reads obs and the network stages no crossed columns.

Encoder cache (either encoder; evaluation, agent/evaluator.py): a sample's encoder output depends on its market row
alone, so where the rows are known in advance `Network(..., cache_samples=M)` holds a second encoder of M samples:
`encode(params, rows)` runs it alone over rows [M] (int32, e.g. every (step, environment) row of an evaluation
chunk, step-major), and `forward(..., encoded=net.encoded(k))` joins the outputs of samples k batch .. (k + 1) batch
of it instead of encoding (the same kernels on the same numbers, per sample: the logits are bit for bit those of
`forward(..., rows=)` on the same rows). The backward needs rows= (it reads the network's own encoder).

Every buffer is allocated in the constructor, so forward and backward run inside a captured StepGraph. `grads` must
be zero in the layout's gaps (allocate it with device_zeros); backward writes every entry but the IQN and mean heads'.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from fox_numba.actions import N_BRANCHES, N_HEADS
from fox_numba.agent.dense import WeightGrad, dense_backward_input, dense_forward, dense_kind
from fox_numba.agent.depth import ResidualTrunk, StochasticDepth
from fox_numba.agent.iqn import IQN_HEAD_PREFIX, iqn_entries
from fox_numba.agent.mean_head import MEAN_HEAD_PREFIX, mean_entries
from fox_numba.agent.mamba2 import MAMBA2_PREFIX, Mamba2Dims, Mamba2Encoder, encoder_dims, mamba2_entries
from fox_numba.agent.mamba2 import init_params as mamba2_init
from fox_numba.agent.moe import GATE_W, MOE_PREFIX, MoeHeads, moe_entries
from fox_numba.agent.noisy import NoiseKey, NoisyHead, init_sigma, sigma_entries
from fox_numba.agent.param_entry import ParamEntry
from fox_numba.agent.spectral import SpectralKey, SpectralNorm, layer_widths
from fox_numba.agent.tlob import TLOB_PREFIX, TlobLayout, TlobShape, TlobWindowEncoder, init_tlob_params, tlob_entries
from fox_numba.agent.tlob import tlob_shape as tlob_config_shape
from fox_numba.agent.vsn import VSN_PREFIX, VsnGate, check_groups, observation_groups, vsn_entries
from fox_numba.config import FeatureConfig, NetworkConfig
from fox_numba.device.elementwise import axpy_f32, scale_f32
from fox_numba.device.fork import SideStream
from fox_numba.device.isv import MOE_MAX_EXPERTS
from fox_numba.device.launch import check_array, i32, launch_strided
from fox_numba.device.memory import device_empty, device_zeros
from fox_numba.device.runtime import device_address
from fox_numba.errors import ConfigError
from fox_numba.kernels.dropout import dropout, keep_scale
from fox_numba.kernels.heads import (
    aux_column,
    dueling_combine_backward,
    dueling_combine_forward,
    head_width,
    live_columns,
)
from fox_numba.kernels.moe import MIN_EXPERTS
from fox_numba.kernels.windows import concat_columns
from fox_numba.kernels.position_cross import position_cross
from fox_numba.observation import N_PORTFOLIO, PORT_POSITION, feature_columns
from fox_numba.observation import obs_dim as features_obs_dim

ALIGN = 32  # floats: every entry starts on a 128-byte boundary


@dataclass(frozen=True)
class ParamLayout:
    """The table of the flat parameter buffer: entries in order, the total size, what built it."""

    obs_dim: int
    hidden: int
    n_layers: int
    n_atoms: int
    entries: tuple[ParamEntry, ...]
    size: int
    noisy_sigma0: float = 0.0  # > 0: the head is a NoisyNet layer (agent/noisy.py); sets sigma's initial value
    iqn_embed: int = 0  # > 0: the layout holds an IQN head of this many cosine features (agent/iqn.py)
    spectral_norm: bool = False  # the trunk layers read W / sigma (agent/spectral.py)
    residual: bool = False  # trunk layers 1 .. n_layers - 1 are residual blocks (agent/depth.py)
    vsn_groups: tuple[tuple[int, int], ...] = ()  # the VSN gate's column ranges [begin, end) (agent/vsn.py); () off
    moe_experts: int = 0  # > 0: the head is a mixture of this many experts under a gate (agent/moe.py)
    mamba2: Mamba2Dims | None = None  # the Mamba2 encoder over the last bars (agent/mamba2.py); None off
    tlob: TlobShape | None = None  # the TLOB encoder over the last book snapshots (agent/tlob.py); None off
    cross: int = 0  # > 0: layer 0 also reads the position times the first `cross` (market) columns; 0 off
    mean_head: bool = False  # a squared-error value head of the directions beside C51 (agent/mean_head.py)
    mean_cross: bool = False  # the `cross` columns feed the mean head alone (network.mean_cross), not layer 0
    live_branches: int = N_BRANCHES  # < N_BRANCHES: the later branches' head columns are zero, not computed

    @classmethod
    def build(cls, obs_dim: int, cfg: NetworkConfig, vsn_groups: tuple[tuple[int, int], ...] | None = None, *,
              features: FeatureConfig | None = None, market_features: int | None = None,
              live_branches: int = N_BRANCHES) -> ParamLayout:
        """The layout of a network over observations of `obs_dim` columns, sized by `cfg`. With cfg.vsn the gate's
        groups are `vsn_groups` (column ranges tiling the input), by default the groups of the observation layout
        under `features` (agent/vsn.py; default: the default FeatureConfig's). With cfg.mamba2_window the encoder
        reads the first `market_features` market columns (by default the feature columns under `features`,
        observation.feature_columns). `live_branches` < N_BRANCHES (agent/learner.py `live_branches`: the branches the
        learner trains or the policy chooses): the head computes the first branches' streams alone (module header)."""
        if not 1 <= live_branches <= N_BRANCHES or (live_branches < N_BRANCHES
                                                    and (cfg.noisy_sigma0 > 0 or cfg.moe_experts)):
            raise ValueError(f"live_branches must be in 1..{N_BRANCHES}, and {N_BRANCHES} with NoisyNet or MoE heads "
                             f"(they write every head column); got {live_branches}")
        if (obs_dim < 1 or cfg.hidden < 1 or cfg.n_layers < 0 or cfg.n_atoms < 2 or not cfg.noisy_sigma0 >= 0
                or cfg.iqn_quantiles < 0 or cfg.iqn_embed < 1):
            raise ValueError(
                f"network needs obs_dim >= 1, hidden >= 1, n_layers >= 0, n_atoms >= 2, noisy_sigma0 >= 0, "
                f"iqn_quantiles >= 0, iqn_embed >= 1; got {obs_dim}, {cfg.hidden}, {cfg.n_layers}, {cfg.n_atoms}, "
                f"{cfg.noisy_sigma0}, {cfg.iqn_quantiles}, {cfg.iqn_embed}"
            )
        residual = cfg.residual or cfg.stochastic_depth > 0
        if cfg.spectral_norm and (cfg.n_layers < 1 or cfg.spectral_iters < 1):
            raise ValueError(f"network.spectral_norm needs a trunk (n_layers >= 1) and spectral_iters >= 1; got "
                             f"n_layers = {cfg.n_layers}, spectral_iters = {cfg.spectral_iters}")
        if not 0.0 <= cfg.stochastic_depth < 1.0 or (residual and cfg.n_layers < 2):
            raise ValueError(f"network.stochastic_depth must be in [0, 1), and residual blocks (network.residual or "
                             f"stochastic_depth > 0) need n_layers >= 2; got stochastic_depth = "
                             f"{cfg.stochastic_depth}, n_layers = {cfg.n_layers}")
        if cfg.vsn and cfg.iqn_quantiles > 0 and cfg.n_layers < 1:
            raise ValueError("network.vsn with an IQN head (iqn_quantiles > 0) needs a trunk (n_layers >= 1): the IQN "
                             "gradient reaches the gate only through the trunk")
        if cfg.moe_experts:
            check_moe(cfg)
        if cfg.mean_head and cfg.iqn_quantiles > 0:
            raise ConfigError("network.mean_head does not combine with an IQN head (network.iqn_quantiles > 0): both "
                              "set the values the direction branch acts on")
        if cfg.mean_cross and (not cfg.mean_head or cfg.position_cross or cfg.n_layers):
            raise ConfigError("network.mean_cross needs network.mean_head and a linear network (n_layers = 0); with "
                              "position_cross every head already reads the crossed columns; it is on by default, and "
                              "network.mirror with it: set network.mean_cross=false and network.mirror=false for a "
                              "trunk")
        if not 0.0 < cfg.mirror_strength <= 1.0:
            raise ConfigError(f"network.mirror_strength must be in (0, 1], got {cfg.mirror_strength}")
        if cfg.mirror and not cfg.mean_cross:
            raise ConfigError("network.mirror (on by default) needs network.mean_cross: the projection is of a linear "
                              "mean head on the observation and its position x market columns; set "
                              "network.mirror=false beside network.mean_cross=false")
        if cfg.mirror and (cfg.mamba2_window or cfg.tlob_window):
            raise ConfigError("network.mirror (on by default) does not combine with an encoder (mamba2_window, "
                              "tlob_window): the market mirror's image of the encoder's columns is not known; set "
                              "network.mirror=false")
        cross = cross_columns(cfg, obs_dim)
        layer_cross = 0 if cfg.mean_cross else cross
        features = features if features is not None else FeatureConfig()
        mamba2 = encoder_dims(cfg, market_features if market_features is not None else feature_columns(features))
        tlob = tlob_config_shape(cfg)
        groups: tuple[tuple[int, int], ...] = ()
        if cfg.vsn:
            if vsn_groups is None and obs_dim != features_obs_dim(features):
                raise ValueError(f"network.vsn takes its groups from the observation layout "
                                 f"({features_obs_dim(features)} columns under its features config); an input of "
                                 f"{obs_dim} columns needs explicit vsn_groups")
            groups = (tuple((int(b), int(e)) for b, e in vsn_groups) if vsn_groups is not None
                      else tuple((g.begin, g.end) for g in observation_groups(features)))
            check_groups(groups, obs_dim)
        shapes: list[tuple[str, tuple[int, ...], bool]] = []
        width = (obs_dim + layer_cross + (mamba2.d_out if mamba2 is not None else 0)
                 + (tlob.n_out if tlob is not None else 0))
        for layer in range(cfg.n_layers):
            shapes += [(f"trunk.{layer}.weight", (width, cfg.hidden), True), (f"trunk.{layer}.bias", (cfg.hidden,), False)]
            width = cfg.hidden
        head_out = head_width(cfg.n_atoms)
        experts_out = head_out * max(cfg.moe_experts, 1)  # the K experts side by side
        shapes += [("head.weight", (width, experts_out), True), ("head.bias", (experts_out,), False)]
        if cfg.noisy_sigma0 > 0:
            shapes += sigma_entries(width, head_out)
        if mamba2 is not None:
            shapes += mamba2_entries(mamba2)
        if tlob is not None:
            shapes += tlob_entries(tlob)
        if groups:
            shapes += vsn_entries(obs_dim, len(groups))
        if cfg.moe_experts:
            shapes += moe_entries(width, cfg.moe_experts)
        iqn_embed = cfg.iqn_embed if cfg.iqn_quantiles > 0 else 0
        if iqn_embed:
            shapes += iqn_entries(iqn_embed, width)
        if cfg.mean_head:
            shapes += mean_entries(width + cross - layer_cross)
        entries, offset = [], 0
        for name, shape, decay in shapes:
            entries.append(ParamEntry(name, offset, shape, decay))
            offset += -(-math.prod(shape) // ALIGN) * ALIGN
        return cls(obs_dim, cfg.hidden, cfg.n_layers, cfg.n_atoms, tuple(entries), offset, float(cfg.noisy_sigma0),
                   iqn_embed, cfg.spectral_norm, residual, groups, cfg.moe_experts, mamba2, tlob, cross,
                   cfg.mean_head, cfg.mean_cross, live_branches)

    @property
    def live_cols(self) -> int:
        """The head GEMM's leading output columns that are computed (heads.live_columns); every column past them is
        0, its weights and bias 0 from `init_params` on (no gradient reaches them: the learner trains only these
        branches)."""
        return live_columns(self.live_branches, self.n_atoms)

    @property
    def noisy(self) -> bool:
        """The head is a NoisyNet layer: the layout has its sigma entries."""
        return self.noisy_sigma0 > 0

    @property
    def iqn(self) -> bool:
        """The layout holds an IQN head (network.iqn_quantiles > 0)."""
        return self.iqn_embed > 0

    @property
    def vsn(self) -> bool:
        """The observation passes a variable-selection gate (network.vsn) before the trunk or heads read it."""
        return bool(self.vsn_groups)

    @property
    def moe(self) -> bool:
        """The head is a mixture of experts under a gate (network.moe_experts > 0)."""
        return self.moe_experts > 0

    @property
    def windowed(self) -> bool:
        """The network has an encoder over windows of past bars (Mamba2 or TLOB): it needs `Network.bind_market`
        once per fold and the observations' rows at every forward."""
        return self.mamba2 is not None or self.tlob is not None

    @property
    def position_col(self) -> int:
        """The observation's held-position column (the portfolio part's first), which network.position_cross
        multiplies into the market columns."""
        return self.obs_dim - N_PORTFOLIO + PORT_POSITION

    @property
    def encoder_col(self) -> int:
        """First column of the Mamba2 or TLOB encoder's output in the first layer's input: after the observation and
        its position x market columns."""
        return self.obs_dim + (0 if self.mean_cross else self.cross)

    @property
    def in_dim(self) -> int:
        """Width of the first layer's input: the observation, its position x market columns
        (network.position_cross) and the Mamba2 or TLOB encoder's output, in that order."""
        extra = self.mamba2.d_out if self.mamba2 is not None else self.tlob.n_out if self.tlob is not None else 0
        return self.encoder_col + extra

    @property
    def head_input_relu(self) -> bool:
        """The heads' input is a ReLU output (a plain last trunk layer), so its gradient is masked by its sign."""
        return self.n_layers > 0 and not self.residual

    @property
    def head_in(self) -> int:
        """Width of the heads' input: the trunk's last layer, or the observation without a trunk."""
        return self.hidden if self.n_layers else self.in_dim

    @property
    def mean_in(self) -> int:
        """Width of the mean head's input: the heads' input, with network.mean_cross beside its crossed columns."""
        return self.head_in + (self.cross if self.mean_cross else 0)

    @property
    def fingerprint(self) -> str:
        """sha256 (first 16 hex digits) of the table and the sizes and action space it was built for."""
        text = "\n".join(f"{e.name}:{e.offset}:{list(e.shape)}:{int(e.decay)}" for e in self.entries)
        text += f"\nsize:{self.size}\nheads:{N_BRANCHES}+{N_HEADS}:by-branch\natoms:{self.n_atoms}\n"
        if self.live_branches < N_BRANCHES:  # which head columns are computed is in no entry's shape
            text += f"live_branches:{self.live_branches}\n"
        if self.spectral_norm:  # the power-iteration vectors' layout (u_l, v_l per trunk layer)
            text += "spectral_uv:" + ",".join(f"{o}+{i}" for i, o in layer_widths(self)) + "\n"
        if self.residual:
            text += f"residual:1..{self.n_layers - 1}\n"
        if self.vsn:
            text += "vsn_groups:" + ",".join(f"{b}-{e}" for b, e in self.vsn_groups) + "\n"
        if self.moe:
            text += f"moe_experts:{self.moe_experts}\n"
        if self.cross:  # which columns multiply is in no entry's shape
            text += f"position_cross:{self.cross}x{self.position_col}{':mean' if self.mean_cross else ''}\n"
        if self.mamba2 is not None:  # the window is in no entry's shape
            d = self.mamba2
            text += (f"mamba2:window={d.seq_len},features={d.n_features},heads={d.n_heads},head_dim={d.head_dim},"
                     f"state={d.state_dim},out={d.d_out}\n")
        if self.tlob is not None:  # the window is in the shapes of the feature view and the head; all sizes, alike
            t = self.tlob
            text += (f"tlob:window={t.seq},features={t.n_in},width={t.width},blocks={t.n_blocks},heads={t.heads_time}+"
                     f"{t.heads_feature},out={t.n_out}\n")
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def entry(self, name: str) -> ParamEntry:
        for e in self.entries:
            if e.name == name:
                return e
        raise KeyError(f"parameter layout has no entry {name!r} (entries: {[e.name for e in self.entries]})")

    def layer(self, index: int) -> tuple[ParamEntry, ParamEntry]:
        """(weight, bias) of dense layer `index`: the trunk layers 0..n_layers-1, then the head."""
        if index == self.n_layers:
            return self.entry("head.weight"), self.entry("head.bias")
        return self.entry(f"trunk.{index}.weight"), self.entry(f"trunk.{index}.bias")

    def decay_mask(self, rate: float = 1.0, encoder_rate: float | None = None) -> np.ndarray:
        """float32 [size]: the weight-decay rate of each element, `rate` on the entries that decay (weights), 0 on
        biases and gaps; the encoders' (Mamba2, TLOB) weights at `encoder_rate` (None: `rate`)."""
        mask = np.zeros(self.size, np.float32)
        for e in self.entries:
            if e.decay:
                encoder = encoder_rate is not None and e.name.startswith((MAMBA2_PREFIX, TLOB_PREFIX))
                mask[e.offset : e.stop] = encoder_rate if encoder else rate
        return mask

    def unpack(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        """Host views {name: array of the entry's shape} of a flat host buffer."""
        if flat.shape != (self.size,):
            raise ValueError(f"flat parameters of shape {flat.shape}, the layout has ({self.size},)")
        return {e.name: flat[e.offset : e.stop].reshape(e.shape) for e in self.entries}

    def views(self, flat: Any) -> dict[str, Any]:
        """Device views {name: array of the entry's shape} of a flat device buffer (no copy)."""
        check_array("flat parameters", flat, "[layout.size]", (self.size,))
        return {e.name: flat[e.offset : e.stop].reshape(e.shape) for e in self.entries}

    def markdown(self) -> str:
        lines = ["| name | offset | shape | weight decay |", "| --- | ---: | --- | --- |"]
        lines += [f"| {e.name} | {e.offset} | {list(e.shape)} | {e.decay} |" for e in self.entries]
        return "\n".join(lines) + f"\n\n{self.size} floats, fingerprint `{self.fingerprint}`\n"


def check_moe(cfg: NetworkConfig) -> None:
    """A ConfigError (one line) for a mixture-of-experts setting outside its range or with a part it does not
    compose with (agent/moe.py)."""
    if not MIN_EXPERTS <= cfg.moe_experts <= MOE_MAX_EXPERTS:
        raise ConfigError(f"network.moe_experts must be 0 (off) or {MIN_EXPERTS} .. {MOE_MAX_EXPERTS} (one ISV "
                          f"utilisation slot per expert), got {cfg.moe_experts}")
    if cfg.noisy_sigma0 > 0:
        raise ConfigError("network.moe_experts does not combine with NoisyNet heads (network.noisy_sigma0 > 0): the "
                          "factorised noise is laid out over one head's columns")


def cross_columns(cfg: NetworkConfig, obs_dim: int) -> int:
    """The market columns network.position_cross multiplies by the position (all of the observation's market part,
    forecast columns included), 0 when off; a ConfigError for a part it does not compose with."""
    if not (cfg.position_cross or cfg.mean_cross):
        return 0
    if cfg.vsn:
        raise ConfigError("network.position_cross (or mean_cross) does not combine with network.vsn (the gate's "
                          "groups tile the observation; the crossed columns would sit outside them)")
    if obs_dim <= N_PORTFOLIO:
        raise ConfigError(f"network.position_cross needs market columns before the {N_PORTFOLIO} portfolio columns; "
                          f"the observation has {obs_dim}")
    return obs_dim - N_PORTFOLIO


def init_params(layout: ParamLayout, seed: int, head_scale: float = 1.0) -> np.ndarray:
    """Seeded, deterministic float32 parameters [layout.size] (scheme in the module header); the heads' weights
    (C51, IQN and mean heads) scaled by `head_scale`."""
    flat = np.zeros(layout.size, np.float32)
    for index, e in enumerate(layout.entries):
        gate_breaks_symmetry = e.name == GATE_W and head_scale == 0  # zero experts: drawn as a trunk layer
        if not e.decay or (e.name.startswith((VSN_PREFIX, MOE_PREFIX, MAMBA2_PREFIX, TLOB_PREFIX))
                           and not gate_breaks_symmetry):
            continue  # biases and the VSN and MoE gates start at 0 (uniform gates), sigma, Mamba2 and TLOB below
        rng = np.random.default_rng([seed % 2**63, index])
        fan_in, fan_out = e.shape
        if e.name == "head.weight":
            fan_out = head_width(layout.n_atoms)  # per expert: each of a mixture's K experts is drawn as one head
        xavier = e.name.startswith(("head.", IQN_HEAD_PREFIX, MEAN_HEAD_PREFIX))
        bound = head_scale * math.sqrt(6.0 / (fan_in + fan_out)) if xavier else math.sqrt(6.0 / fan_in)
        flat[e.offset : e.stop] = rng.uniform(-bound, bound, e.size).astype(np.float32)
    if layout.live_branches < N_BRANCHES:  # the head columns past the live branches' are zero for good
        head = layout.unpack(flat)
        head["head.weight"][:, layout.live_cols :] = 0.0
        head["head.bias"][layout.live_cols :] = 0.0
    if layout.noisy:
        init_sigma(flat, layout)
    if layout.mamba2 is not None:
        names = [e.name for e in layout.entries]
        first = next(k for k, name in enumerate(names) if name.startswith(MAMBA2_PREFIX))
        for name, value in mamba2_init(layout.mamba2, seed, first).items():
            e = layout.entries[names.index(name)]
            flat[e.offset : e.stop] = value.reshape(-1)
    if layout.tlob is not None:
        names = [e.name for e in layout.entries]
        first = next(k for k, name in enumerate(names) if name.startswith(TLOB_PREFIX))
        own = TlobLayout.build(layout.tlob)
        values = init_tlob_params(own, seed, first)
        for t in own.entries:
            e = layout.entry(t.name)
            flat[e.offset : e.stop] = values[t.offset : t.stop]
    return flat


def window_encoder(layout: ParamLayout, samples: int, grad_rows: int, *, dense: str,
                   stream: Any) -> Mamba2Encoder | TlobWindowEncoder | None:
    """The layout's encoder over windows of past bars for `samples` samples (its backward over the first
    `grad_rows`), None for a layout without one."""
    if layout.mamba2 is not None:
        return Mamba2Encoder(layout.mamba2, samples, grad_rows, dense=dense, stream=stream)
    if layout.tlob is not None:
        return TlobWindowEncoder(layout.tlob, samples, grad_rows, dense=dense)
    return None


@dataclass(frozen=True)
class Dropout:
    """Training dropout of the trunk's hidden units: the rate, the optimiser state whose step keys the mask
    (read on the device), and the seed."""

    rate: float
    state: Any
    seed: int


class Network:
    """Forward and backward of the network for `batch` rows (backward over the first `grad_rows`)."""

    def __init__(
        self, layout: ParamLayout, batch: int, *, stream: Any, grad_rows: int | None = None, dense: str = "auto",
        dropout: Dropout | None = None, noise: NoiseKey | None = None, spectral: SpectralKey | None = None,
        depth: StochasticDepth | None = None, isv: Any = None, cache_samples: int = 0,
    ) -> None:
        """`cache_samples` > 0 (a layout with an encoder): the encoder cache's samples (module header)."""
        grad_rows = batch if grad_rows is None else grad_rows
        if not 1 <= grad_rows <= batch:
            raise ValueError(f"Network: need 1 <= grad_rows <= batch, got grad_rows={grad_rows}, batch={batch}")
        dense = dense_kind(dense, "Network")
        self.layout, self.batch, self.grad_rows, self.dense = layout, batch, grad_rows, dense
        self.dropout = dropout if dropout is not None and dropout.rate > 0 else None
        self._keep = keep_scale(self.dropout.rate) if self.dropout is not None else np.float32(1.0)
        if noise is not None and not layout.noisy:
            raise ValueError("Network: noise= needs a noisy layout (network.noisy_sigma0 > 0)")
        self.noisy = NoisyHead(layout, noise) if noise is not None else None
        if (spectral is not None) != layout.spectral_norm:
            raise ValueError("Network: spectral= (the learner's power-iteration vectors) goes with a layout built with "
                             f"network.spectral_norm, and only with one; layout.spectral_norm = {layout.spectral_norm}")
        self.spectral = SpectralNorm(layout, spectral) if spectral is not None else None
        if depth is not None and depth.rate > 0 and not layout.residual:
            raise ValueError("Network: depth= (stochastic depth) needs a residual layout (network.stochastic_depth)")
        if layout.residual and self.dropout is not None:
            raise ValueError("Network: dropout of a residual trunk is not supported (learner.dropout with "
                             "network.residual or network.stochastic_depth)")
        self.residual = ResidualTrunk(layout, batch, grad_rows, depth, stream=stream) if layout.residual else None
        self.vsn = VsnGate(layout, batch, grad_rows, dense, isv=isv, stream=stream) if layout.vsn else None
        self.moe = MoeHeads(layout, batch, grad_rows, dense, isv=isv, stream=stream) if layout.moe else None
        if cache_samples < 0 or (cache_samples > 0 and not layout.windowed):
            raise ValueError(f"Network: cache_samples = {cache_samples} needs a layout with an encoder over past bars "
                             "(network.mamba2_window or tlob_window) and must be >= 0")
        self.encoder = window_encoder(layout, batch, grad_rows, dense=dense, stream=stream)  # its output beside obs
        self.cache = (window_encoder(layout, cache_samples, 1, dense=dense, stream=stream) if cache_samples
                      else None)  # the encoder cache: forward only (one gradient row, the least it allocates)
        self._joined = device_empty((batch, layout.in_dim), np.float32) if self.encoder is not None else None
        self._crossed = (device_empty((batch, layout.obs_dim + layout.cross), np.float32)
                         if layout.cross and not layout.mean_cross
                         else None)  # layer 0's [obs | position x market]; the encoder's columns follow it in _joined
        self._from_cache = False  # the last forward read the cache (its encoder kept nothing for the backward)
        n_layers, hidden, z = layout.n_layers, layout.hidden, layout.n_atoms
        # Trunk outputs [layer, row, unit] in one buffer (the hidden-signal producers read it whole).
        self.activations: Any = device_empty((n_layers, batch, hidden), np.float32) if n_layers else None
        self.head_out = device_zeros((batch, head_width(z)), np.float32, stream=stream)  # past live_cols: 0 for good
        self.dhead = device_zeros((grad_rows, head_width(z)), np.float32, stream=stream)  # aux column: 0 unless written
        self.aux_column = aux_column(z)
        # Each layer's weight gradient runs on a side stream beside the input-gradient chain (device/fork.py) unless
        # main-stream work reads a weight gradient before the end of the backward (NoisyNet's sigma, spectral norm)
        # or rewrites a layer's output gradient (a residual block's, the MoE experts' buffers); beside it every
        # layer's input gradient keeps its own buffer, which the side stream may still be reading.
        self._side = (SideStream() if not (layout.noisy or layout.spectral_norm or layout.residual or layout.moe)
                      else None)
        n_dh = n_layers if self._side is not None else min(n_layers, 2)
        self._dh = [device_empty((grad_rows, hidden), np.float32) for _ in range(n_dh)]
        widths = [layout.in_dim] + [hidden] * n_layers + [head_width(z) * max(layout.moe_experts, 1)]
        self._wgrads = [WeightGrad(dense, grad_rows, widths[k], widths[k + 1]) for k in range(n_layers)]
        self._head_cols = layout.live_cols if layout.live_branches < N_BRANCHES else None  # None: every column
        self._wgrads.append(WeightGrad(dense, grad_rows, widths[-2], widths[-1], cols=self._head_cols))
        self._obs: Any = None
        self._views: dict[int, dict[str, Any]] = {}

    def _params(self, flat: Any) -> dict[str, Any]:
        key = device_address(flat)
        views = self._views.get(key)
        if views is None:
            views = self._views[key] = self.layout.views(flat)
        return views

    def bind_market(self, market_obs: Any, day_first: Any, book_obs: Any = None) -> None:
        """The fold's rows the encoder's windows read (once per fold): market_obs [R, C] float32 (the fold's market
        part; the Mamba2 encoder's), book_obs [R, BOOK_FEATURES] float32 (its book snapshots; the TLOB encoder's)
        and day_first [R] int32 (FoldMarketDevice's); a layout without an encoder refuses."""
        if self.encoder is None:
            raise ValueError("Network.bind_market: the layout has no Mamba2 encoder (network.mamba2_window = 0) and "
                             "no TLOB encoder (network.tlob_window = 0)")
        if self.layout.tlob is not None and book_obs is None:
            raise ValueError("Network.bind_market: the TLOB encoder (network.tlob_window) needs book_obs= "
                             "(FoldMarketDevice.book_obs)")
        source = market_obs if self.layout.tlob is None else book_obs
        for enc in (self.encoder, self.cache):
            if enc is not None:
                enc.bind_market(source, day_first)

    def encode(self, params: Any, rows: Any, *, stream: Any) -> None:
        """Run the encoder cache alone over the market rows `rows` [cache_samples] (int32), for `encoded` to read."""
        if self.cache is None:
            raise ValueError("Network.encode needs an encoder cache (Network(..., cache_samples=M))")
        check_array("rows", rows, "[cache_samples]", (self.cache.samples,), np.int32)
        self.cache.encode(self._params(params), rows, stream=stream)

    def encoded(self, k: int) -> Any:
        """The encoder cache's outputs of samples k batch .. (k + 1) batch of the last `encode`: forward's
        `encoded` for the observations of those rows."""
        if self.cache is None:
            raise ValueError("Network.encoded needs an encoder cache (Network(..., cache_samples=M))")
        if not 0 <= k < self.cache.samples // self.batch:
            raise ValueError(f"Network.encoded: k = {k} is outside the cache's {self.cache.samples} samples in blocks "
                             f"of batch = {self.batch}")
        return self.cache.out[k * self.batch : (k + 1) * self.batch]

    def _input(self, layer: int, rows: int) -> Any:
        """Input activation of dense layer `layer` (the observation, its VSN gating or the observation beside the
        Mamba2 or TLOB encoder's output, for layer 0), first `rows` rows."""
        if layer > 0:
            src = self.activations[layer - 1]
        elif self._joined is not None:
            src = self._joined
        elif self._crossed is not None:
            src = self._crossed
        else:
            src = self._obs if self.vsn is None else self.vsn.gated
        return src if rows == self.batch else src[:rows]

    def head_input(self, rows: int) -> Any:
        """The heads' input of the last forward, first `rows` rows (the trunk's last layer or the observation)."""
        if self._obs is None:
            raise RuntimeError("Network.head_input needs a forward first")
        return self._input(self.layout.n_layers, rows)

    def mean_input(self, rows: int) -> Any:
        """The mean head's input of the last forward, first `rows` rows: the heads' input (with network.mean_cross the
        observation, beside an encoder's columns when there is one; the head forms the observation's position x
        market columns itself, kernels/mean_cross.py)."""
        return self.head_input(rows)

    def _linear(self, x: Any, w: Any, b: Any, y: Any, relu: bool, stream: Any) -> None:
        dense_forward(self.dense, x, w, b, y, relu=relu, stream=stream)

    def _is_block(self, layer: int) -> bool:
        """Trunk layer `layer` is a residual block (layers 1 .. n_layers - 1 of a residual layout)."""
        return self.residual is not None and 1 <= layer < self.layout.n_layers

    def forward(self, params: Any, obs: Any, logits: Any, *, stream: Any, rows: Any = None,
                encoded: Any = None) -> None:
        """logits [batch, N_HEADS, Z] of obs [batch, obs_dim], or with logits None the head GEMM's output head_out
        [batch, head_width(Z)] alone (the learner's fused C51 passes form the combine themselves: kernels/learner.py);
        keeps the activations for `backward`. A layout with a
        Mamba2 or TLOB encoder needs one of `rows` [batch] int32 (each observation's row of the bound market,
        `bind_market`: the encoder runs on their windows) and `encoded` (`encoded(k)`: the encoder cache's outputs
        for the observations' rows); a layout without one reads neither."""
        lay = self.layout
        check_array("obs", obs, "[batch, obs_dim]", (self.batch, lay.obs_dim))
        if logits is not None:
            check_array("logits", logits, "[batch, N_HEADS, Z]", (self.batch, N_HEADS, lay.n_atoms))
        p = self._params(params)
        base = obs
        if self._crossed is not None:
            position_cross(obs, self._crossed, n_cross=lay.cross, pos_col=lay.position_col, stream=stream)
            base = self._crossed
        if self.encoder is not None:
            if (rows is None) == (encoded is None):
                raise ValueError("Network.forward: the layout has an encoder over past bars (network.mamba2_window or "
                                 "tlob_window), so it needs rows= (each observation's market row) or encoded= (the "
                                 "encoder cache's outputs of those rows), one of them")
            if rows is not None:
                check_array("rows", rows, "[batch]", (self.batch,), np.int32)
                encoded = self.encoder.encode(p, rows, stream=stream)
            self._from_cache = rows is None
            concat_columns(base, encoded, self._joined, stream=stream)
        self._obs = obs
        if self.vsn is not None:
            self.vsn.forward(p, obs, stream=stream)
        for layer in range(lay.n_layers):
            w, b = lay.layer(layer)
            weight = self.spectral.forward(p, layer, stream=stream) if self.spectral is not None else p[w.name]
            x, y = self._input(layer, self.batch), self.activations[layer]
            if self._is_block(layer):
                self._linear(x, weight, p[b.name], self.residual.output(layer), True, stream)
                self.residual.forward(layer, x, y, stream=stream)
            else:
                self._linear(x, weight, p[b.name], y, True, stream)
            if self.dropout is not None:
                d = self.dropout
                dropout(self.activations[layer], d.state, d.seed, layer, d.rate, stream=stream)
        w, b = lay.layer(lay.n_layers)
        x = self._input(lay.n_layers, self.batch)
        if self.moe is not None:
            self.moe.forward(p, x, self.head_out, stream=stream)
        else:
            hw, hb = self.noisy.forward(p, stream=stream) if self.noisy is not None else (p[w.name], p[b.name])
            dense_forward(self.dense, x, hw, hb, self.head_out, relu=False, stream=stream, cols=self._head_cols)
        if logits is not None:
            dueling_combine_forward(self.head_out, logits, stream=stream)

    def backward(self, params: Any, dlogits: Any, grads: Any, *, stream: Any, input_grad: Any = None) -> None:
        """grads [layout.size] = d(sum dlogits * logits) / d params over the first grad_rows rows of the last
        forward (whose activations must still be in place). `input_grad` [grad_rows, hidden] (a trunk): the
        gradient another head reading the same input (IQN, the mean head) sends into the trunk's last layer, already
        masked by its ReLU (layout.head_input_relu); it is added to the C51 head's before the trunk's backward.
        Without a trunk, beside an encoder (the mean head's): [grad_rows, the encoder's columns], added to the
        C51 head's gradient of the encoder's output before the encoder's backward."""
        check_array("dlogits", dlogits, "[grad_rows, N_HEADS, Z]", (self.grad_rows, N_HEADS, self.layout.n_atoms))
        dueling_combine_backward(dlogits, self.dhead, stream=stream)
        self.backward_from_head(params, grads, stream=stream, input_grad=input_grad)

    def backward_from_head(self, params: Any, grads: Any, *, stream: Any, input_grad: Any = None) -> None:
        """`backward` from the head GEMM's output gradient: dhead [grad_rows, head_width(Z)], its stream columns
        written by the caller (kernels/learner.py project_loss_scatter takes the C51 loss's gradient through the
        dueling combine itself) and its forecast column as `backward` reads it."""
        lay, rows = self.layout, self.grad_rows
        if self._obs is None or self._from_cache:
            raise RuntimeError("Network.backward needs a forward first, with rows= for an encoder (it reads the kept "
                               "activations)")
        if lay.noisy and self.noisy is None:
            raise RuntimeError("Network.backward of a noisy layout needs noise= (sigma's gradient is the noise's)")
        if input_grad is not None:
            if lay.n_layers == 0 and self.encoder is None:
                raise ValueError("Network.backward: input_grad needs a trunk or an encoder (the observation takes no "
                                 "gradient)")
            width = lay.hidden if lay.n_layers else lay.in_dim - lay.encoder_col
            check_array("input_grad", input_grad, "[grad_rows, width]", (rows, width))
        p, g = self._params(params), self._params(grads)
        dy = self.dhead  # at each layer's output: ReLU-masked for a plain layer, unmasked for a residual block
        for layer in range(lay.n_layers, -1, -1):
            w, b = lay.layer(layer)
            x = self._input(layer, rows)
            block = self._is_block(layer)
            g_out = dy
            if block:
                dy = self.residual.branch_grad(layer, g_out, stream=stream)
            moe = self.moe if layer == lay.n_layers else None
            if moe is not None:  # the gate's gradients; dy becomes the experts' output gradient
                dy = moe.backward(x, self.dhead, g, stream=stream)
            side = self._side.fork(stream) if self._side is not None else stream  # reads x and dy only
            self._wgrads[layer](x, dy, g[w.name], g[b.name], stream=side)
            head_noise = self.noisy if layer == lay.n_layers else None
            head_cols = self._head_cols if layer == lay.n_layers else None  # dy is 0 past the live columns
            if head_noise is not None:
                head_noise.backward(g, stream=stream)
            spectral = self.spectral if layer < lay.n_layers else None
            if spectral is not None:
                spectral.backward(g, layer, stream=stream)
            w_used = p[w.name]  # the weights the forward read:
            if head_noise is not None:
                w_used = head_noise.weight
            elif spectral is not None:
                w_used = spectral.weights[layer]
            if layer == 0 and self.vsn is not None:  # the gate's gradients through the gated observation
                extra = moe.input_grad(p, act=None, stream=stream) if moe is not None else None
                self.vsn.backward(self._obs, dy, w_used, g, stream=stream, extra=extra)
            if layer == 0 and self.encoder is not None:  # the encoder's columns of the input gradient, then its own
                enc = self.encoder
                dense_backward_input(self.dense, dy, w_used[lay.encoder_col :], enc.dx, act=None, stream=stream,
                                     cols=head_cols)
                if lay.n_layers == 0 and input_grad is not None:
                    _add(enc.dx, input_grad, stream)
                enc.backward(p, g, stream=stream)
            if layer > 0:
                dx = self._dh[layer % len(self._dh)]
                relu_input = not self._is_block(layer - 1)  # x is a plain layer's ReLU output: its sign masks
                act = x if relu_input and not block else None
                dense_backward_input(self.dense, dy, w_used, dx, act=act, stream=stream, cols=head_cols)
                if moe is not None:
                    moe.add_input_grad(p, dx, act=act, stream=stream)
                if block:
                    self.residual.skip_grad(dx, g_out, x, mask=relu_input, stream=stream)
                if layer == lay.n_layers and input_grad is not None:
                    _add(dx, input_grad, stream)
                if self.dropout is not None:  # the kept units' 1 / (1 - rate)
                    flat = dx.reshape(dx.size)
                    launch_strided(scale_f32, dx.size, flat, self._keep, i32(dx.size), stream=stream)
                dy = dx
        if self._side is not None:
            self._side.join(stream)


def _add(y: Any, x: Any, stream: Any) -> None:
    """y += x, two float32 device arrays of one shape."""
    launch_strided(axpy_f32, y.size, y.reshape(y.size), np.float32(1.0), x.reshape(y.size), i32(y.size), stream=stream)
