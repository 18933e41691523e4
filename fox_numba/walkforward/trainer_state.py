"""Every piece of the trainer's state in the StateResetRegistry: what a fold boundary resets, what carries over.

The registry is the one place a fold boundary's resets are written (DESIGN.md): the driver calls
`registry.reset(FoldReset, ctx)` and nothing else resets fold state. Entries run in registration order:

    learner.adam_moments   Adam m *= 0.1, v *= 0.01 (direction kept, magnitude history damped; seed K)
    learner.adam_step      Adam's t and the schedule's per-fold step restart at 0 (bias correction, cosine,
    learner.fold_step        the warm-up gates and the curriculum of episode starts start again); one kernel
                             resets both counters
    learner.params         theta = k theta + (1 - k) theta_fresh, k = learner.fold_keep (0.8, the seed's),
                           theta_fresh seeded per (run seed, fold)
    learner.target         target (and its supports) re-synced to the perturbed online network
    learner.average        the epoch-end weight average (evaluation.network = 'average') restarts there too
    learner.spectral_uv    (network.spectral_norm) the power-iteration vectors re-drawn from (run seed, fold) and
                           warmed up on the perturbed network (agent/spectral.py)
    learner.adaptive_tau   tau_eff's damping reads ISV[Q_DRIFT_RATE], reset with the ISV slots below
    collector.replay       the replay buffer emptied: the new fold's market rows mean other bars (and its
                           priorities cleared, with prioritised replay)
    isv.<SLOT>             every ISV slot whose table entry has a fold-reset value (one launch)
    kill.*                 the Q-drift window, the collapse and non-finite counters
    run.best.*             the fold's best epoch

Carried over (PerRun): the online supports, the learner's sampling stream (and, with NoisyNet heads, its noise
counter learner.noise_step: a fold starts on new noise), the ISV slots without a fold reset (the slow
gradient-norm EMA, the Q and reward scale references the support rule reads, ...). Built fresh at every fold by
`Trainer.bind_fold`, so nothing in them crosses a boundary: the fold's market tensors, the collect environments and
their collector, the evaluator. Their within-fold state (the environments' and the collector's random streams, and
the collector's NoisyNet counter) is in every checkpoint as named arrays; the environments' curriculum reach is
recomputed from learner.fold_step every epoch and holds no state of its own. The IQN head (network.iqn_quantiles
> 0) adds no entry: its parameters are entries of the learner's one layout (params, target, Adam, average), its
levels are drawn from learner.rng_states in training and from the collector's streams in collect. The VSN gate
(network.vsn) adds no entry either: its W_g, b_g are entries of the layout (learner.params shrinks them towards the
uniform gate), and its focus EMAs are ISV slots that carry over (isv.VSN_FOCUS_MAX_EMA, isv.VSN_FOCUS_ENTROPY_EMA,
PerRun like the gate they follow). The mixture-of-experts heads (network.moe_experts) keep their experts and gate in
the layout too; their signals are ISV slots that a fold boundary resets (isv.MOE_UTIL_EMA_0..7,
isv.MOE_GATE_ENTROPY_EMA, isv.MOE_MAX_UTIL_EMA to 0: unobserved, the fold's first step seeds them; isv.MOE_LAMBDA_EFF
to its base weight), so each fold's load-balancing controller starts from the same point and reads only that fold's
routing, whose gate shrink-and-perturb has just pulled towards uniform.

`audit_trainer` lists every attribute of the run-wide components that is neither an entry nor declared
wiring (each class's NOT_STATE); the driver refuses to start and a test asserts it is empty, so a field added
without its entry fails.
"""

from __future__ import annotations

from typing import Any

from fox_numba.agent.replay import STORED as REPLAY_FIELDS
from fox_numba.agent.trainer import Trainer
from fox_numba.walkforward.kill import KillCriteria
from fox_numba.walkforward.reset_registry import FoldReset, ResetContext, StateResetRegistry, register_isv
from fox_numba.walkforward.run_folder import BestEpoch


