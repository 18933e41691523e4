"""The market of one walk-forward fold: host tensors of all its bars, and their one upload to the device.

A fold's bars are its training days followed by its validation days (contiguous rows of the FeatureSet);
rows are fold-local (row 0 = the first bar of the first training day). The training days may end in
selection days (folds.select_days): held out like the validation days, with the purge before them.
Built once per fold:

- normalisation fitted on the training rows less the purged tail only (`fit_normaliser`), applied to every
  bar of the fold (`apply_normaliser`), then the market part of the observation (z and its per-day EMAs,
  `observation.feature_part`: the features', then with features.tw_imbalance the time-weighted book imbalance's,
  whose raw columns follow the features in the FeatureSet's values; then a forecast column per
  features.forecast_horizons, fitted on the same
  training rows and cross-fitted on them: features/forecast.py): a bar's row depends on no later bar, and
  no statistic on any bar after the training window's purge start;
- the close book (10 levels x 2 sides, price float64 / size float32), the close mid, the per-bar trade
  summary for limit fills;
- `book_obs`, the TLOB encoder's input (network.tlob_window; features/book.py): each bar's close-book snapshot
  (prices in ticks from the close mid, log1p sizes), normalised with `book_stats`, fitted on the same training rows
  as the features (missing levels 0);
- fold-local `day_start`, `day_first[r]` (the first row of r's day), and `row_stop[r]`: the row after the last
  bar an episode through row r may use (the end of r's day; on the last training day the purge start, so no
  episode enters the purged tail);
- `train_starts`: every training row s from which an episode of env.episode_bars bars stays inside its
  day and out of the purged tail (s + episode_bars <= row_stop[s]); a training day with fewer usable bars
  than an episode (but at least 2) contributes its first row only, and its episodes run to its end; in
  row order, or with env.curriculum_epochs > 0 easiest first: by `start_difficulty` (ties in row order),
  the order the collect draw's curriculum ranks by (kernels/env.py);
- `start_difficulty`: per start, the realised volatility of its episode (`episode_volatility`);
- `val_windows`: one (start, stop) row pair per validation day (days of fewer than 2 bars hold no step
  and are left out); `select_windows` the same for the selection days (none without them);
- `risk_unit` (dollars) = env.max_position * point_value * std of the one-bar mid change over consecutive
  training rows of the same day (purged tail left out), so a full position moves ~1 unit per bar.

`aux_forecast_target(market, horizon)` is the learner's auxiliary regression target: the forward mid change
over `horizon` bars (the probe's target, `forward_change`) in units of its training-window standard
deviation, clipped to +-AUX_CLIP_SIGMA, and NaN wherever it would read a bar at or after the purge start
or past the row's day (so no label reaches into the purged tail or the validation days).

`upload(stager)` copies the tensors to the device once (`FoldMarketDevice`); the environment kernels of
the fold read them from there.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from fox_numba.config import EnvConfig, FeatureConfig
from fox_numba.device.staging import Stager
from fox_numba.errors import ConfigError
from fox_numba.features.book import apply_book_normaliser, book_snapshot, fit_book_normaliser
from fox_numba.features.feature_set import FeatureSet
from fox_numba.features.forecast import ForecastColumn, cross_fitted_column, forward_change
from fox_numba.features.names import feature_names
from fox_numba.features.normalise import NormStats, apply_normaliser, fit_normaliser
from fox_numba.observation import feature_part

MIN_EPISODE_BARS = 2
"""An episode needs two bars: one step acts at the first bar's close and is marked at the second's."""
AUX_CLIP_SIGMA = 5.0
"""The auxiliary target's clip, in training standard deviations (a rare jump does not dominate the loss)."""


class FoldWindows(Protocol):
    """What FoldMarket needs of a fold (`walkforward.folds.Fold` has it): day windows [first, stop) as
    indices into the FeatureSet's days, and the bars purged at the end of training (`build` turns these into
    rows: the one place the purge is derived)."""

    index: int
    train_first: int
    train_stop: int
    val_first: int
    val_stop: int
    purge_bars: int
    select_days: int


