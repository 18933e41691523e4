"""The run folder and resume: a run killed with SIGKILL at chosen moments (a temporary file written but not
renamed, a metrics line written before its checkpoint, a torn metrics line, during a resume, at a fold
boundary, on a killed fold's last epoch) and resumed each time ends with the same files, metrics and
parameters as an uninterrupted run with the same seed. The trainer is tests/walkforward/fake_trainer.py,
run in a subprocess so that it can really be killed."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fox_numba.checkpoint import load_checkpoint, save_checkpoint
from fox_numba.config import load_config
from fox_numba.errors import ConfigError, InputError, Interrupted
from fox_numba.walkforward.folds import make_folds
from fox_numba.walkforward.metrics import DaySeries, compute_metrics
from fox_numba.walkforward.reset_registry import StateResetRegistry
from fox_numba.walkforward.run_folder import BestEpoch, RunFolder, epoch_line

HERE = Path(__file__).parent
DAYS = tuple(f"2024-03-{d:02d}" for d in range(1, 8))


def fake(run_dir, *args):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path]), "NUMBA_ENABLE_CUDASIM": "1"}
    return subprocess.run([sys.executable, str(HERE / "fake_trainer.py"), str(run_dir), *args], env=env,
                          capture_output=True, text=True, timeout=300)


def snapshot(run_dir):
    """Everything a finished run leaves, comparable with ==."""
    out = {name: (run_dir / name).read_text() for name in ("metrics.jsonl", "summary.json", "folds.json")}
    out["config.toml"] = (run_dir / "config.toml").read_text().replace(str(run_dir.parent), "RUNS")  # out_dir differs
    for fold_dir in sorted(run_dir.glob("fold_*")):
        for name in ("last.h5", "best.h5"):
            ck = load_checkpoint(fold_dir / name)
            out[f"{fold_dir.name}/{name}"] = (ck.meta, ck.registry_state, {k: v.tolist() for k, v in ck.arrays.items()})
        with np.load(fold_dir / "best_validation.npz") as z:
            out[f"{fold_dir.name}/best_validation"] = {k: z[k].tolist() for k in z.files}
    leftovers = [p.name for p in run_dir.rglob(".*.tmp-*")]
    return out, leftovers


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("runs") / "base"
    proc = fake(run_dir)
    assert proc.returncode == 0, proc.stderr
    return snapshot(run_dir)


def test_the_uninterrupted_run(uninterrupted):
    files, leftovers = uninterrupted
    lines = [json.loads(x) for x in files["metrics.jsonl"].splitlines()]
    assert [(x["fold"], x["epoch"]) for x in lines] == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (1, 2), (1, 3),
                                                        (2, 0), (2, 1), (2, 2), (2, 3)]
    kill = lines[7]["kill"]
    assert kill["criterion"] == "q_drift" and kill["epoch"] == 3  # fold 1 ends on its kill, fold 2 still runs
    assert [len(x["resets"]) for x in lines if "resets" in x] == [10, 10, 10]
    summary = json.loads(files["summary.json"])
    assert summary["folds"][1]["kill"]["criterion"] == "q_drift"
    for fold in summary["folds"]:
        best = [x for x in lines if x["fold"] == fold["fold"] and x["best"]][-1]
        assert fold["best_epoch"] == best["epoch"] and fold["val"] == best["val"]
        fold_lines = [x for x in lines if x["fold"] == fold["fold"] and x["kill"] is None]
        assert best["epoch"] == fold_lines[-1]["epoch"]  # the last epoch no kill fired at (no selection days)
        peak = max(fold_lines, key=lambda x: x["val"]["sharpe_daily"])
        assert (fold["in_sample_best_epoch"], fold["in_sample_best_val"]) == (peak["epoch"], peak["val"])
        ck = files[f"fold_{fold['fold']:02d}/best.h5"]
        assert ck[0]["epoch"] == fold["best_epoch"] and ck[1]["run.best.epoch"] == fold["best_epoch"]
    last = [[x for x in lines if x["fold"] == k][-1] for k in range(3)]  # fold 1's is its kill epoch
    assert [(f["last_epoch"], f["last_val"]) for f in summary["folds"]] == [(x["epoch"], x["val"]) for x in last]
    assert summary["last_epoch_sharpe_mean"] == pytest.approx(np.mean([x["val"]["sharpe_daily"] for x in last]))
    for fold in summary["folds"]:  # every epoch of the fold, its kill epoch included
        every = [x["val"]["sharpe_daily"] for x in lines if x["fold"] == fold["fold"]]
        assert fold["every_epoch_sharpe_mean"] == pytest.approx(np.mean(every)) and len(set(every)) > 1
    assert files["fold_02/last.h5"][0] == {"fold": 2, "epoch": 3, "fold_done": True}
    assert leftovers == []


def test_killed_at_many_moments_and_resumed_ends_identically(tmp_path, uninterrupted):
    run_dir = tmp_path / "base"  # the same name: config.toml records it
    chain = [
        ([], "replace:4"),  # fold 0 epoch 0: best.h5 written under its temporary name, not renamed
        (["--resume"], "metrics:3"),  # from scratch again; dies after epoch 2's line, before its checkpoint
        (["--resume"], "torn:3"),  # dies half-way through fold 1 epoch 0's line (after a fold boundary)
        (["--resume"], "replace:6"),  # fold 1 epoch 2: last.h5 complete under its temporary name
        (["--resume"], "metrics:2"),  # fold 1 epoch 3 (the kill epoch): line written, checkpoint not
    ]
    for args, kill in chain:
        proc = fake(run_dir, *args, "--kill", kill)
        assert proc.returncode == -signal.SIGKILL, (kill, proc.stderr)
        assert (run_dir / ".lock").exists()  # the killed process could not delete it; the resume takes it over
        if kill.startswith("replace"):  # the temporary file is left behind, complete; the resume deletes it
            (stale,) = run_dir.rglob(".*.tmp-*")
            assert stale.stat().st_size > 0
    proc = fake(run_dir, "--resume")
    assert proc.returncode == 0, proc.stderr
    assert snapshot(run_dir) == uninterrupted
    assert not (run_dir / ".lock").exists()
    proc = fake(run_dir, "--resume")  # a finished run resumes to nothing new
    assert proc.returncode == 0, proc.stderr
    assert snapshot(run_dir) == uninterrupted


def days(seed):
    rng = np.random.default_rng(seed)
    return [DaySeries(rng.standard_normal(8), np.sign(rng.standard_normal(8))) for _ in range(3)]


def test_folder_rules(tmp_path):
    cfg = load_config("smoke", overrides=[f"run.out_dir={tmp_path}", "run.name=r"])
    run = RunFolder.create(cfg, make_folds(cfg.folds, DAYS))
    assert run.config() == cfg
    assert [f["index"] for f in run.folds()] == [0, 1]
    with pytest.raises(ConfigError, match="in use by another process"):
        RunFolder.open(run.path)
    run.close()
    with pytest.raises(ConfigError, match="a run already lives there"):
        RunFolder.create(cfg, make_folds(cfg.folds, DAYS))
    with pytest.raises(InputError, match="not a run folder"):
        RunFolder.open(tmp_path)
    (run.path / "fold_00").mkdir()
    stale = run.path / "fold_00" / ".last.h5.tmp-12345"
    stale.write_bytes(b"half a checkpoint")
    with RunFolder.open(run.path) as again:
        assert not stale.exists()
        assert again.resume_point(2) is None  # no epoch recorded: start from the beginning


def test_the_lock_file_lives_while_the_folder_is_open(tmp_path):
    """Deleted on a clean close and on an interrupt; one that no process holds (a SIGKILL left it) is taken
    over and said so."""
    cfg = load_config("smoke", overrides=[f"run.out_dir={tmp_path}", "run.name=r"])
    lock = tmp_path / "r" / ".lock"
    with RunFolder.create(cfg, make_folds(cfg.folds, DAYS)) as run:
        assert lock.exists() and run.lock_note() is None
    assert not lock.exists()
    with pytest.raises(Interrupted), RunFolder.open(run.path):
        assert lock.exists()
        raise Interrupted(signal.SIGINT)
    assert not lock.exists()
    lock.touch()  # what a killed run leaves: the file, no holder
    with RunFolder.open(run.path) as again:
        note = (f"{lock}: left by a run that did not exit cleanly (killed?); no process held it, so this run took "
                "it over")
        assert again.lock_note() == note
        with pytest.raises(ConfigError, match="in use by another process"):
            RunFolder.open(run.path)
    assert not lock.exists()


def test_without_selection_days_the_last_epoch_is_chosen_and_the_peek_is_labelled(tmp_path):
    """Three epochs whose validation Sharpe peaks at epoch 1: the checkpoint (best.h5, best_validation.npz,
    summary's best_epoch / val / honest_sharpe_mean) is the last epoch's; the validation peak is reported as
    the in-sample best and chooses nothing. A killed epoch is never chosen."""
    cfg = load_config("smoke", overrides=[f"run.out_dir={tmp_path}", "run.name=r"])
    registry, best = StateResetRegistry(), BestEpoch("last")
    best.register_state(registry)
    vals = sorted((compute_metrics(days(seed), annualisation_days=252) for seed in (1, 2, 3)),
                  key=lambda m: m.sharpe_daily)
    order = [vals[0], vals[2], vals[1]]  # epoch 1 has the best validation Sharpe, epoch 2 is the last
    with RunFolder.create(cfg, make_folds(cfg.folds, DAYS)) as run:
        for e, val in enumerate(order):
            run.end_epoch(epoch_line(0, e, val=val), arrays={"p": np.full(3, e, np.float32)}, registry=registry,
                          best=best, fold_done=e == 2, validation=days(e + 1))
        assert [ln["best"] for ln in run.read_metrics()] == [True, True, True]
        assert load_checkpoint(run.fold_dir(0) / "best.h5").arrays["p"].tolist() == [2, 2, 2]
        assert run.best_validation(0)[0].pnl.tolist() == days(3)[0].pnl.tolist()
        with open(run.path / "metrics.jsonl", "a") as fh:
            fh.write('{"fold": 0, "ep')  # a torn line
        assert len(run.read_metrics()) == 3
        point = run.resume_point(2)
        assert (point.fold, point.epoch, point.fold_boundary, point.run_done) == (1, 0, True, False)
        assert (run.path / "metrics.jsonl").read_text().endswith("}\n")
        summary = run.summarise(annualisation_days=252, chosen_by=best.rule)
    fold = summary["folds"][0]
    assert summary["best_chosen_on"] == "last" and fold["best_epoch"] == 2 and fold["val"] == order[2].as_dict()
    assert summary["honest_sharpe_mean"] == order[2].sharpe_daily
    assert fold["in_sample_best_epoch"] == 1 and summary["in_sample_best_sharpe_mean"] == order[1].sharpe_daily
    assert order[1].sharpe_daily > order[2].sharpe_daily  # the peek is higher: it is in sample
    assert best.update(3, float("nan")) is True and best.epoch == 3 and best.sharpe is None
    assert best.update(4, 1e9, eligible=False) is False and best.epoch == 3


def test_selection_days_choose_the_best_epoch(tmp_path):
    """With selection figures on the lines, they choose: validation and selection Sharpe rank the three epochs
    in opposite orders here, and the summary says what chose."""
    cfg = load_config("smoke", overrides=[f"run.out_dir={tmp_path}", "run.name=r"])
    registry, best = StateResetRegistry(), BestEpoch.for_config(select_days=10)
    best.register_state(registry)
    vals = sorted((compute_metrics(days(seed), annualisation_days=252) for seed in (1, 2, 3)),
                  key=lambda m: m.sharpe_daily)
    sels = vals[::-1]  # the best by selection is epoch 0, by validation epoch 2
    with RunFolder.create(cfg, make_folds(cfg.folds, DAYS)) as run:
        for e in range(3):
            run.end_epoch(epoch_line(0, e, val=vals[e], select=sels[e]), arrays={"p": np.full(3, e, np.float32)},
                          registry=registry, best=best, fold_done=e == 2, validation=days(e + 1))
        chosen = 0
        assert len({v.sharpe_daily for v in vals}) == 3
        assert best.epoch == chosen and best.sharpe == sels[chosen].sharpe_daily
        assert load_checkpoint(run.fold_dir(0) / "best.h5").arrays["p"].tolist() == [chosen] * 3
        lines = run.read_metrics()
        assert lines[chosen]["select"] == sels[chosen].as_dict() and lines[chosen]["best"]
        assert [ln["best"] for ln in lines] == [True, False, False]
        summary = run.summarise(annualisation_days=252, chosen_by=best.rule)
        assert summary["best_chosen_on"] == "selection" and summary["folds"][0]["best_epoch"] == chosen
        assert summary["folds"][0]["val"] == vals[chosen].as_dict()
        assert summary["folds"][0]["in_sample_best_epoch"] == 2
    assert best.update(5, float("nan")) is False and best.update(5, 1e9, eligible=False) is False
    with pytest.raises(ValueError, match="rule must be one of"):
        BestEpoch("validation")


def test_resume_checks_the_layouts(tmp_path):
    cfg = load_config("smoke", overrides=[f"run.out_dir={tmp_path}", "run.name=r"])
    with RunFolder.create(cfg, make_folds(cfg.folds, DAYS)) as run:
        save_checkpoint(run.fold_dir(0) / "last.h5", {"p": np.zeros(3, np.float32)}, {"fold": 0, "epoch": 1,
                        "fold_done": False}, fingerprints={"params": "aaaa"})
        point = run.resume_point(2, expected_fingerprints={"params": "aaaa"})
        assert (point.fold, point.epoch, point.fold_boundary) == (0, 2, False)
        from fox_numba.errors import LayoutMismatchError
        with pytest.raises(LayoutMismatchError, match="params layout fingerprint aaaa differs from this build's bbbb"):
            run.resume_point(2, expected_fingerprints={"params": "bbbb"})
