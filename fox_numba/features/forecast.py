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

On the training rows themselves the column is cross-fitted (`cross_fitted_column`): an in-sample fit is
better there than anywhere else (on the default market the 60-bar forecast correlated +0.28 with its target
on the rows it was fitted on and +0.03 on the validation days), and an agent trained on it learns to trust
it that much (tools/results/learner_ablation_h200.md section 13).
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
    """float64 [M]: the ridge weights divided by the forecast's standard deviation on the fitted rows."""
    offset: float
    """Makes the column's mean over the fitted rows 0."""

    @classmethod
    def fit(cls, market_obs: np.ndarray, y: np.ndarray, rows: np.ndarray, *, horizon: int,
            ridge: float) -> ForecastColumn:
        """The ridge forecast of y fitted on `rows` (indices; rows where y is NaN skipped), standardised on
        those rows (ValueError when it does not vary there)."""
        probe = fit_probe(market_obs, y, rows, ridge=ridge, horizon=horizon)
        f = (np.asarray(market_obs[rows], np.float64) - probe.x_mean) @ probe.weights
        scale = float(np.std(f))
        if not scale > 0:
            raise ValueError(f"the {horizon}-bar forecast is constant on the training rows")
        return cls(probe.weights / scale, float(-(probe.x_mean @ probe.weights + f.mean()) / scale))

    def apply(self, market_obs: np.ndarray, clip: float) -> np.ndarray:
        """float32 [n]: the column of every row of market_obs [n, M]."""
        x = np.asarray(market_obs, np.float64)
        return np.clip(x @ self.weights + self.offset, -clip, clip).astype(np.float32)


def training_target(mid: np.ndarray, day_start: np.ndarray, train_stop: int, horizon: int) -> np.ndarray:
    """`forward_change` with every target that would read a row at or after train_stop NaN (whatever the purge)."""
    y = forward_change(mid, day_start, horizon)
    y[max(train_stop - horizon, 0) :] = np.nan
    return y


def cross_fitted_column(market_obs: np.ndarray, mid: np.ndarray, day_start: np.ndarray, train_stop: int, *,
                        horizon: int, ridge: float, blocks: int, clip: float) -> tuple[ForecastColumn, np.ndarray]:
    """The full fit on rows 0 .. train_stop - 1 (what held-out rows and checkpoints use) and the column of every
    row: on the training rows out of fold, each of `blocks` contiguous runs of training days reading the fit on
    the other blocks' rows, so the column is no better on the rows the agent trains on than on days no fit saw
    (1: the full fit everywhere); on the other rows the full fit."""
    y = training_target(mid, day_start, train_stop, horizon)
    train = np.arange(train_stop)
    full = ForecastColumn.fit(market_obs, y, train, horizon=horizon, ridge=ridge)
    column = full.apply(market_obs, clip)
    if blocks > 1:
        day_first = np.asarray(day_start[:-1])[np.asarray(day_start[:-1]) < train_stop]
        if blocks > day_first.size:
            raise ValueError(f"{blocks} cross-fitting blocks need as many training days; there are {day_first.size}")
        edges = [int(day_first[k]) for k in np.linspace(0, day_first.size, blocks + 1).round().astype(int)[:-1]]
        edges.append(train_stop)
        for lo, hi in zip(edges[:-1], edges[1:], strict=True):
            rest = np.concatenate([train[:lo], train[hi:]])
            column[lo:hi] = ForecastColumn.fit(market_obs, y, rest, horizon=horizon, ridge=ridge).apply(
                market_obs[lo:hi], clip)
    return full, column
