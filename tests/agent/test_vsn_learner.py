"""The variable-selection gate in the learner's step and the trainer: the step's VSN kernels (none of them when off),
seed determinism, the focus EMAs in ISV 87-88 against float64, a checkpoint of another layout refused, and a real
trainer that collects, trains (HEALTH_DIAG's vsn_focus_* words) and evaluates with the gate on."""

import numpy as np
import pytest
import reference
from real_trainer import SMALL, real_trainer
from test_learner import M, P, aux_targets, host_state, random_replay, steady_isv, tiny_config, upload_replay

from fox_numba.agent.learner import Learner
from fox_numba.agent.network import ParamLayout
from fox_numba.checkpoint import load_checkpoint, save_checkpoint
from fox_numba.device.isv import Isv
from fox_numba.errors import LayoutMismatchError
from fox_numba.walkforward.reset_registry import FoldReset, ResetContext
from fox_numba.walkforward.trainer_state import audit_trainer

GROUPS = ((0, 1), (1, 3), (3, M + P))  # market columns 0 | 1-2 | the portfolio
VSN_KERNELS = {"vsn_softmax_kernel", "vsn_apply_kernel", "vsn_gate_grad_kernel", "vsn_focus_kernel"}
FOCUS = [Isv.VSN_FOCUS_MAX_EMA, Isv.VSN_FOCUS_ENTROPY_EMA]


def build(stager, stream, cfg, replay_host, market, isv0, seed=0):
    layout = ParamLayout.build(M + P, cfg.network, vsn_groups=GROUPS if cfg.network.vsn else None)
    isv = stager.upload_new(isv0)
    learner = Learner(cfg, layout, upload_replay(stager, replay_host), stager.upload_new(market),
                      stager.upload_new(aux_targets(market)), isv=isv, stager=stager, stream=stream, seed=seed)
    return learner, isv


def vsn_config(vsn, n_layers=1):
    cfg = tiny_config(n_layers=n_layers)
    cfg.network.vsn = vsn
    return cfg


@pytest.mark.parametrize("n_layers", [0, 1])
def test_steps_launch_the_gate_and_follow_the_seed(stream, stager, rng, n_layers):
    """On: the online forward gates (and produces the focus), the target forward gates, the backward takes one gate
    gradient; two learners of one seed give the same bits. Off: not one VSN kernel (one learner: the plain step's
    determinism is test_learner's)."""
    replay, market, isv0 = random_replay(rng), rng.standard_normal((12, M)).astype(np.float32), steady_isv(rng)
    for vsn in (False, True):
        cfg = vsn_config(vsn, n_layers)
        runs = []
        for _ in range(2 if vsn else 1):
            learner, isv = build(stager, stream, cfg, replay, market, isv0, seed=3)
            learner.train_epoch(2)
            runs.append({**host_state(learner), "isv": stager.download(isv)})
        for key in runs[0] if vsn else ():
            np.testing.assert_array_equal(runs[0][key], runs[1][key], err_msg=f"vsn={vsn}: {key}")
        names = [r.kernel.rsplit(".", 1)[1] for r in learner.graph.launches]
        if not vsn:
            assert not VSN_KERNELS & set(names)
            np.testing.assert_array_equal(runs[0]["isv"][FOCUS], isv0[FOCUS])
            continue
        assert names.count("vsn_softmax_kernel") == names.count("vsn_apply_kernel") == 2
        assert names.count("vsn_focus_kernel") == names.count("vsn_gate_grad_kernel") == 1
        assert names.index("vsn_gate_grad_kernel") > names.index("vsn_focus_kernel")
        gate = learner.layout.unpack(runs[0]["params"])["vsn.weight"]
        assert np.abs(gate).max() > 0  # the gate started at 0 and learned


