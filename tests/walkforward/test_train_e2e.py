"""`fox train --preset smoke` end to end under the simulator, an exact resume after kill -9, and the commands
that read a finished run (`fox evaluate`, `fox report`).

The store is four synthetic days of half-hour sessions (the smoke preset's 2 folds of 2 training + 1
validation days). Every run is the smoke preset with SETS: a quarter of its environments, half its network
width, fewer atoms and a smaller replay, which leave every stage of the run as it is and shrink only the
arrays the simulator pays for, thread by thread. One uninterrupted run is the reference. A second run is SIGKILLed
early (where depends on the machine's speed: fold 0's second epoch under the simulator), resumed with
`fox train --resume`, and must end with the same metrics lines, HEALTH_DIAG lines and final parameters; so
must a copy of the reference cut back to the end of fold 0 (a resume across a fold boundary, wherever the
kill landed).
`fox evaluate` and `fox report` run on copies of the reference run (no extra training).
"""

import importlib.util
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from fox_numba.agent.trainer import RING_STATE
from fox_numba.checkpoint import load_checkpoint
from fox_numba.cli import backend_line
from fox_numba.config import PRESETS
from fox_numba.diag.layout import parse_line
from fox_numba.market.calendar import bars_in_session
from fox_numba.market.store import MarketStore
from fox_numba.walkforward.report import FIGURES, equity_figure, write_report

EPOCHS, FOLDS = PRESETS["smoke"]["learner.epochs"], PRESETS["smoke"]["folds.n_folds"]
STEPS, DIAG_EVERY = PRESETS["smoke"]["learner.steps_per_epoch"], PRESETS["smoke"]["run.diag_every"]
ROOT = Path(__file__).resolve().parents[2]
N_ENVS = 4
SETS = (f"env.n_envs={N_ENVS}", "network.hidden=8", "network.n_atoms=5", "learner.batch_size=4",
        "learner.buffer_size=32")  # the replay holds a fold's 2 epochs x 4 collect steps x 4 environments


@pytest.fixture(scope="module")
def store(half_hour_store):
    return half_hour_store


def fox_train(*args, out_dir, name):
    cmd = [sys.executable, "-m", "fox_numba", "train", *args]
    if "--resume" not in args:
        cmd += ["--preset", "smoke", "--set", f"run.out_dir={json.dumps(str(out_dir))}", "--set", f"run.name={json.dumps(name)}"]
        cmd += [a for s in SETS for a in ("--set", s)]
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


def fox(*args):
    return subprocess.run([sys.executable, "-m", "fox_numba", *args], capture_output=True, text=True, timeout=900)


def best_line(run, k):
    """The metrics line of fold k's best epoch, as summary.json names it."""
    best = json.loads((run / "summary.json").read_text())["folds"][k]["best_epoch"]
    return next(ln for ln in metrics(run) if (ln["fold"], ln["epoch"]) == (k, best))


def assert_report(run):
    """Every figure decodes at 1000 x 600 (10 x 6 in at 100 dpi) and is not blank; report.md has a row per fold."""
    for name in FIGURES:
        img = plt.imread(run / "report" / name)  # decodes the whole PNG
        assert img.shape[:2] == (600, 1000) and img.std() > 0.01, name
    text = (run / "report" / "report.md").read_text()
    for k in range(FOLDS):
        assert f"| {k} | {best_line(run, k)['epoch']} | " in text
    assert all(f"![{name}]({name})" in text for name in FIGURES)


def test_smoke_runs_every_fold_end_to_end(reference):
    run, proc = reference
    assert backend_line() in proc.stderr  # where the kernels ran, said in one line
    lines = metrics(run)
    assert [(ln["fold"], ln["epoch"]) for ln in lines] == [(k, e) for k in range(FOLDS) for e in range(EPOCHS)]
    train_log = (run / "train.log").read_text().splitlines()
    for k in range(FOLDS):
        reset = next(ln for ln in train_log if ln.startswith(f"fold {k} reset ("))  # in full in the run folder
        assert sum(ln.startswith(f"fold {k}: ") and "state entries reset (listed in train.log)" in ln
                   and re.search(r"; set up in \d+\.\d s: features \d+\.\d, device \d+\.\d, resets \d+\.\d, "
                                r"baselines \d+\.\d$", ln) is not None
                   for ln in proc.stdout.splitlines()) == 1  # counted in the fold's one console line, timed
        for entry in ("learner.adam_moments", "learner.params", "learner.target", "collector.replay",
                      "isv.FOLD_WARMUP_FACTOR", "kill.q_drift.window"):
            assert entry in reset
        assert lines[k * EPOCHS]["resets"] and lines[k * EPOCHS]["kill"] is None
        for name in ("last.h5", "best.h5", "best_validation.npz", "baselines.npz"):
            assert (run / f"fold_{k:02d}" / name).is_file()
        for name in ("last.h5", "best.h5"):  # the fold has ended: the ring its successor empties is left out
            held = load_checkpoint(run / f"fold_{k:02d}" / name).arrays
            assert "learner.params" in held and not set(RING_STATE) & set(held), name
    assert all(np.isfinite(ln["train"]["loss"]) and ln["train"]["steps"] == STEPS for ln in lines)
    summary = json.loads((run / "summary.json").read_text())
    assert len(summary["folds"]) == FOLDS and summary["across_folds"] is not None
    assert_report(run)
    diag = [parse_line(ln) for ln in (run / "health_diag.log").read_text().splitlines()]
    assert len(diag) == FOLDS * EPOCHS * STEPS // DIAG_EVERY  # a snapshot every DIAG_EVERY steps
    per_fold = EPOCHS * STEPS // DIAG_EVERY  # the fold's step counter runs on across its epochs, then restarts
    assert [d["step"] for d in diag] == [DIAG_EVERY * (k % per_fold + 1) for k in range(len(diag))]
    assert sum(diag[0][f"train_dir_{d}"] for d in ("short", "hold", "long", "flat")) == N_ENVS  # one collect step
    assert "HEALTH_DIAG " not in proc.stdout and not re.search(r"^fold \d+ reset \(", proc.stdout, re.M)  # quiet
    assert max(len(ln) for ln in proc.stdout.splitlines()) < 400


