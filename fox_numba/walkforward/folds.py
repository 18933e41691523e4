"""Walk-forward folds as data: a `FoldConfig` and a list of trading days expand to per-fold windows.

Fold k trains on `train_days` consecutive days and validates on the `val_days` that follow; the windows
advance by `step_days` per fold. Rolling folds slide the training start with them; anchored folds keep it
at the first day (each fold trains on everything before its validation window). Windows are whole
trading days, so episodes never cross a window edge. The last `purge_bars` bars of every training window
are dropped (in bar rows, by `agent.fold_market.FoldMarket.build`, the one place that derives them): their
look-ahead (rewards and labels over the next bars) would otherwise sit next to the validation window. With
`select_days` > 0 the last that many days of the training window are held out as the selection window:
nothing trains on them (the purge moves to their start), and each epoch's backtest on them, not on the
validation days, picks the fold's best epoch, so the validation figures of that epoch are out of sample.
Example, the default config (60 training / 10 validation days, advancing 10) on a 120-day market (the
default market's length):

    fold 0: train days 0-59,   validate 60-69
    fold 1: train days 10-69,  validate 70-79
    fold 2: train days 20-79,  validate 80-89
    fold 3: train days 30-89,  validate 90-99
    fold 4: train days 40-99,  validate 100-109
    fold 5: train days 50-109, validate 110-119

Everything that depends on a fold (normalisation statistics, state resets) keys off this list.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fox_numba.config import FoldConfig
from fox_numba.errors import ConfigError


@dataclass(frozen=True)
class Fold:
    """One walk-forward fold: day windows as [first, stop) indices into the run's trading days."""

    index: int
    train_first: int
    train_stop: int
    val_first: int
    val_stop: int
    days: tuple[str, ...]
    """All trading days of the run (the windows index into them)."""
    purge_bars: int
    """Bars dropped before the first held-out day (FoldMarket.build derives the fold's training rows)."""
    select_days: int = 0
    """The last days of the training window held out for selecting the best epoch (0: none)."""

    @property
    def select_first(self) -> int:
        """First day of the selection window (= train_stop without one); training stops before it."""
        return self.train_stop - self.select_days

    @property
    def train_days(self) -> tuple[str, ...]:
        """The training window, selection days included."""
        return self.days[self.train_first : self.train_stop]

    @property
    def selection_days(self) -> tuple[str, ...]:
        return self.days[self.select_first : self.train_stop]

    @property
    def val_days(self) -> tuple[str, ...]:
        return self.days[self.val_first : self.val_stop]

    def as_dict(self) -> dict[str, object]:
        """The fold as plain data (the run folder's folds.json): windows as indices and as day names."""
        return {
            "index": self.index,
            "train": [self.train_first, self.train_stop],
            "val": [self.val_first, self.val_stop],
            "train_days": [self.train_days[0], self.train_days[-1]],
            "val_days": [self.val_days[0], self.val_days[-1]],
            "purge_bars": self.purge_bars,
            "select": [self.select_first, self.train_stop],
            "select_days": [self.selection_days[0], self.selection_days[-1]] if self.select_days else [],
        }

    def describe(self) -> str:
        trained = self.days[self.train_first : self.select_first]
        held = (f", select {self.selection_days[0]}..{self.selection_days[-1]} ({self.select_days} days)"
                if self.select_days else "")  # fmt: skip
        return (
            f"fold {self.index}: train {trained[0]}..{trained[-1]} ({len(trained)} days){held}, "
            f"validate {self.val_days[0]}..{self.val_days[-1]} ({len(self.val_days)} days)"
        )


def days_needed(cfg: FoldConfig) -> int:
    """Trading days the config's folds span."""
    return (cfg.n_folds - 1) * cfg.step_days + cfg.train_days + cfg.val_days


def max_folds(cfg: FoldConfig, n_days: int) -> int:
    """The largest n_folds whose windows fit in `n_days` trading days (0 if not even one fits)."""
    room = n_days - cfg.train_days - cfg.val_days
    return 0 if room < 0 else room // cfg.step_days + 1


def make_folds(cfg: FoldConfig, days: Sequence[str]) -> list[Fold]:
    """Expand the fold config over `days` (in time order); ConfigError if the days cannot hold the folds."""
    for name in ("n_folds", "train_days", "val_days", "step_days"):
        if getattr(cfg, name) < 1:
            raise ConfigError(f"folds.{name} must be at least 1, got {getattr(cfg, name)}")
    if cfg.purge_bars < 0:
        raise ConfigError(f"folds.purge_bars must be >= 0, got {cfg.purge_bars}")
    if not 0 <= cfg.select_days < cfg.train_days:
        raise ConfigError(
            f"folds.select_days must be in [0, folds.train_days = {cfg.train_days}), got {cfg.select_days}"
        )
    need = days_needed(cfg)
    if need > len(days):
        raise ConfigError(
            f"{cfg.n_folds} folds of {cfg.train_days} training + {cfg.val_days} validation days, advancing "
            f"{cfg.step_days} days per fold, need {need} trading days; the market has {len(days)} "
            "(lower folds.n_folds, folds.train_days or folds.step_days, or use more days)"
        )
    folds = []
    for k in range(cfg.n_folds):
        train_stop = k * cfg.step_days + cfg.train_days
        train_first = 0 if cfg.anchored else k * cfg.step_days
        folds.append(
            Fold(k, train_first, train_stop, train_stop, train_stop + cfg.val_days, tuple(days), cfg.purge_bars,
                 cfg.select_days)
        )
    return folds
