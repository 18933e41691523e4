"""Kill criteria on the seed's cases, their fold-boundary state and their order."""

import math

import numpy as np
import pytest

from fox_numba.device.isv import Isv, bootstrap_values
from fox_numba.walkforward.kill import (
    GRAD_COLLAPSE_FLOOR,
    GRAD_COLLAPSE_PATIENCE,
    GRAD_COLLAPSE_WARMUP_STEPS,
    EpochHealth,
    GradCollapseKill,
    KillCriteria,
    NonFiniteKill,
    QDriftKill,
)
from fox_numba.walkforward.reset_registry import FoldReset, ResetContext, StateResetRegistry


def health(epoch, q=0.1, *, refs=(0.05, 0.05), grad=10.0, fold_step=10_000, nonfinite=0, steps=1000, loss=1.0):
    return EpochHealth(epoch=epoch, q_mean=q, loss=loss, grad_norm=grad, q_abs_ref=refs[0], q_dir_abs_ref=refs[1],
                       nonfinite_steps=nonfinite, steps=steps, fold_step=fold_step)


def run_q(kill, qs, refs=(0.05, 0.05)):
    return [kill.check(health(e, q, refs=refs)) for e, q in enumerate(qs)]


def test_cold_start_growth_stays_silent():
    """Seed smoke-test-n9xzr: -0.0795 -> 0.7647 at epoch 2 (a ratio of 9.6 the old criterion fired on)."""
    assert run_q(QDriftKill(), [-0.0312, -0.0795, 0.7647]) == [None, None, None]


def test_geometric_runaway_fires_at_epoch_3():
    """0.5 -> 62.5 over 4 epochs: |62.5 - 2.5| = 60 > 4 x MAD 2, and 62.5 > 3 x 12 (Q scales at 12)."""
    kills = run_q(QDriftKill(), [0.5, 2.5, 12.5, 62.5], refs=(12.0, 7.0))
    assert kills[:3] == [None, None, None]
    k = kills[3]
    assert k.criterion == "q_drift" and k.epoch == 3
    assert k.detail == pytest.approx({"q_mean": 62.5, "median": 2.5, "mad": 2.0, "deviation": 60.0, "limit": 8.0,
                                      "floor": 36.0})
    assert k.reason.startswith("Q drift at epoch 3: q mean 62.5 is 60 from the median 2.5 of the last 3 epochs")


def test_the_adaptive_floor_holds_a_large_but_in_scale_q():
    assert run_q(QDriftKill(), [0.5, 2.5, 12.5, 62.5], refs=(25.0, 1.0))[3] is None  # floor 75 > 62.5
    assert run_q(QDriftKill(), [0.01, 0.02, 0.015, 0.45])[3] is None  # an outlier under the 0.5 floor


def test_a_noisy_steady_q_never_fires():
    rng = np.random.default_rng(1)
    qs = 0.8 + 0.05 * rng.standard_normal(200)
    assert all(k is None for k in run_q(QDriftKill(), qs, refs=(0.8, 0.8)))


def test_the_window_keeps_the_last_five_finite_means():
    kill = QDriftKill()
    run_q(kill, [1.0, 2.0, math.nan, 3.0, 4.0, 5.0, 6.0])
    assert kill.window == (2.0, 3.0, 4.0, 5.0, 6.0)


def fold_boundary(*components):
    registry = StateResetRegistry()
    for c in components:
        c.register_state(registry)
    return registry


def test_the_window_does_not_cross_a_fold_boundary():
    kill = QDriftKill()
    registry = fold_boundary(kill)
    run_q(kill, [0.5, 2.5, 12.5], refs=(12.0, 12.0))
    registry.reset(FoldReset, ResetContext(fold=1))
    assert kill.window == ()
    assert run_q(kill, [62.5, 70.0], refs=(12.0, 12.0)) == [None, None]  # no priors from fold 0


