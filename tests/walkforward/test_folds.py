"""Walk-forward folds: exact windows, no overlap between a fold's training and validation, purging."""

import dataclasses

import numpy as np
import pytest

from fox_numba.config import FoldConfig
from fox_numba.errors import ConfigError
from fox_numba.market import default
from fox_numba.market.synthetic_definition import load_definition
from fox_numba.walkforward.folds import days_needed, make_folds

DAYS = tuple(f"2024-08-{d:02d}" for d in range(1, 32))


def test_default_config_on_the_default_market_gives_four_folds():
    n_days = load_definition(default.default_definition_path()).market.days
    folds = make_folds(FoldConfig(), DAYS[:n_days])
    assert len(folds) == 4 and days_needed(FoldConfig()) <= n_days
    windows = [(f.train_first, f.train_stop, f.val_first, f.val_stop) for f in folds]
    assert windows == [(0, 14, 14, 18), (4, 18, 18, 22), (8, 22, 22, 26), (12, 26, 26, 30)]
    assert folds[3].describe() == (
        "fold 3: train 2024-08-13..2024-08-26 (14 days), validate 2024-08-27..2024-08-30 (4 days)"
    )


def test_anchored_folds_keep_the_start():
    folds = make_folds(FoldConfig(anchored=True), DAYS)
    assert [f.train_first for f in folds] == [0, 0, 0, 0]
    assert [len(f.train_days) for f in folds] == [14, 18, 22, 26]


def test_rows_are_purged_and_never_overlap():
    rng = np.random.default_rng(7)
    bars_per_day = rng.integers(300, 391, size=len(DAYS))
    day_start = np.concatenate(([0], np.cumsum(bars_per_day)))
    for fold in make_folds(FoldConfig(purge_bars=30), DAYS):
        train, val = fold.train_rows(day_start), fold.val_rows(day_start)
        assert train.start == day_start[fold.train_first]
        assert train.stop == day_start[fold.train_stop] - 30
        assert val == slice(day_start[fold.val_first], day_start[fold.val_stop])
        assert train.stop + 30 == val.start  # the purge gap sits right before validation


def test_too_few_days_says_what_to_change():
    with pytest.raises(ConfigError, match="need 30 trading days; the market has 20"):
        make_folds(FoldConfig(), DAYS[:20])


@pytest.mark.parametrize("field, value", [("n_folds", 0), ("val_days", 0), ("purge_bars", -1)])
def test_bad_fold_config(field, value):
    with pytest.raises(ConfigError, match=f"folds.{field}"):
        make_folds(dataclasses.replace(FoldConfig(), **{field: value}), DAYS)


def test_purge_longer_than_the_window_is_refused():
    fold = make_folds(FoldConfig(n_folds=1, train_days=1, val_days=1, purge_bars=500), DAYS)[0]
    with pytest.raises(ConfigError, match="leaves no training bars"):
        fold.train_rows(np.array([0, 390, 780]))
