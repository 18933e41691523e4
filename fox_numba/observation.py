"""The observation layout: one source of truth for every column the network sees.

An observation row is float32 [obs_dim(features)] = [market part | portfolio part (N_PORTFOLIO)]; the market
part is the N_MARKET feature columns, with features.tw_imbalance the N_TW_IMBALANCE columns of the time-weighted
book imbalance (`feature_columns` in all; on by default), then one forecast column per features.forecast_horizons
entry (none by default; without either block obs_dim is OBS_DIM):

- Market part, precomputed on the host once per fold for every bar of the fold (`feature_part`): each block of
  `market_part`, of the bar's fold-normalised features z (features/normalise.py, statistics from the fold's training
  rows only; the time-weighted imbalance's, when on, normalised alike, in a block of its own): z, then for each
  half-life h in EMA_HALF_LIVES the per-day EMA of z, restarting at each day's first bar:
      ema[t] = ema[t - 1] + alpha_h * (z[t] - ema[t - 1]),  alpha_h = 1 - 0.5**(1/h),  from
      ema[first - 1] = z[first] (features.ema_start 'first': ema[first] = z[first]) or 0 ('zero')
  Each column of a bar uses that bar and earlier bars of its day only: no look-ahead. A forecast column is a
  linear function of the bar's `feature_columns` fitted on the fold's training rows (features/forecast.py).
- Portfolio part, computed on the device from an environment's state every step (kernels/env.py).

Kernels read the plain-int constants below (numba freezes module globals at compile time).
`python -m fox_numba.observation --write` regenerates OBSERVATION.md beside this file (a test checks it
is current).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from fox_numba.config import FeatureConfig
from fox_numba.features.names import (
    FEATURE_INDEX,
    FEATURE_NAMES,
    FEATURES,
    TW_IMBALANCE_COLUMNS,
    TW_IMBALANCE_FEATURES,
)
from fox_numba.io import generated_doc_main
from fox_numba.jitcache import cached_njit

EMA_HALF_LIVES: tuple[int, ...] = (3, 10, 30)
"""Half-lives in bars of the per-day EMAs of the normalised features."""
N_FEATURES = len(FEATURE_NAMES)
N_MARKET = N_FEATURES * (1 + len(EMA_HALF_LIVES))
N_TW_IMBALANCE = len(TW_IMBALANCE_COLUMNS) * (1 + len(EMA_HALF_LIVES))
"""Market columns of the time-weighted imbalance block (features.tw_imbalance), after the N_MARKET feature columns."""

UPNL_CLIP = 5.0
"""The unrealised-PnL column is clipped to +-UPNL_CLIP risk units."""
ORDER_DIST_TICKS = 10.0
"""The resting-order distance column is (distance in ticks) / ORDER_DIST_TICKS."""

PORTFOLIO: tuple[tuple[str, str], ...] = (
    ("position", "Signed position / env.max_position, in [-1, 1]."),
    (
        "unrealised_pnl",
        (
            f"Unrealised PnL of the open position at the bar's close mid, (mid - average entry) * position * "
            f"point value, / the fold's risk unit, clipped to +-{UPNL_CLIP:g}; 0 when flat or with "
            "env.position_history = false."
        ),
    ),
    (
        "bars_in_position",
        "Bars the position has been held on its current side / env.episode_bars, capped at 1; 0 when flat or with "
        "env.position_history = false.",
    ),
    ("order_side", "Side of the resting limit order: +1 buy, -1 sell, 0 none."),
    (
        "order_distance",
        (
            f"order_side x (order price - close mid) in ticks / {ORDER_DIST_TICKS:g}: negative = passive (a buy "
            "below the mid, a sell above it); 0 without an order."
        ),
    ),
    (
        "bars_left",
        (
            "Bars left in the episode (last bar - this bar) / env.episode_bars, capped at 1 (an evaluation day "
            "longer than an episode reads 1 until its last episode_bars bars)."
        ),
    ),
)
"""(name, meaning) of the portfolio columns, in order."""
N_PORTFOLIO = len(PORTFOLIO)
OBS_DIM = N_MARKET + N_PORTFOLIO
"""The observation's width without the time-weighted imbalance block and forecast columns (`obs_dim` with
features.tw_imbalance = false and no forecast horizons; the default adds the block's N_TW_IMBALANCE)."""

