"""One typed config tree, with the help text of every field beside its default.

`FoxConfig` holds one dataclass per stage (market, features, folds, env, network, learner, evaluation,
run). A run starts from a preset (`default` for a GPU, `smoke` for the CPU simulator), then a TOML file,
then `section.field=value` overrides from the command line; the resolved tree is written into every run
folder (`config.toml`) so a run can be repeated exactly.

Architectural constants that are not meant to be tuned (ISV slots, HEALTH_DIAG layout, the floors of
adaptive multipliers) live beside the code that owns them, not here.
"""

from __future__ import annotations

import datetime
import json
import math
import sys
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, get_type_hints

from fox_numba.errors import ConfigError
from fox_numba.io import atomic_write_text, generated_doc_main


CHOICES: dict[str, tuple[str, ...]] = {
    "market.session": ("regular", "full"),
    "features.ema_start": ("first", "zero"),
    "learner.bootstrap": ("direction", "branch"),
    "learner.warmup_rule": ("seed", "damped"),
    "evaluation.network": ("online", "target", "average"),
    "run.precision": ("fp32", "tf32", "bf16"),
}
"""The string fields that take one of a few names: checked as a config is resolved (a ConfigError naming the
field and the names), and the one list the modules that act on them read."""
INT_CHOICES: dict[str, tuple[int, ...]] = {
    "network.moe_experts": (0, 2, 3, 4, 5, 6, 7, 8),  # off, or 2 .. 8 experts (the seed's 8 ISV utilisation slots)
}
"""The integer fields that take one of a few values, checked as CHOICES are; device/isv.py and kernels/moe.py read
the mixture-of-experts sizes from here."""


