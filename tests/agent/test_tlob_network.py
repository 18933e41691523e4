"""The TLOB encoder in the Network (network.tlob_window; agent/tlob.py TlobWindowEncoder): the layout's entries, wider
first layer, fingerprint and refusals, and the whole forward (book-window gather -> encoder -> [obs | enc] -> the
trunk or the linear head -> dueling logits) and every parameter's gradient against a float64 reference.

The reference: tests/reference_tlob.py's encoder64 on the float64 windows of the book snapshots, tests/reference.py's
net_head64 and dueling64; the gradients are central differences (h = 1e-6) of that float64 objective sum(dlogits *
logits) over the first GRAD_ROWS samples (truncation ~1e-12, rounding ~1e-10 of the largest gradient). Tolerances:
the encoder's float32 output is within ~1e-6 of its largest element (tests/agent/test_tlob.py holds it to 2e-5), the
logits sums of <= 12 products after it: 2e-5 relative plus 2e-5 of the largest logit; the gradients 1e-4 relative
plus 2e-5 of each entry's largest element, as test_tlob.py's.
"""

import numpy as np
import pytest
import reference
from windowed_network import ENCODER_CONFLICTS, run_windowed, unbound_network
import reference_tlob as ref

from fox_numba.actions import N_DIRECTIONS, N_HEADS
from fox_numba.agent.fold_market import day_first_rows
from fox_numba.agent.mean_head import MEAN_HEAD_PREFIX, MEAN_W
from fox_numba.agent.network import Network, ParamLayout, init_params
from fox_numba.agent.tlob import TLOB_PREFIX, TlobLayout, tlob_entries
from fox_numba.device.memory import device_zeros
from fox_numba.errors import ConfigError
from fox_numba.features.book import BOOK_FEATURES
from fox_numba.observation import OBS_DIM
from plain_learner import plain_network

OBS, C, ROWS, GRAD_ROWS = 7, 6, 6, 4
DAY_START = np.array([0, 3, 9, 16])  # the market's days: rows 0-2, 3-8, 9-15
SAMPLE_ROWS = np.array([4, 0, 9, 15, 3, 11], np.int32)  # day starts and rows near them: every window clamps
SIZES = dict(tlob_window=4, tlob_width=4, tlob_blocks=1, tlob_heads=2, tlob_out=3)
LINEAR = plain_network(hidden=5, n_layers=0, n_atoms=3, **SIZES)
TRUNK = plain_network(hidden=5, n_layers=2, n_atoms=3, **SIZES)
SPECTRAL = plain_network(hidden=5, n_layers=2, n_atoms=3, spectral_norm=True, **SIZES)
TWO_BLOCKS = plain_network(hidden=5, n_layers=1, n_atoms=3, **{**SIZES, "tlob_blocks": 2})
MEAN_CROSS = plain_network(hidden=5, n_layers=0, n_atoms=3, mean_head=True, mean_cross=True, **SIZES)


def build(cfg):
    return ParamLayout.build(OBS, cfg)


def test_layout_entries_width_and_fingerprint():
    plain = ParamLayout.build(OBS, plain_network(hidden=5, n_layers=2, n_atoms=3))
    lay = build(TRUNK)
    assert lay.windowed and lay.mamba2 is None and lay.in_dim == OBS + 3
    assert lay.entry("trunk.0.weight").shape == (OBS + 3, 5) and build(LINEAR).entry("head.weight").shape[0] == OBS + 3
    own = tlob_entries(lay.tlob)
    assert [(e.name, e.shape, e.decay) for e in lay.entries[len(plain.entries) :]] == own
    assert lay.entry(f"{TLOB_PREFIX}embed.weight").shape == (BOOK_FEATURES, 4)
    assert lay.entry(f"{TLOB_PREFIX}head.weight").shape == (4 * 4, 3)
    wider = build(plain_network(**{**vars(TRUNK), "tlob_heads": 1}))  # the same shapes, other heads
    assert [e.shape for e in wider.entries] == [e.shape for e in lay.entries]
    assert len({plain.fingerprint, lay.fingerprint, wider.fingerprint, build(TWO_BLOCKS).fingerprint}) == 4
    real = ParamLayout.build(OBS_DIM, plain_network(tlob_window=8))
    assert real.tlob.n_in == BOOK_FEATURES and real.in_dim == OBS_DIM + plain_network().tlob_out
    assert not plain_network().tlob_window and not ParamLayout.build(OBS, plain_network()).windowed
    p, again = init_params(lay, 5), init_params(lay, 5)
    np.testing.assert_array_equal(p, again)
    first = len(plain.entries)
    for k, e in enumerate(lay.entries[first:]):  # agent/tlob.py's scheme, drawn under the layout's own indices
        values = p[e.offset : e.stop]
        if e.decay:
            bound = np.sqrt(6.0 / sum(e.shape))
            rng = np.random.default_rng([5, first + k])
            np.testing.assert_array_equal(values, rng.uniform(-bound, bound, e.size).astype(np.float32), e.name)
        else:
            np.testing.assert_array_equal(values, 1.0 if e.name.endswith("norm.gamma") else 0.0, e.name)
    assert TlobLayout.build(lay.tlob).size < lay.size


