"""The learner's gradient step as a whole: a float64 reference step, the non-finite guard, determinism,
a learning problem with a known answer, the per-epoch schedule and the fold-boundary pieces.

Replay contents are built by hand and uploaded into a ReplayBuffer. Under the simulator the network
runs its grid-stride dense kernels (bit-equal to the tiled GEMMs at these sizes, tests/agent/
test_network.py); the reference step also runs once with the tiled GEMMs forced.
"""

import itertools
import math

import numpy as np
import pytest
import reference

from fox_numba.actions import N_HEADS, Direction
from fox_numba.agent.learner import Learner
from fox_numba.agent.network import Network, ParamLayout, init_params
from fox_numba.agent.replay import ReplayBuffer
from fox_numba.checkpoint import LayoutMismatchError, load_checkpoint, save_checkpoint
from fox_numba.device.isv import Isv, bootstrap_values
from fox_numba.device.rng import xoroshiro_states_host
from fox_numba.kernels.distributional import expected_q
from fox_numba.kernels.heads import base_support
from fox_numba.kernels.optim import OPTIM_STATE_DTYPE
from plain_learner import plain_config

M, P = 3, 2  # market and portfolio columns of the observation
STRIDE = 4  # transitions per collect step of the test rings (env.n_envs): an environment's next slot is 4 on
SHORT, HOLD, LONG, FLAT = (int(d) for d in Direction)


def tiny_config(batch=6, hidden=4, n_layers=1, n_atoms=5, **learner):
    cfg = plain_config()
    cfg.network.hidden, cfg.network.n_layers, cfg.network.n_atoms = hidden, n_layers, n_atoms
    cfg.learner.batch_size = batch
    cfg.learner.steps_per_epoch = 4
    cfg.learner.epochs = 3
    cfg.run.graphs = True
    cfg.run.diag_every = 1
    cfg.env.n_envs = STRIDE
    for key, value in learner.items():
        setattr(cfg.learner, key, value)
    return cfg


def random_replay(rng, capacity=20, n_bars=12):
    h = {
        "row": rng.integers(0, n_bars, capacity).astype(np.int32),
        "port": rng.standard_normal((capacity, P)).astype(np.float32),
        "action": np.stack([rng.integers(0, 4, capacity)] + [rng.integers(0, 3, capacity) for _ in range(3)],
                           1).astype(np.int32),
        "reward": (0.5 * rng.standard_normal(capacity)).astype(np.float32),
        "done": (rng.random(capacity) < 0.25).astype(np.float32),
        "next_row": rng.integers(0, n_bars, capacity).astype(np.int32),
        "next_port": rng.standard_normal((capacity, P)).astype(np.float32),
        "entry": rng.uniform(4000.0, 6000.0, capacity),
        "meta": np.array([5, capacity - 3], np.int32),  # the last 3 slots are not filled yet
    }
    # every other transition continues into the slot STRIDE on (its next_row is that slot's row), so n-step
    # chains of several lengths run through the ring
    for s in range(0, capacity - STRIDE, 2):
        h["next_row"][s] = h["row"][s + STRIDE]
    return h


def upload_replay(stager, h):
    """A replay buffer holding the host arrays `h` (its portfolio width is theirs)."""
    replay = ReplayBuffer(h["row"].shape[0], stream=stager.stream, n_port=h["port"].shape[1])
    replay.upload(h, stager)
    return replay


def aux_targets(market):
    """Seeded auxiliary targets of the market's rows, every third one NaN (a row without a label)."""
    y = np.random.default_rng(17).standard_normal(market.shape[0]).astype(np.float32)
    y[::3] = np.nan
    return y


def build(stager, stream, cfg, replay_host, market, isv0, seed=0, dense="auto"):
    layout = ParamLayout.build(market.shape[1] + P, cfg.network)
    isv = stager.upload_new(isv0)
    learner = Learner(cfg, layout, upload_replay(stager, replay_host), stager.upload_new(market),
                      stager.upload_new(aux_targets(market)), isv=isv, stager=stager, stream=stream, seed=seed,
                      dense=dense)
    return learner, isv


def host_state(learner):
    return {name: learner.stager.download(arr) for name, arr in learner.state_arrays().items()}


def steps_with_and_without(stager, stream, rng, cfgs):
    """(gradients, kernel names) of one step of a learner of each config in `cfgs`, on the same random replay,
    market and ISV (seed 6): a part's launches and its gradient against the learner without it."""
    replay, market, isv0 = random_replay(rng), rng.standard_normal((12, M)).astype(np.float32), steady_isv(rng)
    grads, names = [], []
    for cfg in cfgs:
        learner, _ = build(stager, stream, cfg, replay, market, isv0, seed=6)
        learner.train_epoch(1)
        grads.append(stager.download(learner.grads))
        names.append([r.kernel.rsplit(".", 1)[1] for r in learner.graph.launches])
    return grads, names


def resumes_through_a_checkpoint(stager, stream, rng, cfg, path, refused_cfg):
    """A learner of `cfg` saved to the checkpoint `path` after one epoch of one step and loaded into a fresh learner
    of the seed continues as the uninterrupted one, bit for bit, and the layout of `refused_cfg` (the same network
    without the part under test) is refused by fingerprint. Returns the uninterrupted learner."""
    replay, market, isv0 = random_replay(rng), rng.standard_normal((12, M)).astype(np.float32), steady_isv(rng)
    a, isv_a = build(stager, stream, cfg, replay, market, isv0, seed=2)
    a.train_epoch(1)
    path = save_checkpoint(path, host_state(a), fingerprints={"params": a.layout.fingerprint})
    saved_isv = stager.download(isv_a)
    a.train_epoch(1)
    b, _ = build(stager, stream, cfg, replay, market, saved_isv, seed=2)
    b.load_state(load_checkpoint(path, expected_fingerprints={"params": b.layout.fingerprint}).arrays)
    b.train_epoch(1)
    for name, arr in host_state(a).items():
        np.testing.assert_array_equal(arr.view(np.uint8), host_state(b)[name].view(np.uint8), name)
    off = ParamLayout.build(M + P, refused_cfg.network)
    with pytest.raises(LayoutMismatchError, match="params layout fingerprint"):
        load_checkpoint(path, expected_fingerprints={"params": off.fingerprint})
    return a


