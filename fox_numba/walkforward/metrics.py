"""Validation metrics from per-bar PnL and positions of whole days, and the baselines they are read against.

Input: one `DaySeries` per validation day: `pnl[m]`, the dollars bar m added to equity net of costs (the
previous position's mark-to-market from bar m-1's close to bar m's, minus the commission and spread paid
for the change made at bar m's close), and `position[m]`, the contracts held after bar m's decision (the
environment's and the oracle's convention, `market.synthetic_oracle.position_pnl`). Every day starts flat.

Conventions (stated once, used everywhere):
- Sharpe, daily: d_i = sum of day i's bar PnL; mean(d) / std(d, ddof=1) * sqrt(evaluation.annualisation_days).
  The figure the best epoch is chosen by and the oracle's convention (STORE.oracle.json).
- Sharpe, per bar: r = every bar's PnL over all days; mean(r) / std(r, ddof=1) * sqrt(annualisation_days *
  bars_per_day), bars_per_day = bars / days of the sample. It treats bars as independent, so it differs
  from the daily figure when intraday PnL is autocorrelated (holding periods longer than a bar); it is less
  noisy over a 10-day window.
  Either Sharpe is 0 when its standard deviation is 0 (flat: nothing earned or lost).
- Sortino (daily): mean(d) / sqrt(mean(min(d, 0)**2)) * sqrt(annualisation_days), target 0 over all days;
  inf when no day lost and the mean is positive, 0 when nothing was earned or lost.
- A ratio that cannot be formed, from fewer than two samples (one validation day: no spread of days), is
  NaN, every ratio alike: None in JSON, "n/a" on the console (`signed`), never chosen by, never averaged.
- Max drawdown: the largest fall of cumulative equity (dollars, from 0 at the first bar, days chained)
  below its running peak; a positive number of dollars.
- Total return: the sum of PnL, dollars (per the traded size: one contract for the baselines).
- Turnover: contracts traded per bar, sum |position change| / bars (a day's opening trade from flat and its
  closing trade count).
- Trades: bars at which the position changed (executions).
- Round trips and hit rate: a round trip is a maximal run of bars holding a position of one sign; its PnL
  runs from its entry bar (entry cost included) to the bar that closes or reverses it (exit cost included;
  the whole cost of a reversal is charged to the trip it closes). Hit rate = winning trips / trips (NaN
  without trips).
- Active fraction: the fraction of bars holding a position.

Baselines (`flat_days`, `buy_and_hold_days`, the probe in walkforward/probe.py) are DaySeries too, so every
figure is computed by the same code. `OracleReference` reads a synthetic store's `STORE.oracle.json`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fox_numba.errors import InputError
from fox_numba.market.synthetic_oracle import position_pnl


@dataclass(frozen=True)
class DaySeries:
    """One validation day: float64 PnL per bar (dollars, net of costs) and the position after each bar."""

    pnl: np.ndarray
    position: np.ndarray

    def __post_init__(self) -> None:
        pnl, pos = np.asarray(self.pnl), np.asarray(self.position)
        if pnl.ndim != 1 or pnl.shape != pos.shape or pnl.size == 0:
            raise ValueError(f"a day needs pnl and position of one equal non-zero length, got {pnl.shape} and {pos.shape}")


def day_series(records: Sequence[tuple[np.ndarray, np.ndarray]]) -> list[DaySeries]:
    """An Evaluator's per-day (pnl, position) records as DaySeries (positions as float64)."""
    return [DaySeries(pnl, pos.astype(np.float64)) for pnl, pos in records]


def positions_to_days(
    positions: Sequence[np.ndarray], mids: Sequence[np.ndarray], half_spreads: Sequence[np.ndarray], *,
    point_value: float, commission: float,
) -> list[DaySeries]:
    """Days traded with the oracle's cost model (half the close spread plus commission per contract per side)."""
    out = []
    for pos, mid, half in zip(positions, mids, half_spreads, strict=True):
        pos = np.asarray(pos, dtype=np.float64)
        out.append(DaySeries(position_pnl(pos, mid, half, point_value=point_value, commission=commission), pos))
    return out


def flat_days(lengths: Sequence[int]) -> list[DaySeries]:
    """The flat baseline: no position, no PnL."""
    return [DaySeries(np.zeros(n), np.zeros(n)) for n in lengths]


def buy_and_hold_days(
    mids: Sequence[np.ndarray], half_spreads: Sequence[np.ndarray], *, point_value: float, commission: float
) -> list[DaySeries]:
    """One contract bought at each day's first bar close and sold at its last (both crossings paid)."""
    positions = []
    for mid in mids:
        pos = np.ones(len(mid))
        pos[-1] = 0.0
        positions.append(pos)
    return positions_to_days(positions, mids, half_spreads, point_value=point_value, commission=commission)


