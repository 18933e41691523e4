"""Dueling combine, its backward, and the adaptive supports against float64 references.

Tolerances: the combine is a sum of <= 4 float32 terms, a division and two additions per output, so every
element is within 8 float32 ulps of the output's largest operand; the support refresh is a handful of
float32 operations: 1e-6 relative.

The rule's constants are the values kernels/heads.py documents, written here as literals (not imported), so a
changed constant in the module fails these tests.
"""

import math

import numpy as np
import pytest
import reference

from fox_numba.actions import N_HEADS
from fox_numba.device.isv import Isv, bootstrap_values
from fox_numba.kernels.heads import (
    aux_column,
    base_support,
    broadcast_supports,
    dueling_combine_backward,
    dueling_combine_forward,
    head_width,
    refresh_supports,
    return_spread,
)

pytestmark = pytest.mark.usefixtures("long_switch_interval")
B, Z = 5, 7
N_STREAMS = 17  # per branch its value stream, then its heads' advantage streams: 4 + 13
Q_COVER, RETURN_COVER, SCALE_STEP = 3.0, 2.0, 2.0  # the support rule's documented constants


def ulp_bound(*operands, ulps=8):
    scale = np.max([np.abs(o) for o in operands], axis=0).astype(np.float32)
    return ulps * np.spacing(scale).astype(np.float64)


def test_dueling_combine_forward(stream, stager, rng):
    head = rng.standard_normal((B, head_width(Z))).astype(np.float32)
    logits = stager.upload_new(np.full((B, N_HEADS, Z), np.nan, np.float32))
    dueling_combine_forward(stager.upload_new(head), logits, stream=stream)
    got = stager.download(logits)
    ref = reference.dueling64(head, Z)
    streams = head[:, : N_STREAMS * Z].reshape(B, N_STREAMS, Z)
    scale = np.abs(streams).max(axis=1, keepdims=True) * 3
    values, _ = reference.split_streams(head, Z)
    assert np.all(np.abs(got - ref) <= ulp_bound(np.broadcast_to(scale, ref.shape)))
    # the advantages of each branch average out: the branch mean of the logits is the value stream
    for b, (off, size) in enumerate(reference.branch_spans()):
        np.testing.assert_allclose(got[:, off : off + size].mean(axis=1), values[:, b], atol=1e-5)
        np.testing.assert_array_equal(values[:, b], streams[:, off + b])  # branch b's value stream: offset + b


def test_dueling_combine_backward_is_the_transpose(stream, stager, rng):
    """Every stream column of dhead is the transpose's; the auxiliary column is left as it was (NaN here)."""
    dl = rng.standard_normal((B, N_HEADS, Z)).astype(np.float32)
    dhead = stager.upload_new(np.full((B, head_width(Z)), np.nan, np.float32))
    dueling_combine_backward(stager.upload_new(dl), dhead, stream=stream)
    got = stager.download(dhead)
    assert np.isnan(got[:, aux_column(Z)]).all()
    got = got[:, : aux_column(Z)]
    ref = reference.dueling_backward64(dl)
    assert np.all(np.abs(got - ref) <= ulp_bound(np.full(ref.shape, np.abs(dl).max() * 4)))
    # adjoint identity <dl, combine(h)> = <combine^T(dl), h> in float64
    h = rng.standard_normal((B, N_STREAMS * Z))
    assert np.sum(dl * reference.dueling64(h, Z)) == pytest.approx(np.sum(ref * h), rel=1e-12)


def support_rule64(isv, old, v_min, v_max, gamma, cap, z):
    """The rule of kernels/heads.py in float64 (old: the current supports [13, 3])."""
    out = np.empty((N_HEADS, 3))
    for a in range(N_HEADS):
        q_ref = isv[Isv.Q_DIR_ABS_REF] if a < 4 else isv[Isv.Q_ABS_REF]
        want = Q_COVER * q_ref + RETURN_COVER * isv[Isv.REWARD_ABS_EMA] / math.sqrt(1 - gamma**2)
        prev = (old[a, 1] - old[a, 0]) / (v_max - v_min)
        scale = want / max(abs(v_min), abs(v_max))
        scale = prev if not np.isfinite(scale) else min(max(scale, prev / SCALE_STEP), prev * SCALE_STEP)
        scale = min(max(scale, 1.0), cap)
        out[a] = (v_min * scale, v_max * scale, (v_max - v_min) * scale / (z - 1))
    return out


