"""Validation metrics on hand-made days, the baselines, the oracle reference and the cross-fold record."""

import json
import math
import statistics

import numpy as np
import pytest

from fox_numba.errors import InputError
from fox_numba.market.synthetic_oracle import oracle_pnl, oracle_positions, oracle_threshold
from fox_numba.walkforward.metrics import (
    DaySeries,
    OracleReference,
    across_folds,
    buy_and_hold_days,
    compute_metrics,
    flat_days,
    fold_report,
    positions_to_days,
    round_trip_pnls,
    signed,
)

# Day A: long 1 (entry costs 3), reversed to short at bar 2, closed at bar 4. Day B: long 2 from bar 1.
# Day C: short 1 at bar 1, closed at a loss.
DAY_A = DaySeries(np.array([-3.0, 10.0, -8.0, 4.0, 6.0]), np.array([1, 1, -1, -1, 0]))
DAY_B = DaySeries(np.array([0.0, -4.0, 7.0, -1.0]), np.array([0, 2, 2, 0]))
DAY_C = DaySeries(np.array([0.0, 0.5, -4.5]), np.array([0, -1, 0]))
BARS = [-3.0, 10.0, -8.0, 4.0, 6.0, 0.0, -4.0, 7.0, -1.0, 0.0, 0.5, -4.5]


def test_round_trips_charge_a_reversal_to_the_trip_it_closes():
    np.testing.assert_array_equal(round_trip_pnls(DAY_A), [-3 + 10 - 8, 4 + 6])
    np.testing.assert_array_equal(round_trip_pnls(DAY_B), [-4 + 7 - 1])
    np.testing.assert_array_equal(round_trip_pnls(DaySeries(np.array([1.0, 2.0]), np.array([0, 1]))), [2.0])  # open at the end


def test_every_figure_on_hand_made_days():
    m = compute_metrics([DAY_A, DAY_B, DAY_C], annualisation_days=252)
    daily = [9.0, 2.0, -4.0]
    assert m.sharpe_daily == pytest.approx(statistics.mean(daily) / statistics.stdev(daily) * math.sqrt(252))
    assert m.sharpe_bar == pytest.approx(statistics.mean(BARS) / statistics.stdev(BARS) * math.sqrt(252 * 4))
    assert m.sortino_daily == pytest.approx((7 / 3) / math.sqrt(16 / 3) * math.sqrt(252))
    assert m.max_drawdown == 8.0  # equity 0, -3, 7, -1: 8 below the peak of 7
    assert (m.total_return, m.mean_daily_pnl) == (7.0, pytest.approx(7 / 3))
    assert m.std_daily_pnl == pytest.approx(statistics.stdev(daily))
    assert m.turnover == pytest.approx((4 + 4 + 2) / 12)  # contracts traded per bar
    assert (m.trades, m.round_trips, m.hit_rate) == (7, 4, 0.5)
    assert m.active_fraction == pytest.approx(7 / 12)
    assert (m.n_days, m.n_bars) == (3, 12)


def test_degenerate_days():
    m = compute_metrics([DAY_A, DAY_B], annualisation_days=252)
    assert m.sortino_daily == math.inf and m.as_dict()["sortino_daily"] is None  # no losing day
    flat = compute_metrics(flat_days([5, 4]), annualisation_days=252)
    assert (flat.sharpe_daily, flat.sharpe_bar, flat.sortino_daily, flat.max_drawdown, flat.turnover) == (0, 0, 0, 0, 0)
    assert math.isnan(flat.hit_rate) and flat.as_dict()["hit_rate"] is None
    json.dumps(flat.as_dict(), allow_nan=False)
    with pytest.raises(ValueError, match="equal non-zero length"):
        DaySeries(np.zeros(3), np.zeros(4))


@pytest.mark.parametrize("day", [DAY_A, DAY_C, DaySeries(np.zeros(4), np.zeros(4))], ids=["won", "lost", "flat"])
def test_a_ratio_of_one_day_is_undefined_alike(day):
    """One day has no spread of days: daily Sharpe and Sortino alike are NaN (None in JSON, n/a on the console),
    whether the day won, lost or stood still; so is the per-bar Sharpe of a single bar."""
    m = compute_metrics([day], annualisation_days=252)
    assert math.isnan(m.sharpe_daily) and math.isnan(m.sortino_daily)
    assert m.as_dict()["sharpe_daily"] is None and m.as_dict()["sortino_daily"] is None
    assert signed(m.sharpe_daily) == signed(None) == "n/a" and signed(0.5) == "+0.50"
    assert math.isfinite(m.sharpe_bar)  # several bars: the per-bar figure is formed
    assert math.isnan(compute_metrics([DaySeries(np.ones(1), np.ones(1))], annualisation_days=252).sharpe_bar)
    json.dumps(m.as_dict(), allow_nan=False)