@pytest.mark.parametrize("change, match", [
    ({"tlob_window": 1}, "tlob_window must be 0"),
    *ENCODER_CONFLICTS,
    ({"mamba2_window": 4}, "network.mamba2_window"),
    ({"tlob_window": 5}, "multiple of the heads"),
    ({"tlob_width": 6, "tlob_heads": 4, "tlob_window": 4}, "multiple of the heads"),
    ({"tlob_window": 66}, "tokens <= 64"),
    ({"tlob_window": 64, "tlob_width": 64, "tlob_heads": 1}, "tokens x head width <= 2048"),
    ({"tlob_out": 0}, "n_out=0"),
])
def test_unsupported_settings_are_refused(change, match):
    with pytest.raises(ConfigError, match=match):
        build(plain_network(**{**vars(TRUNK), **change}))


def market(stager, rng):
    """(host book_obs [16, BOOK_FEATURES], its device copy, a device market_obs [16, C], the device day_first)."""
    host = rng.standard_normal((DAY_START[-1], BOOK_FEATURES)).astype(np.float32)
    market_obs = stager.upload_new(rng.standard_normal((DAY_START[-1], C)).astype(np.float32))
    return host, stager.upload_new(host), market_obs, stager.upload_new(day_first_rows(DAY_START))


def test_decay_rates_give_the_encoder_its_own():
    """learner.encoder_weight_decay: the encoder's weights decay at their own rate, the other weights at weight_decay,
    biases and norm parameters never; without an encoder rate every weight decays at the one rate."""
    lay = build(TRUNK)
    rates = lay.decay_mask(0.25, 0.75)
    for e in lay.entries:
        want = (0.75 if e.name.startswith(TLOB_PREFIX) else 0.25) if e.decay else 0.0
        np.testing.assert_array_equal(rates[e.offset : e.stop], np.float32(want), e.name)
    assert any(e.decay and e.name.startswith(TLOB_PREFIX) for e in lay.entries)
    np.testing.assert_array_equal(lay.decay_mask(0.25), lay.decay_mask() * np.float32(0.25))


def test_forward_needs_the_book_and_rows(stream, stager, rng):
    net = unbound_network(stream, stager, build(LINEAR), SAMPLE_ROWS)
    _, book_obs, market_obs, day_first = market(stager, rng)
    with pytest.raises(ValueError, match="needs book_obs="):
        net.bind_market(market_obs, day_first)
    with pytest.raises(ValueError, match="columns"):
        net.bind_market(market_obs, day_first, market_obs)  # the market part is not the book
    with pytest.raises(ValueError, match="day_first"):
        net.bind_market(market_obs, stager.upload_new(np.zeros(3, np.int32)), book_obs)
    plain = ParamLayout.build(OBS, plain_network(hidden=5, n_layers=0, n_atoms=3))
    with pytest.raises(ValueError, match="no TLOB encoder"):
        Network(plain, ROWS, stream=stream).bind_market(market_obs, day_first, book_obs)


def random_params(lay, rng):
    """init_params with nonzero biases and betas and the norms' gamma away from 1."""
    p0 = init_params(lay, 3)
    for e in lay.entries:
        if not e.decay:
            shift = 1.0 if e.name.endswith("norm.gamma") else 0.0
            p0[e.offset : e.stop] = shift + rng.uniform(-0.5, 0.5, e.size)
    return p0


def encoded64(lay, flat, book, n):
    """The float64 encoder's output [n, O] over the windows of the first n sample rows."""
    p, t = lay.unpack(flat), lay.tlob
    first = day_first_rows(DAY_START)
    x = np.stack([book[np.maximum(np.arange(r - t.seq + 1, r + 1), first[r])].reshape(-1)
                  for r in SAMPLE_ROWS[:n]]).astype(np.float64)
    enc = {name: value for name, value in p.items() if name.startswith(TLOB_PREFIX)}
    return ref.encoder64(enc, x, t.seq, t.width, t.n_blocks, t.heads_time, t.heads_feature)[0]


def objective64(lay, flat, book, obs, dl, spectral):
    """(logits, sum(dl * logits)) of the float64 network on the first len(obs) samples."""
    out = encoded64(lay, flat, book, len(obs))
    _, head = reference.net_head64(lay.unpack(flat), lay.n_layers, np.concatenate([obs, out], axis=1),
                                   spectral=spectral)
    logits = reference.dueling64(head, lay.n_atoms)
    return logits, float(np.sum(dl * logits))


