"""Walk-forward folds: exact day windows, no overlap between a fold's training and validation. The purge (rows) is
FoldMarket's: tests/agent/test_fold_market.py."""

import dataclasses
import json

import numpy as np
import pytest

from fox_numba.config import FoldConfig, load_config
from fox_numba.errors import ConfigError
from fox_numba.market import default
from fox_numba.market.synthetic_definition import load_definition
from fox_numba.walkforward.folds import days_needed, make_folds, max_folds


def trading_days(n):
    """`n` distinct day names in order (the folds only index into them)."""
    start = np.datetime64("2024-01-01")
    return tuple(str(start + np.timedelta64(i, "D")) for i in range(n))


DAYS = trading_days(120)


def test_default_config_fills_120_days_with_six_folds():
    cfg = FoldConfig()
    assert (cfg.train_days, cfg.val_days, cfg.step_days) == (60, 10, 10)
    assert days_needed(cfg) == 120 and cfg.n_folds == max_folds(cfg, 120) == 6
    folds = make_folds(cfg, DAYS)
    windows = [(f.train_first, f.train_stop, f.val_first, f.val_stop) for f in folds]
    assert windows == [(10 * k, 10 * k + 60, 10 * k + 60, 10 * k + 70) for k in range(6)]
    assert folds[5].describe() == (
        f"fold 5: train {DAYS[50]}..{DAYS[109]} (60 days), validate {DAYS[110]}..{DAYS[119]} (10 days)"
    )
    assert json.loads(json.dumps(folds[5].as_dict())) == {
        "index": 5, "train": [50, 110], "val": [110, 120], "train_days": [DAYS[50], DAYS[109]],
        "val_days": [DAYS[110], DAYS[119]], "purge_bars": 30, "select": [110, 110], "select_days": [],
    }


def test_selection_days_end_the_training_window():
    """The selection days are the training window's last days (FoldMarket purges the bars before them:
    tests/agent/test_fold_market.py)."""
    fold = make_folds(FoldConfig(select_days=10), DAYS)[2]
    assert (fold.train_first, fold.select_first, fold.train_stop, fold.val_first) == (20, 70, 80, 80)
    assert fold.selection_days == DAYS[70:80] and len(fold.train_days) == 60
    assert fold.describe() == (f"fold 2: train {DAYS[20]}..{DAYS[69]} (50 days), select {DAYS[70]}..{DAYS[79]} "
                               f"(10 days), validate {DAYS[80]}..{DAYS[89]} (10 days)")
    d = fold.as_dict()
    assert d["select"] == [70, 80] and d["select_days"] == [DAYS[70], DAYS[79]]


def test_default_config_on_the_default_market():
    """The default market's day count decides: the default folds fit exactly when it has 120 days or more,
    else make_folds says how many days they need (independent of the market's current length)."""
    n_days = load_definition(default.default_definition_path()).market.days
    days = trading_days(n_days)
    if n_days >= days_needed(FoldConfig()):
        assert len(make_folds(FoldConfig(), days)) == 6
    else:
        with pytest.raises(ConfigError, match=f"need 120 trading days; the market has {n_days}"):
            make_folds(FoldConfig(), days)


@pytest.mark.parametrize("n_days, n_folds", [(69, 0), (70, 1), (79, 1), (80, 2), (119, 5), (120, 6), (131, 7)])
def test_max_folds(n_days, n_folds):
    assert max_folds(FoldConfig(), n_days) == n_folds
    if n_folds:
        make_folds(dataclasses.replace(FoldConfig(), n_folds=n_folds), trading_days(n_days))
        with pytest.raises(ConfigError, match="need"):
            make_folds(dataclasses.replace(FoldConfig(), n_folds=n_folds + 1), trading_days(n_days))


def test_smoke_preset_stays_small():
    cfg = load_config("smoke").folds
    assert days_needed(cfg) <= 4 and len(make_folds(cfg, trading_days(4))) == cfg.n_folds == 2


def test_anchored_folds_keep_the_start():
    folds = make_folds(FoldConfig(anchored=True), DAYS)
    assert [f.train_first for f in folds] == [0] * 6
    assert [len(f.train_days) for f in folds] == [60, 70, 80, 90, 100, 110]


def test_too_few_days_says_what_to_change():
    with pytest.raises(ConfigError, match="need 120 trading days; the market has 100"):
        make_folds(FoldConfig(), DAYS[:100])


@pytest.mark.parametrize("field, value", [("n_folds", 0), ("val_days", 0), ("purge_bars", -1), ("select_days", -1),
                                          ("select_days", 60)])
def test_bad_fold_config(field, value):
    with pytest.raises(ConfigError, match=f"folds.{field}"):
        make_folds(dataclasses.replace(FoldConfig(), **{field: value}), DAYS)
