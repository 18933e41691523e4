"""kernels/counterfactual.py against the float64 reference environment (tests/reference_env.py).

Transitions come from reference environments stepped with random directions, market orders of one fixed size and
random urgencies on random books (small sizes, so orders walk several levels and past the shown depth), in collect
mode with five-bar episodes (forced closes and auto-resets). Before every step each environment's state is copied
and stepped once with each of the four directions: those are the expected rows of the pseudo-batch. Every output
element is checked: the copied ones exactly, the computed rewards and next portfolios to float32 tolerance. With
held positions (`held=True`), transitions k = 1, 2, 3 mod 4 are also stepped from a copy re-held at (k mod 4 - 2) T
contracts, entered at the bar's mid one bar earlier, with no resting order: those are their expected rows. With a
history (`history=H`), the copy has been held a drawn number of bars, entered at that many bars' earlier mid, the
draw computed here from tests/reference.py's twin of the counter-based hash.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
from reference import hash_uniform64
from reference_env import F32_TOL, Params, ReferenceEnv, StepOut, Windows, env_config, random_feature_set

from fox_numba.agent.environment import env_params
from fox_numba.agent.fold_market import FoldMarket
from fox_numba.agent.replay import ReplayBatch
from fox_numba.config import FeatureConfig
from fox_numba.device.rng import xoroshiro_states_host
from fox_numba.kernels.counterfactual import counterfactual_batch
from fox_numba.observation import PORT_BARS_IN_POS, PORT_BARS_LEFT, PORT_ORDER_SIDE, PORT_POSITION, PORT_UPNL

SHORT, HOLD, LONG, FLAT = range(4)
GAMMA = 0.9
N_ENVS, STEPS = 8, 12
pytestmark = pytest.mark.usefixtures("long_switch_interval")


def _action(d: int, magnitude: int, urgency: int) -> list[int]:
    return [d, magnitude if d in (SHORT, LONG) else 0, 0, urgency]


def reference_transitions(seed: int, magnitude: int, history: int = 0, position_history: bool = True,
                          hold_bars: int = 1) -> tuple[FoldMarket, object, dict[str, np.ndarray]]:
    """The market, its env config and the stored transitions with every direction's expected outcome (re-held with
    histories of up to `history` bars; env.position_history as given; each direction's position held `hold_bars`
    bars: `held_for`)."""
    rng = np.random.default_rng(seed)
    fs = random_feature_set(rng, [12, 9, 3, 10, 8])
    env = env_config(episode_bars=5, position_history=position_history)
    market = FoldMarket.build(fs, Windows(0, 4, 4, 5, 2), FeatureConfig(), env)
    ref = ReferenceEnv(market, Params.of(market, env, FeatureConfig()), "collect", xoroshiro_states_host(N_ENVS, seed))
    ref.reset()
    rec: dict[str, list] = {k: [] for k in ("row", "port", "entry", "action", "reward", "done", "next_row",
                                            "next_port", "cf_reward", "cf_port", "held_port", "held_reward",
                                            "held_next_port", "cf_next_row", "cf_discount", "held_next_row",
                                            "held_discount")}  # fmt: skip
    for _ in range(STEPS):
        for i, e in enumerate(ref.envs):
            urgency = int(rng.integers(0, 3))
            outs = [held_for(ref, i, e, _action(d, magnitude, urgency), hold_bars) for d in range(4)]
            n = len(rec["row"])  # the transition's place in the batch, and its replay slot (run_kernel's idx)
            held = reheld(ref, e, (n % 4 - 2) * ref.p.targets[magnitude], held_bars(market, e.row, n, history))
            held_outs = [held_for(ref, i, held, _action(d, magnitude, urgency), hold_bars) for d in range(4)]
            rec["held_port"].append(list(held.port))
            rec["held_reward"].append([o.reward for o in held_outs])
            rec["held_next_port"].append([o.next_port for o in held_outs])
            rec["held_next_row"].append([o.next_row for o in held_outs])
            rec["held_discount"].append([o.done for o in held_outs])
            rec["row"].append(e.row)
            rec["port"].append(list(e.port))
            rec["entry"].append(e.avg)
            taken = _action(int(rng.integers(0, 4)), magnitude, urgency)
            out = ref.step_one(i, e, taken, 0.05)
            if hold_bars == 1:
                assert out.reward == outs[taken[0]].reward  # the copies step as the environment does
            rec["action"].append(taken)
            rec["reward"].append(out.reward)
            rec["done"].append(out.done)
            rec["next_row"].append(out.next_row)
            rec["next_port"].append(out.next_port)
            rec["cf_reward"].append([o.reward for o in outs])
            rec["cf_port"].append([o.next_port for o in outs])
            rec["cf_next_row"].append([o.next_row for o in outs])
            rec["cf_discount"].append([o.done for o in outs])
    arrays = {k: np.asarray(v) for k, v in rec.items()}
    return market, env, arrays


def held_for(ref: ReferenceEnv, i: int, e, action: list[int], bars: int) -> StepOut:
    """A copy of state e stepped with `action`, then with Hold until `bars` bars or the episode's end: the reward
    sum_s GAMMA^s r_s, the last step's next row and portfolio, and in `done` the discount (GAMMA^steps, 0 at the
    episode's end; one bar: the plain step, done as stepped)."""
    h = copy.deepcopy(e)
    out = ref.step_one(i, h, action, 0.05)
    if bars == 1:
        return out
    total, g, steps = float(out.reward), GAMMA, 1
    while not out.done and steps < bars:
        out = ref.step_one(i, h, _action(HOLD, 0, action[3]), 0.05)
        total += g * float(out.reward)
        g *= GAMMA
        steps += 1
    return StepOut(np.float32(total), 0.0 if out.done else g, out.next_row, out.next_port, out.comps, out.stats)


