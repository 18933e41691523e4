"""The probe baseline: a ridge regression of the forward mid change on the agent's own market observation,
fitted on a fold's training rows and traded on its validation days by the oracle's rule.

It answers "is the information there?": a learner that does far worse than the probe fails to learn what
a linear read of its own observation already earns; a learner and a probe that both earn nothing point at
the observation (or the market). The probe works on plain numpy arrays, fold-local rows:

- `market_obs` float [n, M]: the observation's market part of every bar of the fold (normalised with the
  fold's training statistics, as the agent sees it);
- `mid`, `half_spread` float64 [n]: the close book's mid and half spread, price units;
- `day_start` int [n_days + 1]: day d holds rows day_start[d] .. day_start[d + 1] - 1;
- `train_rows`: the fold's training rows (a slice or indices; the purged tail already left out);
- `val_days`: the validation day indices into `day_start`.

Target: y_m = mid[m + h] - mid[m] (h = evaluation.probe_horizon_bars), only where m + h lies in the same
day; rows without a target are not fitted, so no target crosses a day (nor the purge gap). Fit: with an
intercept, on rows centred by their training means, w = (Xc'Xc + lambda * n I)^-1 Xc'yc, lambda =
evaluation.probe_ridge (per row, so its strength does not change with the window's length). Trading: the
forecast stands in for the oracle's expected return in `market.synthetic_oracle.oracle_positions` (enter
when |forecast| beats the round-trip cost c_rt, hold while it agrees, flat at the close), one contract,
PnL by `position_pnl` (half the close spread + commission per side), so the probe and the oracle differ
only in their forecast.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fox_numba.agent.fold_market import forward_change
from fox_numba.market.synthetic_oracle import oracle_positions, oracle_threshold
from fox_numba.walkforward.metrics import DaySeries, Metrics, compute_metrics, positions_to_days


@dataclass(frozen=True)
class Probe:
    """A fitted probe: forecast = (x - x_mean) @ weights + y_mean."""

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


@dataclass(frozen=True)
class ProbeResult:
    probe: Probe
    days: list[DaySeries]
    metrics: Metrics
    val_r2: float
    """R^2 of the forecast on the validation rows that have a target."""


def fit_probe(market_obs: np.ndarray, y: np.ndarray, rows: slice | np.ndarray, *, ridge: float, horizon: int) -> Probe:
    """Ridge fit of y on market_obs over `rows` (rows where y is NaN are skipped)."""
    if ridge < 0:
        raise ValueError(f"evaluation.probe_ridge must be >= 0, got {ridge}")
    idx = np.arange(len(y))[rows]
    idx = idx[np.isfinite(y[idx])]
    if idx.size < 2:
        raise ValueError("the probe has fewer than two training rows with a target")
    x = np.asarray(market_obs[idx], dtype=np.float64)
    t = y[idx]
    x_mean, y_mean = x.mean(axis=0), float(t.mean())
    xc, yc = x - x_mean, t - y_mean
    gram = xc.T @ xc + ridge * idx.size * np.eye(x.shape[1])
    w = np.linalg.lstsq(gram, xc.T @ yc, rcond=None)[0]
    resid = yc - xc @ w
    ss = float(yc @ yc)
    return Probe(w, x_mean, y_mean, horizon, ridge, int(idx.size), 1.0 - float(resid @ resid) / ss if ss > 0 else 0.0)


def probe_baseline(
    market_obs: np.ndarray, mid: np.ndarray, half_spread: np.ndarray, day_start: np.ndarray,
    train_rows: slice | np.ndarray, val_days: Sequence[int], *, horizon: int, ridge: float, tick_size: float,
    point_value: float, commission: float, annualisation_days: int,
) -> ProbeResult:
    """Fit on the training rows, trade the validation days by the oracle's rule, measure (module docstring)."""
    day_start = np.asarray(day_start, dtype=np.int64)
    if market_obs.shape[0] != len(mid) or len(mid) != len(half_spread) or day_start[-1] != len(mid):
        raise ValueError(
            f"probe inputs disagree: {market_obs.shape[0]} observation rows, {len(mid)} mids, {len(half_spread)} "
            f"half spreads, day_start ends at {day_start[-1]}"
        )
    y = forward_change(mid, day_start, horizon)
    probe = fit_probe(market_obs, y, train_rows, ridge=ridge, horizon=horizon)
    threshold = oracle_threshold(tick_size, point_value, commission)
    windows = [(int(day_start[d]), int(day_start[d + 1])) for d in val_days]
    positions, mids, halves, preds, targets = [], [], [], [], []
    for a, b in windows:
        pred = probe.forecast(market_obs[a:b])
        positions.append(oracle_positions(pred, threshold))
        mids.append(mid[a:b])
        halves.append(half_spread[a:b])
        preds.append(pred)
        targets.append(y[a:b])
    days = positions_to_days(positions, mids, halves, point_value=point_value, commission=commission)
    p, t = np.concatenate(preds), np.concatenate(targets)
    ok = np.isfinite(t)
    ss = float(np.sum((t[ok] - t[ok].mean()) ** 2)) if ok.any() else 0.0
    val_r2 = 1.0 - float(np.sum((t[ok] - p[ok]) ** 2)) / ss if ss > 0 else 0.0
    return ProbeResult(probe, days, compute_metrics(days, annualisation_days=annualisation_days), val_r2)