@dataclass(frozen=True)
class FoldMarket:
    """Host tensors of one fold (rows fold-local); see the module docstring."""

    fold_index: int
    row0: int
    """FeatureSet row of fold row 0."""
    days: tuple[str, ...]
    """The fold's trading days, training then validation."""
    market_obs: np.ndarray
    """float32 [n, observation.market_columns]: the market part of every bar's observation."""
    bid_px: np.ndarray
    """float64 [n, 10]: close-book bid prices, best first (NaN: empty level)."""
    ask_px: np.ndarray
    """float64 [n, 10]: close-book ask prices."""
    bid_sz: np.ndarray
    """float32 [n, 10]: close-book bid sizes (0: empty level)."""
    ask_sz: np.ndarray
    """float32 [n, 10]: close-book ask sizes."""
    book_obs: np.ndarray
    """float32 [n, BOOK_FEATURES]: the normalised close-book snapshot of every bar (features/book.py; zeros where no
    statistics exist: a market built from a checkpoint without BOOK_ARRAYS, which no TLOB network reads)."""
    mid: np.ndarray
    """float64 [n]: close mid."""
    trade_lo: np.ndarray
    """float64 [n]: lowest trade price of the bar (NaN without trades)."""
    trade_hi: np.ndarray
    """float64 [n]: highest trade price of the bar (NaN without trades)."""
    vol_lo: np.ndarray
    """float32 [n]: contracts traded at exactly trade_lo."""
    vol_hi: np.ndarray
    """float32 [n]: contracts traded at exactly trade_hi."""
    day_start: np.ndarray
    """int32 [n_days + 1]: fold-local first row of each day, then n."""
    row_stop: np.ndarray
    """int32 [n]: the row after the last bar an episode through this row may use."""
    train_starts: np.ndarray
    """int32 [n_starts]: episode starts of the training window (easiest first with the curriculum on)."""
    start_difficulty: np.ndarray
    """float64 [n_starts]: the curriculum's difficulty of each start (`episode_volatility`), host only."""
    val_windows: np.ndarray
    """int32 [n_windows, 2]: (start, stop) rows of each validation day."""
    select_windows: np.ndarray
    """int32 [n_select, 2]: (start, stop) rows of each selection day (n_select may be 0)."""
    train_stop: int
    """Fold row where the purged tail begins (training rows are 0 .. train_stop - 1)."""
    val_start: int
    """Fold row of the first validation bar."""
    stats: NormStats
    """The statistics of the FeatureSet's values (the features, then the time-weighted imbalance's with
    features.tw_imbalance): fitted on the training rows, or a checkpoint's."""
    book_stats: NormStats | None
    """The book snapshot's statistics (`fit_book_normaliser` on the training rows, or a checkpoint's)."""
    forecast: tuple[ForecastColumn, ...]
    """The forecast columns' fits, one per features.forecast_horizons entry."""
    risk_unit: float
    """Dollars per reward unit."""
    tick_size: float
    point_value: float
    episode_bars: int

    @property
    def n_rows(self) -> int:
        return int(self.mid.shape[0])

    @property
    def day_first(self) -> np.ndarray:
        """int32 [n]: the first row of each row's day (`day_first_rows`; the encoders' windows stop there)."""
        return day_first_rows(self.day_start)

    @classmethod
    def build(
        cls, fs: FeatureSet, fold: FoldWindows, features: FeatureConfig, env: EnvConfig, *,
        stats: NormStats | None = None, risk_unit: float | None = None, forecast: tuple[ForecastColumn, ...] = (),
        book_stats: NormStats | None = None,
    ) -> FoldMarket:
        """The fold's tensors from the run's FeatureSet (ConfigError when the fold cannot hold an episode).

        `stats` and `risk_unit` given (a trained network's, from its checkpoint, with its `forecast` columns
        when features.forecast_horizons is set) are used instead of being fitted on the training window, which
        may then be empty: `fox evaluate` backtests a checkpoint on
        any days this way, every selected day a validation day (the market then has no collect starts:
        `train_starts` holds the single row 0, which an evaluation environment never reads). `book_stats` given
        (a checkpoint's BOOK_ARRAYS) normalise the book snapshot; else they are fitted on the training rows, and
        without any the snapshot is zeros.
        """
        raw = fs.raw
        given = stats is not None and risk_unit is not None
        if fs.names != feature_names(features):
            raise ConfigError(f"fold {fold.index}: the feature set holds {len(fs.names)} columns per bar, features "
                              f"(tw_imbalance = {features.tw_imbalance}) needs {len(feature_names(features))}; "
                              "build the features with the run's features config")  # fmt: skip
        if not (0 <= fold.train_first <= fold.train_stop == fold.val_first < fold.val_stop <= fs.n_days) or (
            fold.train_first == fold.train_stop and not given
        ):
            raise ConfigError(
                f"fold {fold.index}: windows train {fold.train_first}..{fold.train_stop - 1}, validate "
                f"{fold.val_first}..{fold.val_stop - 1} must be consecutive days of the {fs.n_days} days"
            )
        if env.episode_bars < MIN_EPISODE_BARS:
            raise ConfigError(f"env.episode_bars is {env.episode_bars}; an episode needs at least {MIN_EPISODE_BARS}")
        if env.max_position < 1:
            raise ConfigError(f"env.max_position is {env.max_position}; it must be at least 1")
        if not 0 <= fold.select_days <= fold.train_stop - fold.train_first:
            raise ConfigError(f"fold {fold.index}: {fold.select_days} selection days in a training window of "
                              f"{fold.train_stop - fold.train_first}")  # fmt: skip
        select_first = fold.train_stop - fold.select_days
        g0 = int(raw.day_start[fold.train_first])
        g_val = int(raw.day_start[fold.val_first])
        g_held = int(raw.day_start[select_first])
        g_end = int(raw.day_start[fold.val_stop])
        g_train_stop = g_held - fold.purge_bars if select_first > fold.train_first else g0
        if g_train_stop <= g0 and not given:
            raise ConfigError(
                f"fold {fold.index}: purging {fold.purge_bars} bars leaves no training bars (the window has "
                f"{g_held - g0})"
            )
        rows = slice(g0, g_end)
        stats = stats if given else fit_normaliser(fs.values, slice(g0, g_train_stop))
        z = apply_normaliser(fs.values[rows], stats, features.clip_sigma)
        day_start = (np.asarray(raw.day_start[fold.train_first : fold.val_stop + 1]) - g0).astype(np.int32)
        train_stop, val_start, n = g_train_stop - g0, g_val - g0, g_end - g0
        mid = np.ascontiguousarray(raw.mid[rows], np.float64)
        feature_obs = feature_part(z, day_start, features.ema_start)
        if given:
            if len(forecast) != len(features.forecast_horizons):
                raise ConfigError(f"fold {fold.index}: {len(forecast)} forecast columns given for "
                                  f"features.forecast_horizons = {features.forecast_horizons}")  # fmt: skip
            columns = [c.apply(feature_obs, features.clip_sigma) for c in forecast]
        else:
            forecast, columns = fit_forecast_columns(feature_obs, mid, day_start, train_stop, features, fold.index)
        market_obs = np.column_stack([feature_obs, *columns])

        day_of_row = np.repeat(np.arange(day_start.size - 1), np.diff(day_start))
        row_stop = day_start[1:][day_of_row].astype(np.int32)
        in_train = np.arange(n) < train_stop
        row_stop[in_train] = np.minimum(row_stop[in_train], train_stop)

        starts = []
        for d in range(fold.train_stop - fold.train_first):
            first, stop = int(day_start[d]), min(int(day_start[d + 1]), train_stop)
            if stop - first >= env.episode_bars:
                starts.append(np.arange(first, stop - env.episode_bars + 1))
            elif stop - first >= MIN_EPISODE_BARS:
                starts.append(np.array([first]))
        if not starts and not given:
            raise ConfigError(f"fold {fold.index}: no training day holds an episode of {MIN_EPISODE_BARS}+ bars")
        train_starts = np.concatenate(starts).astype(np.int32) if starts else np.zeros(1, np.int32)
        difficulty = (episode_volatility(mid, train_starts, row_stop, env.episode_bars) if starts
                      else np.zeros(1, np.float64))  # fmt: skip
        if env.curriculum_epochs > 0:
            order = np.argsort(difficulty, kind="stable")
            train_starts, difficulty = train_starts[order], difficulty[order]

        def day_windows(first: int, stop: int, what: str) -> np.ndarray:
            windows = [(int(day_start[d]), int(day_start[d + 1])) for d in range(first, stop)]
            windows = [w for w in windows if w[1] - w[0] >= MIN_EPISODE_BARS]
            if not windows and stop > first:
                raise ConfigError(f"fold {fold.index}: no {what} day has {MIN_EPISODE_BARS}+ bars")
            return np.array(windows, np.int32).reshape(-1, 2)

        val_windows = day_windows(fold.val_first - fold.train_first, fold.val_stop - fold.train_first, "validation")
        select_windows = day_windows(select_first - fold.train_first, fold.train_stop - fold.train_first, "selection")

        if not given:
            same_day = day_of_row[1:train_stop] == day_of_row[: train_stop - 1]
            moves = np.diff(mid[:train_stop])[same_day]
            if moves.size == 0 or not np.std(moves) > 0:
                raise ConfigError(
                    f"fold {fold.index}: the close mid never moves within a training day; no risk unit can be set"
                )
            risk_unit = float(env.max_position * raw.point_value * np.std(moves))

        raw_book = book_snapshot(raw.bid_px[rows], raw.ask_px[rows], raw.bid_sz[rows], raw.ask_sz[rows], mid,
                                 float(raw.tick_size))
        if book_stats is None and train_stop > 0:
            book_stats = fit_book_normaliser(raw_book, slice(0, train_stop))
        book_obs = (apply_book_normaliser(raw_book, book_stats, features.clip_sigma) if book_stats is not None
                    else np.zeros(raw_book.shape, np.float32))  # fmt: skip

        def f64(a: np.ndarray) -> np.ndarray:
            return np.ascontiguousarray(a[rows], np.float64)

        def f32(a: np.ndarray) -> np.ndarray:
            return np.ascontiguousarray(a[rows], np.float32)

        return cls(
            fold_index=fold.index,
            row0=g0,
            days=tuple(fs.days[fold.train_first : fold.val_stop]),
            market_obs=np.ascontiguousarray(market_obs, np.float32),
            bid_px=f64(raw.bid_px),
            ask_px=f64(raw.ask_px),
            bid_sz=f32(raw.bid_sz),
            ask_sz=f32(raw.ask_sz),
            book_obs=np.ascontiguousarray(book_obs, np.float32),
            mid=mid,
            trade_lo=f64(raw.trade_lo),
            trade_hi=f64(raw.trade_hi),
            vol_lo=f32(raw.vol_lo),
            vol_hi=f32(raw.vol_hi),
            day_start=day_start,
            row_stop=row_stop,
            train_starts=train_starts,
            start_difficulty=difficulty,
            val_windows=val_windows,
            select_windows=select_windows,
            train_stop=train_stop,
            val_start=val_start,
            stats=stats,
            book_stats=book_stats,
            forecast=tuple(forecast),
            risk_unit=float(risk_unit),
            tick_size=float(raw.tick_size),
            point_value=float(raw.point_value),
            episode_bars=int(env.episode_bars),
        )

    def checkpoint_arrays(self) -> dict[str, np.ndarray]:
        """What a checkpoint keeps of the fold's market so that its network can be evaluated on other days:
        the normalisation statistics (of the time-weighted imbalance's columns too, with features.tw_imbalance) and the
        risk unit (CHECKPOINT_ARRAYS), and the forecast columns' fits
        (FORECAST_ARRAYS) where the run has them, and the book snapshot's statistics (BOOK_ARRAYS) where the market
        has them."""
        out = {
            "market.norm_mean": np.asarray(self.stats.mean, np.float64),
            "market.norm_std": np.asarray(self.stats.std, np.float64),
            "market.risk_unit": np.asarray(self.risk_unit, np.float64),
        }
        if self.forecast:
            out["market.forecast_weights"] = np.stack([c.weights for c in self.forecast]).astype(np.float64)
            out["market.forecast_offset"] = np.array([c.offset for c in self.forecast], np.float64)
        if self.book_stats is not None:
            out["market.book_mean"] = np.asarray(self.book_stats.mean, np.float64)
            out["market.book_std"] = np.asarray(self.book_stats.std, np.float64)
        return out

    def upload(self, stager: Stager) -> FoldMarketDevice:
        """Copy every tensor to the device (once per fold)."""
        arrays = {name: stager.upload_new(getattr(self, name)) for name in DEVICE_TENSORS}
        return FoldMarketDevice(host=self, **arrays)


