"""The Mamba2 encoder in the Network (network.mamba2_window; agent/mamba2.py Mamba2Encoder): the layout's entries,
wider first layer, fingerprint and refusals, and the whole forward (window gather -> block -> [obs | last bar] ->
the trunk or the linear head -> dueling logits) and every parameter's gradient against a float64 reference.

The reference: tests/reference_mamba2.py's block64 on the float64 windows, tests/reference.py's net_head64 and
dueling64; the gradients are central differences (h = 1e-6) of that float64 objective sum(dlogits * logits) over the
first GRAD_ROWS samples (truncation ~1e-12, rounding ~1e-10 of the largest gradient). Tolerances: the logits are
float32 sums of <= 10 products after the block, whose float32 output is within ~3e-7 of its largest element
(tests/agent/test_mamba2.py): 1e-5 relative plus 1e-5 of the largest logit. The gradients add the block's backward
(measured within ~1e-6 of each array's largest element there): 1e-4 relative plus 1e-5 of the largest element per
entry, and per row of mamba2.heads (d a_log, dD and d dt_bias differ in scale by up to 1e3), as in test_mamba2.py.
"""

import numpy as np
import pytest
import reference
from windowed_network import ENCODER_CONFLICTS, run_windowed, unbound_network
import reference_mamba2 as ref

from fox_numba.actions import N_HEADS
from fox_numba.agent.fold_market import day_first_rows
from fox_numba.agent.mamba2 import HEADS, IN_W, OUT_W
from fox_numba.agent.network import Network, ParamLayout, init_params
from fox_numba.config import FeatureConfig
from fox_numba.errors import ConfigError
from fox_numba.observation import N_MARKET, OBS_DIM
from plain_learner import plain_network

OBS, F, C, ROWS, GRAD_ROWS = 7, 5, 8, 6, 4
DAY_START = np.array([0, 3, 9, 16])  # the market's days: rows 0-2, 3-8, 9-15
SAMPLE_ROWS = np.array([4, 0, 9, 15, 3, 11], np.int32)  # day starts and rows near them: every window clamps
SIZES = dict(mamba2_window=4, mamba2_heads=2, mamba2_head_dim=4, mamba2_state=3, mamba2_out=3)
LINEAR = plain_network(hidden=5, n_layers=0, n_atoms=3, **SIZES)
TRUNK = plain_network(hidden=5, n_layers=2, n_atoms=3, **SIZES)
SPECTRAL = plain_network(hidden=5, n_layers=2, n_atoms=3, spectral_norm=True, **SIZES)
CROSS = plain_network(hidden=5, n_layers=0, n_atoms=3, position_cross=True, **SIZES)  # [obs | q x market | enc]


def build(cfg):
    return ParamLayout.build(OBS, cfg, market_features=F)


def test_layout_entries_width_and_fingerprint():
    plain = ParamLayout.build(OBS, plain_network(hidden=5, n_layers=2, n_atoms=3))
    lay = build(TRUNK)
    assert lay.in_dim == OBS + 3 and lay.entry("trunk.0.weight").shape == (OBS + 3, 5)
    assert [e.name for e in lay.entries[len(plain.entries) :]] == [IN_W, HEADS, OUT_W]
    assert lay.entry(IN_W).shape == (F, 2 * 8 + 2 * 3 + 2) and lay.entry(IN_W).decay
    assert lay.entry(OUT_W).shape == (8, 3) and not lay.entry(HEADS).decay
    assert build(LINEAR).entry("head.weight").shape[0] == OBS + 3
    longer = build(plain_network(**{**vars(TRUNK), "mamba2_window": 6}))
    assert longer.entries == lay.entries  # the window is in no shape, only in the fingerprint
    assert len({plain.fingerprint, lay.fingerprint, longer.fingerprint}) == 3
    real = ParamLayout.build(OBS_DIM, plain_network(mamba2_window=8), features=FeatureConfig(tw_imbalance=False))
    assert real.mamba2.n_features == N_MARKET and real.in_dim == OBS_DIM + 32 and not plain_network().mamba2_window
    p, again = init_params(lay, 5), init_params(lay, 5)
    np.testing.assert_array_equal(p, again)
    heads = p[lay.entry(HEADS).offset : lay.entry(HEADS).stop].reshape(3, 2)
    np.testing.assert_array_equal(heads[1], 1.0)  # D starts at 1 (agent/mamba2.py init_params)
    for name in (IN_W, OUT_W):
        e = lay.entry(name)
        assert 0 < np.abs(p[e.offset : e.stop]).max() <= 1 / np.sqrt(e.shape[0])


