"""The variable-selection gate in the Network (agent/vsn.py): its groups from the observation layout, the layout's
checks and fingerprint, a zero gate as the identity, and the forward and backward of the whole network with the gate
on against a float64 forward and its central finite differences (tests/agent/test_trunk_parts.py's tolerances: the
float32 backward within 2e-5 of the largest gradient plus 1e-4 relative)."""

import numpy as np
import pytest
import reference

from fox_numba.actions import N_HEADS
from fox_numba.agent.network import Network, ParamLayout, init_params
from fox_numba.agent.spectral import SpectralKey, init_vectors, vector_views
from fox_numba.agent.vsn import check_groups, observation_groups
from fox_numba.config import FeatureConfig
from fox_numba.device.memory import device_zeros
from fox_numba.observation import column_names, obs_dim
from plain_learner import plain_network

OBS, ROWS, GRAD_ROWS = 7, 6, 4
GROUPS = ((0, 2), (2, 3), (3, 6), (6, 7))
LINEAR = plain_network(hidden=5, n_layers=0, n_atoms=3, vsn=True)
TRUNK = plain_network(hidden=5, n_layers=2, n_atoms=3, vsn=True)
SPECTRAL = plain_network(hidden=5, n_layers=2, n_atoms=3, vsn=True, spectral_norm=True)


def test_groups_follow_the_observation_layout():
    groups = observation_groups(FeatureConfig(tw_imbalance=False))  # the default adds a tw_imbalance group
    assert [(g.name, g.begin, g.end) for g in groups] == [
        ("ofi", 0, 12), ("trade", 12, 16), ("bar", 16, 32), ("history", 32, 128), ("portfolio", 128, 134)]
    prefixes = {"ofi": ("z.ofi_",), "trade": ("z.trade_", "z.log_volume", "z.log_trade_count"),
                "history": ("ema",), "tw_imbalance": ("z.tw_imbalance_", "ema"), "forecast": ("forecast.",),
                "portfolio": ("port.",)}
    for features, kinds in (
        (FeatureConfig(tw_imbalance=False, forecast_horizons=[5, 15]),
         ["ofi", "trade", "bar", "history", "forecast", "portfolio"]),
        (FeatureConfig(tw_imbalance=True), ["ofi", "trade", "bar", "history", "tw_imbalance", "portfolio"]),
        (FeatureConfig(tw_imbalance=True, forecast_horizons=[5]),
         ["ofi", "trade", "bar", "history", "tw_imbalance", "forecast", "portfolio"]),
    ):
        names = column_names(features)
        groups = observation_groups(features)
        assert [g.name for g in groups] == kinds
        for g in groups:  # every column of a group is the group's kind, by its name in observation.py
            for name in names[g.begin : g.end]:
                if g.name == "bar":
                    assert name.startswith("z.") and not name.startswith(prefixes["ofi"] + prefixes["trade"]), name
                else:
                    assert name.startswith(prefixes[g.name]), (g.name, name)
                assert ("tw_imbalance" in name) == (g.name == "tw_imbalance"), (g.name, name)
        check_groups(tuple((g.begin, g.end) for g in groups), len(names))
        layout = ParamLayout.build(len(names), plain_network(n_atoms=3, vsn=True), features=features)
        assert layout.vsn_groups == tuple((g.begin, g.end) for g in groups)
    tw = observation_groups(FeatureConfig(tw_imbalance=True))
    assert (tw[4].begin, tw[4].end, tw[-1].end) == (128, 176, 182)


def test_layout_checks_and_fingerprints():
    plain = ParamLayout.build(OBS, plain_network(hidden=5, n_layers=2, n_atoms=3))
    vsn = ParamLayout.build(OBS, TRUNK, vsn_groups=GROUPS)
    other = ParamLayout.build(OBS, TRUNK, vsn_groups=((0, 3), (3, 6), (6, 7)))
    assert not plain.vsn and plain.vsn_groups == () and vsn.vsn and vsn.vsn_groups == GROUPS
    assert vsn.entries[: len(plain.entries)] == plain.entries and vsn.size > plain.size  # the gate comes last
    assert [e.name for e in vsn.entries[len(plain.entries) :]] == ["vsn.weight", "vsn.bias"]
    assert vsn.entry("vsn.weight").shape == (OBS, 4) and vsn.entry("vsn.weight").decay
    assert not vsn.entry("vsn.bias").decay
    assert len({plain.fingerprint, vsn.fingerprint, other.fingerprint}) == 3
    iqn = ParamLayout.build(OBS, plain_network(**{**vars(TRUNK), "iqn_quantiles": 4}), vsn_groups=GROUPS)
    names = [e.name for e in iqn.entries]
    assert names[: len(vsn.entries)] == [e.name for e in vsn.entries] and names[-1] == "iqn.head.bias"  # IQN last
    real = ParamLayout.build(obs_dim(FeatureConfig()), plain_network(vsn=True))  # the default observation's groups
    assert real.vsn_groups == tuple((g.begin, g.end) for g in observation_groups(FeatureConfig()))
    p = init_params(real, 5)
    assert not p[real.entry("vsn.weight").offset : real.entry("vsn.bias").stop].any()  # a uniform gate at start
    for cfg, groups, match in (
        (TRUNK, None, "needs explicit vsn_groups"),
        (TRUNK, ((0, 3), (4, 7)), "must be 2 .. 16"),
        (TRUNK, ((0, 7),), "must be 2 .. 16"),
        (TRUNK, ((0, 3), (3, 6)), "must be 2 .. 16"),
        (plain_network(n_layers=0, vsn=True, iqn_quantiles=8), GROUPS, "needs a trunk"),
    ):
        with pytest.raises(ValueError, match=match):
            ParamLayout.build(OBS, cfg, vsn_groups=groups)


