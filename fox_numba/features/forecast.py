"""A linear forecast of the forward mid change from the observation's market part: the probe baseline's fit
(walkforward/probe.py) and the forecast columns a run may add to the observation (features.forecast_horizons).

Target: y_m = mid[m + h] - mid[m], only where m + h lies in the same day (`forward_change`); rows without a
target are not fitted, so no target crosses a day (nor a purge gap, which always ends a fold's training rows
before a held-out day). Fit (`fit_probe`): with an intercept, on rows centred by their training means,
w = (Xc'Xc + lambda * n I)^-1 Xc'yc, lambda per row, so its strength does not change with the window's length.

A forecast column (`ForecastColumn`) is that forecast standardised on the rows it was fitted on, clipped like
the features: column = clip(x @ weights + offset, +-features.clip_sigma). Fitted on a fold's training rows
only, it is a function of the bar's own market row, so it looks no further ahead than the features do; a
checkpoint keeps (weights, offset) so that `fox evaluate` computes the same column on other days.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def forward_change(mid: np.ndarray, day_start: np.ndarray, horizon: int) -> np.ndarray:
    """y_m = mid[m + horizon] - mid[m] where m + horizon is in m's day, NaN elsewhere (float64 [n])."""
    mid = np.asarray(mid, dtype=np.float64)
    y = np.full(mid.shape, np.nan)
    for a, b in zip(day_start[:-1], day_start[1:], strict=True):
        a, b = int(a), int(b)
        if b - a > horizon:
            y[a : b - horizon] = mid[a + horizon : b] - mid[a : b - horizon]
    return y


@dataclass(frozen=True)
class Probe:
    """A fitted ridge forecast: forecast = (x - x_mean) @ weights + y_mean."""

    weights: np.ndarray
    x_mean: np.ndarray
    y_mean: float
    horizon: int
    ridge: float
    n_train: int
    train_r2: float

    def forecast(self, market_obs: np.ndarray) -> np.ndarray:
        x = np.asarray(market_obs, dtype=np.float64)
        return (x - self.x_mean) @ self.weights + self.y_mean


def fit_probe(market_obs: np.ndarray, y: np.ndarray, rows: slice | np.ndarray, *, ridge: float, horizon: int) -> Probe:
    """Ridge fit of y on market_obs over `rows` (rows where y is NaN are skipped)."""
    if ridge < 0:
        raise ValueError(f"the ridge penalty must be >= 0, got {ridge}")
    idx = np.arange(len(y))[rows]
    idx = idx[np.isfinite(y[idx])]
    if idx.size < 2:
        raise ValueError(f"a {horizon}-bar forecast has fewer than two training rows with a target")
    x = np.asarray(market_obs[idx], dtype=np.float64)
    t = y[idx]
    x_mean, y_mean = x.mean(axis=0), float(t.mean())
    xc, yc = x - x_mean, t - y_mean
    gram = xc.T @ xc + ridge * idx.size * np.eye(x.shape[1])
    w = np.linalg.lstsq(gram, xc.T @ yc, rcond=None)[0]
    resid = yc - xc @ w
    ss = float(yc @ yc)
    return Probe(w, x_mean, y_mean, horizon, ridge, int(idx.size), 1.0 - float(resid @ resid) / ss if ss > 0 else 0.0)


@dataclass(frozen=True)
class ForecastColumn:
    """One forecast column: column = clip(x @ weights + offset, +-clip) of a bar's market row x (float64
    inside, float32 out)."""

    weights: np.ndarray
    """float64 [M]: the ridge weights divided by the forecast's training standard deviation."""
    offset: float
    """Makes the column's mean over the fitted rows 0."""

    @classmethod
    def fit(cls, market_obs: np.ndarray, mid: np.ndarray, day_start: np.ndarray, train_stop: int, *,
            horizon: int, ridge: float) -> ForecastColumn:
        """The `horizon`-bar forecast fitted on rows 0 .. train_stop - 1 whose target reads no row at or after
        train_stop (whatever the purge), standardised on those rows (ValueError when it does not vary there)."""
        y = forward_change(mid, day_start, horizon)
        y[max(train_stop - horizon, 0) :] = np.nan
        probe = fit_probe(market_obs, y, slice(0, train_stop), ridge=ridge, horizon=horizon)
        f = (np.asarray(market_obs[:train_stop], np.float64) - probe.x_mean) @ probe.weights
        scale = float(np.std(f))
        if not scale > 0:
            raise ValueError(f"the {horizon}-bar forecast is constant on the training rows")
        return cls(probe.weights / scale, float(-(probe.x_mean @ probe.weights + f.mean()) / scale))

    def apply(self, market_obs: np.ndarray, clip: float) -> np.ndarray:
        """float32 [n]: the column of every row of market_obs [n, M]."""
        x = np.asarray(market_obs, np.float64)
        return np.clip(x @ self.weights + self.offset, -clip, clip).astype(np.float32)
