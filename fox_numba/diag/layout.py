"""The HEALTH_DIAG snapshot: one record of 4-byte words, its field table, the line format and its parser.

The snapshot lives in mapped pinned memory (`HealthDiag`, agent/health.py); kernels write every field
(an ISV-mirror kernel, deterministic block reductions of per-sample buffers, a finalise kernel), except
the few fields the host owns already (the fold, epoch and the kill criteria's state, which live on the
host), and the host only formats. Every field is float32 or uint32, so the record has no padding and
kernels address it as flat word arrays (`words_f32`, `words_u32` of the same memory).

`FIELDS` below is the only place a field is defined: its word index is its position. The line is
`HEALTH_DIAG key=value ...` in that order; float32 values are written with the shortest text that reads
back to the same float32, so `parse_line(format_line(record))` returns the record exactly.
`python -m fox_numba.diag.layout --write` regenerates HEALTH_DIAG.md beside this file (a test checks it
is current); `layout_fingerprint()` changes whenever a field is added, removed, renamed or moved.
"""

from __future__ import annotations

import hashlib
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fox_numba.actions import BRANCHES, Magnitude
from fox_numba.device.isv import MOE_MAX_EXPERTS, Isv
from fox_numba.io import generated_doc_main

PREFIX = "HEALTH_DIAG"
DOC_PATH = Path(__file__).with_name("HEALTH_DIAG.md")


@dataclass(frozen=True)
class Field:
    """One word of the snapshot: its name, type ('f32' or 'u32'), meaning, and who writes it.

    `isv` names the ISV slot the mirror kernel copies (None: another writer, named in `source`).
    """

    name: str
    kind: str
    meaning: str
    source: str
    isv: str | None = None


def _mirror(name: str, slot: str, meaning: str) -> Field:
    return Field(name, "f32", meaning, f"ISV mirror (ISV[{slot}] = {int(Isv[slot])})", slot)


_HIST = "action histogram kernel"
_MAG = "per-magnitude reduce kernel"
_FIN = "finalise kernel"
_HOST = "host (kill criteria state lives on the host)"
_SIGMA = "noisy sigma kernel (from the online parameters)"

_REWARD = ("pnl", "novelty", "persist", "regime", "stable", "timing")
_REWARD_SLOTS = ("REWARD_PNL_EMA", "REWARD_NOVELTY_EMA", "REWARD_PERSIST_EMA", "REWARD_REGIME_EMA",
                 "REWARD_STABLE_EMA", "REWARD_TIMING_EMA")
_BINS = tuple(f"{b.name[:3]}_{m.name.lower()}" for b in BRANCHES for m in b.bins)
_MAGS = tuple(m.name.lower() for m in Magnitude)

