"""The parameter layout, the seeded initialisation, and the network's forward and backward.

The backward of the whole network (trunk, head GEMM, dueling combine) is checked against float64 central
finite differences of a float64 forward on a tiny net: the gradient of J = sum(dl * logits) with a random
dl. Tolerance: the float32 backward within 2e-5 of the largest gradient plus 1e-4 relative (its chains are a
few dozen float32 roundings of terms no larger than the largest gradient), the float64 differences exact to
~1e-9 (J is piecewise polynomial and no ReLU kink lies within h = 1e-6 of these inputs). A dropped term,
a wrong transpose or a missing mask moves a gradient by a whole term, 1e2-1e4 times the tolerance.
"""

import math

import numpy as np
import pytest
import reference

from fox_numba.actions import N_HEADS
from fox_numba.agent.network import ALIGN, Dropout, Network, ParamLayout, init_params
from fox_numba.device.memory import device_zeros
from fox_numba.kernels.heads import head_width
from plain_learner import plain_network

TINY = plain_network(hidden=5, n_layers=2, n_atoms=3)
LINEAR = plain_network(hidden=5, n_layers=0, n_atoms=3)  # the default: the head reads the observation
OBS = 3


def test_layout_table():
    lay = ParamLayout.build(OBS, TINY)
    names = [e.name for e in lay.entries]
    assert names == ["trunk.0.weight", "trunk.0.bias", "trunk.1.weight", "trunk.1.bias", "head.weight", "head.bias"]
    shapes = [e.shape for e in lay.entries]
    assert shapes == [(3, 5), (5,), (5, 5), (5,), (5, head_width(3)), (head_width(3),)]
    assert [e.decay for e in lay.entries] == [True, False, True, False, True, False]
    assert all(e.offset % ALIGN == 0 for e in lay.entries)
    assert all(a.stop <= b.offset for a, b in zip(lay.entries, lay.entries[1:], strict=False))
    assert lay.size % ALIGN == 0 and lay.size >= lay.entries[-1].stop
    mask = lay.decay_mask()
    for e in lay.entries:
        assert np.all(mask[e.offset : e.stop] == float(e.decay))
    assert mask.sum() == sum(e.size for e in lay.entries if e.decay)
    assert lay.layer(2) == (lay.entry("head.weight"), lay.entry("head.bias"))
    with pytest.raises(KeyError, match="no entry"):
        lay.entry("trunk.7.weight")
    assert "head.weight" in lay.markdown()


def test_layout_fingerprint():
    a, b = ParamLayout.build(OBS, TINY), ParamLayout.build(OBS, TINY)
    assert a.fingerprint == b.fingerprint and len(a.fingerprint) == 16
    others = [
        ParamLayout.build(OBS + 1, TINY),
        ParamLayout.build(OBS, plain_network(hidden=6, n_layers=2, n_atoms=3)),
        ParamLayout.build(OBS, plain_network(hidden=5, n_layers=1, n_atoms=3)),
        ParamLayout.build(OBS, plain_network(hidden=5, n_layers=2, n_atoms=5)),
    ]
    assert len({a.fingerprint} | {o.fingerprint for o in others}) == 5
    default = ParamLayout.build(134, plain_network())
    assert [e.name for e in default.entries] == ["head.weight", "head.bias"]  # linear: the head reads the obs
    assert default.entry("head.weight").shape == (134, 17 * 51 + 1)  # the streams, then the forecast


def test_init_is_seeded_and_scaled():
    lay = ParamLayout.build(OBS, plain_network(hidden=64, n_layers=2, n_atoms=11))
    p0, p1, p2 = init_params(lay, 7), init_params(lay, 7), init_params(lay, 8)
    assert p0.dtype == np.float32 and p0.shape == (lay.size,)
    np.testing.assert_array_equal(p0, p1)
    assert not np.array_equal(p0, p2)
    unpacked = lay.unpack(p0)
    gaps = np.ones(lay.size, bool)
    for e in lay.entries:
        gaps[e.offset : e.stop] = False
        w = unpacked[e.name]
        if not e.decay:
            assert not w.any()  # biases start at 0
            continue
        fan_in, fan_out = e.shape
        bound = math.sqrt(6 / (fan_in + fan_out)) if e.name.startswith("head") else math.sqrt(6 / fan_in)
        assert np.abs(w).max() <= bound and np.abs(w).max() > 0.9 * bound
        assert abs(w.mean()) < 0.1 * bound
    assert not p0[gaps].any()