@pytest.mark.parametrize("dense, cfg", [("strided", LINEAR), ("strided", TRUNK), ("strided", SPECTRAL),
                                        ("strided", TWO_BLOCKS), ("tiled", LINEAR)],
                         ids=["linear", "trunk", "spectral", "two_blocks", "linear_tiled"])
def test_forward_and_backward_match_float64(stream, stager, rng, dense, cfg):
    lay = build(cfg)
    p0 = random_params(lay, rng)
    host_book, book_obs, market_obs, day_first = market(stager, rng)
    obs = rng.standard_normal((ROWS, OBS)).astype(np.float32)
    dl = rng.standard_normal((GRAD_ROWS, N_HEADS, lay.n_atoms)).astype(np.float32)
    bound = (market_obs, day_first, book_obs)
    logits, grads, uv = run_windowed(stager, stream, lay, p0, obs, dl, SAMPLE_ROWS, bound, dense)
    ref_logits, _ = objective64(lay, p0.astype(np.float64), host_book, obs, np.zeros_like(logits), uv)
    np.testing.assert_allclose(logits, ref_logits, rtol=2e-5, atol=2e-5 * np.abs(ref_logits).max())
    dl64 = dl.astype(np.float64)
    fd = reference.central_differences64(lambda f: objective64(lay, f, host_book, obs[:GRAD_ROWS], dl64, uv)[1],
                                         p0.astype(np.float64), lay.entries)  # fmt: skip
    for e in lay.entries:
        got, want = grads[e.offset : e.stop], fd[e.offset : e.stop]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5 * np.abs(want).max(), err_msg=e.name)
        assert np.abs(got).max() > 0, e.name  # every entry takes a gradient


def test_the_mean_head_reads_the_encoder_and_its_gradient_reaches_it(stream, stager, rng):
    """network.mean_cross beside the encoder (mirror off; on, it is refused): the mean head's weight has a row per
    column of [obs | enc] and per crossed market column, Network.mean_input is [obs | enc] with the float64 encoder's
    output, and a gradient sent into the encoder's columns (backward's input_grad: the mean head's, MeanStep.dx) adds
    to the C51 head's: every encoder and C51 entry's gradient is the central difference of sum(dl * logits) + sum(dx
    * enc); the mean head's entries take none here (MeanStep writes them: tests/agent/test_mean_head.py)."""
    lay = build(MEAN_CROSS)
    n_out = lay.tlob.n_out
    assert lay.entry(MEAN_W).shape == (OBS + n_out + lay.cross, N_DIRECTIONS) and lay.cross == OBS - 6
    assert (lay.encoder_col, lay.in_dim, lay.mean_in) == (OBS, OBS + n_out, OBS + n_out + lay.cross)
    with pytest.raises(ConfigError, match="network.mirror .* does not combine with an encoder"):
        build(plain_network(hidden=5, n_layers=0, n_atoms=3, mean_head=True, mean_cross=True, mirror=True, **SIZES))
    p0 = random_params(lay, rng)
    host_book, book_obs, market_obs, day_first = market(stager, rng)
    obs = rng.standard_normal((ROWS, OBS)).astype(np.float32)
    dl = rng.standard_normal((GRAD_ROWS, N_HEADS, lay.n_atoms)).astype(np.float32)
    dx = rng.standard_normal((GRAD_ROWS, n_out)).astype(np.float32)
    net = Network(lay, ROWS, stream=stream, grad_rows=GRAD_ROWS, dense="strided")
    net.bind_market(market_obs, day_first, book_obs)
    params, grads = stager.upload_new(p0), device_zeros(lay.size, np.float32, stream=stream)
    net.forward(params, stager.upload_new(obs), None, stream=stream, rows=stager.upload_new(SAMPLE_ROWS))
    want = np.concatenate([obs, encoded64(lay, p0.astype(np.float64), host_book, ROWS)], axis=1)
    np.testing.assert_allclose(stager.download(net.mean_input(ROWS)), want, rtol=2e-5, atol=2e-5 * np.abs(want).max())
    net.backward(params, stager.upload_new(dl), grads, stream=stream, input_grad=stager.upload_new(dx))
    got_all = stager.download(grads)
    dl64, dx64 = dl.astype(np.float64), dx.astype(np.float64)

    def objective(flat):
        c51 = objective64(lay, flat, host_book, obs[:GRAD_ROWS], dl64, None)[1]
        return c51 + float(np.sum(dx64 * encoded64(lay, flat, host_book, GRAD_ROWS)))

    fd = reference.central_differences64(objective, p0.astype(np.float64), lay.entries)
    for e in lay.entries:
        got, want = got_all[e.offset : e.stop], fd[e.offset : e.stop]
        if e.name.startswith(MEAN_HEAD_PREFIX):
            assert not got.any() and not want.any(), e.name
            continue
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5 * np.abs(want).max(), err_msg=e.name)
        assert np.abs(got).max() > 0, e.name