# Portfolio column indices within the portfolio part (kernels add N_MARKET for the observation row).
PORT_POSITION, PORT_UPNL, PORT_BARS_IN_POS, PORT_ORDER_SIDE, PORT_ORDER_DIST, PORT_BARS_LEFT = range(N_PORTFOLIO)

MIRROR_EVEN: frozenset[str] = frozenset({
    "log_volume", "log_trade_count", "range_rel", "realised_vol_15", "spread_close_ticks", "spread_mean_ticks",
    "log_depth", "log_book_events", "tod_sin", "tod_cos", "session_frac",
    "unrealised_pnl", "bars_in_position", "order_distance", "bars_left",
})
"""The features and portfolio columns the market's mirror leaves unchanged (every price reflected about a level, so
buyers and sellers swap and every price change flips sign): sizes, counts, ranges, volatility, spreads, depth, the
time of day, and the portfolio's PnL, holding time, order distance and time left. Every other column changes sign
(order-flow and trade imbalances, returns, depth imbalances, the close book's and the time-weighted ones, the
microprice offset, their EMAs, the forecast columns, the position and the order's side). Normalised columns flip
exactly where their training mean is 0 (network.mirror; tools/symmetry_probe.py)."""

Z_REALISED_VOL = FEATURE_INDEX["realised_vol_15"]
"""Market column of the bar's normalised realised_vol_15 (the regime penalty's volatility)."""

OBSERVATION_DOC_PATH = Path(__file__).with_name("OBSERVATION.md")


def feature_columns(features: FeatureConfig) -> int:
    """Columns of the market part's feature blocks (N_MARKET, + N_TW_IMBALANCE with features.tw_imbalance): what the
    probe, the forecast columns and a Mamba2 encoder read."""
    return N_MARKET + (N_TW_IMBALANCE if features.tw_imbalance else 0)


def market_columns(features: FeatureConfig) -> int:
    """Columns of the market part: the feature blocks, then one per forecast horizon."""
    return feature_columns(features) + len(features.forecast_horizons)


def obs_dim(features: FeatureConfig) -> int:
    """Columns of an observation row under `features`."""
    return market_columns(features) + N_PORTFOLIO


def ema_alpha(half_life: float) -> float:
    """EMA weight of the newest bar for a half-life in bars."""
    return 1.0 - 0.5 ** (1.0 / half_life)


def market_block_names() -> tuple[str, ...]:
    """Prefixes of the market blocks in order: z, then ema{h} per half-life."""
    return ("z",) + tuple(f"ema{h}" for h in EMA_HALF_LIVES)


def column_names(features: FeatureConfig | None = None) -> tuple[str, ...]:
    """Every observation column's name, in order (`z.ofi_l1`, ..., `ema30.session_frac`, [`z.tw_imbalance_l1`, ...,
    `ema30.tw_imbalance_l1_10`,] [`forecast.h15`...,] `port.position`...); without `features`, the default layout."""
    features = features if features is not None else FeatureConfig()
    parts = FEATURE_NAMES, *([TW_IMBALANCE_COLUMNS] if features.tw_imbalance else [])
    market = tuple(f"{block}.{name}" for names in parts for block in market_block_names() for name in names)
    horizons = features.forecast_horizons
    return market + tuple(f"forecast.h{h}" for h in horizons) + tuple(f"port.{name}" for name, _ in PORTFOLIO)