FIELDS: tuple[Field, ...] = (
    Field("fold", "u32", "Walk-forward fold index.", _HOST),
    Field("epoch", "u32", "Epoch within the fold.", _HOST),
    Field("step", "u32", "Gradient steps taken in this fold (the learner's device counter).", _FIN),
    *(_mirror(f"reward_{r}", s, f"EMA of the mean |{r} reward component| per step (reward split).")
      for r, s in zip(_REWARD, _REWARD_SLOTS, strict=True)),
    _mirror("reward_abs", "REWARD_ABS_EMA", "EMA of the mean |reward| per rollout step."),
    _mirror("q_abs_ref", "Q_ABS_REF", "EMA of mean |E[Q]| over the magnitude bins (Q scale)."),
    _mirror("q_dir_abs_ref", "Q_DIR_ABS_REF", "EMA of mean |E[Q]| over the direction bins (direction Q scale)."),
    _mirror("q_mean", "Q_MEAN_EMA", "EMA of the batch mean of E[Q]."),
    _mirror("q_std", "Q_STD_EMA", "EMA of the batch standard deviation of E[Q]."),
    _mirror("q_max_abs", "Q_MAX_ABS", "Largest |E[Q]| of the last batch."),
    _mirror("q_dir_gap", "Q_DIR_GAP_EMA", "EMA of the best minus second-best direction E[Q]."),
    _mirror("td_abs", "TD_ABS_EMA", "EMA of mean |E[target] - E[Q]| of the taken actions."),
    _mirror("target_q_mean", "TARGET_Q_MEAN_EMA", "EMA of the target network's batch mean E[Q]."),
    _mirror("target_q_drift", "TARGET_Q_DRIFT_EMA", "EMA of mean |E[Q_target] - E[Q_online]|."),
    _mirror("atom_entropy", "ATOM_ENTROPY_EMA", "EMA of the C51 entropy / log(n_atoms)."),
    _mirror("atom_util", "ATOM_UTIL_EMA", "EMA of the fraction of atoms holding probability > 1e-3."),
    _mirror("loss", "LOSS_EMA", "EMA of the C51 cross-entropy summed over the branches."),
    _mirror("loss_dir", "LOSS_DIR_EMA", "EMA of the direction branch's cross-entropy."),
    _mirror("loss_mag", "LOSS_MAG_EMA", "EMA of the magnitude branch's cross-entropy."),
    _mirror("loss_ord", "LOSS_ORD_EMA", "EMA of the order-type branch's cross-entropy."),
    _mirror("loss_urg", "LOSS_URG_EMA", "EMA of the urgency branch's cross-entropy."),
    _mirror("loss_iqn", "IQN_LOSS_EMA",
            "EMA of the IQN head's quantile Huber loss (0 when network.iqn_quantiles = 0)."),
    _mirror("loss_aux", "AUX_LOSS_EMA",
            "EMA of the auxiliary forecast regression's loss (0 when learner.aux_weight = 0)."),
    _mirror("grad_norm_raw", "GRAD_NORM_RAW", "Global gradient norm before clipping, last step."),
    Field("grad_norm_clipped", "f32", "Gradient norm after clipping: min(grad_norm_raw, clip_eff).", _FIN),
    _mirror("grad_norm_ema", "GRAD_NORM_EMA", "EMA of the raw gradient norm (the clip base)."),
    _mirror("grad_norm_fast", "GRAD_NORM_FAST_EMA", "Fast EMA of the gradient norm (warm-up factor numerator)."),
    _mirror("grad_norm_slow", "GRAD_NORM_SLOW_EMA", "Slow EMA of the gradient norm (warm-up factor baseline)."),
    _mirror("clip_eff", "CLIP_EFF", "Gradient-norm clip in force."),
    _mirror("clip_engaged", "CLIP_ENGAGED_EMA", "EMA of the fraction of steps whose norm exceeded the clip."),
    Field("lr_eff", "f32", "Learning rate of the last step: scheduled lr x max(0.05, warm-up factor).", _FIN),
    Field("tau_eff", "f32", "Polyak rate of the last step: tau_base x cosine / (1 + drift rate).", _FIN),
    _mirror("warmup_factor", "FOLD_WARMUP_FACTOR", "Fold warm-up factor damping lr and clip."),
    _mirror("drift_rate", "Q_DRIFT_RATE", "Per-epoch Q drift rate, clipped to [0, 4]."),
    _mirror("update_rms", "UPDATE_RMS_EMA", "EMA of the RMS of Adam's parameter update."),
    _mirror("param_norm", "PARAM_NORM", "L2 norm of the online parameters."),
    _mirror("target_drift", "TARGET_DRIFT_EMA", "EMA of |theta_target - theta_online| / |theta_online|."),
    _mirror("hidden_rms_l0", "HIDDEN_RMS_L0_EMA", "EMA of the RMS activation of trunk layer 0 (0 if absent)."),
    _mirror("hidden_rms_l1", "HIDDEN_RMS_L1_EMA", "EMA of the RMS activation of trunk layer 1 (0 if absent)."),
    _mirror("dead_frac", "DEAD_UNIT_FRAC_EMA",
            "EMA of the fraction of trunk ReLU units zero over a batch (0 without a trunk)."),
    _mirror("vsn_focus_max", "VSN_FOCUS_MAX_EMA",
            "EMA of the mean largest VSN gate weight, in [1/K, 1] (1/K uniform; 0 when network.vsn is off)."),
    _mirror("vsn_focus_entropy", "VSN_FOCUS_ENTROPY_EMA",
            "EMA of the mean VSN gate entropy / ln K, in [0, 1] (1 uniform; 0 when network.vsn is off)."),
    *(_mirror(f"moe_util_{k}", f"MOE_UTIL_EMA_{k}", f"EMA of MoE expert {k}'s utilisation (batch-mean gate weight, "
              "mean over the branch gates; 1/K balanced; 0 for k >= K and when network.moe_experts = 0).")
      for k in range(MOE_MAX_EXPERTS)),
    _mirror("moe_gate_entropy", "MOE_GATE_ENTROPY_EMA",
            "EMA of the mean per-sample MoE gate entropy / ln K, in [0, 1] (0 when network.moe_experts = 0)."),
    _mirror("moe_max_util", "MOE_MAX_UTIL_EMA",
            "EMA of the largest expert utilisation of a branch gate, in [1/K, 1] (0 when network.moe_experts = 0)."),
    _mirror("moe_lambda_eff", "MOE_LAMBDA_EFF",
            "Load-balancing loss weight in force (controller in kernels/moe.py; unused when network.moe_experts = 0)."),
    *(Field(f"noisy_sigma_{b.name[:3]}", "f32", f"Mean |sigma| of the {b.name} branch's noisy head weights and "
            f"biases (network.noisy_sigma0 > 0; 0 when off).", _SIGMA) for b in BRANCHES),
    _mirror("nonfinite_steps", "NONFINITE_STEPS", "Steps of this fold skipped for a non-finite loss or gradient."),
    _mirror("act_short", "ACT_SHORT_FRAC_EMA", "EMA of the rollout share of Short."),
    _mirror("act_hold", "ACT_HOLD_FRAC_EMA", "EMA of the rollout share of Hold."),
    _mirror("act_long", "ACT_LONG_FRAC_EMA", "EMA of the rollout share of Long."),
    _mirror("act_flat", "ACT_FLAT_FRAC_EMA", "EMA of the rollout share of Flat."),
    _mirror("position_abs", "POSITION_ABS_EMA", "EMA of mean |position| / max_position."),
    _mirror("turnover", "TURNOVER_EMA", "EMA of contracts traded per environment step."),
    _mirror("episode_return", "EPISODE_RETURN_EMA", "EMA of completed episodes' returns."),
    *(Field(f"train_{b}", "u32", f"Actions of the last collect step with bin {b}.", _HIST) for b in _BINS),
    *(Field(f"eval_{b}", "u32", f"Actions of the last validation backtest with bin {b}.", _HIST) for b in _BINS),
    *(Field(f"mag_win_{m}", "f32", f"Share of positive rewards among the last collect step's Long/Short "
            f"actions of magnitude {m} (0 when none).", _MAG) for m in _MAGS),
    *(Field(f"mag_pnl_var_{m}", "f32", f"Variance of the reward among the last collect step's Long/Short "
            f"actions of magnitude {m} (0 when fewer than two).", _MAG) for m in _MAGS),
    Field("limit_fill_rate", "f32", "Contracts filled / contracts placed by limit orders this epoch.", _FIN),
    Field("kill_q_median", "f32", "Median of the Q-drift window (NaN until 3 epochs are in it).", _HOST),
    Field("kill_q_mad", "f32", "MAD of the Q-drift window (NaN until 3 epochs are in it).", _HOST),
    Field("kill_q_floor", "f32", "Q-drift kill floor max(0.5, 3 max(q_abs_ref, q_dir_abs_ref)).", _HOST),
    Field("kill_collapse_epochs", "u32", "Consecutive epochs of near-zero gradient (collapse kill at 5).", _HOST),
)

