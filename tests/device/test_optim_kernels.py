"""Optimiser kernels against float64 numpy references; per-step scalars come from the device optimiser
state (step, adam_t, lr, tau), written by kernels, never by the host per step."""

import numpy as np
import pytest
import reference
from reference import adaptive_clip64

from fox_numba.device.elementwise import scatter_f32
from fox_numba.device.graphs import StepGraph
from fox_numba.device.isv import Isv, IsvBus, bootstrap_values, fold_reset_entries
from fox_numba.device.launch import i32, launch_strided
from fox_numba.device.memory import Mapped
from fox_numba.device.runtime import SIMULATOR
from fox_numba.kernels.optim import (
    ADAM_SHRINK_M,
    ADAM_SHRINK_V,
    NORM_BLOCK,
    OPTIM_STATE_DTYPE,
    adam_update,
    global_grad_norm,
    norm_partials_len,
    partials_used,
    polyak,
    shrink_adam_moments,
    update_adaptive_clip,
)

N = 1000


def optim_state(stager, step=0, adam_t=0, lr=0.0, tau=0.0):
    rec = np.zeros(1, OPTIM_STATE_DTYPE)
    rec[0] = (step, adam_t, lr, tau)
    return stager.upload_new(rec)


def test_polyak_reads_tau_from_the_device_state(stream, stager):
    """Tolerance: 3 float32 ulps of the larger operand (a subtract, a multiply and an add); the partials'
    sums 1e-12 relative (float64)."""
    rng = np.random.default_rng(7)
    target0 = rng.standard_normal(N).astype(np.float32)
    online0 = rng.standard_normal(N).astype(np.float32)
    tau = np.float32(rng.uniform(0.001, 0.5))
    target, online = stager.upload_new(target0), stager.upload_new(online0)
    isv0 = bootstrap_values()
    isv0[RAW] = 1.5
    partials = stager.upload_new(np.full((norm_partials_len(N), 2), np.nan))
    polyak(target, online, stager.upload_new(isv0), optim_state(stager, tau=tau), partials, stream=stream)

    t64, o64 = target0.astype(np.float64), online0.astype(np.float64)
    expected = t64 + float(tau) * (o64 - t64)
    got = stager.download(target)
    scale = np.maximum(np.abs(t64), np.abs(o64)).astype(np.float32)
    assert np.all(np.abs(got - expected) <= 3 * np.spacing(scale).astype(np.float64))
    np.testing.assert_array_equal(stager.download(online), online0)
    sums = stager.download(partials)[: partials_used(N)].sum(axis=0)
    np.testing.assert_allclose(sums, [np.sum((got.astype(np.float64) - o64) ** 2), np.sum(o64**2)], rtol=1e-12)


def test_polyak_skips_a_nonfinite_step(stream, stager, rng):
    target0, online0 = rng.standard_normal(N).astype(np.float32), rng.standard_normal(N).astype(np.float32)
    target = stager.upload_new(target0)
    isv0 = bootstrap_values()
    isv0[RAW] = np.nan
    polyak(target, stager.upload_new(online0), stager.upload_new(isv0), optim_state(stager, tau=0.5),
           stager.upload_new(np.zeros((norm_partials_len(N), 2))), stream=stream)
    np.testing.assert_array_equal(stager.download(target), target0)


# ---- gradient norm, adaptive clip, Adam -------------------------------------------------------------
# Tolerances (float64 references, float32 state on the device):
# - norm: 1 float32 ulp (float64 accumulation, one final rounding); partials 1e-12 relative.
# - producer: slots within 1e-5 relative (+1e-9 absolute) after 250 steps of float32 EMA updates;
#   counters and the bootstrap branch exact.
# - Adam: m, v within 1e-5 relative plus 1e-6 of the array's largest magnitude (m cancels where the
#   gradient changes sign); params within 2 float32 ulps of the parameter plus 1e-4 of the step's
#   learning rate per step.

B1, B2, ADAM_EPS, CLIP_MULT = 0.9, 0.999, 1.5e-4, 2.0
RAW, EMA, FAST, SLOW = Isv.GRAD_NORM_RAW, Isv.GRAD_NORM_EMA, Isv.GRAD_NORM_FAST_EMA, Isv.GRAD_NORM_SLOW_EMA
ENGAGED, NONFINITE, OBSERVED = Isv.CLIP_ENGAGED_EMA, Isv.NONFINITE_STEPS, Isv.GRAD_NORM_OBSERVED
CLIP, FACTOR = Isv.CLIP_EFF, Isv.FOLD_WARMUP_FACTOR
PRODUCED = [EMA, FAST, SLOW, ENGAGED, OBSERVED, CLIP, FACTOR]
F32 = (float(np.float32(B1)), float(np.float32(B2)), float(np.float32(ADAM_EPS)))


