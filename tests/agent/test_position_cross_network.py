"""network.position_cross in the Network: the layout's wider first layer, fingerprint and refusals, and the whole
forward (position x market -> the trunk or the linear head -> dueling logits) and every parameter's gradient
against the float64 reference (tests/reference.py: position_cross64, then net_forward64 / net_backward64).

Tolerances as tests/agent/test_network.py's: the logits within 1e-5 relative plus 1e-5 of the largest, the
gradients 1e-4 relative plus 2e-5 of the largest (a few dozen float32 roundings of terms no larger than it). A
crossed column read at the wrong position, or left out of the weight gradient, moves a logit or a gradient by a
whole term, 1e2-1e4 times the tolerance; the inputs put a different nonzero position in every row.
"""

import numpy as np
import pytest
import reference

from fox_numba.actions import N_HEADS
from fox_numba.agent.network import Network, ParamLayout, init_params
from fox_numba.device.memory import device_zeros
from fox_numba.errors import ConfigError
from fox_numba.observation import N_PORTFOLIO, OBS_DIM
from plain_learner import plain_network

MARKET = 4
OBS = MARKET + N_PORTFOLIO  # 4 market columns, then the portfolio part (its first column the position)
LINEAR = plain_network(hidden=5, n_layers=0, n_atoms=3, position_cross=True)
TRUNK = plain_network(hidden=5, n_layers=2, n_atoms=3, position_cross=True)


def test_layout_width_fingerprint_and_refusals():
    lay = ParamLayout.build(OBS, TRUNK)
    assert (lay.cross, lay.position_col, lay.in_dim) == (MARKET, MARKET, OBS + MARKET)
    assert lay.entry("trunk.0.weight").shape == (OBS + MARKET, 5)
    assert ParamLayout.build(OBS, LINEAR).entry("head.weight").shape[0] == OBS + MARKET
    plain = ParamLayout.build(OBS, plain_network(hidden=5, n_layers=2, n_atoms=3))
    assert plain.cross == 0 and plain.in_dim == OBS and plain.fingerprint != lay.fingerprint
    default = ParamLayout.build(OBS_DIM, plain_network(position_cross=True))
    assert default.in_dim == 2 * OBS_DIM - N_PORTFOLIO and default.position_col == OBS_DIM - N_PORTFOLIO
    with pytest.raises(ConfigError, match="network.vsn"):
        ParamLayout.build(OBS, plain_network(**{**vars(TRUNK), "vsn": True}))
    with pytest.raises(ConfigError, match="market columns"):
        ParamLayout.build(N_PORTFOLIO, LINEAR)


@pytest.mark.parametrize("dense, cfg", [("strided", LINEAR), ("tiled", LINEAR), ("strided", TRUNK), ("tiled", TRUNK)])
def test_forward_and_backward_match_float64(stream, stager, rng, dense, cfg):
    lay = ParamLayout.build(OBS, cfg)
    p0 = init_params(lay, 3)
    for e in lay.entries:
        if not e.decay:
            p0[e.offset : e.stop] = rng.uniform(-0.2, 0.2, e.size)  # nonzero biases too
    rows, grad_rows = 6, 4
    obs = rng.standard_normal((rows, OBS)).astype(np.float32)
    obs[:, lay.position_col] = [-1.0, -0.5, 0.25, 0.75, 1.0, -0.25]
    dl = rng.standard_normal((grad_rows, N_HEADS, lay.n_atoms)).astype(np.float32)
    net = Network(lay, rows, stream=stream, grad_rows=grad_rows, dense=dense)
    params = stager.upload_new(p0)
    logits = stager.upload_new(np.full((rows, N_HEADS, lay.n_atoms), np.nan, np.float32))
    grads = device_zeros(lay.size, np.float32, stream=stream)
    net.forward(params, stager.upload_new(obs), logits, stream=stream)
    net.backward(params, stager.upload_new(dl), grads, stream=stream)

    x = reference.position_cross64(obs, MARKET, lay.position_col)
    p = lay.unpack(p0)
    acts, want = reference.net_forward64(p, lay.n_layers, x, lay.n_atoms)
    got = stager.download(logits)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    _, plain = reference.net_forward64(p, lay.n_layers, x[:, :OBS] @ np.eye(OBS, OBS + MARKET), lay.n_atoms)
    assert np.abs(plain - want).max() > 1e3 * 1e-5 * np.abs(want).max()  # the crossed columns matter
    analytic = reference.net_backward64(p, lay.n_layers, x[:grad_rows], [a[:grad_rows] for a in acts], dl)
    g = stager.download(grads)
    for name, want_g in analytic.items():
        e = lay.entry(name)
        scale = np.abs(want_g).max()
        np.testing.assert_allclose(g[e.offset : e.stop].reshape(e.shape), want_g, rtol=1e-4, atol=2e-5 * scale,
                                   err_msg=name)
    if lay.n_layers == 0:  # the heads read [obs | position x market], each product one float32 rounding
        np.testing.assert_array_equal(stager.download(net.head_input(rows)), x.astype(np.float32))
