"""Kill criteria: checks run on the host once per epoch; a kill ends the fold (the run goes on with the next).

Each criterion reads one `EpochHealth` (host scalars the driver reads once per epoch, mostly ISV slots)
and keeps its own host state, registered in the StateResetRegistry as FoldReset fields, so nothing of one
fold judges the next (the seed's A.1 / A.3 / F+H fixes). They run in a fixed order, non-finite first:

- non_finite: the epoch's q mean or loss is NaN/Inf, or at least NONFINITE_MAX_FRACTION of the epoch's
  gradient steps had a non-finite gradient (ISV[NONFINITE_STEPS] counts them; Adam skips such steps, so a
  few are harmless, a tenth of an epoch is a learner that no longer learns).
- q_drift (seed F+H): a rolling window of the previous Q_DRIFT_WINDOW epoch q means, silent until
  Q_DRIFT_MIN_PRIORS are present; fires when
      |q - median(window)| > Q_DRIFT_DEVIATION * max(MAD(window), Q_DRIFT_MIN_MAD)      (an outlier)
  and |q| > max(Q_DRIFT_FLOOR_MIN, Q_DRIFT_FLOOR_MULT * max(ISV[Q_ABS_REF], ISV[Q_DIR_ABS_REF]))  (and large),
  MAD = median(|x - median(window)|). Seed cases: -0.0795 -> 0.7647 at epoch 2 has two priors and stays
  silent; 0.5, 2.5, 12.5, 62.5 fires at epoch 3 (|62.5 - 2.5| = 60 > 4 * MAD 2 = 8, and 62.5 > 3 * 12 with
  the Q scales at 12).
- grad_collapse (seed A.3): GRAD_COLLAPSE_PATIENCE consecutive epochs whose gradient scale is below
  GRAD_COLLAPSE_FLOOR, counted only once the fold has run GRAD_COLLAPSE_WARMUP_STEPS gradient steps (the
  per-fold step counter restarts at a fold boundary, so the warm-up applies again in every fold).

The constants are the seed's architectural constants, not tuning knobs. `KillCriteria.check` returns the
first criterion that fired as a `Kill` (its `reason` is the line for the log and the metrics).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fox_numba.device.isv import Isv
from fox_numba.walkforward.reset_registry import FoldReset, StateResetRegistry

Q_DRIFT_WINDOW = 5  # epoch q means kept (the seed's smoke fold length)
Q_DRIFT_MIN_PRIORS = 3  # fewer priors make the MAD a half-range that trips on monotone growth
Q_DRIFT_DEVIATION = 4.0  # MADs (about 2.7 sigma for a Gaussian)
Q_DRIFT_MIN_MAD = 0.01  # floor of the MAD when the window is (nearly) constant
Q_DRIFT_FLOOR_MIN = 0.5  # |q| must exceed max(this, ...)
Q_DRIFT_FLOOR_MULT = 3.0  # ... and this many times the network's Q scale

GRAD_COLLAPSE_PATIENCE = 5  # consecutive epochs
GRAD_COLLAPSE_FLOOR = 1e-6  # gradient norm of a live C51 learner: O(1e-2 .. 1e2)
GRAD_COLLAPSE_WARMUP_STEPS = 200  # per-fold gradient steps before an epoch counts (the warm-up bootstrap)

NONFINITE_MAX_FRACTION = 0.1  # of an epoch's gradient steps


@dataclass(frozen=True)
class EpochHealth:
    """What the criteria read at the end of an epoch (host scalars).

    `grad_norm` is the epoch's recent gradient scale (ISV[GRAD_NORM_FAST_EMA] at the epoch's end: the EMA of
    the last ~10 steps' norms); `nonfinite_steps` is the fold's running count (ISV[NONFINITE_STEPS], reset
    to 0 at a fold boundary); `steps` the gradient steps of this epoch; `fold_step` those of the fold so far.
    """

    epoch: int
    q_mean: float
    loss: float
    grad_norm: float
    q_abs_ref: float
    q_dir_abs_ref: float
    nonfinite_steps: int
    steps: int
    fold_step: int

    @classmethod
    def from_isv(cls, isv: np.ndarray, *, epoch: int, q_mean: float, steps: int, fold_step: int,
                 loss: float | None = None) -> EpochHealth:
        """The health record from a host copy of the ISV bus (loss: ISV[LOSS_EMA] unless given)."""
        return cls(
            epoch=epoch, q_mean=float(q_mean),
            loss=float(isv[Isv.LOSS_EMA]) if loss is None else float(loss),
            grad_norm=float(isv[Isv.GRAD_NORM_FAST_EMA]), q_abs_ref=float(isv[Isv.Q_ABS_REF]),
            q_dir_abs_ref=float(isv[Isv.Q_DIR_ABS_REF]), nonfinite_steps=int(isv[Isv.NONFINITE_STEPS]),
            steps=int(steps), fold_step=int(fold_step),
        )


@dataclass(frozen=True)
class Kill:
    """A fired criterion: `reason` is one line for the log and the metrics."""

    criterion: str
    epoch: int
    reason: str
    detail: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"criterion": self.criterion, "epoch": self.epoch, "reason": self.reason, "detail": self.detail}


def _median(x: np.ndarray) -> float:
    return float(np.median(x))


class QDriftKill:
    """The Q-drift criterion with its window of prior epoch q means (a FoldReset field)."""

    NOT_STATE = ()

    def __init__(self) -> None:
        self.window: tuple[float, ...] = ()

    def register_state(self, registry: StateResetRegistry) -> None:
        registry.owner(self, "kill.q_drift").field(
            "window", FoldReset, (), "epoch q means of this fold (cross-fold q statistics would inflate the MAD)")

    def check(self, h: EpochHealth) -> Kill | None:
        q = h.q_mean
        kill = None
        if len(self.window) >= Q_DRIFT_MIN_PRIORS and math.isfinite(q):
            prior = np.asarray(self.window, dtype=np.float64)
            med = _median(prior)
            mad = _median(np.abs(prior - med))
            deviation = abs(q - med)
            limit = Q_DRIFT_DEVIATION * max(mad, Q_DRIFT_MIN_MAD)
            floor = max(Q_DRIFT_FLOOR_MIN, Q_DRIFT_FLOOR_MULT * max(h.q_abs_ref, h.q_dir_abs_ref))
            if deviation > limit and abs(q) > floor:
                kill = Kill("q_drift", h.epoch,
                            f"Q drift at epoch {h.epoch}: q mean {q:.6g} is {deviation:.6g} from the median "
                            f"{med:.6g} of the last {prior.size} epochs (limit {limit:.6g} = "
                            f"{Q_DRIFT_DEVIATION:g} x max(MAD {mad:.6g}, {Q_DRIFT_MIN_MAD:g})) and |q| > floor "
                            f"{floor:.6g}",
                            {"q_mean": q, "median": med, "mad": mad, "deviation": deviation, "limit": limit,
                             "floor": floor})
        if math.isfinite(q):
            self.window = (*self.window, q)[-Q_DRIFT_WINDOW:]
        return kill


class GradCollapseKill:
    """Consecutive epochs of a near-zero gradient after the per-fold warm-up (a FoldReset counter)."""

    NOT_STATE = ()

    def __init__(self) -> None:
        self.count = 0

    def register_state(self, registry: StateResetRegistry) -> None:
        registry.owner(self, "kill.grad_collapse").field(
            "count", FoldReset, 0, "consecutive near-zero-gradient epochs (fold 0's tail must not count in fold 1)")

    def check(self, h: EpochHealth) -> Kill | None:
        if h.fold_step < GRAD_COLLAPSE_WARMUP_STEPS:
            return None
        self.count = self.count + 1 if h.grad_norm < GRAD_COLLAPSE_FLOOR else 0
        if self.count >= GRAD_COLLAPSE_PATIENCE:
            return Kill("grad_collapse", h.epoch,
                        f"gradient collapse at epoch {h.epoch}: gradient norm under {GRAD_COLLAPSE_FLOOR:g} for "
                        f"{self.count} consecutive epochs (last {h.grad_norm:.3g})",
                        {"grad_norm": h.grad_norm, "epochs": float(self.count)})
        return None


class NonFiniteKill:
    """NaN/Inf in the epoch's q mean or loss, or in too many of its gradient steps."""

    NOT_STATE = ()

    def __init__(self) -> None:
        self.seen_steps = 0

    def register_state(self, registry: StateResetRegistry) -> None:
        registry.owner(self, "kill.non_finite").field(
            "seen_steps", FoldReset, 0, "ISV[NONFINITE_STEPS] at the last check (the slot restarts at 0 per fold)")

    def check(self, h: EpochHealth) -> Kill | None:
        new = h.nonfinite_steps - self.seen_steps
        self.seen_steps = h.nonfinite_steps
        bad = [name for name, v in (("q mean", h.q_mean), ("loss", h.loss)) if not math.isfinite(v)]
        too_many = new >= max(1.0, NONFINITE_MAX_FRACTION * h.steps)
        if not bad and not too_many:
            return None
        parts = [" and ".join(bad) + " not finite"] if bad else []
        if too_many:
            parts.append(f"{new} of {h.steps} gradient steps non-finite")
        return Kill("non_finite", h.epoch, f"non-finite values at epoch {h.epoch}: " + "; ".join(parts),
                    {"q_mean": h.q_mean, "loss": h.loss, "nonfinite_steps": float(new)})