# ---- one whole step against float64 ---------------------------------------------------------------------


def step_reference64(cfg, layout, st, replay, market, isv0, sample=None):
    """The learner's step in float64 from the host state `st` (state_arrays names) and the ISV before the step
    `isv0`; the warm-up factor and CLIP_EFF come from the float64 adaptive-clip producer (reference.py, the
    formulas of device/isv.py's slots) on isv0 and this step's norm. `sample(rng_states, step)` -> (slots, importance
    weights [B]) replaces the uniform draw with weights 1 (prioritised replay, tests/agent/test_priority_learner.py).
    Returns (new state dict, expected ISV slots dict); the new state also holds the step's aux loss, its slots and
    its per-row losses."""
    lc, z, n_layers = cfg.learner, layout.n_atoms, layout.n_layers
    b = lc.batch_size
    st = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in st.items()}
    isv = {}
    # schedule
    rec = st["optim_state"][0]
    step = int(rec["step"]) + 1
    horizon = lc.epochs * lc.steps_per_epoch
    cosine = 0.5 * (1 + math.cos(math.pi * min((step - 1) / horizon, 1.0)))
    def f32(x):  # the config's values as the device holds them
        return float(np.float32(x))

    lr = f32(lc.lr) * (f32(lc.lr_min_frac) + (1 - f32(lc.lr_min_frac)) * cosine)
    drift = min(max(float(isv0[Isv.Q_DRIFT_RATE]), 0.0), 4.0)
    tau = f32(lc.tau) * (f32(lc.tau_min_frac) + (1 - f32(lc.tau_min_frac)) * cosine) / (1 + drift)
    # sample and gather
    if sample is None:
        idx, is_w = reference.sample_indices64(st["rng_states"], int(replay["meta"][1])), np.ones(b)
    else:
        idx, is_w = sample(st["rng_states"], step)
    batch = reference.replay_gather64(replay, idx, stride=cfg.env.n_envs, n_step=lc.n_step, gamma=f32(lc.gamma))
    rows, port = batch["rows"], batch["port"]
    obs = np.concatenate([market[rows], port], axis=1).astype(np.float64)
    actions, rewards, discounts = batch["actions"], batch["rewards"], batch["discounts"]
    # forwards, E[Q], double DQN rows, projection, loss
    p_on, p_tg = layout.unpack(st["params"]), layout.unpack(st["target_params"])
    acts_s, head_s = reference.net_head64(p_on, n_layers, obs[:b])
    logits_s = reference.dueling64(head_s, z)
    _, logits_n = reference.net_forward64(p_on, n_layers, obs[b:], z)
    _, logits_t = reference.net_forward64(p_tg, n_layers, obs[b:], z)
    logits = np.concatenate([logits_s, logits_n])
    sup_on, sup_tg = st["support_online"].astype(np.float64), st["support_target"].astype(np.float64)
    q = reference.expected_q64(logits, np.broadcast_to(sup_on, (2 * b, N_HEADS, 3)))
    rws = reference.double_dqn64(logits, q, logits_t, sup_on, sup_tg, actions, rewards, discounts,
                                 np.asarray(lc.branch_weights, np.float64))
    rws["w"] = rws["w"] * np.repeat(is_w, 4)
    m_proj = reference.project64(rws["p_next"], rws["rew"], rws["disc"], rws["sup_next"], rws["sup_proj"])
    loss = reference.loss64(rws["taken"], m_proj)
    dl_rows = rws["w"][:, None] * (m_proj.sum(1, keepdims=True) * reference.softmax64(rws["taken"]) - m_proj)
    dlogits = np.zeros((b, N_HEADS, z))
    for i in range(b):
        for br, (off, _size) in enumerate(reference.branch_spans()):
            dlogits[i, off + actions[i, br]] = dl_rows[4 * i + br]
    y = aux_targets(market).astype(np.float64)[rows[:b]]
    labelled = np.isfinite(y)
    d_aux = np.where(labelled, head_s[:, -1] - np.nan_to_num(y), 0.0)
    g_named = reference.net_backward64(p_on, n_layers, obs[:b], acts_s, dlogits, f32(lc.aux_weight) * d_aux / b)
    grads = np.zeros(layout.size)
    for e in layout.entries:
        grads[e.offset : e.stop] = g_named[e.name].reshape(-1)
    norm = float(np.sqrt(np.sum(grads**2)))
    # the adaptive clip: factor and CLIP_EFF from the EMAs before this norm, then the EMAs take it
    clip = np.array(isv0, np.float64)
    clip[Isv.GRAD_NORM_RAW] = norm
    reference.adaptive_clip64(clip, f32(lc.clip_ema_mult), lc.warmup_rule)
    clip_eff, factor = float(clip[Isv.CLIP_EFF]), float(clip[Isv.FOLD_WARMUP_FACTOR])
    for slot in (Isv.FOLD_WARMUP_FACTOR, Isv.CLIP_EFF, Isv.CLIP_ENGAGED_EMA, Isv.GRAD_NORM_EMA, Isv.GRAD_NORM_FAST_EMA,
                 Isv.GRAD_NORM_SLOW_EMA, Isv.GRAD_NORM_OBSERVED):
        isv[slot] = float(clip[slot])
    # AdamW, Polyak, commit
    params = st["params"].astype(np.float64)
    m, v = st["adam_m"].astype(np.float64), st["adam_v"].astype(np.float64)
    t = int(rec["adam_t"]) + 1
    u = reference.adamw64(params, m, v, grads, clip_scale=min(1.0, clip_eff / (norm + 1e-12)),
                          lr=lr * max(0.05, factor), t=t, beta1=f32(lc.adam_beta1), beta2=f32(lc.adam_beta2),
                          eps=f32(lc.adam_eps), weight_decay=f32(lc.weight_decay), mask=layout.decay_mask())
    target = st["target_params"].astype(np.float64)
    target += tau * (params - target)
    new = {"params": params, "adam_m": m, "adam_v": v, "target_params": target,
           "support_target": sup_tg + tau * (sup_on - sup_tg), "step": step, "adam_t": t, "lr": lr, "tau": tau,
           "loss_aux": float(np.mean(d_aux[labelled] ** 2) / 2), "idx": idx, "row_loss": loss}
    # ISV producers
    def ema(slot, x, alpha):
        return float(isv0[slot]) + alpha * (x - float(isv0[slot]))

    qs = q[:b]
    top2 = np.sort(qs[:, :4], axis=1)[:, -2:]
    entropy_s = -(reference.softmax64(logits_s) * np.log(reference.softmax64(logits_s))).sum(-1)
    isv[Isv.GRAD_NORM_RAW] = norm
    isv[Isv.Q_DIR_ABS_REF] = ema(Isv.Q_DIR_ABS_REF, np.abs(qs[:, :4]).mean(), 0.05)
    isv[Isv.Q_ABS_REF] = ema(Isv.Q_ABS_REF, np.abs(qs[:, 4:7]).mean(), 0.05)
    isv[Isv.Q_MEAN_EMA] = ema(Isv.Q_MEAN_EMA, qs.mean(), 0.05)
    isv[Isv.Q_STD_EMA] = ema(Isv.Q_STD_EMA, qs.std(), 0.05)
    isv[Isv.Q_MAX_ABS] = np.abs(qs).max()
    isv[Isv.Q_DIR_GAP_EMA] = ema(Isv.Q_DIR_GAP_EMA, (top2[:, 1] - top2[:, 0]).mean(), 0.05)
    isv[Isv.ATOM_ENTROPY_EMA] = ema(Isv.ATOM_ENTROPY_EMA, entropy_s.mean() / math.log(z), 0.05)
    isv[Isv.ATOM_UTIL_EMA] = ema(Isv.ATOM_UTIL_EMA, (reference.softmax64(logits_s) > 1e-3).mean(), 0.05)
    total = float(np.sum(rws["w"] * loss))
    eff = rws["w"] > 0
    isv[Isv.LOSS_RAW] = total
    isv[Isv.LOSS_EMA] = ema(Isv.LOSS_EMA, total, 0.01)
    branch = np.arange(4 * b) % 4
    for br, slot in enumerate([Isv.LOSS_DIR_EMA, Isv.LOSS_MAG_EMA, Isv.LOSS_ORD_EMA, Isv.LOSS_URG_EMA]):
        if (eff & (branch == br)).any():
            isv[slot] = ema(slot, loss[eff & (branch == br)].mean(), 0.01)
    isv[Isv.TD_ABS_EMA] = ema(Isv.TD_ABS_EMA, np.abs(rws["stats"][eff, 0]).mean(), 0.05)
    isv[Isv.TARGET_Q_MEAN_EMA] = ema(Isv.TARGET_Q_MEAN_EMA, rws["stats"][:, 1].mean(), 0.05)
    isv[Isv.TARGET_Q_DRIFT_EMA] = ema(Isv.TARGET_Q_DRIFT_EMA, np.abs(rws["stats"][:, 2]).mean(), 0.05)
    isv[Isv.UPDATE_RMS_EMA] = ema(Isv.UPDATE_RMS_EMA, math.sqrt(np.sum(u**2) / layout.size), 0.01)
    param_norm = float(np.sqrt(np.sum(params**2)))
    isv[Isv.PARAM_NORM] = param_norm
    isv[Isv.TARGET_DRIFT_EMA] = ema(Isv.TARGET_DRIFT_EMA, np.sqrt(np.sum((target - params) ** 2)) / param_norm, 0.05)
    for layer in range(n_layers):
        slot = Isv.HIDDEN_RMS_L0_EMA + layer
        isv[slot] = ema(slot, math.sqrt(np.mean(acts_s[layer] ** 2)), 0.01)
    if n_layers:  # a linear network has no hidden units: the producer is not launched
        dead = sum(int((a == 0).all(axis=0).sum()) for a in acts_s) / (n_layers * layout.hidden)
        isv[Isv.DEAD_UNIT_FRAC_EMA] = ema(Isv.DEAD_UNIT_FRAC_EMA, dead, 0.01)
    return new, isv


