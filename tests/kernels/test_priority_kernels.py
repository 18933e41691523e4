"""Prioritised replay's kernels (kernels/priority.py) against float64 references on small seeded inputs, every
output element checked, and the sampler's frequencies against the priorities.

Tolerances: the tree's nodes are float64 sums of the same two children in the same order (exact); sampled
slots are integers (exact); importance weights are one float64 power rounded to float32 (1e-6 relative, a few
float32 ulps: Python's and numpy's float64 power may differ in the last bit); priorities one float64 power
(1e-12 relative); copied values (put, clear) exact.
"""

import math

import numpy as np
import pytest
import reference

from fox_numba.device.control import ControlBlock
from fox_numba.device.launch import launch
from fox_numba.device.rng import xoroshiro_states_host
from fox_numba.kernels.learner import SCHEDULE_DTYPE
from fox_numba.kernels.optim import OPTIM_STATE_DTYPE
from fox_numba.kernels.priority import (
    PRIORITY_START,
    importance_weights,
    priority_clear,
    priority_put,
    priority_sample,
    priority_sample_kernel,
    priority_update,
    rebuild_tree,
    tree_leaves,
)

pytestmark = pytest.mark.usefixtures("long_switch_interval")


def tree64(leaves, n_leaves):
    """The sum tree [2L] of `leaves` (float64 [C], C <= L): node k = node 2k + node 2k + 1, bottom up."""
    tree = np.zeros(2 * n_leaves)
    tree[n_leaves : n_leaves + leaves.size] = leaves
    for k in range(n_leaves - 1, 0, -1):
        tree[k] = tree[2 * k] + tree[2 * k + 1]
    return tree


def walk64(tree, x):
    """The slot of x: left when x < sum(left) or the right subtree is empty, else right with x - sum(left)."""
    n_leaves, k = tree.size // 2, 1
    while k < n_leaves:
        if x < tree[2 * k] or not tree[2 * k + 1] > 0:
            k = 2 * k
        else:
            x -= tree[2 * k]
            k = 2 * k + 1
    return k - n_leaves


def sample64(tree, states, batch):
    """Stratified draws x_j = (j + U_j) * total / B, U_j the top 32 bits of one draw of states[j] / 2**32
    (advances the host states); -1 for an empty tree."""
    us = [(reference.xoroshiro_next64(states, j) >> 32) * 2.0**-32 for j in range(batch)]
    if not tree[1] > 0:
        return np.full(batch, -1)
    return np.array([walk64(tree, (j + u) * tree[1] / batch) for j, u in enumerate(us)])


def random_leaves(rng, capacity, unwritten=()):
    """Seeded priorities in [0.05, 3), 0 at the slots `unwritten`."""
    leaves = rng.uniform(0.05, 3.0, capacity)
    leaves[list(unwritten)] = 0.0
    return leaves


def test_tree_leaves():
    assert [tree_leaves(c) for c in (1, 2, 3, 8, 9, 20, 1 << 20)] == [1, 2, 4, 8, 16, 32, 1 << 20]
    with pytest.raises(ValueError):
        tree_leaves(0)


def test_rebuild_sets_every_node(stream, stager, rng):
    leaves = random_leaves(rng, 20, unwritten=(3, 17, 18, 19))
    tree = np.zeros(64)
    tree[32:52] = leaves
    tree[1:32] = rng.uniform(-5, 5, 31)  # stale inner nodes: every one must be rewritten
    dev = stager.upload_new(tree)
    rebuild_tree(dev, stream=stream)
    np.testing.assert_array_equal(stager.download(dev)[1:], tree64(leaves, 32)[1:])


