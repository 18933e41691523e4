"""The ISV signal bus: one float32 device array of ISV_TOTAL_DIM named slots, and its one table.

Producer kernels (EMAs of gradient norms, Q statistics, losses, rewards; adaptive factors) write slots
inside the captured training graph; consumer kernels read them in the same graph, so adaptive signals
never leave the GPU. The host reads the bus only every K steps (HEALTH_DIAG) or at a fold boundary.

`SLOTS` below is the only place a slot index is written. Kernels get indices as int32 arguments
(`i32(Isv.Q_ABS_REF)`) or as compile-time constants taken from `Isv`, never as literals. The indices the
seed system fixed are kept (Q_ABS_REF 16, Q_DIR_ABS_REF 21, reward-component EMAs 63-68, VSN focus EMAs
87-88, MoE expert utilisation 118-125 and gate entropy 126, MOE_LAMBDA_EFF 128, Q_DRIFT_RATE 129,
FOLD_WARMUP_FACTOR 130); every index not named is RESERVED_nnn. The seed's description names no slot 127; the
MoE controller's input (MOE_MAX_UTIL_EMA) takes it, beside the slots it sits between.

Each slot states its bootstrap value (written when the bus is created) and its fold-reset value (what the
StateResetRegistry writes at a fold boundary; None: the slot carries over from fold to fold).
`layout_fingerprint()` hashes names, indices and the total; every checkpoint stores it and a checkpoint
with another fingerprint is refused. `python -m fox_numba.device.isv --write` regenerates ISV_SLOTS.md
beside this file (a test checks the committed table is current).
"""

from __future__ import annotations

import enum
import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fox_numba.config import INT_CHOICES
from fox_numba.device.elementwise import scatter_f32
from fox_numba.device.launch import i32, launch_strided
from fox_numba.device.memory import Mapped, device_empty
from fox_numba.device.staging import Stager
from fox_numba.io import generated_doc_main

ISV_TOTAL_DIM = 131
MOE_MAX_EXPERTS = max(INT_CHOICES["network.moe_experts"])
"""Most experts a mixture-of-experts head may have: one utilisation slot each (the seed's 118-125)."""
MOE_LAMBDA_BASE = 0.01
"""MOE_LAMBDA_EFF's bootstrap and fold-reset value: the Switch Transformer's load-balancing weight (Fedus et al.
2021, alpha = 1e-2); kernels/moe.py's controller moves it from there within its floor and ceiling."""
SLOT_DOC_PATH = Path(__file__).with_name("ISV_SLOTS.md")

# Producers and consumers named below are kernels of later stages (agent/, kernels/signals, diag/).
_GRAD = "learner grad-norm reduce (every step, train graph)"
_CLIP = "learner adaptive-clip producer (every step, train graph)"
_QSTATS = "learner q-stats reduce (every step, train graph)"
_LOSS = "learner C51 loss reduce (every step, train graph)"
_ROLLOUT = "collector action-select/env-step reduce (every collect step)"
_DIAG = "HEALTH_DIAG"
_VSN = "learner VSN gate focus reduce (every step, train graph; kernels/vsn.py)"
_MOE = "learner MoE gate producer (every step, train graph; kernels/moe.py moe_signals, one thread)"


@dataclass(frozen=True)
class Slot:
    """One ISV slot: what it holds, who writes and reads it, and the values resets write."""

    name: str
    index: int
    meaning: str
    producer: str
    consumers: str
    bootstrap: float = 0.0
    fold_reset: float | None = 0.0

    @property
    def reserved(self) -> bool:
        return self.name.startswith("RESERVED_")


