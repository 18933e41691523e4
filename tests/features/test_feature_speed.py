"""A default-sized market (120 days x 390 bars, 5-30 book events and trades a minute) builds in seconds."""

from __future__ import annotations

import time

import numpy as np

from fox_numba.config import FeatureConfig
from fox_numba.features import build_features
from fox_numba.market.schema import Instrument


def test_default_sized_market_builds_in_seconds(random_market):
    days = random_market(7, n_days=120, n_bars=390)
    build_features(days[:1], Instrument(), FeatureConfig())  # compile (or load the numba cache)
    start = time.perf_counter()
    fs = build_features(days, Instrument(), FeatureConfig())
    seconds = time.perf_counter() - start
    n_rows = sum(d.mbp10.ts_event.shape[0] for d in days)
    print(f"features: {fs.n_bars} bars, {n_rows} MBP-10 rows in {seconds:.3f} s")
    assert fs.values.shape == (120 * 390, len(fs.names)) == (120 * 390, 44) and np.isfinite(fs.values).all()
    assert seconds < 5.0
