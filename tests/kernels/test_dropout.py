"""The dropout kernel against its float64 reference (every element), its drop rate, and its key."""

import numpy as np
import pytest
import reference

from fox_numba.kernels.dropout import dropout, keep_scale
from fox_numba.kernels.optim import OPTIM_STATE_DTYPE


def state_at(stager, step):
    state = np.zeros(1, OPTIM_STATE_DTYPE)
    state[0]["step"] = step
    return stager.upload_new(state)


def run(stager, stream, act, *, step, seed, layer, rate):
    dev = stager.upload_new(act)
    dropout(dev, state_at(stager, step), seed, layer, rate, stream=stream)
    return stager.download(dev)


@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_every_element_follows_the_reference(stream, stager, rng, rate):
    act = rng.uniform(0.1, 2.0, (37, 11)).astype(np.float32)
    got = run(stager, stream, act, step=123, seed=7, layer=1, rate=rate)
    keep = reference.dropout_keep64(37, 11, seed=7, step=123, layer=1, rate=rate)
    np.testing.assert_allclose(got, act * keep, rtol=1e-6, atol=0)
    assert (got == 0).any() and (got != 0).any()


def test_the_drop_rate_and_the_key(stream, stager, rng):
    """4,096 elements at rate 0.3: the dropped count is binomial with sd 29, so |share - 0.3| < 0.035 is six
    sd (a wrong rate of 0.25 or 0.35 is 7 sd away). Another step, layer or seed gives another mask, on the first
    16 rows (1,024 elements, whose keys and so whose mask are those of the first 16 rows of the whole array);
    the same step, layer and seed gives those rows the same mask again."""
    act = rng.uniform(0.5, 1.5, (64, 64)).astype(np.float32)
    base = run(stager, stream, act, step=5, seed=1, layer=0, rate=0.3) == 0
    assert abs(base.mean() - 0.3) < 0.035
    head = act[:16]
    for change in ({"step": 6}, {"layer": 1}, {"seed": 2}):
        other = run(stager, stream, head, **{"step": 5, "seed": 1, "layer": 0, "rate": 0.3, **change}) == 0
        assert 0.1 < (other != base[:16]).mean() < 0.6, change  # independent masks differ on ~42% (sd 0.015)
    again = run(stager, stream, head, step=5, seed=1, layer=0, rate=0.3) == 0
    assert np.array_equal(again, base[:16])  # no hidden state


def test_the_rate_is_checked():
    assert keep_scale(0.2) == np.float32(1.25)
    with pytest.raises(ValueError, match=r"learner.dropout must be in \[0, 1\), got 1.0"):
        keep_scale(1.0)