def test_gradient_collapse_needs_five_consecutive_epochs_after_the_warm_up():
    kill = GradCollapseKill()
    tiny = GRAD_COLLAPSE_FLOOR / 10
    # epochs inside the fold's warm-up do not count, whatever their gradient
    assert kill.check(health(0, grad=tiny, fold_step=GRAD_COLLAPSE_WARMUP_STEPS - 1)) is None and kill.count == 0
    fired = [kill.check(health(e, grad=tiny, fold_step=GRAD_COLLAPSE_WARMUP_STEPS + e)) for e in range(1, 5)]
    assert fired == [None] * 4 and kill.count == 4
    assert kill.check(health(5, grad=1.0)) is None and kill.count == 0  # one live epoch restarts the count
    fired = [kill.check(health(e, grad=0.0)) for e in range(6, 6 + GRAD_COLLAPSE_PATIENCE)]
    assert fired[:-1] == [None] * 4
    assert fired[-1].criterion == "grad_collapse" and fired[-1].epoch == 10
    assert "under 1e-06 for 5 consecutive epochs" in fired[-1].reason


def test_gradient_collapse_counts_from_the_200th_fold_step():
    """The warm-up boundary in the header's numbers: an epoch ending at fold step 199 does not count, one at 200
    does (gradient 1e-7, under the 1e-6 floor)."""
    kill = GradCollapseKill()
    assert kill.check(health(0, grad=1e-7, fold_step=199)) is None and kill.count == 0
    assert kill.check(health(1, grad=1e-7, fold_step=200)) is None and kill.count == 1


def test_gradient_collapse_count_does_not_cross_a_fold_boundary():
    """Seed A.3: fold 0 ended 4 epochs into a collapse; fold 1 (grad 296k at epoch 1) must not fire."""
    kill = GradCollapseKill()
    registry = fold_boundary(kill)
    for e in range(4):
        kill.check(health(e, grad=0.0))
    registry.reset(FoldReset, ResetContext(fold=1))
    assert kill.count == 0
    assert kill.check(health(0, grad=0.0, fold_step=100)) is None  # fold 1's warm-up: not counted
    assert kill.check(health(1, grad=296_417.0, fold_step=1000)) is None and kill.count == 0


def test_non_finite_values_fire():
    assert NonFiniteKill().check(health(0, q=math.nan)).reason == "non-finite values at epoch 0: q mean not finite"
    assert "loss not finite" in NonFiniteKill().check(health(0, loss=math.inf)).reason
    kill = NonFiniteKill()
    assert kill.check(health(0, nonfinite=99, steps=1000)) is None  # Adam skipped 99 steps: harmless
    k = kill.check(health(1, nonfinite=99 + 100, steps=1000))  # 100 more in this epoch: a tenth
    assert k.criterion == "non_finite" and k.reason.endswith("100 of 1000 gradient steps non-finite")
    registry = fold_boundary(kill)
    registry.reset(FoldReset, ResetContext(fold=1))
    assert kill.seen_steps == 0 and kill.check(health(0, nonfinite=3)) is None  # ISV count restarted at 0


def test_criteria_run_in_order_and_all_keep_their_state():
    kills = KillCriteria()
    for e, q in enumerate([0.5, 2.5, 12.5]):
        assert kills.check(health(e, q, refs=(12.0, 12.0), grad=0.0)) is None
    k = kills.check(health(3, 62.5, refs=(12.0, 12.0), grad=0.0, loss=math.nan))
    assert k.criterion == "non_finite"  # first in order; the others still saw the epoch
    assert kills.criteria[1].window == (0.5, 2.5, 12.5, 62.5) and kills.criteria[2].count == 4
    assert k.as_dict()["criterion"] == "non_finite"


def test_health_from_the_isv_bus():
    isv = bootstrap_values()
    isv[[Isv.GRAD_NORM_FAST_EMA, Isv.Q_ABS_REF, Isv.Q_DIR_ABS_REF, Isv.NONFINITE_STEPS, Isv.LOSS_EMA]] = (
        3.5, 0.25, 0.5, 2.0, 1.75)
    h = EpochHealth.from_isv(isv, epoch=4, q_mean=0.3, steps=1000, fold_step=5000)
    assert (h.grad_norm, h.q_abs_ref, h.q_dir_abs_ref, h.nonfinite_steps, h.loss) == (3.5, 0.25, 0.5, 2, 1.75)
    assert (h.epoch, h.q_mean, h.steps, h.fold_step) == (4, 0.3, 1000, 5000)
