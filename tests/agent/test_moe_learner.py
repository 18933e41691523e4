"""Mixture-of-experts heads in the learner's step and the trainer: the step's MoE kernels (none of them when off, and
the MoE slots untouched), seed determinism, the signals and the lambda controller in ISV 118-128 after a step against
float64, the fold-boundary resets, a checkpoint of another layout refused, and a real trainer that collects, trains
(HEALTH_DIAG's moe_* words, epoch stat moe_balance) and evaluates with the mixture on."""

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest
import reference
from real_trainer import SMALL, real_trainer
from test_learner import M, P, aux_targets, host_state, random_replay, steady_isv, tiny_config, upload_replay

from fox_numba.actions import N_BRANCHES
from fox_numba.agent.learner import Learner
from fox_numba.agent.network import ParamLayout
from fox_numba.checkpoint import load_checkpoint, save_checkpoint
from fox_numba.device.isv import MOE_LAMBDA_BASE, Isv
from fox_numba.errors import LayoutMismatchError
from fox_numba.kernels.moe import MOE_IMBALANCE_TARGET, MOE_LAMBDA_GAIN
from fox_numba.walkforward.reset_registry import FoldReset, ResetContext
from fox_numba.walkforward.trainer_state import audit_trainer

K = 3
MOE_KERNELS = {"moe_gate_softmax_kernel", "moe_mix_kernel", "moe_expert_grad_kernel", "moe_gate_grad_kernel",
               "moe_usage_kernel", "moe_signals_kernel"}
SLOTS = [*(int(Isv.MOE_UTIL_EMA_0) + k for k in range(8)), Isv.MOE_GATE_ENTROPY_EMA, Isv.MOE_MAX_UTIL_EMA,
         Isv.MOE_LAMBDA_EFF]


def build(stager, stream, cfg, replay_host, market, isv0, seed=0):
    layout = ParamLayout.build(M + P, cfg.network)
    isv = stager.upload_new(isv0)
    learner = Learner(cfg, layout, upload_replay(stager, replay_host), stager.upload_new(market),
                      stager.upload_new(aux_targets(market)), isv=isv, stager=stager, stream=stream, seed=seed)
    return learner, isv


def moe_config(k, n_layers=1, **learner):
    cfg = tiny_config(n_layers=n_layers, **learner)
    cfg.network.moe_experts = k
    return cfg


@pytest.mark.parametrize("n_layers", [0, 1])
def test_steps_launch_the_mixture_and_follow_the_seed(stream, stager, rng, n_layers):
    """On: both forwards mix, the online one reduces the usage and runs the signals, the backward takes both gradients;
    two learners of one seed give the same bits, and the gate and every expert learn. Off: not one MoE kernel, the
    MoE slots as they were (one learner: the plain step's determinism is test_learner's)."""
    replay, market, isv0 = random_replay(rng), rng.standard_normal((12, M)).astype(np.float32), steady_isv(rng)
    for k in (0, K):
        cfg = moe_config(k, n_layers)
        runs = []
        for _ in range(2 if k else 1):
            learner, isv = build(stager, stream, cfg, replay, market, isv0, seed=3)
            learner.train_epoch(2)
            runs.append({**host_state(learner), "isv": stager.download(isv)})
        for key in runs[0] if k else ():
            np.testing.assert_array_equal(runs[0][key], runs[1][key], err_msg=f"moe_experts={k}: {key}")
        names = [r.kernel.rsplit(".", 1)[1] for r in learner.graph.launches]
        stats = learner.epoch_stats()
        if not k:
            assert not MOE_KERNELS & set(names) and "moe_balance" not in stats
            np.testing.assert_array_equal(runs[0]["isv"][SLOTS], isv0[SLOTS])
            continue
        assert names.count("moe_gate_softmax_kernel") == names.count("moe_mix_kernel") == 2
        for name in ("moe_usage_kernel", "moe_signals_kernel", "moe_expert_grad_kernel", "moe_gate_grad_kernel"):
            assert names.count(name) == 1, name
        assert names.index("moe_signals_kernel") < names.index("moe_gate_grad_kernel")
        p = learner.layout.unpack(runs[0]["params"])
        assert np.abs(p["moe.weight"]).max() > 0  # the gate started at 0 and learned
        assert 1.0 <= stats["moe_balance"] <= K


