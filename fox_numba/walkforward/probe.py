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

Target and fit: features/forecast.py (`forward_change`, `fit_probe`), h = evaluation.probe_horizon_bars,
lambda = evaluation.probe_ridge; the probe reads the feature blocks of the market part only
(observation.feature_columns: the N_MARKET columns, and the time-weighted imbalance's with features.tw_imbalance),
never a run's forecast columns, which are its own fit. Trading: the forecast stands in for the
oracle's expected return in `market.synthetic_oracle.oracle_positions` (enter when |forecast| beats the
round-trip cost c_rt, hold while it agrees, flat at the close), one contract, PnL by `position_pnl` (half
the close spread + commission per side), so the probe and the oracle differ only in their forecast.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fox_numba.features.forecast import Probe, fit_probe, forward_change
from fox_numba.market.synthetic_oracle import oracle_positions, oracle_threshold
from fox_numba.walkforward.metrics import DaySeries, Metrics, compute_metrics, positions_to_days


@dataclass(frozen=True)
class ProbeResult:
    probe: Probe
    days: list[DaySeries]
    metrics: Metrics
    val_r2: float
    """R^2 of the forecast on the validation rows that have a target."""


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
