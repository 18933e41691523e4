"""Forecast columns (features/forecast.py): the ridge fit and its standardisation against a float64 closed
form, every row of the column checked; nothing at or after the training stop reaches the fit."""

import numpy as np
import pytest

from fox_numba.features.forecast import ForecastColumn, forward_change

def reference_column(x, mid, day_start, train_stop, h, lam):
    """Independent float64 reference: targets inside the day and before train_stop, ridge with an intercept as
    augmented least squares, the fitted rows' forecast standardised (population std); not clipped."""
    n = len(mid)
    y = np.full(n, np.nan)
    for a, b in zip(day_start[:-1], day_start[1:]):
        for r in range(a, b - h):
            if r + h < train_stop:
                y[r] = mid[r + h] - mid[r]
    keep = np.flatnonzero(np.isfinite(y[:train_stop]))
    xk = x[keep].astype(np.float64)
    xm, ym = xk.mean(0), y[keep].mean()
    k = x.shape[1]
    a = np.vstack([xk - xm, np.sqrt(lam * keep.size) * np.eye(k)])
    w = np.linalg.lstsq(a, np.concatenate([y[keep] - ym, np.zeros(k)]), rcond=None)[0]
    f_train = (x[:train_stop].astype(np.float64) - xm) @ w
    return ((x.astype(np.float64) - xm) @ w - f_train.mean()) / f_train.std()


def market(rng, days=5, bars=40, k=6):
    n = days * bars
    x = (rng.standard_normal((n, k)) * rng.uniform(0.5, 2, k) + rng.uniform(-1, 1, k)).astype(np.float32)
    mid = 5000 + np.cumsum(0.25 * np.round(x[:, 0] * 0.8 + rng.standard_normal(n)))
    return x, mid, np.arange(days + 1) * bars


@pytest.mark.parametrize(("h", "lam"), [(1, 0.0), (5, 0.01), (12, 0.5)])
def test_the_column_matches_the_closed_form_on_every_row(rng, h, lam):
    x, mid, day_start = market(rng)
    train_stop = 150
    col = ForecastColumn.fit(x, mid, day_start, train_stop, horizon=h, ridge=lam)
    want = reference_column(x, mid, day_start, train_stop, h, lam)
    wide = col.apply(x, 100.0)
    assert wide.dtype == np.float32 and wide.shape == (len(mid),)
    np.testing.assert_allclose(wide, want, rtol=2e-6, atol=2e-6)
    assert abs(wide[:train_stop].mean()) < 1e-5 and wide[:train_stop].std() == pytest.approx(1.0, rel=1e-5)
    clipped = col.apply(x, 0.5)
    assert (np.abs(want) > 0.5).sum() > 20  # the clip is exercised
    np.testing.assert_allclose(clipped, np.clip(want, -0.5, 0.5), rtol=2e-6, atol=2e-6)


def test_nothing_at_or_after_the_training_stop_moves_the_fit(rng):
    """Mids and rows from train_stop on, and every target that would read them, are not fitted: poisoning
    them leaves the weights and offset bit-identical; moving a mid before the stop changes them."""
    x, mid, day_start = market(rng)
    h, train_stop = 7, 130
    base = ForecastColumn.fit(x, mid, day_start, train_stop, horizon=h, ridge=0.01)
    x2, mid2 = x.copy(), mid.copy()
    x2[train_stop:] = 1e3
    mid2[train_stop:] += 1e4
    poisoned = ForecastColumn.fit(x2, mid2, day_start, train_stop, horizon=h, ridge=0.01)
    np.testing.assert_array_equal(poisoned.weights, base.weights)
    assert poisoned.offset == base.offset
    mid3 = mid.copy()
    mid3[train_stop - 1] += 5.0  # read by the target of row train_stop - 1 - h
    assert not np.array_equal(ForecastColumn.fit(x, mid3, day_start, train_stop, horizon=h, ridge=0.01).weights,
                              base.weights)


def test_a_forecast_that_cannot_be_fitted_is_refused(rng):
    x, mid, day_start = market(rng)
    with pytest.raises(ValueError, match="ridge penalty"):
        ForecastColumn.fit(x, mid, day_start, 150, horizon=3, ridge=-1.0)
    with pytest.raises(ValueError, match="fewer than two training rows"):
        ForecastColumn.fit(x, mid, day_start, 150, horizon=40, ridge=0.0)  # no day holds 41 bars
    flat = np.full_like(mid, 5000.0)
    with pytest.raises(ValueError, match="constant"):
        ForecastColumn.fit(x, flat, day_start, 150, horizon=3, ridge=0.0)


def test_forward_change_stays_inside_each_day():
    mid = np.array([10.0, 11.0, 13.0, 20.0, 21.0, 19.0, 18.0])
    np.testing.assert_array_equal(forward_change(mid, np.array([0, 3, 4, 7]), 2),
                                  [3.0, np.nan, np.nan, np.nan, -3.0, np.nan, np.nan])