def perturbed_start(learner, rng, stager):
    """A mid-training state: Adam moments, t = 3, a target and supports that differ from the online ones."""
    layout, b = learner.layout, learner.batch_size
    st = host_state(learner)
    st["params"] = init_params(layout, 21)
    st["target_params"] = (st["params"] + 0.05 * rng.standard_normal(layout.size) * (st["params"] != 0)).astype(
        np.float32)
    st["adam_m"] = (1e-3 * rng.standard_normal(layout.size)).astype(np.float32)
    st["adam_v"] = (1e-6 * rng.uniform(0.1, 1.0, layout.size)).astype(np.float32)
    rec = np.zeros(1, OPTIM_STATE_DTYPE)
    rec[0] = (4, 3, 0.0, 0.0)
    st["optim_state"] = rec
    st["rng_states"] = xoroshiro_states_host(b, 77)
    st["support_online"] = reference.random_support(rng, (N_HEADS,), layout.n_atoms)
    st["support_target"] = reference.random_support(rng, (N_HEADS,), layout.n_atoms)
    learner.load_state(st)
    return host_state(learner)


def steady_isv(rng):
    """An ISV past the clip producer's bootstrap, with a Q drift and seeded EMAs."""
    isv0 = bootstrap_values()
    isv0[[Isv.GRAD_NORM_EMA, Isv.GRAD_NORM_FAST_EMA, Isv.GRAD_NORM_SLOW_EMA, Isv.GRAD_NORM_OBSERVED]] = (
        0.05, 0.04, 0.06, 500.0)
    isv0[Isv.Q_DRIFT_RATE] = 0.7
    seeded = [Isv.Q_MEAN_EMA, Isv.Q_STD_EMA, Isv.Q_DIR_GAP_EMA, Isv.LOSS_EMA, Isv.LOSS_DIR_EMA, Isv.LOSS_MAG_EMA,
              Isv.LOSS_ORD_EMA, Isv.LOSS_URG_EMA, Isv.TD_ABS_EMA, Isv.UPDATE_RMS_EMA, Isv.TARGET_DRIFT_EMA,
              Isv.HIDDEN_RMS_L0_EMA, Isv.HIDDEN_RMS_L1_EMA, Isv.DEAD_UNIT_FRAC_EMA]
    isv0[seeded] = rng.uniform(0.05, 0.5, len(seeded))
    return isv0


