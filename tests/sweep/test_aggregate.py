"""The sweep aggregate, from hand-made run folders: Sharpe pooled over seeds and folds, oracle fraction,
HEALTH_DIAG across seeds, wall seconds kept apart."""

import json
import math

import numpy as np
import pytest

from fox_numba.diag.layout import FIELDS, SNAPSHOT_DTYPE, format_line
from fox_numba.sweep.aggregate import results_table, sweep_summary
from fox_numba.sweep.folder import SweepFolder, TrialRecord
from fox_numba.sweep.spec import Trial

LR = (("learner.lr", 1e-4),)


def write_run(folder, trial, sharpes, oracles, probes, q_abs):
    run = folder.run_dir(trial)
    run.mkdir(parents=True)
    folds = [{"fold": k, "best_epoch": 1, "val": {"sharpe_daily": s},
              "baselines": {"probe": {"sharpe_daily": p}, "oracle_sharpe": o}, "kill": None}
             for k, (s, o, p) in enumerate(zip(sharpes, oracles, probes, strict=True))]
    (run / "summary.json").write_text(json.dumps({"folds": folds, "across_folds": None}))
    lines = []
    for k, q in enumerate(q_abs):
        for epoch, scale in ((0, 0.5), (1, 1.0)):  # the last snapshot of the fold counts
            rec = np.zeros(1, SNAPSHOT_DTYPE)
            rec["fold"], rec["epoch"], rec["q_abs_ref"] = k, epoch, np.float32(q * scale)
            lines.append(format_line(rec[0]))
    (run / "health_diag.log").write_text("\n".join(lines) + "\n")


@pytest.fixture()
def sweep(tmp_path):
    folder = SweepFolder(tmp_path / "sw")
    lr3 = (("learner.lr", 3e-4),)
    trials = [Trial("c00-seed0", "c00", LR, 0), Trial("c00-seed1", "c00", LR, 1),
              Trial("c01-seed0", "c01", lr3, 0), Trial("c01-seed1", "c01", lr3, 1)]
    write_run(folder, "c00-seed0", [1.0, 2.0], [10.0, 10.0], [0.5, 0.5], [0.25, 0.5])
    write_run(folder, "c00-seed1", [3.0, None], [10.0, 30.0], [1.5, 0.5], [0.75, 1.0])  # a fold without a best epoch
    write_run(folder, "c01-seed0", [-1.0, 1.0], [None, None], [0.0, 0.0], [1.0, 1.0])  # a store without an oracle
    records = {"c00-seed0": TrialRecord(0, None, 1, 10.0), "c00-seed1": TrialRecord(0, None, 2, 30.0),
               "c01-seed0": TrialRecord(0, None, 1, 12.0), "c01-seed1": TrialRecord(-9, "exit -9:\nboom", 1, 4.0)}
    return sweep_summary(list(reversed(trials)), folder, records, wall_s=99.0)


def test_sharpe_is_pooled_over_seeds_and_folds(sweep):
    c00, c01 = sweep["configs"]
    assert (c00["config"], c00["values"]) == ("c00", {"learner.lr": 1e-4})
    assert c00["seeds"] == c00["finished"] == [0, 1]
    s = c00["sharpe_daily"]
    assert s["n"] == 3 and s["mean"] == pytest.approx(2.0) and s["min"] == 1.0 and s["max"] == 3.0
    assert s["std"] == pytest.approx(math.sqrt(2 / 3))
    assert c00["probe_sharpe_daily"] == pytest.approx(0.75)
    assert c00["oracle_sharpe"] == pytest.approx(15.0)
    assert c00["oracle_fraction"] == pytest.approx(2.0 / 15.0)
    assert c01["finished"] == [0] and c01["sharpe_daily"]["mean"] == 0.0 and c01["sharpe_daily"]["std"] == 1.0
    assert c01["oracle_sharpe"] is None and c01["oracle_fraction"] is None


def test_health_diag_is_aggregated_across_the_seeds_of_a_config(sweep):
    c00 = sweep["configs"][0]["health_diag"]
    assert sorted(c00) == ["0", "1"] and len(c00["0"]) == len(FIELDS)
    q = c00["1"]["q_abs_ref"]
    assert (q["mean"], q["std"], q["min"], q["max"], q["n"]) == (0.75, 0.25, 0.5, 1.0, 2)
    assert sweep["configs"][1]["health_diag"]["0"]["q_abs_ref"]["n"] == 1


def test_trials_are_in_id_order_and_wall_seconds_apart(sweep):
    assert [t["id"] for t in sweep["trials"]] == ["c00-seed0", "c00-seed1", "c01-seed0", "c01-seed1"]
    assert [t["finished"] for t in sweep["trials"]] == [True, True, True, False]
    assert sweep["trials"][3]["error"] == "exit -9:\nboom" and sweep["trials"][0]["error"] is None
    assert sweep["wall_s"] == {"sweep": 99.0, "trial": {"c00-seed0": 10.0, "c00-seed1": 30.0, "c01-seed0": 12.0,
                                                         "c01-seed1": 4.0}, "config_mean": {"c00": 20.0, "c01": 8.0}}
    assert "wall" not in json.dumps(sweep["configs"])
    json.dumps(sweep, allow_nan=False)  # strict JSON: what summary.json is written as


def test_the_table_has_a_row_per_config(sweep):
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(results_table(sweep))
    text = console.export_text()
    assert "learner.lr=0.0001" in text and "2/2" in text and "1/2" in text and "+2.00" in text and "0.13" in text