def test_the_iqn_gradient_reaches_the_gate_through_the_trunk(stream, stager, rng):
    """With an IQN head beside C51 (a trunk: its input gradient enters there) the gate's gradient is the C51 step's
    plus the IQN head's share, so it differs from the same step with learner.iqn_weight = 0."""
    replay, market, isv0 = random_replay(rng), rng.standard_normal((12, M)).astype(np.float32), steady_isv(rng)
    grads = []
    for weight in (0.0, 1.0):
        cfg = vsn_config(True)
        cfg.network.iqn_quantiles, cfg.network.iqn_embed, cfg.learner.iqn_weight = 3, 4, weight
        learner, _ = build(stager, stream, cfg, replay, market, isv0, seed=2)
        learner.step()
        g = learner.layout.unpack(stager.download(learner.grads))
        assert np.isfinite(stager.download(learner.grads)).all()
        grads.append(np.concatenate([g["vsn.weight"].ravel(), g["vsn.bias"]]))
    assert np.abs(grads[0]).max() > 0 and not np.allclose(grads[0], grads[1])


def test_focus_slots_hold_the_step_gate_focus(stream, stager, rng):
    """After the first step (the slots at their bootstrap 0) ISV 87-88 are the focus of the step's online gate
    weights on s; one more step folds the next batch in with alpha 0.01."""
    replay, market, isv0 = random_replay(rng), rng.standard_normal((12, M)).astype(np.float32), steady_isv(rng)
    learner, isv = build(stager, stream, vsn_config(True), replay, market, isv0, seed=1)
    b = learner.batch_size
    learner.step()
    w = stager.download(learner.online.vsn.weights)[:b]
    first = stager.download(isv)[FOCUS]
    np.testing.assert_allclose(first, reference.vsn_focus64(w), rtol=1e-6)
    learner.step()
    w = stager.download(learner.online.vsn.weights)[:b]
    want = first + 0.01 * (np.array(reference.vsn_focus64(w)) - first)
    np.testing.assert_allclose(stager.download(isv)[FOCUS], want, rtol=1e-6)


def test_a_checkpoint_without_the_gate_refuses_to_load(stream, stager, rng, tmp_path):
    cfg = vsn_config(True)
    plain = ParamLayout.build(M + P, vsn_config(False).network)
    vsn = ParamLayout.build(M + P, cfg.network, vsn_groups=GROUPS)
    replay, market, isv0 = random_replay(rng), rng.standard_normal((12, M)).astype(np.float32), steady_isv(rng)
    learner, _ = build(stager, stream, vsn_config(False), replay, market, isv0)
    path = save_checkpoint(tmp_path / "old.h5", host_state(learner), fingerprints={"params": plain.fingerprint})
    with pytest.raises(LayoutMismatchError, match="params layout fingerprint"):
        load_checkpoint(path, expected_fingerprints={"params": vsn.fingerprint})


def test_a_trainer_with_the_gate_registers_collects_trains_and_evaluates(half_hour_store):
    rt = real_trainer(half_hour_store, [*SMALL, "env.collect_steps=2", "learner.steps_per_epoch=1", "network.vsn=true"])
    trainer = rt.trainer
    layout = trainer.layout
    assert [b for b, _ in layout.vsn_groups][:4] == [0, 12, 16, 32] and layout.vsn_groups[-1][1] == layout.obs_dim
    assert audit_trainer(rt.registry, trainer, rt.kills, rt.best) == []
    rt.registry.reset(FoldReset, ResetContext(fold=0, seed=rt.cfg.run.seed, stream=trainer.stream))
    trainer.collect()
    stats = trainer.train(lambda: None)
    assert np.isfinite(stats["loss"])
    rec = trainer.download_state()["health.record"][0]
    k = len(layout.vsn_groups)
    assert 1 / k <= rec["vsn_focus_max"] <= 1 and 0 < rec["vsn_focus_entropy"] <= 1
    days = trainer.evaluate()[0]
    assert len(days) > 0 and all(np.isfinite(pnl).all() for pnl, _ in days)