def held_bars(market: FoldMarket, row: int, i: int, history: int) -> int:
    """Bars a re-held position of transition i (replay slot i) at `row` has been held: 1 + floor(u span), span =
    min(bars since the day's first + 1, history), u the hash of (slot, place, 0, row); 1 when span <= 1."""
    span = min(row - int(market.day_first[row]) + 1, history)
    return 1 + int(np.floor(hash_uniform64(i, i, 0, row) * span)) if span > 1 else 1


def reheld(ref: ReferenceEnv, e, pos: int, bars: int = 1):
    """A copy of environment state e holding `pos` contracts for `bars` bars, entered at the mid bars - 1 bars before
    its bar (one bar: at its bar's mid), no resting order."""
    h = copy.deepcopy(e)
    mid = float(ref.m.mid[h.row])
    h.pos, h.bars_in_pos = pos, bars if pos != 0 else 0
    h.avg = float(ref.m.mid[h.row - bars + 1]) if pos != 0 else 0.0
    h.oside = h.osize = h.olife = 0
    h.oprice = h.oqueue = 0.0
    bars_left = h.port[PORT_BARS_LEFT]
    h.port = ref.portfolio(pos, h.avg, h.bars_in_pos, 0, 0.0, mid, h.row, h.last)
    assert h.port[PORT_BARS_LEFT] == bars_left
    return h


def run_kernel(stager, market, env, t: dict[str, np.ndarray], magnitude: int, held: bool = False, history: int = 0,
               hold_bars: int = 1) -> dict[str, np.ndarray]:  # fmt: skip
    n = len(t["row"])
    batch, out = ReplayBatch(n, stream=stager.stream), ReplayBatch(4 * n, stream=stager.stream)
    stager.upload(np.arange(n, dtype=np.int32), batch.idx)
    stager.upload(np.concatenate([t["row"], t["next_row"]]).astype(np.int32), batch.rows)
    stager.upload(np.concatenate([t["port"], t["next_port"]]).astype(np.float32), batch.port)
    stager.upload(t["action"].astype(np.int32), batch.actions)
    stager.upload(t["reward"].astype(np.float32), batch.rewards)
    stager.upload((GAMMA * (1.0 - t["done"])).astype(np.float32), batch.discounts)
    params = stager.upload_new(env_params(market, env, FeatureConfig()))
    entry = stager.upload_new(t["entry"].astype(np.float64))
    counterfactual_batch(market.upload(stager), params, entry, magnitude, batch, out, held=held, history=history,
                         hold_bars=hold_bars, gamma=GAMMA, stream=stager.stream)  # fmt: skip
    return {k: stager.download(getattr(out, k)) for k in ("rows", "port", "actions", "rewards", "discounts")}


