"""The TLOB encoder composed from its kernels (agent/tlob.py): the parameter layout and init, and the forward and
backward of the whole encoder against the float64 reference (tests/reference_tlob.py, itself checked against
central differences in tests/kernels/test_tlob_kernels.py), every output and every gradient element.

Tolerances: float32 through up to 2 blocks of 2 sublayers, each with a layer norm that rescales by rstd (up to ~3
here): the output within 2e-5 relative plus 2e-5 of the largest output; gradients within 1e-4 relative plus 2e-5 of
the entry's largest gradient (the attention Jacobian and the layer norm's mean terms cancel). On 6 seeded draws
the errors stayed below a fifth of these bounds.
"""

import numpy as np
import pytest
import reference_tlob as ref

from fox_numba.agent.tlob import TlobEncoder, TlobLayout, TlobShape, init_tlob_params, tlob_entries

TWO_BLOCKS = TlobShape(seq=4, n_in=3, width=6, n_blocks=2, heads_time=2, heads_feature=2, n_out=3)
ONE_BLOCK = TlobShape(seq=3, n_in=2, width=4, n_blocks=1, heads_time=4, heads_feature=1, n_out=2)
BATCH = 2


def test_layout_order_sizes_and_init():
    lay = TlobLayout.build(TWO_BLOCKS)
    names = [e.name for e in lay.entries]
    assert names[:2] == ["tlob.embed.weight", "tlob.embed.bias"] and names[-2:] == ["tlob.head.weight",
                                                                                   "tlob.head.bias"]
    assert names[2:8] == [f"tlob.block0.time.{k}" for k in ("qkv.weight", "qkv.bias", "out.weight", "out.bias",
                                                             "norm.gamma", "norm.beta")]
    assert names[8] == "tlob.block0.feature.qkv.weight" and names[14] == "tlob.block1.time.qkv.weight"
    shapes = {e.name: e.shape for e in lay.entries}
    assert shapes["tlob.block1.feature.qkv.weight"] == (4, 12) and shapes["tlob.block0.time.out.weight"] == (6, 6)
    assert shapes["tlob.head.weight"] == (24, 3)
    assert [e.offset for e in lay.entries[1:]] == [e.stop for e in lay.entries[:-1]]
    per_block = (6 * 18 + 18 + 36 + 6 + 12) + (4 * 12 + 12 + 16 + 4 + 8)  # time view (D = 6), feature view (T = 4)
    assert lay.size == lay.entries[-1].stop == 3 * 6 + 6 + 2 * per_block + 24 * 3 + 3
    assert [e.decay for e in lay.entries] == [n.endswith(".weight") for n in names]
    assert [(n, s) for n, s, _ in tlob_entries(TWO_BLOCKS)] == list(shapes.items())
    p = init_tlob_params(lay, 7)
    np.testing.assert_array_equal(p, init_tlob_params(lay, 7))
    assert not np.array_equal(p, init_tlob_params(lay, 8))
    for e in lay.entries:
        v = p[e.offset : e.stop]
        if e.decay:
            bound = np.sqrt(6.0 / sum(e.shape))
            assert np.all(np.abs(v) <= bound) and np.all(v != 0), e.name
        else:
            np.testing.assert_array_equal(v, 1.0 if e.name.endswith("gamma") else 0.0)


@pytest.mark.parametrize(("shape", "match"), [
    (TlobShape(4, 3, 6, 1, 4, 2, 3), "time view"),
    (TlobShape(65, 3, 6, 1, 1, 1, 3), "time view"),
    (TlobShape(4, 3, 6, 1, 2, 3, 3), "feature view"),
    (TlobShape(4, 3, 6, 0, 2, 2, 3), "n_blocks=0"),
])
def test_shape_checks(shape, match):
    with pytest.raises(ValueError, match=match):
        TlobLayout.build(shape)


def random_flat(lay, rng):
    """Every entry nonzero: weights 0.5 N(0, 1), gamma 1 + 0.3 N, biases and beta 0.3 N."""
    flat = np.empty(lay.size, np.float32)
    for e in lay.entries:
        scale, shift = (0.5, 0.0) if e.decay else (0.3, 1.0 if e.name.endswith("gamma") else 0.0)
        flat[e.offset : e.stop] = shift + scale * rng.standard_normal(e.size)
    return flat


@pytest.mark.parametrize("shape", [TWO_BLOCKS, ONE_BLOCK], ids=["two_blocks", "one_block_e1"])
def test_encoder_matches_float64_forward_and_backward(stream, stager, rng, shape):
    lay = TlobLayout.build(shape)
    flat = random_flat(lay, rng)
    x = rng.standard_normal((BATCH, shape.seq * shape.n_in)).astype(np.float32)
    dout = rng.standard_normal((BATCH, shape.n_out)).astype(np.float32)
    d_flat, dx, ddout = (stager.upload_new(a) for a in (flat, x, dout))
    g_flat = stager.upload_new(np.full(lay.size, np.nan, np.float32))
    enc = TlobEncoder(lay, BATCH)
    out = enc.forward(lay.views(d_flat), dx, stream=stream)
    enc.backward(lay.views(d_flat), dx, ddout, lay.views(g_flat), stream=stream)

    p = {e.name: flat[e.offset : e.stop].astype(np.float64).reshape(e.shape) for e in lay.entries}
    want, cache = ref.encoder64(p, x, shape.seq, shape.width, shape.n_blocks, shape.heads_time, shape.heads_feature)
    np.testing.assert_allclose(stager.download(out), want, rtol=2e-5, atol=2e-5 * np.abs(want).max())
    grads = ref.encoder_bwd64(p, x, cache, dout.astype(np.float64), shape.seq, shape.width)
    got = stager.download(g_flat)
    for e in lay.entries:
        w = grads[e.name]
        np.testing.assert_allclose(got[e.offset : e.stop].reshape(e.shape), w, rtol=1e-4,
                                   atol=2e-5 * np.abs(w).max(), err_msg=e.name)

    enc.backward(lay.views(d_flat), dx, ddout, lay.views(g_flat), stream=stream)  # same bits on a second call
    np.testing.assert_array_equal(stager.download(g_flat), got)


def test_encoder_checks_its_inputs(stream, stager):
    lay = TlobLayout.build(ONE_BLOCK)
    enc = TlobEncoder(lay, BATCH)
    p = lay.views(stager.upload_new(np.ones(lay.size, np.float32)))
    with pytest.raises(ValueError, match=r"x must be"):
        enc.forward(p, stager.upload_new(np.ones((BATCH, 5), np.float32)), stream=stream)
    with pytest.raises(ValueError, match="flat TLOB parameters"):
        lay.views(stager.upload_new(np.ones(lay.size + 1, np.float32)))