@dataclass(frozen=True)
class Metrics:
    """The figures of one set of days (module docstring: conventions)."""

    sharpe_daily: float
    sharpe_bar: float
    sortino_daily: float
    max_drawdown: float
    total_return: float
    mean_daily_pnl: float
    std_daily_pnl: float
    turnover: float
    trades: int
    round_trips: int
    hit_rate: float
    active_fraction: float
    n_days: int
    n_bars: int

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: non-finite figures become None."""
        return {k: json_number(v) for k, v in asdict(self).items()}


def json_number(v: Any) -> Any:
    """`v` with NaN / inf replaced by None (strict JSON has neither)."""
    if isinstance(v, float | np.floating) and not math.isfinite(v):
        return None
    if isinstance(v, np.generic):
        return v.item()
    return v


MIN_SAMPLES = 2
"""Samples a ratio needs (a standard deviation or a downside deviation of one sample says nothing)."""


def signed(value: float | None) -> str:
    """A ratio for the console: +1.23, or n/a when it could not be formed (None or NaN)."""
    return "n/a" if value is None or math.isnan(value) else f"{value:+.2f}"


def sharpe(samples: np.ndarray, periods_per_year: float) -> float:
    """mean / std(ddof=1) * sqrt(periods_per_year); NaN with fewer than MIN_SAMPLES, 0 with no variation."""
    x = np.asarray(samples, dtype=np.float64)
    if x.size < MIN_SAMPLES:
        return math.nan
    std = float(x.std(ddof=1))
    return float(x.mean() / std * math.sqrt(periods_per_year)) if std > 0 else 0.0


def sortino(daily: np.ndarray, periods_per_year: float) -> float:
    """mean / downside deviation * sqrt(periods_per_year) (module docstring); NaN with fewer than MIN_SAMPLES."""
    d = np.asarray(daily, dtype=np.float64)
    if d.size < MIN_SAMPLES:
        return math.nan
    downside = math.sqrt(float(np.mean(np.minimum(d, 0.0) ** 2)))
    mean = float(d.mean())
    if downside == 0:
        return math.inf if mean > 0 else 0.0
    return mean / downside * math.sqrt(periods_per_year)


def max_drawdown(pnl: np.ndarray) -> float:
    equity = np.concatenate(([0.0], np.cumsum(np.asarray(pnl, dtype=np.float64))))
    return float(np.max(np.maximum.accumulate(equity) - equity))


def round_trip_pnls(day: DaySeries) -> np.ndarray:
    """PnL of each round trip of one day (module docstring), in order."""
    pnl, pos = np.asarray(day.pnl, dtype=np.float64), np.asarray(day.position, dtype=np.float64)
    sign = np.sign(pos)
    prev = np.concatenate(([0.0], sign[:-1]))
    starts = np.flatnonzero((sign != 0) & (sign != prev))
    out = []
    n = sign.size
    for a in starts:
        b = a
        while b + 1 < n and sign[b + 1] == sign[a]:
            b += 1
        first = a + 1 if prev[a] != 0 else a  # a reversal's cost belongs to the trip it closed
        last = min(b + 1, n - 1)  # the closing bar (its cost and its last mark); the day's end if still open
        out.append(float(pnl[first : last + 1].sum()))
    return np.array(out)


def compute_metrics(days: Sequence[DaySeries], *, annualisation_days: int) -> Metrics:
    """Every figure of the module docstring over `days` (in time order)."""
    if not days:
        raise ValueError("no days to compute metrics on")
    pnl = np.concatenate([np.asarray(d.pnl, dtype=np.float64) for d in days])
    pos = np.concatenate([np.asarray(d.position, dtype=np.float64) for d in days])
    daily = np.array([float(np.sum(d.pnl)) for d in days])
    changes = np.concatenate([np.abs(np.diff(np.asarray(d.position, dtype=np.float64), prepend=0.0)) for d in days])
    trips = np.concatenate([round_trip_pnls(d) for d in days])
    n_bars, n_days = int(pnl.size), len(days)
    return Metrics(
        sharpe_daily=sharpe(daily, annualisation_days),
        sharpe_bar=sharpe(pnl, annualisation_days * n_bars / n_days),
        sortino_daily=sortino(daily, annualisation_days),
        max_drawdown=max_drawdown(pnl),
        total_return=float(pnl.sum()),
        mean_daily_pnl=float(daily.mean()),
        std_daily_pnl=float(daily.std(ddof=1)) if n_days > 1 else 0.0,
        turnover=float(changes.sum() / n_bars),
        trades=int(np.count_nonzero(changes)),
        round_trips=int(trips.size),
        hit_rate=float(np.mean(trips > 0)) if trips.size else math.nan,
        active_fraction=float(np.mean(pos != 0)),
        n_days=n_days,
        n_bars=n_bars,
    )


@dataclass(frozen=True)
class OracleReference:
    """A synthetic store's oracle (STORE.oracle.json): its Sharpe over the whole store and its daily PnL."""

    path: Path
    sharpe: float
    daily_pnl: np.ndarray
    """float64 [store days], in the store's day order."""
    annualisation_days: int

    @classmethod
    def for_store(cls, store: str | Path) -> OracleReference | None:
        """The oracle beside `store` (None when the store has no oracle sidecar: not a synthetic store)."""
        path = Path(store).with_name(Path(store).name + ".oracle.json")
        if not path.is_file():
            return None
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return cls(path, float(data["oracle_sharpe"]), np.asarray(data["oracle_daily_pnl"], dtype=np.float64),
                       int(data["oracle_annualisation_days"]))
        except (ValueError, KeyError, TypeError) as e:
            raise InputError(path, f"not a readable oracle sidecar ({type(e).__name__}: {e})") from None

    def day_indices(self, store_days: Sequence[str], names: Sequence[str]) -> list[int]:
        """Indices into `daily_pnl` of the days `names`, given the store's days in order (MarketStore's list;
        a run that selects a day range sees only part of it)."""
        if len(store_days) != self.daily_pnl.size:
            raise InputError(self.path, f"the oracle has {self.daily_pnl.size} days, the store {len(store_days)}",
                             field="oracle_daily_pnl")
        where = {d: i for i, d in enumerate(store_days)}
        missing = [n for n in names if n not in where]
        if missing:
            raise InputError(self.path, f"days {missing} are not in the store", field="oracle_daily_pnl")
        return [where[n] for n in names]

    def sharpe_on(self, day_indices: Sequence[int], annualisation_days: int) -> float:
        """The oracle's daily Sharpe over the store days `day_indices` (a fold's validation days)."""
        idx = np.asarray(day_indices, dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= self.daily_pnl.size):
            raise InputError(self.path, f"day index out of range 0..{self.daily_pnl.size - 1}", field="oracle_daily_pnl")
        return sharpe(self.daily_pnl[idx], annualisation_days)


