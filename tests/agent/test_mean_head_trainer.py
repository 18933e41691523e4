"""The direction mean head in a real trainer (network.mean_head): collect and evaluation act on its values, the
epoch reports its loss and value gap, and the registry audit finds no unregistered state. The loss kernel and the
learner's step: tests/kernels/test_mean_head_kernels.py, tests/agent/test_mean_head.py."""

import numpy as np
import pytest
import reference
from real_trainer import SMALL, real_trainer

from fox_numba.agent.mean_head import MEAN_B, MEAN_W, mean_head_parity
from fox_numba.device.registry import kernel_name
from fox_numba.kernels.action_select import heads_kernel
from fox_numba.walkforward.reset_registry import FoldReset, ResetContext
from fox_numba.walkforward.trainer_state import audit_trainer


def test_a_mean_head_trainer_collects_trains_and_evaluates_on_the_head_values(half_hour_store):
    """A real trainer with the mean head: the collect step runs the head's dense layer between the forward and
    action selection, training reports loss_mean and mean_gap, the registry audit finds no unregistered state, and
    evaluation's last step chose, in every environment, the direction of the head's largest value with that value's
    gap as conviction (the C51 E[Q] is not read for the direction)."""
    rt = real_trainer(half_hour_store, [*SMALL, "env.collect_steps=2", "learner.steps_per_epoch=1",
                                        "network.mean_head=true"])
    trainer = rt.trainer
    assert audit_trainer(rt.registry, trainer, rt.kills, rt.best) == []
    rt.registry.reset(FoldReset, ResetContext(fold=0, seed=rt.cfg.run.seed, stream=trainer.stream))
    trainer.collect()
    step = [r.kernel.rsplit(".", 1)[1] for r in trainer.collector.graph.launches]
    at = step.index(kernel_name(heads_kernel(rt.cfg.env.fixed_bins)).rsplit(".", 1)[1])
    # dense forwards (the strided kernel under the simulator, tiled GEMMs linear_fwd_* on the GPU): the trunk's
    # layers, the heads, then the mean head's layer, right before action selection
    forwards = step[step.index("gather_obs_kernel") + 1 : at]
    assert all(k == "dense_fwd" or k.startswith("linear_fwd") for k in forwards)
    assert len(forwards) == rt.cfg.network.n_layers + 2
    stats = trainer.train(lambda: None)
    assert np.isfinite(stats["loss_mean"]) and stats["loss_mean"] > 0 and stats["mean_gap"] > 0
    days = trainer.evaluate()[0]
    assert len(days) > 0 and all(np.isfinite(pnl).all() for pnl, _ in days)
    ev = trainer.evaluator
    values = ev.stager.download(ev.mean.values)[:, 0].astype(np.float64)
    actions, conviction = ev.stager.download(ev.actions), ev.stager.download(ev.conviction)
    np.testing.assert_array_equal(actions[:, 0], values.argmax(1))
    top2 = np.sort(values, axis=1)[:, -2:]
    np.testing.assert_allclose(conviction, top2[:, 1] - top2[:, 0], rtol=0, atol=1e-6)


def test_with_mean_cross_the_mean_head_alone_reads_the_crossed_columns(half_hour_store):
    """network.mean_head with network.mean_cross (the linear default): the mean head reads the observation and its
    position x market columns, the C51 heads the observation alone, so its weight has obs_dim + cross rows; the
    second collect step's values are that input times the weights (float64, 1e-5: sums of ~260 float32 products of
    size ~1), and in the learner's last step the head's weight gradient is its crossed s rows times dm (float64,
    2e-5). With position_cross the head reads layer 0's crossed input: tests/agent/test_mean_head.py. The run is
    pinned to fp32: under the tf32 default a GPU's C51 head GEMM rounds its inputs to 10-bit mantissas (the mean
    head's fused kernels are float32 at every precision: kernels/mean_cross.py)."""
    rt = real_trainer(half_hour_store, [*SMALL, "env.collect_steps=2", "learner.steps_per_epoch=1",
                                        "network.mean_head=true", "network.mean_cross=true", "network.n_layers=0",
                                        'run.precision="fp32"'])
    trainer, lay = rt.trainer, rt.trainer.layout
    assert lay.cross > 0 and lay.entry("mean.head.weight").shape == (lay.obs_dim + lay.cross, 4)
    rt.registry.reset(FoldReset, ResetContext(fold=0, seed=rt.cfg.run.seed, stream=trainer.stream))
    trainer.collect()
    col, down = trainer.collector, trainer.evaluator.stager.download
    obs = down(col.obs).astype(np.float64)
    np.testing.assert_array_equal(down(col.net.mean_input(col.env.n)), obs)  # the head forms the crossed columns
    q = obs[:, lay.position_col : lay.position_col + 1]
    x = np.hstack([obs, q * obs[:, : lay.cross]])
    heads = down(col.net.head_input(col.env.n))
    assert heads.shape[1] == lay.obs_dim
    p = lay.unpack(down(trainer.learner.params))
    want = x @ p["mean.head.weight"].astype(np.float64) + p["mean.head.bias"]
    np.testing.assert_allclose(down(col.mean.values)[:, 0], want, rtol=1e-5, atol=1e-5)
    assert np.abs(q).max() > 0  # some environment held a position, so the crossed columns are not all zero
    trainer.train(lambda: None)  # the learner's last step: the mean head's weight gradient from its crossed s rows
    ln = trainer.learner
    x_s = reference.position_cross64(down(ln.obs)[: ln.batch_size], lay.cross, lay.position_col)
    want = x_s.T @ down(ln.mean.dm).astype(np.float64)
    got = lay.unpack(down(ln.grads))["mean.head.weight"]
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * np.abs(want).max())
    assert np.abs(want).max() > 0


