"""The learner's step kernels against float64 references on small seeded inputs, every output checked.
(The replay sample and gather the step starts with: tests/env/test_replay.py; its observation gather:
tests/env/test_gather_and_actions.py.)

Tolerances: the schedule and the commit are a few float32 operations on each value (1e-6 relative);
the greedy bins, supports, rewards, weights and the gradient scatter are exact;
the target softmax and the row statistics are Z-term float32 sums (1e-5 relative plus 1e-6 absolute);
the auxiliary gradient is two float32 operations per row (1e-6 relative), its loss the float64 mean of squared
float32 differences (2e-7 relative); the observation noise float32 log, sqrt and cosine (1e-5 relative).
"""

import math

import numpy as np
import pytest
import reference

from fox_numba.actions import FLAT, HOLD, N_HEADS, OrderType
from fox_numba.device.control import ControlBlock
from fox_numba.device.isv import Isv, bootstrap_values
from fox_numba.device.rng import xoroshiro_states_host
from fox_numba.kernels.heads import aux_column, head_width
from fox_numba.kernels.learner import (
    SCHEDULE_DTYPE,
    BranchRows,
    add_obs_noise,
    aux_loss,
    finish,
    guard_loss,
    reset_counters,
    scatter_grads,
    schedule_step,
    select_rows,
    shrink_perturb,
)
from fox_numba.kernels.optim import OPTIM_STATE_DTYPE, norm_partials_len, partials_used
from fox_numba.kernels.signals import N_EPOCH_STATS, EpochStat

pytestmark = pytest.mark.usefixtures("long_switch_interval")


def state_record(step=0, adam_t=0, lr=0.0, tau=0.0):
    rec = np.zeros(1, OPTIM_STATE_DTYPE)
    rec[0] = (step, adam_t, lr, tau)
    return rec


def test_step_schedule(stream, stager):
    sched = ControlBlock(SCHEDULE_DTYPE)
    sched.set(lr_base=np.float32(1e-3), lr_min_frac=np.float32(0.1), tau_base=np.float32(0.01),
              tau_min_frac=np.float32(0.5), horizon=10)
    sched.upload(stream)
    state = stager.upload_new(state_record(adam_t=4))
    isv0 = bootstrap_values()
    isv = stager.upload_new(isv0)
    drifts = [0.0, 2.0, 10.0, np.nan, -1.0, 0.5] * 2
    for k, drift in enumerate(drifts, start=1):
        isv0[Isv.Q_DRIFT_RATE] = drift
        stager.upload(isv0, isv)
        schedule_step(sched.device, state, isv, stream=stream)
        got = stager.download(state)[0]
        cosine = 0.5 * (1 + math.cos(math.pi * min((k - 1) / 10, 1.0)))
        damp = 1 + (min(drift, 4.0) if drift > 0 else 0.0)
        assert got["step"] == k and got["adam_t"] == 4
        assert got["lr"] == pytest.approx(1e-3 * (0.1 + 0.9 * cosine), rel=1e-6)
        assert got["tau"] == pytest.approx(0.01 * (0.5 + 0.5 * cosine) / damp, rel=1e-6)
        assert 0.01 * 0.5 / 5 * (1 - 1e-6) <= got["tau"] <= 0.01
    sched.set(horizon=0)  # no horizon: no decay
    sched.upload(stream)
    schedule_step(sched.device, state, isv, stream=stream)
    assert stager.download(state)[0]["lr"] == np.float32(1e-3)


