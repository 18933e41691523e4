"""Prioritised replay in the learner's step (learner.priority_alpha): a real step against the float64 reference
step with proportional draws and importance-weighted rows, the priorities it writes, the step's kernels, seed
determinism, the off switch (alpha = 0) bit for bit, and the replay's put / clear of priorities.

The reference draws with a cumulative-sum search (an independent reference of the device's tree walk, same
stratified uniforms); tolerances as tests/agent/test_learner.py's reference step, priorities 1e-4 relative (one
float64 power of a float32 cross-entropy against the float64 one).
"""

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import reference
from plain_learner import PLAIN_OVERRIDES
from real_trainer import SMALL, real_trainer
from test_learner import (
    M,
    build,
    host_state,
    perturbed_start,
    random_replay,
    step_reference64,
    steady_isv,
    tiny_config,
)

from fox_numba.agent.replay import ReplayBuffer
from fox_numba.device.isv import Isv
from fox_numba.kernels.priority import PRIORITY_START
from fox_numba.walkforward.reset_registry import FoldReset, ResetContext
from fox_numba.walkforward.trainer_state import audit_trainer

ALPHA, BETA0, EPS = 0.6, 0.3, 0.01
TOOL = Path(__file__).resolve().parents[2] / "tools" / "bench_learner.py"


def prio_config(**learner):
    return tiny_config(weight_decay=0.01, branch_weights=[1.0, 0.5, 2.0, 0.25], tau=0.05, gamma=0.9, **learner)


def ring_priorities(rng, replay):
    """Seeded priorities of the ring's written slots (slot 2 heavy, so a batch draws it more than once), 0 beyond."""
    leaves = np.zeros(replay["row"].shape[0])
    size = int(replay["meta"][1])
    leaves[:size] = rng.uniform(0.2, 2.0, size)
    leaves[2] = 6.0
    return leaves


def proportional64(leaves, cfg):
    """The reference draw: stratified x_j = (j + U_j) * total / B searched in the cumulative priorities, and the
    importance weights (p_min / p_j)**beta with beta annealed on the schedule's float32 clock."""
    lc = cfg.learner

    def sample(states, step):
        b = lc.batch_size
        u = np.array([(reference.xoroshiro_next64(states, j) >> 32) * 2.0**-32 for j in range(b)])
        cum = np.cumsum(leaves)
        idx = np.searchsorted(cum, (np.arange(b) + u) * cum[-1] / b, side="right")
        progress = min(np.float32(step - 1) / np.float32(lc.epochs * lc.steps_per_epoch), np.float32(1.0))
        beta = np.float32(lc.priority_beta0) + (np.float32(1.0) - np.float32(lc.priority_beta0)) * progress
        p = leaves[idx]
        return idx, (p.min() / p) ** np.float64(beta)

    return sample


def assert_step_matches(got, got_isv, ref, ref_isv):
    """test_learner.py's tolerances for a whole step."""
    rec = got["optim_state"][0]
    assert (rec["step"], rec["adam_t"]) == (ref["step"], ref["adam_t"])
    for name in ("params", "target_params"):
        tol = 2 * np.spacing(np.abs(got[name])).astype(np.float64) + 1e-4 * ref["lr"]
        assert np.all(np.abs(got[name] - ref[name]) <= tol), name
    for name in ("adam_m", "adam_v"):
        np.testing.assert_allclose(got[name], ref[name], rtol=1e-4, atol=1e-5 * np.abs(ref[name]).max())
    for slot, want in ref_isv.items():
        assert got_isv[slot] == pytest.approx(want, rel=1e-4, abs=1e-6), Isv(slot).name
    assert got_isv[Isv.NONFINITE_STEPS] == 0


