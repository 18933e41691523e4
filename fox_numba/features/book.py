"""The close book as the TLOB encoder's input (network.tlob_window; agent/tlob.py): one snapshot of BOOK_FEATURES
columns per bar, normalised with statistics of the training window only (as features/normalise.py does the bar
features), so no bar after the window touches them.

    raw = book_snapshot(bid_px, ask_px, bid_sz, ask_sz, mid, tick_size)      float64 [n, BOOK_FEATURES], NaN: missing
    stats = fit_book_normaliser(raw, train_rows)                              per-column mean and std of present values
    book_obs = apply_book_normaliser(raw, stats, clip_sigma)                  float32 [n, BOOK_FEATURES], all finite

Columns, level k = 0 (best) .. N_LEVELS - 1: [bid price k | ask price k | bid size k | ask size k] in four blocks of
N_LEVELS: a price is (level price - close mid) / tick (negative on the bid side), a size log1p(size). A level without
a price (NaN) or without size (<= 0) is missing: its price and size columns are NaN in `raw`, left out of the
statistics, and 0 (the training mean) after normalisation; a column with no present value in the training window
normalises with mean 0 and std 1 (its later values are clipped like any other).
"""

from __future__ import annotations

import numpy as np

from fox_numba.features.normalise import STD_FLOOR, NormStats, apply_normaliser
from fox_numba.market.schema import N_LEVELS

BOOK_FEATURES = 4 * N_LEVELS
"""Columns of a book snapshot: price and size of each level on each side."""


def book_snapshot(bid_px: np.ndarray, ask_px: np.ndarray, bid_sz: np.ndarray, ask_sz: np.ndarray, mid: np.ndarray,
                  tick_size: float) -> np.ndarray:
    """float64 [n, BOOK_FEATURES] of the close book [n, N_LEVELS] per side and the close mid [n] (module header)."""
    mid = np.asarray(mid, np.float64)[:, None]
    prices = [(np.asarray(px, np.float64) - mid) / tick_size for px in (bid_px, ask_px)]
    sizes = [np.asarray(sz, np.float64) for sz in (bid_sz, ask_sz)]
    present = [np.isfinite(px) & (sz > 0) for px, sz in zip(prices, sizes, strict=True)]
    cols = [np.where(ok, px, np.nan) for px, ok in zip(prices, present, strict=True)]
    cols += [np.where(ok, np.log1p(np.maximum(sz, 0.0)), np.nan) for sz, ok in zip(sizes, present, strict=True)]
    return np.concatenate(cols, axis=1)


def fit_book_normaliser(raw: np.ndarray, train_rows: slice) -> NormStats:
    """Per-column mean and std (population, floored at STD_FLOOR) of the present (finite) values of `train_rows`;
    mean 0, std 1 for a column with none."""
    window = np.asarray(raw[train_rows], np.float64)
    present = np.isfinite(window)
    count = present.sum(axis=0)
    mean = np.where(present, window, 0.0).sum(axis=0) / np.maximum(count, 1)
    var = np.where(present, (window - mean) ** 2, 0.0).sum(axis=0) / np.maximum(count, 1)
    std = np.where(count > 0, np.maximum(np.sqrt(var), STD_FLOOR), 1.0)
    return NormStats(mean=mean, std=std, n_rows=int(window.shape[0]))


def apply_book_normaliser(raw: np.ndarray, stats: NormStats, clip_sigma: float) -> np.ndarray:
    """float32 [n, BOOK_FEATURES]: (raw - mean) / std clipped to +-clip_sigma, missing values 0."""
    z = apply_normaliser(raw, stats, clip_sigma)
    z[~np.isfinite(z)] = 0.0
    return z