def test_buy_and_hold_pays_both_crossings():
    mids = [np.array([100.0, 100.5, 101.0, 100.75]), np.array([101.0, 100.0, 99.5])]
    halves = [np.array([0.125, 0.25, 0.125, 0.375]), np.array([0.25, 0.125, 0.125])]
    days = buy_and_hold_days(mids, halves, point_value=50.0, commission=2.25)
    assert days[0].pnl.sum() == pytest.approx((100.75 - 100.0) * 50 - (0.125 * 50 + 2.25) - (0.375 * 50 + 2.25))
    assert days[1].pnl.sum() == pytest.approx((99.5 - 101.0) * 50 - (0.25 * 50 + 2.25) - (0.125 * 50 + 2.25))
    np.testing.assert_array_equal(days[0].position, [1, 1, 1, 0])
    m = compute_metrics(days, annualisation_days=252)
    assert (m.trades, m.round_trips, m.hit_rate) == (4, 2, 0.5)


def test_positions_to_days_reuses_the_oracle_cost_model(rng):
    """The oracle's daily PnL is the day sums of its positions traded by positions_to_days."""
    days, bars = 3, 50
    er = rng.normal(0, 0.5, days * bars)
    mid = 5000 + np.cumsum(rng.normal(0, 0.25, days * bars))
    half = rng.choice([0.125, 0.25], days * bars)
    oracle = oracle_pnl(er, mid, half, bars, tick_size=0.25, point_value=50.0, commission=2.25, horizon_minutes=15,
                        annualisation_days=252)
    pos = oracle_positions(er.reshape(days, bars), oracle_threshold(0.25, 50.0, 2.25))
    np.testing.assert_array_equal(pos.astype(np.int8).ravel(), oracle.position)
    traded = positions_to_days(list(pos), list(mid.reshape(days, bars)), list(half.reshape(days, bars)),
                               point_value=50.0, commission=2.25)
    np.testing.assert_allclose([d.pnl.sum() for d in traded], oracle.daily_pnl, rtol=1e-12, atol=1e-9)
    assert compute_metrics(traded, annualisation_days=252).sharpe_daily == pytest.approx(oracle.sharpe, rel=1e-9)


def test_oracle_reference_from_the_sidecar(tmp_path):
    store = tmp_path / "m.h5"
    assert OracleReference.for_store(store) is None  # not a synthetic store
    daily = [100.0, -50.0, 80.0, 20.0, 60.0]
    (tmp_path / "m.h5.oracle.json").write_text(json.dumps(
        {"oracle_sharpe": 9.8, "oracle_daily_pnl": daily, "oracle_annualisation_days": 252}))
    ref = OracleReference.for_store(store)
    assert ref.sharpe == 9.8
    sub = [80.0, 20.0, 60.0]
    assert ref.sharpe_on([2, 3, 4], 252) == pytest.approx(statistics.mean(sub) / statistics.stdev(sub) * math.sqrt(252))
    store_days = ["d0", "d1", "d2", "d3", "d4"]
    assert ref.day_indices(store_days, ["d2", "d3", "d4"]) == [2, 3, 4]
    with pytest.raises(InputError, match=r"days \['d9'\] are not in the store"):
        ref.day_indices(store_days, ["d9"])
    with pytest.raises(InputError, match="the oracle has 5 days, the store 4"):
        ref.day_indices(store_days[:4], ["d1"])
    with pytest.raises(InputError, match="day index out of range"):
        ref.sharpe_on([5], 252)
    (tmp_path / "m.h5.oracle.json").write_text("{}")
    with pytest.raises(InputError, match="not a readable oracle sidecar"):
        OracleReference.for_store(store)


def test_fold_report_and_the_cross_fold_record():
    agent = compute_metrics([DAY_A, DAY_B, DAY_C], annualisation_days=252)
    flat = compute_metrics(flat_days([5, 4, 3]), annualisation_days=252)
    probe = compute_metrics([DAY_B, DAY_C, DAY_A], annualisation_days=252)
    report = fold_report(agent, flat=flat, buy_and_hold=flat, probe=probe, oracle_sharpe=2 * agent.sharpe_daily)
    assert report["oracle_fraction"] == pytest.approx(0.5)
    assert report["probe_fraction"] == pytest.approx(1.0)
    assert report["agent"]["trades"] == 7
    json.dumps(report, allow_nan=False)
    no_oracle = fold_report(agent, flat=flat, buy_and_hold=flat)
    assert no_oracle["oracle_fraction"] is None and no_oracle["probe"] is None
    record = across_folds([[DAY_A, DAY_B], [DAY_C, DAY_A]], annualisation_days=252)
    chained = compute_metrics([DAY_A, DAY_B, DAY_C, DAY_A], annualisation_days=252)
    assert record["all_validation_days"] == chained.as_dict()
    per_fold = [compute_metrics(d, annualisation_days=252).sharpe_daily for d in ([DAY_A, DAY_B], [DAY_C, DAY_A])]
    assert record["fold_sharpe_daily"] == per_fold and record["fold_sharpe_mean"] == pytest.approx(np.mean(per_fold))
