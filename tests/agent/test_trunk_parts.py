"""Spectral normalisation and residual blocks with stochastic depth in the Network (agent/spectral.py, agent/depth.py):
the layout's checks and fingerprint, and the forward and backward of the whole network with each part on against
a float64 forward and its central finite differences.

The float64 reference holds the power-iteration vectors and the depth factors constant (the gradient the parts
define); h = 1e-6 and the tolerances are tests/agent/test_network.py's: the float32 backward within 2e-5 of the
largest gradient plus 1e-4 relative, the power iteration's float32 vectors within 1e-5.
"""

import numpy as np
import pytest
import reference

from fox_numba.actions import N_HEADS
from fox_numba.agent.depth import StochasticDepth
from fox_numba.agent.network import Dropout, Network, ParamLayout, init_params
from fox_numba.agent.spectral import SpectralKey, init_vectors, vector_views, vectors_len
from fox_numba.device.memory import device_zeros
from fox_numba.kernels.depth import drop_rate
from fox_numba.kernels.optim import OPTIM_STATE_DTYPE
from plain_learner import plain_network

OBS, ROWS, GRAD_ROWS, STEP, SEED = 3, 6, 4, 7, 3
SPECTRAL = plain_network(hidden=5, n_layers=2, n_atoms=3, spectral_norm=True)
DEPTH = plain_network(hidden=5, n_layers=3, n_atoms=3, stochastic_depth=0.5)
BOTH = plain_network(hidden=5, n_layers=3, n_atoms=3, spectral_norm=True, stochastic_depth=0.5)
PLAIN = plain_network(hidden=5, n_layers=3, n_atoms=3)


def test_layout_checks_and_fingerprints():
    plain, spectral = ParamLayout.build(OBS, PLAIN), ParamLayout.build(OBS, plain_network(**{**vars(PLAIN),
                                                                                            "spectral_norm": True}))
    residual = ParamLayout.build(OBS, plain_network(**{**vars(PLAIN), "residual": True}))
    depth, both = ParamLayout.build(OBS, DEPTH), ParamLayout.build(OBS, BOTH)
    assert not plain.spectral_norm and not plain.residual and plain.head_input_relu
    assert spectral.spectral_norm and residual.residual and depth.residual and not depth.head_input_relu
    assert plain.entries == spectral.entries == residual.entries == both.entries  # the parameters do not change
    assert depth.fingerprint == residual.fingerprint  # the drop rate is training, not architecture
    assert len({plain.fingerprint, spectral.fingerprint, residual.fingerprint, both.fingerprint}) == 4
    assert vectors_len(spectral) == (5 + OBS) + 2 * (5 + 5)
    for bad, match in (
        (plain_network(n_layers=0, spectral_norm=True), "spectral_norm needs a trunk"),
        (plain_network(n_layers=2, spectral_norm=True, spectral_iters=0), "spectral_iters >= 1"),
        (plain_network(n_layers=1, stochastic_depth=0.2), "need n_layers >= 2"),
        (plain_network(n_layers=1, residual=True), "need n_layers >= 2"),
        (plain_network(n_layers=3, stochastic_depth=1.0), "must be in"),
    ):
        with pytest.raises(ValueError, match=match):
            ParamLayout.build(OBS, bad)


def test_init_vectors_are_seeded_unit_vectors():
    lay = ParamLayout.build(OBS, BOTH)
    a, b, c = init_vectors(lay, 5), init_vectors(lay, 5), init_vectors(lay, 6)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    for u, v in vector_views(lay, a):
        assert u.shape == (5,) and abs(np.linalg.norm(u) - 1) < 1e-6 and abs(np.linalg.norm(v) - 1) < 1e-6


def random_params(lay, rng):
    p0 = init_params(lay, 3)
    for e in lay.entries:
        if not e.decay:
            p0[e.offset : e.stop] = rng.uniform(-0.2, 0.2, e.size)  # nonzero biases too
    return p0


def state_at(stager, step):
    state = np.zeros(1, OPTIM_STATE_DTYPE)
    state[0]["step"] = step
    return stager.upload_new(state)


