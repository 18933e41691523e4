"""tools/bench_scale.py on two generated days of 2,000 rows: the import is the real `fox data import`; `fox train`
is a stand-in that prints the lines the tool looks for (a real one takes minutes under the simulator), so this
checks the tool's timing, its markers and its report, not the trainer."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parents[1] / "tools"

STAND_IN = """
import os, sys, time
if sys.argv[1:3] == ["data", "import"]:
    os.execv(sys.executable, [sys.executable, "-m", "fox_numba", *sys.argv[1:]])
print("run folder somewhere", flush=True)
block = b"x" * (64 << 20)  # touched: the peak RSS read at the next line includes it
print("fold 0: train a..b (1 days), validate c..c (1 days): 390 bars; 10 state entries reset; baselines: x",
      flush=True)
time.sleep(0.2)  # alive while the tool reads its peak RSS
print("fold 0 epoch 0: val Sharpe +0.00", flush=True)
time.sleep(0.2)
"""


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_scale_fills_its_report(tmp_path, monkeypatch):
    dbn = tmp_path / "dbn"
    subprocess.run([sys.executable, str(TOOLS / "gen_dbn.py"), str(dbn), "--rows", "2000", "--days", "2"],
                   check=True, capture_output=True)  # fmt: skip
    stand_in = tmp_path / "fox_stand_in.py"
    stand_in.write_text(STAND_IN)
    bench = load("bench_scale")
    monkeypatch.setattr(bench, "fox", lambda: [sys.executable, str(stand_in)])
    out = tmp_path / "scale"
    assert bench.main([str(dbn), "--out", str(out), "--set", "folds.n_folds=1", "--work", str(tmp_path)]) == 0
    report = json.loads(Path(f"{out}.json").read_text())
    assert report["machine"]["nproc"] >= 1 and report["machine"]["numpy"]
    (f,) = report["folders"]
    assert f["days"] == 2 and f["days_trained"] == 2 and f["rows_a_day"]["mbp10"] == 2000
    assert f["fold_plan"][:2] == ["folds.train_days=1", "folds.val_days=1"]
    imp = f["import"]
    assert imp["records"] == 2 * (2000 + 500) and imp["store_bytes"] > 0 and imp["dbn_bytes"] > 0
    assert imp["wall_s"] > 0 and imp["cpu_s"] > 0 and imp["peak_rss_mib"] > 0 and len(imp["load"]) == 2
    for case in ("cold", "warm"):
        r = f["train"][case]
        at = [r["markers"][name] for name in ("run_folder", "first_collect", "first_epoch")]
        assert all(m is not None for m in at) and at[0]["s"] <= at[1]["s"] <= at[2]["s"] <= r["wall_s"]
        assert at[1]["peak_rss_mib"] >= 64 and r["peak_rss_mib"] >= at[1]["peak_rss_mib"]
        assert "--store" in r["command"] and "market.cache=" in r["command"]
    text = Path(f"{out}.md").read_text()
    assert text.count(str(dbn)) >= 3 and "| cold |" in text and "| warm |" in text
    assert not list(tmp_path.glob("scale-dbn-*"))  # the work folder is removed without --keep
