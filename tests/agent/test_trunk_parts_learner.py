"""Spectral normalisation and stochastic depth in the learner's step and the trainer: the step's kernels (none of
them when off), seed determinism, the epoch's spectral_sigma, the power-iteration vectors as learner state (a
bit-for-bit resume, a checkpoint that refuses another layout, the fold-boundary entry of the registry), and a real
trainer that collects, trains and evaluates with both parts on."""

import numpy as np
import pytest
import reference
from real_trainer import SMALL, real_trainer
from test_learner import M, P, build, host_state, random_replay, steady_isv, tiny_config

from fox_numba.agent.network import ParamLayout
from fox_numba.agent.spectral import WARMUP_ITERS, init_vectors, vector_views
from fox_numba.checkpoint import load_checkpoint, save_checkpoint
from fox_numba.errors import LayoutMismatchError
from fox_numba.walkforward.reset_registry import FoldReset, ResetContext
from fox_numba.walkforward.trainer_state import audit_trainer

SPECTRAL_KERNELS = {"spectral_power_kernel", "spectral_scale_kernel", "spectral_grad_kernel",
                    "spectral_epoch_stat_kernel"}
DEPTH_KERNELS = {"depth_factors_kernel", "residual_add_kernel", "residual_branch_grad_kernel",
                 "residual_skip_grad_kernel"}


def parts_config(*, spectral=False, depth=0.0, n_layers=2):
    cfg = tiny_config(n_layers=n_layers)
    cfg.network.spectral_norm, cfg.network.stochastic_depth = spectral, depth
    return cfg


def _names(learner):
    return [r.kernel.rsplit(".", 1)[1] for r in learner.graph.launches]


def test_steps_launch_each_part_and_follow_the_seed(stream, stager, rng):
    replay, market, isv0 = random_replay(rng), rng.standard_normal((12, M)).astype(np.float32), steady_isv(rng)
    configs = {"off": parts_config(n_layers=3), "spectral": parts_config(spectral=True),
               "depth": parts_config(depth=0.5, n_layers=3), "both": parts_config(spectral=True, depth=0.5, n_layers=3)}
    for name, cfg in configs.items():
        runs = []
        for _ in range(2 if name == "both" else 1):  # the seed's determinism with both parts drawing and iterating
            learner, _ = build(stager, stream, cfg, replay, market, isv0, seed=3)
            learner.train_epoch(2)
            runs.append(host_state(learner))
        for key in runs[0] if len(runs) == 2 else ():  # one seed, the same bits
            np.testing.assert_array_equal(runs[0][key], runs[1][key], err_msg=f"{name}: {key}")
        names = _names(learner)
        on_s, on_d = bool(SPECTRAL_KERNELS & set(names)), bool(DEPTH_KERNELS & set(names))
        assert (on_s, on_d) == (cfg.network.spectral_norm, cfg.network.stochastic_depth > 0), name
        assert ("spectral_uv" in runs[0]) == cfg.network.spectral_norm
        n = cfg.network.n_layers
        if on_s:  # online iterates, target reads; one gradient each; one stat
            assert names.count("spectral_power_kernel") == names.count("spectral_scale_kernel") == 2 * n
            assert names.count("spectral_grad_kernel") == n and names.count("spectral_epoch_stat_kernel") == 1
        if on_d:  # the online network draws, both networks add, the backward of the online one
            assert names.count("depth_factors_kernel") == n - 1 and names.count("residual_add_kernel") == 2 * (n - 1)
            assert names.count("residual_branch_grad_kernel") == names.count("residual_skip_grad_kernel") == n - 1


def test_epoch_stat_and_vectors_move(stream, stager, rng):
    replay, market, isv0 = random_replay(rng), rng.standard_normal((12, M)).astype(np.float32), steady_isv(rng)
    learner, _ = build(stager, stream, parts_config(spectral=True), replay, market, isv0, seed=4)
    layout = learner.layout
    start = host_state(learner)
    p = layout.unpack(start["params"])
    for k, ((u, v), (u0, v0)) in enumerate(zip(vector_views(layout, start["spectral_uv"]),
                                               vector_views(layout, init_vectors(layout, 4)), strict=True)):
        want_u, want_v, _ = reference.spectral_power64(p[f"trunk.{k}.weight"], u0, v0, WARMUP_ITERS)
        np.testing.assert_allclose(u, want_u, rtol=1e-4, atol=1e-5)  # the construction's warm-up
        np.testing.assert_allclose(v, want_v, rtol=1e-4, atol=1e-5)
    learner.train_epoch(1)
    stats = learner.epoch_stats()
    sigma = stager.download(learner.online.spectral.sigma).astype(np.float64)
    assert stats["spectral_sigma"] == pytest.approx(sigma.mean(), rel=1e-12) and sigma.min() > 0
    assert not np.array_equal(host_state(learner)["spectral_uv"], start["spectral_uv"])  # one iteration per step
    assert "spectral_sigma" not in build(stager, stream, parts_config(), replay, market, isv0)[0].epoch_stats()


