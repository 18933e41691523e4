"""The replay ring: writes at the cursor with wrap-around, the size cap, clearing, uniform sampling and
the learner's batch gather, against a numpy ring and float64 / integer references.

Tolerances: everything here is exact (slots are integer arithmetic on the generator's bits, writes and
gathers are copies)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import reference

from fox_numba.agent.replay import STORED, ReplayBatch, ReplayBuffer
from fox_numba.device.rng import xoroshiro_states_host
from fox_numba.observation import N_PORTFOLIO

pytestmark = pytest.mark.usefixtures("long_switch_interval")


def random_step(rng, n, n_port=N_PORTFOLIO):
    return {
        "row": rng.integers(0, 1000, n).astype(np.int32),
        "port": rng.normal(size=(n, n_port)).astype(np.float32),
        "action": rng.integers(0, 3, (n, 4)).astype(np.int32),
        "reward": rng.normal(size=n).astype(np.float32),
        "done": (rng.random(n) < 0.3).astype(np.float32),
        "next_row": rng.integers(0, 1000, n).astype(np.int32),
        "next_port": rng.normal(size=(n, n_port)).astype(np.float32),
        "entry": rng.uniform(4000.0, 6000.0, n),
    }


def write(replay, stager, stream, step):
    d = {k: stager.upload_new(v) for k, v in step.items()}
    replay.put_obs(d["row"], d["port"], d["action"], d["entry"], stream=stream)
    replay.put_result(d["reward"], d["done"], d["next_row"], d["next_port"], stream=stream)


def test_ring_wraps_around_and_caps_its_size(stream, stager, rng):
    """Capacity 11, 4 transitions per step, 7 steps: slot (cursor + i) % 11 holds the latest write, the
    cursor advances by 4 mod 11 and the size stops at 11; unwritten slots stay zero, and clearing zeroes every slot."""
    cap, n = 11, 4
    replay = ReplayBuffer(cap, stream=stream)
    ring = {k: np.zeros((cap, *v.shape[1:]), v.dtype) for k, v in random_step(rng, 1).items()}
    cursor = size = 0
    for step in range(7):
        data = random_step(rng, n)
        write(replay, stager, stream, data)
        for i in range(n):
            for k in STORED:
                ring[k][(cursor + i) % cap] = data[k][i]
        cursor, size = (cursor + n) % cap, min(size + n, cap)
        got = replay.download(stager)
        for k in STORED:
            np.testing.assert_array_equal(got[k], ring[k], err_msg=f"step {step}: {k}")
        assert replay.read_meta(stager) == (cursor, size)
    assert all(got[k].any() for k in STORED)  # every field holds nonzero data before the clear
    replay.clear(stream=stream)
    assert replay.read_meta(stager) == (0, 0)
    for k, v in replay.download(stager).items():  # every slot zero bits: an emptied ring is the same whatever it held
        assert not np.ascontiguousarray(v).view(np.uint8).any(), k


def test_more_transitions_than_slots_are_refused(stream, stager, rng):
    replay = ReplayBuffer(3, stream=stream)
    with pytest.raises(ValueError, match="4 transitions per step do not fit a ring of 3"):
        write(replay, stager, stream, random_step(rng, 4))


def test_narrow_rings_take_their_width_from_the_arrays(stream, stager, rng):
    """A ring of portfolio width 2 (the learner's tests): puts, upload and download keep every element."""
    replay = ReplayBuffer(5, stream=stream, n_port=2)
    data = random_step(rng, 3, n_port=2)
    write(replay, stager, stream, data)
    got = replay.download(stager)
    for k in STORED:
        np.testing.assert_array_equal(got[k][:3], data[k], err_msg=k)
    host = {**{k: v.copy() for k, v in got.items()}, "meta": np.array([4, 5], np.int32)}
    host["port"][4] = [1.5, -2.5]
    replay.upload(host, stager)
    for k, v in replay.download(stager).items():
        np.testing.assert_array_equal(v, host[k], err_msg=k)


def filled_ring(stager, stream, rng, capacity, size, n_port=N_PORTFOLIO):
    """A ring with random contents in every slot and meta = (3, size)."""
    replay = ReplayBuffer(capacity, stream=stream, n_port=n_port)
    host = random_step(rng, capacity, n_port)
    host["meta"] = np.array([3, size], np.int32)
    replay.upload(host, stager)
    return replay, host


@pytest.fixture(scope="module")
def ring_1000(stager, stream):
    """A 1000-slot ring with seeded random contents, built once (the simulator pays ~2.5 s per ring): sampling
    reads only meta, which each test sets."""
    return filled_ring(stager, stream, np.random.default_rng(1000), 1000, 0, n_port=1)[0]


@pytest.mark.parametrize("size", [1000, 7, 0])
def test_sample_draws_the_learners_slots(stream, stager, ring_1000, size):
    """37 samples: slot j = floor(top 32 bits of one draw of states[j] * size / 2**32) (tests/reference.py
    sample_indices64, the learner's draw order), -1 from an empty ring; each generator advances once."""
    replay = ring_1000
    stager.upload(np.array([3, size], np.int32), replay.meta)
    host_states = xoroshiro_states_host(37, seed=5)
    states = stager.upload_new(host_states)
    idx = stager.upload_new(np.full(37, -7, np.int32))
    replay.sample(states, idx, stream=stream)
    got = stager.download(idx)
    advanced = host_states.copy()
    expected = reference.sample_indices64(advanced, size)
    np.testing.assert_array_equal(got, expected if size else np.full(37, -1))
    np.testing.assert_array_equal(stager.download(states), advanced)  # each generator advanced once
    if size:
        assert got.min() >= 0 and got.max() < size


def test_sampling_is_uniform(stream, stager, rng):
    """2**13 draws over 5 slots: every slot within 5 standard deviations of its expected count."""
    replay, _ = filled_ring(stager, stream, rng, 8, 5, n_port=1)
    states = stager.upload_new(xoroshiro_states_host(64, seed=9))
    idx = stager.upload_new(np.zeros(64, np.int32))
    counts = np.zeros(5)
    for _ in range(128):
        replay.sample(states, idx, stream=stream)
        counts += np.bincount(stager.download(idx), minlength=5)
    expected = counts.sum() / 5
    assert np.all(np.abs(counts - expected) < 5 * math.sqrt(expected * 0.8))


@pytest.mark.parametrize("n_port", [N_PORTFOLIO, 3])
def test_gather_stacks_s_then_s_prime(stream, stager, rng, n_port):
    """One-step gather: 9 samples of a ring of 50, one of them slot -1 (an empty ring's) and two the same slot:
    rows and port hold s in 0..8 and s' in 9..17; every element equals the reference exactly (NaN where
    expected), and the discount is the float32 product gamma * (1 - done) the learner formed before n-step."""
    replay, host = filled_ring(stager, stream, rng, 50, 50, n_port)
    idx = rng.integers(0, 50, 9).astype(np.int32)
    idx[4], idx[7] = -1, idx[2]
    batch = ReplayBatch(9, stream=stream, n_port=n_port)
    for name in ("rows", "port", "actions", "rewards", "discounts"):  # poison the outputs
        arr = getattr(batch, name)
        stager.upload(np.full(arr.shape, -9, arr.dtype), arr)
    stager.upload(idx, batch.idx)
    replay.gather(batch, stride=1, n_step=1, gamma=0.9, stream=stream)
    want = reference.replay_gather64(host, idx)
    want["discounts"] = np.where(idx >= 0, np.float32(0.9) * (np.float32(1.0) - host["done"][idx]), 0.0)
    for name, expected in want.items():
        np.testing.assert_array_equal(stager.download(getattr(batch, name)), expected, err_msg=name)


def episodes_ring(rng, n_envs, steps, capacity):
    """A ring written as a collect writes it: n_envs environments step `steps` times (N slots a step, the ring
    wrapping), each walking consecutive rows with random dones (an auto-reset to a fresh row follows) and a
    restart at a fresh row without a done every 5 steps (the collect's per-epoch reset)."""
    host = {k: np.zeros((capacity, *v.shape[1:]), v.dtype) for k, v in random_step(rng, 1, 3).items()}
    row = rng.integers(0, 10_000, n_envs)
    cursor = size = 0
    for t in range(steps):
        if t % 5 == 0:
            row = rng.integers(0, 10_000, n_envs)
        done = (rng.random(n_envs) < 0.15).astype(np.float32)
        slots = (cursor + np.arange(n_envs)) % capacity
        host["row"][slots], host["next_row"][slots] = row, row + 1
        host["port"][slots] = rng.normal(size=(n_envs, 3))
        host["next_port"][slots] = rng.normal(size=(n_envs, 3))
        host["action"][slots] = rng.integers(0, 3, (n_envs, 4))
        host["reward"][slots] = rng.normal(size=n_envs)
        host["done"][slots] = done
        row = np.where(done > 0, rng.integers(0, 10_000, n_envs), row + 1)
        cursor, size = (cursor + n_envs) % capacity, min(size + n_envs, capacity)
    host["meta"] = np.array([cursor, size], np.int32)
    # A trap for the write-order check: the slot after each newest transition (the oldest slot of a full
    # ring, an unwritten one of a part-full ring) continues its row, so only the write order stops the chain.
    newest, beyond = (cursor - n_envs + np.arange(n_envs)) % capacity, (cursor + np.arange(n_envs)) % capacity
    host["done"][newest] = 0.0
    host["row"][beyond] = host["next_row"][newest]
    return host


@pytest.mark.parametrize(("n_step", "capacity", "steps"), [(4, 40, 13), (3, 64, 9), (1, 40, 13)])
def test_n_step_gather_follows_each_environment(stream, stager, rng, n_step, capacity, steps):
    """5 environments written as a collect writes them into a ring that wraps (capacity 40 after 13 steps)
    or is part full (64 after 9 steps), every slot sampled once: the n-step rewards, discounts and s' of each
    equal the float64 chain of gather64 (rtol 1e-6: float32 sums of <= 4 terms of |r| < 5, and gamma**k).
    The chains stop at dones, at the every-5-steps restarts and at the ring's newest slots; the test checks
    that each kind of stop happens, so it cannot pass on chains that never start or never stop."""
    host = episodes_ring(rng, 5, steps, capacity)
    size = int(host["meta"][1])
    replay = ReplayBuffer(capacity, stream=stream, n_port=3)
    replay.upload(host, stager)
    idx = np.arange(size, dtype=np.int32)
    batch = ReplayBatch(size, stream=stream, n_port=3)
    stager.upload(idx, batch.idx)
    replay.gather(batch, stride=5, n_step=n_step, gamma=0.9, stream=stream)
    want = reference.replay_gather64(host, idx, stride=5, n_step=n_step, gamma=0.9)
    for name in ("rows", "port", "actions"):
        np.testing.assert_array_equal(stager.download(getattr(batch, name)), want[name], err_msg=name)
    for name in ("rewards", "discounts"):
        np.testing.assert_allclose(stager.download(getattr(batch, name)), want[name], rtol=1e-6, atol=1e-7,
                                   err_msg=name)
    lengths = np.round(np.log(np.maximum(want["discounts"], 1e-30)) / np.log(0.9)).astype(int)
    alive = host["done"][idx] == 0
    if n_step > 1:
        assert (lengths[alive] == n_step).any() and (lengths[alive] < n_step).any()  # full and cut chains
        assert (want["discounts"] == 0).any()  # a chain that ended on a terminal


def test_sample_and_gather_check_their_arguments(stream, stager):
    replay = ReplayBuffer(4, stream=stream)
    states = stager.upload_new(xoroshiro_states_host(3, seed=1))
    with pytest.raises(ValueError, match=r"states must be xoroshiro128p states \[>= 4\]"):
        replay.sample(states, stager.upload_new(np.zeros(4, np.int32)), stream=stream)
    with pytest.raises(ValueError, match="port2 must be"):
        replay.gather(ReplayBatch(2, stream=stream, n_port=3), stride=1, gamma=0.9, stream=stream)
    with pytest.raises(ValueError, match="n_step >= 1, 1 <= stride <= 4"):
        replay.gather(ReplayBatch(2, stream=stream), stride=5, gamma=0.9, stream=stream)