def random_params(lay, rng):
    """init_params with nonzero biases and a nonzero gate (its init is 0)."""
    p0 = init_params(lay, 3)
    for e in lay.entries:
        if not e.decay or e.name.startswith("vsn."):
            p0[e.offset : e.stop] = rng.uniform(-0.5, 0.5, e.size)
    return p0


def run(stager, stream, lay, p0, obs, dl, *, dense, vectors=None, iters=0):
    """(logits, grads, the network) of one forward over ROWS rows and a backward over GRAD_ROWS."""
    spectral = SpectralKey(stager.upload_new(vectors), iters) if vectors is not None else None
    net = Network(lay, ROWS, stream=stream, grad_rows=GRAD_ROWS, dense=dense, spectral=spectral)
    params = stager.upload_new(p0)
    logits = stager.upload_new(np.full((ROWS, N_HEADS, lay.n_atoms), np.nan, np.float32))
    grads = device_zeros(lay.size, np.float32, stream=stream)
    net.forward(params, stager.upload_new(obs), logits, stream=stream)
    net.backward(params, stager.upload_new(dl), grads, stream=stream)
    return stager.download(logits), stager.download(grads), net


def objective64(lay, flat, obs, dl, spectral):
    p = lay.unpack(flat)
    _, gated = reference.vsn_forward64(p, obs, GROUPS)
    _, head = reference.net_head64(p, lay.n_layers, gated, spectral=spectral)
    return float(np.sum(dl * reference.dueling64(head, lay.n_atoms)))


@pytest.mark.parametrize("dense, cfg", [("strided", LINEAR), ("strided", TRUNK), ("strided", SPECTRAL),
                                        ("tiled", TRUNK)])
def test_forward_and_backward_against_finite_differences(stream, stager, rng, dense, cfg):
    """The logits of all rows, the gate weights and the gradient of every entry (the gate's included) over the first
    GRAD_ROWS rows against float64 (spectral: one power iteration, the vectors then held constant)."""
    lay = ParamLayout.build(OBS, cfg, vsn_groups=GROUPS)
    p0 = random_params(lay, rng)
    obs = rng.standard_normal((ROWS, OBS)).astype(np.float32)
    dl = rng.standard_normal((GRAD_ROWS, N_HEADS, lay.n_atoms)).astype(np.float32)
    vectors = init_vectors(lay, 11) if lay.spectral_norm else None
    logits, grads, net = run(stager, stream, lay, p0, obs, dl, dense=dense, vectors=vectors, iters=1)
    p = lay.unpack(p0)
    uv = None
    if lay.spectral_norm:
        uv = [reference.spectral_power64(p[f"trunk.{k}.weight"], u, v, 1)[:2]
              for k, (u, v) in enumerate(vector_views(lay, vectors))]
    w, gated = reference.vsn_forward64(p, obs, GROUPS)
    np.testing.assert_allclose(stager.download(net.vsn.weights), w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(stager.download(net.vsn.gated), gated, rtol=1e-5, atol=1e-6)
    _, head = reference.net_head64(p, lay.n_layers, gated, spectral=uv)
    ref_logits = reference.dueling64(head, lay.n_atoms)
    np.testing.assert_allclose(logits, ref_logits, rtol=1e-5, atol=1e-5 * np.abs(ref_logits).max())
    dl64 = dl.astype(np.float64)
    fd = reference.central_differences64(lambda f: objective64(lay, f, obs[:GRAD_ROWS], dl64, uv),
                                         p0.astype(np.float64), lay.entries)  # fmt: skip
    np.testing.assert_allclose(grads, fd, rtol=1e-4, atol=2e-5 * np.abs(fd).max())
    for e in lay.entries:  # every entry takes a gradient
        assert np.abs(grads[e.offset : e.stop]).max() > 0, e.name


@pytest.mark.parametrize("cfg", [LINEAR, TRUNK])
def test_a_zero_gate_is_the_identity(stream, stager, rng, cfg):
    """With the gate at its initial 0 (K = 4: K * 1/4 is exactly 1) the logits and the shared entries' gradients are
    the plain network's, bit for bit."""
    lay = ParamLayout.build(OBS, cfg, vsn_groups=GROUPS)
    plain = ParamLayout.build(OBS, plain_network(**{**vars(cfg), "vsn": False}))
    p0 = random_params(lay, rng)
    p0[lay.entry("vsn.weight").offset : lay.entry("vsn.bias").stop] = 0.0
    obs = rng.standard_normal((ROWS, OBS)).astype(np.float32)
    dl = rng.standard_normal((GRAD_ROWS, N_HEADS, lay.n_atoms)).astype(np.float32)
    logits, grads, _ = run(stager, stream, lay, p0, obs, dl, dense="strided")
    logits_plain, grads_plain, _ = run(stager, stream, plain, p0[: plain.size], obs, dl, dense="strided")
    np.testing.assert_array_equal(logits, logits_plain)
    np.testing.assert_array_equal(grads[: plain.size], grads_plain)
