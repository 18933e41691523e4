"""NoisyNet heads in the learner's step and the trainer (network.noisy_sigma0): the step's kernels, independent
online and target draws, a new draw per step, seed determinism, a step that differs from the noiseless one, and
a real trainer that collects and trains with noise, writes the per-branch mean |sigma| into HEALTH_DIAG,
registers and checkpoints its counters, and evaluates noise-free (mu alone: the same backtest twice)."""

import numpy as np
import reference
from real_trainer import SMALL, real_trainer
from test_learner import M, P, build, host_state, random_replay, steady_isv, tiny_config

from fox_numba.actions import N_BRANCHES
from fox_numba.agent.network import ParamLayout, init_params
from fox_numba.agent.noisy import BIAS_SIGMA, WEIGHT_SIGMA
from fox_numba.walkforward.reset_registry import FoldReset, ResetContext
from fox_numba.walkforward.trainer_state import audit_trainer

SIGMA0 = 0.5


def noisy_config(sigma0=SIGMA0):
    cfg = tiny_config()
    cfg.network.noisy_sigma0 = sigma0
    return cfg


def _names(learner):
    return [r.kernel.rsplit(".", 1)[1] for r in learner.graph.launches]


def test_noisy_steps_draw_anew_per_step_and_network_and_follow_the_seed(stream, stager, rng):
    replay, market, isv0 = random_replay(rng), rng.standard_normal((12, M)).astype(np.float32), steady_isv(rng)
    runs, draws, names = [], [], []
    for cfg in (noisy_config(), noisy_config(), noisy_config(0.0)):
        learner, _ = build(stager, stream, cfg, replay, market, isv0, seed=3)
        for _ in range(2):
            learner.train_epoch(1)
            if learner.noise_step is not None:
                draws.append([stager.download(n.noisy.f_eps) for n in (learner.online, learner.target_net)])
        runs.append(host_state(learner))
        names.append(_names(learner))
    on, again, off = runs
    for name in on:
        np.testing.assert_array_equal(on[name], again[name], err_msg=name)  # one seed, the same bits
    assert on["noise_step"][0] == 2 and "noise_step" not in off
    assert not np.array_equal(on["params"][: off["params"].size], off["params"])  # noise moved mu
    lay = ParamLayout.build(M + P, noisy_config().network)
    sigma = lay.unpack(on["params"])[WEIGHT_SIGMA]
    assert not np.array_equal(sigma, lay.unpack(init_params(lay, 3))[WEIGHT_SIGMA])  # sigma is learned
    (online_1, target_1), (online_2, _) = draws[:2]
    assert not np.allclose(online_1, target_1)  # independent streams on one counter
    assert not np.allclose(online_1, online_2)  # a new draw every step
    step = names[0]
    assert step.index("noise_tick") == step.index("step_schedule") + 1
    assert step.count("noise_draw") == 2 and step.count("noisy_weights_kernel") == 2
    assert step.count("noisy_grads_kernel") == 1
    assert not {"noise_tick", "noise_draw", "noisy_weights_kernel", "noisy_grads_kernel"} & set(names[2])


def test_a_saved_noisy_learner_resumes_bit_for_bit(stream, stager, rng):
    """Saved mid-run (noise_step with mu and sigma) and loaded into a fresh learner of the run's seed (the noise
    key is the seed and the counter), the next steps draw the same noise and give the same bits as the
    uninterrupted learner; a counter restarting at 0 would redraw the first steps' noise and differ."""
    cfg = noisy_config()
    replay, market, isv0 = random_replay(rng), rng.standard_normal((12, M)).astype(np.float32), steady_isv(rng)
    a, isv_a = build(stager, stream, cfg, replay, market, isv0, seed=2)
    a.train_epoch(2)
    saved, saved_isv = host_state(a), stager.download(isv_a)
    a.train_epoch(2)
    b, _ = build(stager, stream, cfg, replay, market, saved_isv, seed=2)
    b.load_state(saved)
    b.train_epoch(2)
    assert saved["noise_step"][0] == 2 and host_state(a)["noise_step"][0] == 4
    for name, arr in host_state(a).items():
        np.testing.assert_array_equal(arr.view(np.uint8), host_state(b)[name].view(np.uint8), name)


def test_a_noisy_trainer_collects_trains_diagnoses_and_evaluates_without_noise(half_hour_store):
    rt = real_trainer(half_hour_store, [*SMALL, "env.collect_steps=2", "learner.steps_per_epoch=1",
                                        f"network.noisy_sigma0={SIGMA0}"])
    cfg, trainer, registry = rt.cfg, rt.trainer, rt.registry
    assert audit_trainer(registry, trainer, rt.kills, rt.best) == [] and registry["learner.noise_step"]
    registry.reset(FoldReset, ResetContext(fold=0, seed=cfg.run.seed, stream=trainer.stream))
    trainer.collect()
    trainer.train(lambda: None)
    state = trainer.download_state()
    assert state["collector.noise_step"][0] == cfg.env.collect_steps
    assert state["learner.noise_step"][0] == cfg.learner.steps_per_epoch
    lay = trainer.layout
    p = lay.unpack(state["learner.params"])
    branch = reference.column_branches64(lay.n_atoms)
    both = np.abs(np.vstack([p[WEIGHT_SIGMA], p[BIAS_SIGMA][None]]).astype(np.float64))
    rec = state["health.record"][0]
    got = [rec[f"noisy_sigma_{name}"] for name in ("dir", "mag", "ord", "urg")]
    np.testing.assert_allclose(got, [both[:, branch == b].mean() for b in range(N_BRANCHES)], rtol=1e-6)
    first, second = trainer.evaluate()[0], trainer.evaluate()[0]  # mu alone: the same backtest twice
    for (pnl_a, pos_a), (pnl_b, pos_b) in zip(first, second, strict=True):
        np.testing.assert_array_equal(pnl_a, pnl_b)
        np.testing.assert_array_equal(pos_a, pos_b)
