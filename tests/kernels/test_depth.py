"""Residual-block and stochastic-depth kernels (kernels/depth.py) against float64 references on small seeded
inputs, every output element; the drop rate and the draw's key.

Tolerances: each output is one float32 product and sum of the float64 reference's terms: 1e-6 relative.
"""

import numpy as np
import pytest
import reference

from fox_numba.kernels.depth import (
    depth_factors,
    drop_rate,
    residual_add,
    residual_branch_grad,
    residual_skip_grad,
)
from fox_numba.kernels.optim import OPTIM_STATE_DTYPE

ROWS, H = 9, 6


def state_at(stager, step):
    state = np.zeros(1, OPTIM_STATE_DTYPE)
    state[0]["step"] = step
    return stager.upload_new(state)


def factors(stager, stream, rows, *, step, seed, layer, rate):
    d = stager.upload_new(np.full(rows, np.nan, np.float32))
    depth_factors(d, state_at(stager, step), seed, layer, rate, stream=stream)
    return stager.download(d)


def test_factors_follow_the_reference(stream, stager):
    got = factors(stager, stream, 64, step=41, seed=9, layer=2, rate=0.5)
    want = reference.depth_factors64(64, seed=9, step=41, layer=2, rate=0.5)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)
    assert (got == 0).any() and (got == 2).any()


def test_the_drop_rate_and_the_key(stream, stager):
    """2,048 rows at rate 0.25: the dropped count is binomial with sd 19.6, so |share - 0.25| < 0.06 is over six sd.
    Another step, layer or seed draws another mask (independent masks differ on 37.5% of the rows, sd 1.7% on
    the first 512); the same key draws the same mask again."""
    base = factors(stager, stream, 2048, step=3, seed=1, layer=1, rate=0.25) == 0
    assert abs(base.mean() - 0.25) < 0.06
    for change in ({"step": 4}, {"layer": 2}, {"seed": 2}):
        other = factors(stager, stream, 512, **{"step": 3, "seed": 1, "layer": 1, "rate": 0.25, **change}) == 0
        assert 0.2 < (other != base[:512]).mean() < 0.55, change
    again = factors(stager, stream, 512, step=3, seed=1, layer=1, rate=0.25) == 0
    assert np.array_equal(again, base[:512])


def test_drop_rate_is_linear_in_depth():
    assert [drop_rate(0.4, k, 5) for k in range(1, 5)] == pytest.approx([0.1, 0.2, 0.3, 0.4])
    with pytest.raises(ValueError, match="not a residual block"):
        drop_rate(0.4, 0, 5)


def test_residual_add(stream, stager, rng):
    x, h = rng.uniform(0.1, 2.0, (ROWS, H)), rng.uniform(0.1, 2.0, (ROWS, H))
    d = np.where(rng.random(ROWS) < 0.4, 0.0, 1.25)
    dev = [stager.upload_new(a.astype(np.float32)) for a in (x, h, d)]
    y = stager.upload_new(np.full((ROWS, H), np.nan, np.float32))
    residual_add(*dev, y, stream=stream)
    want = x.astype(np.float32) + d.astype(np.float32)[:, None] * h.astype(np.float32).astype(np.float64)
    np.testing.assert_allclose(stager.download(y), want, rtol=1e-6)


def test_branch_grad_reads_the_first_rows(stream, stager, rng):
    g = rng.standard_normal((ROWS, H)).astype(np.float32)
    h = np.maximum(rng.standard_normal((ROWS + 4, H)), 0).astype(np.float32)  # the forward's rows: more than G
    d = np.where(rng.random(ROWS + 4) < 0.4, 0.0, 1.5).astype(np.float32)
    assert (h[:ROWS] == 0).any() and (h[:ROWS] > 0).any() and (d[:ROWS] == 0).any()
    dz = stager.upload_new(np.full((ROWS, H), np.nan, np.float32))
    residual_branch_grad(stager.upload_new(g), stager.upload_new(d), stager.upload_new(h), dz, stream=stream)
    want = g.astype(np.float64) * d[:ROWS, None] * (h[:ROWS] > 0)
    np.testing.assert_allclose(stager.download(dz), want, rtol=1e-6)
    with pytest.raises(ValueError, match="must cover"):
        residual_branch_grad(stager.upload_new(g), stager.upload_new(d[:3]), stager.upload_new(h), dz, stream=stream)


@pytest.mark.parametrize("mask", [True, False])
def test_skip_grad(stream, stager, rng, mask):
    dx, g = rng.standard_normal((ROWS, H)), rng.standard_normal((ROWS, H))
    x = np.maximum(rng.standard_normal((ROWS, H)), 0)
    dev = stager.upload_new(dx.astype(np.float32))
    residual_skip_grad(dev, stager.upload_new(g.astype(np.float32)), stager.upload_new(x.astype(np.float32)),
                       mask=mask, stream=stream)
    want = (dx.astype(np.float32) + g.astype(np.float32).astype(np.float64)) * ((x > 0) if mask else 1.0)
    np.testing.assert_allclose(stager.download(dev), want, rtol=1e-6)