CHECKPOINT_ARRAYS: tuple[str, ...] = ("market.norm_mean", "market.norm_std", "market.risk_unit")
"""The names `FoldMarket.checkpoint_arrays` always writes."""
FORECAST_ARRAYS: tuple[str, ...] = ("market.forecast_weights", "market.forecast_offset")
"""The names it adds for a run with forecast columns (weights [k, observation.feature_columns], offsets [k])."""
BOOK_ARRAYS: tuple[str, ...] = ("market.book_mean", "market.book_std")
"""The names it adds for a market with book statistics (every trained fold's; [BOOK_FEATURES] each), which a
checkpoint of a TLOB network (network.tlob_window) needs."""


def forecast_from_checkpoint(arrays: dict[str, np.ndarray]) -> tuple[ForecastColumn, ...]:
    """The forecast columns a checkpoint's arrays keep (none where it has no FORECAST_ARRAYS)."""
    if FORECAST_ARRAYS[0] not in arrays:
        return ()
    weights, offsets = (np.asarray(arrays[name], np.float64) for name in FORECAST_ARRAYS)
    return tuple(ForecastColumn(w, float(b)) for w, b in zip(weights, offsets, strict=True))


def book_stats_from_checkpoint(arrays: dict[str, np.ndarray]) -> NormStats | None:
    """The book snapshot's statistics a checkpoint's arrays keep (None where it has no BOOK_ARRAYS)."""
    if BOOK_ARRAYS[0] not in arrays:
        return None
    mean, std = (np.asarray(arrays[name], np.float64) for name in BOOK_ARRAYS)
    return NormStats(mean=mean, std=std, n_rows=0)


