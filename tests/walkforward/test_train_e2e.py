"""`fox train --preset smoke` end to end under the simulator, and an exact resume after kill -9.

The store is four synthetic days (the smoke preset's 2 folds of 2 training + 1 validation days). One
uninterrupted run is the reference; a second run is SIGKILLed during fold 0's second epoch, resumed with
`fox train --resume`, and must end with the same metrics lines, HEALTH_DIAG lines and final parameters.
"""

import json
import os
import signal
import subprocess
import sys
import time

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from fox_numba.checkpoint import load_checkpoint
from fox_numba.cli import backend_line
from fox_numba.diag.layout import parse_line
from fox_numba.market import default
from fox_numba.market.store import write_store
from fox_numba.market.synthetic import generate
from fox_numba.market.synthetic_definition import load_definition

EPOCHS, FOLDS = 2, 2  # the smoke preset's


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    market = generate(load_definition(default.default_definition_path()).with_overrides(days=4))
    return write_store(tmp_path_factory.mktemp("store") / "four.h5", market.instrument, market.days)


def fox_train(*args, out_dir, name):
    cmd = [sys.executable, "-m", "fox_numba", "train", *args]
    if "--resume" not in args:
        cmd += ["--preset", "smoke", "--set", f"run.out_dir={json.dumps(str(out_dir))}", "--set", f"run.name={json.dumps(name)}"]
    return cmd


@pytest.fixture(scope="module")
def reference(store, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    proc = subprocess.run(fox_train("--store", str(store), out_dir=out, name="ref"), capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out / "ref", proc


def metrics(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_smoke_runs_every_fold_end_to_end(reference):
    run, proc = reference
    assert backend_line() in proc.stderr  # where the kernels ran, said in one line
    lines = metrics(run)
    assert [(ln["fold"], ln["epoch"]) for ln in lines] == [(k, e) for k in range(FOLDS) for e in range(EPOCHS)]
    for k in range(FOLDS):
        reset = next(ln for ln in proc.stdout.splitlines() if ln.startswith(f"fold {k} reset ("))
        for entry in ("learner.adam_moments", "learner.params", "learner.target", "collector.replay",
                      "isv.FOLD_WARMUP_FACTOR", "kill.q_drift.window"):
            assert entry in reset
        assert lines[k * EPOCHS]["resets"] and lines[k * EPOCHS]["kill"] is None
        for name in ("last.h5", "best.h5", "best_validation.npz", "baselines.npz"):
            assert (run / f"fold_{k:02d}" / name).is_file()
    assert all(np.isfinite(ln["train"]["loss"]) and ln["train"]["steps"] == 4 for ln in lines)
    summary = json.loads((run / "summary.json").read_text())
    assert len(summary["folds"]) == FOLDS and summary["across_folds"] is not None
    assert {p.name for p in (run / "report").iterdir()} >= {"report.md", "equity.png", "sharpe.png", "signals.png",
                                                             "actions.png"}
    for name in ("equity", "sharpe", "signals", "actions"):
        img = plt.imread(run / "report" / f"{name}.png")  # decodes the whole PNG
        assert img.shape[:2] == (600, 1000) and img.std() > 0.01, name  # 10 x 6 in at 100 dpi, not blank
    assert "| 0 |" in (run / "report" / "report.md").read_text()
    diag = [parse_line(ln) for ln in (run / "health_diag.log").read_text().splitlines()]
    assert len(diag) == FOLDS * EPOCHS * 2  # 4 steps per epoch, a snapshot every 2
    assert [d["step"] for d in diag[:4]] == [2, 4, 6, 8]  # the fold's step counter runs on across its epochs
    assert sum(diag[0][f"train_dir_{d}"] for d in ("short", "hold", "long", "flat")) == 16  # one collect step
    assert proc.stdout.count("HEALTH_DIAG ") == len(diag)


def test_a_killed_run_resumes_to_the_same_numbers(reference, store, tmp_path):
    ref, _ = reference
    proc = subprocess.Popen(fox_train("--store", str(store), out_dir=tmp_path, name="cut"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    run = tmp_path / "cut"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        if (run / "metrics.jsonl").is_file() and len((run / "metrics.jsonl").read_text().splitlines()) >= 1:
            time.sleep(1.0)  # into fold 0's second epoch
            break
        time.sleep(0.2)
    assert proc.poll() is None, "the run ended before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert len(metrics(run)) < FOLDS * EPOCHS
    resumed = subprocess.run(fox_train("--resume", str(run), out_dir=tmp_path, name="cut"), capture_output=True,
                             text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout
    assert metrics(run) == metrics(ref)
    assert (run / "health_diag.log").read_text() == (ref / "health_diag.log").read_text()
    a, b = load_checkpoint(ref / "fold_01" / "last.h5"), load_checkpoint(run / "fold_01" / "last.h5")
    assert sorted(a.arrays) == sorted(b.arrays) and "learner.params" in a.arrays
    for name in a.arrays:
        assert a.arrays[name].tobytes() == b.arrays[name].tobytes(), name  # bit for bit (NaN fields too)