def test_head_init_scale_scales_the_heads_alone():
    """network.head_init_scale multiplies the heads' draws (C51 and mean head here) and leaves the trunk's."""
    cfg = plain_network(hidden=8, n_layers=1, n_atoms=5)
    cfg.mean_head = True
    lay = ParamLayout.build(OBS, cfg)
    one, part, zero = (lay.unpack(init_params(lay, 3, scale)) for scale in (1.0, 0.25, 0.0))
    heads = [e.name for e in lay.entries if e.decay and e.name.startswith(("head.", "mean.head."))]
    assert len(heads) == 2
    for e in lay.entries:
        if e.name in heads:
            np.testing.assert_allclose(part[e.name], 0.25 * one[e.name].astype(np.float64), rtol=1e-6)
            assert not zero[e.name].any() and one[e.name].any()
        else:
            np.testing.assert_array_equal(part[e.name], one[e.name])
            np.testing.assert_array_equal(zero[e.name], one[e.name])


def forward_backward(stager, stream, lay, p0, obs, dl, dense, grad_rows=None, daux=None):
    """(logits, grads, net) of one forward and backward; `daux` [grad_rows] goes into the forecast column of
    dhead first, as the learner's aux loss writes it (the column stays 0 without it)."""
    b = obs.shape[0]
    net = Network(lay, b, stream=stream, grad_rows=grad_rows, dense=dense)
    params = stager.upload_new(p0)
    logits = stager.upload_new(np.full((b, N_HEADS, lay.n_atoms), np.nan, np.float32))
    grads = device_zeros(lay.size, np.float32, stream=stream)
    net.forward(params, stager.upload_new(obs), logits, stream=stream)
    if daux is not None:
        dhead = np.full(net.dhead.shape, np.nan, np.float32)  # the combine's backward writes the streams
        dhead[:, net.aux_column] = daux
        stager.upload(dhead, net.dhead)
    net.backward(params, stager.upload_new(dl), grads, stream=stream)
    return stager.download(logits), stager.download(grads), net


def finite_difference(lay, p0, obs, dl, daux, h=1e-6, keep=None):
    """Central differences of J = sum(dl * logits) + sum(daux * forecast) in float64, for every parameter
    (`keep`: fixed dropout factors per hidden layer)."""
    flat = p0.astype(np.float64)

    def objective(f):
        _, head = reference.net_head64(lay.unpack(f), lay.n_layers, obs, keep)
        return float(np.sum(dl * reference.dueling64(head, lay.n_atoms)) + np.sum(daux * head[:, -1]))

    return reference.central_differences64(objective, flat, lay.entries, eps=h)


@pytest.mark.parametrize("dense, cfg", [("strided", TINY), ("tiled", TINY), ("tiled", LINEAR), ("strided", LINEAR)])
def test_backward_against_finite_differences(stream, stager, rng, dense, cfg):
    lay = ParamLayout.build(OBS, cfg)
    p0 = init_params(lay, 3)
    for e in lay.entries:
        if not e.decay:
            p0[e.offset : e.stop] = rng.uniform(-0.2, 0.2, e.size)  # nonzero biases too
    obs = rng.standard_normal((6, OBS)).astype(np.float32)
    dl = rng.standard_normal((6, N_HEADS, lay.n_atoms)).astype(np.float32)
    daux = rng.standard_normal(6).astype(np.float32)
    logits, grads, _ = forward_backward(stager, stream, lay, p0, obs, dl, dense, daux=daux)

    acts, ref_logits = reference.net_forward64(lay.unpack(p0), lay.n_layers, obs, lay.n_atoms)
    np.testing.assert_allclose(logits, ref_logits, rtol=1e-5, atol=1e-5 * np.abs(ref_logits).max())
    assert all((a > 0).any() and (a == 0).any() for a in acts)  # the masks matter
    fd = finite_difference(lay, p0, obs, dl.astype(np.float64), daux.astype(np.float64))
    np.testing.assert_allclose(grads, fd, rtol=1e-4, atol=2e-5 * np.abs(fd).max())
    analytic = reference.net_backward64(lay.unpack(p0), lay.n_layers, obs, acts, dl, daux)
    for name, g in analytic.items():  # the float64 backward reference agrees with the differences
        e = lay.entry(name)
        np.testing.assert_allclose(g.reshape(-1), fd[e.offset : e.stop], rtol=1e-6, atol=1e-7 * np.abs(fd).max())
    gaps = np.ones(lay.size, bool)
    for e in lay.entries:
        gaps[e.offset : e.stop] = False
    assert not grads[gaps].any()


