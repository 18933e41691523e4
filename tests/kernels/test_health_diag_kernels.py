"""HEALTH_DIAG kernels against numpy: ISV mirror, action histograms, per-magnitude win share and variance."""

import numpy as np
import pytest

from fox_numba.actions import BRANCHES, LONG, N_BRANCHES, N_HEADS, SHORT
from fox_numba.device.isv import ISV_TOTAL_DIM
from fox_numba.device.memory import Mapped, words
from fox_numba.diag.layout import (
    N_WORDS,
    SNAPSHOT_DTYPE,
    W_EVAL_HIST,
    W_MAG_VAR,
    W_MAG_WIN,
    W_TRAIN_HIST,
    mirror_table,
)
from fox_numba.kernels.health_diag import histogram_actions, mirror_isv, reduce_magnitude_stats

pytestmark = pytest.mark.usefixtures("long_switch_interval")


@pytest.fixture()
def snapshot():
    snap = Mapped(1, SNAPSHOT_DTYPE)
    snap.host.view(np.uint32)[:] = 0xDEADBEEF  # every word the kernels do not write keeps this
    return snap


def views(snap):
    flat = words(snap.device)
    return flat.view(np.float32), flat


def random_actions(rng, n):
    return np.stack([rng.integers(0, b.size, n) for b in BRANCHES], axis=1).astype(np.int32)


def test_isv_mirror_copies_every_slot(stream, stager, snapshot, rng):
    isv = rng.standard_normal(ISV_TOTAL_DIM).astype(np.float32)
    slots, wds = mirror_table()
    snap_f, _ = views(snapshot)
    mirror_isv(stager.upload_new(isv), stager.upload_new(slots), stager.upload_new(wds), snap_f, stream=stream)
    stream.synchronize()
    got = snapshot.host.view(np.float32).reshape(N_WORDS)
    np.testing.assert_array_equal(got[wds], isv[slots])
    untouched = np.setdiff1d(np.arange(N_WORDS), wds)
    assert (snapshot.host.view(np.uint32).reshape(N_WORDS)[untouched] == 0xDEADBEEF).all()


@pytest.mark.parametrize("n", [1, 300, 700])
def test_action_histogram_counts_every_head(stream, stager, snapshot, rng, n):
    """Rows > DIAG_BLOCK exercise the strided loop; accumulate adds a second batch to the eval words."""
    a, b = random_actions(rng, n), random_actions(rng, n)
    _, snap_u = views(snapshot)
    histogram_actions(stager.upload_new(a), snap_u, evaluation=False, accumulate=False, stream=stream)
    histogram_actions(stager.upload_new(a), snap_u, evaluation=True, accumulate=False, stream=stream)
    histogram_actions(stager.upload_new(b), snap_u, evaluation=True, accumulate=True, stream=stream)
    stream.synchronize()

    def ref(acts):
        return np.concatenate([np.bincount(acts[:, k], minlength=br.size) for k, br in enumerate(BRANCHES)])

    host = snapshot.host.view(np.uint32).reshape(N_WORDS)
    np.testing.assert_array_equal(host[W_TRAIN_HIST : W_TRAIN_HIST + N_HEADS], ref(a))
    np.testing.assert_array_equal(host[W_EVAL_HIST : W_EVAL_HIST + N_HEADS], ref(a) + ref(b))


def test_magnitude_stats_match_float64(stream, stager, snapshot, rng):
    """600 rows (strided over 256 threads), rewards ~ N(0.1, 1): win share exact to float32 rounding,
    variance within 1e-6 relative (float64 sums of 600 terms, one float32 rounding at the end)."""
    n = 600
    acts = random_actions(rng, n)
    reward = (rng.standard_normal(n) + 0.1).astype(np.float32)
    snap_f, _ = views(snapshot)
    reduce_magnitude_stats(stager.upload_new(acts), stager.upload_new(reward), snap_f, stream=stream)
    stream.synchronize()
    host = snapshot.host.view(np.float32).reshape(N_WORDS)
    for m in range(3):
        sel = np.isin(acts[:, 0], (SHORT, LONG)) & (acts[:, 1] == m)
        r = reward[sel].astype(np.float64)
        assert sel.sum() > 50
        np.testing.assert_allclose(host[W_MAG_WIN + m], (r > 0).mean(), rtol=1e-6)
        np.testing.assert_allclose(host[W_MAG_VAR + m], r.var(), rtol=1e-6)


def test_magnitude_stats_without_rows_are_zero(stream, stager, snapshot):
    acts = np.zeros((8, N_BRANCHES), np.int32)
    acts[:, 0] = 1  # Hold: no magnitude
    snap_f, _ = views(snapshot)
    reward = np.linspace(-1, 1, 8).astype(np.float32)
    reduce_magnitude_stats(stager.upload_new(acts), stager.upload_new(reward), snap_f, stream=stream)
    stream.synchronize()
    host = snapshot.host.view(np.float32).reshape(N_WORDS)
    assert (host[W_MAG_WIN : W_MAG_WIN + 3] == 0).all() and (host[W_MAG_VAR : W_MAG_VAR + 3] == 0).all()


def test_tally_and_count_histogram_match_numpy(stream, stager, snapshot, rng):
    """Per-row tallies over 5 steps of 37 rows, then the histogram of the tallies: the eval words."""
    from fox_numba.device.memory import device_zeros
    from fox_numba.kernels.health_diag import histogram_counts, tally

    n, steps = 37, 5
    counts = device_zeros((n, N_HEADS), np.int32, stream=stream)
    batches = [random_actions(rng, n) for _ in range(steps)]
    for a in batches:
        tally(stager.upload_new(a), counts, stream=stream)
    _, snap_u = views(snapshot)
    histogram_counts(counts, snap_u, stream=stream)
    stream.synchronize()
    every = np.concatenate(batches)
    per_row = np.zeros((n, N_HEADS), np.int64)
    for a in batches:
        for k, br in enumerate(BRANCHES):
            per_row[np.arange(n), br.offset + a[:, k]] += 1
    np.testing.assert_array_equal(stager.download(counts), per_row)
    ref = np.concatenate([np.bincount(every[:, k], minlength=br.size) for k, br in enumerate(BRANCHES)])
    host = snapshot.host.view(np.uint32).reshape(N_WORDS)
    np.testing.assert_array_equal(host[W_EVAL_HIST : W_EVAL_HIST + N_HEADS], ref)
