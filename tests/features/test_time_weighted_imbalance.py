"""features/book_features.py time_weighted_imbalance: every bar and column against a float64 loop."""

from __future__ import annotations

import numpy as np

from fox_numba.features.book_features import TW_IMBALANCE_COLUMNS, time_weighted_imbalance

MINUTE = 60_000_000_000


def test_time_weighted_imbalance_against_a_loop(rng):
    """Every bar and column against a float64 loop over the book states: a state weighs the time it rests inside the
    bar (from its timestamp, or the bar's start for the one entering it, to the next state or the bar's end); the
    per-level, levels 1-5 and 1-10 imbalances (bid - ask) / (bid + ask), 0 where both sides are empty. Random sizes
    with empty levels, several states a bar at random times, and a bar whose only state entered before it."""
    n_rows, n_bars = 60, 5
    bar_ts = np.arange(n_bars, dtype=np.int64) * MINUTE + 7 * MINUTE
    book_ts = np.sort(rng.integers(bar_ts[0] - MINUTE // 2, bar_ts[-2] + MINUTE, n_rows))  # the last bar: none
    bid = rng.integers(1, 50, (n_rows, 10)).astype(np.float64) * (rng.random((n_rows, 10)) > 0.2)
    ask = rng.integers(1, 50, (n_rows, 10)).astype(np.float64) * (rng.random((n_rows, 10)) > 0.2)
    bid[3, 4] = ask[3, 4] = 0.0  # a level empty on both sides
    got = time_weighted_imbalance(book_ts, bid, ask, bar_ts)
    assert got.shape == (n_bars, len(TW_IMBALANCE_COLUMNS)) == (n_bars, 12)
    for b, t0 in enumerate(bar_ts):
        t1 = t0 + MINUTE
        inside = [r for r in range(n_rows) if t0 <= book_ts[r] < t1]
        before = [r for r in range(n_rows) if book_ts[r] < t0]
        states = ([before[-1]] if before else []) + inside
        want, total = np.zeros(12), 0.0
        for i, r in enumerate(states):
            start = max(book_ts[r], t0)
            end = book_ts[states[i + 1]] if i + 1 < len(states) else t1
            b_q = [*bid[r], bid[r, :5].sum(), bid[r].sum()]
            a_q = [*ask[r], ask[r, :5].sum(), ask[r].sum()]
            imb = [(x - y) / (x + y) if x + y > 0 else 0.0 for x, y in zip(b_q, a_q, strict=True)]
            want += (end - start) * np.array(imb)
            total += end - start
        np.testing.assert_allclose(got[b], want / total, rtol=1e-12, atol=1e-15)
    assert np.abs(got).max() > 0.05 and (got[:, :10] != got[:, 10:11]).any()