@pytest.mark.parametrize("change, match", [
    ({"mamba2_window": 1}, "mamba2_window must be 0"),
    *ENCODER_CONFLICTS,
    ({"mamba2_head_dim": 65}, "head_dim <= 64"),
])
def test_unsupported_settings_are_refused(change, match):
    with pytest.raises(ConfigError, match=match):
        build(plain_network(**{**vars(TRUNK), **change}))


def market(stager, rng):
    """(host market_obs [16, C], its device copy, the device day_first [16])."""
    host = rng.standard_normal((DAY_START[-1], C)).astype(np.float32)
    return host, stager.upload_new(host), stager.upload_new(day_first_rows(DAY_START))


def test_forward_needs_the_market_and_rows(stream, stager, rng):
    net = unbound_network(stream, stager, build(LINEAR), SAMPLE_ROWS)
    _, market_obs, day_first = market(stager, rng)
    with pytest.raises(ValueError, match="day_first"):
        net.bind_market(market_obs, stager.upload_new(np.zeros(3, np.int32)))
    plain = ParamLayout.build(OBS, plain_network(hidden=5, n_layers=0, n_atoms=3))
    with pytest.raises(ValueError, match="no Mamba2 encoder"):
        Network(plain, ROWS, stream=stream).bind_market(market_obs, day_first)


def random_params(lay, rng):
    """init_params with nonzero biases, D away from 1 and dt ~ 0.5 (decays well below 1 per bar)."""
    p0 = init_params(lay, 3)
    for e in lay.entries:
        if not e.decay and e.name != HEADS:
            p0[e.offset : e.stop] = rng.uniform(-0.5, 0.5, e.size)
    heads = p0[lay.entry(HEADS).offset : lay.entry(HEADS).stop].reshape(3, -1)
    heads[1:] += rng.uniform(-0.5, 0.5, heads[1:].shape)
    heads[2] += 2.0
    return p0


def objective64(lay, flat, market_obs, obs, dl, spectral):
    """sum(dl * logits) of the float64 network on the first len(obs) samples."""
    p, d = lay.unpack(flat), lay.mamba2
    rows = SAMPLE_ROWS[: len(obs)]
    u = np.concatenate([market_obs[np.maximum(np.arange(r - d.seq_len + 1, r + 1), day_first_rows(DAY_START)[r]), :F]
                        for r in rows]).astype(np.float64)
    out = ref.block64(u, p[IN_W], p[OUT_W], p[HEADS], d.seq_len, d.n_heads, d.head_dim, d.state_dim)[0]
    crossed = reference.position_cross64(obs, lay.cross, lay.position_col) if lay.cross else obs
    x = np.concatenate([crossed, out[d.seq_len - 1 :: d.seq_len]], axis=1)
    _, head = reference.net_head64(p, lay.n_layers, x, spectral=spectral)
    return reference.dueling64(head, lay.n_atoms), float(np.sum(dl * reference.dueling64(head, lay.n_atoms)))


@pytest.mark.parametrize("dense, cfg", [("strided", LINEAR), ("strided", TRUNK), ("strided", SPECTRAL),
                                        ("tiled", TRUNK), ("strided", CROSS)])
def test_forward_and_backward_match_float64(stream, stager, rng, dense, cfg):
    lay = build(cfg)
    p0 = random_params(lay, rng)
    host_market, market_obs, day_first = market(stager, rng)
    obs = rng.standard_normal((ROWS, OBS)).astype(np.float32)
    dl = rng.standard_normal((GRAD_ROWS, N_HEADS, lay.n_atoms)).astype(np.float32)
    logits, grads, uv = run_windowed(stager, stream, lay, p0, obs, dl, SAMPLE_ROWS, (market_obs, day_first), dense)
    ref_logits, _ = objective64(lay, p0.astype(np.float64), host_market, obs, np.zeros_like(logits), uv)
    np.testing.assert_allclose(logits, ref_logits, rtol=1e-5, atol=1e-5 * np.abs(ref_logits).max())
    dl64 = dl.astype(np.float64)
    fd = reference.central_differences64(lambda f: objective64(lay, f, host_market, obs[:GRAD_ROWS], dl64, uv)[1],
                                         p0.astype(np.float64), lay.entries)  # fmt: skip
    for e in lay.entries:
        got, want = grads[e.offset : e.stop].reshape(e.shape), fd[e.offset : e.stop].reshape(e.shape)
        for g_part, w_part in zip(*((got, want) if e.name == HEADS else ([got], [want])), strict=True):
            np.testing.assert_allclose(g_part, w_part, rtol=1e-4, atol=1e-5 * np.abs(w_part).max(), err_msg=e.name)
            assert np.abs(g_part).max() > 0, e.name  # every entry (each head parameter) takes a gradient