def test_zero_started_experts_part_under_the_drawn_gate(stream, stager, rng):
    """Heads started at zero (network.head_init_scale = 0): the K experts begin equal, and the drawn gate
    (agent/moe.py) weights each one's gradient by its own routing, so after an epoch no two experts are equal
    and the mixture is not the single head; under the gate of the drawn-head start (0, uniform) the same epoch
    leaves every expert equal to the first, bit for bit (the failure the drawn gate removes)."""
    replay, market, isv0 = random_replay(rng), rng.standard_normal((12, M)).astype(np.float32), steady_isv(rng)
    cfg = moe_config(K, n_layers=0)
    cfg.network.head_init_scale = 0.0
    for uniform_gate in (False, True):
        learner, _ = build(stager, stream, cfg, replay, market, isv0, seed=3)
        if uniform_gate:
            flat = stager.download(learner.params)
            learner.layout.unpack(flat)["moe.weight"][:] = 0.0  # views of flat
            stager.upload(flat, learner.params)
            stager.upload(flat, learner.target)
        learner.train_epoch(1)
        p = learner.layout.unpack(stager.download(learner.params))
        hw = p["head.weight"].shape[1] // K
        experts = [p["head.weight"][:, k * hw : (k + 1) * hw] for k in range(K)]
        assert np.abs(experts[0]).max() > 0  # the heads learned
        equal = [np.array_equal(experts[0], e) for e in experts[1:]]
        assert equal == [uniform_gate] * (K - 1), f"uniform gate {uniform_gate}: experts equal to the first {equal}"


def test_signals_and_lambda_after_a_step(stream, stager, rng):
    """After the first step (the slots at their bootstrap: unobserved) ISV 118-127 hold the signals of the step's
    online gate weights on s and lambda has taken one controller step from its base weight; the epoch stat is the
    step's balance term."""
    replay, market, isv0 = random_replay(rng), rng.standard_normal((12, M)).astype(np.float32), steady_isv(rng)
    learner, isv = build(stager, stream, moe_config(K), replay, market, isv0, seed=1)
    b = learner.batch_size
    learner.step()
    w = stager.download(learner.online.moe.gate)[:b].astype(np.float64).reshape(b, N_BRANCHES, K)
    u, h = reference.moe_usage64(w)
    got = stager.download(isv)
    np.testing.assert_allclose(got[SLOTS[:K]], u.mean(axis=0), rtol=1e-5)
    assert not got[SLOTS[K:8]].any()
    np.testing.assert_allclose(got[Isv.MOE_GATE_ENTROPY_EMA], np.clip(h.mean() / math.log(K), 0, 1), rtol=1e-5)
    m = np.clip(u.max(axis=1).mean(), 1 / K, 1)
    np.testing.assert_allclose(got[Isv.MOE_MAX_UTIL_EMA], m, rtol=1e-5)
    lam = MOE_LAMBDA_BASE * math.exp(MOE_LAMBDA_GAIN * ((m - 1 / K) / (1 - 1 / K) - MOE_IMBALANCE_TARGET))
    np.testing.assert_allclose(got[Isv.MOE_LAMBDA_EFF], lam, rtol=1e-5)
    assert learner.epoch_stats()["moe_balance"] == pytest.approx(reference.moe_balance64(u), rel=1e-5)


def test_an_iqn_head_and_the_aux_regression_compose(stream, stager, rng):
    """The mixture beside an IQN head (it reads the same trunk output) and the auxiliary regression (its column the
    experts' mean): a finite step that moves every entry."""
    replay, market, isv0 = random_replay(rng), rng.standard_normal((12, M)).astype(np.float32), steady_isv(rng)
    cfg = moe_config(2, aux_weight=0.5, iqn_weight=1.0)
    cfg.network.iqn_quantiles, cfg.network.iqn_embed = 3, 4
    learner, _ = build(stager, stream, cfg, replay, market, isv0, seed=2)
    learner.step()
    grads = stager.download(learner.grads)
    assert np.isfinite(grads).all()
    g = learner.layout.unpack(grads)
    for e in learner.layout.entries:
        assert np.abs(g[e.name]).max() > 0, e.name


