"""TensorBoard events of a run: every number of a metrics line and of a HEALTH_DIAG line becomes a scalar with
its fold's tag and its x (the epoch, the fold's gradient step), read back from the event file as TensorBoard
reads it (TFRecord framing, Event protos); a rebuilt folder holds exactly the kept records."""

import importlib.util
import json
import os
import struct

import numpy as np
import pytest

from fox_numba.config import load_config
from fox_numba.errors import ConfigError
from fox_numba.diag.layout import SNAPSHOT_DTYPE, format_line
from fox_numba.market.select import select_market
from fox_numba.walkforward.driver import train_run
from fox_numba.walkforward.tensorboard import EVENTS_DIR, EventLog, epoch_scalars

if importlib.util.find_spec("tensorboardX") is None:
    if os.environ.get("CI"):  # the README's test command installs the extra: under CI its absence is a failure
        pytest.fail("tensorboardX is not installed under CI", pytrace=False)
    pytest.skip("the optional extra is not installed: pip install -e '.[tensorboard]'", allow_module_level=True)
from tensorboardX.proto import event_pb2  # noqa: E402


def read_scalars(folder):
    """{(tag, step): value} of every event file in `folder` (8-byte length, 4-byte crc, data, 4-byte crc)."""
    out = {}
    for path in sorted(folder.iterdir()):
        data = path.read_bytes()
        pos = 0
        while pos < len(data):
            (n,) = struct.unpack("<Q", data[pos : pos + 8])
            event = event_pb2.Event.FromString(data[pos + 12 : pos + 12 + n])
            pos += 16 + n
            for v in event.summary.value:
                out[(v.tag, event.step)] = v.simple_value
    return out


def metrics_line(fold, epoch, sharpe):
    return {"fold": fold, "epoch": epoch, "best": True, "kill": None,
            "val": {"sharpe_daily": sharpe, "trades": 12, "sortino": None},
            "baselines": {"probe": {"sharpe_daily": 1.5, "trades": 3}, "oracle_sharpe": 9.0},
            "train": {"loss": 2.0 + epoch, "q_mean": -0.25}}


def health_line(fold, epoch, step, rng):
    rec = np.zeros(1, SNAPSHOT_DTYPE)
    for name in SNAPSHOT_DTYPE.names:
        rec[name] = rng.uniform(0.1, 2.0) if SNAPSHOT_DTYPE[name].kind == "f" else rng.integers(1, 50)
    rec["fold"], rec["epoch"], rec["step"] = fold, epoch, step
    return format_line(rec[0])


def test_a_metrics_line_becomes_its_tags():
    tags = dict(epoch_scalars(metrics_line(1, 3, 0.75)))
    assert tags == {"fold_01/val/sharpe_daily": 0.75, "fold_01/val/trades": 12.0,
                    "fold_01/baselines/probe/sharpe_daily": 1.5, "fold_01/baselines/oracle_sharpe": 9.0,
                    "fold_01/train/loss": 5.0, "fold_01/train/q_mean": -0.25}


def test_events_hold_every_record_and_a_rebuild_only_the_kept_ones(tmp_path, rng):
    health = [health_line(0, 0, 50, rng), health_line(0, 1, 100, rng)]
    log = EventLog(tmp_path)
    for epoch, sharpe in enumerate((0.5, -1.25)):
        log.epoch(metrics_line(0, epoch, sharpe))
        log.health(health[epoch])
    log.close()
    got = read_scalars(tmp_path / EVENTS_DIR)
    assert got[("fold_00/val/sharpe_daily", 0)] == 0.5 and got[("fold_00/val/sharpe_daily", 1)] == -1.25
    assert got[("fold_00/train/loss", 1)] == 3.0
    fields = [n for n in SNAPSHOT_DTYPE.names if n not in ("fold", "epoch", "step")]
    for line, step in zip(health, (50, 100), strict=True):
        record = dict(part.split("=") for part in line.split()[1:])
        for name in fields:
            assert got[(f"fold_00/health/{name}", step)] == pytest.approx(float(record[name]), rel=1e-6), name
    (tmp_path / "health_diag.log").write_text(health[0] + "\n")
    EventLog.rebuilt(tmp_path, [metrics_line(0, 0, 0.5)], tmp_path / "health_diag.log").close()
    again = read_scalars(tmp_path / EVENTS_DIR)
    assert ("fold_00/val/sharpe_daily", 1) not in again and again[("fold_00/val/sharpe_daily", 0)] == 0.5
    assert ("fold_00/health/" + fields[0], 100) not in again and ("fold_00/health/" + fields[0], 50) in again


def test_a_run_writes_its_records_as_events(half_hour_store, tmp_path):
    """fox train with run.tensorboard = true (in process, the half-hour store, one fold of two epochs): each
    metrics line's validation Sharpe and loss, and each HEALTH_DIAG line's fields, are events at their x."""
    cfg = load_config("smoke", overrides=[
        f"market.store={json.dumps(str(half_hour_store))}", f"run.out_dir={json.dumps(str(tmp_path))}",
        "run.name=tb", "run.tensorboard=true", "folds.n_folds=1", "learner.epochs=2", "learner.steps_per_epoch=2",
        "env.collect_steps=2", "env.n_envs=4", "network.hidden=8", "network.n_atoms=5", "learner.batch_size=4",
        "learner.buffer_size=64"])
    run_dir, _ = train_run(cfg, select_market(cfg.market), log=lambda line: None)
    got = read_scalars(run_dir / EVENTS_DIR)
    for line in (json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()):
        assert got[("fold_00/val/sharpe_bar", line["epoch"])] == pytest.approx(line["val"]["sharpe_bar"], rel=1e-6)
        assert got[("fold_00/train/loss", line["epoch"])] == pytest.approx(line["train"]["loss"], rel=1e-6)
    diag = (run_dir / "health_diag.log").read_text().splitlines()
    assert len(diag) == 2
    for text in diag:
        record = dict(part.split("=") for part in text.split()[1:])
        assert got[("fold_00/health/loss", int(record["step"]))] == pytest.approx(float(record["loss"]), rel=1e-6)


def test_without_the_extra_the_run_is_refused_before_any_work(half_hour_store, tmp_path, monkeypatch):
    """run.tensorboard = true without tensorboardX: one ConfigError naming the extra, and no run folder made."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "tensorboardX" else real(name, *a))
    cfg = load_config("smoke", overrides=[f"market.store={json.dumps(str(half_hour_store))}", "run.name=tb",
                                          f"run.out_dir={json.dumps(str(tmp_path))}", "run.tensorboard=true"])
    with pytest.raises(ConfigError, match=r'pip install -e "\.\[tensorboard\]"'):
        train_run(cfg, select_market(cfg.market), log=lambda line: None)
    assert not (tmp_path / "tb").exists()