_NAMED: tuple[Slot, ...] = (
    # 0-15: gradients and the optimiser
    Slot("GRAD_NORM_RAW", 0, "Global L2 norm of the gradient before clipping, last step.", _GRAD,
         "GRAD_NORM_EMA, GRAD_NORM_FAST_EMA, GRAD_NORM_SLOW_EMA producers; " + _DIAG),
    Slot("GRAD_NORM_EMA", 1, "EMA (alpha 0.01) of the observed norm (min(GRAD_NORM_RAW, CLIP_EFF) under "
         "learner.warmup_rule 'damped', GRAD_NORM_RAW under 'seed'); the adaptive clip base is "
         "GRAD_NORM_EMA * learner.clip_ema_mult (0: no observation yet, the first one seeds it).", _CLIP,
         "clip_eff = clip_base * (0.1 + 0.9 * FOLD_WARMUP_FACTOR)", fold_reset=None),
    Slot("GRAD_NORM_FAST_EMA", 2, "EMA (alpha 0.1) of the observed norm (as GRAD_NORM_EMA): the fold's recent "
         "gradient scale.",
         _CLIP, "FOLD_WARMUP_FACTOR"),
    Slot("GRAD_NORM_SLOW_EMA", 3, "EMA (alpha 0.001) of the observed norm (as GRAD_NORM_EMA): the cross-fold "
         "steady-state gradient scale, kept across folds as the warm-up baseline; under the 'damped' rule a "
         "spike cannot lift it, and it follows a raw norm below it at alpha 0.02 (a fold with smaller "
         "gradients re-baselines in ~50 steps).", _CLIP, "FOLD_WARMUP_FACTOR",
         fold_reset=None),
    Slot("CLIP_ENGAGED_EMA", 4, "EMA (alpha 0.01) of 1 when GRAD_NORM_RAW exceeded clip_eff, else 0.",
         _CLIP, _DIAG),
    Slot("UPDATE_RMS_EMA", 5, "EMA (alpha 0.01) of the RMS of Adam's parameter update.",
         "learner Adam kernel reduce (every step, train graph)", _DIAG),
    Slot("PARAM_NORM", 6, "L2 norm of the online network's parameters after the last applied step.",
         "learner Polyak reduce (every step, train graph)", "TARGET_DRIFT_EMA producer; " + _DIAG,
         fold_reset=None),
    Slot("NONFINITE_STEPS", 8, "Steps of this fold whose loss or gradient held a NaN or Inf (count).",
         _GRAD, "kill criteria; " + _DIAG),
    Slot("GRAD_NORM_OBSERVED", 9, "Finite GRAD_NORM_RAW observations folded into GRAD_NORM_SLOW_EMA "
         "(count, saturating at 2**24 where float32 stops counting exactly); it carries over folds with the "
         "slow EMA, so the warm-up bootstrap covers the run's first 200 steps, not every fold's.", _CLIP,
         "FOLD_WARMUP_FACTOR (bootstrap branch); " + _DIAG, fold_reset=None),
    Slot("CLIP_EFF", 10, "Gradient-norm clip threshold in force this step: max(GRAD_NORM_EMA * "
         "learner.clip_ema_mult * (0.1 + 0.9 * FOLD_WARMUP_FACTOR), 1e-12); rewritten every step before "
         "it is read.", _CLIP, "learner Adam kernel (gradient scale min(1, CLIP_EFF / GRAD_NORM_RAW)); "
         "CLIP_ENGAGED_EMA; " + _DIAG, fold_reset=None),
    # 16-31: Q-value statistics
    Slot("Q_ABS_REF", 16, "EMA (alpha 0.05) of the mean |E[Q]| over the magnitude-branch bins: the "
         "network's Q scale.", _QSTATS,
         "Q-drift kill floor; Q_DRIFT_RATE producer; learner support refresh (non-direction heads, per epoch)",
         bootstrap=0.05,
         fold_reset=None),
    Slot("Q_MEAN_EMA", 17, "EMA (alpha 0.05) of the batch mean of E[Q] over all branch actions.", _QSTATS,
         _DIAG),
    Slot("Q_STD_EMA", 18, "EMA (alpha 0.05) of the batch standard deviation of E[Q].", _QSTATS, _DIAG),
    Slot("Q_EPOCH_MEAN_PREV", 19, "Mean E[Q] of the previous epoch: the Q-drift baseline.",
         "kernels/drift.py q_drift_rate_producer (every epoch, after the kill check)", "Q_DRIFT_RATE producer"),
    Slot("TD_ABS_EMA", 20, "EMA (alpha 0.05) of the mean |r + discount * E_target[Q(s', a*)] - E[Q(s, a)]| over "
         "the branch rows of the taken actions that had an effect.", _LOSS, _DIAG),
    Slot("Q_DIR_ABS_REF", 21, "EMA (alpha 0.05) of the mean |E[Q]| over the direction-branch bins: the "
         "direction Q scale.", _QSTATS,
         "reward-shaping caps (timing bonus, regime penalty); Q-drift kill floor; Q_DRIFT_RATE producer; "
         "learner support refresh (direction heads, per epoch)",
         bootstrap=0.05, fold_reset=None),
    Slot("Q_DIR_GAP_EMA", 22, "EMA (alpha 0.05) of the gap between the best and second-best direction "
         "E[Q] (conviction).", _QSTATS, _DIAG),
    Slot("ATOM_ENTROPY_EMA", 23, "EMA (alpha 0.05) of the C51 distributions' entropy / log(n_atoms).",
         _QSTATS, _DIAG, fold_reset=None),
    Slot("ATOM_UTIL_EMA", 24, "EMA (alpha 0.05) of the fraction of atoms holding probability > 1e-3.",
         _QSTATS, _DIAG, fold_reset=None),
    Slot("TARGET_Q_MEAN_EMA", 25, "EMA (alpha 0.05) of the batch mean of the target network's E[Q] at the "
         "double-DQN next bins (s', a*).", _LOSS, _DIAG),
    Slot("Q_MAX_ABS", 26, "Largest |E[Q]| of the last batch (+inf if any E[Q] was not finite).", _QSTATS,
         "Q-drift kill; " + _DIAG),
    # 32-47: losses
    Slot("LOSS_EMA", 32, "EMA (alpha 0.01) of the C51 cross-entropy summed over the four branches.", _LOSS,
         _DIAG),
    Slot("LOSS_DIR_EMA", 33, "EMA (alpha 0.01) of the direction branch's mean cross-entropy (rows where it had "
         "an effect).", _LOSS, _DIAG),
    Slot("LOSS_MAG_EMA", 34, "EMA (alpha 0.01) of the magnitude branch's mean cross-entropy (rows where it had "
         "an effect).", _LOSS, _DIAG),
    Slot("LOSS_ORD_EMA", 35, "EMA (alpha 0.01) of the order-type branch's mean cross-entropy (rows where it had "
         "an effect).", _LOSS, _DIAG),
    Slot("LOSS_URG_EMA", 36, "EMA (alpha 0.01) of the urgency branch's mean cross-entropy (rows where it had an "
         "effect).", _LOSS, _DIAG),
    Slot("LOSS_RAW", 37, "The loss of the last step: sum over branch rows of branch weight x effect / B x "
         "cross-entropy (non-finite marks the step non-finite).", _LOSS,
         "learner non-finite guard; kill criteria; " + _DIAG),
    # 48-62: the training rollouts
    Slot("ACT_SHORT_FRAC_EMA", 48, "EMA (alpha 0.05) of the fraction of rollout actions going Short.",
         _ROLLOUT, _DIAG + " (train active fraction = Short + Long)"),
    Slot("ACT_HOLD_FRAC_EMA", 49, "EMA (alpha 0.05) of the fraction of rollout actions that Hold.", _ROLLOUT,
         _DIAG),
    Slot("ACT_LONG_FRAC_EMA", 50, "EMA (alpha 0.05) of the fraction of rollout actions going Long.",
         _ROLLOUT, _DIAG + " (train active fraction = Short + Long)"),
    Slot("ACT_FLAT_FRAC_EMA", 51, "EMA (alpha 0.05) of the fraction of rollout actions going Flat.",
         _ROLLOUT, _DIAG),
    Slot("POSITION_ABS_EMA", 52, "EMA (alpha 0.05) of the mean |position| / env.max_position.", _ROLLOUT,
         _DIAG),
    Slot("TURNOVER_EMA", 53, "EMA (alpha 0.05) of contracts traded per environment step.", _ROLLOUT, _DIAG),
    Slot("EPISODE_RETURN_EMA", 54, "EMA (alpha 0.05) of the returns of completed episodes.", _ROLLOUT,
         _DIAG),
    Slot("REWARD_ABS_EMA", 55, "EMA (alpha 0.05) of the mean |reward| per step. Carries over folds like the Q "
         "scale references: the support refresh before a fold's first collect reads it beside them, and a reset "
         "to 0 would halve every support the fold starts with (rewards are in risk units, comparable across "
         "folds).", _ROLLOUT, "learner support refresh (per epoch); " + _DIAG, fold_reset=None),
    # 63-68: reward components (seed indices), EMA (alpha 0.05) of the mean |component| per step
    Slot("REWARD_PNL_EMA", 63, "Reward component: mark-to-market PnL net of commission.", _ROLLOUT,
         _DIAG + " reward_split"),
    Slot("REWARD_NOVELTY_EMA", 64, "Reward component: novelty bonus (seed B.2).", _ROLLOUT,
         _DIAG + " reward_split"),
    Slot("REWARD_PERSIST_EMA", 65, "Reward component: persistence shaping (seed D.4a).", _ROLLOUT,
         _DIAG + " reward_split"),
    Slot("REWARD_REGIME_EMA", 66, "Reward component: regime penalty, capped by Q_DIR_ABS_REF (seed D.4b).",
         _ROLLOUT, _DIAG + " reward_split"),
    Slot("REWARD_STABLE_EMA", 67, "Reward component: stability shaping (seed D.4c).", _ROLLOUT,
         _DIAG + " reward_split"),
    Slot("REWARD_TIMING_EMA", 68, "Reward component: timing bonus, capped by Q_DIR_ABS_REF (seed C.4).",
         _ROLLOUT, _DIAG + " reward_split"),
    # 80-95: the network and its target
    Slot("HIDDEN_RMS_L0_EMA", 80, "EMA (alpha 0.01) of the RMS activation of trunk layer 0 (0 if absent).",
         "learner forward reduce (every diag_every steps)", _DIAG, fold_reset=None),
    Slot("HIDDEN_RMS_L1_EMA", 81, "EMA (alpha 0.01) of the RMS activation of trunk layer 1 (0 if absent).",
         "learner forward reduce (every diag_every steps)", _DIAG, fold_reset=None),
    Slot("HIDDEN_RMS_L2_EMA", 82, "EMA (alpha 0.01) of the RMS activation of trunk layer 2 (0 if absent).",
         "learner forward reduce (every diag_every steps)", _DIAG, fold_reset=None),
    Slot("HIDDEN_RMS_L3_EMA", 83, "EMA (alpha 0.01) of the RMS activation of trunk layer 3 (0 if absent).",
         "learner forward reduce (every diag_every steps)", _DIAG, fold_reset=None),
    Slot("DEAD_UNIT_FRAC_EMA", 84, "EMA (alpha 0.01) of the fraction of trunk ReLU units zero over a batch "
         "(0 without a trunk).",
         "learner forward reduce (every diag_every steps)", _DIAG, fold_reset=None),
    # 87-88: the seed's VSN attention focus EMAs
    Slot("VSN_FOCUS_MAX_EMA", 87, "EMA (alpha 0.01) of the batch mean of the largest variable-selection gate "
         "weight max_k w_k, clamped to [1/K, 1] (1/K: a uniform gate; 1: every row reads one group); the first "
         "observation seeds it; 0 while network.vsn is off.", _VSN, _DIAG, fold_reset=None),
    Slot("VSN_FOCUS_ENTROPY_EMA", 88, "EMA (alpha 0.01) of the batch mean of the gate entropy -sum_k w_k ln w_k "
         "/ ln K, clamped to [0, 1] (1: uniform; 0: one group); seeded with VSN_FOCUS_MAX_EMA; 0 while network.vsn "
         "is off.", _VSN, _DIAG, fold_reset=None),
    Slot("TARGET_DRIFT_EMA", 92, "EMA (alpha 0.05) of |theta_target - theta_online| / max(PARAM_NORM, "
         "1e-6) (seed index).", "learner Polyak reduce (every step, train graph)", _DIAG),
    Slot("TARGET_Q_DRIFT_EMA", 93, "EMA (alpha 0.05) of the batch mean |E[Q_target] - E[Q_online]| at the "
         "double-DQN next bins (s', a*) (seed index).", _LOSS, _DIAG),
    # 113, 114, 117: the seed's auxiliary-head loss EMAs
    Slot("IQN_LOSS_EMA", 113, "EMA (alpha 0.01) of the IQN head's quantile Huber loss, sum over branch rows of "
         "branch weight x effect / B x the row's loss (the loss the step optimises before learner.iqn_weight); "
         "0 while network.iqn_quantiles = 0 (the seed's first auxiliary-head loss slot).",
         "learner IQN loss reduce (every step, train graph; kernels/iqn.py)", _DIAG),
    Slot("AUX_LOSS_EMA", 114, "EMA (alpha 0.01) of the auxiliary forecast regression's loss, the mean (f - y)^2 / 2 "
         "over the batch rows with a target (learner.aux_weight > 0; the seed's second auxiliary-head loss slot); 0 "
         "while learner.aux_weight = 0.", "learner aux forecast loss (every step, train graph; kernels/learner.py "
         "aux_forecast_loss)", _DIAG),
    # 118-128: the seed's mixture-of-experts head signals (network.moe_experts = K > 0; agent/moe.py)
    *(Slot(f"MOE_UTIL_EMA_{k}", 118 + k, f"EMA (alpha 0.01) of expert {k}'s utilisation: its batch-mean gate weight, "
           "averaged over the 4 branch gates (1/K each when balanced); the first observation of a fold seeds it; 0 "
           "for k >= K and while network.moe_experts = 0.", _MOE, _DIAG) for k in range(MOE_MAX_EXPERTS)),
    Slot("MOE_GATE_ENTROPY_EMA", 126, "EMA (alpha 0.01) of the batch mean of the per-sample gate entropy -sum_k "
         "w_k ln w_k / ln K, averaged over the branch gates, clamped to [0, 1] (1: every sample mixes its experts "
         "uniformly; 0: every sample reads one expert); seeded with the utilisation; 0 while network.moe_experts = "
         "0.", _MOE, _DIAG),
    Slot("MOE_MAX_UTIL_EMA", 127, "EMA (alpha 0.01) of the largest expert utilisation of a branch gate, averaged "
         "over the branches, clamped to [1/K, 1] (1/K: balanced load; 1: one expert takes every sample); seeded "
         "with the utilisation; 0 while network.moe_experts = 0 (no seed index: the seed names none for 127).",
         _MOE, "MOE_LAMBDA_EFF controller; " + _DIAG),
    Slot("MOE_LAMBDA_EFF", 128, "Effective weight of the MoE load-balancing loss (seed index): each step "
         "lambda *= exp(MOE_LAMBDA_GAIN (i - MOE_IMBALANCE_TARGET)), i = (MOE_MAX_UTIL_EMA - 1/K) / (1 - 1/K) the "
         "load imbalance in [0, 1], then clamped to the permanent [MOE_LAMBDA_FLOOR, MOE_LAMBDA_CEIL] (constants "
         "of kernels/moe.py); unchanged until MOE_MAX_UTIL_EMA has an observation; nothing reads it while "
         "network.moe_experts = 0.", _MOE,
         "learner MoE gate gradient (every step, train graph); " + _DIAG, bootstrap=MOE_LAMBDA_BASE,
         fold_reset=MOE_LAMBDA_BASE),
    # 129-130: seed tail
    Slot("Q_DRIFT_RATE", 129, "|q_mean(t) - q_mean(t-1)| / max(|q_mean(t-1)|, Q_ABS_REF + Q_DIR_ABS_REF, "
         "1e-6), clipped to [0, 4]; t counts epochs; unchanged while |q_mean(t-1)| <= 1e-6.",
         "kernels/drift.py q_drift_rate_producer (every epoch, after the kill check)",
         "learner schedule kernel: tau = scheduled tau / (1 + clip(Q_DRIFT_RATE, 0, 4)), so tau stays in "
         "[tau_base/5, tau_base] with tau_min_frac 1"),
    Slot("FOLD_WARMUP_FACTOR", 130, "clamp(GRAD_NORM_FAST_EMA / GRAD_NORM_SLOW_EMA, 0, 1); 1 while "
         "GRAD_NORM_OBSERVED is under 200 or the slow EMA is under 1e-6. 0 at a fold boundary (the fast EMA "
         "restarts at 0), back near 1 within ~20-50 steps.", _CLIP,
         "learner Adam kernel: lr = the scheduled lr of the step (device optimiser state) * max(0.05, factor); "
         "CLIP_EFF = clip_base * (0.1 + 0.9 * factor)",
         bootstrap=1.0, fold_reset=0.0),
)


