"""The IQN head in a real trainer (network.iqn_quantiles > 0): collect and evaluation act on the joint values,
training fills HEALTH_DIAG's loss_iqn, and the registry audit finds no unregistered state. The kernels and the
learner's step: tests/kernels/test_iqn_kernels.py, tests/agent/test_iqn.py."""

import numpy as np
from plain_learner import PLAIN_OVERRIDES
from real_trainer import SMALL, real_trainer

from fox_numba.device.registry import kernel_name
from fox_numba.kernels.action_select import heads_kernel
from fox_numba.walkforward.reset_registry import FoldReset, ResetContext
from fox_numba.walkforward.trainer_state import audit_trainer

N_TAUS, EMBED = 3, 4


def test_an_iqn_trainer_collects_trains_diagnoses_and_evaluates_on_the_joint_values(half_hour_store):
    """A real trainer with the IQN head: the collect step runs the IQN actor between the forward and action
    selection (and draws its 4 levels per environment from the collector's generators), training writes the IQN
    loss into HEALTH_DIAG, the registry audit finds no unregistered state, and evaluation runs on the joint values
    with E_IQN from the midpoint levels alone (no draw: evaluation stays a function of the parameters; the levels
    and the states are checked in tests/kernels/test_iqn_kernels.py)."""
    rt = real_trainer(half_hour_store, [*SMALL, "env.collect_steps=2", "learner.steps_per_epoch=1",
                                        f"network.iqn_quantiles={N_TAUS}", f"network.iqn_embed={EMBED}",
                                        *PLAIN_OVERRIDES])
    trainer = rt.trainer
    assert audit_trainer(rt.registry, trainer, rt.kills, rt.best) == []
    rt.registry.reset(FoldReset, ResetContext(fold=0, seed=rt.cfg.run.seed, stream=trainer.stream))
    trainer.collect()
    step = [r.kernel.rsplit(".", 1)[1] for r in trainer.collector.graph.launches]
    at = step.index(kernel_name(heads_kernel(rt.cfg.env.fixed_bins)).rsplit(".", 1)[1])
    assert step[step.index("iqn_act_taus"):at] == ["iqn_act_taus", "iqn_act_values"]
    trainer.train(lambda: None)
    rec = trainer.download_state()["health.record"][0]
    assert rec["loss_iqn"] > 0
    days = trainer.evaluate()[0]
    assert len(days) > 0 and all(np.isfinite(pnl).all() for pnl, _ in days)
    evaluator = trainer.evaluator
    values = evaluator.stager.download(evaluator.iqn.values)
    assert np.isfinite(values).all() and np.array_equal(values[:, 0], values[:, 1])  # no draws in evaluation
