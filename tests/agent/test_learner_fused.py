"""The learner's fused C51 passes (kernels/learner.py select_q_rows and project_loss_scatter) against the chain of
kernels they replaced, run inside whole learner steps: every output bit for bit (np.array_equal, NaN equal to NaN).

The chain is the step as it stood before the fusion (commit 7a96c31): the dueling combine of the online and target
head outputs into logits (which the fused passes later took over too), expected_q with the utilisation pass over the
2B online rows, double_dqn_rows, the importance weights (prioritised), c51_project, c51_loss, scatter_branch_grads and
the dueling combine's backward into the online network's dhead (which the fused loss pass also took over, later). The
two kernels the fusion removed from the package are kept here verbatim as the reference; they launch directly (not
through device/launch.py, which takes registered package kernels only). Each case runs three steps of a tiny learner
(batch 6, 5 atoms) and compares the parameters, the target, the Adam moments, every other state array, the ISV, the
raw epoch sums and every buffer of the step the later kernels read.
"""

import math

import numpy as np
import pytest
from numba import cuda, float32
from test_learner import M, P, aux_targets, host_state, random_replay, steady_isv, tiny_config, upload_replay
from test_priority_learner import ring_priorities

from fox_numba.actions import N_BRANCHES, N_HEADS
from fox_numba.agent.learner import Learner
from fox_numba.agent.network import ParamLayout
from fox_numba.device.memory import device_empty
from fox_numba.kernels.distributional import c51_loss, c51_project, expected_q
from fox_numba.kernels.heads import (
    branch_span,
    broadcast_supports,
    dueling_combine_backward,
    dueling_combine_forward,
)
from fox_numba.kernels.learner import _effect, greedy_next


@cuda.jit
def double_dqn_rows(logits, q, logits_tgt, support_online, support_target, actions, rewards, discounts,
                    branch_w, shared, taken, p_next, sup_next, sup_proj, rew_r, disc_r, weights, row_stats,
                    n):
    """The replaced kernel, verbatim (kernels/learner.py at 7a96c31)."""
    n_atoms = logits.shape[2]
    n_samples = actions.shape[0]
    r = cuda.grid(1)
    while r < n:
        i = r // N_BRANCHES
        b = r - i * N_BRANCHES
        off, size = branch_span(b)
        bin_t = min(max(actions[i, b], 0), size - 1)
        a_t = off + bin_t
        a_n = greedy_next(q, n_samples, i, b, shared)
        for z in range(n_atoms):
            taken[r, z] = logits[i, a_t, z]
        mx = logits_tgt[i, a_n, 0]
        for z in range(1, n_atoms):
            mx = max(mx, logits_tgt[i, a_n, z])
        total = float32(0.0)
        for z in range(n_atoms):
            total += math.exp(logits_tgt[i, a_n, z] - mx)
        v_min = support_target[a_n, 0]
        dz = support_target[a_n, 2]
        e_tgt = float32(0.0)
        for z in range(n_atoms):
            p = math.exp(logits_tgt[i, a_n, z] - mx) / total
            p_next[r, z] = p
            e_tgt += p * (v_min + float32(z) * dz)
        for c in range(3):
            sup_next[r, c] = support_target[a_n, c]
            sup_proj[r, c] = support_online[a_t, c]
        reward = rewards[i]
        discount = discounts[i]
        rew_r[r] = reward
        disc_r[r] = discount
        weights[r] = branch_w[b] * _effect(actions, i, b) / float32(n_samples)
        row_stats[r, 0] = reward + discount * e_tgt - q[i, a_t]
        row_stats[r, 1] = e_tgt
        row_stats[r, 2] = e_tgt - q[n_samples + i, a_n]
        r += cuda.gridsize(1)


@cuda.jit
def scatter_branch_grads(dl_rows, actions, dlogits, n):
    """The replaced kernel, verbatim (kernels/learner.py at 7a96c31)."""
    n_atoms = dlogits.shape[2]
    t = cuda.grid(1)
    while t < n:
        r = t // n_atoms
        z = t - r * n_atoms
        i = r // N_BRANCHES
        b = r - i * N_BRANCHES
        off, size = branch_span(b)
        taken = min(max(actions[i, b], 0), size - 1)
        g = dl_rows[r, z]
        for k in range(size):
            dlogits[i, off + k, z] = g if k == taken else float32(0.0)
        t += cuda.gridsize(1)


