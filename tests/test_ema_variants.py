"""tools/ema_variants.py's EMAs: 'first' and 'zero' are observation.market_part's two starts, 'cross' runs on."""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from ema_variants import ema  # noqa: E402

from fox_numba import observation as ob  # noqa: E402


def test_ema_starts_match_the_observation_and_cross_runs_across_days(rng):
    z = rng.normal(size=(17, ob.N_FEATURES))
    day_start = np.array([0, 6, 11, 17])
    for start in ("first", "zero"):
        part = ob.market_part(z.astype(np.float32), day_start, start)
        for k, h in enumerate(ob.EMA_HALF_LIVES):
            got = ema(z.astype(np.float32).astype(np.float64), day_start, h, start)
            np.testing.assert_allclose(got, part[:, (k + 1) * ob.N_FEATURES:(k + 2) * ob.N_FEATURES], rtol=1e-6,
                                       atol=1e-6)
    a = ob.ema_alpha(10)
    cross = ema(z, day_start, 10, "cross")
    np.testing.assert_allclose(cross[6], cross[5] + a * (z[6] - cross[5]), err_msg="no restart at day 1's first bar")
    np.testing.assert_allclose(cross[0], z[0])