@pytest.mark.parametrize("dense, n_layers, n_step", [("strided", 2, 1), ("tiled", 1, 1), ("tiled", 0, 1),
                                                      ("tiled", 0, 3)])
def test_one_step_equals_a_float64_step(stream, stager, rng, dense, n_layers, n_step):
    """Tolerance: parameters within 2 float32 ulps plus 1e-4 of the step's lr; moments 1e-4 relative plus
    1e-5 of the largest; ISV slots 1e-4 relative plus 1e-6 (float32 chains through two forwards, softmax,
    projection and backward, against float64)."""
    cfg = tiny_config(n_layers=n_layers, weight_decay=0.01, branch_weights=[1.0, 0.5, 2.0, 0.25], tau=0.05,
                      tau_min_frac=0.5, gamma=0.9, aux_weight=0.7, n_step=n_step)
    replay, market = random_replay(rng), rng.standard_normal((12, M)).astype(np.float32)
    isv0 = steady_isv(rng)
    learner, isv = build(stager, stream, cfg, replay, market, isv0, dense=dense)
    start = perturbed_start(learner, rng, stager)
    learner.step()
    got = host_state(learner)
    got_isv = stager.download(isv)
    ref, ref_isv = step_reference64(cfg, learner.layout, start, replay, market, isv0.astype(np.float64))
    # the step runs past the warm-up bootstrap with the clip engaged: factor 0.04 / 0.06, CLIP_EFF below the norm
    assert ref_isv[Isv.FOLD_WARMUP_FACTOR] == pytest.approx(2 / 3, rel=1e-6)
    assert ref_isv[Isv.CLIP_EFF] < ref_isv[Isv.GRAD_NORM_RAW]
    rec = got["optim_state"][0]
    assert (rec["step"], rec["adam_t"]) == (ref["step"], ref["adam_t"])
    assert rec["lr"] == pytest.approx(ref["lr"], rel=1e-6) and rec["tau"] == pytest.approx(ref["tau"], rel=1e-6)
    lr = ref["lr"]
    for name in ("params", "target_params"):
        tol = 2 * np.spacing(np.abs(got[name])).astype(np.float64) + 1e-4 * lr
        assert np.all(np.abs(got[name] - ref[name]) <= tol), name
    for name in ("adam_m", "adam_v"):
        np.testing.assert_allclose(got[name], ref[name], rtol=1e-4, atol=1e-5 * np.abs(ref[name]).max())
    np.testing.assert_allclose(got["support_target"], ref["support_target"], rtol=1e-6, atol=1e-7)
    for slot, want in ref_isv.items():
        assert got_isv[slot] == pytest.approx(want, rel=1e-4, abs=1e-6), Isv(slot).name
    assert got_isv[Isv.NONFINITE_STEPS] == 0
    assert not np.array_equal(got["params"], start["params"])
    stats = learner.epoch_stats()
    assert stats["steps"] == 1 and stats["applied_steps"] == 1
    assert stats["loss"] == pytest.approx(ref_isv[Isv.LOSS_RAW], rel=1e-4)
    assert stats["loss_aux"] == pytest.approx(ref["loss_aux"], rel=1e-4) and ref["loss_aux"] > 0


def _step_kernels(stager, stream, rng, cfg, lanes: bool = False) -> tuple[list[str], dict[str, float]]:
    """The step's kernels as module.kernel, in launch order (with `lanes`: (name, lane) pairs, device/fork.py)."""
    learner, _ = build(stager, stream, cfg, random_replay(rng), rng.standard_normal((12, M)).astype(np.float32),
                       bootstrap_values())
    learner.step()
    names = [r.kernel.rsplit(".", 2)[-2] + "." + r.kernel.rsplit(".", 1)[1] for r in learner.graph.launches]
    if lanes:
        names = list(zip(names, [r.lane for r in learner.graph.launches], strict=True))
    return names, learner.epoch_stats()


def test_the_step_lists_its_kernels_in_order(stream, stager, rng):
    """Per lane: the step stream's chain, the target forward and the loss and Q signals on the learner's side
    stream, the hidden signals on the diagnostics side stream, and every weight gradient on the network's."""
    launched, stats = _step_kernels(stager, stream, rng, tiny_config(aux_weight=0.5), lanes=True)
    lanes = {}
    for name, lane in launched:
        lanes.setdefault(lane, []).append(name)
    main, side = lanes.pop(0), lanes.pop(1)
    assert main[:4] == ["learner.step_schedule", "replay.replay_sample_kernel", "replay.replay_gather_kernel",
                        "env.gather_obs_kernel"]
    order = ["learner.select_q_rows", "learner.project_loss_scatter", "learner.aux_forecast_loss",
             "optim.grad_sq_partials", "optim.grad_norm_finish", "learner.loss_guard", "optim.adaptive_clip_producer",
             "optim.adam_step", "optim.polyak_update", "learner.finish_step"]
    positions = [main.index(k) for k in order]
    assert positions == sorted(positions)
    assert side[-4:] == ["signals.loss_partials", "signals.loss_finish", "signals.q_partials", "signals.q_finish"]
    assert not any(k.startswith("signals.") for k in main)
    hidden = ["signals.hidden_partials", "signals.hidden_finish"]
    (network,) = [v for v in lanes.values() if v != hidden]  # the head's and layer 0's weight gradients
    assert len(lanes) == 2 and all("wgrad" in k for k in network)  # with, on the GPU, their split reductions
    assert len([k for k in network if "reduce" not in k]) == 2
    names = [name for name, _ in launched]
    assert "elementwise.copy_u32" not in names  # nothing copied from the host inside a step
    assert "heads.dueling_combine_bwd" not in names  # project_loss_scatter takes the gradient through the combine
    assert "loss_aux" in stats