class KillCriteria:
    """The criteria in their fixed order; `check` feeds every one (each keeps its state current)."""

    NOT_STATE = ("criteria",)

    def __init__(self) -> None:
        self.criteria = (NonFiniteKill(), QDriftKill(), GradCollapseKill())

    def register_state(self, registry: StateResetRegistry) -> None:
        for c in self.criteria:
            c.register_state(registry)

    def components(self) -> tuple[Any, ...]:
        """Every object holding state, for `StateResetRegistry.audit`."""
        return (self, *self.criteria)

    def diag_fields(self, q_abs_ref: float, q_dir_abs_ref: float) -> dict[str, float]:
        """The criteria's state for HEALTH_DIAG: the Q-drift window's median and MAD (NaN until it holds
        Q_DRIFT_MIN_PRIORS epochs), the Q-drift floor at these Q scales, the collapse count."""
        _, q_drift, collapse = self.criteria
        median = mad = math.nan
        if len(q_drift.window) >= Q_DRIFT_MIN_PRIORS:
            prior = np.asarray(q_drift.window, dtype=np.float64)
            median = _median(prior)
            mad = _median(np.abs(prior - median))
        floor = max(Q_DRIFT_FLOOR_MIN, Q_DRIFT_FLOOR_MULT * max(q_abs_ref, q_dir_abs_ref))
        return {"kill_q_median": median, "kill_q_mad": mad, "kill_q_floor": floor,
                "kill_collapse_epochs": float(collapse.count)}

    def check(self, health: EpochHealth) -> Kill | None:
        """The first criterion that fired this epoch, or None."""
        fired = [c.check(health) for c in self.criteria]
        return next((k for k in fired if k is not None), None)
