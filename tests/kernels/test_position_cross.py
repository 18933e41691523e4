"""The position x market kernel (kernels/position_cross.py) against its float64 numpy reference on small seeded
random inputs, every output element: the copies are exact and each product is one float32 multiply, so the output
is the float64 product rounded once (to float32), compared exactly."""

import numpy as np
import pytest
from reference import position_cross64

from fox_numba.device import registry
from fox_numba.kernels.position_cross import position_cross


def test_kernel_is_registered():
    assert "fox_numba.kernels.position_cross.position_cross_kernel" in registry.KERNELS


@pytest.mark.parametrize(("d", "n_cross", "pos_col"), [(9, 6, 6), (7, 7, 2)])
def test_position_cross_matches_float64(stream, stager, rng, d, n_cross, pos_col):
    obs = rng.uniform(0.5, 2.0, (5, d)) * rng.choice([-1.0, 1.0], (5, d))  # never 0: every product is informative
    obs = obs.astype(np.float32)
    x = stager.upload_new(np.full((5, d + n_cross), np.nan, np.float32))
    position_cross(stager.upload_new(obs), x, n_cross=n_cross, pos_col=pos_col, stream=stream)
    np.testing.assert_array_equal(stager.download(x), position_cross64(obs, n_cross, pos_col).astype(np.float32))


def test_position_cross_refuses_bad_columns(stream, stager):
    obs = stager.upload_new(np.ones((2, 4), np.float32))
    with pytest.raises(ValueError, match="n_cross"):
        position_cross(obs, stager.upload_new(np.ones((2, 9), np.float32)), n_cross=5, pos_col=0, stream=stream)
    with pytest.raises(ValueError, match="pos_col"):
        position_cross(obs, stager.upload_new(np.ones((2, 7), np.float32)), n_cross=3, pos_col=4, stream=stream)
