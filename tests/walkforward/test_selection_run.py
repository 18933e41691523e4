"""A run with selection days (folds.select_days): nothing trains on them, each epoch is backtested on them,
and they, not the validation days, choose each fold's best epoch. In process, under the simulator, on the
half-hour store (one fold of 3 training days, the last 2 held out, then 1 validation day)."""

import json

import numpy as np

from fox_numba.config import load_config
from fox_numba.diag.layout import PREFIX
from fox_numba.market.select import select_market
from fox_numba.walkforward.driver import train_run
from fox_numba.walkforward.report import sharpe_figure


def test_selection_days_are_backtested_and_choose_the_best_epoch(half_hour_store, tmp_path):
    cfg = load_config("smoke", overrides=[
        f"market.store={json.dumps(str(half_hour_store))}", f"run.out_dir={json.dumps(str(tmp_path))}",
        "run.name=sel", "folds.n_folds=1", "folds.train_days=3", "folds.select_days=2", "folds.purge_bars=5",
        "learner.epochs=3", "learner.steps_per_epoch=1", "env.collect_steps=2", "env.n_envs=4", "network.hidden=8",
        "network.n_atoms=5", "learner.batch_size=4", "learner.buffer_size=64"])
    logged: list[str] = []
    bar: list[tuple[str, int]] = []
    run_dir, summary = train_run(cfg, select_market(cfg.market), log=logged.append, verbose=True,
                                 progress=lambda message, advance=1: bar.append((message, advance)))
    # the progress bar: every phase of the 3 epochs one step (1 fold x 3 epochs x 3 phases), and the HEALTH_DIAG
    # snapshots in between as messages that do not advance it
    assert sum(advance for _, advance in bar) == 9
    assert ("fold 0 epoch 2: train, step 3", 0) in bar  # the fold's step and bar[-1] == ("fold 0 epoch 2 done", 1)
    fold = json.loads((run_dir / "folds.json").read_text())["folds"][0]
    assert fold["select"] == [1, 3] and fold["val"] == [3, 4]
    assert any(ln.startswith("fold 0: train") and "(1 days), select" in ln and "(2 days)" in ln for ln in logged)
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 3
    for ln in lines:  # 29 backtest steps a half-hour day
        figures = (ln["select"]["n_days"], ln["select"]["n_bars"], ln["val"]["n_days"], ln["val"]["n_bars"])
        assert figures == (2, 58, 1, 29)
    sel = [ln["select"]["sharpe_daily"] for ln in lines]
    assert [ln["best"] for ln in lines] == [s > max(sel[:i], default=-np.inf) for i, s in enumerate(sel)]
    chosen = [ln for ln in lines if ln["best"]][-1]
    assert summary["best_chosen_on"] == "selection" and summary["folds"][0]["best_epoch"] == chosen["epoch"]
    assert any(ln.startswith("fold 0 epoch 2: select Sharpe") for ln in logged)
    fig = sharpe_figure(lines)  # the report's Sharpe panel: validation, and dashed the selection days
    plotted = {ln.get_label(): ln for ln in fig.axes[0].get_lines()}
    np.testing.assert_array_equal(plotted["fold 0, selection days"].get_ydata(), sel)
    assert plotted["fold 0, selection days"].get_linestyle() == "--" and "fold 0" in plotted
    assert (run_dir / "report" / "sharpe.png").is_file()
    # --verbose: the long lines on the console too; train.log has every line but HEALTH_DIAG (health_diag.log)
    diag = (run_dir / "health_diag.log").read_text().splitlines()
    assert [ln for ln in logged if ln.startswith(PREFIX)] == diag and diag
    assert sum(ln.startswith("fold 0 reset (") for ln in logged) == 1
    assert (run_dir / "train.log").read_text().splitlines() == [ln for ln in logged if not ln.startswith(PREFIX)]