FIELD_INDEX: dict[str, int] = {f.name: i for i, f in enumerate(FIELDS)}
N_WORDS = len(FIELDS)
SNAPSHOT_DTYPE = np.dtype([(f.name, "<f4" if f.kind == "f32" else "<u4") for f in FIELDS])

# Word indices the kernels take as compile-time constants.
W_STEP = FIELD_INDEX["step"]
W_GRAD_CLIPPED = FIELD_INDEX["grad_norm_clipped"]
W_LR_EFF = FIELD_INDEX["lr_eff"]
W_TAU_EFF = FIELD_INDEX["tau_eff"]
W_LIMIT_FILL = FIELD_INDEX["limit_fill_rate"]
W_TRAIN_HIST = FIELD_INDEX[f"train_{_BINS[0]}"]
W_EVAL_HIST = FIELD_INDEX[f"eval_{_BINS[0]}"]
W_MAG_WIN = FIELD_INDEX[f"mag_win_{_MAGS[0]}"]
W_MAG_VAR = FIELD_INDEX[f"mag_pnl_var_{_MAGS[0]}"]
W_NOISY_SIGMA = FIELD_INDEX[f"noisy_sigma_{BRANCHES[0].name[:3]}"]


def _check_layout() -> None:
    if len(FIELD_INDEX) != N_WORDS:
        raise ValueError("two HEALTH_DIAG fields share a name")
    if SNAPSHOT_DTYPE.itemsize != 4 * N_WORDS:
        raise ValueError("the HEALTH_DIAG record has padding")
    for f in FIELDS:
        if f.kind not in ("f32", "u32") or (f.isv is not None and f.kind != "f32"):
            raise ValueError(f"HEALTH_DIAG field {f.name}: kind {f.kind!r}")