def run(stager, stream, lay, p0, obs, dl, *, dense, vectors=None, iters=0, depth=None, dinput=None):
    """(logits, grads, vectors after the forward) of one forward over ROWS rows and a backward over GRAD_ROWS
    (`dinput`: another head's gradient at the trunk's output, Network.backward's input_grad)."""
    spectral = SpectralKey(stager.upload_new(vectors), iters) if vectors is not None else None
    net = Network(lay, ROWS, stream=stream, grad_rows=GRAD_ROWS, dense=dense, spectral=spectral, depth=depth)
    params = stager.upload_new(p0)
    logits = stager.upload_new(np.full((ROWS, N_HEADS, lay.n_atoms), np.nan, np.float32))
    grads = device_zeros(lay.size, np.float32, stream=stream)
    net.forward(params, stager.upload_new(obs), logits, stream=stream)
    input_grad = stager.upload_new(dinput) if dinput is not None else None
    net.backward(params, stager.upload_new(dl), grads, stream=stream, input_grad=input_grad)
    after = stager.download(spectral.vectors) if spectral is not None else None
    return stager.download(logits), stager.download(grads), after


def finite_difference(lay, p0, obs, dl, dinput=None, **parts):
    """Central differences of J = sum(dl * logits) (+ sum(dinput * the trunk's output)) over the first GRAD_ROWS
    rows, in float64, every parameter."""
    flat = p0.astype(np.float64)

    def objective(f):
        acts, head = reference.net_head64(lay.unpack(f), lay.n_layers, obs[:GRAD_ROWS], **parts)
        extra = 0.0 if dinput is None else float(np.sum(dinput * acts[-1]))
        return float(np.sum(dl * reference.dueling64(head, lay.n_atoms))) + extra

    return reference.central_differences64(objective, flat, lay.entries)


@pytest.mark.parametrize("dense, cfg, iters", [("strided", SPECTRAL, 2), ("strided", DEPTH, 0),
                                               ("strided", BOTH, 1), ("tiled", BOTH, 1)])