def _with_reserved(named: tuple[Slot, ...], total: int) -> tuple[Slot, ...]:
    by_index = {s.index: s for s in named}
    if len(by_index) != len(named):
        raise ValueError("two ISV slots share an index")
    if max(by_index) >= total:
        raise ValueError(f"an ISV slot index is beyond ISV_TOTAL_DIM={total}")
    return tuple(
        by_index.get(i) or Slot(f"RESERVED_{i:03d}", i, "Reserved: no producer.", "-", "-", 0.0, None)
        for i in range(total)
    )


SLOTS: tuple[Slot, ...] = _with_reserved(_NAMED, ISV_TOTAL_DIM)

Isv = enum.IntEnum("Isv", [(s.name, s.index) for s in SLOTS])
Isv.__doc__ = "Slot indices by name (`Isv.Q_ABS_REF == 16`); the table is `SLOTS`."


def layout_fingerprint(slots: tuple[Slot, ...] = SLOTS, total: int = ISV_TOTAL_DIM) -> str:
    """sha256 (first 16 hex digits) of every slot's `name:index` and the total."""
    text = "\n".join(f"{s.name}:{s.index}" for s in slots) + f"\nISV_TOTAL_DIM:{total}\n"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


ISV_FINGERPRINT = layout_fingerprint()