def ref_norm(grad, isv):
    """float64 global norm written as the finish kernel does (RAW rounded to float32, non-finite counted)."""
    norm = np.float32(np.sqrt(np.sum(grad.astype(np.float64) ** 2)))
    isv[RAW] = norm
    if not np.isfinite(norm):
        isv[NONFINITE] += 1


def ref_producer(isv, mult=CLIP_MULT, rule="damped"):
    """The float64 adaptive-clip producer of tests/reference.py (rule: learner.warmup_rule)."""
    adaptive_clip64(isv, mult, rule)


def ref_adam(p, m, v, g, isv, lr_base, t, weight_decay=0.0, mask=1.0):
    """float64 AdamW on the clipped gradient, in place (returns the update); no update when the norm is
    not finite."""
    b1, b2, eps = F32
    norm = isv[RAW]
    if not np.isfinite(norm):
        return np.zeros_like(p)
    return reference.adamw64(p, m, v, g, clip_scale=min(1.0, isv[CLIP] / (norm + 1e-12)),
                             lr=lr_base * max(0.05, isv[FACTOR]), t=t, beta1=b1, beta2=b2, eps=eps,
                             weight_decay=weight_decay, mask=mask)


def assert_moment(got, ref):
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6 * np.abs(ref).max())


def assert_slots(got, ref, slots=PRODUCED):
    np.testing.assert_allclose(got[slots], ref[slots], rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("n", [3001, 37])
def test_global_grad_norm_two_pass_reduction(stream, stager, rng, n):
    grad0 = (rng.standard_normal(n) * rng.uniform(0.01, 10.0, n)).astype(np.float32)
    isv0 = bootstrap_values()
    grad, isv = stager.upload_new(grad0), stager.upload_new(isv0)
    partials = stager.upload_new(np.full(norm_partials_len(n), np.nan))
    global_grad_norm(grad, partials, isv, stream=stream)

    got_partials = stager.download(partials)
    if SIMULATOR:  # one block of a few threads strides over every element
        assert partials_used(n) == 1
        np.testing.assert_allclose(got_partials[0], np.sum(grad0.astype(np.float64) ** 2), rtol=1e-12)
    else:  # one element per thread, one partial per block of NORM_BLOCK
        sq = np.zeros(norm_partials_len(n) * NORM_BLOCK)
        sq[:n] = grad0.astype(np.float64) ** 2
        np.testing.assert_allclose(got_partials, sq.reshape(-1, NORM_BLOCK).sum(1), rtol=1e-12)
    expected = isv0.astype(np.float64)
    ref_norm(grad0, expected)
    got = stager.download(isv)
    assert abs(float(got[RAW]) - expected[RAW]) <= np.spacing(np.float32(expected[RAW]))
    np.testing.assert_array_equal(np.delete(got, RAW), np.delete(isv0, RAW))


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nonfinite_gradient_is_counted_and_skips_adam(stream, stager, rng, bad):
    n = 37
    grad0 = rng.standard_normal(n).astype(np.float32)
    grad0[[5, 30]] = bad
    isv0 = bootstrap_values()
    isv0[[EMA, FAST, SLOW, OBSERVED, NONFINITE]] = (3.0, 2.5, 3.5, 400.0, 2.0)
    p0, m0, v0 = (rng.standard_normal(n).astype(np.float32) for _ in range(3))
    v0 = np.abs(v0)
    grad, isv = stager.upload_new(grad0), stager.upload_new(isv0)
    partials = stager.upload_new(np.zeros(norm_partials_len(n)))
    p, m, v = stager.upload_new(p0), stager.upload_new(m0), stager.upload_new(v0)
    mask = stager.upload_new(np.ones(n, np.float32))
    global_grad_norm(grad, partials, isv, stream=stream)
    update_adaptive_clip(isv, CLIP_MULT, stream=stream)
    adam_update(p, grad, m, v, mask, isv, optim_state(stager, 3, 3, 1e-3), partials, beta1=B1, beta2=B2,
                eps=ADAM_EPS, weight_decay=0.01, stream=stream)

    got = stager.download(isv)
    assert not np.isfinite(got[RAW]) and got[NONFINITE] == 3.0
    np.testing.assert_array_equal(got[[EMA, FAST, SLOW, OBSERVED, ENGAGED]], isv0[[EMA, FAST, SLOW, OBSERVED, ENGAGED]])
    for dev, host in ((p, p0), (m, m0), (v, v0)):
        np.testing.assert_array_equal(stager.download(dev), host)


@pytest.mark.parametrize("rule", ["seed", "damped"])
def test_adaptive_clip_producer_bootstrap_then_fold_damping(stream, stager, rng, rule):
    """220 steps from a fresh bus (a NaN norm at step 50), a fold reset, then 30 steps: factor 1 until
    200 observations (bootstrap), then 0 right after the reset, climbing with the fast EMA; floors kept.
    The kernel runs the steps where the state changes regime: 0-9 (the fresh bus), 48-53 (around the NaN),
    196-205 (the end of the bootstrap), 218-235 (the reset and the climb) and 246-249 (the end); between
    them only the reference steps, and its state is uploaded before each of the kernel's stretches."""
    bus = IsvBus(stager)
    ref = bootstrap_values().astype(np.float64)
    reset_index, reset_values = fold_reset_entries()
    norms = rng.lognormal(np.log(10.0), 0.3, 250)
    norms[50] = np.nan
    raw = Mapped(1, np.float32)
    raw_index = stager.upload_new(np.array([RAW], np.int32))
    on_kernel = set(range(10)) | set(range(48, 54)) | set(range(196, 206)) | set(range(218, 236)) | set(range(246, 250))
    factors, clips, engaged = {}, {}, {}
    for step, value in enumerate(norms):
        if step in on_kernel and step - 1 not in on_kernel:
            stager.upload(ref.astype(np.float32), bus.values)
        if step == 220:
            bus.fold_reset(stream)
            ref[reset_index] = reset_values
        ref[RAW] = np.float32(value)
        ema_before = ref[EMA]
        if step not in on_kernel:
            ref_producer(ref, rule=rule)
            continue
        raw.host[0] = value
        launch_strided(scatter_f32, 1, bus.values, raw_index, raw.device, i32(1), stream=stream)
        update_adaptive_clip(bus.values, CLIP_MULT, stream=stream, warmup_rule=rule)
        ref_producer(ref, rule=rule)
        got = bus.read()
        assert_slots(got, ref)
        assert got[OBSERVED] == step + 1 - (step >= 50)
        assert 0.0 <= got[FACTOR] <= 1.0
        if step > 0:
            assert got[CLIP] >= 0.1 * CLIP_MULT * ema_before * (1 - 1e-6)
        factors[step] = float(got[FACTOR])
        clips[step] = float(got[CLIP]) / (CLIP_MULT * ema_before or 1.0)
        engaged[step] = float(got[ENGAGED])
    assert all(factors[k] == 1.0 for k in factors if k <= 200)  # up to 200 finite observations: bootstrap
    assert factors[220] == 0.0 and clips[220] == pytest.approx(0.1, rel=1e-6)  # fast EMA reset to 0
    assert all(factors[k] < 1.0 for k in range(220, 235))  # the fast EMA climbs from 0 ...
    assert factors[249] > 0.5  # ... towards the slow one
    assert engaged[220] == pytest.approx(0.01, rel=1e-6)  # reset to 0, then the damped clip engages on an ordinary norm


def test_adaptive_clip_producer_bootstrap_on_a_tiny_slow_ema(stream, stager):
    isv0 = bootstrap_values()
    isv0[[RAW, FAST, SLOW, OBSERVED, EMA]] = (1e-7, 0.0, 5e-7, 500.0, 5e-7)
    isv = stager.upload_new(isv0)
    update_adaptive_clip(isv, CLIP_MULT, stream=stream)
    ref = isv0.astype(np.float64)
    ref_producer(ref)
    got = stager.download(isv)
    assert got[FACTOR] == 1.0
    assert_slots(got, ref)


SLOW_MIN = float(np.float32(1e-6))


@pytest.mark.parametrize(
    "observed, slow, bootstrap",
    [
        (199.0, 4.0, True),  # 199 finite observations so far: still the bootstrap
        (200.0, 4.0, False),  # exactly 200: damping starts (a `> 200` test would keep the bootstrap here)
        (201.0, 4.0, False),
        (500.0, SLOW_MIN, False),  # the slow EMA exactly at its 1e-6 floor counts
        (500.0, float(np.nextafter(np.float32(SLOW_MIN), np.float32(0))), True),  # one ulp below does not
    ],
)
def test_adaptive_clip_producer_bootstrap_boundaries(stream, stager, observed, slow, bootstrap):
    """The factor is 1 while fewer than 200 finite norms have been observed or the slow EMA is below 1e-6, and
    fast / slow otherwise: here the fast EMA is half the slow one, so the factor is exactly 0.5 off the
    bootstrap. Both boundaries are checked on each side (the running test above cannot see the first:
    its fast / slow ratio is clipped to 1 at step 200)."""
    isv0 = bootstrap_values()
    isv0[[RAW, EMA, FAST, SLOW, OBSERVED]] = (3.0, 3.0, slow / 2, slow, observed)
    isv = stager.upload_new(isv0)
    update_adaptive_clip(isv, CLIP_MULT, stream=stream)
    got = stager.download(isv)
    assert got[FACTOR] == (1.0 if bootstrap else 0.5)
    ref = isv0.astype(np.float64)
    ref_producer(ref)
    assert_slots(got, ref)
    assert got[OBSERVED] == observed + 1


def test_adam_step_against_a_float64_reference(stream, stager, rng):
    """Five steps of AdamW with a decay mask; the clip engages on odd steps; factor 0 at step 1 puts lr on
    its 0.05 floor. t = adam_t + 1 comes from the device state; the update's squares are summed per block."""
    n = 701
    p0 = rng.standard_normal(n).astype(np.float32)
    mask0 = (rng.random(n) < 0.7).astype(np.float32)
    p, m, v = stager.upload_new(p0), stager.upload_new(np.zeros(n, np.float32)), stager.upload_new(
        np.zeros(n, np.float32))
    grads, mask = stager.upload_new(np.zeros(n, np.float32)), stager.upload_new(mask0)
    isv = stager.upload_new(bootstrap_values())
    partials = stager.upload_new(np.full(norm_partials_len(n), np.nan))
    pr, mr, vr = p0.astype(np.float64), np.zeros(n), np.zeros(n)
    wd = 0.02
    for t, factor in zip(range(1, 6), (0.0, 0.3, 1.0, 0.02, 0.7), strict=True):
        g0 = (rng.standard_normal(n) * 10.0 ** rng.uniform(-4, 0)).astype(np.float32)
        norm = np.float32(np.linalg.norm(g0.astype(np.float64)))
        isv0 = bootstrap_values()
        isv0[[RAW, CLIP, FACTOR]] = (norm, norm * (0.5 if t % 2 else 3.0), factor)
        stager.upload(g0, grads)
        stager.upload(isv0, isv)
        lr = np.float32(10.0 ** rng.uniform(-4, -2))
        state = optim_state(stager, step=100 + t, adam_t=t - 1, lr=lr)
        adam_update(p, grads, m, v, mask, isv, state, partials, beta1=B1, beta2=B2, eps=ADAM_EPS,
                    weight_decay=wd, stream=stream)
        u = ref_adam(pr, mr, vr, g0, isv0.astype(np.float64), float(lr), t, float(np.float32(wd)), mask0)
        assert_moment(stager.download(m), mr)
        assert_moment(stager.download(v), vr)
        got = stager.download(p)
        tol = 2 * np.spacing(np.abs(got)).astype(np.float64) + 1e-4 * float(lr) * t
        assert np.all(np.abs(got - pr) <= tol)
        np.testing.assert_allclose(stager.download(partials)[: partials_used(n)].sum(), np.sum(u**2), rtol=1e-4)
        assert stager.download(state)[0]["adam_t"] == t - 1  # adam_step reads t, the learner advances it


def test_weight_decay_spares_masked_entries(stream, stager):
    """A zero gradient: AdamW moves only the decaying entries, each by lr * wd * p."""
    n = 64
    p0 = np.linspace(-2, 2, n).astype(np.float32)
    mask0 = (np.arange(n) % 2).astype(np.float32)
    p = stager.upload_new(p0)
    zeros = [stager.upload_new(np.zeros(n, np.float32)) for _ in range(3)]
    isv0 = bootstrap_values()
    isv0[[RAW, CLIP, FACTOR]] = (0.0, 1.0, 1.0)
    adam_update(p, zeros[0], zeros[1], zeros[2], stager.upload_new(mask0), stager.upload_new(isv0),
                optim_state(stager, lr=0.1), stager.upload_new(np.zeros(norm_partials_len(n))), beta1=B1,
                beta2=B2, eps=ADAM_EPS, weight_decay=0.5, stream=stream)
    got = stager.download(p)
    np.testing.assert_array_equal(got[mask0 == 0], p0[mask0 == 0])
    np.testing.assert_allclose(got[mask0 == 1], p0[mask0 == 1] * (1 - 0.1 * 0.5), rtol=1e-6)


def test_step_graph_replays_norm_clip_adam(stream, stager, rng):
    """[norm, producer, adam] as one StepGraph; the gradient and the device optimiser state (t, lr) change
    between replays, no control block involved."""
    n = 300
    p0 = rng.standard_normal(n).astype(np.float32)
    p, m, v = stager.upload_new(p0), stager.upload_new(np.zeros(n, np.float32)), stager.upload_new(
        np.zeros(n, np.float32))
    grads = stager.upload_new(np.zeros(n, np.float32))
    mask = stager.upload_new(np.ones(n, np.float32))
    partials = stager.upload_new(np.zeros(norm_partials_len(n)))
    adam_partials = stager.upload_new(np.zeros(norm_partials_len(n)))
    isv0 = bootstrap_values()
    isv0[[EMA, FAST, SLOW, OBSERVED]] = (20.0, 2.0, 20.0, 300.0)  # a fold start: damped lr and clip
    isv = stager.upload_new(isv0)
    state = optim_state(stager)

    def body(s):
        global_grad_norm(grads, partials, isv, stream=s)
        update_adaptive_clip(isv, CLIP_MULT, stream=s)
        adam_update(p, grads, m, v, mask, isv, state, adam_partials, beta1=B1, beta2=B2, eps=ADAM_EPS,
                    weight_decay=0.0, stream=s)

    step = StepGraph("optim", body, stream, use_graph=True)
    ref, pr, mr, vr = isv0.astype(np.float64), p0.astype(np.float64), np.zeros(n), np.zeros(n)
    for t in range(1, 5):
        g0 = (rng.standard_normal(n) * 0.1 * t).astype(np.float32)
        stager.upload(g0, grads)
        lr = np.float32(1e-3 / t)
        rec = np.zeros(1, OPTIM_STATE_DTYPE)
        rec[0] = (t, t - 1, lr, 0.0)
        stager.upload(rec, state)
        step.replay()
        ref_norm(g0, ref)
        ref_producer(ref)
        ref_adam(pr, mr, vr, g0, ref, float(lr), t)
        got = stager.download(isv)
        assert_slots(got, ref)
        assert 0.0 < got[FACTOR] < 1.0
        assert_moment(stager.download(m), mr)
        assert_moment(stager.download(v), vr)
        got_p = stager.download(p)
        assert np.all(np.abs(got_p - pr) <= 2 * np.spacing(np.abs(got_p)).astype(np.float64) + 1e-4 * float(lr) * t)
    assert step.replays == 4
    assert [r.kernel.rsplit(".", 1)[1] for r in step.launches] == [
        "grad_sq_partials", "grad_norm_finish", "adaptive_clip_producer", "adam_step"]


def test_shrink_adam_moments(stream, stager, rng):
    m0, v0 = rng.standard_normal(N).astype(np.float32), rng.uniform(0, 1, N).astype(np.float32)
    m, v = stager.upload_new(m0), stager.upload_new(v0)
    shrink_adam_moments(m, v, stream=stream)
    np.testing.assert_array_equal(stager.download(m), (m0 * np.float64(ADAM_SHRINK_M)).astype(np.float32))
    np.testing.assert_array_equal(stager.download(v), (v0 * np.float64(ADAM_SHRINK_V)).astype(np.float32))
    assert (ADAM_SHRINK_M, ADAM_SHRINK_V) == (np.float32(0.1), np.float32(0.01))


def test_wrappers_check_shapes(stream, stager):
    grad = stager.upload_new(np.zeros(300, np.float32))
    isv = stager.upload_new(bootstrap_values())
    with pytest.raises(ValueError, match="partials"):
        global_grad_norm(grad, stager.upload_new(np.zeros(1)), isv, stream=stream)
    with pytest.raises(ValueError, match="isv"):
        update_adaptive_clip(grad, CLIP_MULT, stream=stream)
    partials = stager.upload_new(np.zeros(norm_partials_len(300)))
    state = optim_state(stager)
    with pytest.raises(ValueError, match="m must"):
        adam_update(grad, grad, isv, grad, grad, isv, state, partials, beta1=B1, beta2=B2, eps=ADAM_EPS,
                    weight_decay=0.0, stream=stream)
    with pytest.raises(ValueError, match="state must"):
        adam_update(grad, grad, grad, grad, grad, isv, isv, partials, beta1=B1, beta2=B2, eps=ADAM_EPS,
                    weight_decay=0.0, stream=stream)
    with pytest.raises(ValueError, match="weight_decay"):
        adam_update(grad, grad, grad, grad, grad, isv, state, partials, beta1=B1, beta2=B2, eps=ADAM_EPS,
                    weight_decay=-1.0, stream=stream)
    with pytest.raises(ValueError, match="partials"):
        polyak(grad, grad, isv, state, partials, stream=stream)