def test_the_auxiliary_loss_off_launches_nothing_and_reports_nothing(stream, stager, rng):
    names, stats = _step_kernels(stager, stream, rng, tiny_config(aux_weight=0.0))
    assert "learner.aux_forecast_loss" not in names and "learner.project_loss_scatter" in names
    assert "loss_aux" not in stats


# ---- the non-finite guard -----------------------------------------------------------------------------


def test_a_nan_reward_skips_the_step_bit_for_bit(stream, stager, rng):
    cfg = tiny_config()
    replay, market = random_replay(rng), rng.standard_normal((12, M)).astype(np.float32)
    learner, isv = build(stager, stream, cfg, replay, market, steady_isv(rng))
    learner.step()  # a normal step first, so the moments are not zero
    before = host_state(learner)
    isv_before = stager.download(isv)
    slot = int(reference.sample_indices64(before["rng_states"].copy(), int(replay["meta"][1]))[2])
    replay["reward"][slot] = np.nan  # the slot sample 2 draws next
    stager.upload(replay["reward"], learner.replay.reward)
    learner.epoch_stats()
    learner.step()
    after = host_state(learner)
    isv_after = stager.download(isv)
    for name in ("params", "target_params", "adam_m", "adam_v", "support_target", "support_online"):
        np.testing.assert_array_equal(after[name].view(np.uint8), before[name].view(np.uint8), err_msg=name)
    assert after["optim_state"][0]["adam_t"] == before["optim_state"][0]["adam_t"]
    assert after["optim_state"][0]["step"] == before["optim_state"][0]["step"] + 1  # the schedule's clock runs
    assert isv_after[Isv.NONFINITE_STEPS] == isv_before[Isv.NONFINITE_STEPS] + 1
    assert np.isnan(isv_after[Isv.LOSS_RAW]) and np.isnan(isv_after[Isv.GRAD_NORM_RAW])
    for s in (Isv.GRAD_NORM_EMA, Isv.GRAD_NORM_SLOW_EMA, Isv.GRAD_NORM_OBSERVED, Isv.LOSS_EMA, Isv.TD_ABS_EMA,
              Isv.UPDATE_RMS_EMA, Isv.TARGET_DRIFT_EMA):
        assert isv_after[s] == isv_before[s], Isv(s).name
    stats = learner.epoch_stats()
    assert (stats["steps"], stats["applied_steps"], stats["skipped_steps"]) == (1, 0, 1)


def batch_q_mean64(learner, st, replay, market):
    """The mean E[Q] over the 13 heads of the B rows s the next step samples, in float64 from host state `st`."""
    layout, b = learner.layout, learner.batch_size
    idx = reference.sample_indices64(st["rng_states"].copy(), int(replay["meta"][1]))
    obs = np.concatenate([market[replay["row"][idx]], replay["port"][idx]], axis=1)
    _, logits = reference.net_forward64(layout.unpack(st["params"]), layout.n_layers, obs, layout.n_atoms)
    support = np.broadcast_to(st["support_online"].astype(np.float64), (b, N_HEADS, 3))
    return float(reference.expected_q64(logits, support).mean())


def test_epoch_means_divide_by_their_own_counts(stream, stager, rng):
    """Two steps, the second skipped by the guard (a NaN reward, a finite forward): q_mean is the mean over both
    steps of the batch mean E[Q], the loss and gradient norm are the applied step's alone."""
    replay, market = random_replay(rng), rng.standard_normal((12, M)).astype(np.float32)
    learner, isv = build(stager, stream, tiny_config(), replay, market, steady_isv(rng))
    q_means = [batch_q_mean64(learner, host_state(learner), replay, market)]
    learner.step()
    first = stager.download(isv)
    st = host_state(learner)
    slot = int(reference.sample_indices64(st["rng_states"].copy(), int(replay["meta"][1]))[2])
    replay["reward"][slot] = np.nan  # the slot sample 2 draws next
    stager.upload(replay["reward"], learner.replay.reward)
    q_means.append(batch_q_mean64(learner, st, replay, market))
    learner.step()
    stats = learner.epoch_stats()
    assert (stats["steps"], stats["applied_steps"], stats["skipped_steps"]) == (2, 1, 1)
    assert stats["q_mean"] == pytest.approx(np.mean(q_means), rel=1e-4, abs=1e-6)
    assert stats["loss"] == pytest.approx(first[Isv.LOSS_RAW], rel=1e-6)
    assert stats["grad_norm"] == pytest.approx(first[Isv.GRAD_NORM_RAW], rel=1e-6)


def test_an_empty_replay_skips_steps(stream, stager, rng):
    replay = random_replay(rng)
    replay["meta"][1] = 0
    learner, isv = build(stager, stream, tiny_config(), replay, rng.standard_normal((12, M)).astype(np.float32),
                         bootstrap_values())
    before = stager.download(learner.params)
    learner.step()
    np.testing.assert_array_equal(stager.download(learner.params), before)
    assert stager.download(isv)[Isv.NONFINITE_STEPS] == 1


# ---- determinism ----------------------------------------------------------------------------------------


