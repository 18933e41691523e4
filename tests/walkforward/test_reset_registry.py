"""The StateResetRegistry on a small trainer made the way the real one will be: every stateful field of every
component is a registry entry or declared not-state, and the fold reset does exactly the issue's resets.

The fake learner holds its parameters, target and Adam moments on the device (kernels of device/ and
kernels/optim.py do the resets), host counters beside them, the ISV bus its entries from the slot table,
and the kill criteria their own windows and counters.
"""

import json

import numpy as np
import pytest

from fox_numba.device.elementwise import axpy_f32, scale_f32
from fox_numba.device.isv import SLOTS, Isv, IsvBus, bootstrap_values
from fox_numba.device.launch import i32, launch_strided
from fox_numba.device.memory import copy_device
from fox_numba.errors import LayoutMismatchError
from fox_numba.kernels.optim import ADAM_SHRINK_M, ADAM_SHRINK_V, shrink_adam_moments
from fox_numba.walkforward.kill import KillCriteria
from fox_numba.walkforward.reset_registry import (
    REQUIRED_FOLD_RESETS,
    FoldReset,
    PerRun,
    ResetContext,
    StateResetRegistry,
    format_resets,
    register_isv,
)

N = 64
SHRINK = np.float32(0.8)


def fresh_params(seed):
    return np.random.default_rng(seed).standard_normal(N).astype(np.float32)


class FakeLearner:
    """Device params / target / Adam moments, host counters and an adaptive-tau state."""

    NOT_STATE = ("stager", "n")

    def __init__(self, stager, seed):
        self.stager, self.n = stager, N
        rng = np.random.default_rng(seed)
        self.params = stager.upload_new(fresh_params(seed))
        self.target = stager.upload_new(fresh_params(seed))
        self.m = stager.upload_new(rng.standard_normal(N).astype(np.float32))
        self.v = stager.upload_new(rng.uniform(0.1, 1.0, N).astype(np.float32))
        self.adam_step = 0
        self.fold_step = 0
        self.global_step = 0
        self.adaptive_tau = 1.0

    def shrink_perturb(self, ctx):
        """theta = 0.8 theta + 0.2 theta_fresh, theta_fresh drawn with the entry's seed."""
        fresh = self.stager.upload_new(fresh_params(ctx.seed_for("learner.params")))
        launch_strided(scale_f32, N, self.params, SHRINK, i32(N), stream=ctx.stream)
        launch_strided(axpy_f32, N, self.params, np.float32(1.0) - SHRINK, fresh, i32(N), stream=ctx.stream)

    def register_state(self, registry):
        r = registry.owner(self, "learner")
        r.action("adam_moments", FoldReset, "Adam m *= 0.1, v *= 0.01", fields=("m", "v"),
                 action=lambda ctx: shrink_adam_moments(self.m, self.v, stream=ctx.stream))
        r.field("adam_step", FoldReset, 0, "Adam step counter (bias correction restarts)")
        r.action("params", FoldReset, "theta = 0.8 theta + 0.2 theta_fresh (seeded)", fields=("params",),
                 action=self.shrink_perturb)
        r.action("target", FoldReset, "target re-synced to theta", fields=("target",),
                 action=lambda ctx: copy_device(self.target, self.params, stream=ctx.stream))
        r.field("fold_step", FoldReset, 0, "per-fold step counter (warm-up gates apply again)")
        r.field("adaptive_tau", FoldReset, 1.0, "adaptive-tau modulation state")
        r.per_run("global_step", "gradient steps of the whole run")


class FakeCollector:
    NOT_STATE = ()

    def __init__(self):
        self.replay_size = 17
        self.episodes = 3

    def register_state(self, registry):
        r = registry.owner(self, "collector")
        r.field("replay_size", FoldReset, 0, "the replay buffer is emptied", name="replay")
        r.per_run("episodes", "episodes completed in the run")


