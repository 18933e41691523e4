"""The learner: the train stage. One gradient step is one StepGraph; an epoch replays it K times.

    learner = Learner(cfg, layout, replay, market_obs, aux_target, isv=bus.values, stager=stager, stream=stream)
                (and day_first= with network.mamba2_window, also book_obs= with network.tlob_window: the online and
                target networks' encoders read the windows of the s and s' rows; set_market(market_obs, aux_target,
                day_first, book_obs=book_obs) per later fold)
    per fold:   learner.shrink_adam(); learner.reset_step_counter(); learner.shrink_perturb(seed);
                learner.sync_target(); learner.restart_average()   the fold reset's learner entries, in its order
                                                           (walkforward/trainer_state.py); the driver runs
                                                           the whole reset at every fold, fold 0 included
    per epoch:  learner.refresh_supports()                 before collect (the collector reads
                                                           learner.support_online)
                learner.train_epoch()                      K = learner.steps_per_epoch replays, no host sync
                stats = learner.epoch_stats()              one read of the device sums, then zeroed
                learner.average_epoch(epoch)               the fold's running mean of epoch-end networks

One step, in launch order (`_step`): the schedule (step counter, lr, tau on the device) -> sample B replay
slots and gather s, a, r, done, s' (ReplayBuffer.sample / gather, agent/replay.py: s rows, then s' rows) ->
the observations of those 2B rows (kernels/env.py gather_obs, the collector's gather; with learner.obs_noise
> 0 Gaussian noise on their market columns, kernels/learner.py) -> online forward on
s and s' as one batch of 2B rows (the s rows kept for backward), and beside it on a side stream the target forward
on s' (device/fork.py; after it where spectral norm's online forward iterates the vectors the target reads) -> one
fused pass
(kernels/learner.py select_q_rows, from the two head GEMM outputs, the dueling combine formed as it reads them):
online E[Q], entropy and atom utilisation on s (E[Q] on s'), and the double
DQN rows: the greedy next bin (of the direction branch for every branch, by default: learner.bootstrap) from the
online E[Q](s'), evaluated with the target distribution -> (prioritised: the importance weights) -> one fused pass
(project_loss_scatter): C51 projection of r + gamma (1 - done) z onto the online support, cross-entropy per branch
row and its gradient, scattered into the heads and taken through the dueling combine's backward into the online
network's dhead (the two passes are the chain expected_q, double DQN rows, c51_project, c51_loss, scatter,
dueling_combine_bwd bit for bit: kernels/learner.py header) -> ISV producers of the loss and of Q (on a side stream,
joined before the guard) -> the auxiliary
regression (its gradient into the forecast column of dhead) -> backward from dhead (each layer's weight gradient
on a side stream beside the input-gradient chain: agent/network.py) -> global
gradient norm -> the non-finite guard (a non-finite loss or gradient skips the update, counts NONFINITE_STEPS
once, and leaves parameters, Adam state and target bit-identical) -> adaptive clip
(the landed producer) -> AdamW (lr = cosine schedule x max(0.05, FOLD_WARMUP_FACTOR)) -> Polyak with tau =
tau_base x cosine / (1 + clip(ISV[Q_DRIFT_RATE], 0, 4)) -> commit (Adam's t, the target supports, update /
drift / parameter-norm signals); the hidden-activation signals (every diag_every steps) run on a side stream from
the online forward to the step's end.
n-step returns (learner.n_step): the replay stores one-step transitions; the gather sums up to n of one
environment's consecutive rewards and hands the row its discount gamma**k * (1 - done) (kernels/replay.py).

Auxiliary regression (learner.aux_weight, 0 turns it off): the head GEMM's extra column f(s) regresses
y = aux_target[row of s] (agent/fold_market.py `aux_forecast_target`: the forward mid change over
learner.aux_horizon_bars in training standard deviations, NaN where no label may be read) with the loss
aux_weight * sum_i (f_i - y_i)**2 / (2B), added to the C51 loss. Why: one-step TD carries the market's
edge, a few tenths of a risk unit per trade, under several units of return noise; the regression hands
the trunk the probe's target directly (the probe is a ridge fit of the same y on the same observation).
Acting uses the logits alone. Measured on the default market it did worse than off, so it is off by
default; its in-sample fit (epoch stat loss_aux, 0.5 = no skill) is the evidence that the trunk memorises
the training window (tools/results/learner_ablation_h200.md section 7).

Counterfactual direction targets (learner.counterfactual; kernels/counterfactual.py): the step draws B / 4
transitions into `draw` and expands each into four rows of the batch, one per direction, right after the gather:
the taken direction keeps its stored reward and next state, the others get the reward and next portfolio the
environment's fill rules give them from the stored state (market orders of env.fixed_bins' magnitude). The rest
of the step runs unchanged on the B rows, with the branch weights of magnitude, order type and urgency at 0, so
every direction head gets a target on every drawn transition, not only where the policy chose it. The learner
holds the fold's book and environment parameters for it (`book=`, set_market's `book`). With
learner.counterfactual_held, three of every four drawn transitions are priced from a re-held position instead
(short, flat, long), so every direction trains from every position (kernels/counterfactual.py); with
learner.counterfactual_history those positions are given a drawn history of up to that many bars; with
learner.counterfactual_hold_bars K > 1 each priced direction's position is held K bars before the target bootstraps.

Nothing in a step is written from the host: the schedule constants go into a ControlBlock once per epoch
(`train_epoch`), so the K replays queue back to back. The replay buffer and market_obs are bound at
construction; `set_market` binds another fold's market_obs (the step is captured again, once).

Prioritised replay (learner.priority_alpha > 0; kernels/priority.py): the learner gives its replay buffer
priorities at construction (ReplayBuffer.prioritise). The step then samples in proportion to priority
(the sum tree rebuilt from its leaves first) instead of uniformly, multiplies each sample's four branch-row
weights by its importance weight right after the double DQN rows (so the loss, its gradient and the loss
signals are weighted), and after the C51 loss sets the drawn slots' priorities from their direction-branch
cross-entropy. Off (0), the step launches exactly the uniform step's kernels. The priorities are replay
state: the replay's fold reset clears them, and a checkpoint holds them with the learner's arrays
(priority_tree, priority_max), as it holds the replay's contents.

NoisyNet heads (network.noisy_sigma0 > 0; agent/noisy.py, kernels/noisy.py): right after the schedule the step
ticks the learner's noise counter (`noise_step`), and the online forward (s and s', one draw) and the target
forward each draw their own factorised noise from it (independent streams) before their head GEMM; the
backward adds the sigma gradients, which Adam, the clip and Polyak treat as any parameter's (sigma does not
decay). The counter is carried across folds (a registry entry) and held by checkpoints; off, the step launches
exactly the noiseless step's kernels.

Spectral normalisation of the trunk (network.spectral_norm; agent/spectral.py, kernels/spectral.py): the learner
owns the power-iteration vectors (`spectral_uv`). In the online forward every trunk layer runs
network.spectral_iters power iterations on them and reads W / sigma; right after it, sigma's mean over the layers
joins the epoch sums (epoch stat spectral_sigma); the target forward reads the vectors without iterating, and the
backward turns each trunk weight's gradient into the gradient through sigma. The vectors are a fold-reset entry
(re-drawn per fold, then warmed up on the perturbed parameters: `reset_spectral`) and a checkpoint array.
Residual blocks and stochastic depth (network.residual, network.stochastic_depth; agent/depth.py): the online
network drops blocks per row, keyed by the optimiser's step counter; the target network keeps every block. Off,
the step launches exactly the plain trunk's kernels.

Variable selection (network.vsn; agent/vsn.py): the online network gates the observation before the trunk (or the
heads) read it and, handed the ISV, folds the gate's focus into ISV[VSN_FOCUS_MAX_EMA] and ISV[VSN_FOCUS_ENTROPY_EMA]
inside the forward; the target network gates without producing signals. The gate's parameters are entries of the
layout (Adam, clip, Polyak, checkpoints cover them); off, the step launches none of its kernels.

Mixture-of-experts heads (network.moe_experts = K > 0; agent/moe.py, kernels/moe.py): the online forward mixes the
K experts under the per-branch gate and reduces the gate's usage over the s rows; right after it one thread
(`moe.signals`) folds the usage into ISV 118-127, steps the lambda controller (ISV[MOE_LAMBDA_EFF]) and adds the
balance term to the epoch sums (epoch stat moe_balance); the backward adds lambda times the load-balancing gradient
to the gate's. The target forward mixes without signals. Experts and gate are entries of the layout, the signals ISV
slots (their fold-boundary resets in device/isv.py); off, the step launches none of its kernels.

IQN head beside C51 (network.iqn_quantiles = N > 0; agent/iqn.py, kernels/iqn.py): after the scatter and the
auxiliary regression the step draws N online and N target quantile levels per sample from the learner's generators
(after the replay draw, so the sample is the IQN-less step's), runs the online IQN head on the C51 heads' input of s
and the target's on s', takes the quantile Huber loss of every C51 branch row (its reward, discount, weight and the
same double-DQN a*) weighted by learner.iqn_weight, folds it into ISV[IQN_LOSS_EMA] and the epoch's loss_iqn, and
backpropagates into the IQN entries of the gradient and, with a trunk, into the trunk through the shared input
(Network.backward's input_grad). The IQN parameters are entries of the one layout, so the clip, Adam, Polyak,
shrink-and-perturb and checkpoints cover them; the head holds no other state (no registry entry). Off, the step
launches exactly the IQN-less step's kernels. Acting on the joint values: agent/iqn.py IqnActor.

Direction mean head (network.mean_head; agent/mean_head.py, kernels/mean_head.py): after the IQN head's place the
step runs the head's dense layer on the online s and s' rows and the target's s' rows, its squared error towards
r + discount m_target(s', argmax_d m(s', d)) on the direction rows (their rewards, discounts and weights) weighted by
learner.mean_weight, the epoch's loss_mean and mean_gap, and its backward into the mean entries of the gradient and,
with a trunk, into the trunk through input_grad; all of it on a side stream, joined before the C51 backward where that
takes its input_grad, else before the gradient norm. Off, the step launches none of its kernels. Acting on its values:
agent/mean_head.py MeanActor.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fox_numba.actions import N_BRANCHES, N_DIRECTIONS, N_HEADS, OrderType
from fox_numba.agent.dense import precision_dense
from fox_numba.agent.depth import StochasticDepth
from fox_numba.agent.environment import env_params
from fox_numba.agent.fold_market import FoldMarketDevice
from fox_numba.agent.iqn import IqnStep
from fox_numba.agent.mean_head import MEAN_B, MEAN_W, MeanStep, mean_head_parity
from fox_numba.agent.network import Dropout, Network, ParamLayout, init_params
from fox_numba.agent.noisy import STREAM_ONLINE, STREAM_TARGET, NoiseKey
from fox_numba.agent.replay import ReplayBatch, ReplayBuffer
from fox_numba.agent.spectral import WARMUP_ITERS, SpectralKey, init_vectors
from fox_numba.config import FoxConfig
from fox_numba.device.control import ControlBlock
from fox_numba.device.elementwise import axpy_f32, copy_u32, fill_u32, scale_f32
from fox_numba.device.graphs import StepGraph
from fox_numba.device.fork import SideStream
from fox_numba.device.launch import i32, launch_strided
from fox_numba.device.memory import device_empty, device_zeros, words
from fox_numba.device.rng import xoroshiro_states
from fox_numba.device.staging import Stager
from fox_numba.errors import ConfigError
from fox_numba.kernels.counterfactual import counterfactual_batch
from fox_numba.kernels.env import N_PARAMS, gather_obs
from fox_numba.kernels.heads import base_support, refresh_supports
from fox_numba.kernels.noisy import tick_noise
from fox_numba.kernels.learner import (
    BOOTSTRAP_RULES,
    SCHEDULE_DTYPE,
    BranchRows,
    add_obs_noise,
    aux_loss,
    branch_loss,
    finish,
    guard_loss,
    reset_counters,
    schedule_step,
    select_rows,
    shrink_perturb,
)
from fox_numba.kernels.mirror import mirror_project
from fox_numba.kernels.optim import (
    OPTIM_STATE_DTYPE,
    adam_update,
    global_grad_norm,
    norm_partials_len,
    polyak,
    shrink_adam_moments,
    update_adaptive_clip,
)
from fox_numba.kernels.signals import (
    N_EPOCH_STATS,
    N_LOSS_SUMS,
    N_Q_PARTIALS,
    EpochStat,
    hidden_partials_shape,
    produce_hidden_signals,
    produce_loss_signals,
    produce_q_signals,
    signal_partials_shape,
)
from fox_numba.kernels.spectral import spectral_epoch_stat
from fox_numba.observation import obs_dim

def check_counterfactual(cfg: FoxConfig) -> None:
    """learner.counterfactual's requirements (config.py), a ConfigError naming the first key that breaks one: the
    untaken directions are priced as market orders of one size from a state with no resting order, with the
    environment's PnL reward, one step on (kernels/counterfactual.py). Off, only learner.counterfactual_held (which
    needs it) is refused."""
    env, lc = cfg.env, cfg.learner
    if lc.counterfactual_history < 0:
        raise ConfigError(f"learner.counterfactual_history must be >= 0 bars, got {lc.counterfactual_history}")
    if lc.counterfactual_history > 0 and not lc.counterfactual_held:
        raise ConfigError("learner.counterfactual_history needs learner.counterfactual_held = true")
    if lc.counterfactual_hold_bars < 1:
        raise ConfigError(f"learner.counterfactual_hold_bars must be >= 1 bar, got {lc.counterfactual_hold_bars}")
    if lc.counterfactual_hold_bars > 1 and not lc.counterfactual:
        raise ConfigError("learner.counterfactual_hold_bars above 1 needs learner.counterfactual = true (without it "
                          "learner.n_step gives multi-bar returns)")
    if not lc.counterfactual:
        if lc.counterfactual_held:
            raise ConfigError("learner.counterfactual_held needs learner.counterfactual = true")
        return
    problems = (
        (env.fixed_bins[0] < 0, "env.fixed_bins must fix the magnitude (its first entry >= 0)"),
        (env.fixed_bins[1] != int(OrderType.MARKET), "env.fixed_bins must fix the order type to Market (0)"),
        (lc.n_step != 1, "learner.n_step must be 1"),
        (any(w != 0 for w in (env.w_timing, env.w_persist, env.w_regime, env.w_novelty, env.w_stable)),
         "every env.w_* shaping weight must be 0"),
        (lc.priority_alpha > 0, "learner.priority_alpha must be 0 (no prioritised replay)"),
        (env.hindsight_fraction > 0, "env.hindsight_fraction must be 0"),
        (cfg.network.iqn_quantiles > 0, "network.iqn_quantiles must be 0"),
        (lc.batch_size % N_DIRECTIONS != 0, f"learner.batch_size must be a multiple of {N_DIRECTIONS}"),
    )
    for broken, what in problems:
        if broken:
            raise ConfigError(f"learner.counterfactual: {what} (counterfactual targets are on by default: set "
                              "learner.counterfactual=false and learner.counterfactual_held=false to train without "
                              "them)")


def live_branches(cfg: FoxConfig) -> int:
    """The branches whose head columns the network computes (agent/network.py, ParamLayout.live_branches): all of
    them, unless the counterfactual learner trains the direction branch alone (its targets give the others' rows
    weight 0, so their parameters never move) with no part that writes every head column (NoisyNet or MoE heads, the
    auxiliary forecast); then the direction branch and each later one up to the last the policy chooses
    (env.fixed_bins -1), whose untrained heads it still reads."""
    lc, net = cfg.learner, cfg.network
    if not lc.counterfactual or net.noisy_sigma0 > 0 or net.moe_experts or lc.aux_weight > 0:
        return N_BRANCHES
    return max([1] + [b + 2 for b, fixed in enumerate(cfg.env.fixed_bins) if fixed < 0])  # entry b: branch b + 1


def run_layout(cfg: FoxConfig) -> ParamLayout:
    """The network layout of a run (the trainer's, `fox evaluate`'s): over obs_dim(cfg.features) columns, its VSN
    groups and Mamba2 inputs taken from cfg.features, its `live_branches`."""
    return ParamLayout.build(obs_dim(cfg.features), cfg.network, features=cfg.features,
                             live_branches=live_branches(cfg))


class Learner:
    """The train stage around one fold's replay buffer and market observations (module header)."""

    # Wiring, constants and per-step scratch (rewritten before every read within a step, so nothing a fold
    # could leak); the state is params, target, adam_m, adam_v, optim_state, fresh, rng_states and the
    # supports, each an entry of walkforward/trainer_state.py.
    NOT_STATE = (
        "cfg", "layout", "replay", "market_obs", "isv", "stager", "stream", "seed", "batch_size", "steps_per_epoch",
        "online", "target_net", "graph", "batch", "obs", "obs_next", "rows", "q", "entropy",
        "util", "grads", "aux_target", "norm_partials", "adam_partials", "polyak_partials", "loss_partials",
        "q_partials", "hidden_partials", "decay_mask", "branch_weights", "schedule", "epoch",
        "is_weights", "iqn", "mean", "draw", "book", "env_params", "lr_scale", "mirror", "side",
        "head_side", "diag_side",
    )

    def __init__(
        self, cfg: FoxConfig, layout: ParamLayout, replay: ReplayBuffer, market_obs: Any, aux_target: Any, *,
        isv: Any, stager: Stager, stream: Any, seed: int | None = None, dense: str = "auto", day_first: Any = None,
        book: FoldMarketDevice | None = None, book_obs: Any = None,
    ) -> None:
        """`day_first` [fold rows] (FoldMarketDevice.day_first): where the Mamba2 encoder's windows stop (a layout
        with network.mamba2_window needs it; the windows read market_obs, so learner.obs_noise does not reach them).
        `book`: the fold's market on the device, which learner.counterfactual prices the untaken directions on.
        `book_obs` [fold rows, BOOK_FEATURES] (FoldMarketDevice.book_obs): the TLOB encoder's snapshots."""
        lc = cfg.learner
        check_counterfactual(cfg)
        if len(lc.branch_weights) != N_BRANCHES or min(lc.branch_weights) < 0:
            raise ValueError(f"learner.branch_weights needs {N_BRANCHES} weights >= 0, got {lc.branch_weights}")
        if not (0.0 <= lc.gamma < 1.0 and 0.0 <= lc.lr_min_frac <= 1.0 and 0.0 <= lc.tau_min_frac <= 1.0
                and 0.0 < lc.tau <= 1.0 and lc.batch_size >= 1 and lc.steps_per_epoch >= 1 and lc.aux_weight >= 0
                and lc.obs_noise >= 0 and 0.0 <= lc.dropout < 1.0 and 0.0 <= lc.fold_keep <= 1.0
                and lc.refit_lr_scale > 0):
            raise ValueError("learner config out of range: need 0 <= gamma < 1, lr_min_frac, tau_min_frac and "
                             "fold_keep in [0, 1], 0 < tau <= 1, batch_size >= 1, steps_per_epoch >= 1, aux_weight "
                             ">= 0, obs_noise >= 0, 0 <= dropout < 1, refit_lr_scale > 0")
        if not cfg.network.head_init_scale >= 0:
            raise ValueError(f"network.head_init_scale must be >= 0, got {cfg.network.head_init_scale}")
        if cfg.evaluation.average_start < 0:
            raise ValueError(f"evaluation.average_start must be >= 0, got {cfg.evaluation.average_start}")
        if lc.n_step < 1:
            raise ValueError(f"learner.n_step must be >= 1, got {lc.n_step}")
        if not (lc.priority_alpha >= 0 and 0.0 <= lc.priority_beta0 <= 1.0 and lc.priority_eps > 0):
            raise ValueError("prioritised replay out of range: need learner.priority_alpha >= 0, priority_beta0 in "
                             f"[0, 1] and priority_eps > 0; got {lc.priority_alpha}, {lc.priority_beta0}, "
                             f"{lc.priority_eps}")
        if lc.bootstrap not in BOOTSTRAP_RULES:
            raise ValueError(f"learner.bootstrap must be one of {BOOTSTRAP_RULES}, got {lc.bootstrap!r}")
        if not lc.iqn_weight >= 0:
            raise ValueError(f"learner.iqn_weight must be >= 0, got {lc.iqn_weight}")
        if not lc.mean_weight >= 0:
            raise ValueError(f"learner.mean_weight must be >= 0, got {lc.mean_weight}")
        if not (lc.weight_decay >= 0 and lc.encoder_weight_decay >= 0):
            raise ValueError(f"learner.weight_decay and encoder_weight_decay must be >= 0, got {lc.weight_decay}, "
                             f"{lc.encoder_weight_decay}")
        if cfg.run.diag_every < 1:
            raise ValueError(f"run.diag_every must be >= 1, got {cfg.run.diag_every}")
        self.cfg, self.layout, self.replay, self.isv = cfg, layout, replay, isv
        dense = precision_dense(cfg.run.precision) if dense == "auto" else dense  # run.precision (agent/dense.py)
        self.stager, self.stream = stager, stream
        self.seed = cfg.run.seed if seed is None else seed
        b, z, n = lc.batch_size, layout.n_atoms, layout.size
        self.batch_size, self.steps_per_epoch = b, lc.steps_per_epoch
        n_port = replay.n_port
        self._check_market(market_obs, aux_target, n_port)
        self.market_obs, self.aux_target = market_obs, aux_target

        # parameters, target, optimiser state (the layout's one flat buffer each)
        self.params = stager.upload_new(init_params(layout, self.seed, cfg.network.head_init_scale))
        self.target = device_empty(n, np.float32)
        self.grads = device_zeros(n, np.float32, stream=stream)
        self.adam_m = device_zeros(n, np.float32, stream=stream)
        self.adam_v = device_zeros(n, np.float32, stream=stream)
        # each element's AdamW decay rate (adam_update's weight_decay is then 1: the same float32 product)
        rates = layout.decay_mask(lc.weight_decay, lc.weight_decay + lc.encoder_weight_decay)
        self.decay_mask = stager.upload_new(rates)
        self.fresh = device_empty(n, np.float32)  # shrink-and-perturb's fresh draw
        self.average = device_zeros(n, np.float32, stream=stream)  # the fold's running mean of epoch-end params
        self.mirror = stager.upload_new(mean_head_parity(cfg, layout)) if cfg.network.mirror else None
        """network.mirror: the parity of the mean head's input columns (kernels/mirror.py); None off."""
        self.project_mirror(stream)
        self.optim_state = device_zeros(1, OPTIM_STATE_DTYPE, stream=stream)
        self.schedule = ControlBlock(SCHEDULE_DTYPE)
        self.lr_scale = 1.0
        """The fold's factor on learner.lr (learner.refit_lr_scale after the first fold; the trainer sets it)."""
        weights = np.asarray(lc.branch_weights, np.float32)
        if lc.counterfactual:  # only the direction branch trains (its four rows per transition)
            weights[1:] = 0.0
        self.branch_weights = stager.upload_new(weights)
        self.rng_states = xoroshiro_states(b, self.seed, stager)
        self.epoch = device_zeros(N_EPOCH_STATS, np.float64, stream=stream)
        k = norm_partials_len(n)
        self.norm_partials = device_zeros(k, np.float64, stream=stream)
        self.adam_partials = device_zeros(k, np.float64, stream=stream)
        self.polyak_partials = device_zeros((k, 2), np.float64, stream=stream)
        self.q_partials = device_empty(signal_partials_shape(b, N_Q_PARTIALS), np.float64)
        self.loss_partials = device_empty(signal_partials_shape(N_BRANCHES * b, N_LOSS_SUMS), np.float64)

        # supports: per head [13, 3]
        base = base_support(cfg.network.v_min, cfg.network.v_max, z)
        self.support_online = stager.upload_new(base)
        self.support_target = stager.upload_new(base)
        self.support_average = stager.upload_new(base)
        self.restart_average()

        # the step's buffers; counterfactual targets draw B / 4 transitions (`draw`) and train on their B rows
        self.batch = ReplayBatch(b, stream=stream, n_port=n_port)
        self.draw = ReplayBatch(b // N_DIRECTIONS, stream=stream, n_port=n_port) if lc.counterfactual else self.batch
        self.env_params = device_zeros(N_PARAMS, np.float64, stream=stream) if lc.counterfactual else None
        self.book: FoldMarketDevice | None = None
        self._bind_book(book)
        self.is_weights: Any = None  # the batch's importance weights [B] (prioritised replay only)
        if lc.priority_alpha > 0:
            replay.prioritise(stream=stream)
            self.is_weights = device_empty(b, np.float32)
        self.obs = device_empty((2 * b, layout.obs_dim), np.float32)  # s rows, then s' rows
        self.obs_next = self.obs[b:]
        drop = Dropout(lc.dropout, self.optim_state, self.seed) if lc.dropout > 0 else None
        # NoisyNet heads: the draw counter of both networks, ticked once per step (agent/noisy.py)
        self.noise_step = device_zeros(1, np.int64, stream=stream) if layout.noisy else None
        noise_on, noise_tgt = (
            (NoiseKey(self.noise_step, self.seed, STREAM_ONLINE), NoiseKey(self.noise_step, self.seed, STREAM_TARGET))
            if self.noise_step is not None else (None, None)
        )
        # spectral normalisation: the trunk's power-iteration vectors; the online network iterates, the target reads
        self.spectral_uv = stager.upload_new(init_vectors(layout, self.seed)) if layout.spectral_norm else None
        spec_on, spec_tgt = (
            (SpectralKey(self.spectral_uv, cfg.network.spectral_iters), SpectralKey(self.spectral_uv, 0))
            if self.spectral_uv is not None else (None, None)
        )
        depth = StochasticDepth(cfg.network.stochastic_depth, self.optim_state, self.seed)
        self.online = Network(layout, 2 * b, stream=stream, grad_rows=b, dense=dense, dropout=drop, noise=noise_on,
                              spectral=spec_on, depth=depth, isv=isv)  # isv: the VSN and MoE gates' signals of s
        self.target_net = Network(layout, b, stream=stream, dense=dense, noise=noise_tgt, spectral=spec_tgt)
        # side streams of the step (_step): the target forward beside the online forward, unless it reads the spectral
        # vectors the online forward iterates, then the loss and Q signals beside the backward; the mean head's step;
        # the hidden signals beside everything after the online forward
        self.side, self.head_side, self.diag_side = SideStream(), SideStream(), SideStream()
        self._bind_encoders(market_obs, day_first, book_obs)
        self.q = device_empty((2 * b, N_HEADS), np.float32)
        self.entropy = device_empty((b, N_HEADS), np.float32)  # of s (the Q signals read s only)
        self.util = device_empty((b, N_HEADS), np.float32)
        self.rows = BranchRows(b, z)
        self.hidden_partials = (
            device_empty(hidden_partials_shape(layout.n_layers, b, layout.hidden), np.float32)
            if layout.n_layers else None
        )
        # the IQN head beside C51 (network.iqn_quantiles > 0; agent/iqn.py): its step buffers
        self.iqn = (
            IqnStep(layout, b, cfg.network.iqn_quantiles, lc.iqn_weight, params=self.params, target=self.target,
                    grads=self.grads)
            if layout.iqn else None
        )
        # the direction mean head (network.mean_head; agent/mean_head.py): its step buffers
        self.mean = (MeanStep(layout, b, lc.mean_weight, params=self.params, target=self.target, grads=self.grads,
                              dense=dense) if layout.mean_head else None)
        if self.spectral_uv is not None:
            self.reset_spectral(self.seed)
        self.sync_target()
        self.graph = StepGraph("learner.step", self._step, stream, use_graph=cfg.run.graphs)

    def _bind_encoders(self, market_obs: Any, day_first: Any, book_obs: Any) -> None:
        """The fold's market for both networks' Mamba2 or TLOB encoders (network.mamba2_window, tlob_window; nothing
        without one)."""
        if not self.layout.windowed:
            return
        if day_first is None:
            raise ValueError("Learner: a layout with the Mamba2 or TLOB encoder (network.mamba2_window, tlob_window) "
                             "needs day_first= (FoldMarketDevice.day_first)")
        self.online.bind_market(market_obs, day_first, book_obs)
        self.target_net.bind_market(market_obs, day_first, book_obs)

    def _bind_book(self, book: FoldMarketDevice | None) -> None:
        """The fold's book and environment parameters for counterfactual targets (nothing without them)."""
        if self.env_params is None:
            return
        if book is None:
            raise ValueError("Learner: learner.counterfactual needs book= (the fold's FoldMarketDevice)")
        self.book = book
        self.stager.upload(env_params(book.host, self.cfg.env, self.cfg.features), self.env_params)

    def _check_market(self, market_obs: Any, aux_target: Any, n_port: int) -> None:
        if tuple(aux_target.shape) != (int(market_obs.shape[0]),):
            raise ValueError(f"aux_target has shape {tuple(aux_target.shape)}, market_obs {market_obs.shape[0]} rows")
        width = int(market_obs.shape[1]) + n_port
        if width != self.layout.obs_dim:
            raise ValueError(
                f"market_obs has {market_obs.shape[1]} columns and the replay's portfolio {n_port}: {width}, "
                f"the network's obs_dim is {self.layout.obs_dim}"
            )

    # ---- one gradient step (the StepGraph body) ---------------------------------------------------------

    def _step(self, s: Any) -> None:
        lc, bt, draw, rows, n = self.cfg.learner, self.batch, self.draw, self.rows, self.layout.size
        schedule_step(self.schedule.device, self.optim_state, self.isv, stream=s)
        if self.noise_step is not None:
            tick_noise(self.noise_step, stream=s)
        prio = self.replay.priorities if lc.priority_alpha > 0 else None
        if prio is not None:
            prio.sample(self.rng_states, draw.idx, stream=s)
        else:
            self.replay.sample(self.rng_states, draw.idx, stream=s)
        self.replay.gather(draw, stride=self.cfg.env.n_envs, n_step=lc.n_step, gamma=lc.gamma, stream=s)
        if draw is not bt:
            counterfactual_batch(self.book, self.env_params, self.replay.entry, self.cfg.env.fixed_bins[0], draw, bt,
                                 held=lc.counterfactual_held, history=lc.counterfactual_history,
                                 hold_bars=lc.counterfactual_hold_bars, gamma=lc.gamma, stream=s)
        gather_obs(self.market_obs, bt.rows, bt.port, self.obs, stream=s)
        if lc.obs_noise > 0:
            add_obs_noise(self.obs, self.rng_states, lc.obs_noise, int(self.market_obs.shape[1]), stream=s)
        # The target forward on a side stream beside the online one (device/fork.py): it reads s' and the target's
        # parameters and writes only target_net's buffers (the target has no ISV, dropout or depth; its NoisyNet
        # draw is its own), none of which the online forward or its statistics touch.
        target_rows, beside = bt.rows[self.batch_size :], not self.layout.spectral_norm
        if beside:
            self.target_net.forward(self.target, self.obs_next, None, stream=self.side.fork(s), rows=target_rows)
        self.online.forward(self.params, self.obs, None, stream=s, rows=bt.rows)  # s, s' (s kept for backward)
        if self.hidden_partials is not None:  # reads the activations of s, which nothing rewrites before the next step
            produce_hidden_signals(self.online.activations, self.hidden_partials, self.isv, self.optim_state,
                                   n_rows=self.batch_size, diag_every=self.cfg.run.diag_every,
                                   stream=self.diag_side.fork(s))
        if self.online.spectral is not None:
            spectral_epoch_stat(self.online.spectral.sigma, self.epoch, stream=s)
        if self.online.moe is not None:
            self.online.moe.signals(self.epoch, stream=s)
        if beside:
            self.side.join(s)
        else:  # after the online forward's power iteration, whose vectors it reads
            self.target_net.forward(self.target, self.obs_next, None, stream=s, rows=target_rows)
        self._c51_rows(s, prio)
        if prio is not None:
            prio.update(bt.idx, rows.loss, alpha=lc.priority_alpha, eps=lc.priority_eps, stream=s)
        # The loss and Q signals beside the rest until the guard reads LOSS_RAW: they read the branch rows and the
        # online E[Q], entropy and utilisation, which the heads' losses and the backward only read, and write ISV
        # slots and epoch sums of their own.
        signals = self.side.fork(s)
        produce_loss_signals(rows.loss, rows.weights, rows.stats, self.loss_partials, self.isv, self.epoch,
                             stream=signals)
        produce_q_signals(self.q[: self.batch_size], self.entropy, self.util, self.q_partials, self.isv, self.epoch,
                          n_rows=self.batch_size, n_atoms=self.layout.n_atoms, stream=signals)
        if lc.aux_weight > 0:  # off: the forecast column's dhead stays at its allocation zeros
            aux_loss(self.online.head_out, bt.rows, self.aux_target, lc.aux_weight, self.online.dhead, self.isv,
                     self.epoch, stream=s)
        head_dx = None
        if self.iqn is not None:
            b = self.batch_size
            self.iqn.run(self.online.head_input(b), self.target_net.head_input(b), self.q, bt.actions, rows,
                         self.rng_states, self.isv, self.epoch, bootstrap=lc.bootstrap, stream=s)
            head_dx = self.iqn.online.dx if self.layout.n_layers else None
        if self.mean is not None:
            # On a side stream: it reads both forwards' inputs and the C51 rows, writes its own buffers, gradient
            # entries and epoch sums; the C51 backward needs its dx (with a trunk or an encoder), the norm all of it.
            self.mean.run(self.online.mean_input(2 * self.batch_size), self.target_net.mean_input(self.batch_size),
                          bt.actions, rows, self.epoch, stream=self.head_side.fork(s))
            head_dx = self.mean.dx
            if head_dx is not None:
                self.head_side.join(s)
        self.online.backward_from_head(self.params, self.grads, stream=s, input_grad=head_dx)
        if self.mean is not None and self.mean.dx is None:
            self.head_side.join(s)
        global_grad_norm(self.grads, self.norm_partials, self.isv, stream=s)
        self.side.join(s)
        guard_loss(self.isv, stream=s)
        update_adaptive_clip(self.isv, lc.clip_ema_mult, stream=s, warmup_rule=lc.warmup_rule)
        adam_update(self.params, self.grads, self.adam_m, self.adam_v, self.decay_mask, self.isv, self.optim_state,
                    self.adam_partials, beta1=lc.adam_beta1, beta2=lc.adam_beta2, eps=lc.adam_eps,
                    weight_decay=1.0, stream=s)
        self.project_mirror(s)
        polyak(self.target, self.params, self.isv, self.optim_state, self.polyak_partials, stream=s)
        finish(self.isv, self.optim_state, self.adam_partials, self.polyak_partials, n, self.support_online,
               self.support_target, self.epoch, stream=s)
        if self.hidden_partials is not None:
            self.diag_side.join(s)

    def _c51_rows(self, s: Any, prio: Any) -> None:
        """The C51 part of the step between the forwards and the loss consumers, two fused passes: the online E[Q]
        statistics and the double DQN rows (select_rows), the importance weights (prioritised: `prio`), then the
        projection, the cross-entropy and its gradient through the dueling combine into the online dhead
        (branch_loss)."""
        lc, bt, rows = self.cfg.learner, self.batch, self.rows
        head, head_tgt = self.online.head_out, self.target_net.head_out
        select_rows(head, head_tgt, self.support_online, self.support_target, bt.actions, bt.rewards, bt.discounts,
                    self.branch_weights, self.q, self.entropy, self.util, rows, stream=s, bootstrap=lc.bootstrap,
                    live=self.layout.live_branches)
        if prio is not None:
            prio.weights(bt.idx, self.schedule.device, self.optim_state, lc.priority_beta0, rows.weights,
                         self.is_weights, stream=s)
        branch_loss(head, head_tgt, rows, bt.actions, self.support_online, self.support_target, self.online.dhead,
                    stream=s, live=self.layout.live_branches)

    # ---- per epoch ----------------------------------------------------------------------------------------

    def set_schedule(self) -> None:
        """Write the schedule constants (host, once per epoch) and queue their upload on the stream."""
        lc = self.cfg.learner
        self.schedule.set(
            lr_base=np.float32(lc.lr * self.lr_scale), lr_min_frac=np.float32(lc.lr_min_frac),
            tau_base=np.float32(lc.tau),
            tau_min_frac=np.float32(lc.tau_min_frac), horizon=lc.epochs * lc.steps_per_epoch,
        )
        self.schedule.upload(self.stream)

    def refresh_supports(self) -> None:
        """Per epoch, before collect: each head's online support from the ISV (rule in kernels/heads.py)."""
        nc = self.cfg.network
        refresh_supports(self.isv, self.support_online, v_min=nc.v_min, v_max=nc.v_max, gamma=self.cfg.learner.gamma,
                         scale_cap=nc.support_max_scale, n_atoms=self.layout.n_atoms, stream=self.stream)

    def step(self) -> None:
        """One gradient step (one replay), asynchronously; the schedule must have been set."""
        if self.schedule.pending:
            self.set_schedule()
        self.graph.replay()

    def train_epoch(self, steps: int | None = None) -> None:
        """`steps` (default learner.steps_per_epoch) gradient steps queued back to back; no host sync."""
        self.set_schedule()
        for _ in range(self.steps_per_epoch if steps is None else steps):
            self.graph.replay()

    def epoch_stats(self) -> dict[str, float]:
        """Means over the epoch's steps (one device read, then the sums restart at 0)."""
        acc = self.stager.download(self.epoch)
        self._zero_epoch()
        applied = max(acc[EpochStat.APPLIED], 1.0)
        steps = max(acc[EpochStat.STEPS], 1.0)
        stats = {
            "steps": float(acc[EpochStat.STEPS]),
            "applied_steps": float(acc[EpochStat.APPLIED]),
            "skipped_steps": float(acc[EpochStat.SKIPPED]),
            "loss": float(acc[EpochStat.LOSS] / applied),
            "loss_direction": float(acc[EpochStat.LOSS_DIR] / applied),
            "loss_magnitude": float(acc[EpochStat.LOSS_MAG] / applied),
            "loss_order": float(acc[EpochStat.LOSS_ORD] / applied),
            "loss_urgency": float(acc[EpochStat.LOSS_URG] / applied),
            "grad_norm": float(acc[EpochStat.GRAD_NORM] / applied),
            "q_mean": float(acc[EpochStat.Q_MEAN] / steps),
            "td_abs": float(acc[EpochStat.TD_ABS] / applied),
        }
        if self.cfg.learner.aux_weight > 0:  # an untrained column's loss would mean nothing
            stats["loss_aux"] = float(acc[EpochStat.LOSS_AUX] / steps)
        if self.iqn is not None:
            stats["loss_iqn"] = float(acc[EpochStat.LOSS_IQN] / steps)
        if self.mean is not None:
            stats["loss_mean"] = float(acc[EpochStat.LOSS_MEAN] / steps)
            stats["mean_gap"] = float(acc[EpochStat.MEAN_GAP] / steps)
        if self.spectral_uv is not None:
            stats["spectral_sigma"] = float(acc[EpochStat.SPECTRAL_SIGMA] / steps)
        if self.online.moe is not None:
            stats["moe_balance"] = float(acc[EpochStat.MOE_BALANCE] / steps)
        return stats

    def _zero_epoch(self) -> None:
        w = words(self.epoch)
        launch_strided(fill_u32, w.size, w, np.uint32(0), i32(w.size), stream=self.stream)

    # ---- fold boundary (each a kernel launch or two; the walk-forward driver calls them) -----------------

    def shrink_perturb(self, seed: int) -> None:
        """theta = keep theta + (1 - keep) theta_fresh, keep = learner.fold_keep, theta_fresh = init_params(layout,
        seed, network.head_init_scale)."""
        self.stager.upload(init_params(self.layout, seed, self.cfg.network.head_init_scale), self.fresh)
        shrink_perturb(self.params, self.fresh, self.cfg.learner.fold_keep, stream=self.stream)
        self.project_mirror(self.stream)

    def project_mirror(self, stream: Any) -> None:
        """With network.mirror, the mean head's weights moved network.mirror_strength of the way to mirror-symmetric
        ones in place (kernels/mirror.py); off, nothing."""
        if self.mirror is not None:
            mirror_project(self.params, self.mirror, w_offset=self.layout.entry(MEAN_W).offset,
                           b_offset=self.layout.entry(MEAN_B).offset, strength=self.cfg.network.mirror_strength,
                           stream=stream)

    def sync_target(self) -> None:
        """target = params and target supports = online supports."""
        for dst, src in ((self.target, self.params), (self.support_target, self.support_online)):
            self._copy_words(dst, src)

    def restart_average(self) -> None:
        """The weight average restarts at the current parameters and supports (a fold boundary)."""
        self._copy_words(self.average, self.params)
        self._copy_words(self.support_average, self.support_online)

    def average_epoch(self, epoch: int) -> None:
        """Fold the parameters and supports at the end of the fold's epoch `epoch` into their running mean:
        average += (x - average) / k with k = epoch - evaluation.average_start + 1, and average = x while k <= 1
        (epochs before average_start only follow the current network). evaluation.network = 'average' trades
        with it: the mean of the fold's epoch-end networks, SWA's estimate (Izmailov et al. 2018), which
        does not depend on where in its epoch-to-epoch swing the last epoch stopped."""
        k = epoch - self.cfg.evaluation.average_start + 1
        for avg, x in ((self.average, self.params), (self.support_average, self.support_online)):
            if k <= 1:
                self._copy_words(avg, x)
                continue
            flat_avg, flat_x = avg.reshape(avg.size), x.reshape(x.size)
            launch_strided(scale_f32, flat_avg.size, flat_avg, np.float32(1.0 - 1.0 / k), i32(flat_avg.size),
                   stream=self.stream)
            launch_strided(axpy_f32, flat_avg.size, flat_avg, np.float32(1.0 / k), flat_x, i32(flat_avg.size),
                   stream=self.stream)

    def _copy_words(self, dst: Any, src: Any) -> None:
        dw, sw = words(dst), words(src)
        launch_strided(copy_u32, dw.size, dw, sw, i32(dw.size), stream=self.stream)

    def reset_spectral(self, seed: int) -> None:
        """The spectral norm's vectors re-drawn from `seed`, then WARMUP_ITERS power iterations on the current
        parameters (agent/spectral.py): run after shrink-and-perturb at a fold boundary."""
        if self.spectral_uv is None or self.online.spectral is None:
            raise RuntimeError("Learner.reset_spectral: the layout has no spectral normalisation")
        self.stager.upload(init_vectors(self.layout, seed), self.spectral_uv)
        self.online.spectral.power(self.layout.views(self.params), WARMUP_ITERS, stream=self.stream)

    def shrink_adam(self) -> None:
        """m *= 0.1, v *= 0.01 (kernels/optim.py); Adam's t restarts with reset_step_counter."""
        shrink_adam_moments(self.adam_m, self.adam_v, stream=self.stream)

    def reset_step_counter(self) -> None:
        """The schedule's step and Adam's t restart at 0 (the cosine and the bias correction start again)."""
        reset_counters(self.optim_state, stream=self.stream)

    def set_market(self, market_obs: Any, aux_target: Any, day_first: Any = None,
                   book: FoldMarketDevice | None = None, book_obs: Any = None) -> None:
        """Bind another fold's market observations, auxiliary targets, (the Mamba2 and TLOB encoders) day_first,
        (counterfactual targets) book and (the TLOB encoder) book_obs (the step is captured again at its next
        replays)."""
        self._check_market(market_obs, aux_target, self.replay.n_port)
        self.market_obs, self.aux_target = market_obs, aux_target
        self._bind_encoders(market_obs, day_first, book_obs)
        self._bind_book(book)
        self.graph = StepGraph("learner.step", self._step, self.stream, use_graph=self.cfg.run.graphs)

    # ---- state ----------------------------------------------------------------------------------------------

    def state_arrays(self) -> dict[str, Any]:
        """Every device array a checkpoint needs to resume training bit for bit, by name (prioritised, the replay's
        priorities too: the checkpoint holds the replay's contents; noisy, the noise counter; spectral normalisation,
        the power-iteration vectors)."""
        arrays = {
            "params": self.params,
            "target_params": self.target,
            "adam_m": self.adam_m,
            "adam_v": self.adam_v,
            "optim_state": self.optim_state,
            "rng_states": self.rng_states,
            "support_online": self.support_online,
            "support_target": self.support_target,
            "average_params": self.average,
            "support_average": self.support_average,
        }
        prio = self.replay.priorities
        if self.cfg.learner.priority_alpha > 0 and prio is not None:
            arrays |= {"priority_tree": prio.tree, "priority_max": prio.max_priority}
        if self.noise_step is not None:
            arrays["noise_step"] = self.noise_step
        if self.spectral_uv is not None:
            arrays["spectral_uv"] = self.spectral_uv
        return arrays

    def load_state(self, arrays: dict[str, np.ndarray]) -> None:
        """Upload host arrays (a checkpoint's) into the arrays of `state_arrays` (names and shapes must match)."""
        dev = self.state_arrays()
        missing = set(dev) - set(arrays)
        if missing:
            raise KeyError(f"learner state lacks {sorted(missing)}")
        for name, arr in dev.items():
            self.stager.upload(np.ascontiguousarray(arrays[name]), arr)

    def read_optim_state(self) -> np.ndarray:
        """A host copy of the optimiser state record (step, adam_t, lr, tau); synchronises."""
        return self.stager.download(self.optim_state)[0]
