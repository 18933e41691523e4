"""Mixture-of-experts kernels (kernels/moe.py) against float64 references on small seeded inputs, every output element;
the gate gradient formula (the load-balancing term included) against float64 central differences; the signals
producer's seeding, EMAs, controller, bounds and non-finite guard.

Tolerances: the softmax and the mixture are a few float32 roundings over K <= 3 terms: 1e-6 relative plus 1e-6; the
gate gradient sums (1 + n_b) Z float32 products per expert and cancels in the softmax Jacobian: 1e-5 relative plus
1e-5 of the largest; the usage and the signals run in float64 and round once to float32: 1e-6 relative.
"""

import math

import numpy as np
import pytest
import reference

from fox_numba.actions import N_BRANCHES
from fox_numba.device.isv import ISV_TOTAL_DIM, MOE_LAMBDA_BASE, Isv, bootstrap_values
from fox_numba.kernels.heads import head_width
from fox_numba.kernels.moe import (
    MOE_ALPHA,
    MOE_IMBALANCE_TARGET,
    MOE_LAMBDA_CEIL,
    MOE_LAMBDA_FLOOR,
    MOE_LAMBDA_GAIN,
    moe_expert_grad,
    moe_gate_grad,
    moe_gate_softmax,
    moe_mix,
    moe_signals,
    moe_usage,
)
from fox_numba.kernels.signals import N_EPOCH_STATS, EpochStat

ROWS, GRAD_ROWS, K, Z = 5, 4, 3, 2
HW = head_width(Z)
UTIL = [int(Isv.MOE_UTIL_EMA_0) + k for k in range(K)]
SIGNALS = [*UTIL, Isv.MOE_GATE_ENTROPY_EMA, Isv.MOE_MAX_UTIL_EMA]


def upload(stager, *arrays, dtype=np.float32):
    return [stager.upload_new(np.ascontiguousarray(a, dtype)) for a in arrays]


def gate_weights(rng, rows):
    """Softmax weights [rows, 4, K] of random logits (never uniform, never zero)."""
    return reference.softmax64(1.5 * rng.standard_normal((rows, N_BRANCHES, K)))