def test_same_seed_same_numbers(stream, stager, rng):
    """Two learners, same seed and replay: 6 steps give the same bits (here and on the GPU). 6 steps run past
    the schedule's 4-step cosine horizon (2 epochs of 2 steps), so its clamped tail is covered too; a step is a
    function of the state the previous one left, so more steps would only repeat the same kernels."""
    cfg = tiny_config(batch=4, hidden=4, n_atoms=5)
    cfg.learner.steps_per_epoch, cfg.learner.epochs = 2, 2
    replay, market = random_replay(rng), rng.standard_normal((12, M)).astype(np.float32)
    runs = []
    for _ in range(2):
        learner, isv = build(stager, stream, cfg, replay, market, bootstrap_values(), seed=3)
        learner.train_epoch(6)
        runs.append((host_state(learner), stager.download(isv)))
    for name in runs[0][0]:
        np.testing.assert_array_equal(runs[0][0][name].view(np.uint8), runs[1][0][name].view(np.uint8), name)
    np.testing.assert_array_equal(runs[0][1].view(np.uint32), runs[1][1].view(np.uint32))
    assert runs[0][0]["optim_state"][0]["step"] == 6
    other, _ = build(stager, stream, cfg, replay, market, bootstrap_values(), seed=4)
    assert not np.array_equal(stager.download(other.params), runs[0][0]["params"])


@pytest.mark.gpu_only("graph capture exists only on the GPU")
def test_graph_replays_equal_eager_steps(stream, stager, rng):
    replay, market = random_replay(rng), rng.standard_normal((12, M)).astype(np.float32)
    results = []
    for graphs in (True, False):
        cfg = tiny_config()
        cfg.run.graphs = graphs
        learner, isv = build(stager, stream, cfg, replay, market, bootstrap_values(), seed=1)
        learner.train_epoch(20)
        assert learner.graph.mode == ("graph" if graphs else "eager")
        results.append((stager.download(learner.params), stager.download(isv)))
    np.testing.assert_array_equal(results[0][0].view(np.uint32), results[1][0].view(np.uint32))
    np.testing.assert_array_equal(results[0][1].view(np.uint32), results[1][1].view(np.uint32))


# ---- a learning problem with a known answer -------------------------------------------------------------


def bandit_replay():
    """Every combination of the sign feature x and a designed set of actions, one-step (done = 1).

    reward = 0.5 * x for Long, -0.5 * x for Short, 0 for Hold and Flat. The actions are chosen so every
    (x, head) pair has one reward value wherever its branch had an effect, so each head's E[Q] has an
    exact answer (and a wrong effect mask would mix in other rewards):
      Long:  magnitude 0 or 2, MARKET, any urgency (no effect: market order)
      Short: magnitude 1, LIMIT_JOIN, urgency 0
      Flat:  magnitude 0 (no effect), LIMIT_IMPROVE, urgency 1 or 2
      Hold:  magnitude 0, any order type and urgency (no effect)
    """
    combos = []
    for x in (0, 1):
        combos += [(x, LONG, m, 0, u) for m in (0, 2) for u in range(3)]
        combos += [(x, SHORT, 1, 1, 0)] * 3
        combos += [(x, FLAT, 0, 2, u) for u in (1, 2)] * 2
        combos += [(x, HOLD, 0, o, u) for o, u in itertools.product(range(3), range(3))]
    rows = np.array([c[0] for c in combos], np.int32)
    actions = np.array([c[1:] for c in combos], np.int32)
    sign = np.where(actions[:, 0] == LONG, 1.0, np.where(actions[:, 0] == SHORT, -1.0, 0.0))
    reward = (0.5 * sign * np.where(rows == 1, 1.0, -1.0)).astype(np.float32)
    c = len(combos)
    return {"row": rows, "port": np.zeros((c, 1), np.float32), "action": actions, "reward": reward,
            "done": np.ones(c, np.float32), "next_row": rows, "next_port": np.zeros((c, 1), np.float32),
            "entry": np.zeros(c), "meta": np.array([0, c], np.int32)}


def bandit_answer():
    """E[Q] [x = -1, x = +1][13 heads] of the designed bandit."""
    per_x = []
    for x in (-1.0, 1.0):
        long_, short = 0.5 * x, -0.5 * x
        per_x.append([short, 0.0, long_, 0.0,  # direction: Short, Hold, Long, Flat
                      long_, short, long_,  # magnitude 0, 1, 2 (Long, Short, Long)
                      long_, short, 0.0,  # order type: MARKET (Long), JOIN (Short), IMPROVE (Flat)
                      short, 0.0, 0.0])  # urgency 0 (Short), 1 and 2 (Flat); MARKET's urgency has no effect
    return np.array(per_x)


def test_learns_a_contextual_bandit(stream, stager):
    """The best direction flips with the sign of one feature; after 25 steps of 8 samples every head's E[Q]
    is within 0.05 of its exact value (a quarter of the 0.2 between atoms; 0.015 at this seed, 0.023, 0.100
    and 0.059 at learner seeds 1-3, where 20 steps at lr 0.08 reached 0.041-0.237 and the 35 at lr 0.05 this
    test took before 0.015-0.053) and every branch's argmax is right where the answer has one, at every seed
    tried. It cannot pass unlearned: an untrained network's E[Q] is about 0 on every head, 0.5 from the Long
    and Short answers."""
    cfg = plain_config()
    cfg.network.hidden, cfg.network.n_layers, cfg.network.n_atoms = 8, 1, 11
    cfg.network.support_max_scale = 1.0
    cfg.learner.batch_size, cfg.learner.lr, cfg.learner.lr_min_frac = 8, 0.07, 0.05
    cfg.learner.epochs, cfg.learner.steps_per_epoch = 1, 25
    cfg.run.diag_every = 1000
    cfg.env.n_envs = 1  # a bandit: every transition is done, no chain to follow
    market = np.array([[-1.0], [1.0]], np.float32)
    replay = bandit_replay()
    layout = ParamLayout.build(2, cfg.network)
    learner = Learner(cfg, layout, upload_replay(stager, replay), stager.upload_new(market),
                      stager.upload_new(aux_targets(market)), isv=stager.upload_new(bootstrap_values()), stager=stager,
                      stream=stream, seed=0)
    learner.train_epoch()
    net = Network(layout, 2, stream=stream)
    logits = stager.upload_new(np.zeros((2, N_HEADS, 11), np.float32))
    q, entropy = (stager.upload_new(np.zeros((2, N_HEADS), np.float32)) for _ in range(2))
    net.forward(learner.params, stager.upload_new(np.array([[-1.0, 0.0], [1.0, 0.0]], np.float32)), logits,
                stream=stream)
    expected_q(logits, stager.upload_new(np.broadcast_to(base_support(-1.0, 1.0, 11), (2, N_HEADS, 3)).copy()), q,
               entropy, stream=stream)
    got, want = stager.download(q), bandit_answer()
    assert np.abs(got - want).max() < 0.05, np.round(got - want, 3)
    for off, size in reference.branch_spans():
        best = want[:, off : off + size].argmax(axis=1)
        unique = (np.sort(want[:, off : off + size], axis=1)[:, -1] > np.sort(want[:, off : off + size], axis=1)[:, -2])
        assert np.array_equal(got[:, off : off + size].argmax(axis=1)[unique], best[unique])
    stats = learner.epoch_stats()
    assert stats["applied_steps"] == 25 and stats["skipped_steps"] == 0