def bootstrap_values() -> np.ndarray:
    """The float32 vector written into a new bus."""
    return np.array([s.bootstrap for s in SLOTS], dtype=np.float32)


def fold_reset_entries() -> tuple[np.ndarray, np.ndarray]:
    """(int32 slot indices, float32 values) that a fold boundary writes; other slots carry over."""
    resets = [s for s in SLOTS if s.fold_reset is not None]
    return (np.array([s.index for s in resets], dtype=np.int32),
            np.array([s.fold_reset for s in resets], dtype=np.float32))


class IsvBus:
    """The bus on the device: `values` (float32[ISV_TOTAL_DIM]) holding the bootstrap values at creation."""

    def __init__(self, stager: Stager) -> None:
        self._stager = stager
        self.values: Any = device_empty(ISV_TOTAL_DIM, np.float32)
        stager.upload(bootstrap_values(), self.values)
        index, values = fold_reset_entries()
        self._reset_index = Mapped(index.size, np.int32)
        self._reset_values = Mapped(values.size, np.float32)
        self._reset_index.host[:] = index
        self._reset_values.host[:] = values

    def read(self) -> np.ndarray:
        """A host copy of every slot (synchronises the stager's stream)."""
        return self._stager.download(self.values)

    def fold_reset(self, stream: Any) -> None:
        """Write every slot's fold-reset value on `stream`; slots with fold_reset None are untouched."""
        n = self._reset_index.shape[0]
        launch_strided(scatter_f32, n, self.values, self._reset_index.device, self._reset_values.device, i32(n),
               stream=stream)


