"""tools/train_seeds.py --tabulate: the tables of run folders, the chosen, in-sample, last and every-epoch means,
and the note saying which days chose each fold's checkpoint."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "tools" / "train_seeds.py"


def load_script():
    spec = importlib.util.spec_from_file_location("train_seeds", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fold(k: int, best: float, last: float, every: float, probe: float) -> dict:
    val = {"sharpe_daily": best, "sharpe_bar": best / 2, "total_return": 10.0, "active_fraction": 0.3}
    return {"fold": k, "best_epoch": 1, "val": val,
            "baselines": {"probe": {"sharpe_daily": probe}, "buy_and_hold": {"sharpe_daily": 0.5},
                          "oracle_sharpe": 12.0},
            "kill": None, "last_val": {"sharpe_daily": last}, "every_epoch_sharpe_mean": every,
            "in_sample_best_val": {"sharpe_daily": max(best, last) + 1.0}}


@pytest.mark.parametrize("chosen_on, note", [("last", "is its last epoch (the kill criteria passing), so 'agent' is"),
                                             ("selection", "so 'agent' is out of sample")])
def test_tabulate_rereads_the_run_folders(tmp_path, chosen_on, note):
    runs = tmp_path / "runs"
    figures = {3: [fold(0, 6.0, 2.0, 1.5, 4.0), fold(1, 2.0, -1.0, 0.5, 1.0)],
               1: [fold(0, 5.0, 4.0, 3.0, 4.0), fold(1, 1.0, 1.0, 2.5, 1.0)]}
    for seed, folds in figures.items():
        (runs / f"seed_{seed}").mkdir(parents=True)
        summary = {"folds": folds, "best_chosen_on": chosen_on}
        (runs / f"seed_{seed}" / "summary.json").write_text(json.dumps(summary))
    earlier = tmp_path / "earlier.json"
    seeds = {"3": {"returncode": 0, "wall_s": 11.0}, "1": {"returncode": 0, "wall_s": 9.0}}
    earlier.write_text(json.dumps({"command": "python3 tools/train_seeds.py --seeds 3 1", "wall_s": 12.0,
                                   "machine": {"date_utc": "2026-12-02 04:26", "device": "X"}, "parallel": 2,
                                   "seeds": seeds}))
    out = tmp_path / "table"
    assert load_script().main(["--tabulate", str(earlier), "--runs", str(runs), "--out", str(out)]) == 0
    text = out.with_suffix(".md").read_text()
    assert note in text and "python3 tools/train_seeds.py --seeds 3 1" in text
    assert text.index("## seed 1:") < text.index("## seed 3:")  # seed order, not completion order
    assert "| mean | | +4.00 | | | | +5.00 | +0.50 | +1.00 | +2.50 |" in text  # seed 3: chosen, in sample, last, ...
    assert "| mean | | +3.00 | | | | +4.00 | +2.50 | +2.75 | +2.50 |" in text  # seed 1
    result = json.loads(out.with_suffix(".json").read_text())
    assert result["across_seeds"]["agent"] == pytest.approx(3.5)
    assert result["across_seeds"]["last"] == pytest.approx(1.5)
    assert result["across_seeds"]["every"] == pytest.approx(1.875)
    assert result["seeds"]["3"]["wall_s"] == 11.0 and result["seeds"]["1"]["chosen_on"] == chosen_on


def test_run_jobs_keeps_each_failed_jobs_last_log_line(tmp_path):
    """A job that fails reports its log's last non-blank line (the exception) beside its exit code; one that
    succeeds reports none; at most `parallel` run at a time and every job ends."""
    module = load_script()
    fail = [sys.executable, "-c", "import sys; print('first'); sys.exit('ValueError: boom\\n\\n')"]
    ok = [sys.executable, "-c", "print('fine')"]
    jobs = [module.Job("bad", fail, tmp_path / "bad.log"), module.Job("good", ok, tmp_path / "good.log")]
    done = module.run_jobs(jobs, parallel=1, poll_s=0.01)
    assert done["bad"]["returncode"] == 1 and done["bad"]["error"] == "ValueError: boom"
    assert done["good"]["returncode"] == 0 and "error" not in done["good"]
    assert (tmp_path / "bad.log").read_text().startswith("first")