def test_forward_and_backward_against_finite_differences(stream, stager, rng, dense, cfg, iters):
    """The learner's online network: `iters` power iterations per forward (their vectors written back) and
    per-row drops of the residual blocks at step STEP; the logits of all rows and the gradient of the first
    GRAD_ROWS against float64."""
    lay = ParamLayout.build(OBS, cfg)
    p0 = random_params(lay, rng)
    obs = rng.standard_normal((ROWS, OBS)).astype(np.float32)
    dl = rng.standard_normal((GRAD_ROWS, N_HEADS, lay.n_atoms)).astype(np.float32)
    vectors = init_vectors(lay, 11) if lay.spectral_norm else None
    depth = StochasticDepth(cfg.stochastic_depth, state_at(stager, STEP), SEED) if lay.residual else None
    logits, grads, after = run(stager, stream, lay, p0, obs, dl, dense=dense, vectors=vectors, iters=iters,
                               depth=depth)

    parts: dict = {}
    p = lay.unpack(p0)
    if lay.spectral_norm:
        uv = [reference.spectral_power64(p[f"trunk.{k}.weight"], u, v, iters)[:2]
              for k, (u, v) in enumerate(vector_views(lay, vectors))]
        for (u, v), (got_u, got_v) in zip(uv, vector_views(lay, after), strict=True):
            np.testing.assert_allclose(got_u, u, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(got_v, v, rtol=1e-5, atol=1e-6)
        parts["spectral"] = uv
    if lay.residual:
        d = [reference.depth_factors64(ROWS, seed=SEED, step=STEP, layer=k, rate=drop_rate(0.5, k, lay.n_layers))
             for k in range(1, lay.n_layers)]
        assert np.concatenate([x[:GRAD_ROWS] for x in d]).min() == 0 and max(x.max() for x in d) > 1  # both kinds
        parts |= {"residual": True, "depth": d}
    _, head = reference.net_head64(p, lay.n_layers, obs, **parts)
    ref_logits = reference.dueling64(head, lay.n_atoms)
    np.testing.assert_allclose(logits, ref_logits, rtol=1e-5, atol=1e-5 * np.abs(ref_logits).max())
    fd = finite_difference(lay, p0, obs, dl.astype(np.float64),
                           **{**parts, "depth": [x[:GRAD_ROWS] for x in parts.get("depth", [])] or None})
    np.testing.assert_allclose(grads, fd, rtol=1e-4, atol=2e-5 * np.abs(fd).max())
    for e in lay.entries:  # every entry takes a gradient
        assert np.abs(grads[e.offset : e.stop]).max() > 0, e.name


def test_read_only_networks_keep_the_vectors_and_every_block(stream, stager, rng):
    """A target or acting network (iters 0, no depth=): sigma = v^T W u of the vectors as they are, which keep their
    bits, and every residual block kept (d = 1)."""
    lay = ParamLayout.build(OBS, BOTH)
    p0 = random_params(lay, rng)
    obs = rng.standard_normal((ROWS, OBS)).astype(np.float32)
    dl = rng.standard_normal((GRAD_ROWS, N_HEADS, lay.n_atoms)).astype(np.float32)
    vectors, p = init_vectors(lay, 2), lay.unpack(p0)
    for k, (u, v) in enumerate(vector_views(lay, vectors)):  # warmed up, as the learner leaves them
        u[:], v[:] = reference.spectral_power64(p[f"trunk.{k}.weight"], u, v, 3)[:2]
    logits, _, after = run(stager, stream, lay, p0, obs, dl, dense="strided", vectors=vectors)
    np.testing.assert_array_equal(after, vectors)
    uv = [(u.astype(np.float64), v.astype(np.float64)) for u, v in vector_views(lay, vectors)]
    _, head = reference.net_head64(lay.unpack(p0), lay.n_layers, obs, spectral=uv, residual=True)
    ref = reference.dueling64(head, lay.n_atoms)
    np.testing.assert_allclose(logits, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def test_network_refuses_mismatched_parts(stream, stager):
    spectral, depth, plain = (ParamLayout.build(OBS, c) for c in (SPECTRAL, DEPTH, PLAIN))
    key = SpectralKey(stager.upload_new(init_vectors(spectral, 0)), 1)
    state = state_at(stager, 0)
    with pytest.raises(ValueError, match="spectral="):
        Network(spectral, 4, stream=stream)
    with pytest.raises(ValueError, match="spectral="):
        Network(plain, 4, stream=stream, spectral=key)
    with pytest.raises(ValueError, match="residual layout"):
        Network(plain, 4, stream=stream, depth=StochasticDepth(0.3, state, 0))
    with pytest.raises(ValueError, match="dropout of a residual trunk"):
        Network(depth, 4, stream=stream, dropout=Dropout(0.2, state, 0))


def test_another_heads_gradient_enters_a_residual_trunk_unmasked(stream, stager, rng):
    """input_grad (the IQN head's gradient at the trunk's output) on a residual trunk: the output of a block is not
    a ReLU output, so the gradient goes in unmasked (layout.head_input_relu is False) and is backpropagated with
    the C51 head's; against the finite differences of J + sum(dinput * x_L)."""
    lay = ParamLayout.build(OBS, BOTH)
    assert not lay.head_input_relu
    p0 = random_params(lay, rng)
    obs = rng.standard_normal((ROWS, OBS)).astype(np.float32)
    dl = rng.standard_normal((GRAD_ROWS, N_HEADS, lay.n_atoms)).astype(np.float32)
    dinput = rng.standard_normal((GRAD_ROWS, lay.hidden)).astype(np.float32)
    vectors = init_vectors(lay, 1)
    _, grads, after = run(stager, stream, lay, p0, obs, dl, dense="strided", vectors=vectors, iters=1,
                          depth=StochasticDepth(0.5, state_at(stager, STEP), SEED), dinput=dinput)
    uv = [(u.astype(np.float64), v.astype(np.float64)) for u, v in vector_views(lay, after)]
    d = [reference.depth_factors64(GRAD_ROWS, seed=SEED, step=STEP, layer=k, rate=drop_rate(0.5, k, lay.n_layers))
         for k in range(1, lay.n_layers)]
    fd = finite_difference(lay, p0, obs, dl.astype(np.float64), dinput.astype(np.float64), spectral=uv,
                           residual=True, depth=d)
    np.testing.assert_allclose(grads, fd, rtol=1e-4, atol=2e-5 * np.abs(fd).max())
