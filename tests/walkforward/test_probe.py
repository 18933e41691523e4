"""The probe baseline: its target, its ridge fit against a float64 closed form, and its trading by the
oracle's rule on a hand-made market whose future is visible in one observation column."""

import numpy as np
import pytest

from fox_numba.features.forecast import forward_change
from fox_numba.market.synthetic_oracle import oracle_positions, oracle_threshold, position_pnl
from fox_numba.features.forecast import fit_probe
from fox_numba.walkforward.probe import probe_baseline

COSTS = dict(tick_size=0.25, point_value=50.0, commission=2.25)


def ridge_reference(x, y, lam):
    """Ridge with an intercept as augmented least squares: [Xc; sqrt(lam n) I] w = [yc; 0]."""
    n, k = x.shape
    xc, yc = x - x.mean(0), y - y.mean()
    a = np.vstack([xc, np.sqrt(lam * n) * np.eye(k)])
    return np.linalg.lstsq(a, np.concatenate([yc, np.zeros(k)]), rcond=None)[0]


@pytest.mark.parametrize("lam", [0.0, 0.05, 2.0])
def test_fit_matches_the_closed_form_on_the_training_rows_only(rng, lam):
    n, k = 400, 6
    x = rng.standard_normal((n, k)) * rng.uniform(0.5, 2.0, k) + rng.uniform(-1, 1, k)
    y = x @ rng.standard_normal(k) + 0.3 + rng.standard_normal(n) * 0.5
    y[[7, 50]] = np.nan  # rows without a target are skipped
    rows = slice(0, 300)
    probe = fit_probe(x, y, rows, ridge=lam, horizon=15)
    keep = np.setdiff1d(np.arange(300), [7, 50])
    np.testing.assert_allclose(probe.weights, ridge_reference(x[keep], y[keep], lam), rtol=1e-9, atol=1e-12)
    assert probe.n_train == 298 and probe.y_mean == pytest.approx(y[keep].mean())
    y2, x2 = y.copy(), x.copy()
    y2[300:], x2[300:] = 1e6, -1e6  # what lies outside the training rows changes nothing
    np.testing.assert_array_equal(fit_probe(x2, y2, rows, ridge=lam, horizon=15).weights, probe.weights)
    with pytest.raises(ValueError, match="ridge penalty"):
        fit_probe(x, y, rows, ridge=-1.0, horizon=15)


def market(rng, days, bars, horizon):
    """Mids whose next `horizon`-bar change is in observation column 0 (plus 3 noise columns)."""
    mid = 5000 + np.cumsum(rng.choice([-0.25, 0.0, 0.25], days * bars, p=[0.3, 0.4, 0.3]))
    day_start = np.arange(days + 1) * bars
    y = forward_change(mid, day_start, horizon)
    obs = rng.standard_normal((days * bars, 4)).astype(np.float32)
    obs[:, 0] = np.nan_to_num(y, nan=0.0)
    half = np.full(days * bars, 0.125)
    return obs, mid, half, day_start, y


def test_a_probe_that_sees_the_future_trades_like_the_oracle(rng):
    days, bars, h = 6, 120, 15
    obs, mid, half, day_start, y = market(rng, days, bars, h)
    result = probe_baseline(obs, mid, half, day_start, slice(0, 4 * bars - 10), [4, 5], horizon=h, ridge=0.0,
                            annualisation_days=252, **COSTS)
    assert result.probe.weights[0] == pytest.approx(1.0, abs=1e-6) and result.probe.train_r2 > 0.999
    threshold = oracle_threshold(**COSTS)
    for day, d in zip(result.days, (4, 5), strict=True):
        a, b = day_start[d], day_start[d + 1]
        pos = oracle_positions(result.probe.forecast(obs[a:b]), threshold)
        np.testing.assert_array_equal(day.position, pos)
        np.testing.assert_array_equal(day.pnl, position_pnl(pos, mid[a:b], half[a:b], point_value=50.0,
                                                            commission=2.25))
    daily = np.array([day.pnl.sum() for day in result.days], dtype=np.float64)
    assert result.metrics.sharpe_daily == pytest.approx(daily.mean() / daily.std(ddof=1) * np.sqrt(252), rel=1e-12)
    assert (result.metrics.n_days, result.metrics.n_bars) == (2, 2 * bars)
    assert result.metrics.total_return > 0 and result.metrics.active_fraction > 0.2
    assert result.val_r2 > 0.999


def test_a_probe_without_information_hardly_trades(rng):
    days, bars, h = 6, 120, 15
    obs, mid, half, day_start, _ = market(rng, days, bars, h)
    obs[:, 0] = rng.standard_normal(days * bars)
    result = probe_baseline(obs, mid, half, day_start, slice(0, 4 * bars), [4, 5], horizon=h, ridge=0.01,
                            annualisation_days=252, **COSTS)
    assert result.metrics.active_fraction < 0.05  # forecasts never beat the round-trip cost


def test_inputs_that_disagree_are_refused(rng):
    obs, mid, half, day_start, _ = market(rng, 2, 50, 5)
    with pytest.raises(ValueError, match="probe inputs disagree"):
        probe_baseline(obs[:-1], mid, half, day_start, slice(0, 50), [1], horizon=5, ridge=0.0,
                       annualisation_days=252, **COSTS)
