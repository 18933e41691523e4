"""`fox sweep` on a local Ray cluster under the simulator: a 1 x 2 (configs x seeds) smoke sweep, then a
sweep that loses a trial to kill -9 and resumes it to the uninterrupted numbers. Two trials, so that on two
cores each sweep is one round of trials; the grid's product and the pooling over several configs are
tested without Ray (tests/sweep/test_spec.py, test_aggregate.py).

Every trial is `fox train` (the smoke preset) on a four-day synthetic store whose regular session is half
an hour (30 bars a day), with one fold of 2 training and 2 validation days, 2 epochs of one gradient step
and a tiny network and replay (TRIAL_SETS): a trial takes under 30 s of one core, about 10 of them setting
up (the whole reference sweep, Ray's start included, about 40 s on two cores).

The interrupted sweep runs both trials again: one is killed once its first checkpoint exists while the
other finishes; the rerun skips the finished trial, resumes the killed one, and every figure of the
aggregate and of the killed trial's run folder matches the reference.
"""

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest


TRIAL_SETS = ("folds.n_folds=1", "folds.train_days=2", "folds.val_days=2", "folds.purge_bars=5", "learner.epochs=2",
              "learner.steps_per_epoch=1", "learner.batch_size=4", "learner.buffer_size=64", "env.n_envs=4",
              "env.collect_steps=2", "env.episode_bars=16", "network.hidden=8", "network.n_atoms=5")
SPEC = '[sweep]\nseeds = [0, 1]\n[grid]\n"learner.lr" = [3e-4]\n'
TRIALS = ("c00-seed0", "c00-seed1")
KILLED, RERUN = "c00-seed1", "c00-seed0"  # the trial killed mid-way, and the one that runs beside it
TIMEOUT = 600


@pytest.fixture(scope="module", autouse=True)
def ray_installed():
    if importlib.util.find_spec("ray") is None:
        if os.environ.get("CI"):
            pytest.fail("ray is not installed under CI: the README's test command installs the ray extra")
        pytest.skip("ray is not installed here (pip install -e '.[ray]')")


@pytest.fixture(scope="module")
def store(half_hour_store):
    return half_hour_store


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    path = tmp_path_factory.mktemp("spec") / "smoke.toml"
    path.write_text(SPEC, encoding="utf-8")
    return path


def fox_sweep(spec, store, out):
    sets = [a for s in TRIAL_SETS for a in ("--set", s)]
    return [sys.executable, "-m", "fox_numba", "sweep", str(spec), "--store", str(store), "--out", str(out), *sets]


def run_sweep(spec, store, out):
    return subprocess.run(fox_sweep(spec, store, out), capture_output=True, text=True, timeout=TIMEOUT)


def summary(out):
    return json.loads((out / "summary.json").read_text())


@pytest.fixture(scope="module")
def reference(spec, store, tmp_path_factory):
    out = tmp_path_factory.mktemp("sweeps") / "ref"
    start = time.monotonic()
    proc = run_sweep(spec, store, out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    print(f"reference sweep: {time.monotonic() - start:.0f} s")
    return out, proc


def test_the_sweep_runs_every_trial_and_aggregates_them(reference):
    out, proc = reference
    done = sorted(ln.split()[2] for ln in proc.stderr.splitlines() if ln.startswith("sweep: [") and " done in " in ln)
    assert done == list(TRIALS), proc.stderr
    for trial in TRIALS:
        run = out / "runs" / trial
        for name in ("config.toml", "metrics.jsonl", "health_diag.log", "summary.json", "fold_00/best.h5"):
            assert (run / name).is_file(), (trial, name)
        assert len((run / "metrics.jsonl").read_text().splitlines()) == 2  # 1 fold x 2 epochs
        assert f'name = "{trial}"' in (run / "config.toml").read_text()
    s = summary(out)
    assert [c["config"] for c in s["configs"]] == ["c00"]
    assert [c["values"] for c in s["configs"]] == [{"learner.lr": 3e-4}]
    for c in s["configs"]:
        runs = [summary(out / "runs" / f"{c['config']}-seed{seed}") for seed in (0, 1)]
        sharpes = [f["val"]["sharpe_daily"] for r in runs for f in r["folds"]]
        assert c["finished"] == [0, 1] and c["sharpe_daily"]["n"] == 2
        assert c["sharpe_daily"]["mean"] == pytest.approx(sum(sharpes) / 2)
        assert c["sharpe_daily"]["min"] == min(sharpes) and c["sharpe_daily"]["max"] == max(sharpes)
        assert c["health_diag"]["0"]["q_abs_ref"]["n"] == 2
    assert all(t["finished"] and t["error"] is None for t in s["trials"])
    assert "agent/oracle" in proc.stdout and "c00" in proc.stdout and "2 of 2 trials finished" in proc.stdout


def trial_pids(trial, out):
    """Pids of the `fox train` processes of `trial` in the sweep folder `out`."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            args = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"train" in args and f'run.name="{trial}"'.encode() in args and any(str(out).encode() in a for a in args):
            pids.append(int(proc.name))
    return pids


def without_volatile(s):
    return {k: v for k, v in s.items() if k != "wall_s"}


def test_a_killed_trial_resumes_to_the_uninterrupted_numbers(reference, spec, store, tmp_path):
    ref, _ = reference
    out = tmp_path / "cut"
    proc = subprocess.Popen(fox_sweep(spec, store, out), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + TIMEOUT
    while not (out / "runs" / KILLED / "fold_00" / "last.h5").is_file():
        assert proc.poll() is None and time.monotonic() < deadline, "the sweep ended before the trial could be killed"
        time.sleep(0.2)
    pids = trial_pids(KILLED, out)
    assert len(pids) == 1, pids
    os.kill(pids[0], signal.SIGKILL)
    stdout, stderr = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 1, stderr[-3000:]
    assert f"{KILLED} failed (exit -9, killed by SIGKILL)" in stderr, stderr
    assert f"{RERUN} done in" in stderr and "skipped" not in stderr, stderr
    assert "1 of 2 trials finished" in stdout
    assert len((out / "runs" / KILLED / "metrics.jsonl").read_text().splitlines()) < 2
    failed = next(t for t in summary(out)["trials"] if t["id"] == KILLED)
    assert not failed["finished"] and "SIGKILL" in failed["error"]

    again = run_sweep(spec, store, out)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"{KILLED} resumed and done in" in again.stderr and again.stderr.count("skipped: finished before") == 1
    assert f"{RERUN} skipped: finished before" in again.stderr
    assert "resumed from" in (out / "logs" / f"{KILLED}.out").read_text()
    record = json.loads((out / "trials" / f"{KILLED}.json").read_text())
    assert record["attempts"] == 2 and record["returncode"] == 0 and record["error"] is None
    for name in ("metrics.jsonl", "health_diag.log", "summary.json"):
        assert (out / "runs" / KILLED / name).read_text() == (ref / "runs" / KILLED / name).read_text(), name
    assert without_volatile(summary(out)) == without_volatile(summary(ref))  # all but the wall seconds
