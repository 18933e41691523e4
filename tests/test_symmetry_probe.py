"""tools/symmetry_probe.py: the odd read is the probe's own ridge fit on the training rows and their mirror, and the
other variants are the fits their names say, on random rows (float64, every forecast element)."""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from symmetry_probe import UNSIGNED, fit, largest_offset, side_shares, signed_columns  # noqa: E402

from fox_numba.features.forecast import fit_probe  # noqa: E402
from fox_numba.features.normalise import NormStats  # noqa: E402
from fox_numba.observation import FEATURE_NAMES, N_MARKET  # noqa: E402


def rows(rng, n=300):
    x = rng.standard_normal((n, N_MARKET)) + 0.3  # means away from 0, so centring matters
    y = x[:, :5] @ rng.standard_normal(5) + 0.2 + rng.standard_normal(n)
    return x, y


def test_the_signed_columns_are_every_blocks_signed_features():
    signed = signed_columns()
    n = len(FEATURE_NAMES)
    assert len(signed) == (N_MARKET // n) * (n - len(UNSIGNED)) and UNSIGNED < set(FEATURE_NAMES)
    for c in signed:
        assert FEATURE_NAMES[c % n] not in UNSIGNED
    assert FEATURE_NAMES.index("ofi_l1") in signed and FEATURE_NAMES.index("log_volume") not in signed


def test_the_odd_read_is_the_probe_fitted_on_the_rows_and_their_mirror(rng):
    x, y = rows(rng)
    mirror = x.copy()
    mirror[:, signed_columns()] *= -1.0
    probe = fit_probe(np.vstack([x, mirror]), np.concatenate([y, -y]), slice(None), ridge=0.01, horizon=15)
    z = rng.standard_normal((40, N_MARKET))
    np.testing.assert_allclose(fit("odd", x, y, 0.01)(z), probe.forecast(z), rtol=1e-9, atol=1e-12)
    z_mirror = z.copy()
    z_mirror[:, signed_columns()] *= -1.0
    np.testing.assert_allclose(fit("odd", x, y, 0.01)(z_mirror), -fit("odd", x, y, 0.01)(z), rtol=1e-12)


def test_the_probe_variant_is_the_probe_and_the_others_drop_what_they_name(rng):
    x, y = rows(rng)
    z = rng.standard_normal((40, N_MARKET))
    probe = fit_probe(x, y, slice(None), ridge=0.01, horizon=15)
    np.testing.assert_allclose(fit("probe", x, y, 0.01)(z), probe.forecast(z), rtol=1e-9, atol=1e-12)
    s = signed_columns()
    signed = fit_probe(x[:, s], y, slice(None), ridge=0.01, horizon=15)
    np.testing.assert_allclose(fit("signed", x, y, 0.01)(z), signed.forecast(z[:, s]), rtol=1e-9, atol=1e-12)
    w = np.linalg.solve(x.T @ x + 0.01 * len(y) * np.eye(N_MARKET), x.T @ y)
    np.testing.assert_allclose(fit("no_intercept", x, y, 0.01)(z), z @ w, rtol=1e-9, atol=1e-12)
    assert fit("no_intercept", x, y, 0.01)(np.zeros((1, N_MARKET)))[0] == 0.0


def test_side_shares_count_the_moves_past_the_threshold_and_the_held_sides(rng):
    forward = rng.standard_normal(200)
    forward[::17] = np.nan
    held = rng.integers(-1, 2, 200).astype(np.float64)
    up, down, long, short = side_shares(forward, held, 0.5)
    ok = forward[np.isfinite(forward)]
    assert up == sum(1 for v in ok if v > 0.5) / len(ok) and down == sum(1 for v in ok if v < -0.5) / len(ok)
    assert long == sum(1 for v in held if v > 0) / 200 and short == sum(1 for v in held if v < 0) / 200
    assert 0 < up < 0.5 and 0 < down < 0.5 and 0 < long < 0.5 and 0 < short < 0.5


def test_largest_offset_reads_the_signed_features_alone(rng):
    n = len(FEATURE_NAMES)
    mean, std = rng.uniform(-0.01, 0.01, n), rng.uniform(1.0, 2.0, n)
    unsigned, signed = FEATURE_NAMES.index("log_volume"), FEATURE_NAMES.index("ofi_l1")
    mean[unsigned] = 5.0  # an unsigned feature's offset does not count
    mean[signed], std[signed] = -0.3, 1.5
    assert largest_offset(NormStats(mean=mean, std=std, n_rows=10)) == ("ofi_l1", -0.3 / 1.5)