def test_state_and_isv_resume_the_mixture_bit_for_bit(stream, stager, rng):
    """The learner's state arrays and the ISV (a checkpoint's) hold everything the mixture carries: the experts and
    the gate in the parameters, the signals and lambda in the ISV; the usage is per-step scratch."""
    replay, market, isv0 = random_replay(rng), rng.standard_normal((12, M)).astype(np.float32), steady_isv(rng)
    cfg = moe_config(K)
    a, isv_a = build(stager, stream, cfg, replay, market, isv0, seed=2)
    a.train_epoch(2)
    saved, saved_isv = host_state(a), stager.download(isv_a)
    a.train_epoch(2)
    b, isv_b = build(stager, stream, cfg, replay, market, saved_isv, seed=9)
    b.load_state(saved)
    b.train_epoch(2)
    for name, arr in host_state(a).items():
        np.testing.assert_array_equal(arr.view(np.uint8), host_state(b)[name].view(np.uint8), name)
    np.testing.assert_array_equal(stager.download(isv_a), stager.download(isv_b))


def test_a_checkpoint_of_another_mixture_refuses_to_load(stream, stager, rng, tmp_path):
    plain = ParamLayout.build(M + P, moe_config(0).network)
    replay, market, isv0 = random_replay(rng), rng.standard_normal((12, M)).astype(np.float32), steady_isv(rng)
    learner, _ = build(stager, stream, moe_config(0), replay, market, isv0)
    path = save_checkpoint(tmp_path / "old.h5", host_state(learner), fingerprints={"params": plain.fingerprint})
    for k in (2, 3):
        with pytest.raises(LayoutMismatchError, match="params layout fingerprint"):
            load_checkpoint(path, expected_fingerprints={"params": ParamLayout.build(M + P, moe_config(k).network)
                                                         .fingerprint})


def test_a_trainer_with_the_mixture_resets_collects_trains_and_evaluates(half_hour_store):
    """The registry's fold reset writes the MoE slots' reset values (lambda back to its base, the EMAs unobserved);
    a fold's collect, train and evaluation run the mixture, and HEALTH_DIAG mirrors its signals."""
    rt = real_trainer(half_hour_store, [*SMALL, "env.collect_steps=2", "learner.steps_per_epoch=1",
                                        f"network.moe_experts={K}"])
    trainer = rt.trainer
    assert trainer.layout.moe_experts == K
    assert audit_trainer(rt.registry, trainer, rt.kills, rt.best) == []
    names = set(rt.registry.names(FoldReset))
    assert {"isv.MOE_LAMBDA_EFF", "isv.MOE_MAX_UTIL_EMA", "isv.MOE_GATE_ENTROPY_EMA", "isv.MOE_UTIL_EMA_0"} <= names
    stale = trainer.bus.read()
    stale[SLOTS] = 0.7
    trainer.stager.upload(stale, trainer.bus.values)
    rt.registry.reset(FoldReset, ResetContext(fold=0, seed=rt.cfg.run.seed, stream=trainer.stream))
    isv = trainer.bus.read()
    assert not isv[SLOTS[:-1]].any() and isv[Isv.MOE_LAMBDA_EFF] == np.float32(MOE_LAMBDA_BASE)
    trainer.collect()
    stats = trainer.train(lambda: None)
    assert np.isfinite(stats["loss"]) and 1.0 <= stats["moe_balance"] <= K
    rec = trainer.download_state()["health.record"][0]
    assert 1 / K <= rec["moe_max_util"] <= 1 and 0 < rec["moe_gate_entropy"] <= 1
    assert sum(rec[f"moe_util_{k}"] for k in range(K)) == pytest.approx(1.0, rel=1e-4)
    assert rec["moe_util_7"] == 0 and 0.001 <= rec["moe_lambda_eff"] <= 1
    days = trainer.evaluate()[0]
    assert len(days) > 0 and all(np.isfinite(pnl).all() for pnl, _ in days)


def test_bench_learner_builds_the_mixture(stream, stager):
    """tools/bench_learner.py --moe-experts K measures a learner with K experts per branch (the tool's own run, at
    its --tiny size, is test_bench_learner's; the H200 figure comes from its run there)."""
    tool = Path(__file__).resolve().parents[2] / "tools" / "bench_learner.py"
    spec = importlib.util.spec_from_file_location("bench_learner", tool)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    args = module.build_parser().parse_args(["--out", "unused", "--tiny", "--moe-experts", "2", "--obs-dim", "10",
                                             "--capacity", "64", "--bars", "16"])
    args.batch = 4  # main's --tiny sizes, one batch
    learner, _ = module.make_learner(args, stager, stream, graphs=False)
    assert learner.cfg.network.moe_experts == 2
    learner.train_epoch(1)
    names = {r.kernel.rsplit(".", 1)[1] for r in learner.graph.launches}
    assert MOE_KERNELS <= names
