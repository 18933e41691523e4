"""A whole collect loop driven through a StepGraph with a fixed action source (actions drawn by a kernel
from a seeded stream): observe -> actions -> replay put_obs -> env step -> replay put_result -> rollout ISV.
120 steps twice with the same seeds give identical replay buffers, ISV and metrics; the buffer's
transitions chain (each non-terminal transition's next observation is the environment's next observed
one); this is the loop the integrator wires the network into (replacing `random_actions`)."""

from __future__ import annotations

import numpy as np
import pytest
from reference_env import Windows, env_config, random_feature_set

from fox_numba.agent.environment import VecEnv
from fox_numba.agent.fold_market import FoldMarket
from fox_numba.agent.replay import STORED, ReplayBuffer
from fox_numba.config import FeatureConfig
from fox_numba.device.graphs import StepGraph
from fox_numba.device.isv import Isv, IsvBus
from fox_numba.device.memory import device_empty, device_zeros
from fox_numba.device.rng import xoroshiro_states
from fox_numba.kernels.env import random_actions
from fox_numba.observation import market_columns, obs_dim

pytestmark = pytest.mark.usefixtures("long_switch_interval")
N_ENVS, CAPACITY, STEPS = 4, 64, 120

MARKET_COLS = market_columns(FeatureConfig())  # the default observation's market part and width
OBS_COLS = obs_dim(FeatureConfig())


def collect(stager, seed: int, steps: int = STEPS):
    """Build a fold, an environment, a replay buffer and the collect StepGraph; replay it `steps` times."""
    stream = stager.stream
    fs = random_feature_set(np.random.default_rng(123), [14, 11, 3, 12, 9])
    env_cfg = env_config(episode_bars=8, w_timing=0.5, w_persist=0.2, w_regime=0.3, w_novelty=0.1, w_stable=0.1)
    market = FoldMarket.build(fs, Windows(0, 4, 4, 5, 2), FeatureConfig(), env_cfg)
    bus = IsvBus(stager)
    env = VecEnv(market.upload(stager), env_cfg, FeatureConfig(), bus.values, stager=stager, n_envs=N_ENVS, seed=seed)
    replay = ReplayBuffer(CAPACITY, stream=stream)
    action_states = xoroshiro_states(N_ENVS, seed + 1000, stager)
    actions = device_zeros((N_ENVS, 4), np.int32, stream=stream)
    obs = device_empty((N_ENVS, OBS_COLS), np.float32)

    def body(s):
        env.observe(obs, stream=s)
        random_actions(action_states, actions, stream=s)  # the network forward + action selection go here
        replay.put_obs(env.row, env.port, actions, env.entry, stream=s)
        env.step(actions, stream=s)
        replay.put_result(env.reward, env.done, env.next_row, env.next_port, stream=s)
        env.rollout_stats(actions, stream=s)

    graph = StepGraph("collect", body, stream, use_graph=True)
    for _ in range(steps):
        graph.replay()
    stream.synchronize()
    metrics = env.read_metrics(stream=stream)
    last_obs = stager.download(obs)
    return replay.download(stager), stager.download(bus.values), metrics, last_obs, market, graph


def test_collect_loop_is_deterministic_and_chains_its_transitions(stager):
    first = collect(stager, seed=21)
    second = collect(stager, seed=21)
    buf, isv, metrics, last_obs, market, graph = first
    assert len(graph.launches) == 7 and graph.replays == STEPS
    for k in (*STORED, "meta"):
        np.testing.assert_array_equal(second[0][k], buf[k], err_msg=k)
    np.testing.assert_array_equal(second[1], isv)
    assert second[2] == metrics
    np.testing.assert_array_equal(second[3], last_obs)

    np.testing.assert_array_equal(buf["meta"], [STEPS * N_ENVS % CAPACITY, CAPACITY])
    assert metrics["steps"] == STEPS * N_ENVS and metrics["episodes"] > 50
    assert 0 < metrics["fill_rate"] <= 1 and metrics["turnover"] > 0
    assert isv[Isv.ACT_SHORT_FRAC_EMA] > 0 and isv[Isv.REWARD_PNL_EMA] > 0 and isv[Isv.EPISODE_RETURN_EMA] != 0
    # slot of (step k, env i) = (k * N + i) % C: the ring holds the last C / N steps
    cursor = int(buf["meta"][0])
    order = [(cursor + j) % CAPACITY for j in range(CAPACITY)]  # oldest first
    for j in range(CAPACITY - N_ENVS):
        a, b = order[j], order[j + N_ENVS]  # same environment, consecutive steps
        if buf["done"][a] == 0:
            assert buf["next_row"][a] == buf["row"][b] and buf["row"][b] == buf["row"][a] + 1
            np.testing.assert_array_equal(buf["next_port"][a], buf["port"][b])
        else:
            assert buf["row"][b] in market.train_starts and buf["port"][b][0] == 0
    # the last observation gathered is market_obs[row] | port of the last step's observed state
    for i in range(N_ENVS):
        slot = order[CAPACITY - N_ENVS + i]
        np.testing.assert_array_equal(last_obs[i, :MARKET_COLS], market.market_obs[buf["row"][slot]])
        np.testing.assert_array_equal(last_obs[i, MARKET_COLS:], buf["port"][slot])


def test_another_seed_collects_other_transitions(stager):
    a = collect(stager, seed=1, steps=20)[0]
    b = collect(stager, seed=2, steps=20)[0]
    assert not np.array_equal(a["row"], b["row"])