def test_softmax_and_mixture_match_float64(stream, stager, rng):
    logits = (2.0 * rng.standard_normal((ROWS, N_BRANCHES * K))).astype(np.float32)
    e = rng.standard_normal((ROWS, K * HW)).astype(np.float32)
    g, de, out = upload(stager, logits, e, np.full((ROWS, HW), np.nan))
    moe_gate_softmax(g, stream=stream)
    moe_mix(de, g, out, stream=stream)
    w = reference.softmax64(logits.astype(np.float64).reshape(ROWS, N_BRANCHES, K))
    np.testing.assert_allclose(stager.download(g), w.reshape(ROWS, -1), rtol=1e-6, atol=1e-7)
    want = reference.moe_mix64(e, stager.download(g).astype(np.float64).reshape(ROWS, N_BRANCHES, K), Z)
    np.testing.assert_allclose(stager.download(out), want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(stager.download(out)[:, -1], e.reshape(ROWS, K, HW)[:, :, -1].mean(axis=1), rtol=1e-6)


def test_a_uniform_gate_mixes_the_experts_mean(stream, stager, rng):
    e = rng.standard_normal((ROWS, K * HW)).astype(np.float32)
    g, de, out = upload(stager, np.zeros((ROWS, N_BRANCHES * K)), e, np.full((ROWS, HW), np.nan))
    moe_gate_softmax(g, stream=stream)
    moe_mix(de, g, out, stream=stream)
    np.testing.assert_allclose(stager.download(out), e.astype(np.float64).reshape(ROWS, K, HW).mean(axis=1),
                               rtol=1e-6, atol=1e-6)


def test_usage_matches_float64(stream, stager, rng):
    """The first GRAD_ROWS of ROWS rows: the per-(branch, expert) means, then the branch entropies."""
    w = gate_weights(rng, ROWS)
    g, usage = upload(stager, w.reshape(ROWS, -1), np.full((K + 1) * N_BRANCHES, np.nan))
    moe_usage(g, usage, n_rows=GRAD_ROWS, stream=stream)
    u, h = reference.moe_usage64(w.astype(np.float32).astype(np.float64)[:GRAD_ROWS])
    np.testing.assert_allclose(stager.download(usage), np.concatenate([u.ravel(), h]), rtol=1e-6)


def test_gradients_match_float64_and_finite_differences(stream, stager, rng):
    """Both gradient kernels on GRAD_ROWS rows against the formulas, and the formulas against central differences of
    J = sum(dout * mix(e, softmax(g))) + lam * sum_b K sum_k u_bk(g)**2 with respect to e and g."""
    logits = 1.5 * rng.standard_normal((GRAD_ROWS, N_BRANCHES, K))
    w = reference.softmax64(logits)
    e = rng.standard_normal((GRAD_ROWS, K * HW)).astype(np.float32)
    dout = rng.standard_normal((GRAD_ROWS, HW)).astype(np.float32)
    lam = np.float32(0.37)
    isv0 = bootstrap_values()
    isv0[Isv.MOE_LAMBDA_EFF] = lam
    w32 = w.astype(np.float32).reshape(GRAD_ROWS, -1)
    u, h = reference.moe_usage64(w32.astype(np.float64).reshape(GRAD_ROWS, N_BRANCHES, K))
    usage32 = np.concatenate([u.ravel(), h]).astype(np.float32)
    d_out, d_e, d_w, d_usage, isv = upload(stager, dout, e, w32, usage32, isv0)
    de, dg = upload(stager, np.full((GRAD_ROWS, K * HW), np.nan), np.full((GRAD_ROWS, N_BRANCHES * K), np.nan))
    moe_expert_grad(d_out, d_w, de, stream=stream)
    moe_gate_grad(d_out, d_e, d_w, d_usage, isv, dg, stream=stream)
    w64 = w32.astype(np.float64).reshape(GRAD_ROWS, N_BRANCHES, K)
    want_de, want_dg = reference.moe_backward64(dout, e, w64, float(lam), Z)
    np.testing.assert_allclose(stager.download(de), want_de, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(stager.download(dg), want_dg, rtol=1e-5, atol=1e-5 * np.abs(want_dg).max())

    def objective(g64, e64):
        ww = reference.softmax64(g64)
        uu, _ = reference.moe_usage64(ww)
        mixed = float(np.sum(dout * reference.moe_mix64(e64, ww, Z)))
        return mixed + float(lam) * N_BRANCHES * reference.moe_balance64(uu)

    eps = 1e-6
    fd_g = np.zeros(logits.size)
    for i in range(logits.size):
        up, down = logits.ravel().copy(), logits.ravel().copy()
        up[i] += eps
        down[i] -= eps
        fd_g[i] = (objective(up.reshape(logits.shape), e) - objective(down.reshape(logits.shape), e)) / (2 * eps)
    _, dg64 = reference.moe_backward64(dout, e, w, float(lam), Z)
    np.testing.assert_allclose(dg64.ravel(), fd_g, rtol=1e-6, atol=1e-7 * np.abs(fd_g).max())
    e64 = e.astype(np.float64).ravel()
    fd_e = np.zeros(e64.size)
    for i in range(e64.size):
        up, down = e64.copy(), e64.copy()
        up[i] += eps
        down[i] -= eps
        fd_e[i] = (objective(logits, up.reshape(e.shape)) - objective(logits, down.reshape(e.shape))) / (2 * eps)
    de64, _ = reference.moe_backward64(dout, e, w, float(lam), Z)
    np.testing.assert_allclose(de64.ravel(), fd_e, rtol=1e-6, atol=1e-8)


def signals64(isv, usage):
    """The slots moe_signals writes and the balance term, in float64 from the ISV before and the usage."""
    u, h = usage[: N_BRANCHES * K].reshape(N_BRANCHES, K).astype(np.float64), usage[N_BRANCHES * K :]
    obs = np.concatenate([u.mean(axis=0), [np.clip(h.mean() / math.log(K), 0, 1)],
                          [np.clip(u.max(axis=1).mean(), 1 / K, 1)]])
    old = isv[SIGNALS].astype(np.float64)
    new = obs if isv[Isv.MOE_MAX_UTIL_EMA] == 0 else old + MOE_ALPHA * (obs - old)
    imbalance = (np.float32(new[-1]) - 1 / K) / (1 - 1 / K)
    lam = isv[Isv.MOE_LAMBDA_EFF] * math.exp(MOE_LAMBDA_GAIN * (imbalance - MOE_IMBALANCE_TARGET))
    return new, float(np.clip(lam, MOE_LAMBDA_FLOOR, MOE_LAMBDA_CEIL)), reference.moe_balance64(u)


@pytest.mark.parametrize("seeded", [False, True])
def test_signals_seed_fold_and_drive_lambda(stream, stager, rng, seeded):
    """Unseeded (the fold reset's 0): the observation seeds the slots; seeded: alpha-EMAs. Either way lambda moves by
    the controller and the balance term joins the epoch sums; slots of experts >= K stay untouched."""
    w = gate_weights(rng, GRAD_ROWS)
    u, h = reference.moe_usage64(w)
    usage = np.concatenate([u.ravel(), h]).astype(np.float32)
    isv0 = bootstrap_values()
    isv0[Isv.MOE_UTIL_EMA_7] = 0.5  # beyond K: nothing writes it
    if seeded:
        isv0[SIGNALS] = rng.uniform(0.2, 0.6, len(SIGNALS))
        isv0[Isv.MOE_LAMBDA_EFF] = 0.05
    epoch0 = rng.uniform(0, 1, N_EPOCH_STATS)
    d_usage, isv = upload(stager, usage, isv0)
    (epoch,) = upload(stager, epoch0, dtype=np.float64)
    moe_signals(d_usage, isv, epoch, n_experts=K, stream=stream)
    got, got_epoch = stager.download(isv), stager.download(epoch)
    want, lam, balance = signals64(isv0, usage)
    np.testing.assert_allclose(got[SIGNALS], want, rtol=1e-6)
    np.testing.assert_allclose(got[Isv.MOE_LAMBDA_EFF], lam, rtol=1e-6)
    assert got[Isv.MOE_LAMBDA_EFF] != isv0[Isv.MOE_LAMBDA_EFF]
    want_epoch = epoch0.copy()
    want_epoch[EpochStat.MOE_BALANCE] += balance
    np.testing.assert_allclose(got_epoch, want_epoch, rtol=1e-12)
    others = np.setdiff1d(np.arange(ISV_TOTAL_DIM), [*SIGNALS, Isv.MOE_LAMBDA_EFF])
    np.testing.assert_array_equal(got[others], isv0[others])


@pytest.mark.parametrize("collapsed, lam0, bound", [(True, 0.999, MOE_LAMBDA_CEIL), (False, 0.001, MOE_LAMBDA_FLOOR),
                                                    (True, 0.0, MOE_LAMBDA_FLOOR)])
def test_lambda_rises_on_collapse_falls_on_balance_within_bounds(stream, stager, collapsed, lam0, bound):
    """One expert taking every row raises lambda (to the ceiling here), a balanced load lowers it (to the floor);
    a lambda of 0 (an older bus) is lifted to the floor."""
    u = np.tile(np.eye(K)[0] if collapsed else np.full(K, 1 / K), (N_BRANCHES, 1))
    usage = np.concatenate([u.ravel(), np.zeros(N_BRANCHES)]).astype(np.float32)
    isv0 = bootstrap_values()
    isv0[Isv.MOE_LAMBDA_EFF] = lam0
    d_usage, isv = upload(stager, usage, isv0)
    (epoch,) = upload(stager, np.zeros(N_EPOCH_STATS), dtype=np.float64)
    moe_signals(d_usage, isv, epoch, n_experts=K, stream=stream)
    got = stager.download(isv)
    assert got[Isv.MOE_MAX_UTIL_EMA] == np.float32(1.0 if collapsed else 1 / K)
    assert got[Isv.MOE_LAMBDA_EFF] == np.float32(bound)
    assert stager.download(epoch)[EpochStat.MOE_BALANCE] == pytest.approx(K if collapsed else 1.0, rel=1e-6)


def test_a_non_finite_usage_moves_nothing(stream, stager, rng):
    w = gate_weights(rng, GRAD_ROWS)
    u, h = reference.moe_usage64(w)
    usage = np.concatenate([u.ravel(), h]).astype(np.float32)
    usage[1] = np.nan
    isv0 = bootstrap_values()
    d_usage, isv = upload(stager, usage, isv0)
    (epoch,) = upload(stager, np.zeros(N_EPOCH_STATS), dtype=np.float64)
    moe_signals(d_usage, isv, epoch, n_experts=K, stream=stream)
    np.testing.assert_array_equal(stager.download(isv), isv0)
    assert not stager.download(epoch).any()
    assert isv0[Isv.MOE_LAMBDA_EFF] == np.float32(MOE_LAMBDA_BASE)


def test_wrappers_refuse_bad_shapes(stream, stager):
    g, usage, isv = upload(stager, np.zeros((ROWS, N_BRANCHES * 9)), np.zeros(40), bootstrap_values())
    (epoch,) = upload(stager, np.zeros(N_EPOCH_STATS), dtype=np.float64)
    with pytest.raises(ValueError, match="2 .. 8 experts"):
        moe_gate_softmax(g, stream=stream)
    with pytest.raises(ValueError, match="2 .. 8 experts"):
        moe_signals(usage, isv, epoch, n_experts=1, stream=stream)
    (odd,) = upload(stager, np.zeros((ROWS, 6)))
    with pytest.raises(ValueError, match="4 K columns"):
        moe_usage(odd, usage, n_rows=ROWS, stream=stream)
