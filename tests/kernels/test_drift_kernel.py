"""The Q_DRIFT_RATE producer against its float64 reference: every ISV element checked after every epoch.

Tolerance: the rate within 4 float32 ulps of the reference (a subtract, an add, a divide, each rounded
once in float32, on float32 inputs); the baseline slot exact (a copy); every other slot untouched.
"""

import numpy as np
import pytest
from reference import q_drift_rate64

from fox_numba.device.isv import Isv, bootstrap_values, fold_reset_entries
from fox_numba.device.memory import Mapped
from fox_numba.kernels.drift import update_q_drift_rate

RATE, PREV, Q_ABS, Q_DIR_ABS = Isv.Q_DRIFT_RATE, Isv.Q_EPOCH_MEAN_PREV, Isv.Q_ABS_REF, Isv.Q_DIR_ABS_REF


def run(stream, stager, isv0, qs):
    """The kernel over the epoch means `qs` from `isv0`; yields (device ISV, reference ISV) per epoch."""
    isv, ref = stager.upload_new(isv0), isv0.astype(np.float64)
    q_dev = Mapped(1, np.float32)
    for q in qs:
        q_dev.host[0] = q
        update_q_drift_rate(isv, q_dev.device, stream=stream)
        q_drift_rate64(ref, float(np.float32(q)))
        yield stager.download(isv), ref


def check(got, ref, isv0):
    scale = np.spacing(np.float32(max(abs(ref[RATE]), 1e-30)))
    assert abs(float(got[RATE]) - ref[RATE]) <= 4 * scale, (got[RATE], ref[RATE])
    assert got[PREV] == np.float32(ref[PREV])
    others = np.setdiff1d(np.arange(isv0.size), [RATE, PREV])
    np.testing.assert_array_equal(got[others], isv0[others])


def test_random_epochs_against_the_reference(stream, stager, rng):
    """Epoch means of mixed scale and sign on a bus with random (non-zero) slots: every branch is reached."""
    isv0 = rng.uniform(0.01, 2.0, bootstrap_values().size).astype(np.float32)
    isv0[[Q_ABS, Q_DIR_ABS]] = (0.03, 0.02)
    isv0[PREV] = 0.0  # a fold start: the first epoch only sets the baseline
    qs = rng.standard_normal(40) * 10.0 ** rng.uniform(-7, 1, 40)
    qs[[5, 6]] = (1e-7, 0.5)  # a baseline under 1e-6: epoch 6 keeps the last rate
    qs[[10, 11]] = (1e-3, 5.0)  # a rate far above the clip
    branches = set()
    for k, (got, ref) in enumerate(run(stream, stager, isv0, qs)):
        check(got, ref, isv0)
        prev = np.float32(qs[k - 1]) if k else 0.0
        branches.add("skipped" if abs(prev) <= 1e-6 else "clipped" if ref[RATE] == 4.0 else "rate")
    assert branches == {"skipped", "clipped", "rate"}


@pytest.mark.parametrize(
    "prev, q, refs, expected",
    [
        (-0.018, 0.82, (0.05, 0.05), 4.0),  # the seed's Plan C fold 0 epoch 2: 8.38, clipped to 4
        (0.21, 0.21, (0.05, 0.05), 0.0),  # a steady run: tau unchanged
        (0.5, 0.6, (0.1, 0.2), 0.2),  # |0.1| / max(0.5, 0.3)
        (0.1, 0.2, (0.3, 0.2), 0.2),  # |0.1| / max(0.1, 0.5): the Q scale floors the denominator
        (5e-7, 3.0, (0.1, 0.1), 1.25),  # skipped: |q(t-1)| <= 1e-6 keeps the last rate (1.25 here)
    ],
)
def test_worked_examples(stream, stager, prev, q, refs, expected):
    isv0 = bootstrap_values()
    isv0[[Q_ABS, Q_DIR_ABS, PREV, RATE]] = (*refs, prev, 1.25)
    ((got, ref),) = list(run(stream, stager, isv0, [q]))
    check(got, ref, isv0)
    assert got[RATE] == pytest.approx(expected, rel=1e-6, abs=1e-7)
    assert got[PREV] == np.float32(q)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_nonfinite_epoch_mean_changes_nothing(stream, stager, bad):
    isv0 = bootstrap_values()
    isv0[[PREV, RATE]] = (0.4, 0.7)
    ((got, _),) = list(run(stream, stager, isv0, [bad]))
    np.testing.assert_array_equal(got, isv0)


def test_the_fold_reset_zeroes_rate_and_baseline():
    index, values = fold_reset_entries()
    reset = dict(zip(index.tolist(), values.tolist(), strict=True))
    assert reset[RATE] == 0.0 and reset[PREV] == 0.0


def test_wrapper_checks_shapes(stream, stager):
    isv = stager.upload_new(bootstrap_values())
    with pytest.raises(ValueError, match="q_epoch_mean"):
        update_q_drift_rate(isv, stager.upload_new(np.zeros(2, np.float32)), stream=stream)
    with pytest.raises(TypeError, match="q_epoch_mean"):
        update_q_drift_rate(isv, np.zeros(1, np.float32), stream=stream)
