"""Hindsight relabelling's kernels (kernels/hindsight.py) against their float64 references: every label of seeded
random folds (mids walking in ticks, so forward moves hit 0 and the threshold exactly), every action element after
a relabel, and the rule's identity with the oracle's positions. Labels and actions are integers: compared exactly.
"""

import numpy as np
import pytest
from reference import HINDSIGHT_KEEP_LONG, HINDSIGHT_KEEP_SHORT, hindsight_labels64, hindsight_relabel64

from fox_numba.device.memory import device_empty
from fox_numba.kernels.hindsight import hindsight_labels, relabel_directions
from fox_numba.market.synthetic_oracle import oracle_positions, oracle_threshold
from fox_numba.observation import N_PORTFOLIO, PORT_POSITION

pytestmark = pytest.mark.usefixtures("long_switch_interval")
TICK = 0.25
DAY_BARS = [37, 25, 3, 40, 19]


def random_fold(rng, train_stop):
    """mid float64 [n] walking in ticks, day_start, and row_stop as FoldMarket builds it (the day's end, on a
    training row no later than the purge start)."""
    day_start = np.concatenate(([0], np.cumsum(DAY_BARS))).astype(np.int32)
    n = int(day_start[-1])
    mid = 5000.0 + TICK * np.cumsum(rng.integers(-2, 3, n)).astype(np.float64)
    day_end = np.repeat(day_start[1:], DAY_BARS)
    row_stop = np.where(np.arange(n) < train_stop, np.minimum(day_end, train_stop), day_end).astype(np.int32)
    return mid, day_start, row_stop


def device_labels(stager, mid, row_stop, train_stop, horizon, threshold):
    labels = device_empty(mid.size, np.int32)
    hindsight_labels(stager.upload_new(mid), stager.upload_new(row_stop), train_stop, horizon, threshold, labels,
                     stream=stager.stream)  # fmt: skip
    return stager.download(labels)


@pytest.mark.parametrize("horizon, threshold", [(4, 2 * TICK), (1, TICK), (6, oracle_threshold(TICK, 50.0, 2.25))])
def test_every_label_matches_the_reference(stager, rng, horizon, threshold):
    train_stop = 90  # inside the fourth day: its later rows and the fifth day are past the purge start
    mid, day_start, row_stop = random_fold(rng, train_stop)
    got = device_labels(stager, mid, row_stop, train_stop, horizon, threshold)
    want = hindsight_labels64(mid, day_start, train_stop, horizon, threshold)
    np.testing.assert_array_equal(got, want)
    assert set(np.unique(want)) == {-1, 0, 2, 3, HINDSIGHT_KEEP_LONG, HINDSIGHT_KEEP_SHORT} or horizon == 1
    assert np.all(got[train_stop - horizon :] == -1) and np.all(got[day_start[3] - horizon : day_start[3]] == -1)


def test_every_action_element_matches_the_reference(stager, rng):
    n_envs, n_rows, n_relabel = 40, 50, 27
    labels = rng.choice([-1, 0, 2, 3, HINDSIGHT_KEEP_LONG, HINDSIGHT_KEEP_SHORT], n_rows).astype(np.int32)
    rows = rng.integers(0, n_rows, n_envs).astype(np.int32)
    port = rng.uniform(-1.0, 1.0, (n_envs, N_PORTFOLIO)).astype(np.float32)
    port[:, PORT_POSITION] = rng.choice([-1.0, -0.5, 0.0, 0.25, 1.0], n_envs)
    actions = np.stack([rng.integers(0, 4, n_envs)] + [rng.integers(0, 3, n_envs) for _ in range(3)], 1)
    actions[np.isin(actions[:, 0], (1, 3)), 1] = 0  # the policy's Hold and Flat record magnitude 0
    actions = actions.astype(np.int32)
    for count in (n_relabel, n_envs):
        dev = stager.upload_new(actions)
        relabel_directions(stager.upload_new(labels), stager.upload_new(rows), stager.upload_new(port), dev, count,
                           stream=stager.stream)  # fmt: skip
        got = stager.download(dev)
        want = hindsight_relabel64(labels, rows, port[:, PORT_POSITION], actions, count)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(got[count:], actions[count:])
        assert np.any(got[:count, 0] != actions[:count, 0])  # something was relabelled
        assert set(got[:count, 0][labels[rows[:count]] >= 4]) == {1, 3}  # the keep labels gave Hold and Flat


def test_relabelled_positions_are_the_oracles(stager, rng):
    """Acting on the labels from a flat start, each training day's position chain (Long +1, Short -1, Hold keeps,
    Flat 0) is the oracle's pos_m with the realised move as its expected return, on every labelled bar."""
    horizon, threshold, train_stop = 3, 2 * TICK, 90
    mid, day_start, row_stop = random_fold(rng, train_stop)
    labels = device_labels(stager, mid, row_stop, train_stop, horizon, threshold)
    checked = 0
    for a, b in zip(day_start[:-1], day_start[1:], strict=True):
        b = min(int(b), train_stop)
        fwd = np.zeros(max(b - a, 0))
        fwd[: max(b - a - horizon, 0)] = mid[a + horizon : b] - mid[a : b - horizon]
        oracle = oracle_positions(fwd, threshold)
        pos = 0.0
        for m, r in enumerate(range(a, b - horizon)):
            d = hindsight_relabel64(labels, [r], [pos], np.zeros((1, 4), np.int32), 1)[0, 0]
            pos = {0: -1.0, 1: pos, 2: 1.0, 3: 0.0}[int(d)]
            assert pos == oracle[m], (r, d, pos, oracle[m])
            checked += 1
    assert checked > 60


def test_bad_arguments_are_refused(stager):
    mid, row_stop = stager.upload_new(np.ones(4)), stager.upload_new(np.full(4, 4, np.int32))
    labels = device_empty(4, np.int32)
    with pytest.raises(ValueError, match="horizon >= 1"):
        hindsight_labels(mid, row_stop, 4, 0, 0.5, labels, stream=stager.stream)
    port = stager.upload_new(np.zeros((2, N_PORTFOLIO), np.float32))
    actions, rows = stager.upload_new(np.zeros((2, 4), np.int32)), stager.upload_new(np.zeros(2, np.int32))
    with pytest.raises(ValueError, match="n_relabel = 3"):
        relabel_directions(labels, rows, port, actions, 3, stream=stager.stream)