def fit_forecast_columns(feature_obs: np.ndarray, mid: np.ndarray, day_start: np.ndarray, train_stop: int,
                         features: FeatureConfig, fold: int) -> tuple[tuple[ForecastColumn, ...], list[np.ndarray]]:
    """Per features.forecast_horizons entry: the fit on rows 0 .. train_stop - 1 and the column of every row,
    cross-fitted over features.forecast_blocks on the training rows (features/forecast.py)."""
    horizons = features.forecast_horizons
    if any(h < 1 for h in horizons) or len(set(horizons)) != len(horizons) or features.forecast_ridge < 0 or (
        features.forecast_blocks < 1
    ):
        raise ConfigError(f"features.forecast_horizons must be distinct bar counts >= 1, features.forecast_ridge >= 0 "
                          f"and features.forecast_blocks >= 1; got {horizons}, {features.forecast_ridge} and "
                          f"{features.forecast_blocks}")  # fmt: skip
    try:
        fits = [cross_fitted_column(feature_obs, mid, day_start, train_stop, horizon=h, ridge=features.forecast_ridge,
                                    blocks=features.forecast_blocks, clip=features.clip_sigma) for h in horizons]
    except ValueError as e:
        raise ConfigError(f"fold {fold}: forecast columns (features.forecast_horizons, forecast_blocks): {e}") from None
    return tuple(f for f, _ in fits), [c for _, c in fits]