def test_a_killed_run_resumes_to_the_same_numbers(reference, store, tmp_path):
    ref, _ = reference
    proc = subprocess.Popen(fox_train("--store", str(store), out_dir=tmp_path, name="cut"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    run = tmp_path / "cut"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        if (run / "fold_00" / "last.h5").is_file():  # the first epoch's checkpoint (renamed into place whole)
            break  # at once: on a GPU the three epochs left take about a second
        time.sleep(0.01)
    assert proc.poll() is None, "the run ended before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert len(metrics(run)) < FOLDS * EPOCHS
    first = load_checkpoint(run / "fold_00" / "last.h5")  # the first epoch's, unless the second ended meanwhile
    ring = set(RING_STATE) & set(first.arrays)
    assert ring == (set() if first.meta["fold_done"] else set(RING_STATE))  # mid-fold, resuming needs the ring
    resumed = subprocess.run(fox_train("--resume", str(run), out_dir=tmp_path, name="cut"), capture_output=True,
                             text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout
    assert_same_run(run, ref)


def assert_same_run(run, ref):
    """The same metrics lines, HEALTH_DIAG lines and final checkpoint, bit for bit."""
    assert metrics(run) == metrics(ref)
    assert (run / "health_diag.log").read_text() == (ref / "health_diag.log").read_text()
    a, b = load_checkpoint(ref / "fold_01" / "last.h5"), load_checkpoint(run / "fold_01" / "last.h5")
    assert sorted(a.arrays) == sorted(b.arrays) and "learner.params" in a.arrays
    for name in a.arrays:
        assert a.arrays[name].tobytes() == b.arrays[name].tobytes(), name  # bit for bit (NaN fields too)


def test_a_run_cut_at_a_fold_boundary_resumes_to_the_same_numbers(reference, tmp_path):
    """Fold 1 starts from fold 0's last checkpoint: the run-wide state (learner, replay, ISV) from the file,
    the environments' and the collector's random streams seeded for fold 1 as in an uninterrupted run."""
    ref, _ = reference
    run = tmp_path / "cut"
    shutil.copytree(ref, run)
    shutil.rmtree(run / "fold_01")
    lines = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
    (run / "metrics.jsonl").write_text("".join(ln for ln in lines if json.loads(ln)["fold"] == 0))
    proc = subprocess.run(fox_train("--resume", str(run), out_dir=tmp_path, name="cut"), capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"resumed from {run / 'fold_00' / 'last.h5'} at fold 1 epoch 0" in proc.stdout
    assert any(ln.startswith("fold 1: ") and "state entries reset" in ln for ln in proc.stdout.splitlines())
    assert_same_run(run, ref)


def same(a, b):
    """Equal, a None (strict JSON's NaN in metrics.jsonl) matching a NaN."""
    return (a is None or math.isnan(a)) and (b is None or math.isnan(b)) or a == b


def test_evaluate_reproduces_the_best_epoch_and_takes_a_day_range(reference, store):
    """Without --set: fold 0's validation days, every agent figure as the run recorded it for the best epoch
    (the same network, statistics and backtest). With a bare-date day range: the fold's training days."""
    run, _ = reference
    ck = run / "fold_00" / "best.h5"
    proc = fox("evaluate", str(ck), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout)
    line = best_line(run, 0)
    assert {k for k in got if k.startswith("agent_")} == {f"agent_{k}" for k in line["val"]}
    for name, value in line["val"].items():
        assert same(got[f"agent_{name}"], value), name  # exactly: the same kernels on the same inputs
    assert got["days"] == line["val"]["n_days"] == 1
    base = line["baselines"]
    assert same(got["buy_and_hold_sharpe_daily"], base["buy_and_hold"]["sharpe_daily"])
    assert same(got["flat_sharpe_daily"], base["flat"]["sharpe_daily"])

    train_days = json.loads((run / "folds.json").read_text())["folds"][0]["train_days"]
    proc = fox("evaluate", str(ck), "--set", f"market.first_day={train_days[0]}", "--set",
               f"market.last_day={train_days[-1]}")  # bare dates, as the README writes them
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"on {len(train_days)} days of " in proc.stderr and f"({train_days[0]}..{train_days[-1]})" in proc.stderr
    rows = {}
    for text in proc.stdout.splitlines():
        cells = [c.strip() for c in text.split("│")]
        if len(cells) == 4:  # │ name │ value │
            rows[cells[1]] = float(cells[2].replace(",", ""))
    assert list(rows) == list(got)  # one row per figure, in the JSON's order
    with MarketStore(store) as st:
        steps = sum(bars_in_session(st.read_day(d).bars.ts_event, d, st.instrument, "regular").size - 1
                    for d in train_days)  # a step per bar but each day's last
    assert rows["agent_n_days"] == rows["days"] == len(train_days) != got["agent_n_days"]
    assert rows["agent_n_bars"] == steps != got["agent_n_bars"]
    assert rows["agent_total_return"] == pytest.approx(len(train_days) * rows["agent_mean_daily_pnl"], rel=1e-5)
    assert rows["agent_total_return"] != pytest.approx(got["agent_total_return"], rel=1e-3)

    proc = fox("evaluate", str(ck), "--set", "evaluation.hold_margin=1000", "--json")  # not a day-choosing section
    assert proc.returncode == 0, proc.stderr[-3000:]
    held = json.loads(proc.stdout)
    assert held["days"] == got["days"] and held["agent_n_bars"] == got["agent_n_bars"]  # the same validation days
    assert held["agent_trades"] == 0 < got["agent_trades"]  # no change of position beats Hold by 1000


def test_report_command_rewrites_the_report(reference, tmp_path):
    run = tmp_path / "ref"
    shutil.copytree(reference[0], run)
    shutil.rmtree(run / "report")
    proc = fox("report", str(run))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == f"report {run / 'report' / 'report.md'}"
    assert_report(run)


def test_equity_panels_plot_each_folds_best_epoch(reference):
    """A panel per fold with the best epoch's curve, a point per validation bar (a report with only the flat
    line, as when best_validation.npz was not written, fails here: the PNG checks cannot see it)."""
    run, _ = reference
    fig = equity_figure(run, list(range(FOLDS)))
    for k, ax in enumerate(fig.axes[:FOLDS]):
        line = best_line(run, k)
        agent = [ln for ln in ax.get_lines() if re.fullmatch(r"agent \(epoch \d+\)", ln.get_label())]
        assert [ln.get_label() for ln in agent] == [f"agent (epoch {line['epoch']})"], k
        assert len(agent[0].get_xdata()) == line["val"]["n_bars"]
        assert agent[0].get_ydata()[-1] == pytest.approx(line["val"]["total_return"])
    plt.close(fig)


def test_a_missing_best_validation_is_reported_not_silently_skipped(reference, tmp_path):
    run = tmp_path / "ref"
    shutil.copytree(reference[0], run)
    (run / "fold_01" / "best_validation.npz").unlink()
    notes = []
    write_report(run, log=notes.append)
    note = "fold 1: best_validation.npz missing, so its equity panel has no agent curve"
    assert notes == [note]
    assert note in (run / "report" / "report.md").read_text()
    fig = equity_figure(run, [0, 1])
    assert [t.get_text() for t in fig.axes[1].texts] == ["no best_validation.npz"] and not fig.axes[0].texts
    plt.close(fig)


def test_signal_probe_reads_each_folds_honest_checkpoint(reference):
    """tools/signal_probe.py on the finished run: a row per fold at its checkpoint's epoch, the agent's figures
    those the run recorded for that epoch, the probe's those of the run's own baseline (the same fit on the same
    days), and the signal's one-column fit scored on the validation rows (tests/agent/test_direction_signal.py
    checks the signal itself against a float64 reference)."""
    run, _ = reference
    spec = importlib.util.spec_from_file_location("signal_probe", ROOT / "tools" / "signal_probe.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    folds = tool.run_folds(run)
    assert [f["fold"] for f in folds] == list(range(FOLDS))
    for f in folds:
        line = best_line(run, f["fold"])
        assert f["epoch"] == line["epoch"]
        assert same(f["agent_bar"], line["val"]["sharpe_bar"]) and same(f["agent"], line["val"]["sharpe_daily"])
        assert f["probe_bar"] == pytest.approx(line["baselines"]["probe"]["sharpe_bar"], rel=1e-12)
        assert math.isfinite(f["signal_r2"])
