"""The replay ring: writes at the cursor with wrap-around, the size cap, clearing, uniform sampling and
batch gathers, against a numpy ring."""

from __future__ import annotations

import numpy as np
import pytest
from reference_env import uniform64

from fox_numba.agent.replay import FIELDS, ReplayBatch, ReplayBuffer
from fox_numba.device.rng import xoroshiro_states, xoroshiro_states_host
from fox_numba.observation import N_PORTFOLIO

pytestmark = [
    pytest.mark.filterwarnings("ignore:overflow encountered in scalar add:RuntimeWarning"),
    pytest.mark.usefixtures("long_switch_interval"),
]


def random_step(rng, n):
    return {
        "row": rng.integers(0, 1000, n).astype(np.int32),
        "port": rng.normal(size=(n, N_PORTFOLIO)).astype(np.float32),
        "action": rng.integers(0, 3, (n, 4)).astype(np.int32),
        "reward": rng.normal(size=n).astype(np.float32),
        "done": (rng.random(n) < 0.3).astype(np.float32),
        "next_row": rng.integers(0, 1000, n).astype(np.int32),
        "next_port": rng.normal(size=(n, N_PORTFOLIO)).astype(np.float32),
    }


def write(replay, stager, stream, step):
    d = {k: stager.upload_new(v) for k, v in step.items()}
    replay.put_obs(d["row"], d["port"], d["action"], stream=stream)
    replay.put_result(d["reward"], d["done"], d["next_row"], d["next_port"], stream=stream)


def test_ring_wraps_around_and_caps_its_size(stream, stager, rng):
    """Capacity 11, 4 transitions per step, 7 steps: slot (cursor + i) % 11 holds the latest write, the
    cursor advances by 4 mod 11 and the size stops at 11; unwritten slots stay zero."""
    cap, n = 11, 4
    replay = ReplayBuffer(cap, stream=stream)
    ring = {k: np.zeros((cap, *v.shape[1:]), v.dtype) for k, v in random_step(rng, 1).items()}
    cursor = size = 0
    for step in range(7):
        data = random_step(rng, n)
        write(replay, stager, stream, data)
        for i in range(n):
            for k in FIELDS:
                ring[k][(cursor + i) % cap] = data[k][i]
        cursor, size = (cursor + n) % cap, min(size + n, cap)
        got = replay.download(stager)
        for k in FIELDS:
            np.testing.assert_array_equal(got[k], ring[k], err_msg=f"step {step}: {k}")
        assert replay.read_meta(stager) == (cursor, size)
    replay.clear(stream=stream)
    assert replay.read_meta(stager) == (0, 0)


def test_more_transitions_than_slots_are_refused(stream, stager, rng):
    replay = ReplayBuffer(3, stream=stream)
    with pytest.raises(ValueError, match="4 transitions per step do not fit a ring of 3"):
        write(replay, stager, stream, random_step(rng, 4))


def test_sample_is_uniform_below_the_size_and_gather_copies_the_slots(stream, stager, rng):
    """After 3 writes of 5 into a ring of 32 (size 15), 64 samples draw slot floor(u * 15) with u the
    states' float64 draws; gather copies those slots' every field; a second sample after the ring filled
    draws below 32."""
    replay = ReplayBuffer(32, stream=stream)
    for _ in range(3):
        write(replay, stager, stream, random_step(rng, 5))
    states = xoroshiro_states(64, 11, stager)
    ref = [[int(s["s0"]), int(s["s1"])] for s in xoroshiro_states_host(64, 11)]
    batch = ReplayBatch(64, stream=stream)
    replay.sample(states, batch.idx, stream=stream)
    idx = stager.download(batch.idx)
    np.testing.assert_array_equal(idx, [int(uniform64(r) * 15) for r in ref])
    replay.gather(batch, stream=stream)
    ring = replay.download(stager)
    for k in FIELDS:
        np.testing.assert_array_equal(stager.download(getattr(batch, k)), ring[k][idx], err_msg=k)
    for _ in range(5):
        write(replay, stager, stream, random_step(rng, 5))
    replay.sample(states, batch.idx, stream=stream)
    np.testing.assert_array_equal(stager.download(batch.idx), [int(uniform64(r) * 32) for r in ref])