DEVICE_TENSORS: tuple[str, ...] = (
    "market_obs",
    "bid_px",
    "ask_px",
    "bid_sz",
    "ask_sz",
    "book_obs",
    "mid",
    "trade_lo",
    "trade_hi",
    "vol_lo",
    "vol_hi",
    "day_start",
    "day_first",
    "row_stop",
    "train_starts",
    "val_windows",
)
"""The FoldMarket arrays that go to the device, each under its own name."""


@dataclass(frozen=True)
class FoldMarketDevice:
    """The device copies of a FoldMarket's tensors (same names, shapes and dtypes) and the host record."""

    host: FoldMarket
    market_obs: Any
    bid_px: Any
    ask_px: Any
    bid_sz: Any
    ask_sz: Any
    book_obs: Any
    mid: Any
    trade_lo: Any
    trade_hi: Any
    vol_lo: Any
    vol_hi: Any
    day_start: Any
    day_first: Any
    row_stop: Any
    train_starts: Any
    val_windows: Any

    @property
    def n_rows(self) -> int:
        return self.host.n_rows

    def on_selection_days(self, stager: Stager) -> FoldMarketDevice:
        """The same market with the selection days as its evaluation windows (for a second Evaluator; the
        other tensors are shared, not copied)."""
        if self.host.select_windows.shape[0] == 0:
            raise ConfigError(f"fold {self.host.fold_index} has no selection days (folds.select_days = 0)")
        host = dataclasses.replace(self.host, val_windows=self.host.select_windows)
        return dataclasses.replace(self, host=host, val_windows=stager.upload_new(host.val_windows))


