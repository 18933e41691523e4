"""gather_obs (observation rows from market rows + portfolio features) and the random action source against
numpy references; the reference xoroshiro generator against numba's."""

from __future__ import annotations

import numpy as np
import pytest
from reference_env import uniform32, uniform64

from fox_numba.device.memory import device_empty
from fox_numba.device.rng import (
    xoroshiro128p_uniform_float32,
    xoroshiro128p_uniform_float64,
    xoroshiro_states,
    xoroshiro_states_host,
)
from fox_numba.kernels.env import gather_obs, random_actions
from fox_numba.observation import N_MARKET, N_PORTFOLIO, OBS_DIM

pytestmark = pytest.mark.usefixtures("long_switch_interval")


@pytest.mark.parametrize("lanes", [1, 4, 32])
def test_gather_obs_copies_rows_and_portfolio(stream, stager, rng, lanes):
    """21 rows (not a multiple of the 8 rows per block) gathered from 13 market rows, repeats included:
    every element equals the numpy gather exactly, whatever the lanes per row."""
    market = rng.normal(size=(13, N_MARKET)).astype(np.float32)
    rows = rng.integers(0, 13, 21).astype(np.int32)
    port = rng.normal(size=(21, N_PORTFOLIO)).astype(np.float32)
    obs = device_empty((21, OBS_DIM), np.float32)
    gather_obs(stager.upload_new(market), stager.upload_new(rows), stager.upload_new(port), obs, stream=stream,
               lanes=lanes)  # fmt: skip
    np.testing.assert_array_equal(stager.download(obs), np.concatenate([market[rows], port], axis=1))


@pytest.mark.parametrize("lanes", [1, 4])
def test_gather_obs_of_narrow_rows_and_rows_outside_the_market(stream, stager, rng, lanes):
    """The learner's use: 2B = 18 rows (s rows, then s' rows) of a narrow observation (M + P = 4 + 3, the
    widths come from the arrays); rows -1 and 20 lie outside the 20 market rows and get a NaN market part
    and their portfolio part. Every element equals the numpy gather exactly (NaN where expected)."""
    n_bars, n_market, n_port = 20, 4, 3
    market = rng.normal(size=(n_bars, n_market)).astype(np.float32)
    rows = rng.integers(0, n_bars, 18).astype(np.int32)
    rows[[5, 12]] = [-1, n_bars]
    port = rng.normal(size=(18, n_port)).astype(np.float32)
    obs = stager.upload_new(np.full((18, n_market + n_port), -9.0, np.float32))
    gather_obs(stager.upload_new(market), stager.upload_new(rows), stager.upload_new(port), obs, stream=stream,
               lanes=lanes)  # fmt: skip
    want_market = market[np.clip(rows, 0, n_bars - 1)]
    want_market[[5, 12]] = np.nan
    np.testing.assert_array_equal(stager.download(obs), np.concatenate([want_market, port], axis=1))


def test_gather_obs_checks_its_arguments(stream, stager):
    market = stager.upload_new(np.zeros((4, N_MARKET), np.float32))
    rows = stager.upload_new(np.zeros(3, np.int32))
    port = stager.upload_new(np.zeros((3, N_PORTFOLIO), np.float32))
    with pytest.raises(ValueError, match="obs must be a C-contiguous float32 array"):
        gather_obs(market, rows, port, device_empty((3, OBS_DIM - 1), np.float32), stream=stream)
    with pytest.raises(ValueError, match="rows must be"):
        gather_obs(market, rows, port, device_empty((2, OBS_DIM), np.float32), stream=stream)


def test_reference_generator_is_numbas():
    states = xoroshiro_states_host(3, 17)
    ours = [[int(s["s0"]), int(s["s1"])] for s in states]
    for i in range(3):
        for _ in range(5):
            assert uniform64(ours[i]) == xoroshiro128p_uniform_float64(states, i)
            assert uniform32(ours[i]) == xoroshiro128p_uniform_float32(states, i)


def test_random_actions_are_uniform_draws_in_order(stream, stager):
    """40 environments x 3 steps: direction, magnitude, order, urgency from 4 float32 draws in that order,
    Hold / Flat record magnitude 0; the states advance by exactly 4 draws per step."""
    n = 40
    states = xoroshiro_states(n, 5, stager)
    ref = [[int(s["s0"]), int(s["s1"])] for s in xoroshiro_states_host(n, 5)]
    actions = device_empty((n, 4), np.int32)
    for _ in range(3):
        random_actions(states, actions, stream=stream)
        expected = np.array(
            [[min(int(uniform32(r) * np.float32(k)), k - 1) for k in (4, 3, 3, 3)] for r in ref], np.int32
        )
        expected[np.isin(expected[:, 0], (1, 3)), 1] = 0
        np.testing.assert_array_equal(stager.download(actions), expected)
    got = stager.download(states)
    np.testing.assert_array_equal(np.stack([got["s0"], got["s1"]], axis=1), np.array(ref, np.uint64))