def test_with_counterfactual_targets_the_mean_head_trains_every_direction_on_every_draw(four_day_store):
    """network.mean_head with learner.counterfactual (and re-held positions): the step's B rows are each drawn
    transition's four directions, so the mean head's gradient has, in row j, direction j % 4 alone, every row
    weighted (the full-information problem of learner_ablation_h200.md section 27, with the squared error)."""
    rt = real_trainer(four_day_store, [*SMALL, "learner.batch_size=8", "learner.counterfactual=true",
                                       "learner.counterfactual_held=true", "env.fixed_bins=[0, 0, 0]",
                                       "network.mean_head=true"])
    trainer = rt.trainer
    rt.registry.reset(FoldReset, ResetContext(fold=0, seed=rt.cfg.run.seed, stream=trainer.stream))
    trainer.collect()
    stats = trainer.train(lambda: None)
    assert np.isfinite(stats["loss_mean"]) and stats["loss_mean"] > 0
    dm = trainer.evaluator.stager.download(trainer.learner.mean.dm)
    expected = np.zeros(dm.shape, bool)
    expected[np.arange(8), np.arange(8) % 4] = True
    np.testing.assert_array_equal(dm != 0, expected)


@pytest.mark.parametrize("mirror", [True, False], ids=["mirror", "free"])  # two tests: xdist runs them side by side
def test_the_mirror_keeps_the_mean_head_symmetric_through_training_and_the_fold_boundary(half_hour_store, mirror):
    """network.mirror at strength 1: from its start, after each epoch's steps and after the fold reset
    (shrink-and-perturb from a fresh draw), the mean head's weights satisfy W[i, d] = p_i W[i, sigma d] exactly (sigma
    swaps Short and Long; p the input columns' mirror parity, agent/mean_head.py), so the mirrored observation values
    Short as the observation values Long; the bias pairs Short with Long; the target network, Polyak-averaged from
    symmetric weights, is symmetric too. Without it the trained head is not."""
    base = [*SMALL, "env.collect_steps=2", "learner.steps_per_epoch=2", "network.mean_head=true",
            "network.mean_cross=true", "network.n_layers=0", "network.head_init_scale=1.0"]
    sigma = [2, 1, 0, 3]
    rt = real_trainer(half_hour_store, [*base, f"network.mirror={str(mirror).lower()}", "network.mirror_strength=1"])
    trainer, lay = rt.trainer, rt.trainer.layout
    learner = trainer.learner
    parity = mean_head_parity(rt.cfg, lay)
    assert parity.shape == (lay.obs_dim + lay.cross,) and (parity < 0).any() and (parity > 0).any()

    def symmetric(flat):
        p = lay.unpack(flat)
        w, b = p[MEAN_W], p[MEAN_B]
        return np.array_equal(w, parity[:, None] * w[:, sigma]) and np.array_equal(b, b[sigma])

    checks = [symmetric(learner.stager.download(learner.params))]
    rt.registry.reset(FoldReset, ResetContext(fold=0, seed=rt.cfg.run.seed, stream=trainer.stream))
    trainer.collect()
    trainer.train(lambda: None)
    checks += [symmetric(learner.stager.download(learner.params)), symmetric(learner.stager.download(learner.target))]
    rt.registry.reset(FoldReset, ResetContext(fold=1, seed=rt.cfg.run.seed, stream=trainer.stream))
    checks.append(symmetric(learner.stager.download(learner.params)))
    assert checks == [mirror] * 4, f"mirror={mirror}: {checks}"


def test_a_mirror_strength_below_one_shrinks_the_started_heads_asymmetry_by_that_fraction(half_hour_store):
    """network.mirror_strength reaches the learner: the drawn mean head (head_init_scale 1) of the same seed keeps
    (1 - s) of its asymmetry W - p W[:, sigma] after the starting projection, where the mirror off keeps all of it."""
    base = [*SMALL, "network.mean_head=true", "network.mean_cross=true", "network.n_layers=0",
            "network.head_init_scale=1.0"]
    sigma = [2, 1, 0, 3]
    gaps = []
    for extra in (["network.mirror=false"], ["network.mirror=true", "network.mirror_strength=0.25"]):
        rt = real_trainer(half_hour_store, [*base, *extra])
        learner, lay = rt.trainer.learner, rt.trainer.layout
        w = lay.unpack(learner.stager.download(learner.params))[MEAN_W].astype(np.float64)
        gaps.append(w - mean_head_parity(rt.cfg, lay)[:, None] * w[:, sigma])
    assert np.abs(gaps[0]).max() > 1e-3
    np.testing.assert_allclose(gaps[1], 0.75 * gaps[0], rtol=1e-4, atol=1e-6)