def test_dropout_forward_and_backward_follow_the_reference(stream, stager, rng):
    """With dropout 0.4 at step 9: the logits and every gradient of the first 4 of 6 rows against the float64
    network under the kernel's mask (reference.dropout_keep64), itself checked by finite differences."""
    from fox_numba.kernels.optim import OPTIM_STATE_DTYPE

    lay = ParamLayout.build(OBS, TINY)
    p0 = init_params(lay, 5)
    for name in ("trunk.0.bias", "trunk.1.bias"):  # a row whose every unit is dropped sits at b, off the kink
        p0[lay.entry(name).offset : lay.entry(name).stop] = 0.1
    obs = rng.standard_normal((6, OBS)).astype(np.float32)
    dl = rng.standard_normal((4, N_HEADS, lay.n_atoms)).astype(np.float32)
    state = np.zeros(1, OPTIM_STATE_DTYPE)
    state[0]["step"] = 9
    drop = Dropout(0.4, stager.upload_new(state), 3)
    net = Network(lay, 6, stream=stream, grad_rows=4, dense="strided", dropout=drop)
    params = stager.upload_new(p0)
    logits = stager.upload_new(np.zeros((6, N_HEADS, lay.n_atoms), np.float32))
    grads = device_zeros(lay.size, np.float32, stream=stream)
    net.forward(params, stager.upload_new(obs), logits, stream=stream)
    net.backward(params, stager.upload_new(dl), grads, stream=stream)
    keep = [reference.dropout_keep64(6, TINY.hidden, seed=3, step=9, layer=k, rate=0.4) for k in range(2)]
    assert all((k == 0).any() and (k > 0).any() for k in keep)
    acts, ref_logits = reference.net_forward64(lay.unpack(p0), 2, obs, lay.n_atoms, keep)
    np.testing.assert_allclose(stager.download(logits), ref_logits, rtol=1e-5, atol=1e-5 * np.abs(ref_logits).max())
    ref = reference.net_backward64(lay.unpack(p0), 2, obs[:4], [a[:4] for a in acts], dl.astype(np.float64),
                                   keep=[k[:4] for k in keep])  # fmt: skip
    fd = finite_difference(lay, p0, obs[:4], dl.astype(np.float64), np.zeros(4), keep=[k[:4] for k in keep])
    got = stager.download(grads)
    for name, g in ref.items():
        e = lay.entry(name)
        np.testing.assert_allclose(g.reshape(-1), fd[e.offset : e.stop], rtol=1e-6, atol=1e-7 * np.abs(fd).max())
        np.testing.assert_allclose(got[e.offset : e.stop], g.reshape(-1), rtol=1e-4, atol=2e-5 * np.abs(g).max())


def test_backward_reads_the_first_grad_rows(stream, stager, rng):
    """A forward over 2B rows and a backward over the first B (the learner's s and s' batch)."""
    lay = ParamLayout.build(OBS, plain_network(hidden=4, n_layers=1, n_atoms=5))
    p0 = init_params(lay, 11)
    obs = rng.standard_normal((8, OBS)).astype(np.float32)
    dl = rng.standard_normal((4, N_HEADS, 5)).astype(np.float32)
    _, grads, net = forward_backward(stager, stream, lay, p0, obs, dl, "strided", grad_rows=4)
    acts, _ = reference.net_forward64(lay.unpack(p0), 1, obs[:4], 5)
    ref = reference.net_backward64(lay.unpack(p0), 1, obs[:4], acts, dl)
    for name, g in ref.items():
        e = lay.entry(name)
        np.testing.assert_allclose(grads[e.offset : e.stop], g.reshape(-1), rtol=1e-5, atol=1e-6 * np.abs(g).max())
    assert net.activations.shape == (1, 8, 4)


def test_strided_and_tiled_networks_give_the_same_bits(stream, stager, rng):
    lay = ParamLayout.build(OBS, TINY)
    p0 = init_params(lay, 5)
    obs = rng.standard_normal((7, OBS)).astype(np.float32)
    dl = rng.standard_normal((7, N_HEADS, lay.n_atoms)).astype(np.float32)
    a = forward_backward(stager, stream, lay, p0, obs, dl, "strided")
    b = forward_backward(stager, stream, lay, p0, obs, dl, "tiled")
    np.testing.assert_array_equal(a[0].view(np.uint32), b[0].view(np.uint32))
    np.testing.assert_array_equal(a[1].view(np.uint32), b[1].view(np.uint32))


def test_network_checks(stream, stager):
    lay = ParamLayout.build(OBS, TINY)
    with pytest.raises(ValueError, match="grad_rows"):
        Network(lay, 4, stream=stream, grad_rows=5)
    with pytest.raises(ValueError, match="dense"):
        Network(lay, 4, stream=stream, dense="fast")
    net = Network(lay, 4, stream=stream)
    params = stager.upload_new(init_params(lay, 0))
    with pytest.raises(RuntimeError, match="forward first"):
        net.backward(params, stager.upload_new(np.zeros((4, N_HEADS, 3), np.float32)), params, stream=stream)
    with pytest.raises(ValueError, match="obs"):
        net.forward(params, stager.upload_new(np.zeros((4, OBS + 1), np.float32)),
                    stager.upload_new(np.zeros((4, N_HEADS, 3), np.float32)), stream=stream)
    with pytest.raises(ValueError):
        ParamLayout.build(0, TINY)