@pytest.mark.parametrize("magnitude", [1, 2])
def test_every_direction_matches_the_reference_environment(stager, magnitude):
    market, env, t = reference_transitions(11 + magnitude, magnitude)
    n = len(t["row"])
    got = run_kernel(stager, market, env, t, magnitude)
    d = np.tile(np.arange(4), n)
    i = np.repeat(np.arange(n), 4)
    taken = d == t["action"][i, 0]
    assert taken.sum() == n and (~taken).sum() == 3 * n
    moved = np.array([[a != b for a, b in zip(r, r[1:], strict=False)] for r in t["cf_reward"]]).any()
    assert moved  # the directions' rewards differ somewhere: the comparison below can fail
    np.testing.assert_array_equal(got["rows"], np.concatenate([t["row"][i], t["next_row"][i]]))
    np.testing.assert_array_equal(got["port"][: 4 * n], t["port"][i].astype(np.float32))
    expected_actions = np.stack([d, np.where((d == SHORT) | (d == LONG), magnitude, 0), np.zeros_like(d),
                                 t["action"][i, 3]], axis=1)  # fmt: skip
    np.testing.assert_array_equal(got["actions"], expected_actions)
    np.testing.assert_array_equal(got["discounts"], (GAMMA * (1.0 - t["done"][i])).astype(np.float32))
    cf_reward = t["cf_reward"][i, d].astype(np.float32)
    cf_port = t["cf_port"][i, d].astype(np.float32)
    np.testing.assert_array_equal(got["rewards"][taken], t["reward"].astype(np.float32))
    np.testing.assert_array_equal(got["port"][4 * n :][taken], t["next_port"].astype(np.float32))
    np.testing.assert_allclose(got["rewards"][~taken], cf_reward[~taken], **F32_TOL)
    np.testing.assert_allclose(got["port"][4 * n :][~taken], cf_port[~taken], **F32_TOL)
    assert t["done"].any() and (t["port"][:, 0] != 0).any()  # forced closes and held positions were priced


@pytest.mark.parametrize(("magnitude", "history", "position_history"), [(0, 0, True), (2, 0, True), (1, 6, True),
                                                                       (1, 6, False)])
def test_held_positions_match_the_reference_environment(stager, magnitude, history, position_history):
    """held=True: transition k = 0 mod 4 as without it; the others from their re-held state (held one bar, or a drawn
    history of up to `history` bars), every direction priced (the taken one too), the s rows' portfolio that
    state's (its unrealised PnL and bars in position 0 without env.position_history)."""
    market, env, t = reference_transitions(21 + magnitude, magnitude, history, position_history)
    n = len(t["row"])
    got = run_kernel(stager, market, env, t, magnitude, held=True, history=history)
    plain = run_kernel(stager, market, env, t, magnitude)
    i = np.repeat(np.arange(n), 4)
    d = np.tile(np.arange(4), n)
    kept = i % 4 == 0
    for k in ("rows", "actions", "discounts"):
        np.testing.assert_array_equal(got[k], plain[k])
    np.testing.assert_array_equal(got["rewards"][kept], plain["rewards"][kept])
    both = np.concatenate([kept, kept])
    np.testing.assert_array_equal(got["port"][both], plain["port"][both])
    held = ~kept
    np.testing.assert_allclose(got["port"][: 4 * n][held], t["held_port"][i][held].astype(np.float32), **F32_TOL)
    np.testing.assert_allclose(got["rewards"][held], t["held_reward"][i, d][held].astype(np.float32), **F32_TOL)
    np.testing.assert_allclose(got["port"][4 * n :][held], t["held_next_port"][i, d][held].astype(np.float32),
                               **F32_TOL)  # fmt: skip
    positions = np.round(got["port"][: 4 * n, PORT_POSITION] * env.max_position)
    target = Params.of(market, env, FeatureConfig()).targets[magnitude]
    np.testing.assert_array_equal(positions[held], ((i % 4 - 2) * target)[held])
    stored = np.round(t["port"][i, PORT_POSITION] * env.max_position)
    assert (positions[held] != stored[held]).mean() > 0.3  # most re-held states differ from the stored ones
    assert not np.allclose(got["rewards"][held], plain["rewards"][held])  # and so do their rewards
    bars = np.round(got["port"][: 4 * n, PORT_BARS_IN_POS] * env.episode_bars)[held & (positions != 0)]
    if position_history:
        assert (bars > 1).any() == (history > 1) and (bars >= 1).all()  # histories drawn only when asked for
    else:
        assert (bars == 0).all() and (got["port"][:, PORT_UPNL] == 0).all()