def test_a_prioritised_step_equals_a_float64_step(stream, stager, rng):
    cfg = prio_config(priority_alpha=ALPHA, priority_beta0=BETA0, priority_eps=EPS)
    replay, market = random_replay(rng), rng.standard_normal((12, M)).astype(np.float32)
    isv0 = steady_isv(rng)
    learner, isv = build(stager, stream, cfg, replay, market, isv0)
    perturbed_start(learner, rng, stager)  # schedule step 4 of 12: beta = 0.3 + 0.7 * 4 / 12
    leaves, max0 = ring_priorities(rng, replay), 6.5
    prio = learner.replay.priorities
    prio.upload(leaves, max0, stager)
    start = host_state(learner)
    assert {"priority_tree", "priority_max"} <= set(start)  # checkpointed with the learner, as the ring is
    learner.step()
    got, got_isv = host_state(learner), stager.download(isv)
    ref, ref_isv = step_reference64(cfg, learner.layout, start, replay, market, isv0.astype(np.float64),
                                    sample=proportional64(leaves, cfg))
    idx = stager.download(learner.batch.idx)
    np.testing.assert_array_equal(idx, ref["idx"])
    assert (idx == 2).sum() >= 2  # a slot drawn twice: its new priority is the larger of the two
    is_w = stager.download(learner.is_weights)
    _, want_w = proportional64(leaves, cfg)(start["rng_states"].copy(), ref["step"])
    np.testing.assert_allclose(is_w, want_w, rtol=1e-6)
    assert is_w.min() < 0.5 and is_w.max() == 1.0  # the weights change the loss
    assert_step_matches(got, got_isv, ref, ref_isv)
    # the drawn slots' new priorities from their direction rows' cross-entropy; the others keep theirs
    want = leaves.copy()
    new = (np.maximum(ref["row_loss"][0::4], 0.0) + np.float32(EPS)) ** np.float32(ALPHA)
    for s in set(idx):
        want[s] = new[idx == s].max()
    got_leaves, got_max = prio.download(stager)
    np.testing.assert_allclose(got_leaves, want, rtol=1e-4)
    assert got_max == pytest.approx(max(max0, new.max()), rel=1e-4)


def _names(learner):
    return [r.kernel.rsplit(".", 2)[-2] + "." + r.kernel.rsplit(".", 1)[1] for r in learner.graph.launches]


def test_the_prioritised_step_kernels_and_seed_determinism(stream, stager, rng):
    """Two learners of one seed run two steps to the same bits (slots drawn twice, atomic maxima included)."""
    cfg = prio_config(priority_alpha=ALPHA, priority_beta0=BETA0, priority_eps=EPS)
    replay, market = random_replay(rng), rng.standard_normal((12, M)).astype(np.float32)
    leaves, isv0 = ring_priorities(rng, replay), steady_isv(rng)
    runs = []
    for _ in range(2):
        learner, isv = build(stager, stream, cfg, replay, market, isv0, seed=3)
        learner.replay.priorities.upload(leaves, 6.5, stager)
        for _ in range(2):
            learner.step()
        runs.append((host_state(learner), stager.download(isv), learner))
    (a, isv_a, lrn), (b, isv_b, _) = runs
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    np.testing.assert_array_equal(isv_a, isv_b)
    names = _names(lrn)
    assert "replay.replay_sample_kernel" not in names
    assert names.count("priority.sum_tree_level_kernel") == 5  # a 20-slot ring: 32 leaves, 5 levels
    order = ["learner.step_schedule", "priority.sum_tree_level_kernel", "priority.priority_sample_kernel",
             "replay.replay_gather_kernel", "learner.select_q_rows", "priority.importance_weights_kernel",
             "learner.project_loss_scatter", "priority.priority_zero_kernel",
             "priority.priority_set_kernel", "signals.loss_partials", "optim.adam_step"]
    positions = [names.index(k) for k in order]
    assert positions == sorted(positions)


def test_alpha_zero_is_the_uniform_step_bit_for_bit(stream, stager, rng):
    """priority_alpha = 0 with the other priority fields changed: the uniform step's kernels, the float64
    reference step's numbers, and the default configuration's bits."""
    replay, market = random_replay(rng), rng.standard_normal((12, M)).astype(np.float32)
    isv0 = steady_isv(rng)
    runs = []
    for cfg in (prio_config(), prio_config(priority_beta0=0.9, priority_eps=0.5)):
        learner, isv = build(stager, stream, cfg, replay, market, isv0)
        start = perturbed_start(learner, np.random.default_rng(5), stager)
        learner.step()
        runs.append((cfg, learner, start, host_state(learner), stager.download(isv)))
    (_, lrn_a, _, a, isv_a), (cfg, lrn_b, start, b, isv_b) = runs
    assert lrn_b.replay.priorities is None and lrn_b.is_weights is None
    assert _names(lrn_a) == _names(lrn_b) and not any(n.startswith("priority.") for n in _names(lrn_b))
    assert set(a) == set(b) and "priority_tree" not in b
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    np.testing.assert_array_equal(isv_a, isv_b)
    ref, ref_isv = step_reference64(cfg, lrn_b.layout, start, replay, market, isv0.astype(np.float64))
    assert_step_matches(b, isv_b, ref, ref_isv)


