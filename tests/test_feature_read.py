"""tools/feature_read.py on a small synthetic market with its latent truth (the time-weighted imbalance itself:
tests/features/test_time_weighted_imbalance.py)."""

from __future__ import annotations

import pytest
from tool_loader import tool_module


@pytest.fixture(scope="module")
def feature_read():
    yield from tool_module("feature_read")


def test_the_tool_on_a_small_synthetic_market(feature_read, tmp_path, small_synth_store):
    out = tmp_path / "read.md"
    assert feature_read.main(["--store", str(small_synth_store), "--set", "folds.n_folds=1", "--set",
                              "folds.train_days=12", "--set", "folds.val_days=4", "--out", str(out)]) == 0
    rows = [line for line in out.read_text().splitlines() if line.startswith("| 0 |")]
    assert len(rows) == 6  # two signals on each of the three column sets
    corr = [float(r.split("|")[4]) for r in rows]
    assert all(0.0 < c <= 1.0 for c in corr), rows  # every read correlates with the planted latent
