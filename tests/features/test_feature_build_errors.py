"""The feature builder rejects what it cannot build from, naming the day (and the row where there is one)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from fox_numba.config import FeatureConfig
from fox_numba.errors import ConfigError, InputError, MissingDataError
from fox_numba.features import FEATURE_NAMES, build_features, check_feature_config
from fox_numba.market.schema import NS_PER_MINUTE, UNDEF_PRICE, Instrument, Mbp10

ES = Instrument()


@pytest.mark.parametrize("schema, name", [("mbp10", "MBP-10"), ("trades", "trade")])
def test_day_with_bars_but_no_book_or_trades(random_market, schema, name):
    days = random_market(0, n_days=3, n_bars=5)
    days[1] = replace(days[1], **{schema: None})
    with pytest.raises(MissingDataError, match=f"day {days[1].day} has bars but no {name} data.*mandatory"):
        build_features(days, ES, FeatureConfig(), source="es.h5")


def test_empty_book_counts_as_missing(random_market):
    days = random_market(0, n_days=1, n_bars=5)
    book = days[0].mbp10
    days[0] = replace(days[0], mbp10=Mbp10(**{k: v[:0] for k, v in vars(book).items()}))
    with pytest.raises(MissingDataError, match="MBP-10"):
        build_features(days, ES, FeatureConfig())


def test_day_without_bars_and_no_days(random_market):
    days = random_market(0, n_days=1, n_bars=5)
    with pytest.raises(MissingDataError, match=f"day {days[0].day} has no bars"):
        build_features([replace(days[0], bars=None)], ES, FeatureConfig())
    with pytest.raises(MissingDataError, match="no trading days"):
        build_features([], ES, FeatureConfig())


def test_width_mismatch_is_a_config_error(random_market):
    with pytest.raises(ConfigError, match=f"n_features is 31 .* produces {len(FEATURE_NAMES)} features"):
        build_features(random_market(0, n_days=1, n_bars=3), ES, FeatureConfig(n_features=31))
    assert len(FEATURE_NAMES) == FeatureConfig().n_features == 32
    assert len(set(FEATURE_NAMES)) == 32


@pytest.mark.parametrize("config, match", [
    (FeatureConfig(ofi_levels=0), "ofi_levels is 0"),
    (FeatureConfig(ofi_levels=11), "ofi_levels is 11"),
    (FeatureConfig(clip_sigma=0.0), "clip_sigma"),
])
def test_other_config_errors(config, match):
    with pytest.raises(ConfigError, match=match):
        check_feature_config(config)


def test_book_must_start_by_the_first_close(random_market):
    day = random_market(0, n_days=1, n_bars=5)[0]
    late = day.mbp10.ts_event >= day.bars.ts_event[1]  # first row inside the second bar
    book = Mbp10(**{k: v[late] for k, v in vars(day.mbp10).items()})
    with pytest.raises(InputError, match="first bar closes before the day's first MBP-10 row"):
        build_features([replace(day, mbp10=book)], ES, FeatureConfig())


def test_one_sided_close_book_names_the_row(random_market):
    day = random_market(0, n_days=1, n_bars=5)[0]
    close_row = int(np.flatnonzero(day.mbp10.ts_event < day.bars.ts_event[2] + NS_PER_MINUTE)[-1])
    day.mbp10.ask_px[close_row, 0] = UNDEF_PRICE
    with pytest.raises(InputError, match=f"row {close_row}: the close book of bar 2 is one-sided"):
        build_features([day], ES, FeatureConfig())


def test_unsorted_and_misordered_input(random_market):
    days = random_market(0, n_days=2, n_bars=5)
    with pytest.raises(InputError, match=f"day {days[0].day} does not start after day {days[1].day} ends"):
        build_features([days[1], days[0]], ES, FeatureConfig())
    days[0].trades.ts_event[[3, 4]] = days[0].trades.ts_event[[4, 3]] + np.array([0, 1], dtype=np.uint64)
    with pytest.raises(InputError, match="trades, field ts_event, row 4: timestamps are not in time order"):
        build_features(days, ES, FeatureConfig())