@pytest.mark.parametrize("capacity, batch", [(20, 12), (1, 3), (16, 16)])
def test_sample_gives_the_reference_walks_slots(stream, stager, rng, capacity, batch):
    n_leaves = tree_leaves(capacity)
    leaves = random_leaves(rng, capacity, unwritten=(capacity - 1,) if capacity > 1 else ())
    if capacity == 20:
        leaves[[2, 5]] = (40.0, 1e-3)  # one heavy slot (drawn several times), one light one
    tree = tree64(leaves, n_leaves)
    states = xoroshiro_states_host(batch, int(rng.integers(1 << 30)))
    want = sample64(tree, states.copy(), batch)
    leaves_only = tree.copy()
    leaves_only[:n_leaves] = 0.0  # the sampler rebuilds the inner nodes itself
    dev_tree = stager.upload_new(leaves_only)
    dev_states, idx = stager.upload_new(states), stager.upload_new(np.full(batch, 99, np.int32))
    priority_sample(dev_tree, dev_states, idx, stream=stream)
    got = stager.download(idx)
    np.testing.assert_array_equal(got, want)
    assert (leaves[got] > 0).all()
    if capacity == 20:
        assert (got == 2).sum() >= 2
    # each generator advanced by exactly one draw, as the uniform sampler's
    after = stager.download(dev_states)
    ref = states.copy()
    for j in range(batch):
        reference.xoroshiro_next64(ref, j)
    np.testing.assert_array_equal(after, ref)


def test_sample_empty_tree_gives_minus_one(stream, stager):
    tree, idx = stager.upload_new(np.zeros(8)), stager.upload_new(np.zeros(5, np.int32))
    priority_sample(tree, stager.upload_new(xoroshiro_states_host(5, 3)), idx, stream=stream)
    np.testing.assert_array_equal(stager.download(idx), -1)


def test_a_walk_past_the_last_positive_leaf_stays_on_one(stream, stager):
    """A root larger than its children's sum (float rounding, exaggerated) carries x past the last positive
    leaf: the empty-right-subtree rule keeps the walk on a positive leaf, as the reference's."""
    tree = tree64(np.array([1.0, 2.0, 0.0, 0.0]), 4)
    tree[1] = 3.5
    batch = 8
    states = xoroshiro_states_host(batch, 5)
    want = sample64(tree, states.copy(), batch)
    idx = stager.upload_new(np.zeros(batch, np.int32))
    launch(priority_sample_kernel, batch, stager.upload_new(tree), stager.upload_new(states), idx, stream=stream,
           block=batch)
    got = stager.download(idx)
    np.testing.assert_array_equal(got, want)
    assert set(got) <= {0, 1} and (got == 1).sum() >= 3  # x in [3, 3.5) lands on slot 1, not on 2 or 3


def test_sampling_frequencies_follow_the_priorities(stream, stager):
    """Stratified draws of one batch of B: every stratum of width total / B holds one draw, so a slot whose
    share of the total is P is drawn B P times up to the (at most two) strata its interval cuts: |count - B P|
    < 2 for every slot, and 0 for a slot of priority 0. Tolerance 2 draws of 2048: a sampler off by more than
    4 / 2048 = 0.2 % in any slot's probability fails; uniform sampling over the written slots would miss the
    heaviest slot (P = 0.40) by over 450 draws."""
    leaves = np.array([1.0, 2.0, 0.0, 8.0, 0.5, 3.0, 0.0, 9.5])
    batch = 2048
    tree = stager.upload_new(tree64(leaves, 8))
    idx = stager.upload_new(np.zeros(batch, np.int32))
    priority_sample(tree, stager.upload_new(xoroshiro_states_host(batch, 11)), idx, stream=stream)
    counts = np.bincount(stager.download(idx), minlength=8)
    expected = batch * leaves / leaves.sum()
    assert counts.sum() == batch
    assert np.all(np.abs(counts - expected) < 2), (counts, expected)
    assert counts[2] == counts[6] == 0


def schedule(stream, horizon):
    sched = ControlBlock(SCHEDULE_DTYPE)
    sched.set(lr_base=np.float32(1e-3), lr_min_frac=np.float32(0.1), tau_base=np.float32(0.01),
              tau_min_frac=np.float32(1.0), horizon=horizon)
    sched.upload(stream)
    return sched


def optim_state(step):
    rec = np.zeros(1, OPTIM_STATE_DTYPE)
    rec[0] = (step, 0, 0.0, 0.0)
    return rec