def feature_part(z: np.ndarray, day_start: np.ndarray, ema_start: str) -> np.ndarray:
    """The market part's feature blocks float32 [n, N_MARKET (+ N_TW_IMBALANCE)] of normalised values z [n,
    N_FEATURES (+ len(TW_IMBALANCE_COLUMNS) with features.tw_imbalance)]: `market_part` of the features, then of the
    time-weighted imbalance (each column of z and its EMAs, as `column_names` orders them)."""
    z = np.asarray(z)
    widths = (N_FEATURES, N_FEATURES + len(TW_IMBALANCE_COLUMNS))
    if z.ndim != 2 or z.shape[1] not in widths:
        raise ValueError(f"z must be [n, {widths[0]}] or [n, {widths[1]}] (features.tw_imbalance), got {z.shape}")
    blocks = [market_part(z[:, :N_FEATURES], day_start, ema_start)]
    if z.shape[1] > N_FEATURES:
        blocks.append(market_part(z[:, N_FEATURES:], day_start, ema_start))
    return np.concatenate(blocks, axis=1)


def market_part(z: np.ndarray, day_start: np.ndarray, ema_start: str) -> np.ndarray:
    """float32 [n, c (1 + len(EMA_HALF_LIVES))]: normalised columns z [n, c], then each EMA block of them, of rows
    whose days start at rows day_start[0] = 0 < ... < day_start[-1] = n (EMAs restart at every day's first row from
    that row's z, or from 0 with ema_start 'zero': features.ema_start; float64 inside). Column k c + j is block k
    (z, ema3, ema10, ema30) of column j."""
    z = np.asarray(z)
    day_start = np.asarray(day_start, np.int64)
    if z.ndim != 2 or z.shape[1] < 1:
        raise ValueError(f"z must be [n, c >= 1], got {z.shape}")
    n, c = z.shape
    if day_start.ndim != 1 or day_start.size < 2 or day_start[0] != 0 or day_start[-1] != n:
        raise ValueError(f"day_start must run from 0 to the {n} rows, got {day_start}")
    if np.any(np.diff(day_start) <= 0):
        raise ValueError("day_start must be strictly increasing (no empty days)")
    z64 = z.astype(np.float64)
    out = np.empty((n, c * (1 + len(EMA_HALF_LIVES))), np.float32)
    out[:, :c] = z
    first = np.zeros(n, bool)
    first[day_start[:-1]] = True
    if ema_start not in ("first", "zero"):
        raise ValueError(f"ema_start must be 'first' or 'zero', got {ema_start!r}")
    for k, h in enumerate(EMA_HALF_LIVES):
        out[:, (k + 1) * c : (k + 2) * c] = _day_emas(z64, first, ema_alpha(h), ema_start == "first")
    return out


