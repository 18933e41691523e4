"""tools/td_read.py: the fit's Long-minus-Short weights, the correlations and the loadings, each against a plain
computation on small seeded inputs; and the validation rows of a fold's windows."""

import math
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from td_read import correlation, loadings, long_minus_short, val_rows  # noqa: E402


def pearson(a, b) -> float:
    ma, mb = sum(a) / len(a), sum(b) / len(b)
    num = sum((x - ma) * (y - mb) for x, y in zip(a, b, strict=True))
    return num / math.sqrt(sum((x - ma) ** 2 for x in a) * sum((y - mb) ** 2 for y in b))


def test_long_minus_short_reads_the_market_rows_of_the_long_and_short_columns():
    w = np.random.default_rng(1).normal(size=(7, 4))  # 5 market columns, the bias, one more input
    np.testing.assert_array_equal(long_minus_short(w, 5), w[:5, 2] - w[:5, 0])


def test_correlation_skips_rows_without_a_target_and_is_nan_for_a_constant():
    rng = np.random.default_rng(2)
    score, y = rng.normal(size=30), rng.normal(size=30)
    y[[3, 7, 20]] = np.nan
    rows = np.arange(2, 25)
    keep = [r for r in rows if np.isfinite(y[r])]
    assert correlation(score, y, rows) == pytest.approx(pearson(score[keep], y[keep]), rel=1e-12)
    assert math.isnan(correlation(np.ones(30), y, rows))


def test_loadings_are_each_columns_correlation_with_the_score():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(40, 4))
    x[:, 3] = 2.5  # a constant column loads 0
    score = x[:, :3] @ np.array([0.5, -1.0, 0.2]) + rng.normal(size=40)
    rows = np.arange(5, 37)
    got = loadings(score, x, rows)
    expected = [pearson(score[rows], x[rows, j]) for j in range(3)] + [0.0]
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-15)


def test_val_rows_join_the_validation_windows():
    m = SimpleNamespace(val_windows=np.array([[10, 13], [20, 22]]))
    np.testing.assert_array_equal(val_rows(m), [10, 11, 12, 20, 21])