def test_a_transition_it_cannot_price_makes_its_untaken_rows_nan(stager):
    """A resting order in the state, or a taken order type other than Market: NaN rewards on the untaken rows (the
    learner's non-finite guard then skips the step); the taken row keeps what happened."""
    market, env, t = reference_transitions(5, 2)
    t["port"][0, PORT_ORDER_SIDE] = 1.0
    t["action"][1, 2] = 1
    n = len(t["row"])
    got = run_kernel(stager, market, env, t, 2)
    rewards = got["rewards"].reshape(n, 4)
    for k in (0, 1):
        taken = t["action"][k, 0]
        assert rewards[k, taken] == np.float32(t["reward"][k])
        assert np.isnan(np.delete(rewards[k], taken)).all()
    assert np.isfinite(rewards[2:]).all()


def test_the_wrapper_refuses_a_batch_of_another_size(stager):
    market, env, t = reference_transitions(3, 2)
    n = len(t["row"])
    batch, out = ReplayBatch(n, stream=stager.stream), ReplayBatch(4 * n - 4, stream=stager.stream)
    params = stager.upload_new(env_params(market, env, FeatureConfig()))
    entry = stager.upload_new(np.zeros(n))
    with pytest.raises(ValueError, match="4 rows per transition"):
        counterfactual_batch(market.upload(stager), params, entry, 2, batch, out, stream=stager.stream)


@pytest.mark.parametrize(("magnitude", "held"), [(1, False), (2, True)])
def test_held_targets_match_the_reference_environment_held_for_k_bars(stager, magnitude, held):
    """hold_bars=3: every priced row holds its direction's position three bars (cut at the episode's end, where it
    closes): the discounted reward, the s' row and portfolio three bars on, the discount GAMMA^k or 0; a kept
    transition's taken direction stays the stored one-step transition. Five-bar episodes cut many holds short."""
    k = 3
    market, env, t = reference_transitions(31 + magnitude, magnitude, hold_bars=k)
    n = len(t["row"])
    got = run_kernel(stager, market, env, t, magnitude, held=held, hold_bars=k)
    i = np.repeat(np.arange(n), 4)
    d = np.tile(np.arange(4), n)
    rehold = held & (i % 4 != 0)
    stored = (d == t["action"][i, 0]) & ~rehold
    priced = ~stored
    expect = {name: np.where(rehold, t[f"held_{name}"][i, d].T, t[f"cf_{name}"][i, d].T).T
              for name in ("reward", "next_row", "discount")}  # fmt: skip
    expect["port"] = np.where(rehold[:, None], t["held_next_port"][i, d], t["cf_port"][i, d])
    np.testing.assert_array_equal(got["rows"][4 * n :][stored], t["next_row"][i][stored])
    np.testing.assert_array_equal(got["rows"][4 * n :][priced], expect["next_row"][priced])
    np.testing.assert_array_equal(got["rows"][: 4 * n], t["row"][i])
    np.testing.assert_array_equal(got["rewards"][stored], t["reward"][i][stored].astype(np.float32))
    np.testing.assert_allclose(got["rewards"][priced], expect["reward"][priced].astype(np.float32), **F32_TOL)
    np.testing.assert_array_equal(got["discounts"][stored], (GAMMA * (1.0 - t["done"][i]))[stored].astype(np.float32))
    np.testing.assert_allclose(got["discounts"][priced], expect["discount"][priced].astype(np.float32), **F32_TOL)
    np.testing.assert_allclose(got["port"][4 * n :][priced], expect["port"][priced].astype(np.float32), **F32_TOL)
    steps = got["rows"][4 * n :][priced] - got["rows"][: 4 * n][priced]
    assert set(np.unique(steps)) == {1, 2, 3}  # holds of every length, the episode's end cutting some
    assert (got["discounts"][priced] == 0).any() and np.isclose(got["discounts"][priced], GAMMA**k).any()