@cached_njit()
def _day_emas(z: np.ndarray, first: np.ndarray, alpha: float, from_first: bool) -> np.ndarray:
    """float64 [n, c]: ema[t] = before + alpha (z[t] - before), before = ema[t - 1], or at a day's first row
    (first[t]) z[t] (from_first) or 0. Compiled: a fold's 27 k rows x 3 half-lives took ~0.3 s as a Python loop
    over rows, every fold of every run."""
    n, c = z.shape
    ema = np.empty_like(z)
    for t in range(n):
        for j in range(c):
            if first[t]:
                before = z[t, j] if from_first else 0.0
            else:
                before = ema[t - 1, j]
            ema[t, j] = before + alpha * (z[t, j] - before)
    return ema


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def observation_table_markdown() -> str:
    """The column table as markdown: one row per market block (its 32 features listed once), the time-weighted
    imbalance block's columns, and one row per portfolio column."""
    meanings = dict(FEATURES)
    lines = [
        "# Observation columns",
        "",
        "Generated by `python -m fox_numba.observation --write` from `fox_numba/observation.py`; do not edit.",
        "",
        (
            f"OBS_DIM = {OBS_DIM} float32 columns: the market part (N_MARKET = {N_MARKET}, precomputed per fold "
            f"on the host) then the portfolio part (N_PORTFOLIO = {N_PORTFOLIO}, computed on the device each "
            "step). Market features are normalised with the fold's training-window statistics and clipped to "
            "+-features.clip_sigma; EMAs restart at each day's first bar (alpha = 1 - 0.5**(1/h)), from 0 "
            "(features.ema_start = 'zero', the default) or from that bar's z ('first'). The time-weighted book "
            "imbalance (features.tw_imbalance, on by default: the default observation has "
            f"{OBS_DIM + N_TW_IMBALANCE} columns) and the forecast columns (features.forecast_horizons, off by "
            "default) follow the feature blocks in that order, before the portfolio part."
        ),
        "",
        "## Market blocks",
        "",
        "| columns | block | meaning |",
        "| ---: | --- | --- |",
    ]
    for k, block in enumerate(market_block_names()):
        span = f"{k * N_FEATURES}-{(k + 1) * N_FEATURES - 1}"
        meaning = (
            "z = the bar's normalised feature"
            if k == 0
            else f"per-day EMA of z, half-life {EMA_HALF_LIVES[k - 1]} bars "
            f"(alpha = {ema_alpha(EMA_HALF_LIVES[k - 1]):.6f})"
        )
        lines.append(f"| {span} | `{block}` | {meaning}; column {k * N_FEATURES} + j is feature j below |")
    lines += ["", "## Features (j = column within a block)", "", "| j | feature | definition |", "| ---: | --- | --- |"]
    for j, name in enumerate(FEATURE_NAMES):
        lines.append(f"| {j} | `{name}` | {_cell(meanings[name])} |")
    n_tw, tw_end = len(TW_IMBALANCE_COLUMNS), N_MARKET + N_TW_IMBALANCE
    lines += [
        "",
        "## Time-weighted book imbalance (features.tw_imbalance)",
        "",
        (
            f"With features.tw_imbalance = true, columns {N_MARKET} .. {tw_end - 1} (N_TW_IMBALANCE = "
            f"{N_TW_IMBALANCE}) hold the {n_tw} columns below in the four blocks of the features, in the same "
            f"order: column {N_MARKET} + {n_tw} k + j is block k (`z`, then `ema{{h}}` per half-life) of column j, "
            f"from `z.{TW_IMBALANCE_COLUMNS[0]}` to `ema{EMA_HALF_LIVES[-1]}.{TW_IMBALANCE_COLUMNS[-1]}`. Each is "
            "computed from every MBP-10 row of the bar (features/book_features.py time_weighted_imbalance), "
            "normalised with the fold's training-window statistics and clipped to +-features.clip_sigma, with the "
            "features' per-day EMAs. Under the market's mirror every one changes sign. On by default since section 68 "
            "of tools/results/learner_ablation_h200.md."
        ),
        "",
        "| j | column | definition |",
        "| ---: | --- | --- |",
    ]
    for j, (name, meaning) in enumerate(TW_IMBALANCE_FEATURES):
        lines.append(f"| {j} | `{name}` | {_cell(meaning)} |")
    lines += [
        "",
        "## Forecast columns (features.forecast_horizons)",
        "",
        (
            f"With horizons h_1 .. h_k set, columns F .. F + k - 1 hold `forecast.h{{h}}`, F the feature columns "
            f"({N_MARKET}, or {tw_end} with the time-weighted imbalance): the ridge forecast of the mid change over "
            "the next h bars from the bar's F feature columns (penalty features.forecast_ridge per row), fitted on "
            "the fold's training rows, standardised on them and clipped to +-features.clip_sigma "
            "(features/forecast.py); the portfolio part then starts at column F + k. None by default."
        ),
        "",
        "## Portfolio part",
        "",
        f"Columns of the default layout: portfolio column j is column F + k + j ({N_MARKET} + j by default).",
        "",
        "| column | name | meaning |",
        "| ---: | --- | --- |",
    ]
    for j, (name, meaning) in enumerate(PORTFOLIO):
        lines.append(f"| {N_MARKET + j} | `port.{name}` | {_cell(meaning)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    return generated_doc_main(argv, OBSERVATION_DOC_PATH, observation_table_markdown(), "observation table")


if __name__ == "__main__":
    sys.exit(main())


def mirror_parity(features: FeatureConfig) -> np.ndarray:
    """float32 [obs_dim(features)]: +1 for each observation column the market's mirror leaves, -1 for one it negates
    (MIRROR_EVEN)."""
    even = [name.split(".", 1)[1] in MIRROR_EVEN for name in column_names(features)]
    return np.where(even, 1.0, -1.0).astype(np.float32)