@pytest.mark.parametrize("field, value", [("priority_alpha", -0.1), ("priority_beta0", 1.5), ("priority_eps", 0.0)])
def test_out_of_range_priority_fields_are_refused(stream, stager, rng, field, value):
    cfg = prio_config(**{field: value})
    with pytest.raises(ValueError, match="prioritised replay"):
        build(stager, stream, cfg, random_replay(rng), rng.standard_normal((12, M)).astype(np.float32),
              steady_isv(rng))


def test_new_transitions_get_the_max_priority_and_clear_empties(stream, stager, rng):
    """The collector's put_obs gives its slots the running max (wrapping the ring); the fold reset's clear
    zeroes every priority and restarts the max; a second prioritise returns the same priorities."""
    ring = ReplayBuffer(8, stream=stream, n_port=2)
    prio = ring.prioritise(stream=stream)
    assert ring.prioritise(stream=stream) is prio
    leaves = rng.uniform(0.1, 1.0, 8)
    prio.upload(leaves, 3.5, stager)
    stager.upload(np.array([6, 8], np.int32), ring.meta)
    n = 3
    ring.put_obs(stager.upload_new(np.arange(n, dtype=np.int32)), stager.upload_new(np.ones((n, 2), np.float32)),
                 stager.upload_new(np.zeros((n, 4), np.int32)), stager.upload_new(np.zeros(n)), stream=stream)
    got, top = prio.download(stager)
    want = leaves.copy()
    want[[6, 7, 0]] = 3.5
    np.testing.assert_array_equal(got, want)
    assert top == 3.5
    ring.clear(stream=stream)
    got, top = prio.download(stager)
    np.testing.assert_array_equal(got, 0.0)
    assert top == PRIORITY_START and ring.read_meta(stager) == (0, 0)


def test_the_learner_benchmark_builds_a_prioritised_step(stream, stager):
    """tools/bench_learner.py --priority-alpha: its learner samples by priority and takes finite steps (the
    whole --tiny run is tests/agent/test_bench_learner.py's; the GPU timings come from a GPU run)."""
    spec = importlib.util.spec_from_file_location("bench_learner", TOOL)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    args = bench.build_parser().parse_args(["--out", "unused", "--tiny", "--steps", "2", "--capacity", "64", "--bars",
                                            "16", "--obs-dim", "10", "--priority-alpha", "0.5"])
    args.batch = 8
    learner, _ = bench.make_learner(args, stager, stream, graphs=False)
    learner.train_epoch(2)
    stats = learner.epoch_stats()
    assert stats["skipped_steps"] == 0 and np.isfinite(stats["loss"])
    assert "priority.priority_sample_kernel" in _names(learner)


def test_a_prioritised_trainer_collects_trains_and_resets(half_hour_store):
    """The real trainer with priority_alpha > 0: the collect gives every new slot the running max, a training
    epoch moves the drawn slots' priorities and the max, every attribute is a registry entry or wiring, a
    checkpoint's arrays hold the priorities, and the fold boundary clears them with the ring."""
    rt = real_trainer(half_hour_store, [*SMALL, "learner.priority_alpha=0.5", *PLAIN_OVERRIDES])
    cfg, trainer, kills, best, registry = rt.cfg, rt.trainer, rt.kills, rt.best, rt.registry
    assert audit_trainer(registry, trainer, kills, best) == []
    registry.reset(FoldReset, ResetContext(fold=0, seed=cfg.run.seed, stream=trainer.stream))
    prio = trainer.replay.priorities
    trainer.collect()
    leaves, top = prio.download(trainer.stager)
    np.testing.assert_array_equal(leaves[:24], PRIORITY_START)  # 4 environments x 6 steps, all new
    np.testing.assert_array_equal(leaves[24:], 0.0)
    assert top == PRIORITY_START
    trainer.train(lambda: None)
    leaves, top = prio.download(trainer.stager)
    assert (leaves[:24] != PRIORITY_START).any() and top > PRIORITY_START and (leaves[:24] > 0).all()
    assert {"learner.priority_tree", "learner.priority_max"} <= set(trainer.device_state())
    registry.reset(FoldReset, ResetContext(fold=1, seed=cfg.run.seed, stream=trainer.stream))  # the next boundary
    leaves, top = prio.download(trainer.stager)
    np.testing.assert_array_equal(leaves, 0.0)
    assert top == PRIORITY_START and trainer.replay.read_meta(trainer.stager) == (0, 0)