@pytest.fixture()
def trainer(stager):
    learner, collector, kill, bus = FakeLearner(stager, 5), FakeCollector(), KillCriteria(), IsvBus(stager)
    registry = StateResetRegistry()
    learner.register_state(registry)
    collector.register_state(registry)
    kill.register_state(registry)
    register_isv(registry, bus)
    return registry, (learner, collector, *kill.components(), bus), learner, collector, kill, bus


def test_every_stateful_field_is_in_the_registry_or_declared(trainer):
    registry, components, *_ = trainer
    assert registry.audit(*components) == []
    assert registry.require(REQUIRED_FOLD_RESETS) == []


def test_a_new_field_cannot_be_forgotten(trainer):
    registry, components, learner, *_ = trainer
    learner.prev_q_mean = 0.3  # a new piece of state, added without its entry
    FakeLearner.NOT_STATE = ("stager", "n", "gone")
    try:
        assert registry.audit(*components) == [
            "FakeLearner.prev_q_mean: neither a registry entry nor declared in FakeLearner.NOT_STATE",
            "FakeLearner.gone: declared not-state but not an attribute (stale NOT_STATE)",
        ]
    finally:
        FakeLearner.NOT_STATE = ("stager", "n")
    assert StateResetRegistry().require(["learner.params", "isv.Q_DRIFT_RATE"]) == [
        "learner.params", "isv.Q_DRIFT_RATE"]


def test_fold_reset_does_every_reset_in_order_and_logs_it(trainer, stager, stream):
    registry, _, learner, collector, kill, bus = trainer
    before = {name: stager.download(getattr(learner, name)).astype(np.float64) for name in ("params", "m", "v")}
    isv0 = np.random.default_rng(3).uniform(0.5, 2.0, bootstrap_values().size).astype(np.float32)
    stager.upload(isv0, bus.values)
    learner.adam_step, learner.fold_step, learner.global_step, learner.adaptive_tau = 900, 1000, 5000, 0.3
    kill.criteria[1].window, kill.criteria[2].count = (0.1, 0.2), 4
    lines = []

    records = registry.reset(FoldReset, ResetContext(fold=2, seed=11, stream=stream), log=lines.append)

    names = [r.name for r in records]
    assert names == registry.names(FoldReset)
    assert names[:6] == ["learner.adam_moments", "learner.adam_step", "learner.params", "learner.target",
                         "learner.fold_step", "learner.adaptive_tau"]
    assert lines == [format_resets(records, 2)] and lines[0].startswith(f"fold 2 reset ({len(records)} entries): ")
    assert "learner.adam_moments: Adam m *= 0.1, v *= 0.01" in lines[0] and "isv.Q_DRIFT_RATE: ISV[Q_DRIFT_RATE] = 0" in lines[0]
    # Adam moments shrunk (float32 products, exact), params shrunk and perturbed, target re-synced after
    np.testing.assert_array_equal(stager.download(learner.m), (before["m"] * np.float64(ADAM_SHRINK_M)).astype(np.float32))
    np.testing.assert_array_equal(stager.download(learner.v), (before["v"] * np.float64(ADAM_SHRINK_V)).astype(np.float32))
    fresh = fresh_params(ResetContext(fold=2, seed=11).seed_for("learner.params")).astype(np.float64)
    expected = before["params"] * 0.8 + 0.2 * fresh
    params = stager.download(learner.params)
    np.testing.assert_allclose(params, expected, rtol=0, atol=4 * float(np.spacing(np.float32(np.abs(expected).max()))))  # float32 ops
    np.testing.assert_array_equal(stager.download(learner.target), params)
    # host fields: FoldReset set back, PerRun kept
    assert (learner.adam_step, learner.fold_step, learner.adaptive_tau, learner.global_step) == (0, 0, 1.0, 5000)
    assert (collector.replay_size, collector.episodes) == (0, 3)
    assert kill.criteria[1].window == () and kill.criteria[2].count == 0
    # every ISV slot with a fold-reset value written, every other slot carried over
    got = bus.read()
    for s in SLOTS:
        assert got[s.index] == (isv0[s.index] if s.fold_reset is None else np.float32(s.fold_reset)), s.name


