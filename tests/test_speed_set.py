"""tools/speed_set.py: the speed set's commands in order, each step's exit status, wall and peak RSS recorded, and the
cold and warm runs' checkpoints compared array by array (a NaN field equal to itself, any other difference not)."""

from __future__ import annotations

import cProfile
import json
import sys

import h5py
import numpy as np
import pytest
from tool_loader import tool_module


@pytest.fixture(scope="module")
def tool():
    yield from tool_module("speed_set")


def test_the_steps_name_the_card_and_the_scratch(tool, tmp_path):
    plan = tool.steps(tmp_path / "out", "h200", tmp_path / "s", pytest=True)
    assert [n for n, _ in plan] == ["train_cold", "train_warm", "bench_learner_mirror", "bench_learner_trunk",
                                    "bench_learner_shared", "bench_collect", "profile", "bench_runs", "pytest"]
    argv = dict(plan)
    assert argv["train_cold"][-1] == f'run.out_dir="{tmp_path / "s" / "cold"}"'
    assert str(tmp_path / "out" / "many_runs_tw_h200") in argv["bench_runs"]
    assert "--mirror" in argv["bench_learner_mirror"] and "--layers" in argv["bench_learner_trunk"]
    shared = argv["bench_learner_shared"]
    assert shared[shared.index("--concurrent") + 1] == "8" and "--mirror" in shared
    assert [n for n, _ in tool.steps(tmp_path, "x", tmp_path, pytest=False)][-1] == "bench_runs"
    warm = dict(tool.steps(tmp_path, "x", tmp_path / "s", pytest=False, warm=True))
    assert warm["cache_warm"][-3:] == ["fox_numba", "cache", "warm"]
    assert warm["train_prewarmed"][-1] == f'run.out_dir="{tmp_path / "s" / "prewarmed"}"'
    assert argv["profile"][-3:] == ["profile", "--set", f'run.out_dir="{tmp_path / "s" / "profile"}"']
    profiled = dict(tool.steps(tmp_path / "out", "x", tmp_path / "s", pytest=False, cprofile=True))["train_cprofile"]
    assert profiled[1:5] == ["-m", "cProfile", "-o", str(tmp_path / "out" / "train_cprofile_x.prof")]
    assert profiled[5:9] == ["-m", "fox_numba", "train", "--set"]
    assert tool.cache_for("train_prewarmed", tmp_path) == tool.cache_for("cache_warm", tmp_path) != tool.cache_for(
        "train_cold", tmp_path) == tool.cache_for("bench_runs", tmp_path)


def write_run(parent, loss: float, kill: float) -> None:
    fold = parent / "20261207-000000" / "fold_00"
    fold.mkdir(parents=True)
    record = np.zeros(1, dtype=[("loss", "<f4"), ("kill_q_median", "<f4"), ("epoch", "<u4")])
    record["loss"], record["kill_q_median"], record["epoch"] = loss, kill, 1
    with h5py.File(fold / "last.h5", "w") as f:
        f["arrays/params"] = np.arange(5, dtype=np.float32) * 0.5
        f["arrays/health.record"] = record


def test_checkpoints_compare_with_nan_fields_equal(tool, tmp_path):
    for name, loss, kill in (("a", 2.5, np.nan), ("b", 2.5, np.nan), ("c", 2.25, np.nan), ("d", 2.5, 1.0)):
        write_run(tmp_path / name, loss, kill)
    runs = {n: tool.checkpoint_arrays(tmp_path / n) for n in "abcd"}
    assert list(runs["a"]) == ["fold_00/last.h5"]
    assert tool.same_arrays(runs["a"], runs["b"])
    assert not tool.same_arrays(runs["a"], runs["c"]) and not tool.same_arrays(runs["a"], runs["d"])
    assert not tool.same_arrays({}, {})  # no checkpoints: nothing shown equal


def test_main_records_every_step_and_fails_on_one(tool, tmp_path, monkeypatch):
    fake = [("ok", [sys.executable, "-c", "print('fine')"]), ("bad", [sys.executable, "-c", "raise SystemExit(3)"])]
    monkeypatch.setattr(tool, "steps", lambda out, suffix, scratch, pytest, warm, cprofile: fake)
    out = tmp_path / "out"
    assert tool.main(["--out", str(out), "--suffix", "t", "--scratch", str(tmp_path / "s")]) == 1
    record = json.loads((out / "speed_set_t.json").read_text())
    assert record["steps"]["ok"]["returncode"] == 0 and record["steps"]["bad"]["returncode"] == 3
    assert record["steps"]["ok"]["peak_rss_kib"] > 0 and record["checkpoints_equal"] is False
    assert record["run_folder_bytes"] == {"cold": 0, "warm": 0}  # the fake steps wrote no run folder
    assert (out / "ok_t.txt").read_text() == "fine\n"


def test_folder_sizes_and_the_profile_table(tool, tmp_path):
    (tmp_path / "run" / "fold_00").mkdir(parents=True)
    (tmp_path / "run" / "a.txt").write_bytes(b"x" * 7)
    (tmp_path / "run" / "fold_00" / "last.h5").write_bytes(b"y" * 1000)
    assert tool.folder_bytes(tmp_path / "run") == 1007 and tool.folder_bytes(tmp_path / "none") == 0
    def busy():
        return sum(i * i for i in range(20000))

    cProfile.runctx("busy()", {"busy": busy}, {}, str(tmp_path / "p.prof"))
    text = tool.profile_top(tmp_path / "p.prof")
    assert text.count("Ordered by: cumulative time") == 1 and text.count("Ordered by: internal time") == 1
    assert "busy" in text


def test_skipped_steps_leave_the_plan_and_an_unknown_one_is_refused(tool, tmp_path, capsys):
    base = ["--out", str(tmp_path / "o"), "--suffix", "x", "--scratch", str(tmp_path / "s"), "--warm", "--dry-run"]
    assert tool.main([*base, "--skip", "bench_runs", "profile"]) == 0
    names = [line.split(":", 1)[0] for line in capsys.readouterr().out.splitlines()]
    assert names == ["train_cold", "train_warm", "bench_learner_mirror", "bench_learner_trunk", "bench_learner_shared",
                     "bench_collect", "cache_warm", "train_prewarmed"]
    with pytest.raises(SystemExit) as refused:
        tool.main([*base, "--skip", "bench_run"])
    assert refused.value.code == 2 and "no step named bench_run" in capsys.readouterr().err