# ---- per epoch and per fold -----------------------------------------------------------------------------


@pytest.mark.parametrize("lr_scale", [1.0, 0.25])
def test_epoch_schedule_and_stats(stream, stager, rng, lr_scale):
    """The cosine schedule of the step's learning rate, times the fold's factor (lr_scale: the trainer writes
    learner.refit_lr_scale there after the first fold), and the epoch's stats."""
    cfg = tiny_config(lr=1e-3, lr_min_frac=0.2)
    learner, _ = build(stager, stream, cfg, random_replay(rng), rng.standard_normal((12, M)).astype(np.float32),
                       bootstrap_values())
    learner.lr_scale = lr_scale
    learner.train_epoch()
    assert not learner.schedule.pending
    rec = learner.read_optim_state()
    horizon = cfg.learner.epochs * cfg.learner.steps_per_epoch
    cosine = 0.5 * (1 + math.cos(math.pi * 3 / horizon))
    assert rec["step"] == 4 and rec["adam_t"] == 4
    assert rec["lr"] == pytest.approx(lr_scale * 1e-3 * (0.2 + 0.8 * cosine), rel=1e-6)
    stats = learner.epoch_stats()
    assert stats["steps"] == 4 and stats["applied_steps"] == 4 and stats["grad_norm"] > 0
    assert all(np.isfinite(v) for v in stats.values())
    assert learner.epoch_stats()["steps"] == 0  # the sums restart after a read


@pytest.mark.parametrize("keep", [0.8, 0.0])
def test_fold_boundary_pieces(stream, stager, rng, keep):
    cfg = tiny_config(fold_keep=keep)
    learner, _ = build(stager, stream, cfg, random_replay(rng), rng.standard_normal((12, M)).astype(np.float32),
                       bootstrap_values())
    learner.train_epoch(3)
    before = host_state(learner)
    learner.shrink_perturb(seed=99)
    fresh = init_params(learner.layout, 99).astype(np.float64)
    np.testing.assert_allclose(stager.download(learner.params), keep * before["params"] + (1 - keep) * fresh,
                               rtol=1e-6, atol=1e-7)
    learner.sync_target()
    np.testing.assert_array_equal(stager.download(learner.target), stager.download(learner.params))
    np.testing.assert_array_equal(stager.download(learner.support_target), stager.download(learner.support_online))
    learner.shrink_adam()
    np.testing.assert_array_equal(stager.download(learner.adam_m), (before["adam_m"] * np.float32(0.1)))
    np.testing.assert_array_equal(stager.download(learner.adam_v), (before["adam_v"] * np.float32(0.01)))
    learner.reset_step_counter()
    rec = learner.read_optim_state()
    assert (rec["step"], rec["adam_t"]) == (0, 0)
    learner.train_epoch(1)
    assert learner.read_optim_state()["adam_t"] == 1


def test_support_refresh_from_the_isv(stream, stager, rng):
    cfg = tiny_config()
    cfg.network.support_max_scale = 4.0
    isv0 = bootstrap_values()
    isv0[[Isv.Q_ABS_REF, Isv.Q_DIR_ABS_REF]] = (0.5, 0.1)
    learner, _ = build(stager, stream, cfg, random_replay(rng), rng.standard_normal((12, M)).astype(np.float32), isv0)
    learner.refresh_supports()
    got = stager.download(learner.support_online)
    np.testing.assert_allclose(got[:4, 1], 1.0)  # direction: 3 * 0.1 is under the base support's half-width
    np.testing.assert_allclose(got[4:, 1], 1.5, rtol=1e-6)  # others: 3 * 0.5
    np.testing.assert_array_equal(stager.download(learner.support_target)[:, 1], 1.0)  # follows by Polyak


def test_state_round_trip_resumes_bit_for_bit(stream, stager, rng):
    cfg = tiny_config()
    replay, market = random_replay(rng), rng.standard_normal((12, M)).astype(np.float32)
    a, isv_a = build(stager, stream, cfg, replay, market, bootstrap_values(), seed=2)
    a.train_epoch(2)
    saved, saved_isv = host_state(a), stager.download(isv_a)
    a.train_epoch(2)
    b, _isv_b = build(stager, stream, cfg, replay, market, saved_isv, seed=9)
    b.load_state(saved)
    b.train_epoch(2)
    for name, arr in host_state(a).items():
        np.testing.assert_array_equal(arr.view(np.uint8), host_state(b)[name].view(np.uint8), name)


