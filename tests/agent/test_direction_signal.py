"""The direction signal (agent/direction_signal.py) against a float64 reference: every bar's E[Q(long)] -
E[Q(short)] with a flat portfolio, chunks of the fold's rows included (a short last chunk)."""

import numpy as np
import reference

from fox_numba.actions import LONG, N_HEADS, SHORT
from fox_numba.agent.direction_signal import DirectionSignal, flat_portfolio
from fox_numba.agent.network import ParamLayout, init_params
from fox_numba.observation import N_PORTFOLIO, PORT_BARS_LEFT
from plain_learner import plain_network

MARKET = 5


def test_every_bar_reads_the_reference_signal(stager, rng):
    lay = ParamLayout.build(MARKET + N_PORTFOLIO, plain_network(hidden=6, n_layers=1, n_atoms=7))
    params = init_params(lay, 3) + rng.normal(0, 0.05, lay.size).astype(np.float32)  # logits that differ
    supports = reference.random_support(rng, (N_HEADS,), lay.n_atoms)
    market_obs = rng.standard_normal((10, MARKET)).astype(np.float32)
    signal = DirectionSignal(lay, stager=stager, chunk=4).compute(
        stager.upload_new(market_obs), stager.upload_new(params), stager.upload_new(supports))

    port = np.zeros(N_PORTFOLIO)
    port[PORT_BARS_LEFT] = 1.0
    np.testing.assert_array_equal(flat_portfolio(), port)
    obs = np.hstack([market_obs.astype(np.float64), np.tile(port, (10, 1))])
    _, logits = reference.net_forward64(lay.unpack(params), 1, obs, lay.n_atoms)
    q = reference.expected_q64(logits, np.broadcast_to(supports, (10, N_HEADS, 3)))
    want = q[:, LONG] - q[:, SHORT]
    assert signal.shape == (10,) and signal.dtype == np.float64
    np.testing.assert_allclose(signal, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
    assert np.ptp(want) > 0.1 * np.abs(want).max()  # the rows differ: the check is not of a constant


def test_with_the_iqn_head_the_signal_is_the_joint_values_difference(stager, rng):
    """network.iqn_quantiles = 3: e_d = (E_C51[d] + E_IQN[d]) / 2 with E_IQN the mean over the levels 1/6, 1/2, 5/6
    (float64 reference of the head), e_long - e_short at every bar (the same tolerance as above)."""
    cfg = plain_network(hidden=6, n_layers=1, n_atoms=7, iqn_quantiles=3, iqn_embed=4)
    lay = ParamLayout.build(MARKET + N_PORTFOLIO, cfg)
    params = init_params(lay, 3) + rng.normal(0, 0.05, lay.size).astype(np.float32)
    supports = reference.random_support(rng, (N_HEADS,), lay.n_atoms)
    market_obs = rng.standard_normal((10, MARKET)).astype(np.float32)
    signal = DirectionSignal(lay, stager=stager, chunk=4, iqn_quantiles=3).compute(
        stager.upload_new(market_obs), stager.upload_new(params), stager.upload_new(supports))
    obs = np.hstack([market_obs.astype(np.float64), np.tile(flat_portfolio(), (10, 1))])
    p = lay.unpack(params)
    acts, logits = reference.net_forward64(p, 1, obs, lay.n_atoms)
    q = reference.expected_q64(logits, np.broadcast_to(supports, (10, N_HEADS, 3)))
    taus = np.tile(np.array([1 / 6, 1 / 2, 5 / 6], np.float32), (10, 1))
    e_iqn = reference.iqn_forward64(p, acts[-1], taus)[3].reshape(10, 3, N_HEADS).mean(1)
    joint = 0.5 * (q + e_iqn)
    want = joint[:, LONG] - joint[:, SHORT]
    np.testing.assert_allclose(signal, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
    assert np.abs(e_iqn[:, LONG] - e_iqn[:, SHORT]).max() > 1e-3  # the IQN head moves the signal


def test_with_the_mean_head_the_signal_is_its_values_difference(stager, rng):
    """network.mean_head: m_long - m_short at every bar, m = x @ W_m + b_m on the trunk's output (float64 reference;
    the same tolerance as above), which differs from the C51 E[Q]'s difference."""
    lay = ParamLayout.build(MARKET + N_PORTFOLIO, plain_network(hidden=6, n_layers=1, n_atoms=7, mean_head=True))
    params = init_params(lay, 3) + rng.normal(0, 0.05, lay.size).astype(np.float32)
    supports = reference.random_support(rng, (N_HEADS,), lay.n_atoms)
    market_obs = rng.standard_normal((10, MARKET)).astype(np.float32)
    signal = DirectionSignal(lay, stager=stager, chunk=4).compute(
        stager.upload_new(market_obs), stager.upload_new(params), stager.upload_new(supports))
    obs = np.hstack([market_obs.astype(np.float64), np.tile(flat_portfolio(), (10, 1))])
    p = lay.unpack(params)
    acts, logits = reference.net_forward64(p, 1, obs, lay.n_atoms)
    m = acts[-1] @ p["mean.head.weight"].astype(np.float64) + p["mean.head.bias"]
    want = m[:, LONG] - m[:, SHORT]
    np.testing.assert_allclose(signal, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
    q = reference.expected_q64(logits, np.broadcast_to(supports, (10, N_HEADS, 3)))
    assert np.abs(want - (q[:, LONG] - q[:, SHORT])).max() > 1e-3