@pytest.mark.parametrize(
    "q_ref, q_dir_ref, r_ref, expect",
    [
        (0.05, 0.05, 0.0, "floor"),  # bootstrap values: the base support
        (1.0, 0.4, 0.02, "grow"),  # wider than the base, within the 2x step
        (50.0, 50.0, 1.0, "step"),  # far wider: the step limits it
        (np.nan, 0.4, 0.02, "keep"),  # a non-finite reference keeps the magnitude heads' support
    ],
)
def test_support_refresh_rule(stream, stager, q_ref, q_dir_ref, r_ref, expect):
    v_min, v_max, gamma, cap = -0.5, 1.0, 0.9, 6.0
    isv0 = bootstrap_values()
    isv0[[Isv.Q_ABS_REF, Isv.Q_DIR_ABS_REF, Isv.REWARD_ABS_EMA]] = (q_ref, q_dir_ref, r_ref)
    old = base_support(v_min, v_max, Z) * np.float32(1.5)  # the last refresh left scale 1.5
    support = stager.upload_new(old)
    refresh_supports(stager.upload_new(isv0), support, v_min=v_min, v_max=v_max, gamma=gamma, scale_cap=cap,
                     n_atoms=Z, stream=stream)
    got = stager.download(support)
    ref = support_rule64(isv0.astype(np.float64), old.astype(np.float64), v_min, v_max, gamma, cap, Z)
    np.testing.assert_allclose(got, ref, rtol=1e-6)
    scale = (got[:, 1] - got[:, 0]) / (v_max - v_min)
    assert np.all((scale >= 1.0 - 1e-6) & (scale <= cap * (1 + 1e-6)))
    np.testing.assert_allclose(got[:, 0] + (Z - 1) * got[:, 2], got[:, 1], rtol=1e-5)  # v_max is the last atom
    if expect == "floor":
        np.testing.assert_allclose(scale, 1.0, rtol=1e-6)
    elif expect == "step":
        np.testing.assert_allclose(scale, 3.0, rtol=1e-6)  # 1.5 * SCALE_STEP
    elif expect == "keep":
        np.testing.assert_allclose(scale[4:], 1.5, rtol=1e-6)
    if expect == "grow":
        assert scale[0] != scale[4]  # direction heads follow Q_DIR_ABS_REF, the others Q_ABS_REF


def test_support_refresh_cap_and_disable(stream, stager):
    isv0 = bootstrap_values()
    isv0[[Isv.Q_ABS_REF, Isv.Q_DIR_ABS_REF, Isv.REWARD_ABS_EMA]] = (5.0, 5.0, 1.0)
    for cap, want in ((1.0, 1.0), (2.5, 2.5)):
        support = stager.upload_new(base_support(-1.0, 1.0, Z) * np.float32(2.0))
        refresh_supports(stager.upload_new(isv0), support, v_min=-1.0, v_max=1.0, gamma=0.99, scale_cap=cap,
                         n_atoms=Z, stream=stream)
        got = stager.download(support)
        np.testing.assert_allclose(got[:, 1], want, rtol=1e-6)


def test_broadcast_and_base_support(stream, stager):
    sup = reference.random_support(np.random.default_rng(3), (N_HEADS,), Z)
    out = stager.upload_new(np.full((6, N_HEADS, 3), np.nan, np.float32))
    broadcast_supports(stager.upload_new(sup), out, stream=stream)
    np.testing.assert_array_equal(stager.download(out), np.broadcast_to(sup, (6, N_HEADS, 3)))
    assert (head_width(Z), aux_column(Z)) == (N_STREAMS * Z + 1, N_STREAMS * Z)  # the streams, then one aux column
    np.testing.assert_array_equal(base_support(-2.0, 2.0, 5)[3], np.float32([-2.0, 2.0, 1.0]))
    assert return_spread(0.0) == 1.0 and return_spread(0.99) == pytest.approx(7.0888, rel=1e-4)
    with pytest.raises(ValueError):
        base_support(1.0, -1.0, 5)