class ChainLearner(Learner):
    """The learner with the replaced chain in place of the two fused passes; entropy and util are the first B rows
    of the chain's [2B, 13] outputs, so the Q signals read what they read before."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        b, z = self.batch_size, self.layout.n_atoms
        r = N_BRANCHES * b
        self.support_rows = device_empty((2 * b, N_HEADS, 3), np.float32)
        self.entropy_rows = device_empty((2 * b, N_HEADS), np.float32)
        self.util_rows = device_empty((2 * b, N_HEADS), np.float32)
        self.entropy, self.util = self.entropy_rows[:b], self.util_rows[:b]
        self.taken, self.p_next, self.target_m, self.dl = (device_empty((r, z), np.float32) for _ in range(4))
        self.sup_next, self.sup_proj = device_empty((r, 3), np.float32), device_empty((r, 3), np.float32)
        self.dlogits = device_empty((b, N_HEADS, z), np.float32)
        self.logits = device_empty((2 * b, N_HEADS, z), np.float32)
        self.logits_tgt = device_empty((b, N_HEADS, z), np.float32)

    def _c51_rows(self, s, prio):
        lc, bt, rows = self.cfg.learner, self.batch, self.rows
        r = N_BRANCHES * self.batch_size
        dueling_combine_forward(self.online.head_out, self.logits, stream=s)
        dueling_combine_forward(self.target_net.head_out, self.logits_tgt, stream=s)
        broadcast_supports(self.support_online, self.support_rows, stream=s)
        expected_q(self.logits, self.support_rows, self.q, self.entropy_rows, utilisation=self.util_rows, stream=s)
        double_dqn_rows[1, 32, s](self.logits, self.q, self.logits_tgt, self.support_online, self.support_target,
                                  bt.actions, bt.rewards, bt.discounts, self.branch_weights,
                                  np.int32(lc.bootstrap == "direction"), self.taken, self.p_next, self.sup_next,
                                  self.sup_proj, rows.rewards, rows.discounts, rows.weights, rows.stats, np.int32(r))
        if prio is not None:
            prio.weights(bt.idx, self.schedule.device, self.optim_state, lc.priority_beta0, rows.weights,
                         self.is_weights, stream=s)
        c51_project(self.p_next, rows.rewards, rows.discounts, self.sup_next, self.sup_proj, self.target_m, stream=s)
        c51_loss(self.taken, self.target_m, rows.weights, rows.loss, self.dl, stream=s)
        scatter_branch_grads[1, 32, s](self.dl, bt.actions, self.dlogits, np.int32(r * self.layout.n_atoms))
        dueling_combine_backward(self.dlogits, self.online.dhead, stream=s)


CASES = {
    "trunk, aux, 3-step, dropout": ({}, dict(n_layers=1, aux_weight=0.7, n_step=3, dropout=0.2,
                                             branch_weights=[1.0, 0.5, 2.0, 0.25])),
    "linear, prioritised, branch bootstrap, obs noise": ({}, dict(n_layers=0, priority_alpha=0.6, priority_beta0=0.3,
                                                                  bootstrap="branch", obs_noise=0.1)),
    "noisy heads, IQN, two layers": (dict(noisy_sigma0=0.5, iqn_quantiles=3, iqn_embed=4), dict(n_layers=2)),
}


def run_steps(learner_cls, stager, stream, case, steps=3):
    net, lc = CASES[case]
    rng = np.random.default_rng(5)
    cfg = tiny_config(**lc)
    for key, value in net.items():
        setattr(cfg.network, key, value)
    if learner_cls is ChainLearner:
        # its two reference kernels launch directly, outside the traced launch helpers, so a captured graph would
        # hold launches StepGraph did not trace (it refuses that on a GPU): the chain runs eagerly, the fused
        # learner as configured, so on a GPU the fused graph is compared with the eager chain
        cfg.run.graphs = False
    replay, market = random_replay(rng), rng.standard_normal((12, M)).astype(np.float32)
    isv = stager.upload_new(steady_isv(rng))
    learner = learner_cls(cfg, ParamLayout.build(M + P, cfg.network), upload_replay(stager, replay),
                          stager.upload_new(market), stager.upload_new(aux_targets(market)), isv=isv, stager=stager,
                          stream=stream, seed=3)
    if cfg.learner.priority_alpha > 0:
        learner.replay.priorities.upload(ring_priorities(rng, replay), 6.5, stager)
    for _ in range(steps):
        learner.step()
    b = learner.batch_size
    out = {f"state.{k}": v for k, v in host_state(learner).items()}
    out["isv"] = stager.download(isv)
    out["epoch"] = stager.download(learner.epoch)
    out["q"] = stager.download(learner.q)
    out["head_out"] = stager.download(learner.online.head_out)
    out["head_out_tgt"] = stager.download(learner.target_net.head_out)
    out["entropy"], out["util"] = stager.download(learner.entropy)[:b], stager.download(learner.util)[:b]
    for name in ("rewards", "discounts", "weights", "loss", "stats"):
        out[f"rows.{name}"] = stager.download(getattr(learner.rows, name))
    out["dhead"] = stager.download(learner.online.dhead)
    if learner.is_weights is not None:
        out["is_weights"] = stager.download(learner.is_weights)
    return out, learner.epoch_stats()


@pytest.mark.parametrize("case", list(CASES))
def test_fused_steps_equal_the_chain_bit_for_bit(stream, stager, case):
    fused, fused_stats = run_steps(Learner, stager, stream, case)
    chain, chain_stats = run_steps(ChainLearner, stager, stream, case)
    assert fused.keys() == chain.keys()
    for name, want in chain.items():
        got = fused[name]
        same = np.array_equal(got, want, equal_nan=True) if got.dtype.kind == "f" else got.tobytes() == want.tobytes()
        assert same, name
    assert fused_stats == chain_stats
    # the steps learned (a skipped step would compare a no-op): every step applied, the parameters moved
    assert fused_stats["applied_steps"] == 3 and fused_stats["skipped_steps"] == 0
    assert np.isfinite(fused["rows.loss"]).all() and np.abs(fused["dhead"]).max() > 0
