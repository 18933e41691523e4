"""The step's ISV producers and epoch accumulators against float64 references.

Tolerance: the producers sum in float64 and round once to float32 before the EMA's float32 update, so each
slot is within 1e-5 relative (+1e-7 absolute) of the float64 result; counts and maxima are exact.
"""

import math

import numpy as np
import pytest

from fox_numba.actions import N_HEADS
from fox_numba.device.isv import Isv, bootstrap_values
from fox_numba.kernels.optim import OPTIM_STATE_DTYPE
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

pytestmark = pytest.mark.usefixtures("long_switch_interval")


def close(got, want):
    assert got == pytest.approx(want, rel=1e-5, abs=1e-7)


def seeded_isv(rng, slots):
    isv = bootstrap_values()
    isv[slots] = rng.uniform(0.1, 1.0, len(slots))
    return isv


def test_q_signals(stream, stager, rng):
    rows, used, z = 300, 290, 11  # two blocks of partials on the GPU
    q = rng.standard_normal((rows, N_HEADS)).astype(np.float32)
    q[used:] = 100.0  # rows past n_rows are not read
    ent = rng.uniform(0, math.log(z), (rows, N_HEADS)).astype(np.float32)
    util = rng.integers(1, z + 1, (rows, N_HEADS)).astype(np.float32) / np.float32(z)
    slots = [Isv.Q_ABS_REF, Isv.Q_DIR_ABS_REF, Isv.Q_MEAN_EMA, Isv.Q_STD_EMA, Isv.Q_DIR_GAP_EMA, Isv.ATOM_ENTROPY_EMA,
             Isv.ATOM_UTIL_EMA]
    isv0 = seeded_isv(rng, slots)
    isv, epoch = stager.upload_new(isv0), stager.upload_new(np.zeros(N_EPOCH_STATS))
    partials = stager.upload_new(np.full(signal_partials_shape(used, N_Q_PARTIALS), np.nan))
    produce_q_signals(stager.upload_new(q), stager.upload_new(ent), stager.upload_new(util), partials, isv, epoch,
                      n_rows=used, n_atoms=z, stream=stream)
    got = stager.download(isv)
    q64, e64 = q[:used].astype(np.float64), ent[:used].astype(np.float64)
    top2 = np.sort(q64[:, :4], axis=1)[:, -2:]
    raw = {
        Isv.Q_DIR_ABS_REF: np.abs(q64[:, :4]).mean(),
        Isv.Q_ABS_REF: np.abs(q64[:, 4:7]).mean(),
        Isv.Q_MEAN_EMA: q64.mean(),
        Isv.Q_STD_EMA: q64.std(),
        Isv.Q_DIR_GAP_EMA: (top2[:, 1] - top2[:, 0]).mean(),
        Isv.ATOM_ENTROPY_EMA: e64.mean() / math.log(z),
        Isv.ATOM_UTIL_EMA: util[:used].astype(np.float64).mean(),
    }
    for slot, x in raw.items():
        close(got[slot], isv0[slot] + 0.05 * (x - isv0[slot]))
    assert got[Isv.Q_MAX_ABS] == np.abs(q[:used]).max()
    untouched = np.setdiff1d(np.arange(got.size), [*raw, Isv.Q_MAX_ABS])
    np.testing.assert_array_equal(got[untouched], isv0[untouched])
    close(stager.download(epoch)[EpochStat.Q_MEAN], q64.mean())


