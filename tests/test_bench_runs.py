"""tools/bench_runs.py: a warm-up run, one alone and N at once, each a stand-in for `fox train` that receives the
tool's arguments and prints what the real one prints (epoch lines, `done in`), then the table; seed 0 alone against
seed 0 among the N decides the determinism line and the exit status. A real `fox train` takes minutes under the
simulator; the command the tool builds is tools/train_seeds.py's, tested there."""

from __future__ import annotations

import json
import sys

import pytest
from tool_loader import tool_module


FAKE_TRAIN = """import json, os, pathlib, sys
runs, seed = pathlib.Path(sys.argv[1]), int(sys.argv[2])
(runs / f"seed_{seed}").mkdir(parents=True)
(runs / f"threads_{seed}.txt").write_text(os.environ.get("OPENBLAS_NUM_THREADS", "unset"))
first = 3.0 + seed
print("fold 0: train ...; baselines: probe Sharpe +1.00 ..., oracle +2.00; set up in 1.5 s: features 0.2, "
      "device 0.6, resets 0.1, baselines %.1f" % (0.6 + 0.1 * seed))
print("fold 0 epoch 0: val Sharpe ... | seconds: collect %.1f train 5.0 evaluate 1.0 epoch 9.5" % first)
print("fold 0 epoch 1: val Sharpe ... | seconds: collect 0.5 train 1.0 evaluate 0.5 epoch 2.0")
print("fold 1: train ...; baselines: probe Sharpe +1.00 ..., oracle +2.00; set up in 0.5 s: features 0.1, "
      "device 0.2, resets 0.0, baselines 0.2")
print("fold 1 epoch 0: val Sharpe ... | seconds: collect 0.5 train 2.0 evaluate 0.5 epoch 3.0")
figure = seed + (0.5 if "--differ" in sys.argv and "together" in str(runs) else 0.0)
(runs / f"seed_{seed}" / "summary.json").write_text(json.dumps({"honest_sharpe_mean": figure}))
print(f"run {runs} done in {7 + seed} s: validation Sharpe ...")
sys.exit(3 if "--fail" in sys.argv and seed == 1 else 0)
"""


@pytest.fixture(scope="module")
def tool():
    yield from tool_module("bench_runs")


@pytest.fixture
def fake(tool, tmp_path, monkeypatch):
    script = tmp_path / "fake_train.py"
    script.write_text(FAKE_TRAIN)
    monkeypatch.setattr(tool, "train_command",
                        lambda args, seed, runs: [sys.executable, str(script), str(runs), str(seed), *args])


def test_warmup_alone_and_together(tool, fake, tmp_path):
    out, folder = tmp_path / "many_runs_x1.5", tmp_path / "runs"  # a dot in the name stays
    assert tool.main(["--runs", "3", "--out", str(out), "--folder", str(folder), "--", "--preset", "smoke"]) == 0
    record = json.loads((tmp_path / "many_runs_x1.5.json").read_text())
    assert list(record["runs"]) == ["warmup", "alone", "together_0", "together_1", "together_2"]
    assert record["extra"] == ["--preset", "smoke"] and record["same_seed_same_summary"] is True
    assert record["ratio"] == pytest.approx(record["together_wall_s"] / record["alone_wall_s"])
    t1 = record["runs"]["together_1"]
    assert t1["returncode"] == 0 and t1["done_s"] == 8 and t1["epochs"] == 3
    assert t1["first_epoch"] == {"collect": 4.0, "train": 5.0, "evaluate": 1.0, "epoch": 9.5}
    assert t1["later_epochs"] == pytest.approx({"collect": 0.5, "train": 1.5, "evaluate": 0.5, "epoch": 2.5})
    text = (tmp_path / "many_runs_x1.5.md").read_text()
    assert "| one alone | first | 3.00 | 5.00 | 1.00 | 9.50 |" in text  # seed 0's first epoch
    assert "| 3 at once | first | 4.00 | 5.00 | 1.00 | 9.50 |" in text  # seeds 0-2: collect 3, 4, 5
    assert "wrote the same summary.json" in text and "python3 tools/bench_runs.py --runs 3" in text
    assert t1["setup_s"] == 2.0 and t1["epochs_s"] == 14.5
    assert t1["setup_parts"] == pytest.approx({"features": 0.3, "device": 0.8, "resets": 0.1, "baselines": 0.9})
    assert "| one alone | 0.30 | 0.80 | 0.10 | 0.80 |" in text  # seed 0: baselines 0.6 + 0.2
    assert "| 3 at once | 0.30 | 0.80 | 0.10 | 0.90 |" in text  # seeds 0-2: 0.8, 0.9, 1.0
    wall = record["runs"]["alone"]["wall_s"]  # seed 0: done in 7, set-up 2.0, epochs 9.5 + 2.0 + 3.0
    assert f"| one alone | {wall:.1f} | {wall - 7:.1f} | 2.0 | 14.5 | -9.5 |" in text
    assert "fox_numba's default (host_threads.py)" in text


def test_threads_per_run_reaches_every_run(tool, fake, tmp_path, monkeypatch):
    for name in tool.THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)  # restored after the test: main sets them for its children
    folder = tmp_path / "runs"
    assert tool.main(["--runs", "2", "--no-warmup", "--threads-per-run", "3", "--folder", str(folder),
                      "--out", str(tmp_path / "t")]) == 0
    assert [(folder / p / f"threads_{s}.txt").read_text() for p, s in
            (("alone", 0), ("together_0", 0), ("together_1", 1))] == ["3", "3", "3"]
    assert json.loads((tmp_path / "t.json").read_text())["threads_per_run"] == 3
    assert "CPU threads of each run's numerical libraries: 3" in (tmp_path / "t.md").read_text()
    with pytest.raises(SystemExit):
        tool.main(["--threads-per-run", "0", "--out", str(tmp_path / "u")])


def test_a_failed_run_or_another_figure_for_the_same_seed_fails(tool, fake, tmp_path):
    argv = ["--runs", "2", "--no-warmup", "--folder"]
    assert tool.main([*argv, str(tmp_path / "a"), "--out", str(tmp_path / "a"), "--", "--differ"]) == 1
    record = json.loads((tmp_path / "a.json").read_text())
    assert "warmup" not in record["runs"] and record["same_seed_same_summary"] is False
    assert "different summary.json files" in (tmp_path / "a.md").read_text()
    assert tool.main([*argv, str(tmp_path / "b"), "--out", str(tmp_path / "b"), "--", "--fail"]) == 1
    text = (tmp_path / "b.md").read_text()
    assert "Failed: together_1 (exit 3" in text


def test_log_figures_of_a_run_that_printed_nothing(tool, tmp_path):
    empty = tmp_path / "x.log"
    empty.write_text("Traceback ...\n")
    assert tool.log_figures(empty) == {"done_s": None, "first_epoch": None, "later_epochs": None, "epochs": 0,
                                       "epochs_s": 0, "setup_s": 0, "setup_parts": None}
    older = tmp_path / "y.log"  # a fold line from before the set-up parts were printed: the total alone
    older.write_text("fold 0: train ...; set up in 1.5 s\n")
    assert tool.log_figures(older)["setup_s"] == 1.5 and tool.log_figures(older)["setup_parts"] is None
    assert tool.log_figures(tmp_path / "missing.log")["epochs"] == 0