def opt(default: Any, help: str) -> Any:
    """A config field: its default and its help text (written above the field in every `config.toml`)."""
    if isinstance(default, list):  # a mutable default: each config gets its own copy
        return field(default_factory=lambda: list(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass
class MarketConfig:
    store: str = opt(
        "default",
        "HDF5 market store to train on, or 'default' for the embedded synthetic ES market "
        "(built from data/default_market.toml on first use and cached).",
    )
    first_day: str = opt("", "First trading day to use, YYYY-MM-DD (empty: the store's first).")
    last_day: str = opt("", "Last trading day to use, YYYY-MM-DD (empty: the store's last).")
    session: str = opt(
        "regular",
        "Bars that features and episodes use: 'regular' (the instrument's regular hours, ES 09:30-16:00 New "
        "York) or 'full' (the whole trading day, ES: the Globex day 18:00-17:00 New York). A day without a bar "
        "in the session is skipped with a note.",
    )
    cache: str = opt(
        "auto",
        "Folder of the per-day cache keyed by each day's content digest (days already validated, per-day "
        "features): 'auto' beside the store (STORE.cache/), 'off' for none (every stage reads and validates "
        "every day), or a folder. A damaged or mismatched entry is ignored and rebuilt.",
    )
    read_workers: int = opt(
        0,
        "Processes that read the days missing from the feature cache and build their features, a day each at a "
        "time, once this process has built the first: 0 for one per core, at most 8, where 8 or more days are "
        "missing (fewer take about as long as the processes take to start); 1 builds every day in this process. "
        "Each holds a block of one day's book, about 0.3 GiB at 3 M rows a day. The features are the same bit for "
        "bit whatever the count (features/cache.py).",
    )


@dataclass
class FeatureConfig:
    n_features: int = opt(32, "Width of the per-bar feature vector the network sees.")
    ofi_levels: int = opt(10, "Book levels summed into multi-level order-flow imbalance (1..10).")
    clip_sigma: float = opt(5.0, "Normalised features are clipped to +-clip_sigma standard deviations.")
    ema_start: str = opt(
        "zero",
        "How each day's EMA columns start (fox_numba/OBSERVATION.md). 'zero' (the default): the EMA starts from 0 "
        "before the day's first bar (ema = alpha z there), an average of the day's bars shrunk towards the "
        "training mean while the day has few bars, so a linear read can weigh the open's evidence less. 'first': "
        "at the day's first bar the EMA is that bar's z, which weighs the first, noisiest bars fully. With 'zero' "
        "the probe earned more on all seven suite markets (tools/results/learner_ablation_h200.md section 38) and "
        "the agent, 5 seeds on the suite, +0.46 (SE 0.14) on the seen markets pooled and +2.50 (0.19) on the "
        "held-out ones (section 40).",
    )
    tw_imbalance: bool = opt(
        True,
        "The time-weighted book imbalance block (fox_numba/OBSERVATION.md): 48 market columns after the 128 "
        "feature columns, the 12 columns of features/book_features.py time_weighted_imbalance (each bar's depth "
        "imbalance averaged over its book states, each weighted by the time it rests, at each level 1-10 and over "
        "levels 1-5 and 1-10), normalised on the fold's training rows and clipped as the features are, with their "
        "per-day EMAs; the probe, the forecast columns and a Mamba2 encoder read it too. Built from each day's "
        "MBP-10 rows only when on. The default since section 68 of tools/results/learner_ablation_h200.md: on the "
        "suite, paired by seed over ten seeds, the seen markets +2.99 (SE 0.11) and the held-out ones +0.00 (0.26) "
        "(volatile +1.02, trade flow, whose signal is in the trades, -1.02); the probe reads it too and gains less. "
        "In tools/feature_read.py it raised the probe's correlation with the latent on all 14 (market, fold) cells "
        "(section 67).",
    )
    forecast_horizons: list[int] = opt(  # noqa: RUF009 (opt gives a list default its default_factory)
        [],
        "Forecast columns appended to the observation's market part, one per horizon in bars (empty: none): "
        "a ridge forecast of the forward mid change over that horizon from the bar's market row, fitted on the "
        "fold's training rows only and standardised on them (features/forecast.py). The probe's own forecast "
        "as an input: a run with them is not pure RL, and says so in its config. [5, 15, 60] lost on the "
        "market suite's seen markets (tools/results/learner_ablation_h200.md section 13).",
    )
    forecast_ridge: float = opt(
        0.01, "Ridge penalty per training row of the forecast columns (as evaluation.probe_ridge is the probe's)."
    )
    forecast_blocks: int = opt(
        5,
        "Cross-fitting of the forecast columns on the training rows: the training days are cut into this many "
        "contiguous blocks and each block's rows read the fit on the other blocks, so the column is no better "
        "where the agent trains than on unseen days (1: the in-sample fit, which on the default market made "
        "the 60-bar column look ten times better than it is; tools/results/learner_ablation_h200.md section 13).",
    )


@dataclass
class FoldConfig:
    n_folds: int = opt(6, "Number of walk-forward folds (6 of 60 + 10 days, advancing 10, span 120 days).")
    train_days: int = opt(60, "Trading days in each fold's training window.")
    val_days: int = opt(10, "Trading days in each fold's validation window.")
    step_days: int = opt(10, "Days the windows advance from one fold to the next.")
    anchored: bool = opt(
        False,
        "Anchored folds keep the training start at day 0; rolling folds slide it. Over ten seeds of the market "
        "suite (a fold after the first trains on every earlier day) the default market gained +1.65 (SE 0.19), to "
        "0.51 of its oracle, all of it in fold 1, the switching market lost -1.07 (0.28), and the seen markets "
        "pooled +0.03 (0.12), noise (tools/results/learner_ablation_h200.md sections 57-58): more days help where "
        "the market's law stays the same and hurt where its regimes change, so rolling stays the default.",
    )
    purge_bars: int = opt(
        30, "Bars dropped between the end of training and the start of validation, or of the selection days (no "
        "label overlap)."
    )
    select_days: int = opt(
        0,
        "Last days of each training window held out for choosing the fold's best epoch (0: choose on the "
        "validation days, which then score their own choice). Nothing trains on them; the purge moves to "
        "their start (walkforward/folds.py). At 10 on the default market the out-of-sample best epoch scored "
        "about its last epoch: 10 days cannot rank the epochs (tools/results/learner_ablation_h200.md section 8).",
    )


@dataclass
class EnvConfig:
    n_envs: int = opt(4096, "Parallel environments stepped by one kernel launch.")
    episode_bars: int = opt(240, "Bars per episode before an environment is reset to a new start.")
    max_position: int = opt(4, "Largest absolute position in contracts (the Full magnitude).")
    commission: float = opt(2.25, "Commission in dollars per contract per side.")
    collect_steps: int = opt(256, "Environment steps per collect phase (per environment).")
    explore_spread: float = opt(
        0.25,
        "Collect policy, direction: each direction's Thompson draw is E[Q] + this x (sampled atom - E[Q]), in "
        "[0, 1]; 1 is plain Thompson sampling over the C51 head, 0 the greedy direction (kernels/action_select.py). "
        "0.25 did best with the linear network (0.1 and 0.5 worse; tools/results/learner_ablation_h200.md "
        "section 9).",
    )
    explore_tau: float = opt(
        1.0,
        "Collect policy, magnitude / order type / urgency: Boltzmann temperature as a multiple of the branch's "
        "E[Q] range, in (0, 1]; 1 is the seed's rule (the best bin at most 58% of the time).",
    )
    fixed_bins: list[int] = opt(  # noqa: RUF009 (opt gives a list default its default_factory)
        [0, 0, 0],
        "Bins of magnitude, order type and urgency that every collect and evaluation step takes, -1 where the "
        "policy chooses (Boltzmann in collect, argmax in evaluation); bins as in fox_numba/actions.py: magnitude "
        "0 Quarter, 1 Half, 2 Full; order type 0 Market, 1 Limit join, 2 Limit improve; urgency 0 Patient, "
        "1 Normal, 2 Urgent. The default [0, 0, 0] trades the direction branch alone, one Quarter of "
        "env.max_position (one contract) with market orders, as the probe and the oracle trade "
        "(kernels/action_select.py). Chosen on the market suite (5 seeds): the seen markets pooled +1.86 (SE 0.14), "
        "+0.97 (0.29) over [-1, -1, -1] (the policy choosing every branch) paired by seed, held out +0.10 (0.22), "
        "+0.30 (0.35); [2, 0, 0] (Full size) was noise (tools/results/learner_ablation_h200.md sections 21, 28).",
    )
    beyond_depth_ticks: int = opt(
        2,
        "A market order larger than the shown close book fills its excess at the last shown level's price "
        "plus this many ticks against it (0: at the last level's price).",
    )
    position_history: bool = opt(
        False,
        "The portfolio part's unrealised PnL and bars-in-position columns (fox_numba/OBSERVATION.md): false writes "
        "both as 0, so the network reads the held position but not what it has made or how long it has been held. "
        "With learner.counterfactual_held, three quarters of each batch are re-held states whose two columns read "
        "0 and one bar whatever the market did; in the linear fit of that batch (tools/port_probe.py) the columns "
        "cost 7.2 daily Sharpe on the default market's fold 0 and without them the fit kept its +12.90; over fold "
        "0 of the seven suite markets hiding them gained +0.86 (seen) and +0.94 (held out), mixed by market "
        "(tools/results/learner_ablation_h200.md section 42). False by default since section 43, with "
        "learner.counterfactual_held.",
    )
    limit_life_patient: int = opt(10, "Bars a Patient limit order rests before the rest is cancelled.")
    limit_life_normal: int = opt(4, "Bars a Normal-urgency limit order rests before the rest is cancelled.")
    limit_life_urgent: int = opt(1, "Bars an Urgent limit order rests before the rest is cancelled.")
    w_timing: float = opt(
        0.0, "Weight of the timing bonus (seed C.4): sign(realised) * min(|realised|, Q_DIR_ABS_REF) on steps "
        "that realise PnL (0: off)."
    )
    w_persist: float = opt(
        0.0, "Weight of the persistence shaping (seed D.4a): clip(unrealised PnL units, -1, 1) while an open "
        "position is unchanged (0: off)."
    )
    w_regime: float = opt(
        0.0, "Weight of the regime penalty (seed D.4b): |position| share * high-volatility share * "
        "min(|PnL reward|, Q_DIR_ABS_REF) (0: off)."
    )
    w_novelty: float = opt(
        0.0, "Weight of the novelty bonus (seed B.2): 1 - the environment's EMA share of the chosen direction "
        "(0: off)."
    )
    w_stable: float = opt(
        0.0, "Weight of the stability shaping (seed D.4c): -|position change| / max_position per step (0: off)."
    )
    curriculum_epochs: int = opt(
        0,
        "Curriculum episode starts (0: off, every start drawn uniformly): a fold's training starts are ranked "
        "easiest first by the realised volatility of their episode's bars (agent/fold_market.py), and a collect "
        "draw is uniform over the easiest share of them, widening linearly from env.curriculum_reach at the "
        "fold's first epoch to all of them (the uniform draw) at this epoch of the fold.",
    )
    curriculum_reach: float = opt(
        0.25, "Curriculum: the share of the easiest training starts drawn from at a fold's first epoch, in (0, 1]."
    )
    hindsight_fraction: float = opt(
        0.0,
        "Hindsight relabelling, in [0, 1] (0: off): at every collect step the direction of the first "
        "round(this x env.n_envs) environments (halves up; a fixed subset) is replaced by the one best in "
        "hindsight on their training bar: the oracle's rule (market/synthetic_oracle.py) with the realised mid "
        "change over evaluation.probe_horizon_bars bars for the expected return, Hold or Flat by the "
        "environment's position inside the cost band; bars without that many later bars in their day before "
        "the purge keep the policy's direction. The relabelled action is the one stepped, so its reward and "
        "next state are real (kernels/hindsight.py). The seed does not say its rule; this one is ours. At 0.25 on "
        "the market suite it lost on six of seven markets and the agent traded two to four times as often: an "
        "action chosen by the move that follows inflates every trading action's value (hindsight bias; "
        "tools/results/learner_ablation_h200.md section 16).",
    )


@dataclass
class NetworkConfig:
    hidden: int = opt(256, "Width of each hidden layer of the shared trunk (unused when n_layers = 0).")
    n_layers: int = opt(
        0,
        "Hidden layers in the shared trunk; 0 is a linear network (the head reads the observation). A trunk of 2 x "
        "256 memorised the default market's training window and traded worse out of sample "
        "(tools/results/learner_ablation_h200.md sections 7-9).",
    )
    head_init_scale: float = opt(
        0.0,
        "The heads' initial weights (C51, IQN and mean heads: Xavier-uniform) times this; the fold boundary's fresh "
        "draw (learner.fold_keep) too. 0 (the default since section 51 of learner_ablation_h200.md) starts the "
        "heads at zero, as the linear replica tools/port_probe.py starts: uniform distributions, equal values. "
        "With five epochs per fold 0 and 1 were alike on the suite (section 50), but from zero the first epoch "
        "already earns what a Xavier start earns after five, so with learner.epochs = 2 a fold trains in two "
        "fifths of the steps (section 51).",
    )
    position_cross: bool = opt(
        False,
        "The network's first layer (the heads, without a trunk) also reads the held position times each market "
        "column (kernels/position_cross.py): a linear head's value of an action is then w . x + q (x . u) + ..., "
        "so the value of holding can be q x . beta, which is bilinear in the position q and the market x. Without "
        "it a linear head cannot tell holding long from holding short on the market's read "
        "(tools/results/learner_ablation_h200.md section 27). Refused with vsn.",
    )
    n_atoms: int = opt(51, "Atoms of the C51 value distribution of each action.")
    v_min: float = opt(-1.0, "Lower end of the base C51 support (rewards are scaled into it).")
    v_max: float = opt(1.0, "Upper end of the base C51 support.")
    support_max_scale: float = opt(
        10.0,
        "Adaptive support cap: each head's support is the base [v_min, v_max] scaled by a factor in [1, this], "
        "refreshed per epoch from the Q and reward scales in the ISV (rule in kernels/heads.py); 1 keeps the "
        "base support.",
    )
    noisy_sigma0: float = opt(
        0.0,
        "NoisyNet heads (0: off): factorised Gaussian noise on the head's weights, the input noise drawn per "
        "branch (Fortunato et al. 2018; kernels/noisy.py); sigma starts at noisy_sigma0 / sqrt(fan_in) and is "
        "learned with mu. The learner draws new noise for the online and the target network every step, the "
        "collect every collect step; evaluation uses mu alone. The paper used 0.5; at 0.5 the market suite saw "
        "noise (pooled -0.04 (0.41) on the seen markets; tools/results/learner_ablation_h200.md section 15).",
    )
    iqn_quantiles: int = opt(
        0,
        "Implicit-quantile (IQN) head beside the C51 heads (0: off): the quantile samples tau per transition in its "
        "loss, N = N', at most 64 (Dabney et al. 2018 used 64 and 64). The head reads the C51 heads' input x and the cosine "
        "embedding phi(tau) = ReLU(cos(pi i tau) @ W_e + b_e), i < iqn_embed, and gives one quantile per action: "
        "Z(x, tau) = (x * phi(tau)) @ W_q + b_q. It is trained beside C51 (quantile Huber loss, kappa 1, towards r + "
        "discount Z_target(s', a*, tau') with C51's double-DQN a*; weight learner.iqn_weight), and its gradient "
        "reaches a trunk through the shared input (agent/iqn.py, kernels/iqn.py). The direction branch acts on the "
        "joint values (the seed's Plan C): collect's Thompson draw is the mean of the C51 draw and one IQN quantile "
        "at a level drawn per direction, evaluation the argmax of (E_C51 + E_IQN) / 2, E_IQN the mean over N "
        "midpoint levels; the conviction reads that joint E[Q] (kernels/action_select.py). On the suite at N = 8 "
        "(5 seeds): worse pooled on the seen markets (-1.11, SE 0.70) and noise on the held-out ones, the agent more "
        "often in the market, twice the training time (tools/results/learner_ablation_h200.md section 18).",
    )
    iqn_embed: int = opt(64, "Cosine features of the IQN head's tau embedding, at most 64 (Dabney et al. 2018: 64).")
    mean_head: bool = opt(
        True,
        "A squared-error value head for the direction branch beside its C51 heads (agent/mean_head.py, "
        "kernels/mean_head.py): four linear outputs m(x, d) on the C51 heads' input x, trained towards r + discount "
        "m_target(s', a*) with a* = argmax_d m(s', d) (weight learner.mean_weight), its gradient reaching a trunk "
        "through x. The direction branch then acts on m: evaluation takes argmax_d m(x, d), collect's Thompson "
        "draw is m(x, d) + env.explore_spread x (the C51 atom drawn - E_C51[d]) (the C51 distribution's shape moved "
        "to m's mean; kernels/action_select.py), and the conviction reads m. Why: the C51 cross-entropy spends its "
        "gradient on the return distribution's shape; the direction values' gaps are hundredths of a unit under a "
        "spread of about one, and a C51 head per direction fitted the forward move about half as well as a squared "
        "error did (tools/results/learner_ablation_h200.md sections 31-32). Refused with iqn_quantiles. On by default "
        "since section 43, with mean_cross and learner.counterfactual_held.",
    )
    mirror: bool = opt(
        True,
        "Keep the direction mean head mirror-symmetric: after each gradient step its weights move "
        "network.mirror_strength of the way to their projection onto the weights for which "
        "the market reflected about its prices (buyers and sellers swapped, every price change negated: "
        "observation.py MIRROR_EVEN) values Short where the market values Long, and Hold and Flat alike, "
        "m(P x, -q, sigma d) = m(x, q, d) (kernels/mirror.py). A prior for markets whose laws do not favour a side: "
        "a 60-day fit otherwise puts direction on columns that carry none (volatility, volume, the time of day) and "
        "on the window's drift. On the suite over ten seeds (tools/results/learner_ablation_h200.md section 64), "
        "at strength 0.01: seen markets +0.46 (SE 0.11), held-out +1.68 (0.20), the default market +0.67 (0.26); "
        "on the seeds that chose nothing (5-9) seen +0.42 (0.19). The exact symmetry (strength 1) gained the "
        "held-out markets more, +2.51 (0.19), but lost high_cost 2.53 (0.30), where the fit leans to one side, and "
        "was noise on the seen ones, +0.06 (0.09) (section 62). On by default since section 64; on today's observation "
        "(the time-weighted block) turning it off costs the seen markets 1.33 (0.25), high_cost 3.32 (0.54) "
        "(section 82, 5 seeds). Needs mean_cross "
        "(a linear network whose mean head reads the observation) and no encoder, whose columns' mirror image is "
        "not known: set network.mirror=false with a trunk, a Mamba2 or a TLOB encoder.",
    )
    mirror_strength: float = opt(
        0.01,
        "With network.mirror, the fraction (0, 1] of the way the mean head's weights move to their mirror-symmetric "
        "projection after each step (kernels/mirror.py): 1 holds the head exactly symmetric; below 1 the part that "
        "breaks the symmetry shrinks by (1 - s) a step, a weight decay on the asymmetry alone that the gradient can "
        "hold up where the training window keeps asking for a lean (such as one side's entries on high_cost). "
        "0.01 against 1 on the suite: seen markets +0.46 (SE 0.11) against +0.06 (0.09) over the defaults before, "
        "high_cost -0.05 (0.35) against -2.53 (0.30) (tools/results/learner_ablation_h200.md sections 62 and 64).",
    )
    mean_cross: bool = opt(
        True,
        "The direction mean head alone reads the position x market input: m(x, d) on [x, q x], the C51 heads on "
        "the observation x; its fused float32 kernels form q x as they read x (kernels/mean_cross.py, at every "
        "run.precision). network.position_cross gives the same input to every head, "
        "so the head GEMM, 17 x Z outputs wide, reads twice the columns; here only the mean head's four outputs "
        "do, the direction values keeping the bilinear term q x . beta that the held position needs (tools/"
        "results/learner_ablation_h200.md sections 27, 34). Needs mean_head and a linear network (n_layers = 0); "
        "beside a Mamba2 or TLOB encoder the mean head reads [x, enc] and its q x, and its gradient reaches the "
        "encoder; refused with position_cross and vsn. On by default since section 43 (the smoke preset, which "
        "keeps a trunk, turns it off).",
    )
    spectral_norm: bool = opt(
        False,
        "Spectral normalisation of the trunk's dense layers (Miyato et al. 2018; needs n_layers >= 1): each trunk "
        "layer reads W / sigma, sigma = v^T W u from persistent power-iteration vectors u, v (learner state: reset "
        "per fold from the seed, held in checkpoints). The learner's online forward runs spectral_iters power "
        "iterations per step and backpropagates through sigma; the target network, collect and evaluation read u, "
        "v as they are (agent/spectral.py, kernels/spectral.py). The epoch stat spectral_sigma is the mean sigma. "
        "Not yet measured here.",
    )
    spectral_iters: int = opt(1, "Power iterations per learner step of spectral_norm (>= 1; the paper used 1).")
    residual: bool = opt(
        False,
        "Trunk layers 1 .. n_layers - 1 (hidden -> hidden) as residual blocks x + relu(x W + b) (needs n_layers >= "
        "2; layer 0 stays plain). Implied by stochastic_depth > 0; on its own, the architecture without drops. "
        "Not yet measured here.",
    )
    stochastic_depth: float = opt(
        0.0,
        "Stochastic depth (Huang et al. 2016; 0: off, else in (0, 1); makes the trunk residual, needs n_layers >= "
        "2): in the learner's online network each row drops residual block l with probability stochastic_depth * "
        "l / (n_layers - 1) (the last block at stochastic_depth) and scales a kept block by 1 / (1 - p_l); the "
        "draw is keyed on the device by (seed, step, layer, row). The target network, collect and evaluation keep "
        "every block (the expected value). Not combined with learner.dropout (refused). Not yet measured here.",
    )
    vsn: bool = opt(
        False,
        "Variable-selection network on the observation (agent/vsn.py, kernels/vsn.py): per sample, a softmax gate w "
        "= softmax(x W_g + b_g) over K feature groups (OFI, trade, bar, history = the EMA columns, forecast when "
        "present, portfolio) scales each column c of group k to K w_k x_c before the trunk (or the heads) read it; "
        "the gate starts uniform (the identity) and is learned with the network. ISV 87-88 and HEALTH_DIAG "
        "vsn_focus_max / vsn_focus_entropy follow its focus. With an IQN head it needs n_layers >= 1. On the "
        "suite (5 seeds): noise pooled (seen -0.18, SE 0.54; held out +0.58, 0.53), single markets both ways, the "
        "agent in the market twice as often; learner step 1.25 ms against 0.93 (tools/results/learner_ablation_h200.md "
        "section 20).",
    )
    moe_experts: int = opt(
        0,
        "Mixture-of-experts heads (0: off, else 2 .. 8; agent/moe.py, kernels/moe.py): K copies of the dueling C51 "
        "head under a per-branch softmax gate on the heads' input (the trunk's output, or the observation); the head "
        "output is the gate-weighted sum of the experts' logits (a dense mixture, no top-k). The learner adds the "
        "load-balancing loss lambda sum_b K sum_k u_bk^2 (u: an expert's batch-mean gate weight), lambda = ISV 128 "
        "MOE_LAMBDA_EFF from a controller that raises it while the load is unbalanced (EMA of the largest "
        "utilisation against 1/K) and lowers it otherwise, within [0.001, 1]; ISV 118-127 and HEALTH_DIAG moe_* "
        "follow the utilisation and gate entropy, epoch stat moe_balance the loss term (1 balanced, K collapsed). "
        "Collect and evaluation act on the same mixture. Refused with noisy_sigma0 > 0. The learner step at K = 4: "
        "3.04 ms on an H200 against 0.93 ms without (tools/results/bench_learner_moe4_h200.md). On the suite at K = 4 "
        "(5 seeds) it first equalled the defaults, seen +0.01 (SE 0.03): with the heads started at zero the experts "
        "were equal and stayed equal (learner_ablation_h200.md section 59); with the gate now drawn when the heads "
        "start at zero the experts part, and the suite calls it noise, seen +0.03 (0.07), held out -0.08 (0.06) "
        "(section 66): the direction branch acts on the mean head (network.mean_head), which the mixture does not "
        "touch, so it shapes only collect's Thompson draw.",
    )
    mamba2_window: int = opt(
        0,
        "Mamba2 encoder over the last T bars (0: off, else T >= 2; agent/mamba2.py, kernels/mamba2_last.py, "
        "kernels/windows.py): per sample, the market columns of the T bars ending at its own bar (a bar before its "
        "day's first reads that first bar: no look across days or ahead) pass a Mamba2 (SSD) block, and the block's "
        "output at the last bar, mamba2_out columns, is appended to the observation the trunk (or the heads) read. "
        "Refused with vsn, moe_experts, iqn_quantiles and noisy_sigma0, and beside network.mirror (set it false); "
        "with network.mean_cross the crossed mean head reads the encoder's columns too. Off by default: on the "
        "suite at T = 32 beside the crossed mean head (mirror off, 5 seeds) it lost on every market against the "
        "same network without it, seen markets 2.12 (SE 0.38), held-out 1.88 (0.38), holding a position in 97-98% "
        "of bars (tools/results/learner_ablation_h200.md section 82; beside the plain head, section 63, it equalled "
        "its network, +0.16, SE 0.53). Learner step 2.54 ms on an H100 against 0.35 ms without it "
        "(tools/results/bench_learner_part_mamba2_tf32_h100.md); about 4.3 GB of GPU memory a run.",
    )
    mamba2_heads: int = opt(4, "Heads H of the Mamba2 encoder (network.mamba2_window > 0).")
    mamba2_head_dim: int = opt(16, "Channels P per head of the Mamba2 encoder, 1 .. 64.")
    mamba2_state: int = opt(
        16, "State width N of the Mamba2 encoder's scan (its B and C columns, shared by the heads), 1 .. 64."
    )
    mamba2_out: int = opt(32, "Output columns E of the Mamba2 encoder, appended to the observation.")
    tlob_window: int = opt(
        0,
        "TLOB dual-attention encoder over the last T close-book snapshots (0: off, else 2 .. 64; Berti & Kasneci "
        "2025; agent/tlob.py, kernels/tlob.py, kernels/windows.py, features/book.py): per sample, the book snapshots "
        "of the T bars ending at its own bar (a bar before its day's first reads that first bar: no look across days "
        "or ahead), 40 columns each (10 levels x bid/ask x price in ticks from the close mid / log1p size, normalised "
        "on the fold's training rows, a missing level 0), pass tlob_blocks blocks of attention over time then over "
        "features, and the encoder's tlob_out columns are appended to the observation the trunk (or the heads) read. "
        "T must be a multiple of tlob_heads. Refused with vsn, moe_experts, iqn_quantiles, noisy_sigma0, "
        "mamba2_window and network.mirror (set it false); with network.mean_cross the crossed mean head reads the "
        "encoder's columns too. Learner step 5.95 ms at T = 32 on an H200 (tools/results/tlob_attention_h200.md), "
        "4.65 ms on an H100 (tools/results/bench_learner_part_tlob_tf32_h100.md). "
        "Off by default: at T = 32 beside the crossed mean head (mirror off), 5 seeds, it lost on every market of "
        "the suite, 4.56 (SE 0.40) pooled on four seen markets against the same network without it, and held a "
        "position in 95-99% of bars: the encoder lets the mean head fit the training days' noise "
        "(tools/results/learner_ablation_h200.md sections 69 and 76). With learner.encoder_weight_decay = 1 it "
        "equals that network (+0.22, SE 0.33) but stays 3.81 (0.49) below the defaults there (section 77) and 2.40 "
        "(0.41) below today's network with the mirror off (section 82); without the decay it loses 7.3-14.0 on "
        "switching, volatile and trade_flow against the latter.",
    )
    tlob_width: int = opt(
        16, "Model width D of the TLOB encoder: each snapshot's embedding, and the feature view's tokens (at most 64, "
        "a multiple of tlob_heads)."
    )
    tlob_blocks: int = opt(1, "Blocks of the TLOB encoder, each an attention over time then one over features (>= 1).")
    tlob_heads: int = opt(
        2, "Attention heads of both TLOB views (the time view's width D and the feature view's width T divide by it; "
        "a head's tokens x columns, T x D / heads and D x T / heads, at most 2048)."
    )
    tlob_out: int = opt(16, "Output columns of the TLOB encoder, appended to the observation.")


@dataclass
class LearnerConfig:
    batch_size: int = opt(8192, "Transitions per gradient step.")
    buffer_size: int = opt(
        1 << 20,
        "Capacity of the GPU experience buffer, in transitions. An epoch's collect writes env.n_envs x "
        "env.collect_steps of them (4096 x 256 = 2**20 by default), so by default each epoch's collect "
        "overwrites the whole buffer and the learner samples only that epoch's transitions, as on-policy "
        "as a replay gets; a larger buffer keeps earlier epochs of the fold (the buffer is emptied at every "
        "fold boundary). Four epochs (2**22) did no better on the suite's seen markets and worse on the volatile "
        "held-out one (tools/results/learner_ablation_h200.md section 13).",
    )
    steps_per_epoch: int = opt(1000, "Gradient steps per epoch.")
    epochs: int = opt(
        2,
        "Epochs per fold (each: one collect of env.n_envs x env.collect_steps transitions, then steps_per_epoch "
        "gradient steps). 2 since section 51 of learner_ablation_h200.md: with the heads started at zero "
        "(network.head_init_scale = 0), 2 epochs against the 5 before on the market suite (5 seeds, paired): seen "
        "+0.21 (SE 0.14), held out +0.15 (0.33), at 0.4 of the training; 1 epoch lost on the seen markets, -0.35 "
        "(0.20), slow_signal -2.99 (0.44).",
    )
    fold_keep: float = opt(
        0.8,
        "Fold boundary shrink-and-perturb: theta = fold_keep * theta + (1 - fold_keep) * theta_fresh, theta_fresh "
        "drawn per (run seed, fold); the reset runs at fold 0 too, over the initial network. 0.8 is the seed's; 1 "
        "carries the network over unchanged, 0 starts every fold from a fresh network (the Adam moments are shrunk "
        "as always: walkforward/trainer_state.py). 0 on the suite: seen -0.38 (SE 0.29), held out -0.55 (0.20) "
        "(learner_ablation_h200.md section 48).",
    )
    lr: float = opt(
        1e-3,
        "Adam base learning rate (before the cosine schedule and warm-up damping). 1e-3 is for the linear network "
        "(at 1e-4 it lost money, at 3e-3 it was unstable); the 2 x 256 trunk did best at 1e-4.",
    )
    refit_lr_scale: float = opt(
        1.0,
        "Every fold after the first trains at lr times this (its whole cosine schedule): those folds start from "
        "the last fold's network (learner.fold_keep), which on the suite validates best after their first epoch "
        "and drifts down after it on the default and high-cost markets (learner_ablation_h200.md section 50). "
        "1: every fold alike.",
    )
    lr_min_frac: float = opt(
        0.1,
        "Cosine schedule ends at lr * lr_min_frac. 0.01 was noise on the market suite and left the direction "
        "values' validation R^2 unchanged (tools/results/learner_ablation_h200.md section 16).",
    )
    gamma: float = opt(
        0.95,
        "Discount factor per bar. 0.95 is a horizon of about 20 bars, the scale of the default market's 15-minute "
        "drift; at 0.99 the return noise on every target drowned the edge and the greedy policy never traded "
        "(tools/results/learner_ablation_h200.md).",
    )
    n_step: int = opt(
        1,
        "Transitions summed into each TD target: r_0 + gamma r_1 + ... + gamma**(k-1) r_(k-1) + gamma**k "
        "Z(s_k), k <= n_step, cut short where the episode ended (kernels/replay.py). 1 is one-step TD.",
    )
    tau: float = opt(0.005, "Polyak averaging rate of the target network (tau_base).")
    tau_min_frac: float = opt(
        1.0,
        "The cosine schedule of tau ends at tau * tau_min_frac (1: no decay; the Q-drift damping still "
        "divides tau by up to 5).",
    )
    weight_decay: float = opt(
        0.0,
        "Decoupled (AdamW) weight decay on the weights; biases never decay. On the suite (5 seeds) 1.0 lifts "
        "trade_flow by 2.58 (SE 0.37) and costs the seen markets 1.30 (0.22), high_cost most: it shrinks the "
        "book's informative weights too (tools/results/learner_ablation_h200.md section 75); so 0.",
    )
    encoder_weight_decay: float = opt(
        0.0,
        "Decoupled weight decay added to weight_decay on the weights of a Mamba2 or TLOB encoder alone (>= 0): "
        "capacity control on the encoder, whose outputs let the heads fit the training window's noise "
        "(tools/results/learner_ablation_h200.md section 69), without shrinking the heads. At 1.0 TLOB "
        "equals the network without an encoder of section 69 on four seen markets (+0.22, SE 0.33) and stays 3.81 "
        "(0.49) below the defaults (section 77), 2.40 (0.41) below the same network without TLOB (section 82).",
    )
    branch_weights: list[float] = opt(  # noqa: RUF009 (opt gives a list default its default_factory)
        [1.0, 1.0, 1.0, 1.0],
        "Loss weight of each action branch (direction, magnitude, order type, urgency).",
    )
    adam_beta1: float = opt(0.9, "Adam first-moment decay.")
    adam_beta2: float = opt(0.999, "Adam second-moment decay.")
    adam_eps: float = opt(
        1.5e-4,
        "Adam epsilon (Rainbow's value; guards the first steps of a fold). 1e-8 on the suite: noise "
        "(learner_ablation_h200.md section 50).",
    )
    clip_ema_mult: float = opt(2.0, "Adaptive clip: clip_base = grad_norm_ema * clip_ema_mult.")
    bootstrap: str = opt(
        "direction",
        "Next-state value of the TD target: 'direction' gives every branch the direction branch's greedy "
        "distribution (the state's value; branching DQN's common target), 'branch' bootstraps each branch "
        "from its own greedy bin (why that fails: kernels/learner.py).",
    )
    aux_weight: float = opt(
        0.0,
        "Weight of the auxiliary regression loss (0: off): one extra output of the head GEMM regresses the forward "
        "mid change over aux_horizon_bars (in training standard deviations) beside the C51 loss (agent/learner.py). "
        "At 1 on the default market it did worse than off, and its in-sample fit shows the trunk memorising the "
        "training window (tools/results/learner_ablation_h200.md section 7).",
    )
    aux_horizon_bars: int = opt(15, "Bars ahead of the mid change the auxiliary regression forecasts.")
    obs_noise: float = opt(
        0.0,
        "Standard deviation of Gaussian noise added to the market columns of every training observation (s and "
        "s', in normalised units; 0: none): data augmentation against memorising the training window's bars "
        "(tools/results/learner_ablation_h200.md section 7). At 0.5-2 on the default market it stopped the memorising "
        "and nearly all trading with it (section 8).",
    )
    dropout: float = opt(
        0.0,
        "Probability of dropping each hidden unit of the online network in training (inverted dropout, kept "
        "units scaled by 1 / (1 - p); 0: none; collect and evaluation never drop): capacity control against "
        "memorising the training window's bars (kernels/dropout.py). At 0.1 and 0.3 on the default market the "
        "greedy policy stopped trading (tools/results/learner_ablation_h200.md section 8).",
    )
    warmup_rule: str = opt(
        "damped",
        "Fold warm-up factor rule: 'damped' feeds the gradient-norm EMAs the clipped norm min(raw, clip_eff), so "
        "a spike cannot inflate the clip base or the slow baseline; 'seed' is the original system's rule (EMAs "
        "of the raw norm), kept for comparison.",
    )
    priority_alpha: float = opt(
        0.0,
        "Prioritised replay's exponent (0: off, uniform replay): slot i is drawn with probability p_i / sum p, "
        "p_i = (loss_i + priority_eps)**priority_alpha, loss_i the C51 cross-entropy of its direction branch at its "
        "last draw; new transitions get the largest priority so far (kernels/priority.py). Rainbow used 0.5.",
    )
    priority_beta0: float = opt(
        0.4,
        "Prioritised replay: the importance-weight exponent at a fold's first step, annealed linearly to 1 at its "
        "last; each sample's loss and gradient are weighted by (p_min / p_i)**beta (Rainbow's 0.4).",
    )
    priority_eps: float = opt(1e-6, "Prioritised replay: added to every loss before the exponent (> 0).")
    iqn_weight: float = opt(
        1.0,
        "Weight of the IQN head's quantile Huber loss beside the C51 cross-entropy (network.iqn_quantiles > 0).",
    )
    mean_weight: float = opt(
        1.0,
        "Weight of the direction mean head's squared error, sum_i w_i (m(s_i, a_i) - y_i)**2 / 2 with w_i the "
        "direction row's weight (1 / B, times prioritised replay's importance weight), beside the C51 "
        "cross-entropy (network.mean_head).",
    )
    counterfactual: bool = opt(
        True,
        "Counterfactual direction targets: each step draws batch_size / 4 transitions and trains all four direction "
        "heads on each, the untaken directions' rewards and next states computed from the stored state with the "
        "environment's own fill rules (kernels/counterfactual.py), so no head learns only where the policy already "
        "favours it. Only the direction branch trains. Needs env.fixed_bins with a fixed magnitude and order type "
        "Market (0), learner.n_step = 1, every env.w_* shaping weight 0, no prioritised replay, no hindsight "
        "relabelling and no IQN head; batch_size a multiple of 4. On by default since section 43 (with "
        "counterfactual_held); turn both off to use n-step returns, prioritised replay, hindsight, shaping or IQN.",
    )
    counterfactual_held: bool = opt(
        True,
        "With counterfactual targets: three of every four drawn transitions are also re-held at -T, 0 and +T "
        "contracts (T: env.fixed_bins' magnitude), entered at the bar's mid one bar earlier, and all four "
        "directions are priced from that state (kernels/counterfactual.py), so the direction values see every "
        "position in every market state and not only the ones the policy held. For the position x market input "
        "(network.position_cross): the value of holding is bilinear in the two (tools/results/"
        "learner_ablation_h200.md sections 27, 29). Needs learner.counterfactual. On by default since section 43: "
        "with network.mean_head, mean_cross and env.position_history = false, on the market suite (5 seeds) the "
        "seen markets pooled +0.84 (SE 0.17) and the held-out ones +0.29 (0.12) over the defaults before, the "
        "default market +1.65 -> +5.52 daily Sharpe (tools/results/learner_ablation_h200.md section 43).",
    )
    counterfactual_history: int = opt(
        0,
        "With counterfactual_held, the longest history in bars a re-held long or short position is given: held k "
        "bars, entered at the mid k - 1 bars before the drawn one, k uniform in [1, min(bars since the day's first "
        "+ 1, this)] (kernels/counterfactual.py), so its unrealised PnL and bars-in-position columns take the "
        "values held positions have. 0: one bar at the drawn bar's mid (unrealised PnL 0). In the linear fit of "
        "the agent's counterfactual batch (tools/port_probe.py, default market, 5 seeds) one bar lost 7.2 daily "
        "Sharpe on fold 0 against no portfolio columns, histories of up to 60 bars won back 4.2 of it and fold 1 "
        "was unchanged (tools/results/learner_ablation_h200.md section 42).",
    )
    counterfactual_hold_bars: int = opt(
        1,
        "With counterfactual targets, the bars K each priced direction's position is held before the target "
        "bootstraps (kernels/counterfactual.py): the reward is the discounted sum of its K bars' equity changes "
        "(cut at the episode's last bar, where it closes), the next state K bars on, the discount gamma^K. The "
        "return over the signal's horizon that learner.n_step gives the one-step learner, for every direction; "
        "the value learnt is that of holding a direction K bars, then acting greedily. 1: one-step targets. A "
        "kept transition's taken direction stays its stored one-step transition. At K = 15 on the market suite (5 "
        "seeds, tools/results/learner_ablation_h200.md section 84) the seen markets lose 1.33 (SE 0.13) and the "
        "fresh draw's held-out ones 4.34 (0.24); slow_signal's later fold gains +3.07 (0.45) on the suite's draw, "
        "as the linear fit said (section 80), and loses on the fresh one. The agent holds a position in 86-98% of "
        "bars (53-92% at K = 1): values of K-bar commitments make a policy that decides every bar enter and flip "
        "more (section 44, and section 85 in the linear fit: round trips double; deciding every K bars brings them "
        "back but stays below one-step targets). So 1 by default.",
    )


@dataclass
class EvaluationConfig:
    chunk_bars: int = opt(
        16,
        "Bars per chunk of the validation backtest: one captured graph of that many steps, replayed. A fold's "
        "first two passes run a chunk's launches from Python (agent/evaluator.py), so short chunks keep them "
        "cheap: on an H100 a default pass took 0.3 s with one 389-step chunk and 0.03 s with 16-step ones, 18 ms "
        "of GPU time either way (tools/results/learner_ablation_h200.md section 89).",
    )
    network: str = opt(
        "online",
        "Network the backtests trade with (validation, selection days, fox evaluate): 'online'; 'target', the "
        "Polyak average of the online weights over about 1 / learner.tau steps (agent/evaluator.py; on the default "
        "market the two trade alike, tools/results/learner_ablation_h200.md section 8); or 'average', the mean of "
        "the fold's epoch-end online networks from epoch average_start on (agent/learner.py average_epoch; it lost "
        "on the default market, tools/results/learner_ablation_h200.md section 12).",
    )
    average_start: int = opt(
        1, "First epoch of a fold whose end-of-epoch network enters evaluation.network = 'average' (before it the "
           "average is the current network).",
    )
    hold_margin: float = opt(
        0.0,
        "The backtests' policy keeps the position unless the best direction's value beats Hold's by at least this "
        "much (risk units of reward; kernels/action_select.py); 0: the plain argmax. Why: on the suite the agent's "
        "fold-1 trading went from 187 to 209 round trips over its epochs at a hit rate of 0.50 while its direction "
        "values' top gap shrank to about 0.016 (learner_ablation_h200.md section 50); the probe holds while its "
        "forecast keeps its sign. Collection ignores it.",
    )
    annualisation_days: int = opt(
        252, "Trading days per year: daily Sharpe x sqrt(this); per-bar Sharpe x sqrt(this x bars per day)."
    )
    probe_horizon_bars: int = opt(
        15, "Probe baseline: bars ahead of the mid change its ridge regression forecasts (the oracle's horizon; "
        "also the realised move env.hindsight_fraction relabels by)."
    )
    probe_ridge: float = opt(
        0.01,
        "Probe baseline: ridge penalty per training row on the centred observation (0 = least squares); "
        "0.003-0.03 did best on a 120-day default market.",
    )


@dataclass
class RunConfig:
    out_dir: str = opt("runs", "Folder that receives one sub-folder per run.")
    name: str = opt("", "Run name (empty: a timestamp).")
    seed: int = opt(0, "Seed for every random stream (network init, environments, sampling).")
    graphs: bool = opt(True, "Replay captured CUDA graphs on the GPU (False: launch eagerly, for debugging).")
    precision: str = opt(
        "tf32", "Dense layers' arithmetic on the GPU: fp32 (exact float32 GEMMs), tf32 or bf16 (tensor cores; "
                "operands rounded to 10 or 7 mantissa bits, fp32 accumulation; kernels/gemm_tensor.py). The simulator "
                "always runs fp32. tf32 by default since section 45 of tools/results/learner_ablation_h200.md: on the "
                "market suite (5 seeds) its honest figure paired with fp32's is -0.00 (SE 0.02) on the seen markets "
                "and +0.02 (0.02) on the held-out ones, every market within 0.05.",
    )
    diag_every: int = opt(50, "Gradient steps between HEALTH_DIAG snapshots.")
    tensorboard: bool = opt(
        False, "Also write TensorBoard event files into the run folder's tensorboard/ (every epoch's validation, "
               "baseline and training figures, the HEALTH_DIAG fields; walkforward/tensorboard.py); needs the "
               "optional extra: pip install -e \".[tensorboard]\".",
    )


@dataclass
class FoxConfig:
    market: MarketConfig = field(default_factory=MarketConfig)
    features: FeatureConfig = field(default_factory=FeatureConfig)
    folds: FoldConfig = field(default_factory=FoldConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    run: RunConfig = field(default_factory=RunConfig)


SECTIONS: tuple[str, ...] = tuple(f.name for f in fields(FoxConfig))

# Presets are overrides of the dataclass defaults (which are the `default` preset, sized for one GPU).
PRESETS: dict[str, dict[str, Any]] = {
    "default": {},
    # Small enough that a whole fold runs in minutes under the CUDA simulator on two CPU cores. It keeps a
    # one-layer trunk, where the default network is linear, so that the end-to-end runs cover the trunk's path
    # (and so leaves out network.mean_cross, which reads the observation directly). Its heads start from their
    # Xavier draw: from the default zero start its few learner steps leave equal values and a policy that never
    # trades, and the run would not exercise the backtest's trade accounting.
    "smoke": {
        "folds.n_folds": 2,
        "folds.train_days": 2,
        "folds.val_days": 1,
        "folds.step_days": 1,
        "env.n_envs": 16,
        "env.episode_bars": 32,
        "env.collect_steps": 4,
        "network.hidden": 16,
        "network.n_layers": 1,
        "network.mean_cross": False,
        "network.mirror": False,
        "network.n_atoms": 11,
        "network.head_init_scale": 1.0,
        "learner.batch_size": 16,
        "learner.buffer_size": 256,
        "learner.steps_per_epoch": 2,
        "learner.epochs": 2,
        "run.graphs": False,
        "run.diag_every": 2,
    },
}


def field_help(section: str, name: str) -> str:
    """The help text of one field (`section.field`), a ConfigError for an unknown name."""
    for f in fields(_section_type(section)):
        if f.name == name:
            return f.metadata["help"]
    raise ConfigError(f"config has no field {section}.{name}")


def _section_type(section: str) -> type:
    if section not in SECTIONS:
        raise ConfigError(f"config has no section '{section}' (sections: {', '.join(SECTIONS)})")
    return get_type_hints(FoxConfig)[section]


def coerce(key: str, value: Any, kind: Any) -> Any:
    """`value` checked against the field type `kind` (int, float, bool, str, list[float] or list[int]); `key`
    names the field in the error. Ints are accepted for floats; floats must be finite; a bool is not an int; a TOML
    date (`--set market.first_day=2024-07-15`, or an unquoted date in a file) is its YYYY-MM-DD string."""
    if kind is str and isinstance(value, datetime.date) and not isinstance(value, datetime.datetime):
        return value.isoformat()
    if kind == list[float]:
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list of numbers, got {type(value).__name__} {value!r}")
        return [coerce(f"{key}[{i}]", v, float) for i, v in enumerate(value)]
    if kind == list[int]:
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list of integers, got {type(value).__name__} {value!r}")
        return [coerce(f"{key}[{i}]", v, int) for i, v in enumerate(value)]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if kind is float and isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key}: {value!r} is not a finite number")
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ConfigError(f"{key}: expected {kind.__name__}, got {type(value).__name__} {value!r}")
    return value


def read_toml(path: str | Path, what: str) -> dict[str, Any]:
    """The parsed TOML file at `path`; a missing, unreadable or malformed file is a ConfigError naming it
    (`what` says what the file is, e.g. "config file")."""
    path = Path(path)
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: {what} not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read the {what} ({e})") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None


def set_value(cfg: FoxConfig, key: str, value: Any) -> None:
    """Set `section.field` on `cfg` in place, checking the name and the type."""
    section, _, name = key.partition(".")
    sec_type = _section_type(section)
    hints = get_type_hints(sec_type)
    if name not in hints:
        known = ", ".join(hints)
        raise ConfigError(f"config section '{section}' has no field '{name}' (fields: {known})")
    value = coerce(key, value, hints[name])
    if key in CHOICES and value not in CHOICES[key]:
        raise ConfigError(f"{key}: {value!r} is not one of {', '.join(CHOICES[key])}")
    if key in INT_CHOICES and value not in INT_CHOICES[key]:
        raise ConfigError(f"{key}: {value!r} is not one of {', '.join(map(str, INT_CHOICES[key]))}")
    setattr(getattr(cfg, section), name, value)


def parse_override(text: str) -> tuple[str, Any]:
    """Parse `section.field=value`; the value is read as a TOML literal, else taken as a string."""
    key, sep, raw = text.partition("=")
    if not sep or "." not in key:
        raise ConfigError(f"override {text!r} is not of the form section.field=value")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key.strip(), value


def apply_mapping(cfg: FoxConfig, data: dict[str, Any], origin: str) -> None:
    """Apply a `{section: {field: value}}` mapping (a parsed TOML file) to `cfg`."""
    for section, values in data.items():
        if not isinstance(values, dict):
            raise ConfigError(f"{origin}: '{section}' must be a table [{section}]")
        for name, value in values.items():
            try:
                set_value(cfg, f"{section}.{name}", value)
            except ConfigError as e:
                raise ConfigError(f"{origin}: {e}") from None


def check_preset(preset: str) -> None:
    """A ConfigError naming an unknown preset and listing the known ones."""
    if preset not in PRESETS:
        raise ConfigError(f"unknown preset '{preset}' (presets: {', '.join(PRESETS)})")


def load_config(
    preset: str = "default", path: str | Path | None = None, overrides: list[str] | None = None
) -> FoxConfig:
    """Resolve a config: preset, then the TOML file at `path`, then `section.field=value` overrides."""
    check_preset(preset)
    cfg = FoxConfig()
    for key, value in PRESETS[preset].items():
        set_value(cfg, key, value)
    if path is not None:
        apply_mapping(cfg, read_toml(path, "config file"), str(path))
    for text in overrides or []:
        set_value(cfg, *parse_override(text))
    return cfg


RUN_FIELDS_ADDED: dict[str, Any] = {
    "run.precision": "fp32",
    "features.ema_start": "first",
    "network.mean_head": False,
    "network.mean_cross": False,
    "network.mirror": False,
    "network.mirror_strength": 1.0,
    "learner.counterfactual": False,
    "learner.counterfactual_held": False,
    "env.position_history": True,
    "features.tw_imbalance": False,
}
"""Fields whose default changed after they were added, each with the value that a run's config.toml written before
the field existed (every run folder's config.toml holds every field of its day) ran with."""


def load_run_config(path: str | Path) -> FoxConfig:
    """The config of a run from its config.toml (`load_config(path=...)`), each field of RUN_FIELDS_ADDED absent from
    the file set to the value that run used, so an older run is evaluated and resumed as it was trained."""
    data = read_toml(path, "config file")
    cfg = load_config(path=path)
    for key, value in RUN_FIELDS_ADDED.items():
        section, name = key.split(".")
        if name not in data.get(section, {}):
            set_value(cfg, key, value)
    return cfg


def toml_literal(value: bool | int | float | str | list[float]) -> str:
    """`value` written as a TOML literal (strings quoted and escaped, lists as arrays)."""
    if isinstance(value, list):
        return "[" + ", ".join(toml_literal(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        # A JSON string is a TOML basic string, once DEL (which TOML also requires escaped) is escaped.
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def to_toml(cfg: FoxConfig) -> str:
    """The config as TOML, each field preceded by its help text; `load_config(path=...)` reads it back."""
    lines: list[str] = []
    for section in SECTIONS:
        lines.append(f"[{section}]")
        sec = getattr(cfg, section)
        for f in fields(sec):
            lines.append(f"# {f.metadata['help']}")
            lines.append(f"{f.name} = {toml_literal(getattr(sec, f.name))}")
        lines.append("")
    return "\n".join(lines)


def write_config(cfg: FoxConfig, path: str | Path) -> Path:
    """Write the resolved config atomically (temporary name, then rename)."""
    return atomic_write_text(Path(path), to_toml(cfg))


CONFIG_DOC_PATH = Path(__file__).with_name("CONFIG.md")


def config_table_markdown() -> str:
    """Every config field with its default, the value each other preset sets, and its help text."""
    default = FoxConfig()
    others = [name for name in PRESETS if name != "default"]
    lines = [
        "# Config reference",
        "",
        "Generated by `python -m fox_numba.config --write` from `fox_numba/config.py`; do not edit.",
        "Set a field with `--set section.field=value` or a `[section]` table in a `--config` TOML file.",
        "",
        "| field | default | " + " | ".join(others) + " | meaning |",
        "| --- | --- | " + " | ".join("---" for _ in others) + " | --- |",
    ]
    for section in SECTIONS:
        for f in fields(getattr(default, section)):
            key = f"{section}.{f.name}"
            preset_values = [toml_literal(PRESETS[p][key]) if key in PRESETS[p] else "" for p in others]
            value = toml_literal(getattr(getattr(default, section), f.name))
            cells = [f"`{key}`", f"`{value}`", *(f"`{v}`" if v else "" for v in preset_values)]
            lines.append("| " + " | ".join(cells) + f" | {f.metadata['help']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    return generated_doc_main(argv, CONFIG_DOC_PATH, config_table_markdown(), "config reference")


if __name__ == "__main__":
    sys.exit(main())