def test_q_signals_report_a_nonfinite_q(stream, stager, rng):
    q = rng.standard_normal((8, N_HEADS)).astype(np.float32)
    q[3, 5] = np.nan
    isv0 = bootstrap_values()
    isv = stager.upload_new(isv0)
    epoch = stager.upload_new(np.full(N_EPOCH_STATS, 0.5))
    produce_q_signals(stager.upload_new(q), stager.upload_new(np.ones_like(q)), stager.upload_new(np.ones_like(q)),
                      stager.upload_new(np.zeros(signal_partials_shape(8, N_Q_PARTIALS))), isv, epoch, n_rows=8,
                      n_atoms=5, stream=stream)
    got = stager.download(isv)
    np.testing.assert_array_equal(stager.download(epoch), 0.5)  # nor the epoch's Q_MEAN sum (metrics stay finite)
    assert got[Isv.Q_MAX_ABS] == np.inf
    assert got[Isv.Q_ABS_REF] == isv0[Isv.Q_ABS_REF]  # a NaN mean never enters an EMA
    assert got[Isv.Q_DIR_ABS_REF] != isv0[Isv.Q_DIR_ABS_REF]  # the direction bins were finite


def loss_inputs(rng, b):
    loss = rng.uniform(0.5, 3.0, 4 * b).astype(np.float32)
    weights = (rng.uniform(0.5, 2.0, 4 * b) / b).astype(np.float32)
    weights[rng.random(4 * b) < 0.3] = 0.0  # rows where the branch had no effect
    stats = rng.standard_normal((4 * b, 3)).astype(np.float32)
    return loss, weights, stats


def test_loss_signals(stream, stager, rng):
    b = 70  # 280 branch rows: two blocks of partials on the GPU
    loss, weights, stats = loss_inputs(rng, b)
    slots = [Isv.LOSS_EMA, Isv.LOSS_DIR_EMA, Isv.LOSS_MAG_EMA, Isv.LOSS_ORD_EMA, Isv.LOSS_URG_EMA, Isv.TD_ABS_EMA,
             Isv.TARGET_Q_MEAN_EMA, Isv.TARGET_Q_DRIFT_EMA]
    isv0 = seeded_isv(rng, slots)
    isv, epoch = stager.upload_new(isv0), stager.upload_new(np.zeros(N_EPOCH_STATS))
    partials = stager.upload_new(np.full(signal_partials_shape(loss.size, N_LOSS_SUMS), np.nan))
    produce_loss_signals(*(stager.upload_new(a) for a in (loss, weights, stats)), partials, isv, epoch, stream=stream)
    got, got_epoch = stager.download(isv), stager.download(epoch)
    l64, w64, s64 = loss.astype(np.float64), weights.astype(np.float64), stats.astype(np.float64)
    total = float(np.sum(w64 * l64))
    eff = w64 > 0
    close(got[Isv.LOSS_RAW], total)
    close(got[Isv.LOSS_EMA], isv0[Isv.LOSS_EMA] + 0.01 * (total - isv0[Isv.LOSS_EMA]))
    branch = np.arange(4 * b) % 4
    for br, slot in enumerate([Isv.LOSS_DIR_EMA, Isv.LOSS_MAG_EMA, Isv.LOSS_ORD_EMA, Isv.LOSS_URG_EMA]):
        mean_b = l64[eff & (branch == br)].mean()
        close(got[slot], isv0[slot] + 0.01 * (mean_b - isv0[slot]))
        close(got_epoch[EpochStat.LOSS_DIR + br], mean_b)
    td = np.abs(s64[eff, 0]).mean()
    close(got[Isv.TD_ABS_EMA], isv0[Isv.TD_ABS_EMA] + 0.05 * (td - isv0[Isv.TD_ABS_EMA]))
    close(got[Isv.TARGET_Q_MEAN_EMA], isv0[Isv.TARGET_Q_MEAN_EMA] + 0.05 * (s64[:, 1].mean() - isv0[Isv.TARGET_Q_MEAN_EMA]))
    close(got[Isv.TARGET_Q_DRIFT_EMA],
          isv0[Isv.TARGET_Q_DRIFT_EMA] + 0.05 * (np.abs(s64[:, 2]).mean() - isv0[Isv.TARGET_Q_DRIFT_EMA]))
    close(got_epoch[EpochStat.LOSS], total)
    close(got_epoch[EpochStat.TD_ABS], td)
    assert got_epoch[EpochStat.STEPS] == 1


