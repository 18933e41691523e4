"""The learner's step kernels against float64 references on small seeded inputs, every output checked.
(The replay sample and gather the step starts with: tests/env/test_replay.py; its observation gather:
tests/env/test_gather_and_actions.py.)

Tolerances: the schedule and the commit are a few float32 operations on each value (1e-6 relative);
the greedy bins, supports, rewards, weights and the gradient scatter are exact;
the target softmax and the row statistics are Z-term float32 sums (1e-5 relative plus 1e-6 absolute);
the auxiliary gradient is two float32 operations per row (1e-6 relative), its loss the float64 mean of squared
float32 differences (2e-7 relative); the observation noise float32 log, sqrt and cosine (1e-5 relative).
"""

import math

import numpy as np
import pytest
import reference

from fox_numba.actions import FLAT, HOLD, N_HEADS, OrderType
from fox_numba.device.control import ControlBlock
from fox_numba.device.isv import Isv, bootstrap_values
from fox_numba.device.memory import device_empty
from fox_numba.device.rng import xoroshiro_states_host
from fox_numba.kernels.distributional import UTIL_THRESHOLD
from fox_numba.kernels.heads import aux_column, head_width
from fox_numba.kernels.learner import (
    MAX_ATOMS,
    SCHEDULE_DTYPE,
    BranchRows,
    add_obs_noise,
    aux_loss,
    branch_loss,
    finish,
    guard_loss,
    reset_counters,
    schedule_step,
    select_rows,
    select_samples,
    shrink_perturb,
)
from fox_numba.kernels.optim import OPTIM_STATE_DTYPE, norm_partials_len, partials_used
from fox_numba.kernels.signals import N_EPOCH_STATS, EpochStat

pytestmark = pytest.mark.usefixtures("long_switch_interval")


def state_record(step=0, adam_t=0, lr=0.0, tau=0.0):
    rec = np.zeros(1, OPTIM_STATE_DTYPE)
    rec[0] = (step, adam_t, lr, tau)
    return rec


def test_step_schedule(stream, stager):
    sched = ControlBlock(SCHEDULE_DTYPE)
    sched.set(lr_base=np.float32(1e-3), lr_min_frac=np.float32(0.1), tau_base=np.float32(0.01),
              tau_min_frac=np.float32(0.5), horizon=10)
    sched.upload(stream)
    state = stager.upload_new(state_record(adam_t=4))
    isv0 = bootstrap_values()
    isv = stager.upload_new(isv0)
    drifts = [0.0, 2.0, 10.0, np.nan, -1.0, 0.5] * 2
    for k, drift in enumerate(drifts, start=1):
        isv0[Isv.Q_DRIFT_RATE] = drift
        stager.upload(isv0, isv)
        schedule_step(sched.device, state, isv, stream=stream)
        got = stager.download(state)[0]
        cosine = 0.5 * (1 + math.cos(math.pi * min((k - 1) / 10, 1.0)))
        damp = 1 + (min(drift, 4.0) if drift > 0 else 0.0)
        assert got["step"] == k and got["adam_t"] == 4
        assert got["lr"] == pytest.approx(1e-3 * (0.1 + 0.9 * cosine), rel=1e-6)
        assert got["tau"] == pytest.approx(0.01 * (0.5 + 0.5 * cosine) / damp, rel=1e-6)
        assert 0.01 * 0.5 / 5 * (1 - 1e-6) <= got["tau"] <= 0.01
    sched.set(horizon=0)  # no horizon: no decay
    sched.upload(stream)
    schedule_step(sched.device, state, isv, stream=stream)
    assert stager.download(state)[0]["lr"] == np.float32(1e-3)


def heads(rng, rows, z):
    """Random head GEMM outputs [rows, head_width(Z)] (value and advantage streams, the forecast column) and their
    logits [rows, 13, Z] as the kernels form them (reference.dueling32, bit for bit)."""
    head = (2 * rng.standard_normal((rows, head_width(z)))).astype(np.float32)
    return head, reference.dueling32(head, z)