@pytest.mark.parametrize("step, horizon", [(1, 10), (5, 10), (40, 10), (7, 0)])
def test_importance_weights_every_element(stream, stager, rng, step, horizon):
    capacity, batch, beta0 = 20, 9, 0.3
    leaves = random_leaves(rng, capacity, unwritten=(19,))
    idx_h = rng.integers(0, 19, batch).astype(np.int32)
    idx_h[3] = idx_h[6]  # a slot drawn twice
    idx_h[7] = -1  # an empty ring's slot
    row_w_h = rng.uniform(0.1, 1.0, 4 * batch).astype(np.float32)
    tree = stager.upload_new(tree64(leaves, 32))
    row_w, is_w = stager.upload_new(row_w_h), stager.upload_new(np.zeros(batch, np.float32))
    sched = schedule(stream, horizon)
    importance_weights(tree, stager.upload_new(idx_h), sched.device, stager.upload_new(optim_state(step)), beta0,
                       row_w, is_w, stream=stream)
    progress = min(np.float32(step - 1) / np.float32(horizon), np.float32(1.0)) if horizon else np.float32(0.0)
    beta = np.float32(beta0) + (np.float32(1.0) - np.float32(beta0)) * progress  # float32, as the device's
    p = np.where(idx_h >= 0, leaves[idx_h], np.nan)
    w = np.where(idx_h >= 0, (np.nanmin(p) / p) ** np.float64(beta), 1.0)
    assert w.max() == 1.0 and w.min() < 0.9
    np.testing.assert_allclose(stager.download(is_w), w, rtol=1e-6)
    np.testing.assert_allclose(stager.download(row_w), row_w_h * np.repeat(w, 4).astype(np.float32), rtol=1e-6)


def test_update_sets_the_drawn_leaves_and_the_max(stream, stager, rng):
    capacity, batch, alpha, eps = 20, 10, 0.6, 0.01
    leaves = random_leaves(rng, capacity, unwritten=(18, 19))
    idx_h = rng.permutation(18)[:batch].astype(np.int32)
    idx_h[[2, 5, 8]] = idx_h[0]  # drawn four times: the largest of its priorities wins
    idx_h[9] = -1
    loss_h = rng.uniform(0.5, 6.0, 4 * batch).astype(np.float32)
    loss_h[4 * 4] = np.nan  # sample 4's direction loss: its leaf is kept
    loss_h[4 * 1 + 2] = np.nan  # another branch's row: ignored
    loss_h[4 * 3] = -1e-7  # float32 rounding below 0: counts as 0
    max0 = 2.0
    tree = stager.upload_new(tree64(leaves, 32))
    max_p = stager.upload_new(np.array([max0]))
    priority_update(stager.upload_new(idx_h), stager.upload_new(loss_h), alpha, eps, tree, max_p, stream=stream)
    want = leaves.copy()
    drawn = {}
    for j, s in enumerate(idx_h):
        d = float(loss_h[4 * j])
        if s >= 0 and math.isfinite(d):
            drawn.setdefault(s, []).append((max(d, 0.0) + eps) ** alpha)
    for s, ps in drawn.items():
        want[s] = max(ps)
    got_tree = stager.download(tree)
    np.testing.assert_allclose(got_tree[32:52], want, rtol=1e-12)
    assert got_tree[32 + idx_h[4]] == leaves[idx_h[4]]
    np.testing.assert_array_equal(got_tree[52:], 0.0)
    top = max(max(ps) for ps in drawn.values())
    assert top > max0
    np.testing.assert_allclose(stager.download(max_p), [top], rtol=1e-12)


def test_put_gives_new_slots_the_max_and_clear_empties(stream, stager, rng):
    capacity, n = 20, 6
    leaves = random_leaves(rng, capacity)
    tree = stager.upload_new(tree64(leaves, 32))
    max_p = stager.upload_new(np.array([4.25]))
    meta = stager.upload_new(np.array([17, capacity], np.int32))  # the step wraps: slots 17, 18, 19, 0, 1, 2
    priority_put(meta, n, capacity, tree, max_p, stream=stream)
    want = tree64(leaves, 32)
    want[32 + np.array([17, 18, 19, 0, 1, 2])] = 4.25
    got = stager.download(tree)
    np.testing.assert_array_equal(got[32:], want[32:])
    np.testing.assert_array_equal(got[1:32], tree64(leaves, 32)[1:32])  # inner nodes wait for the next rebuild
    priority_clear(tree, max_p, stream=stream)
    np.testing.assert_array_equal(stager.download(tree), 0.0)
    assert stager.download(max_p)[0] == PRIORITY_START
    with pytest.raises(ValueError):
        priority_put(meta, capacity + 1, capacity, tree, max_p, stream=stream)
