"""The oracle of the synthetic market: what trading the latent expected return earns after costs.

It answers "how good could a policy be on this market?", so a trained agent's Sharpe can be read as a
fraction of the achievable one. One contract, decided at every bar close m of a day (bars 0..M-1):

    pos_m   = sign(er_m)   if |er_m| > c_rt                   (enter or reverse: the move beats the costs)
            = pos_{m-1}    else if pos_{m-1} * er_m > 0         (hold while the expectation agrees)
            = 0            otherwise;          pos_{-1} = 0, pos_{M-1} = 0 (flat at the close)
    c_rt    = 2 * (tick / 2 + commission / point_value)       (nominal round trip, price units)
    pnl_m   = pos_{m-1} * (mid_m - mid_{m-1}) * point_value
              - |pos_m - pos_{m-1}| * (half_spread_m * point_value + commission)
    daily   = sum_m pnl_m;   sharpe = mean(daily) / std(daily, ddof=1) * sqrt(annualisation_days)

`er_m` is the latent expected change of the efficient price over the next `horizon` minutes (see
`synthetic.expected_return`), `mid_m` and `half_spread_m` are read from the book at bar m's close, so
the oracle pays the spread it would really cross and bears the book's tracking noise around the
efficient price. It is a reference, not a bound (other sizing or exit rules can earn more); on the
default market's parameters it is about 13-15 over long runs, with the spread of a 120-day sample
(about +-1.5) around that: 13.0 on the default market (120 days, seed 20240708).

`oracle_positions` (the rule) and `position_pnl` (the PnL of any positions under this cost model) also
serve other forecasts and positions: the walk-forward probe and buy-and-hold baselines use them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Oracle:
    """The oracle's result for a whole market (dollars per contract)."""

    sharpe: float
    """Annualised Sharpe ratio of daily PnL (0 with fewer than two days or no variation)."""
    mean_daily_pnl: float
    std_daily_pnl: float
    horizon_minutes: int
    commission: float
    """Dollars per contract per side."""
    threshold: float
    """c_rt: |expected return| (price units) above which the oracle holds a position."""
    annualisation_days: int
    daily_pnl: np.ndarray
    """float64 [days]."""
    position: np.ndarray
    """int8 [bars]: pos_m, -1, 0 or +1."""

    def summary(self) -> dict[str, float | int | str]:
        """Scalars for store attrs and the JSON sidecar."""
        return {
            "oracle_sharpe": self.sharpe,
            "oracle_mean_daily_pnl": self.mean_daily_pnl,
            "oracle_std_daily_pnl": self.std_daily_pnl,
            "oracle_horizon_minutes": self.horizon_minutes,
            "oracle_commission": self.commission,
            "oracle_threshold": self.threshold,
            "oracle_annualisation_days": self.annualisation_days,
            "oracle_active_fraction": float(np.mean(self.position != 0)) if self.position.size else 0.0,
            "oracle_cost_model": "half the close spread crossed plus commission per contract per side",
        }


def oracle_threshold(tick_size: float, point_value: float, commission: float) -> float:
    """c_rt: the nominal round-trip cost in price units (half a tick each way plus commission both sides)."""
    return 2.0 * (0.5 * tick_size + commission / point_value)


def oracle_positions(expected_return: np.ndarray, threshold: float) -> np.ndarray:
    """pos_m of the rule above (float64 -1, 0 or +1) along the last axis: one day per row ([..., bars]);
    flat at each day's last bar. Any predicted move in price units can stand in for `expected_return` (the
    probe baseline trades a ridge forecast by this rule)."""
    er = np.asarray(expected_return, dtype=np.float64)
    pos = np.zeros_like(er)
    held = np.zeros(er.shape[:-1])
    for m in range(er.shape[-1] - 1):
        enter = np.abs(er[..., m]) > threshold
        held = np.where(enter, np.sign(er[..., m]), np.where(held * er[..., m] > 0, held, 0.0))
        pos[..., m] = held
    return pos


def position_pnl(
    position: np.ndarray, mid: np.ndarray, half_spread: np.ndarray, *, point_value: float, commission: float
) -> np.ndarray:
    """pnl_m of the formula above (float64 dollars [..., bars], one day per row) for positions held from each
    bar's close (flat before the day's first bar): the previous position's mark-to-market minus the cost of
    changing it, |pos_m - pos_{m-1}| * (half spread * point value + commission)."""
    pos = np.asarray(position, dtype=np.float64)
    mid = np.asarray(mid, dtype=np.float64)
    half = np.asarray(half_spread, dtype=np.float64)
    prev = np.zeros_like(pos)
    prev[..., 1:] = pos[..., :-1]
    hold = np.zeros_like(pos)
    hold[..., 1:] = prev[..., 1:] * np.diff(mid, axis=-1) * point_value
    cost = np.abs(pos - prev) * (half * point_value + commission)
    return hold - cost


def oracle_pnl(
    expected_return: np.ndarray,
    mid: np.ndarray,
    half_spread: np.ndarray,
    bars_per_day: int,
    *,
    tick_size: float,
    point_value: float,
    commission: float,
    horizon_minutes: int,
    annualisation_days: int,
) -> Oracle:
    """Apply the formula above to per-bar arrays of whole days ([days * bars_per_day], price units)."""
    er = np.asarray(expected_return, dtype=np.float64).reshape(-1, bars_per_day)
    mid = np.asarray(mid, dtype=np.float64).reshape(er.shape)
    half = np.asarray(half_spread, dtype=np.float64).reshape(er.shape)
    threshold = oracle_threshold(tick_size, point_value, commission)
    pos = oracle_positions(er, threshold)
    daily = position_pnl(pos, mid, half, point_value=point_value, commission=commission).sum(axis=1)
    std = float(daily.std(ddof=1)) if daily.size > 1 else 0.0
    sharpe = float(daily.mean() / std * np.sqrt(annualisation_days)) if std > 0 else 0.0
    return Oracle(
        sharpe=sharpe,
        mean_daily_pnl=float(daily.mean()),
        std_daily_pnl=std,
        horizon_minutes=horizon_minutes,
        commission=commission,
        threshold=threshold,
        annualisation_days=annualisation_days,
        daily_pnl=daily,
        position=pos.astype(np.int8).ravel(),
    )
