"""Feature normalisation fitted on a training window only, then applied to any bars (no look-ahead).

The walk-forward driver fits on a fold's training rows and applies the same statistics to its
validation rows; each row is normalised on its own, so a bar after the window never touches the
statistics nor any normalised row at or before the window.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fox_numba.errors import ConfigError

STD_FLOOR = 1e-8
"""Smallest standard deviation divided by: a feature (nearly) constant in the window maps to ~0 there
instead of dividing by ~0. It sits well below the smallest real feature scale (one-bar returns, ~1e-4)."""


@dataclass(frozen=True)
class NormStats:
    """Per-feature mean and floored standard deviation (float64 [n_features]) of a training window."""

    mean: np.ndarray
    std: np.ndarray
    n_rows: int
    """Training rows the statistics were fitted on."""


def fit_normaliser(values: np.ndarray, train_rows: slice | np.ndarray) -> NormStats:
    """Mean and std (population, floored at STD_FLOOR) of each column over `train_rows` of `values` only."""
    window = np.asarray(values[train_rows], dtype=np.float64)
    if window.ndim != 2 or window.shape[0] == 0:
        raise ConfigError("the normalisation window holds no bars; a fold's training window must not be empty")
    if not np.isfinite(window).all():
        row, col = np.argwhere(~np.isfinite(window))[0]
        raise ValueError(f"feature column {col} is not finite in row {row} of the normalisation window")
    mean = window.mean(axis=0)
    std = np.maximum(window.std(axis=0), STD_FLOOR)
    return NormStats(mean=mean, std=std, n_rows=int(window.shape[0]))


def apply_normaliser(values: np.ndarray, stats: NormStats, clip_sigma: float) -> np.ndarray:
    """(values - mean) / std clipped to +-clip_sigma, as float32 [n_rows, n_features] (the observation)."""
    if values.shape[-1] != stats.mean.shape[0]:
        raise ValueError(f"values have {values.shape[-1]} features, the statistics {stats.mean.shape[0]}")
    if not clip_sigma > 0:
        raise ConfigError(f"features.clip_sigma is {clip_sigma}; it must be positive")
    z = (np.asarray(values, dtype=np.float64) - stats.mean) / stats.std
    return np.clip(z, -clip_sigma, clip_sigma).astype(np.float32)