def select_inputs(rng, b, z):
    """Online head outputs [2B, head_width(Z)] (s, then s') and target ones [B, ...] with their logits, supports,
    actions hitting every effect rule, n-step rewards and discounts; the first B / 3 rows of s have zero advantages
    and sorted values, so their logits rise at every atom (the running max does too); the magnitude bins of s' row 1
    tie (equal advantages and supports: the lowest wins)."""
    head, _ = heads(rng, 2 * b, z)
    values = [off + br for br, (off, _) in enumerate(reference.branch_spans())]  # value streams (kernels/heads.py)
    for s in range(4 + N_HEADS):  # the advantage streams zero, the values sorted
        block = head[: b // 3, s * z : (s + 1) * z]
        block[:] = np.sort(block, axis=-1) if s in values else 0.0
    for a in (5, 6):  # magnitude bins 1 and 2 of s' row 1 as bin 0 (head 4; advantage stream a + 2)
        head[b + 1, (a + 2) * z : (a + 3) * z] = head[b + 1, 6 * z : 7 * z]
    logits = reference.dueling32(head, z)
    head_tgt, logits_tgt = heads(rng, b, z)
    sup_on = reference.random_support(rng, (N_HEADS,), z)
    sup_tg = reference.random_support(rng, (N_HEADS,), z)
    sup_on[5:7] = sup_on[4]
    actions = np.stack([rng.integers(0, 4, b), rng.integers(0, 3, b), rng.integers(0, 3, b),
                        rng.integers(0, 3, b)], 1).astype(np.int32)
    actions[:4, 0] = [HOLD, FLAT, 0, 2]  # every effect rule shows up
    actions[2:4, 2] = [int(OrderType.MARKET), 1]
    rewards = rng.standard_normal(b).astype(np.float32)
    # the gather's n-step discounts gamma**k * (1 - done): terminal rows 0, the others 0.9 ** k, k in 1..3
    discounts = np.where(np.arange(b) % 3 == 0, 0.0, 0.9 ** rng.integers(1, 4, b)).astype(np.float32)
    return head, head_tgt, logits, logits_tgt, sup_on, sup_tg, actions, rewards, discounts


@pytest.mark.parametrize("bootstrap", ["direction", "branch"])
def test_select_q_rows(stream, stager, rng, bootstrap):
    """B = 10 samples (2 blocks of 8, the second part-filled), Z = 6. Against float64: q of s and s' and the
    entropy of s within test_distributional_kernels.py's bounds, util = the float64 fraction of atoms with p > 1e-3
    (an atom within rounding of the threshold may count either way); the rows against the float64 double DQN rows
    (reference.double_dqn64) on the kernel's own q (its greedy bins follow the float32 E[Q]): a*, rewards, weights
    exact, the target softmax's max exact and its sum exp(x - max) and the row statistics 1e-5 relative plus
    1e-6."""
    b, z = 10, 6
    head, head_tgt, logits, logits_tgt, sup_on, sup_tg, actions, rewards, discounts = select_inputs(rng, b, z)
    assert (np.diff(logits[: b // 3], axis=-1) > 0).all() and (logits[b + 1, 5:7] == logits[b + 1, 4]).all()
    branch_w = np.array([1.0, 0.5, 2.0, 0.25], np.float32)
    rows = BranchRows(b, z)
    q, entropy, util = (stager.upload_new(np.full(shape, np.nan, np.float32))
                        for shape in ((2 * b, N_HEADS), (b, N_HEADS), (b, N_HEADS)))
    select_rows(*(stager.upload_new(a) for a in (head, head_tgt, sup_on, sup_tg, actions, rewards, discounts,
                                                  branch_w)), q, entropy, util, rows, stream=stream,
                bootstrap=bootstrap)
    eps = 2.0**-24
    sup_rows = np.broadcast_to(sup_on, (2 * b, N_HEADS, 3))
    p, atoms = reference.softmax64(logits), reference.atoms64(sup_rows, z)
    got_q = stager.download(q)
    q_tol = 4 * (z + 2) * eps * np.abs(atoms).max(axis=-1)
    assert np.all(np.abs(got_q - (p * atoms).sum(axis=-1)) <= q_tol)
    spread = (logits.max(axis=-1) - logits.min(axis=-1)).astype(np.float64)[:b]
    h_ref = -(p[:b] * np.log(p[:b])).sum(axis=-1)
    assert np.all(np.abs(stager.download(entropy) - h_ref) <= 4 * (z + 2) * eps * (1 + spread))
    band = 4 * (z + 2) * eps * float(UTIL_THRESHOLD)
    lo, hi = ((p[:b] > float(UTIL_THRESHOLD) + sign * band).sum(axis=-1) for sign in (1, -1))
    used = stager.download(util) * z
    assert np.all((lo <= np.rint(used)) & (np.rint(used) <= hi)) and np.allclose(used, np.rint(used))
    assert len(np.unique(lo)) > 1

    ref = reference.double_dqn64(logits, got_q.astype(np.float64), logits_tgt, sup_on, sup_tg, actions, rewards,
                                 discounts, branch_w, bootstrap)
    other = reference.double_dqn64(logits, got_q.astype(np.float64), logits_tgt, sup_on, sup_tg, actions, rewards,
                                   discounts, branch_w, "branch" if bootstrap == "direction" else "direction")
    assert not np.array_equal(ref["a_n"], other["a_n"])  # the two rules differ on these inputs
    if bootstrap == "direction":  # every branch of a sample bootstraps from one head: the same row four times
        heads = ref["a_n"].reshape(b, 4)
        np.testing.assert_array_equal(heads, np.repeat(heads[:, :1], 4, axis=1))
    else:
        assert got_q[b + 1, 4] == got_q[b + 1, 5] == got_q[b + 1, 6]
        assert stager.download(rows.next_head)[4 * 1 + 1] == 4  # the tie goes to the lowest bin
    np.testing.assert_array_equal(stager.download(rows.next_head), ref["a_n"])
    np.testing.assert_array_equal(stager.download(rows.rewards), ref["rew"])
    np.testing.assert_allclose(stager.download(rows.discounts), ref["disc"], rtol=1e-7)
    np.testing.assert_allclose(stager.download(rows.weights), ref["w"], rtol=1e-7)
    x_next = logits_tgt[np.repeat(np.arange(b), 4), ref["a_n"].astype(int)].astype(np.float64)
    next_stats = stager.download(rows.next_stats)
    np.testing.assert_array_equal(next_stats[:, 0], x_next.max(axis=1))
    np.testing.assert_allclose(next_stats[:, 1], np.exp(x_next - x_next.max(axis=1, keepdims=True)).sum(axis=1),
                               rtol=1e-5)
    np.testing.assert_allclose(stager.download(rows.stats), ref["stats"], rtol=1e-5, atol=1e-6)
    w = stager.download(rows.weights).reshape(b, 4)
    assert w[0, 1] == 0 and w[0, 2] == 0 and w[0, 3] == 0  # Hold: magnitude, order type, urgency
    assert w[1, 1] == 0 and w[1, 2] > 0  # Flat: magnitude only
    assert w[2, 3] == 0 and w[3, 3] > 0  # urgency of a market order


@pytest.mark.parametrize("b", [10, 40])
@pytest.mark.parametrize("bootstrap", ["direction", "branch"])
def test_select_q_rows_direction_alone(stream, stager, rng, bootstrap, b):
    """live = 1 (the default network: the head columns past the direction branch's five streams 0, the other
    branches' rows of weight 0): B = 10 or 40 samples, Z = 6 (the whole kernel's blocks of 8; the compact
    direction-only kernel's of 26: one part-filled block, then a whole one and a part-filled one). Every output of
    the direction-only kernel (q of s and s', entropy, util, and every row: a*, the target softmax's max and sum,
    rewards, discounts, weights, row statistics) is the whole kernel's, bit for bit: the other heads' statistics
    come from zero_row_stats, the same code on the same zero logits, and each live row's from the same code on the
    same staged values, whatever block and thread take it."""
    z = 6
    assert select_samples(z, 1) == 26 and select_samples(z, 4) == 8
    head, head_tgt, _, _, sup_on, sup_tg, actions, rewards, discounts = select_inputs(rng, b, z)
    for arr in (head, head_tgt):
        arr[:, 5 * z :] = 0.0  # past the direction branch's value and four advantage streams
    branch_w = np.array([1.0, 0.0, 0.0, 0.0], np.float32)
    got = []
    for live in (4, 1):
        rows = BranchRows(b, z)
        q, entropy, util = (stager.upload_new(np.full(shape, np.nan, np.float32))
                            for shape in ((2 * b, N_HEADS), (b, N_HEADS), (b, N_HEADS)))
        select_rows(*(stager.upload_new(a) for a in (head, head_tgt, sup_on, sup_tg, actions, rewards, discounts,
                                                      branch_w)), q, entropy, util, rows, stream=stream,
                    bootstrap=bootstrap, live=live)
        got.append([stager.download(a) for a in (q, entropy, util, rows.next_head, rows.next_stats, rows.rewards,
                                                 rows.discounts, rows.weights, rows.stats)])
    for name, whole, alone in zip(("q", "entropy", "util", "next_head", "next_stats", "rewards", "discounts",
                                   "weights", "stats"), *got, strict=True):
        np.testing.assert_array_equal(alone.view(np.uint32), whole.view(np.uint32), err_msg=name)
    assert np.isfinite(got[0][0]).all() and len(np.unique(got[0][0][:, 4:])) < len(np.unique(got[0][0][:, :4]))


def loss_inputs(rng, b, z):
    """project_loss_scatter's inputs for B = b samples: head GEMM outputs (online [2B], target [B]) and the online
    logits, actions, supports, the rows as select_rows leaves them (a*, its target softmax's max and sum, seeded
    rewards, discounts with some terminal rows, weights), then p_next and the target softmax stats."""
    r = 4 * b
    head, logits = heads(rng, 2 * b, z)
    head_tgt, logits_tgt = heads(rng, b, z)
    actions = np.stack([rng.integers(0, 4, b)] + [rng.integers(0, 3, b) for _ in range(3)], 1).astype(np.int32)
    sup_on = reference.random_support(rng, (N_HEADS,), z)
    sup_tg = reference.random_support(rng, (N_HEADS,), z)
    next_head = np.array([rng.integers(off, off + size) for _ in range(b) for off, size in reference.branch_spans()],
                         np.int32)
    x_next = logits_tgt[np.repeat(np.arange(b), 4), next_head]
    mx = x_next.max(axis=1)
    next_stats = np.stack([mx, np.exp(x_next - mx[:, None]).sum(axis=1, dtype=np.float32)], 1).astype(np.float32)
    rewards = rng.standard_normal(r).astype(np.float32)
    discounts = np.where(np.arange(r) % 5 == 0, 0.0, 0.9).astype(np.float32)
    weights = (rng.uniform(0.2, 2.0, r) / b).astype(np.float32)
    return (head, head_tgt, logits, actions, sup_on, sup_tg, next_head, rewards, discounts, weights,
            reference.softmax64(x_next), next_stats)


def run_loss(stager, stream, inputs, rows, dhead, live=4):
    """branch_loss on `loss_inputs`' arrays into rows.loss and dhead."""
    head, head_tgt, _, actions, sup_on, sup_tg, next_head, rewards, discounts, weights, _, next_stats = inputs
    for name, value in (("next_stats", next_stats), ("rewards", rewards), ("discounts", discounts),
                        ("weights", weights), ("next_head", next_head)):
        stager.upload(value, getattr(rows, name))
    branch_loss(stager.upload_new(head), stager.upload_new(head_tgt), rows, stager.upload_new(actions),
                stager.upload_new(sup_on), stager.upload_new(sup_tg), dhead, stream=stream, live=live)


def test_project_loss_scatter(stream, stager, rng):
    """B = 18 samples (72 rows: blocks of 64 and 8 rows), Z = 6, rows as select_rows leaves them (a* and its target
    softmax's max and sum, rewards, discounts, weights seeded; some rows terminal); row 5's reward NaN. The
    gradient g at the taken heads, weight * (sum(m) softmax - m) of the float64 projection m (reference.project64
    of p_next = softmax(target logits[a*]) from support_target[a*] onto support_online[a_t]), 0 on the branches'
    other heads, leaves through the dueling combine's backward into dhead [B, head_width(Z)], every element: the
    value stream of each branch row is g itself (a sum of g and zeros), checked against the reference with
    c51_loss's bounds (test_distributional_kernels.py) plus what m's error (8 Z eps per atom and in its mass)
    adds; each advantage stream is exactly the float32 g[a] - g / size that dueling_combine_bwd computes; the
    forecast column is not written. The loss -sum m log softmax of the online logits of s. The NaN row is NaN in
    its loss and its branch's streams and nowhere else."""
    b, z = 18, 6
    r = 4 * b
    eps = 2.0**-24
    inputs = loss_inputs(rng, b, z)
    head, head_tgt, logits, actions, sup_on, sup_tg, next_head, rewards, discounts, weights, p_next = inputs[:11]
    rewards[5] = np.nan
    rows = BranchRows(b, z)
    dhead = stager.upload_new(np.full((b, head_width(z)), np.nan, np.float32))
    run_loss(stager, stream, inputs, rows, dhead)
    spans = reference.branch_spans()
    taken_head = np.array([off + actions[i, br] for i in range(b) for br, (off, _) in enumerate(spans)])
    taken = logits[np.repeat(np.arange(b), 4), taken_head]  # the online logits of s at the taken heads
    good = ~np.isnan(rewards)
    m = np.zeros((r, z))
    m[good] = reference.project64(p_next[good], rewards[good], discounts[good],
                                  sup_tg[next_head[good]], sup_on[taken_head[good]])
    grad_ref = weights.astype(np.float64)[:, None] * (m.sum(axis=1, keepdims=True) * reference.softmax64(taken) - m)
    got_head, got_loss = stager.download(dhead), stager.download(rows.loss)
    assert np.isnan(got_head[:, aux_column(z)]).all()  # the forecast column is the aux loss's
    value_rows, adv = reference.split_streams(got_head, z, np.float32)
    got_rows = value_rows.reshape(r, z)  # the value streams: each branch row's gradient g
    g = np.zeros((b, N_HEADS, z), np.float32)
    g[np.repeat(np.arange(b), 4), taken_head] = got_rows
    for br, (off, size) in enumerate(spans):
        want = g[:, off : off + size] - (got_rows.reshape(b, 4, z)[:, br] / np.float32(size))[:, None]
        np.testing.assert_array_equal(adv[:, off : off + size], want)
    assert np.isnan(got_rows[5]).all() and np.isnan(got_loss[5]) and np.isfinite(got_rows[good]).all()
    # p_next within 4 (Z + 2) eps, m within 8 Z eps per atom and its mass within 8 Z eps (test_distributional_
    # kernels.py), then c51_loss's bound
    tol = weights.astype(np.float64)[:, None] * (4 * (z + 2) + 16 * z + 4 * z * (z + 2)) * eps
    assert np.all(np.abs(got_rows[good] - grad_ref[good]) <= tol[good])
    x = taken.astype(np.float64)
    log_p = np.log(reference.softmax64(taken))
    loss_tol = (4 * (z + 2) * eps * m.sum(axis=1) * (1 + x.max(axis=1) - x.min(axis=1) + np.log(z))
                + (8 * z + 4 * (z + 2)) * z * eps * np.abs(log_p).max(axis=1))
    assert np.all(np.abs(got_loss[good] - reference.loss64(taken, m)[good]) <= loss_tol[good])


def test_project_loss_scatter_direction_alone(stream, stager, rng):
    """live = 1 (the default network: the direction branch's streams alone, the others' columns 0 and their rows of
    weight 0, as the counterfactual learner leaves them): B = 70 samples (blocks of 16 direction rows, the last of
    6), Z = 6.
    Against the whole kernel on the same inputs: the direction rows' loss and every dhead element the same bits,
    the other rows' loss 0 (the whole kernel's is their cross-entropy, which the loss signals weigh by 0), and dhead
    past the direction streams left as it was (0; the whole kernel writes 0 there)."""
    b, z = 70, 6
    inputs = list(loss_inputs(rng, b, z))
    live = 5 * z  # the direction branch's value and four advantage streams (kernels/heads.py)
    for k in (0, 1):
        inputs[k][:, live:] = 0.0
    inputs[9][np.arange(4 * b) % 4 != 0] = 0.0  # weights
    got = []
    for kernel_live in (4, 1):
        rows = BranchRows(b, z)
        dhead = stager.upload_new(np.zeros((b, head_width(z)), np.float32))
        stager.upload(np.full(4 * b, np.nan, np.float32), rows.loss)
        run_loss(stager, stream, inputs, rows, dhead, live=kernel_live)
        got.append((stager.download(rows.loss), stager.download(dhead)))
    (loss4, dhead4), (loss1, dhead1) = got
    direction = np.arange(4 * b) % 4 == 0
    np.testing.assert_array_equal(loss1[direction].view(np.uint32), loss4[direction].view(np.uint32))
    assert np.all(loss1[~direction] == 0) and np.all(np.isfinite(loss4)) and np.all(loss4[~direction] > 0)
    np.testing.assert_array_equal(dhead1, dhead4)
    assert not dhead1[:, live:].any() and np.abs(dhead1[:, :live]).min() > 0


def test_fused_rows_refuse_more_atoms_than_they_stage(stream, stager):
    b, z = 2, MAX_ATOMS + 1
    rows = BranchRows(b, z)
    logits, logits_tgt = device_empty((2 * b, N_HEADS, z), np.float32), device_empty((b, N_HEADS, z), np.float32)
    sup, actions = device_empty((N_HEADS, 3), np.float32), device_empty((b, 4), np.int32)
    with pytest.raises(ValueError, match=f"n_atoms <= {MAX_ATOMS}"):
        branch_loss(logits, logits_tgt, rows, actions, sup, sup, logits_tgt, stream=stream)


def uniform32_64(states, i):
    """numba's xoroshiro128p_uniform_float32 on host states, as float64."""
    return float(np.float32((reference.xoroshiro_next64(states, i) >> 11) * 2.0**-53))


def test_obs_noise(stream, stager, rng):
    """B = 5 samples, 2B rows of 6 columns, noise on the first 5 (an odd count: the last pair's sine is dropped):
    every element against the Box-Muller draws replayed in float64 from host copies of the generators (float32
    log, sqrt, cos and sin: 1e-5 relative plus 1e-6); the portfolio column is untouched; the states advance by
    6 draws each (3 pairs), so the next launch draws fresh noise. Generator 0 starts at s0 = 2**64 - 1, s1 = 0:
    its first two draws round to U = 1.0 in float32, so u1 is the documented floor 2**-25 (a literal here), u2 = 1
    and element (0, 0) gains the whole clipped radius sigma * sqrt(50 ln 2)."""
    b, width, n_market, sigma = 5, 6, 5, 0.3
    u1_floor = 2.0**-25
    obs0 = rng.standard_normal((2 * b, width)).astype(np.float32)
    host_states = xoroshiro_states_host(b, 21)
    host_states[0] = (np.uint64(2**64 - 1), np.uint64(0))
    obs, states = stager.upload_new(obs0), stager.upload_new(host_states)
    add_obs_noise(obs, states, sigma, n_market, stream=stream)
    got = stager.download(obs)
    want = obs0.astype(np.float64)
    ref_states = host_states.copy()
    for j in range(b):
        for row in (j, b + j):
            for c in range(0, n_market, 2):
                u1 = max(float(np.float32(1.0 - uniform32_64(ref_states, j))), u1_floor)
                u2 = uniform32_64(ref_states, j)
                r = float(np.float32(sigma)) * math.sqrt(-2.0 * math.log(u1))
                want[row, c] += r * math.cos(2 * math.pi * u2)
                if c + 1 < n_market:
                    want[row, c + 1] += r * math.sin(2 * math.pi * u2)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert got[0, 0] - obs0[0, 0] == pytest.approx(0.3 * math.sqrt(50 * math.log(2)), rel=1e-5)
    np.testing.assert_array_equal(got[:, n_market:], obs0[:, n_market:])
    assert np.abs(got - obs0).max() > 0.1  # the noise is there at sigma 0.3
    np.testing.assert_array_equal(stager.download(states).view(np.uint64), ref_states.view(np.uint64))
    with pytest.raises(ValueError, match="sigma > 0"):
        add_obs_noise(obs, states, 0.0, n_market, stream=stream)


def test_aux_forecast_loss(stream, stager, rng):
    """B = 9 samples of a 2B-row head (only the first B are read) over 24 distinct market rows, two targets NaN
    and one row outside the market (so three of the nine have no label): the forecast column of dhead is
    weight * (f - y) / B where y is finite, else 0; the stream columns are untouched; the epoch's LOSS_AUX
    gains the mean (f - y)**2 / 2 over the labelled rows, and ISV[AUX_LOSS_EMA] moves 0.01 of the way to it."""
    b, z, weight = 9, 4, 0.7
    head = rng.standard_normal((2 * b, head_width(z))).astype(np.float32)
    rows = rng.permutation(24)[: 2 * b].astype(np.int32)
    rows[4] = 24  # outside the market: no target
    target = rng.standard_normal(24).astype(np.float32)
    target[[rows[1], rows[6]]] = np.nan
    dhead0 = rng.standard_normal((b, head_width(z))).astype(np.float32)
    dhead, epoch = stager.upload_new(dhead0), stager.upload_new(np.full(N_EPOCH_STATS, 0.25))
    isv0 = rng.uniform(0.5, 1.5, len(bootstrap_values())).astype(np.float32)  # every slot nonzero
    isv = stager.upload_new(isv0)
    aux_loss(stager.upload_new(head), stager.upload_new(rows), stager.upload_new(target), weight, dhead, isv, epoch,
             stream=stream)
    got, got_epoch, got_isv = stager.download(dhead), stager.download(epoch), stager.download(isv)
    col = aux_column(z)
    y = np.array([target[r] if r < 24 else np.nan for r in rows[:b]], np.float64)
    labelled = np.isfinite(y)
    assert labelled.sum() == b - 3
    d = head[:b, col].astype(np.float64) - np.nan_to_num(y)
    want = np.where(labelled, float(np.float32(weight)) * d / b, 0.0)
    np.testing.assert_allclose(got[:, col], want, rtol=1e-6, atol=1e-9)
    np.testing.assert_array_equal(np.delete(got, col, axis=1), np.delete(dhead0, col, axis=1))
    want_epoch = np.full(N_EPOCH_STATS, 0.25)
    want_epoch[EpochStat.LOSS_AUX] += np.mean(d[labelled] ** 2) / 2
    np.testing.assert_allclose(got_epoch, want_epoch, rtol=2e-7)  # squares of float32 differences
    want_isv = isv0.astype(np.float64)  # ISV[AUX_LOSS_EMA] moves 0.01 of the way to the mean; no other slot moves
    want_isv[Isv.AUX_LOSS_EMA] += 0.01 * (np.mean(d[labelled] ** 2) / 2 - want_isv[Isv.AUX_LOSS_EMA])
    np.testing.assert_allclose(got_isv, want_isv, rtol=1e-6, atol=0)
    head[np.flatnonzero(labelled)[0], col] = np.nan  # a non-finite forward: the step is skipped, the sum stays
    aux_loss(stager.upload_new(head), stager.upload_new(rows), stager.upload_new(target), weight, dhead, isv, epoch,
             stream=stream)
    np.testing.assert_array_equal(stager.download(epoch), got_epoch)
    np.testing.assert_array_equal(stager.download(isv), got_isv)
    with pytest.raises(ValueError, match="aux_weight"):
        aux_loss(stager.upload_new(head), stager.upload_new(rows), stager.upload_new(target), -1.0, dhead, isv,
                 epoch, stream=stream)


@pytest.mark.parametrize("loss, norm, flagged", [(1.5, 2.0, False), (np.nan, 2.0, True), (np.inf, 2.0, True),
                                                 (np.nan, np.nan, False), (1.5, np.inf, False)])
def test_loss_guard(stream, stager, loss, norm, flagged):
    isv0 = bootstrap_values()
    isv0[[Isv.LOSS_RAW, Isv.GRAD_NORM_RAW, Isv.NONFINITE_STEPS]] = (loss, norm, 2.0)
    isv = stager.upload_new(isv0)
    guard_loss(isv, stream=stream)
    got = stager.download(isv)
    if flagged:
        assert np.isnan(got[Isv.GRAD_NORM_RAW]) and got[Isv.NONFINITE_STEPS] == 3.0
    else:
        np.testing.assert_array_equal(got, isv0)  # a non-finite norm was already counted by its kernel


@pytest.mark.parametrize("applied", [True, False])
def test_finish_step(stream, stager, rng, applied):
    n = 3000
    k = norm_partials_len(n)
    adam_p = rng.uniform(0, 1e-6, k)
    polyak_p = rng.uniform(0, 1, (k, 2))
    used = partials_used(n)
    isv0 = bootstrap_values()
    isv0[[Isv.GRAD_NORM_RAW, Isv.UPDATE_RMS_EMA, Isv.TARGET_DRIFT_EMA]] = (2.5 if applied else np.nan, 1e-4, 0.2)
    isv = stager.upload_new(isv0)
    state = stager.upload_new(state_record(step=9, adam_t=5, lr=1e-3, tau=0.125))
    sup_on, sup_tg = (reference.random_support(rng, (N_HEADS,), 7) for _ in range(2))
    sup_target = stager.upload_new(sup_tg)
    epoch = stager.upload_new(np.zeros(N_EPOCH_STATS))
    finish(isv, state, stager.upload_new(adam_p), stager.upload_new(polyak_p), n, stager.upload_new(sup_on),
           sup_target, epoch, stream=stream)
    got, got_state, got_epoch = stager.download(isv), stager.download(state)[0], stager.download(epoch)
    if not applied:
        np.testing.assert_array_equal(got, isv0)
        np.testing.assert_array_equal(stager.download(sup_target), sup_tg)
        assert got_state["adam_t"] == 5 and got_epoch[EpochStat.SKIPPED] == 1 and got_epoch.sum() == 1
        return
    update = math.sqrt(adam_p[:used].sum() / n)
    param_norm = math.sqrt(polyak_p[:used, 1].sum())
    drift = math.sqrt(polyak_p[:used, 0].sum()) / param_norm
    assert got_state["adam_t"] == 6 and got_state["step"] == 9
    assert got[Isv.UPDATE_RMS_EMA] == pytest.approx(1e-4 + 0.01 * (update - 1e-4), rel=1e-5)
    assert got[Isv.PARAM_NORM] == pytest.approx(param_norm, rel=1e-6)
    assert got[Isv.TARGET_DRIFT_EMA] == pytest.approx(0.2 + 0.05 * (drift - 0.2), rel=1e-5)
    np.testing.assert_allclose(stager.download(sup_target), sup_tg + 0.125 * (sup_on.astype(np.float64) - sup_tg),
                               rtol=1e-6, atol=1e-7)
    assert got_epoch[EpochStat.APPLIED] == 1 and got_epoch[EpochStat.GRAD_NORM] == np.float32(2.5)


def test_fold_kernels(stream, stager, rng):
    p0, f0 = rng.standard_normal(1000).astype(np.float32), rng.standard_normal(1000).astype(np.float32)
    p = stager.upload_new(p0)
    shrink_perturb(p, stager.upload_new(f0), 0.8, stream=stream)
    np.testing.assert_allclose(stager.download(p), 0.8 * p0.astype(np.float64) + 0.2 * f0, rtol=1e-6, atol=1e-7)
    state = stager.upload_new(state_record(step=40, adam_t=33, lr=1e-3, tau=0.01))
    reset_counters(state, stream=stream)
    got = stager.download(state)[0]
    assert (got["step"], got["adam_t"]) == (0, 0) and got["lr"] == np.float32(1e-3)
    with pytest.raises(ValueError, match="fraction"):
        shrink_perturb(p, p, 1.5, stream=stream)