def test_a_saved_learner_resumes_bit_for_bit_and_checkpoints_refuse_another_layout(stream, stager, rng, tmp_path):
    """Saved mid-run (the vectors with the parameters) and loaded into a fresh learner, the next steps give the
    uninterrupted learner's bits; a checkpoint without the vectors (an older layout) refuses to load."""
    cfg = parts_config(spectral=True, depth=0.5, n_layers=3)
    replay, market, isv0 = random_replay(rng), rng.standard_normal((12, M)).astype(np.float32), steady_isv(rng)
    a, isv_a = build(stager, stream, cfg, replay, market, isv0, seed=2)
    a.train_epoch(2)
    layout = a.layout
    path = save_checkpoint(tmp_path / "ck.h5", host_state(a), fingerprints={"params": layout.fingerprint})
    saved, saved_isv = load_checkpoint(path, expected_fingerprints={"params": layout.fingerprint}).arrays, \
        stager.download(isv_a)
    a.train_epoch(2)
    b, _ = build(stager, stream, cfg, replay, market, saved_isv, seed=2)
    b.load_state(saved)
    b.train_epoch(2)
    for name, arr in host_state(a).items():
        np.testing.assert_array_equal(arr.view(np.uint8), host_state(b)[name].view(np.uint8), name)

    plain = parts_config(n_layers=3)
    old = {k: v for k, v in saved.items() if k != "spectral_uv"}
    old_path = save_checkpoint(tmp_path / "old.h5", old,
                               fingerprints={"params": ParamLayout.build(M + P, plain.network).fingerprint})
    with pytest.raises(LayoutMismatchError, match="params layout fingerprint"):
        load_checkpoint(old_path, expected_fingerprints={"params": layout.fingerprint})
    with pytest.raises(KeyError, match="spectral_uv"):
        b.load_state(old)


def test_a_trainer_with_both_parts_registers_resets_collects_trains_and_evaluates(half_hour_store):
    rt = real_trainer(half_hour_store, [*SMALL, "env.collect_steps=2", "learner.steps_per_epoch=1",
                                        "network.n_layers=3", "network.spectral_norm=true",
                                        "network.stochastic_depth=0.3"])
    cfg, trainer, registry = rt.cfg, rt.trainer, rt.registry
    layout = trainer.layout
    assert audit_trainer(registry, trainer, rt.kills, rt.best) == []
    names = registry.names(FoldReset)
    assert names.index("learner.spectral_uv") > names.index("learner.params")  # warmed up on the perturbed theta
    registry.reset(FoldReset, ResetContext(fold=1, seed=cfg.run.seed, stream=trainer.stream))
    state = trainer.download_state()
    p = layout.unpack(state["learner.params"])
    seed = ResetContext(fold=1, seed=cfg.run.seed).seed_for("learner.spectral_uv")
    for k, ((u, v), (u0, v0)) in enumerate(zip(vector_views(layout, state["learner.spectral_uv"]),
                                               vector_views(layout, init_vectors(layout, seed)), strict=True)):
        want_u, want_v, _ = reference.spectral_power64(p[f"trunk.{k}.weight"], u0, v0, WARMUP_ITERS)
        np.testing.assert_allclose(u, want_u, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(v, want_v, rtol=1e-4, atol=1e-5)
    trainer.collect()
    stats = trainer.train(lambda: None)
    assert stats["spectral_sigma"] > 0 and np.isfinite(stats["loss"])
    first, second = trainer.evaluate()[0], trainer.evaluate()[0]  # no drops, no iterations: the same backtest
    for (pnl_a, pos_a), (pnl_b, pos_b) in zip(first, second, strict=True):
        np.testing.assert_array_equal(pnl_a, pnl_b)
        np.testing.assert_array_equal(pos_a, pos_b)