@pytest.mark.parametrize("bootstrap", ["direction", "branch"])
def test_double_dqn_rows(stream, stager, rng, bootstrap):
    b, z = 12, 6
    logits = rng.standard_normal((2 * b, N_HEADS, z)).astype(np.float32)
    q = rng.standard_normal((2 * b, N_HEADS)).astype(np.float32)
    q[b + 1, 4:7] = 0.25  # a three-way tie in the magnitude branch: the lowest bin wins
    logits_tgt = (2 * rng.standard_normal((b, N_HEADS, z))).astype(np.float32)
    sup_on = reference.random_support(rng, (N_HEADS,), z)
    sup_tg = reference.random_support(rng, (N_HEADS,), z)
    actions = np.stack([rng.integers(0, 4, b), rng.integers(0, 3, b), rng.integers(0, 3, b),
                        rng.integers(0, 3, b)], 1).astype(np.int32)
    actions[:4, 0] = [HOLD, FLAT, 0, 2]  # every effect rule shows up
    actions[2:4, 2] = [int(OrderType.MARKET), 1]
    rewards = rng.standard_normal(b).astype(np.float32)
    # the gather's n-step discounts gamma**k * (1 - done): terminal rows 0, the others 0.9 ** k, k in 1..3
    discounts = np.where(np.arange(b) % 3 == 0, 0.0, 0.9 ** rng.integers(1, 4, b)).astype(np.float32)
    branch_w = np.array([1.0, 0.5, 2.0, 0.25], np.float32)
    rows = BranchRows(b, z)
    select_rows(*(stager.upload_new(a) for a in (logits, q, logits_tgt, sup_on, sup_tg, actions, rewards, discounts,
                                                  branch_w)), rows, stream=stream, bootstrap=bootstrap)
    ref = reference.double_dqn64(logits, q, logits_tgt, sup_on, sup_tg, actions, rewards, discounts, branch_w,
                                 bootstrap)
    other = reference.double_dqn64(logits, q, logits_tgt, sup_on, sup_tg, actions, rewards, discounts, branch_w,
                                   "branch" if bootstrap == "direction" else "direction")
    assert not np.allclose(ref["p_next"], other["p_next"])  # the two rules differ on these inputs
    if bootstrap == "direction":  # every branch of a sample bootstraps from one head: the same row four times
        p = ref["p_next"].reshape(b, 4, z)
        np.testing.assert_array_equal(p, np.repeat(p[:, :1], 4, axis=1))
    np.testing.assert_array_equal(stager.download(rows.taken), ref["taken"])
    np.testing.assert_array_equal(stager.download(rows.sup_next), ref["sup_next"])
    np.testing.assert_array_equal(stager.download(rows.sup_proj), ref["sup_proj"])
    np.testing.assert_array_equal(stager.download(rows.rewards), ref["rew"])
    np.testing.assert_allclose(stager.download(rows.discounts), ref["disc"], rtol=1e-7)
    np.testing.assert_allclose(stager.download(rows.weights), ref["w"], rtol=1e-7)
    np.testing.assert_allclose(stager.download(rows.p_next), ref["p_next"], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(stager.download(rows.stats), ref["stats"], rtol=1e-5, atol=1e-6)
    w = stager.download(rows.weights).reshape(b, 4)
    assert w[0, 1] == 0 and w[0, 2] == 0 and w[0, 3] == 0  # Hold: magnitude, order type, urgency
    assert w[1, 1] == 0 and w[1, 2] > 0  # Flat: magnitude only
    assert w[2, 3] == 0 and w[3, 3] > 0  # urgency of a market order
    assert np.allclose(stager.download(rows.p_next).sum(axis=1), 1.0, atol=1e-6)


def test_scatter_branch_grads(stream, stager, rng):
    b, z = 7, 5
    dl = rng.standard_normal((4 * b, z)).astype(np.float32)
    actions = np.stack([rng.integers(0, 4, b)] + [rng.integers(0, 3, b) for _ in range(3)], 1).astype(np.int32)
    out = stager.upload_new(np.full((b, N_HEADS, z), np.nan, np.float32))
    scatter_grads(stager.upload_new(dl), stager.upload_new(actions), out, stream=stream)
    ref = np.zeros((b, N_HEADS, z), np.float32)
    for i in range(b):
        for br, (off, _size) in enumerate(reference.branch_spans()):
            ref[i, off + actions[i, br]] = dl[i * 4 + br]
    np.testing.assert_array_equal(stager.download(out), ref)


def uniform32_64(states, i):
    """numba's xoroshiro128p_uniform_float32 on host states, as float64."""
    return float(np.float32((reference.xoroshiro_next64(states, i) >> 11) * 2.0**-53))


def test_obs_noise(stream, stager, rng):
    """B = 5 samples, 2B rows of 6 columns, noise on the first 5 (an odd count: the last pair's sine is dropped):
    every element against the Box-Muller draws replayed in float64 from host copies of the generators (float32
    log, sqrt, cos and sin: 1e-5 relative plus 1e-6); the portfolio column is untouched; the states advance by
    6 draws each (3 pairs), so the next launch draws fresh noise. Generator 0 starts at s0 = 2**64 - 1, s1 = 0:
    its first two draws round to U = 1.0 in float32, so u1 is the documented floor 2**-25 (a literal here), u2 = 1
    and element (0, 0) gains the whole clipped radius sigma * sqrt(50 ln 2)."""
    b, width, n_market, sigma = 5, 6, 5, 0.3
    u1_floor = 2.0**-25
    obs0 = rng.standard_normal((2 * b, width)).astype(np.float32)
    host_states = xoroshiro_states_host(b, 21)
    host_states[0] = (np.uint64(2**64 - 1), np.uint64(0))
    obs, states = stager.upload_new(obs0), stager.upload_new(host_states)
    add_obs_noise(obs, states, sigma, n_market, stream=stream)
    got = stager.download(obs)
    want = obs0.astype(np.float64)
    ref_states = host_states.copy()
    for j in range(b):
        for row in (j, b + j):
            for c in range(0, n_market, 2):
                u1 = max(float(np.float32(1.0 - uniform32_64(ref_states, j))), u1_floor)
                u2 = uniform32_64(ref_states, j)
                r = float(np.float32(sigma)) * math.sqrt(-2.0 * math.log(u1))
                want[row, c] += r * math.cos(2 * math.pi * u2)
                if c + 1 < n_market:
                    want[row, c + 1] += r * math.sin(2 * math.pi * u2)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert got[0, 0] - obs0[0, 0] == pytest.approx(0.3 * math.sqrt(50 * math.log(2)), rel=1e-5)
    np.testing.assert_array_equal(got[:, n_market:], obs0[:, n_market:])
    assert np.abs(got - obs0).max() > 0.1  # the noise is there at sigma 0.3
    np.testing.assert_array_equal(stager.download(states).view(np.uint64), ref_states.view(np.uint64))
    with pytest.raises(ValueError, match="sigma > 0"):
        add_obs_noise(obs, states, 0.0, n_market, stream=stream)


def test_aux_forecast_loss(stream, stager, rng):
    """B = 9 samples of a 2B-row head (only the first B are read) over 24 distinct market rows, two targets NaN
    and one row outside the market (so three of the nine have no label): the forecast column of dhead is
    weight * (f - y) / B where y is finite, else 0; the stream columns are untouched; the epoch's LOSS_AUX
    gains the mean (f - y)**2 / 2 over the labelled rows."""
    b, z, weight = 9, 4, 0.7
    head = rng.standard_normal((2 * b, head_width(z))).astype(np.float32)
    rows = rng.permutation(24)[: 2 * b].astype(np.int32)
    rows[4] = 24  # outside the market: no target
    target = rng.standard_normal(24).astype(np.float32)
    target[[rows[1], rows[6]]] = np.nan
    dhead0 = rng.standard_normal((b, head_width(z))).astype(np.float32)
    dhead, epoch = stager.upload_new(dhead0), stager.upload_new(np.full(N_EPOCH_STATS, 0.25))
    aux_loss(stager.upload_new(head), stager.upload_new(rows), stager.upload_new(target), weight, dhead, epoch,
             stream=stream)
    got, got_epoch = stager.download(dhead), stager.download(epoch)
    col = aux_column(z)
    y = np.array([target[r] if r < 24 else np.nan for r in rows[:b]], np.float64)
    labelled = np.isfinite(y)
    assert labelled.sum() == b - 3
    d = head[:b, col].astype(np.float64) - np.nan_to_num(y)
    want = np.where(labelled, float(np.float32(weight)) * d / b, 0.0)
    np.testing.assert_allclose(got[:, col], want, rtol=1e-6, atol=1e-9)
    np.testing.assert_array_equal(np.delete(got, col, axis=1), np.delete(dhead0, col, axis=1))
    want_epoch = np.full(N_EPOCH_STATS, 0.25)
    want_epoch[EpochStat.LOSS_AUX] += np.mean(d[labelled] ** 2) / 2
    np.testing.assert_allclose(got_epoch, want_epoch, rtol=2e-7)  # squares of float32 differences
    head[np.flatnonzero(labelled)[0], col] = np.nan  # a non-finite forward: the step is skipped, the sum stays
    aux_loss(stager.upload_new(head), stager.upload_new(rows), stager.upload_new(target), weight, dhead, epoch,
             stream=stream)
    np.testing.assert_array_equal(stager.download(epoch), got_epoch)
    with pytest.raises(ValueError, match="aux_weight"):
        aux_loss(stager.upload_new(head), stager.upload_new(rows), stager.upload_new(target), -1.0, dhead, epoch,
                 stream=stream)


@pytest.mark.parametrize("loss, norm, flagged", [(1.5, 2.0, False), (np.nan, 2.0, True), (np.inf, 2.0, True),
                                                 (np.nan, np.nan, False), (1.5, np.inf, False)])
def test_loss_guard(stream, stager, loss, norm, flagged):
    isv0 = bootstrap_values()
    isv0[[Isv.LOSS_RAW, Isv.GRAD_NORM_RAW, Isv.NONFINITE_STEPS]] = (loss, norm, 2.0)
    isv = stager.upload_new(isv0)
    guard_loss(isv, stream=stream)
    got = stager.download(isv)
    if flagged:
        assert np.isnan(got[Isv.GRAD_NORM_RAW]) and got[Isv.NONFINITE_STEPS] == 3.0
    else:
        np.testing.assert_array_equal(got, isv0)  # a non-finite norm was already counted by its kernel


@pytest.mark.parametrize("applied", [True, False])
def test_finish_step(stream, stager, rng, applied):
    n = 3000
    k = norm_partials_len(n)
    adam_p = rng.uniform(0, 1e-6, k)
    polyak_p = rng.uniform(0, 1, (k, 2))
    used = partials_used(n)
    isv0 = bootstrap_values()
    isv0[[Isv.GRAD_NORM_RAW, Isv.UPDATE_RMS_EMA, Isv.TARGET_DRIFT_EMA]] = (2.5 if applied else np.nan, 1e-4, 0.2)
    isv = stager.upload_new(isv0)
    state = stager.upload_new(state_record(step=9, adam_t=5, lr=1e-3, tau=0.125))
    sup_on, sup_tg = (reference.random_support(rng, (N_HEADS,), 7) for _ in range(2))
    sup_target = stager.upload_new(sup_tg)
    epoch = stager.upload_new(np.zeros(N_EPOCH_STATS))
    finish(isv, state, stager.upload_new(adam_p), stager.upload_new(polyak_p), n, stager.upload_new(sup_on),
           sup_target, epoch, stream=stream)
    got, got_state, got_epoch = stager.download(isv), stager.download(state)[0], stager.download(epoch)
    if not applied:
        np.testing.assert_array_equal(got, isv0)
        np.testing.assert_array_equal(stager.download(sup_target), sup_tg)
        assert got_state["adam_t"] == 5 and got_epoch[EpochStat.SKIPPED] == 1 and got_epoch.sum() == 1
        return
    update = math.sqrt(adam_p[:used].sum() / n)
    param_norm = math.sqrt(polyak_p[:used, 1].sum())
    drift = math.sqrt(polyak_p[:used, 0].sum()) / param_norm
    assert got_state["adam_t"] == 6 and got_state["step"] == 9
    assert got[Isv.UPDATE_RMS_EMA] == pytest.approx(1e-4 + 0.01 * (update - 1e-4), rel=1e-5)
    assert got[Isv.PARAM_NORM] == pytest.approx(param_norm, rel=1e-6)
    assert got[Isv.TARGET_DRIFT_EMA] == pytest.approx(0.2 + 0.05 * (drift - 0.2), rel=1e-5)
    np.testing.assert_allclose(stager.download(sup_target), sup_tg + 0.125 * (sup_on.astype(np.float64) - sup_tg),
                               rtol=1e-6, atol=1e-7)
    assert got_epoch[EpochStat.APPLIED] == 1 and got_epoch[EpochStat.GRAD_NORM] == np.float32(2.5)


def test_fold_kernels(stream, stager, rng):
    p0, f0 = rng.standard_normal(1000).astype(np.float32), rng.standard_normal(1000).astype(np.float32)
    p = stager.upload_new(p0)
    shrink_perturb(p, stager.upload_new(f0), 0.8, stream=stream)
    np.testing.assert_allclose(stager.download(p), 0.8 * p0.astype(np.float64) + 0.2 * f0, rtol=1e-6, atol=1e-7)
    state = stager.upload_new(state_record(step=40, adam_t=33, lr=1e-3, tau=0.01))
    reset_counters(state, stream=stream)
    got = stager.download(state)[0]
    assert (got["step"], got["adam_t"]) == (0, 0) and got["lr"] == np.float32(1e-3)
    with pytest.raises(ValueError, match="fraction"):
        shrink_perturb(p, p, 1.5, stream=stream)
