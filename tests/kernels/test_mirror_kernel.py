"""kernels/mirror.py: the mean head's mirror projection against its float64 twin on seeded random parameters, every
element of the flat buffer (the entries around the head untouched), and the symmetry it gives the head's values."""

import numpy as np
import pytest
from reference import mirror_project64

from fox_numba.kernels.mirror import mirror_project

ROWS = 13


@pytest.mark.parametrize("strength", [1.0, 0.3])
def test_the_projection_matches_float64_and_touches_nothing_else(stream, stager, rng, strength):
    flat = rng.uniform(-1.0, 1.0, 7 + ROWS * 4 + 3 + 4 + 5).astype(np.float32)
    parity = rng.choice([-1.0, 1.0], ROWS).astype(np.float32)
    parity[:2] = [-1.0, 1.0]  # both kinds of row, whatever the draw
    w_off, b_off = 7, 7 + ROWS * 4 + 3
    d = stager.upload_new(flat)
    mirror_project(d, stager.upload_new(parity), w_offset=w_off, b_offset=b_off, strength=strength, stream=stream)
    got = stager.download(d)
    w, b = mirror_project64(flat[w_off : w_off + ROWS * 4].reshape(ROWS, 4), flat[b_off : b_off + 4], parity,
                            strength)
    want = flat.astype(np.float64)
    want[w_off : w_off + ROWS * 4], want[b_off : b_off + 4] = w.ravel(), b
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)  # one float32 add and halving per element
    assert np.array_equal(got[:w_off], flat[:w_off]) and np.array_equal(got[b_off + 4 :], flat[b_off + 4 :])
    # the head's values: a mirrored input row (columns times parity) values Short as the row values Long; at a
    # strength below 1 the gap between the two shrinks by (1 - strength) and no more
    x = rng.standard_normal((5, ROWS))

    def asymmetry(flat_params):
        hw, hb = flat_params[w_off : w_off + ROWS * 4].reshape(ROWS, 4), flat_params[b_off : b_off + 4]
        return (x * parity) @ hw + hb - (x @ hw + hb)[:, [2, 1, 0, 3]]

    before = asymmetry(flat.astype(np.float64))
    assert np.abs(before).min() > 1e-3  # the random head was far from symmetric
    np.testing.assert_allclose(asymmetry(got.astype(np.float64)), (1.0 - strength) * before, rtol=1e-4, atol=1e-5)


def test_out_of_range_offsets_and_strengths_are_refused(stream, stager):
    d = stager.upload_new(np.ones(20, np.float32))
    with pytest.raises(ValueError, match="outside the 20 parameters"):
        mirror_project(d, stager.upload_new(np.ones(ROWS, np.float32)), w_offset=0, b_offset=0, stream=stream)
    with pytest.raises(ValueError, match="strength 0.0 outside"):
        mirror_project(d, stager.upload_new(np.ones(2, np.float32)), w_offset=0, b_offset=12, strength=0.0,
                       stream=stream)
