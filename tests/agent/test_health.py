"""HEALTH_DIAG through the trainer: the kernels' fields agree with numpy on the same buffers, and filling a
snapshot (collect, validation pass, snapshot, line) copies no per-sample buffer to the host (only the mapped
record is read)."""

import numpy as np
import pytest

from fox_numba.actions import BRANCHES, LONG, SHORT
from fox_numba.agent.fold_market import FoldMarket
from fox_numba.agent.trainer import Trainer
from fox_numba.config import load_config
from fox_numba.device.isv import Isv
from fox_numba.device.staging import Stager
from fox_numba.diag.layout import FIELDS, parse_line
from fox_numba.kernels.optim import LR_FLOOR
from fox_numba.market.select import select_market
from fox_numba.walkforward.driver import load_features
from fox_numba.walkforward.folds import make_folds


@pytest.fixture(scope="module")
def trained(half_hour_store):
    """A smoke trainer after one collect phase and 4 gradient steps (a snapshot every 2), on four synthetic days
    of half an hour (a validation pass of 29 steps, not 389); the smoke preset's 16 environments, with a smaller
    network, atom count and batch (the fields reduce the same buffers at any width)."""
    cfg = load_config("smoke", overrides=[f'market.store="{half_hour_store}"', "env.collect_steps=4",
                                        "learner.steps_per_epoch=4", "network.hidden=8", "network.n_atoms=5",
                                        "learner.batch_size=8"])
    selection = select_market(cfg.market)
    fold = make_folds(cfg.folds, selection.days)[0]
    trainer = Trainer(cfg)
    trainer.bind_fold(FoldMarket.build(load_features(cfg, selection), fold, cfg.features, cfg.env), 0)
    rollout = trainer.collect()
    lines = []
    trainer.train(lambda: lines.append(trainer.health.line(fold=0, epoch=0)))
    return trainer, rollout, lines


def test_a_snapshot_per_diag_interval(trained):
    _, _, lines = trained
    assert [parse_line(ln)["step"] for ln in lines] == [2, 4]


def test_fields_agree_with_numpy_on_the_same_buffers(trained):
    trainer, rollout, lines = trained
    rec = parse_line(lines[-1])
    isv = trainer.bus.read()
    for f in FIELDS:
        if f.isv is not None:
            assert rec[f.name] == float(np.float32(isv[Isv[f.isv]])), f.name
    state = trainer.learner.read_optim_state()
    assert rec["step"] == int(state["step"])
    assert rec["grad_norm_clipped"] == float(np.float32(min(isv[Isv.GRAD_NORM_RAW], isv[Isv.CLIP_EFF])))
    lr = np.float32(state["lr"]) * max(LR_FLOOR, np.float32(isv[Isv.FOLD_WARMUP_FACTOR]))
    assert rec["lr_eff"] == pytest.approx(float(lr), rel=1e-6)
    assert rec["tau_eff"] == float(np.float32(state["tau"]))
    assert rec["limit_fill_rate"] == pytest.approx(rollout["fill_rate"], rel=1e-6)
    actions = trainer.stager.download(trainer.collector.actions)
    reward = trainer.stager.download(trainer.env.reward).astype(np.float64)
    for k, br in enumerate(BRANCHES):
        counts = np.bincount(actions[:, k], minlength=br.size)
        for b, count in zip(br.bins, counts, strict=True):
            assert rec[f"train_{br.name[:3]}_{b.name.lower()}"] == count
    for m, name in enumerate(("quarter", "half", "full")):
        sel = np.isin(actions[:, 0], (SHORT, LONG)) & (actions[:, 1] == m)
        r = reward[sel]
        win = (r > 0).mean() if r.size else 0.0
        var = r.var() if r.size > 1 else 0.0
        assert rec[f"mag_win_{name}"] == pytest.approx(win, abs=1e-7)
        assert rec[f"mag_pnl_var_{name}"] == pytest.approx(var, rel=1e-5, abs=1e-9)


def test_health_diag_copies_no_per_sample_buffer_to_the_host(trained, monkeypatch):
    """A collect phase (collect_step), a validation pass (eval_step, eval_done), a snapshot and its line: the
    kernels reduce into the mapped record, and the only device-to-host copies are the validation pass's
    per-day PnL and position records, downloaded once at its end for the metrics (agent/evaluator.py).
    The environment metrics are a mapped record too. Last in the module: it runs the trainer on."""
    trainer, _, _ = trained
    ev = trainer.evaluator
    allowed = {id(ev.pnl): "evaluator.pnl", id(ev.pos): "evaluator.pos"}
    downloaded = []
    download = Stager.download

    def checked_download(self, src, *args, **kwargs):
        assert id(src) in allowed, f"a device buffer {src.shape} {src.dtype} was downloaded"
        downloaded.append(allowed[id(src)])
        return download(self, src, *args, **kwargs)

    def refuse(*args, **kwargs):
        raise AssertionError("a device buffer was copied to the host outside the Stager")

    monkeypatch.setattr(Stager, "download", checked_download)
    from numba import cuda

    monkeypatch.setattr(type(cuda.device_array(1)), "copy_to_host", refuse)
    trainer.collect()
    trainer.evaluate()
    trainer.health.snapshot(trainer.bus.values, trainer.learner.optim_state, trainer.env.metrics.device,
                            use_graph=False)
    rec = parse_line(trainer.health.line(fold=0, epoch=1))
    assert downloaded == ["evaluator.pnl", "evaluator.pos"]
    dirs = [b.name.lower() for b in BRANCHES[0].bins]
    assert sum(rec[f"train_dir_{d}"] for d in dirs) == trainer.env.n  # the new collect step's actions
    assert sum(rec[f"eval_dir_{d}"] for d in dirs) == ev.steps * ev.env.n  # every step of every day
    assert rec["step"] == 4 and rec["epoch"] == 1
