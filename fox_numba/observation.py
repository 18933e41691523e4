"""The observation layout: one source of truth for every column the network sees.

An observation row is float32 [obs_dim(features)] = [market part | portfolio part (N_PORTFOLIO)]; the market
part is the N_MARKET feature columns, then one forecast column per features.forecast_horizons entry (none by
default, when obs_dim is OBS_DIM):

- Market part, precomputed on the host once per fold for every bar of the fold (`market_part`): the bar's
  fold-normalised features z (features/normalise.py, statistics from the fold's training rows only), then
  for each half-life h in EMA_HALF_LIVES the per-day EMA of z, restarting at each day's first bar:
      ema[t] = ema[t - 1] + alpha_h * (z[t] - ema[t - 1]),  alpha_h = 1 - 0.5**(1/h),  from
      ema[first - 1] = z[first] (features.ema_start 'first': ema[first] = z[first]) or 0 ('zero')
  Each column of a bar uses that bar and earlier bars of its day only: no look-ahead. A forecast column is a
  linear function of the bar's feature columns fitted on the fold's training rows (features/forecast.py).
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
from fox_numba.features.names import FEATURE_INDEX, FEATURE_NAMES, FEATURES
from fox_numba.io import generated_doc_main

EMA_HALF_LIVES: tuple[int, ...] = (3, 10, 30)
"""Half-lives in bars of the per-day EMAs of the normalised features."""
N_FEATURES = len(FEATURE_NAMES)
N_MARKET = N_FEATURES * (1 + len(EMA_HALF_LIVES))

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
"""The observation's width without forecast columns (`obs_dim`)."""

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
(order-flow and trade imbalances, returns, depth imbalances, the microprice offset, their EMAs, the forecast
columns, the position and the order's side). Normalised columns flip exactly where their training mean is 0
(network.mirror; tools/symmetry_probe.py)."""

Z_REALISED_VOL = FEATURE_INDEX["realised_vol_15"]
"""Market column of the bar's normalised realised_vol_15 (the regime penalty's volatility)."""

OBSERVATION_DOC_PATH = Path(__file__).with_name("OBSERVATION.md")


def market_columns(features: FeatureConfig) -> int:
    """Columns of the market part: the feature blocks, then one per forecast horizon."""
    return N_MARKET + len(features.forecast_horizons)


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
    """Every observation column's name, in order (`z.ofi_l1`, ..., `ema30.session_frac`, [`forecast.h15`...,]
    `port.position`...); without `features`, the layout without forecast columns."""
    market = tuple(f"{block}.{name}" for block in market_block_names() for name in FEATURE_NAMES)
    horizons = features.forecast_horizons if features is not None else []
    return market + tuple(f"forecast.h{h}" for h in horizons) + tuple(f"port.{name}" for name, _ in PORTFOLIO)


def market_part(z: np.ndarray, day_start: np.ndarray, ema_start: str) -> np.ndarray:
    """The market part float32 [n, N_MARKET] of normalised features z [n, N_FEATURES] whose days start at
    rows day_start[0] = 0 < ... < day_start[-1] = n (EMAs restart at every day's first row from that row's z, or
    from 0 with ema_start 'zero': features.ema_start; float64 inside)."""
    z = np.asarray(z)
    day_start = np.asarray(day_start, np.int64)
    if z.ndim != 2 or z.shape[1] != N_FEATURES:
        raise ValueError(f"z must be [n, {N_FEATURES}], got {z.shape}")
    n = z.shape[0]
    if day_start.ndim != 1 or day_start.size < 2 or day_start[0] != 0 or day_start[-1] != n:
        raise ValueError(f"day_start must run from 0 to the {n} rows, got {day_start}")
    if np.any(np.diff(day_start) <= 0):
        raise ValueError("day_start must be strictly increasing (no empty days)")
    z64 = z.astype(np.float64)
    out = np.empty((n, N_MARKET), np.float32)
    out[:, :N_FEATURES] = z
    first = np.zeros(n, bool)
    first[day_start[:-1]] = True
    if ema_start not in ("first", "zero"):
        raise ValueError(f"ema_start must be 'first' or 'zero', got {ema_start!r}")
    for k, h in enumerate(EMA_HALF_LIVES):
        alpha = ema_alpha(h)
        ema = np.empty_like(z64)
        for t in range(n):
            before = (z64[t] if ema_start == "first" else 0.0) if first[t] else ema[t - 1]
            ema[t] = before + alpha * (z64[t] - before)
        out[:, (k + 1) * N_FEATURES : (k + 2) * N_FEATURES] = ema
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def observation_table_markdown() -> str:
    """The column table as markdown: one row per market block (its 32 features listed once) and one per
    portfolio column."""
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
            "(features.ema_start = 'zero', the default) or from that bar's z ('first')."
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
    lines += [
        "",
        "## Forecast columns (features.forecast_horizons)",
        "",
        (
            f"With horizons h_1 .. h_k set, columns {N_MARKET} .. {N_MARKET} + k - 1 hold `forecast.h{{h}}`: the "
            f"ridge forecast of the mid change over the next h bars from the bar's {N_MARKET} feature columns "
            "(penalty features.forecast_ridge per row), fitted on the fold's training rows, standardised on them "
            "and clipped to +-features.clip_sigma (features/forecast.py); the portfolio part then starts at "
            f"column {N_MARKET} + k. None by default (the table below)."
        ),
        "",
        "## Portfolio part",
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