def test_isv_entries_come_from_the_slot_table(trainer):
    registry, *_ , bus = trainer
    fold = {f"isv.{s.name}": s.fold_reset for s in SLOTS if s.fold_reset is not None}
    carried = {f"isv.{s.name}" for s in SLOTS if s.fold_reset is None and not s.reserved}
    isv_names = [n for n in registry.names() if n.startswith("isv.")]
    assert {n for n in isv_names if registry[n].scope is FoldReset} == set(fold)
    assert {n for n in isv_names if registry[n].scope is PerRun} == carried
    assert all(registry[n].value == v for n, v in fold.items())
    for name in ("isv.Q_DRIFT_RATE", "isv.FOLD_WARMUP_FACTOR", "isv.GRAD_NORM_FAST_EMA", "isv.Q_EPOCH_MEAN_PREV"):
        assert registry[name].scope is FoldReset and registry[name].value == 0.0
    assert registry["isv.GRAD_NORM_SLOW_EMA"].scope is PerRun  # the slow EMA persists


def test_the_isv_batch_is_one_launch(trainer, stream, monkeypatch):
    registry, *_, bus = trainer
    calls = []
    monkeypatch.setattr(bus, "fold_reset", lambda s: calls.append(s))
    registry.reset(FoldReset, ResetContext(fold=1, stream=stream))
    assert calls == [stream]


def test_host_state_round_trips_through_json(trainer):
    registry, _, learner, collector, kill, _ = trainer
    learner.adam_step, learner.global_step, learner.adaptive_tau = 7, 70, 0.123456789012345
    kill.criteria[1].window = (0.1, -0.2, 1 / 3)
    state = json.loads(json.dumps(registry.host_state()))
    assert set(state) == {e.name for e in registry.entries if e.kind == "field"}
    learner.adam_step, learner.global_step, learner.adaptive_tau = 0, 0, 0.0
    kill.criteria[1].window = ()
    registry.load_host_state(state)
    assert (learner.adam_step, learner.global_step, learner.adaptive_tau) == (7, 70, 0.123456789012345)
    assert kill.criteria[1].window == (0.1, -0.2, 1 / 3)
    with pytest.raises(LayoutMismatchError, match=r"missing \['learner.adam_step'\], unknown \['learner.extra'\]"):
        registry.load_host_state({**{k: v for k, v in state.items() if k != "learner.adam_step"}, "learner.extra": 1})


def test_registration_mistakes_are_refused(trainer):
    registry, _, learner, *_ = trainer
    r = registry.owner(learner, "learner")
    with pytest.raises(ValueError, match="registered twice"):
        r.field("adam_step", FoldReset, 0, "again")
    with pytest.raises(ValueError, match="has no attribute"):
        r.field("adam_stpe", FoldReset, 0, "typo")
    with pytest.raises(ValueError, match="use per_run"):
        r.field("x", PerRun, 0, "per-run with a reset value")
    with pytest.raises(ValueError, match="only FoldReset"):
        registry.reset(PerRun)


def test_seeds_depend_on_run_seed_fold_and_name_only():
    a = ResetContext(fold=1, seed=3)
    assert a.seed_for("learner.params") == ResetContext(fold=1, seed=3, stream="s").seed_for("learner.params")
    others = {ResetContext(fold=2, seed=3).seed_for("learner.params"), ResetContext(fold=1, seed=4).seed_for(
        "learner.params"), a.seed_for("collector.rng")}
    assert a.seed_for("learner.params") not in others and len(others) == 3
    assert 0 <= a.seed_for("x") < 2**63


def test_bootstrap_values_untouched_by_registration(stager):
    bus = IsvBus(stager)
    register_isv(StateResetRegistry(), bus)
    np.testing.assert_array_equal(bus.read(), bootstrap_values())
    assert Isv.FOLD_WARMUP_FACTOR.name == "FOLD_WARMUP_FACTOR"
