"""Mixture-of-experts heads in the Network (agent/moe.py): the layout's entries, checks, fingerprint and initialisation;
the forward and backward of the whole network (with and without a trunk, with the VSN gate) against a float64 forward
and its central finite differences, the load-balancing term included; acting networks compute the same mixture.
Tolerances as tests/agent/test_vsn.py: the float32 backward within 2e-5 of the largest gradient plus 1e-4 relative."""

import math
import subprocess
import sys

import numpy as np
import pytest
import reference

from fox_numba.actions import N_BRANCHES, N_HEADS
from fox_numba.agent.network import Network, ParamLayout, init_params
from fox_numba.config import load_config
from fox_numba.device.isv import Isv, bootstrap_values
from fox_numba.device.memory import device_zeros
from fox_numba.errors import ConfigError
from fox_numba.kernels.heads import head_width
from plain_learner import plain_network

OBS, ROWS, GRAD_ROWS, K, Z = 7, 6, 4, 2, 3
HW = head_width(Z)
VSN_GROUPS = ((0, 2), (2, 3), (3, 6), (6, 7))
LINEAR = plain_network(hidden=5, n_layers=0, n_atoms=Z, moe_experts=K)
TRUNK = plain_network(hidden=5, n_layers=2, n_atoms=Z, moe_experts=K)
LINEAR_VSN = plain_network(hidden=5, n_layers=0, n_atoms=Z, moe_experts=K, vsn=True)
TRUNK_VSN = plain_network(hidden=5, n_layers=1, n_atoms=Z, moe_experts=3, vsn=True)
LAMBDA = 0.3


def build(cfg):
    return ParamLayout.build(OBS, cfg, vsn_groups=VSN_GROUPS if cfg.vsn else None)


def test_layout_entries_checks_and_fingerprints():
    plain = ParamLayout.build(OBS, plain_network(hidden=5, n_layers=2, n_atoms=Z))
    moe = build(TRUNK)
    three = build(plain_network(**{**vars(TRUNK), "moe_experts": 3}))
    assert not plain.moe and moe.moe and moe.moe_experts == K
    assert [e.name for e in moe.entries] == [e.name for e in plain.entries] + ["moe.weight", "moe.bias"]
    assert moe.entry("head.weight").shape == (5, K * HW) and moe.entry("head.bias").shape == (K * HW,)
    assert moe.entry("moe.weight").shape == (5, N_BRANCHES * K) and moe.entry("moe.weight").decay
    assert not moe.entry("moe.bias").decay
    assert len({plain.fingerprint, moe.fingerprint, three.fingerprint}) == 3
    iqn = build(plain_network(**{**vars(TRUNK), "iqn_quantiles": 4}))
    assert [e.name for e in iqn.entries][-1] == "iqn.head.bias"  # IQN after the gate
    for k, match in ((1, "0 \\(off\\) or 2 .. 8"), (9, "0 \\(off\\) or 2 .. 8"), (-1, "0 \\(off\\) or 2 .. 8")):
        with pytest.raises(ConfigError, match=match):
            build(plain_network(**{**vars(TRUNK), "moe_experts": k}))
    with pytest.raises(ConfigError, match="NoisyNet") as err:
        build(plain_network(**{**vars(TRUNK), "noisy_sigma0": 0.5}))
    assert "\n" not in str(err.value)


def test_init_draws_each_expert_as_one_head_and_a_uniform_gate():
    lay = build(TRUNK)
    p = lay.unpack(init_params(lay, 5))
    assert not p["moe.weight"].any() and not p["moe.bias"].any()
    experts = p["head.weight"].reshape(5, K, HW)
    bound = math.sqrt(6.0 / (5 + HW))  # Xavier with one head's fan-out, per expert
    assert np.abs(experts).max() <= bound and np.abs(experts).max() > 0.9 * bound
    assert not np.array_equal(experts[:, 0], experts[:, 1])  # the experts differ: the gate can route
    plain = ParamLayout.build(OBS, plain_network(hidden=5, n_layers=2, n_atoms=Z))
    np.testing.assert_array_equal(init_params(plain, 5)[: plain.entry("head.weight").offset],
                                  init_params(lay, 5)[: lay.entry("head.weight").offset])  # the trunk is the plain one