def day_first_rows(day_start: np.ndarray) -> np.ndarray:
    """int32 [R]: the first row of each row's day, from day_start [n_days + 1] (each day's first row, then R)."""
    return np.repeat(day_start[:-1], np.diff(day_start)).astype(np.int32)


def episode_volatility(mid: np.ndarray, starts: np.ndarray, row_stop: np.ndarray, episode_bars: int) -> np.ndarray:
    """float64 [n_starts]: the curriculum's difficulty of each episode start s, the realised volatility of its
    episode: the root mean square of the one-bar close-mid changes over rows s .. last, last = min(s +
    episode_bars, row_stop[s]) - 1, the bars the episode is marked at (summed in bar order).

    Why volatility: a step's reward is the mark-to-market change of the position, so the bars' volatility
    sets the reward noise around what an action is worth; on calm windows the costs of trading (spread,
    commission) stand out and the C51 targets are least noisy, volatile windows bury them. It reads only the
    episode's own bars: a training start's episode ends before the purge start (row_stop), so no bar at or
    after it, nor of the validation days, enters the ranking.
    """
    starts = starts.astype(np.int64)
    moves = np.minimum(starts + episode_bars, row_stop[starts]) - 1 - starts  # >= 1 (episodes of 2+ bars)
    top = int((starts + moves).max()) + 1
    sq = np.concatenate([np.diff(mid[:top]) ** 2, np.zeros(int(moves.max()))])  # zeros: past a short episode
    total = np.zeros(starts.size)
    for j in range(int(moves.max())):
        total += np.where(j < moves, sq[starts + j], 0.0)
    return np.sqrt(total / moves)


def aux_forecast_target(market: FoldMarket, horizon: int) -> np.ndarray:
    """float32 [n]: the auxiliary regression target of every fold row (module docstring); all NaN for a
    market without training rows (`fox evaluate`'s), which trains nothing."""
    if horizon < 1:
        raise ConfigError(f"learner.aux_horizon_bars is {horizon}; it must be at least 1")
    y = forward_change(market.mid, market.day_start, horizon)
    y[max(market.train_stop - horizon, 0) :] = np.nan
    if market.train_stop == 0:
        return y.astype(np.float32)
    seen = y[np.isfinite(y)]
    if seen.size < 2 or not np.std(seen) > 0:
        raise ConfigError(
            f"fold {market.fold_index}: no {horizon}-bar forward mid change varies within the training window "
            "(learner.aux_horizon_bars too long for its days?)"
        )
    return np.clip(y / np.std(seen), -AUX_CLIP_SIGMA, AUX_CLIP_SIGMA).astype(np.float32)