_check_layout()


def mirror_table() -> tuple[np.ndarray, np.ndarray]:
    """(int32 ISV slots, int32 word indices) the ISV-mirror kernel copies, in field order."""
    pairs = [(int(Isv[f.isv]), i) for i, f in enumerate(FIELDS) if f.isv is not None]
    slots, words = zip(*pairs, strict=True)
    return np.array(slots, np.int32), np.array(words, np.int32)


def layout_fingerprint() -> str:
    """sha256 (first 16 hex digits) of every field's name and kind, in order."""
    text = "\n".join(f"{f.name}:{f.kind}" for f in FIELDS) + f"\nN_WORDS:{N_WORDS}\n"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _text(value: np.generic, kind: str) -> str:
    if kind == "u32":
        return str(int(value))
    v = np.float32(value)
    return str(v) if math.isfinite(v) else ("nan" if math.isnan(v) else ("inf" if v > 0 else "-inf"))


def format_line(record: np.void | np.ndarray) -> str:
    """`HEALTH_DIAG name=value ...` in field order; float32 in the shortest text that reads back exactly."""
    rec = np.asarray(record).reshape(())
    return PREFIX + " " + " ".join(f"{f.name}={_text(rec[f.name], f.kind)}" for f in FIELDS)


class ParseError(ValueError):
    """A line that is not a HEALTH_DIAG line of this layout."""


def parse_line(line: str) -> dict[str, float | int]:
    """The fields of a HEALTH_DIAG line as {name: float (f32 values) or int (u32 values)}, in order.

    Refuses a line of another layout (missing, extra or reordered fields) naming the first difference.
    """
    parts = line.strip().split()
    if not parts or parts[0] != PREFIX:
        raise ParseError(f"not a {PREFIX} line: {line[:60]!r}")
    out: dict[str, float | int] = {}
    for pos, part in enumerate(parts[1:]):
        name, sep, value = part.partition("=")
        if not sep:
            raise ParseError(f"{PREFIX} item {pos} {part!r} is not name=value")
        expected = FIELDS[pos].name if pos < N_WORDS else None
        if name != expected:
            raise ParseError(f"{PREFIX} item {pos} is {name!r}, this layout has {expected!r} there")
        kind = FIELDS[pos].kind
        try:
            out[name] = int(value) if kind == "u32" else float(np.float32(value))
        except ValueError:
            raise ParseError(f"{PREFIX} field {name}: {value!r} is not a {kind}") from None
    if len(out) != N_WORDS:
        raise ParseError(f"{PREFIX} line has {len(out)} fields, this layout has {N_WORDS}")
    return out


def to_record(values: dict[str, float | int]) -> np.ndarray:
    """A one-element SNAPSHOT_DTYPE array holding `values` (what `parse_line` returns)."""
    rec = np.zeros(1, SNAPSHOT_DTYPE)
    for f in FIELDS:
        rec[f.name] = values[f.name]
    return rec


def table_markdown() -> str:
    """Every field: word index, name, type, meaning and writer."""
    lines = [
        "# HEALTH_DIAG snapshot",
        "",
        "Generated by `python -m fox_numba.diag.layout --write` from `fox_numba/diag/layout.py`; do not edit.",
        "",
        f"{N_WORDS} words of 4 bytes ({4 * N_WORDS} bytes, no padding), layout fingerprint "
        f"`{layout_fingerprint()}`. The line `{PREFIX} name=value ...` lists the fields in this order.",
        "",
        "| word | name | type | meaning | written by |",
        "| ---: | --- | --- | --- | --- |",
    ]
    for i, f in enumerate(FIELDS):
        lines.append(f"| {i} | {f.name} | {f.kind} | {f.meaning.replace('|', chr(92) + '|')} | {f.source} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    return generated_doc_main(argv, DOC_PATH, table_markdown(), "HEALTH_DIAG field table")


if __name__ == "__main__":
    sys.exit(main())