def test_zero_started_experts_get_a_drawn_gate():
    """With the heads at zero (network.head_init_scale = 0) the K experts are equal: a uniform gate would give each
    1/K of the same gradient and keep them equal for good, so the gate's weight is drawn as a trunk layer's
    (uniform within sqrt(6 / H)), its bias 0; everything else as the single head's zero start."""
    lay = build(TRUNK)
    p = lay.unpack(init_params(lay, 5, head_scale=0.0))
    assert not p["head.weight"].any() and not p["head.bias"].any() and not p["moe.bias"].any()
    gate, bound = p["moe.weight"], math.sqrt(6.0 / lay.entry("moe.weight").shape[0])
    assert np.abs(gate).max() <= bound and np.abs(gate).max() > 0.5 * bound
    assert len({tuple(gate[:, k]) for k in range(gate.shape[1])}) == gate.shape[1]  # every expert routed apart
    drawn = lay.unpack(init_params(lay, 5))
    assert not drawn["moe.weight"].any()  # drawn experts keep the uniform gate
    np.testing.assert_array_equal(init_params(lay, 5, head_scale=0.0)[: lay.entry("head.weight").offset],
                                  init_params(lay, 5)[: lay.entry("head.weight").offset])  # the trunk as before


def random_params(lay, rng):
    """init_params with nonzero biases and a nonzero gate (its init is 0)."""
    p0 = init_params(lay, 3)
    for e in lay.entries:
        if not e.decay or e.name.startswith(("vsn.", "moe.")):
            p0[e.offset : e.stop] = rng.uniform(-0.8, 0.8, e.size)
    return p0


def moe_isv(stager):
    isv0 = bootstrap_values()
    isv0[Isv.MOE_LAMBDA_EFF] = LAMBDA
    return stager.upload_new(isv0)


def run(stager, stream, lay, p0, obs, dl, *, dense, isv):
    """(logits, grads, the network) of one forward over ROWS rows and a backward over GRAD_ROWS."""
    net = Network(lay, ROWS, stream=stream, grad_rows=GRAD_ROWS, dense=dense, isv=isv)
    params = stager.upload_new(p0)
    logits = stager.upload_new(np.full((ROWS, N_HEADS, lay.n_atoms), np.nan, np.float32))
    grads = device_zeros(lay.size, np.float32, stream=stream)
    net.forward(params, stager.upload_new(obs), logits, stream=stream)
    net.backward(params, stager.upload_new(dl), grads, stream=stream)
    return stager.download(logits), stager.download(grads), net


def forward64(lay, p, obs):
    """(gate weights [R, 4, K], experts' outputs, mixed head rows) of the network in float64."""
    x = reference.vsn_forward64(p, obs, VSN_GROUPS)[1] if lay.vsn else obs
    acts, _ = reference.net_head64(p, lay.n_layers, x)
    return reference.moe_forward64(p, acts[-1] if acts else x, lay.moe_experts, lay.n_atoms)


def objective64(lay, flat, obs, dl):
    """sum(dl * logits) + lambda sum_b K sum_k u_bk**2 over the GRAD_ROWS rows."""
    w, _, head = forward64(lay, lay.unpack(flat), obs)
    u, _ = reference.moe_usage64(w)
    return float(np.sum(dl * reference.dueling64(head, lay.n_atoms)) + LAMBDA * N_BRANCHES * reference.moe_balance64(u))


@pytest.mark.parametrize("dense, cfg", [("strided", LINEAR), ("strided", TRUNK), ("strided", LINEAR_VSN),
                                        ("strided", TRUNK_VSN), ("tiled", TRUNK)])
def test_forward_and_backward_against_finite_differences(stream, stager, rng, dense, cfg):
    """The logits of all rows, the gate weights, the usage of the GRAD_ROWS rows and the gradient of every entry
    (experts, gate, trunk, VSN gate) against float64."""
    lay = build(cfg)
    p0 = random_params(lay, rng)
    obs = rng.standard_normal((ROWS, OBS)).astype(np.float32)
    dl = rng.standard_normal((GRAD_ROWS, N_HEADS, lay.n_atoms)).astype(np.float32)
    logits, grads, net = run(stager, stream, lay, p0, obs, dl, dense=dense, isv=moe_isv(stager))
    w, _, head = forward64(lay, lay.unpack(p0), obs)
    np.testing.assert_allclose(stager.download(net.moe.gate), w.reshape(ROWS, -1), rtol=1e-5, atol=1e-6)
    u, h = reference.moe_usage64(w[:GRAD_ROWS])
    np.testing.assert_allclose(stager.download(net.moe.usage), np.concatenate([u.ravel(), h]), rtol=1e-5)
    ref_logits = reference.dueling64(head, lay.n_atoms)
    np.testing.assert_allclose(logits, ref_logits, rtol=1e-5, atol=1e-5 * np.abs(ref_logits).max())
    dl64 = dl.astype(np.float64)
    fd = reference.central_differences64(lambda f: objective64(lay, f, obs[:GRAD_ROWS], dl64), p0.astype(np.float64),
                                         lay.entries)  # fmt: skip
    np.testing.assert_allclose(grads, fd, rtol=1e-4, atol=2e-5 * np.abs(fd).max())
    for e in lay.entries:  # every entry takes a gradient
        assert np.abs(grads[e.offset : e.stop]).max() > 0, e.name