@pytest.mark.parametrize("where", ["loss", "td", "target", "zero-weight row"])
def test_a_nonfinite_row_is_raw_only(stream, stager, rng, where):
    """A NaN in one row (its loss, its TD as a NaN reward leaves it, its target value; or a row of zero
    weight): LOSS_RAW is NaN (the guard reads it), no loss signal and no epoch loss sum moves."""
    loss, weights, stats = loss_inputs(rng, 6)
    row = 5
    weights[row] = 0.0 if where == "zero-weight row" else 0.1
    if where == "loss":
        loss[row] = np.nan
    elif where == "target":
        stats[row, 1] = np.inf
    else:
        stats[row, 0] = np.nan
    slots = [Isv.LOSS_EMA, Isv.LOSS_DIR_EMA, Isv.LOSS_MAG_EMA, Isv.LOSS_ORD_EMA, Isv.LOSS_URG_EMA, Isv.TD_ABS_EMA,
             Isv.TARGET_Q_MEAN_EMA, Isv.TARGET_Q_DRIFT_EMA]
    isv0 = seeded_isv(rng, slots)
    isv, epoch = stager.upload_new(isv0), stager.upload_new(np.zeros(N_EPOCH_STATS))
    partials = stager.upload_new(np.full(signal_partials_shape(loss.size, N_LOSS_SUMS), np.nan))
    produce_loss_signals(*(stager.upload_new(a) for a in (loss, weights, stats)), partials, isv, epoch, stream=stream)
    got, got_epoch = stager.download(isv), stager.download(epoch)
    assert np.isnan(got[Isv.LOSS_RAW])
    np.testing.assert_array_equal(got[slots], isv0[slots])
    assert got_epoch[EpochStat.STEPS] == 1 and got_epoch.sum() == 1


@pytest.mark.parametrize("step, runs", [(6, True), (7, False)])
def test_hidden_signals(stream, stager, rng, step, runs):
    n_layers, rows, used, hidden = 2, 300, 270, 6
    acts = np.maximum(rng.standard_normal((n_layers, rows, hidden)), 0).astype(np.float32)
    acts[0, :used, 2] = 0.0  # a dead unit in layer 0
    acts[1, :used, 4] = 0.0  # and one in layer 1
    acts[1, used:, 4] = 1.0  # alive only on rows past n_rows: still dead
    slots = [Isv.HIDDEN_RMS_L0_EMA, Isv.HIDDEN_RMS_L1_EMA, Isv.HIDDEN_RMS_L2_EMA, Isv.DEAD_UNIT_FRAC_EMA]
    isv0 = seeded_isv(rng, slots)
    isv = stager.upload_new(isv0)
    rec = np.zeros(1, OPTIM_STATE_DTYPE)
    rec[0]["step"] = step
    partials = stager.upload_new(np.zeros(hidden_partials_shape(n_layers, used, hidden), np.float32))
    produce_hidden_signals(stager.upload_new(acts), partials, isv, stager.upload_new(rec), n_rows=used,
                           diag_every=3, stream=stream)
    got = stager.download(isv)
    if not runs:
        np.testing.assert_array_equal(got, isv0)
        return
    for layer in range(n_layers):
        rms = math.sqrt(np.mean(acts[layer, :used].astype(np.float64) ** 2))
        slot = Isv.HIDDEN_RMS_L0_EMA + layer
        close(got[slot], isv0[slot] + 0.01 * (rms - isv0[slot]))
    assert got[Isv.HIDDEN_RMS_L2_EMA] == isv0[Isv.HIDDEN_RMS_L2_EMA]  # no third layer
    dead = 2 / (n_layers * hidden)
    close(got[Isv.DEAD_UNIT_FRAC_EMA], isv0[Isv.DEAD_UNIT_FRAC_EMA] + 0.01 * (dead - isv0[Isv.DEAD_UNIT_FRAC_EMA]))
