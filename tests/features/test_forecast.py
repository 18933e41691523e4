"""Forecast columns (features/forecast.py): the ridge fit, its standardisation and the cross-fitting of the
training rows against a float64 closed form, every row of the column checked; nothing at or after the
training stop reaches any fit."""

import numpy as np
import pytest

from fox_numba.features.forecast import cross_fitted_column, forward_change

WIDE = 100.0  # a clip no standardised forecast here reaches


def reference_fit(x, mid, day_start, train_stop, h, lam, rows):
    """Independent float64 reference: targets inside the day and before train_stop, ridge with an intercept as
    augmented least squares on `rows`, returning the standardised forecast of every row (not clipped)."""
    n = len(mid)
    y = np.full(n, np.nan)
    for a, b in zip(day_start[:-1], day_start[1:]):
        for r in range(a, b - h):
            if r + h < train_stop:
                y[r] = mid[r + h] - mid[r]
    keep = rows[np.isfinite(y[rows])]
    xk = x[keep].astype(np.float64)
    xm, ym = xk.mean(0), y[keep].mean()
    k = x.shape[1]
    a = np.vstack([xk - xm, np.sqrt(lam * keep.size) * np.eye(k)])
    w = np.linalg.lstsq(a, np.concatenate([y[keep] - ym, np.zeros(k)]), rcond=None)[0]
    f_rows = (x[rows].astype(np.float64) - xm) @ w
    return ((x.astype(np.float64) - xm) @ w - f_rows.mean()) / f_rows.std()


def market(rng, days=6, bars=40, k=6):
    n = days * bars
    x = (rng.standard_normal((n, k)) * rng.uniform(0.5, 2, k) + rng.uniform(-1, 1, k)).astype(np.float32)
    mid = 5000 + np.cumsum(0.25 * np.round(x[:, 0] * 0.8 + rng.standard_normal(n)))
    return x, mid, np.arange(days + 1) * bars


@pytest.mark.parametrize(("h", "lam"), [(1, 0.0), (5, 0.01), (12, 0.5)])
def test_the_full_fit_matches_the_closed_form_on_every_row(rng, h, lam):
    x, mid, day_start = market(rng)
    train_stop = 190  # inside day 4: days 0-3 and part of day 4 train
    full, column = cross_fitted_column(x, mid, day_start, train_stop, horizon=h, ridge=lam, blocks=1, clip=WIDE)
    want = reference_fit(x, mid, day_start, train_stop, h, lam, np.arange(train_stop))
    assert column.dtype == np.float32 and column.shape == (len(mid),)
    np.testing.assert_allclose(column, want, rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(full.apply(x, WIDE), want, rtol=2e-6, atol=2e-6)
    assert abs(column[:train_stop].mean()) < 1e-5 and column[:train_stop].std() == pytest.approx(1.0, rel=1e-5)
    assert (np.abs(want) > 0.5).sum() > 20  # a clip of 0.5 is exercised
    np.testing.assert_allclose(full.apply(x, 0.5), np.clip(want, -0.5, 0.5), rtol=2e-6, atol=2e-6)


def test_training_rows_read_the_fit_that_left_their_block_out(rng):
    """Three blocks over the 5 training days (days 0-1, 2, 3-4 by rounding 0, 1.67, 3.33, 5; the last ends at the
    training stop inside day 4): each block's rows hold the fit on the other blocks' rows; the rows after the
    stop hold the full fit, which is what the returned fit applies."""
    x, mid, day_start = market(rng)
    h, lam, train_stop = 4, 0.02, 190
    full, column = cross_fitted_column(x, mid, day_start, train_stop, horizon=h, ridge=lam, blocks=3, clip=WIDE)
    train = np.arange(train_stop)
    for lo, hi in ((0, 80), (80, 120), (120, 190)):
        rest = np.concatenate([train[:lo], train[hi:]])
        want = reference_fit(x, mid, day_start, train_stop, h, lam, rest)
        np.testing.assert_allclose(column[lo:hi], want[lo:hi], rtol=2e-6, atol=2e-6, err_msg=f"block {lo}..{hi}")
    held = reference_fit(x, mid, day_start, train_stop, h, lam, train)
    np.testing.assert_allclose(column[train_stop:], held[train_stop:], rtol=2e-6, atol=2e-6)
    np.testing.assert_array_equal(full.apply(x, WIDE)[train_stop:], column[train_stop:])
    assert not np.allclose(column[:train_stop], held[:train_stop], atol=1e-3)  # cross-fitting changed them
    with pytest.raises(ValueError, match="7 cross-fitting blocks need as many training days; there are 5"):
        cross_fitted_column(x, mid, day_start, train_stop, horizon=h, ridge=lam, blocks=7, clip=WIDE)


@pytest.mark.parametrize("blocks", [1, 2])
def test_nothing_at_or_after_the_training_stop_moves_a_fit(rng, blocks):
    """Mids and rows from train_stop on, and every target that would read them, are not fitted: poisoning
    them leaves the training rows' column and the full fit bit-identical; moving a mid before the stop
    changes them."""
    x, mid, day_start = market(rng)
    h, train_stop = 7, 130
    base, col = cross_fitted_column(x, mid, day_start, train_stop, horizon=h, ridge=0.01, blocks=blocks, clip=WIDE)
    x2, mid2 = x.copy(), mid.copy()
    x2[train_stop:] = 1e3
    mid2[train_stop:] += 1e4
    poisoned, col2 = cross_fitted_column(x2, mid2, day_start, train_stop, horizon=h, ridge=0.01, blocks=blocks,
                                         clip=WIDE)
    np.testing.assert_array_equal(poisoned.weights, base.weights)
    assert poisoned.offset == base.offset
    np.testing.assert_array_equal(col2[:train_stop], col[:train_stop])
    mid3 = mid.copy()
    mid3[train_stop - 1] += 5.0  # read by the target of row train_stop - 1 - h
    moved, _ = cross_fitted_column(x, mid3, day_start, train_stop, horizon=h, ridge=0.01, blocks=blocks, clip=WIDE)
    assert not np.array_equal(moved.weights, base.weights)


def test_a_forecast_that_cannot_be_fitted_is_refused(rng):
    x, mid, day_start = market(rng)
    kw = dict(blocks=1, clip=WIDE)
    with pytest.raises(ValueError, match="ridge penalty"):
        cross_fitted_column(x, mid, day_start, 150, horizon=3, ridge=-1.0, **kw)
    with pytest.raises(ValueError, match="fewer than two training rows"):
        cross_fitted_column(x, mid, day_start, 150, horizon=40, ridge=0.0, **kw)  # no day holds 41 bars
    with pytest.raises(ValueError, match="constant"):
        cross_fitted_column(x, np.full_like(mid, 5000.0), day_start, 150, horizon=3, ridge=0.0, **kw)


def test_forward_change_stays_inside_each_day():
    mid = np.array([10.0, 11.0, 13.0, 20.0, 21.0, 19.0, 18.0])
    np.testing.assert_array_equal(forward_change(mid, np.array([0, 3, 4, 7]), 2),
                                  [3.0, np.nan, np.nan, np.nan, -3.0, np.nan, np.nan])
