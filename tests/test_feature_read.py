"""tools/feature_read.py: the bar's time-weighted book imbalance against a float64 loop, and the whole tool on a small
synthetic market with its latent truth."""

from __future__ import annotations

import numpy as np
import pytest
from tool_loader import tool_module

MINUTE = 60_000_000_000


@pytest.fixture(scope="module")
def feature_read():
    yield from tool_module("feature_read")


def test_time_weighted_imbalance_against_a_loop(feature_read, rng):
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
    got = feature_read.time_weighted_imbalance(book_ts, bid, ask, bar_ts)
    assert got.shape == (n_bars, 12)
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


def test_the_tool_on_a_small_synthetic_market(feature_read, tmp_path, small_synth_store):
    out = tmp_path / "read.md"
    assert feature_read.main(["--store", str(small_synth_store), "--set", "folds.n_folds=1", "--set",
                              "folds.train_days=12", "--set", "folds.val_days=4", "--out", str(out)]) == 0
    rows = [line for line in out.read_text().splitlines() if line.startswith("| 0 |")]
    assert len(rows) == 6  # two signals on each of the three column sets
    corr = [float(r.split("|")[4]) for r in rows]
    assert all(0.0 < c <= 1.0 for c in corr), rows  # every read correlates with the planted latent