def fraction(value: float, reference: float | None) -> float:
    """value / reference, NaN when the reference is missing or not positive."""
    if reference is None or not reference > 0:
        return math.nan
    return value / reference


def fold_report(
    agent: Metrics, *, flat: Metrics, buy_and_hold: Metrics, probe: Metrics | None = None,
    oracle_sharpe: float | None = None,
) -> dict[str, Any]:
    """The agent beside its baselines, JSON-ready: figures per policy, and the agent's daily Sharpe as a
    fraction of the oracle's and of the probe's."""
    report: dict[str, Any] = {
        "agent": agent.as_dict(),
        "flat": flat.as_dict(),
        "buy_and_hold": buy_and_hold.as_dict(),
        "probe": probe.as_dict() if probe is not None else None,
        "oracle_sharpe": json_number(oracle_sharpe) if oracle_sharpe is not None else None,
        "oracle_fraction": json_number(fraction(agent.sharpe_daily, oracle_sharpe)),
        "probe_fraction": json_number(fraction(agent.sharpe_daily, probe.sharpe_daily if probe else None)),
    }
    return report


def across_folds(per_fold_days: Sequence[Sequence[DaySeries]], *, annualisation_days: int) -> dict[str, Any]:
    """The walk-forward record: metrics of every fold's validation days chained in order, and the spread of
    the per-fold daily Sharpes."""
    chained = [d for days in per_fold_days for d in days]
    per_fold = [compute_metrics(days, annualisation_days=annualisation_days).sharpe_daily for days in per_fold_days]
    return {
        "all_validation_days": compute_metrics(chained, annualisation_days=annualisation_days).as_dict(),
        "fold_sharpe_daily": [json_number(s) for s in per_fold],
        "fold_sharpe_mean": json_number(float(np.mean(per_fold))),
        "fold_sharpe_std": json_number(float(np.std(per_fold, ddof=1)) if len(per_fold) > 1 else 0.0),
        "fold_sharpe_min": json_number(float(np.min(per_fold))),
    }
