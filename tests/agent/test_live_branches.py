"""Live branches (agent/network.py): under the default counterfactual learner the network computes the direction
branch's head columns alone. Checked here: which configs get which live branches, the layout (fingerprint, zero
columns from the start, refusals), and through a real Trainer that a fold's epochs (collect, train, a fold-boundary
shrink-and-perturb, evaluation) keep every other head column of the parameters, the target, the gradients and the
head outputs exactly 0, the promise that lets the GPU skip those columns' tiles. The skipped launches' own numbers
against whole ones: tests/kernels/test_nn_kernels.py (fp32, here) and test_gemm_tensor.py (TF32 and bf16, GPU)."""

import numpy as np
import pytest
from real_trainer import SMALL, real_trainer

from fox_numba.actions import N_BRANCHES
from fox_numba.agent.learner import live_branches
from fox_numba.agent.network import ParamLayout, init_params
from fox_numba.checkpoint import load_checkpoint, save_checkpoint
from fox_numba.config import load_config
from fox_numba.errors import LayoutMismatchError
from fox_numba.kernels.heads import head_width, live_columns
from fox_numba.observation import OBS_DIM


@pytest.mark.parametrize(("overrides", "live"), [
    ([], 1),  # the defaults: counterfactual targets, every later branch fixed
    (["learner.counterfactual=false", "learner.counterfactual_held=false"], N_BRANCHES),
    (["env.fixed_bins=[0, 0, -1]"], N_BRANCHES),  # the policy chooses the urgency from its (untrained) heads
    (["learner.aux_weight=0.5"], N_BRANCHES),  # the forecast column sits past the streams
])  # fmt: skip
def test_which_branches_are_live(overrides, live):
    assert live_branches(load_config("default", overrides=overrides)) == live


def test_the_layout_of_live_branches():
    cfg = load_config("default").network
    full = ParamLayout.build(OBS_DIM, cfg)
    live = ParamLayout.build(OBS_DIM, cfg, live_branches=1)
    z = cfg.n_atoms
    assert (full.live_cols, live.live_cols) == (head_width(z), 5 * z) == (live_columns(4, z), live_columns(1, z))
    assert [e.shape for e in live.entries] == [e.shape for e in full.entries] and live.fingerprint != full.fingerprint
    p_full, p_live = (x.unpack(init_params(x, 7, head_scale=1.0)) for x in (full, live))
    w, b = p_live["head.weight"], p_live["head.bias"]
    np.testing.assert_array_equal(w[:, : live.live_cols], p_full["head.weight"][:, : live.live_cols])
    assert np.abs(w[:, : live.live_cols]).min() > 0 and not w[:, live.live_cols :].any() and not b.any()
    for bad in ({"noisy_sigma0": 0.5}, {"moe_experts": 2, "mean_head": False, "mean_cross": False, "mirror": False}):
        net = load_config("default", overrides=[f"network.{k}={str(v).lower()}" for k, v in bad.items()]).network
        with pytest.raises(ValueError, match="live_branches must be in 1..4, and 4 with NoisyNet or MoE heads"):
            ParamLayout.build(OBS_DIM, net, live_branches=1)
    with pytest.raises(ValueError, match="live_branches must be in 1..4"):
        ParamLayout.build(OBS_DIM, cfg, live_branches=0)


def test_a_checkpoint_of_every_branch_refuses_to_load_into_a_live_layout(tmp_path):
    """The same entries and sizes, other head columns computed: a checkpoint's params fingerprint tells them apart,
    and loading names both fingerprints."""
    net = load_config("default").network
    full, live = (ParamLayout.build(OBS_DIM, net, live_branches=b) for b in (N_BRANCHES, 1))
    path = save_checkpoint(tmp_path / "full.h5", {"params": init_params(full, 0)},
                           fingerprints={"params": full.fingerprint})
    with pytest.raises(LayoutMismatchError, match=f"params layout fingerprint.*{full.fingerprint}"):
        load_checkpoint(path, expected_fingerprints={"params": live.fingerprint})
    assert load_checkpoint(path, expected_fingerprints={"params": full.fingerprint}).arrays["params"].shape == (
        full.size,)


def test_the_columns_past_the_live_ones_stay_zero_through_training(four_day_store):
    """Xavier heads (SMALL), so the live columns move and anything leaking into the others would show."""
    rt = real_trainer(four_day_store, [*SMALL, "learner.batch_size=8"])
    trainer, stager = rt.trainer, rt.trainer.stager
    layout, learner = trainer.layout, trainer.learner
    assert layout.live_branches == 1
    cols = layout.live_cols

    def head(flat):
        v = layout.unpack(stager.download(flat))
        return v["head.weight"], v["head.bias"]

    start = head(learner.params)[0][:, :cols].copy()
    for _ in range(2):
        trainer.collect()
        trainer.train(lambda: None)
        learner.shrink_perturb(seed=3)  # a fold boundary's theta_fresh is drawn with the same zero columns
    trainer.evaluate()
    for flat in (learner.params, learner.target, learner.grads, learner.adam_m, learner.adam_v):
        w, b = head(flat)
        assert not w[:, cols:].any() and not b[cols:].any()
    assert not np.array_equal(head(learner.params)[0][:, :cols], start)  # the live columns trained
    for net in (learner.online, learner.target_net):
        out = stager.download(net.head_out)
        assert not out[:, cols:].any() and np.abs(out[:, :cols]).max() > 0


@pytest.mark.parametrize("trunk", [0, 2], ids=["linear", "trunk"])
def test_a_live_branch_trainer_is_the_whole_heads_trainer_bit_for_bit(four_day_store, monkeypatch, trunk):
    """Two epochs of collect, train and evaluation with the direction branch live (the default's kernels:
    select_q_rows_live1, project_loss_scatter_live1, the live GEMM launches) and with every branch live (the whole
    kernels), heads started at zero so both start from the same parameters: the same parameters, target and Adam
    moments, and the same validation days, every bit."""
    overrides = [*SMALL, "learner.batch_size=8", "network.head_init_scale=0.0"]
    if trunk:
        overrides += [f"network.n_layers={trunk}", "network.mean_cross=false", "network.mirror=false"]
    runs = []
    for forced in (None, N_BRANCHES):
        if forced is not None:
            monkeypatch.setattr("fox_numba.agent.learner.live_branches", lambda cfg: forced)  # run_layout reads it
        rt = real_trainer(four_day_store, overrides)
        trainer = rt.trainer
        assert trainer.layout.live_branches == (forced or 1)
        for _ in range(2):
            trainer.collect()
            trainer.train(lambda: None)
        days, _ = trainer.evaluate()
        learner, dl = trainer.learner, trainer.stager.download
        runs.append(([dl(a) for a in (learner.params, learner.target, learner.adam_m, learner.adam_v)], days))
    (live, live_days), (whole, whole_days) = runs
    for a, b in zip(live, whole, strict=True):
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
    assert np.abs(live[0]).max() > 0
    for (pnl, pos), (ref_pnl, ref_pos) in zip(live_days, whole_days, strict=True):
        np.testing.assert_array_equal(pos, ref_pos)
        np.testing.assert_array_equal(pnl, ref_pnl)