def register_trainer(registry: StateResetRegistry, trainer: Trainer, kills: KillCriteria, best: BestEpoch) -> None:
    """Register the trainer's state (module docstring); the trainer must have bound its first fold."""
    lrn, replay, bus, s = trainer.learner, trainer.replay, trainer.bus, trainer.stream
    if lrn is None:
        raise RuntimeError("register_trainer: bind the trainer's first fold before registering its state")
    noisy, spectral = lrn.noise_step is not None, lrn.spectral_uv is not None
    absent = () if noisy else ("noise_step",)  # None without NoisyNet heads ...
    absent += () if spectral else ("spectral_uv",)  # ... and without spectral normalisation
    r = registry.owner(lrn, "learner", not_state=absent)
    r.action("adam_moments", FoldReset, "Adam m *= 0.1, v *= 0.01", fields=("adam_m", "adam_v"),
             action=lambda ctx: lrn.shrink_adam())
    counters = ("learner", "counters")
    r.action("adam_step", FoldReset, "Adam t = 0 (bias correction restarts)", fields=("optim_state",),
             action=lambda ctx: lrn.reset_step_counter(), batch=counters)
    r.action("fold_step", FoldReset, "per-fold step counter = 0 (cosine, warm-up gates and curriculum restart)",
             fields=("optim_state",), action=lambda ctx: lrn.reset_step_counter(), batch=counters)
    r.action("params", FoldReset, "theta = k theta + (1 - k) theta_fresh, k = learner.fold_keep (seeded per fold)",
             fields=("params", "fresh"),
             action=lambda ctx: lrn.shrink_perturb(ctx.seed_for("learner.params")))
    r.action("target", FoldReset, "target network and supports re-synced to the online ones",
             fields=("target", "support_target"), action=lambda ctx: lrn.sync_target())
    r.action("average", FoldReset, "the epoch-end weight average restarts at the perturbed network",
             fields=("average", "support_average"), action=lambda ctx: lrn.restart_average())
    if spectral:
        r.action("spectral_uv", FoldReset, "spectral-norm vectors re-drawn (seeded per fold), warmed up on theta",
                 fields=("spectral_uv",), action=lambda ctx: lrn.reset_spectral(ctx.seed_for("learner.spectral_uv")))
    r.action("adaptive_tau", FoldReset, "tau damping state ISV[Q_DRIFT_RATE] = 0 (with the ISV slots)",
             fields=(), action=lambda ctx: bus.fold_reset(ctx.stream), batch=("isv", id(bus)))
    r.carried("support_online", "the online supports follow the Q scale across folds", fields=("support_online",))
    r.carried("rng_states", "the learner's minibatch sampling stream", fields=("rng_states",))
    if noisy:
        r.carried("noise_step", "the NoisyNet draw counter of the online and target networks (each fold new noise)",
                  fields=("noise_step",))
    registry.owner(replay, "collector").action(
        "replay", FoldReset, "replay buffer emptied (cursor = size = 0), its priorities cleared",
        fields=(*REPLAY_FIELDS, "meta", "priorities"),
        action=lambda ctx: replay.clear(stream=s))
    register_isv(registry, bus)
    kills.register_state(registry)
    best.register_state(registry)


def audit_trainer(registry: StateResetRegistry, trainer: Trainer, kills: KillCriteria, best: BestEpoch) -> list[str]:
    """Attributes of the run-wide components that no entry covers and no list declares (empty: complete)."""
    return registry.audit(trainer, trainer.learner, trainer.replay, trainer.bus, *kills.components(), best)


def fold_reset(registry: StateResetRegistry, fold: int, seed: int, stream: Any) -> list[str]:
    """Run the fold boundary's resets; the names of the entries reset, in order."""
    return [rec.name for rec in registry.reset(FoldReset, ResetContext(fold=fold, seed=seed, stream=stream))]