def test_constructor_checks(stream, stager, rng):
    replay, market = random_replay(rng), rng.standard_normal((12, M + 1)).astype(np.float32)
    cfg = tiny_config()
    layout = ParamLayout.build(M + P, cfg.network)
    with pytest.raises(ValueError, match="obs_dim"):
        Learner(cfg, layout, upload_replay(stager, replay), stager.upload_new(market),
                stager.upload_new(aux_targets(market)), isv=stager.upload_new(bootstrap_values()), stager=stager,
                stream=stream)
    with pytest.raises(ValueError, match="aux_target"):
        Learner(cfg, layout, upload_replay(stager, replay), stager.upload_new(market[:, :M]),
                stager.upload_new(aux_targets(market)[:5]), isv=stager.upload_new(bootstrap_values()), stager=stager,
                stream=stream)
    with pytest.raises(ValueError, match="branch_weights"):
        build(stager, stream, tiny_config(branch_weights=[1.0, 1.0]), replay, market[:, :M], bootstrap_values())
    for keep in (-0.1, 1.5):
        with pytest.raises(ValueError, match="fold_keep"):
            build(stager, stream, tiny_config(fold_keep=keep), replay, market[:, :M], bootstrap_values())
    cfg = tiny_config()
    cfg.network.head_init_scale = -0.5
    with pytest.raises(ValueError, match="head_init_scale"):
        build(stager, stream, cfg, replay, market[:, :M], bootstrap_values())


def test_observation_noise_enters_the_step_only_when_asked(stream, stager, rng):
    """learner.obs_noise > 0 launches the noise kernel after the observation gather (kernel tested against
    float64 in tests/kernels/test_learner_kernels.py) and changes the step; 0 launches nothing extra."""
    replay, market = random_replay(rng), rng.standard_normal((12, M)).astype(np.float32)
    params = {}
    for sigma in (0.0, 0.5):
        learner, _ = build(stager, stream, tiny_config(obs_noise=sigma), replay, market, bootstrap_values(), seed=2)
        learner.step()
        names = [r.kernel.rsplit(".", 1)[1] for r in learner.graph.launches]
        assert ("obs_noise_kernel" in names) == (sigma > 0)
        if sigma > 0:
            assert names.index("obs_noise_kernel") == names.index("gather_obs_kernel") + 1
        params[sigma] = stager.download(learner.params)
        assert np.isfinite(params[sigma]).all()
    assert not np.array_equal(params[0.0], params[0.5])


def test_the_evaluated_network_names_learner_state(stream, stager, rng):
    """evaluation.network picks arrays the learner checkpoints: the online ones, the target's or the average's."""
    from fox_numba.agent.evaluator import EVAL_NETWORKS, eval_network
    from fox_numba.errors import ConfigError

    learner, _ = build(stager, stream, tiny_config(), random_replay(rng), rng.standard_normal((12, M)).astype(
        np.float32), bootstrap_values())
    state = learner.state_arrays()
    for name, arrays in (("online", (learner.params, learner.support_online)),
                         ("target", (learner.target, learner.support_target)),
                         ("average", (learner.average, learner.support_average))):
        assert all(state[n] is a for n, a in zip(eval_network(name), arrays, strict=True)), name
    assert set(EVAL_NETWORKS) == {"online", "target", "average"}
    with pytest.raises(ConfigError, match="evaluation.network is 'best'; choose one of 'online', 'target', 'average'"):
        eval_network("best")


def test_dropout_runs_in_the_online_network_only(stream, stager, rng):
    """learner.dropout 0.3: one mask launch per hidden layer in the online forward (none in the target's), one
    gradient scale per hidden layer in the backward; without it, neither; the step stays finite."""
    launched, stats = _step_kernels(stager, stream, rng, tiny_config(n_layers=2, dropout=0.3), lanes=True)
    names = [name for name, _ in launched]
    assert names.count("dropout.dropout_kernel") == 2 and names.count("elementwise.scale_f32") == 2
    forward = ("dense_strided.dense_fwd", "gemm.linear_fwd")  # the simulator's dense kernel, the GPU's GEMMs
    main = [n for n, lane in launched if lane == 0]  # the target's forward runs on a side stream (lane 1)
    dense = [i for i, n in enumerate(main) if n.startswith(forward)]  # the online network's 3 layers
    drops = [i for i, n in enumerate(main) if n == "dropout.dropout_kernel"]
    assert len(dense) == 3 and dense[0] < drops[0] < dense[1] < drops[1] < dense[2]
    assert sum(n.startswith(forward) for n, lane in launched if lane == 1) == 3  # the target's: no mask
    assert np.isfinite(stats["loss"]) and stats["applied_steps"] == 1
    plain, _ = _step_kernels(stager, stream, rng, tiny_config(n_layers=2))
    assert "dropout.dropout_kernel" not in plain and "elementwise.scale_f32" not in plain


def test_the_weight_average_is_the_mean_of_the_epoch_end_networks(stream, stager, rng):
    """Four epochs of two steps with evaluation.average_start = 1: after epoch 0 the average is the network, after
    epoch e >= 1 it is the float64 mean of the epoch-end networks of epochs 1..e (parameters and supports alike;
    rtol 1e-6 and 1e-7 of the largest parameter: a float32 running mean of <= 3 terms). The fold reset's
    restart_average copies the network exactly."""
    cfg = tiny_config(steps_per_epoch=2)
    cfg.evaluation.average_start = 1
    learner, _ = build(stager, stream, cfg, random_replay(rng), rng.standard_normal((12, M)).astype(np.float32),
                       steady_isv(rng))
    seen = []
    for epoch in range(4):
        learner.train_epoch(2)
        st = host_state(learner)
        st["support_online"] = st["support_online"] * (1.0 + 0.1 * epoch)  # supports that move between epochs
        stager.upload(st["support_online"].astype(np.float32), learner.support_online)
        learner.average_epoch(epoch)
        seen.append({k: st[k].astype(np.float64) for k in ("params", "support_online")})
        got = host_state(learner)
        window = seen[1:] if epoch >= 1 else seen[-1:]
        for name, avg in (("params", "average_params"), ("support_online", "support_average")):
            want = np.mean([s[name] for s in window], axis=0)
            np.testing.assert_allclose(got[avg], want, rtol=1e-6, atol=1e-7 * np.abs(want).max(), err_msg=avg)
    assert not np.allclose(seen[1]["params"], seen[3]["params"])  # the networks moved: the mean is not one of them
    learner.restart_average()
    got = host_state(learner)
    np.testing.assert_array_equal(got["average_params"], got["params"])
    np.testing.assert_array_equal(got["support_average"], got["support_online"])
