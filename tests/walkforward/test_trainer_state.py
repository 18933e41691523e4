"""The real trainer's state in the real StateResetRegistry (`register_trainer`): a fold boundary run on a
trained smoke trainer empties the replay, syncs the target to the perturbed parameters (after the
shrink-and-perturb, not before), shrinks Adam's moments, restarts the step counters, writes the ISV's
fold-reset slots, and leaves the supports where they were once the fold's first support refresh has run
(the refresh reads ISV slots that the reset must not zero: the supports halved at every fold start once).

One module fixture trains fold 0 for one short epoch, binds fold 1 and runs its boundary; the tests read the
state before and after. Half-hour days, 4 environments, a small batch and a small network keep it to seconds
on the simulator.
"""

import numpy as np
import pytest
from real_trainer import SMALL, real_trainer

from fox_numba.agent.fold_market import FoldMarket
from fox_numba.device.isv import SLOTS, Isv
from fox_numba.walkforward.reset_registry import FoldReset, ResetContext
from fox_numba.walkforward.trainer_state import audit_trainer

# ISV values of a trained run (the smoke epoch is too short to move the references off the base support):
# the rule wants a half-width of 3 * 1.5 + 2 * 0.3 / sqrt(1 - 0.95**2) = 6.42 for the direction heads (4.92 for
# the others), between the base's 1 and the cap of 10, where a reset of any reference the rule reads moves it.
TRAINED_REFS = {Isv.Q_ABS_REF: 1.0, Isv.Q_DIR_ABS_REF: 1.5, Isv.REWARD_ABS_EMA: 0.3}


def download(trainer, name):
    return trainer.stager.download(trainer.learner.state_arrays()[name]).copy()


@pytest.fixture(scope="module")
def boundary(half_hour_store):
    rt = real_trainer(half_hour_store, SMALL)
    cfg, trainer, kills, best, registry, folds, features = (rt.cfg, rt.trainer, rt.kills, rt.best, rt.registry,
                                                            rt.folds, rt.features)
    registry.reset(FoldReset, ResetContext(fold=0, seed=cfg.run.seed, stream=trainer.stream))
    trainer.collect()
    trainer.train(lambda: None)
    best.update(0, 1.5)
    isv = trainer.isv()
    for slot, value in TRAINED_REFS.items():
        isv[slot] = value
    trainer.stager.upload(isv, trainer.bus.values)
    for _ in range(4):  # the width moves at most 2x per refresh: four reach the rule's fixed point
        trainer.learner.refresh_supports()
    before = {name: download(trainer, name) for name in ("params", "target_params", "adam_m", "adam_v",
                                                          "support_online")}
    before["isv"] = trainer.isv()
    before["replay_meta"] = trainer.replay.read_meta(trainer.stager)
    before["optim"] = trainer.learner.read_optim_state().copy()

    trainer.bind_fold(FoldMarket.build(features, folds[1], cfg.features, cfg.env), 1)
    records = registry.reset(FoldReset, ResetContext(fold=1, seed=cfg.run.seed, stream=trainer.stream))
    after = {name: download(trainer, name) for name in ("params", "target_params", "adam_m", "adam_v",
                                                         "support_online", "support_target")}
    after["isv"] = trainer.isv()
    after["replay_meta"] = trainer.replay.read_meta(trainer.stager)
    after["optim"] = trainer.learner.read_optim_state().copy()
    trainer.learner.refresh_supports()  # what Trainer.collect runs first in the fold's first epoch
    after["support_refreshed"] = download(trainer, "support_online")
    return {"trainer": trainer, "registry": registry, "kills": kills, "best": best, "records": records,
            "before": before, "after": after}


def test_every_attribute_is_an_entry_or_wiring(boundary):
    b = boundary
    assert audit_trainer(b["registry"], b["trainer"], b["kills"], b["best"]) == []


def test_the_replay_buffer_is_emptied(boundary):
    before, after = boundary["before"], boundary["after"]
    assert before["replay_meta"][1] == 4 * 6  # fold 0's collect filled it
    assert tuple(after["replay_meta"]) == (0, 0)


def test_the_target_is_synced_to_the_perturbed_parameters(boundary):
    before, after = boundary["before"], boundary["after"]
    assert not np.array_equal(after["params"], before["params"])  # shrink-and-perturb ran
    # 0.8 theta + 0.2 fresh: the kept part is there, so this is the perturbation and not a fresh draw
    residual = after["params"].astype(np.float64) - 0.8 * before["params"]
    assert np.abs(residual).max() < np.abs(after["params"]).max()
    np.testing.assert_array_equal(after["target_params"], after["params"])  # synced after, not before
    np.testing.assert_array_equal(after["support_target"], after["support_online"])


def test_adam_moments_shrink_and_counters_restart(boundary):
    before, after = boundary["before"], boundary["after"]
    assert np.abs(before["adam_m"]).max() > 0 and before["adam_v"].max() > 0
    np.testing.assert_allclose(after["adam_m"], before["adam_m"].astype(np.float64) * 0.1, rtol=1e-6, atol=0)
    np.testing.assert_allclose(after["adam_v"], before["adam_v"].astype(np.float64) * 0.01, rtol=1e-6, atol=0)
    assert before["optim"]["step"] == 3 and after["optim"]["step"] == 0 and after["optim"]["adam_t"] == 0


def test_isv_slots_take_their_fold_reset_values(boundary):
    before, after = boundary["before"], boundary["after"]
    for s in SLOTS:
        if s.fold_reset is not None:
            assert after["isv"][s.index] == np.float32(s.fold_reset), s.name
        else:
            assert after["isv"][s.index] == before["isv"][s.index], s.name
    assert after["isv"][Isv.FOLD_WARMUP_FACTOR] == 0.0  # a fold-reset slot that training moved off 0


def test_the_fold_start_leaves_the_supports_where_they_were(boundary):
    before, after = boundary["before"], boundary["after"]
    support = before["support_online"]
    np.testing.assert_allclose(support[:3, 1], 6.42, rtol=1e-3)  # the direction heads at the rule's width
    assert (support[3:, 1] > 4.9).all()  # the others above the base v_max of 1
    np.testing.assert_array_equal(after["support_online"], support)
    np.testing.assert_array_equal(after["support_refreshed"], support)


def test_the_best_epoch_and_kill_state_restart(boundary):
    b = boundary
    assert b["best"].epoch is None and b["best"].sharpe is None
    names = [r.name for r in b["records"]]
    assert names.index("learner.params") < names.index("learner.target")
    assert "collector.replay" in names and "run.best.epoch" in names