def _fmt(value: float | None) -> str:
    return "carries over" if value is None else f"{value:g}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def slot_table_markdown() -> str:
    """The slot table as markdown; runs of reserved slots are one row."""
    lines = [
        "# ISV slots",
        "",
        "Generated by `python -m fox_numba.device.isv --write` from `fox_numba/device/isv.py`; do not edit.",
        "",
        f"ISV_TOTAL_DIM = {ISV_TOTAL_DIM}, layout fingerprint `{ISV_FINGERPRINT}`. "
        "Bootstrap: written when the bus is created. Fold reset: written at every fold boundary.",
        "",
        "| index | name | meaning | producer | consumers | bootstrap | fold reset |",
        "| ---: | --- | --- | --- | --- | ---: | ---: |",
    ]
    i = 0
    while i < len(SLOTS):
        s = SLOTS[i]
        if s.reserved:
            j = i
            while j + 1 < len(SLOTS) and SLOTS[j + 1].reserved:
                j += 1
            span = f"{i}" if j == i else f"{i}-{j}"
            names = s.name if j == i else f"{s.name} .. {SLOTS[j].name}"
            values = f"{_fmt(s.bootstrap)} | {_fmt(s.fold_reset)}"
            lines.append(f"| {span} | {names} | reserved | - | - | {values} |")
            i = j + 1
            continue
        lines.append(
            f"| {s.index} | {s.name} | {_cell(s.meaning)} | {_cell(s.producer)} | {_cell(s.consumers)} "
            f"| {_fmt(s.bootstrap)} | {_fmt(s.fold_reset)} |"
        )
        i += 1
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    return generated_doc_main(argv, SLOT_DOC_PATH, slot_table_markdown(), "ISV slot table")


if __name__ == "__main__":
    sys.exit(main())