def test_the_auxiliary_column_is_the_experts_mean_and_splits_its_gradient(stream, stager, rng):
    """The forecast column (the learner's aux loss writes its dhead) reads the experts' mean: each expert's aux
    weights take 1/K of its gradient, the gate none of it."""
    lay = build(TRUNK)
    p0 = random_params(lay, rng)
    obs = rng.standard_normal((ROWS, OBS)).astype(np.float32)
    net = Network(lay, ROWS, stream=stream, grad_rows=GRAD_ROWS, dense="strided", isv=moe_isv(stager))
    params, grads = stager.upload_new(p0), device_zeros(lay.size, np.float32, stream=stream)
    logits = stager.upload_new(np.zeros((ROWS, N_HEADS, Z), np.float32))
    net.forward(params, stager.upload_new(obs), logits, stream=stream)
    daux = rng.standard_normal(GRAD_ROWS).astype(np.float32)
    dhead = np.zeros((GRAD_ROWS, HW), np.float32)
    dhead[:, -1] = daux
    stager.upload(dhead, net.dhead)
    zero = stager.upload_new(np.zeros((GRAD_ROWS, N_HEADS, Z), np.float32))
    stager.upload(bootstrap_values(), net.moe.isv)  # lambda: the base weight, the balance gradient is not 0
    net.backward(params, zero, grads, stream=stream)
    g = lay.unpack(stager.download(grads))
    x = stager.download(net.activations)[-1][:GRAD_ROWS].astype(np.float64)
    want = x.T @ daux / K
    for k in range(K):
        np.testing.assert_allclose(g["head.weight"][:, k * HW + HW - 1], want, rtol=1e-5, atol=1e-6)
        assert not g["head.weight"][:, k * HW : (k + 1) * HW - 1].any()  # no stream column took a gradient
    head_aux = stager.download(net.head_out)[:, -1]
    e = stager.download(net.moe.experts).reshape(ROWS, K, HW)[:, :, -1]
    np.testing.assert_allclose(head_aux, e.astype(np.float64).mean(axis=1), rtol=1e-6, atol=1e-6)


def test_acting_networks_compute_the_same_mixture(stream, stager, rng):
    """The collector's and evaluator's network (no ISV, one forward) gives the learner's online logits bit for bit."""
    lay = build(TRUNK)
    p0 = random_params(lay, rng)
    obs = stager.upload_new(rng.standard_normal((ROWS, OBS)).astype(np.float32))
    params = stager.upload_new(p0)
    out = []
    for isv in (moe_isv(stager), None):
        net = Network(lay, ROWS, stream=stream, grad_rows=GRAD_ROWS, dense="strided", isv=isv)
        logits = stager.upload_new(np.zeros((ROWS, N_HEADS, Z), np.float32))
        net.forward(params, obs, logits, stream=stream)
        out.append(stager.download(logits))
    np.testing.assert_array_equal(out[0], out[1])
    with pytest.raises(RuntimeError, match="isv="):
        net.backward(params, stager.upload_new(np.zeros((GRAD_ROWS, N_HEADS, Z), np.float32)),
                     device_zeros(lay.size, np.float32, stream=stream), stream=stream)


def test_the_config_refuses_other_sizes_as_it_resolves():
    """network.moe_experts is checked with the config (one line, before any run folder): 0 or 2 .. 8."""
    assert load_config(overrides=["network.moe_experts=8"]).network.moe_experts == 8
    for k in (1, 9, -2):
        with pytest.raises(ConfigError, match=f"network.moe_experts: {k} is not one of 0, 2, 3, 4, 5, 6, 7, 8"):
            load_config(overrides=[f"network.moe_experts={k}"])


def test_fox_train_refuses_a_bad_size_with_one_line_before_any_run_folder(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "fox_numba", "train", "--preset", "smoke", "--set",
                           "network.moe_experts=1", "--set", f'run.out_dir="{tmp_path}"'],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1
    assert proc.stderr.strip() == "fox: error: network.moe_experts: 1 is not one of 0, 2, 3, 4, 5, 6, 7, 8"
    assert not any(tmp_path.iterdir())
