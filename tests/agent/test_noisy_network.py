"""NoisyNet heads in the network (network.noisy_sigma0): the layout's sigma entries and their initialisation, the
noisy forward and backward against the float64 network on the effective weights, and mu alone without noise.

Tolerances as tests/agent/test_network.py's reference comparisons.
"""

import math

import numpy as np
import pytest
import reference

from fox_numba.actions import N_HEADS
from fox_numba.agent.network import Network, ParamLayout, init_params
from fox_numba.agent.noisy import BIAS_SIGMA, WEIGHT_SIGMA, NoiseKey
from fox_numba.device.memory import device_zeros
from fox_numba.kernels.heads import N_STREAMS
from plain_learner import plain_network

OBS, B = 3, 4
NOISY = plain_network(hidden=5, n_layers=1, n_atoms=3, noisy_sigma0=0.5)
PLAIN = plain_network(hidden=5, n_layers=1, n_atoms=3)


def test_layout_adds_sigma_after_the_head_and_keeps_the_plain_prefix():
    noisy, plain = ParamLayout.build(OBS, NOISY), ParamLayout.build(OBS, PLAIN)
    assert noisy.entries[: len(plain.entries)] == plain.entries and not plain.noisy and noisy.noisy
    w, b = noisy.entry(WEIGHT_SIGMA), noisy.entry(BIAS_SIGMA)
    assert w.shape == noisy.entry("head.weight").shape and b.shape == noisy.entry("head.bias").shape
    assert not w.decay and not b.decay and noisy.fingerprint != plain.fingerprint
    flat = init_params(noisy, 5)
    np.testing.assert_array_equal(flat[: plain.size], init_params(plain, 5))  # mu as the plain network's
    sig = noisy.unpack(flat)
    z = N_STREAMS * NOISY.n_atoms
    np.testing.assert_array_equal(sig[WEIGHT_SIGMA][:, :z], np.float32(0.5 / math.sqrt(5)))
    np.testing.assert_array_equal(sig[BIAS_SIGMA][:z], np.float32(0.5 / math.sqrt(5)))
    assert (sig[WEIGHT_SIGMA][:, z:] == 0).all() and (sig[BIAS_SIGMA][z:] == 0).all()  # the forecast column
    with pytest.raises(ValueError, match="noisy_sigma0 >= 0"):
        ParamLayout.build(OBS, plain_network(noisy_sigma0=-0.1))


def test_noisy_forward_and_backward_follow_the_reference(stream, stager, rng):
    lay = ParamLayout.build(OBS, NOISY)
    flat = init_params(lay, 2)
    s = lay.entry(WEIGHT_SIGMA)
    flat[s.offset : s.stop] *= rng.uniform(0.5, 1.5, s.size).astype(np.float32)  # sigma not all alike
    params = stager.upload_new(flat)
    counter = stager.upload_new(np.array([3], np.int64))
    net = Network(lay, B, stream=stream, noise=NoiseKey(counter, 11, 0))
    obs = rng.standard_normal((B, OBS)).astype(np.float32)
    logits = stager.upload_new(np.full((B, N_HEADS, lay.n_atoms), np.nan, np.float32))
    net.forward(params, stager.upload_new(obs), logits, stream=stream)
    p = lay.unpack(flat)
    f_in, f_out = reference.noisy_factors64(stager.download(net.noisy.f_eps), lay.hidden, lay.n_atoms)
    assert np.abs(f_out).max() > 0.1
    eff = dict(p)
    eff["head.weight"] = p["head.weight"] + p[WEIGHT_SIGMA].astype(np.float64) * f_in * f_out
    eff["head.bias"] = p["head.bias"] + p[BIAS_SIGMA].astype(np.float64) * f_out
    acts, ref = reference.net_forward64(eff, lay.n_layers, obs, lay.n_atoms)
    np.testing.assert_allclose(stager.download(logits), ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())

    dl = rng.standard_normal((B, N_HEADS, lay.n_atoms)).astype(np.float32)
    grads = device_zeros(lay.size, np.float32, stream=stream)
    net.backward(params, stager.upload_new(dl), grads, stream=stream)
    want = reference.net_backward64(eff, lay.n_layers, obs, acts, dl)
    want[WEIGHT_SIGMA] = want["head.weight"] * f_in * f_out
    want[BIAS_SIGMA] = want["head.bias"] * f_out
    got = lay.unpack(stager.download(grads))
    for name, g in want.items():
        np.testing.assert_allclose(got[name], g, rtol=1e-4, atol=2e-5 * np.abs(g).max(), err_msg=name)

    plain = Network(lay, B, stream=stream)  # noise off: the head reads mu alone
    plain.forward(params, stager.upload_new(obs), logits, stream=stream)
    _, ref_mu = reference.net_forward64(p, lay.n_layers, obs, lay.n_atoms)
    np.testing.assert_allclose(stager.download(logits), ref_mu, rtol=1e-5, atol=1e-5 * np.abs(ref_mu).max())
    with pytest.raises(RuntimeError, match="needs noise="):
        plain.backward(params, stager.upload_new(dl), grads, stream=stream)
    with pytest.raises(ValueError, match="noisy layout"):
        Network(ParamLayout.build(OBS, PLAIN), B, stream=stream, noise=NoiseKey(counter, 11, 0))
