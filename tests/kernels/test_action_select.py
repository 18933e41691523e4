"""Action selection against float64 numpy references (the seed's Plan C tests T6, T8, T9).

Evaluation is compared exactly with argmax E[Q] (and bit for bit with `expected_q`'s E[Q]); training is
compared per sample with a float64 replay of the policy on the same uniforms (drawn on the host from the
same xoroshiro states), and its frequencies with exact analytic probabilities: Thompson direction counts
by a chi-square test against P(direction wins) summed over atom values (exact ties shared fairly),
Boltzmann histograms within the seed's +-5% absolute. Each statistical test also shows that the
alternatives a broken kernel would implement fail it but for a chance below 1e-6, at the smallest n that
allows (the simulator pays about 7 ms per sample); the GPU test at 2**20 samples resolves biases of 0.003.

Under the simulator, which pays for every thread, the batches run with one thread per sample
(`lanes=1`); `test_every_launch_shape_gives_the_same_bits` shows that the production shape (16 lanes)
and others give the same bits, and on a GPU every test runs the production shape.
"""

import itertools
import math
import sys

import numpy as np
import pytest
from reference import atoms32, atoms64, dueling32, dueling64, expected_q64, linear_support, random_support, softmax64

from fox_numba.actions import (
    BRANCHES,
    MAGNITUDE_FRACTIONS,
    N_BRANCHES,
    N_DIRECTIONS,
    N_HEADS,
    Direction,
    Magnitude,
    OrderType,
)
from fox_numba.device.graphs import StepGraph
from fox_numba.device.memory import device_empty
from fox_numba.device.rng import (
    xoroshiro128p_next,
    xoroshiro128p_uniform_float32,
    xoroshiro_states,
    xoroshiro_states_host,
)
from fox_numba.device.runtime import SIMULATOR
from fox_numba.kernels.action_select import (
    DRAW_BRANCH,
    DRAW_DIRECTION,
    DRAW_TIE,
    DRAWS,
    FREE_BINS,
    LANES,
    MAX_ATOMS,
    TAU_FLOOR,
    stage_samples,
    select_actions,
)
from fox_numba.kernels.distributional import expected_q
from fox_numba.kernels.heads import head_width

SHORT, HOLD, LONG, FLAT = (int(d) for d in Direction)
CHI2_P_MIN = 1e-6  # a correct kernel fails a chi-square test once in a million seeds
CHI2_3DOF_AT_P_MIN = 30.7  # chi2_sf(30.7, 3) ~ 1e-6: the counts fail above this
# A difference of two E[Q] on 21 atoms with |z| <= 1: twice the expected_q bound 4 (Z + 2) eps max|z|.
CONV_TOL = 2 * 4 * (21 + 2) * 2.0**-24
# float32 rounding moves a cumulative probability or a Boltzmann threshold by far less than this; the
# per-sample replay leaves out samples whose uniform falls this close to one (about 2% of them).
BOUNDARY_MARGIN = 1e-4
TEST_LANES = 1 if SIMULATOR else None  # the simulator pays per thread (see the module docstring)


@pytest.fixture(scope="module", autouse=True)
def millisecond_switch_interval():
    """At lanes = 1 a simulated block is 8 threads with two barriers: a 1 ms GIL switch interval runs these
    launches 20-30% faster than the suite's 0.1 ms (measured), which suits blocks of 64 threads and more."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-3)
    yield
    sys.setswitchinterval(old)


def run_select(stream, stager, logits, support, states, explore, lanes=TEST_LANES, spread=1.0, tau_mult=1.0,
               fixed=FREE_BINS):
    """Upload, select, download: (actions [B, 4], conviction [B])."""
    b = logits.shape[0]
    actions, conviction = device_empty((b, N_BRANCHES), np.int32), device_empty(b, np.float32)
    select_actions(
        stager.upload_new(logits), stager.upload_new(support), states, actions, conviction,
        explore=explore, stream=stream, lanes=lanes, spread=spread, tau_mult=tau_mult, fixed=fixed,
    )  # fmt: skip
    return stager.download(actions), stager.download(conviction)


def eval_policy64(q):
    """Reference evaluation policy on E[Q][B, 13]: argmax per branch (lowest index on ties), Hold/Flat -> 0."""
    acts = np.stack([q[:, b.offset : b.offset + b.size].argmax(axis=1) for b in BRANCHES], axis=1)
    acts[np.isin(acts[:, 0], (HOLD, FLAT)), 1] = 0
    return acts.astype(np.int32)


def conviction64(q, direction):
    qd = q[:, :N_DIRECTIONS]
    others = np.where(np.arange(N_DIRECTIONS) == direction[:, None], -np.inf, qd)
    return qd[np.arange(len(q)), direction] - others.max(axis=1)


def host_uniforms(states_host, n_draws=DRAWS):
    """The uniforms [B, n_draws] a kernel draws from each state, in order (advances a copy of the states)."""
    states = states_host.copy()
    return np.array(
        [[xoroshiro128p_uniform_float32(states, i) for _ in range(n_draws)] for i in range(len(states))], np.float32
    )


def thompson_probs(p, values, ties="fair"):
    """Exact P(direction d has the largest draw) for independent draws from p[4, Z] at atom values[4, Z].

    Summed over the distinct atom values v: P(d draws v) times, over each set T of other directions that
    also draw v (the rest drawing below v), the share of the win d gets: 1 / (|T| + 1) under the kernel's
    fair rule, or all of it if d is the lowest ("lowest") or highest ("highest") direction of the tie.
    """
    p, values = np.asarray(p, np.float64), np.asarray(values)
    grid = np.unique(values)
    eq = np.array([[p[d][values[d] == v].sum() for v in grid] for d in range(len(p))])
    below = np.cumsum(eq, axis=1) - eq
    out = np.zeros(len(p))
    for d in range(len(p)):
        others = [e for e in range(len(p)) if e != d]
        for mask in itertools.product((False, True), repeat=len(others)):
            tied = [e for e, t in zip(others, mask, strict=True) if t]
            prob = eq[d].copy()
            for e, t in zip(others, mask, strict=True):
                prob *= eq[e] if t else below[e]
            share = {
                "fair": 1 / (len(tied) + 1),
                "lowest": float(all(d < e for e in tied)),
                "highest": float(all(d > e for e in tied)),
            }[ties]
            out[d] += share * prob.sum()
    return out


def shared_uniform_probs(p):
    """P(d wins) if one uniform drove all four draws (a plausible bug) on one shared support: X_d = F_d^-1(u),
    comonotone, ties to the lowest."""
    cdf = np.cumsum(p, axis=1)
    edges = np.unique(np.concatenate([[0.0, 1.0], np.clip(cdf.ravel(), 0, 1)]))
    out = np.zeros(4)
    for lo, hi in itertools.pairwise(edges):
        idx = [int(np.searchsorted(cdf[d], (lo + hi) / 2, side="right")) for d in range(4)]
        out[int(np.argmax(idx))] += hi - lo
    return out


def select64(logits, support, u, spread=1.0, tau_mult=1.0, mean=None):
    """The training policy replayed in float64 on the kernel's uniforms u[B, DRAWS]: (actions [B, 4], clear [B]).
    A direction draws E[Q] + spread * (atom - E[Q]), or with the mean head's values `mean` [B, 4]
    mean + spread * (atom - E[Q]); Boltzmann runs at tau = max(tau_mult * range, TAU_FLOOR).

    clear is False where float32 rounding could decide the sample: a uniform within BOUNDARY_MARGIN of a
    cumulative probability or Boltzmann threshold, or two direction draws within 2 ulps but not equal."""
    _, _, z = logits.shape
    p = softmax64(logits)
    q = (p * atoms64(support, z)).sum(axis=-1)
    ud = u[:, DRAW_DIRECTION : DRAW_DIRECTION + N_DIRECTIONS].astype(np.float64)[..., None]
    cdf = np.cumsum(p[:, :N_DIRECTIONS], axis=-1)
    atom = np.minimum((cdf <= ud).sum(axis=-1), z - 1)  # the first atom whose cumulative probability exceeds u
    clear = ~np.any(np.abs(cdf[..., :-1] - ud) < BOUNDARY_MARGIN, axis=(1, 2))
    draws = np.take_along_axis(atoms32(support[:, :N_DIRECTIONS], z), atom[..., None], axis=-1)[..., 0]
    if spread != 1.0 or mean is not None:
        centre = q[:, :N_DIRECTIONS] if mean is None else mean
        draws = centre + spread * (draws - q[:, :N_DIRECTIONS])
        clear &= ~np.any(np.abs(draws[:, :, None] - draws[:, None, :]) + np.eye(N_DIRECTIONS) < 1e-5, axis=(1, 2))
    top = draws.max(axis=1, keepdims=True)
    tied = draws == top
    clear &= ~np.any(~tied & (np.abs(draws - top) <= 2 * np.spacing(np.abs(top))), axis=1)
    n_tied = tied.sum(axis=1)
    pick = np.minimum((u[:, DRAW_TIE] * n_tied.astype(np.float32)).astype(np.int64), n_tied - 1)
    direction = np.array([np.flatnonzero(t)[k] for t, k in zip(tied, pick, strict=True)])
    acts = [direction]
    for k, br in enumerate(BRANCHES[1:]):
        qs = q[:, br.offset : br.offset + br.size]
        tau = np.maximum(tau_mult * (qs.max(axis=1) - qs.min(axis=1)), float(TAU_FLOOR))[:, None]
        w = np.exp((qs - qs.max(axis=1, keepdims=True)) / tau)
        cum = np.cumsum(w, axis=1)[:, :-1] / w.sum(axis=1, keepdims=True)
        ub = u[:, DRAW_BRANCH + k].astype(np.float64)[:, None]
        acts.append((cum <= ub).sum(axis=1))
        clear &= ~np.any(np.abs(cum - ub) < BOUNDARY_MARGIN, axis=1)
    acts = np.stack(acts, axis=1).astype(np.int32)
    acts[np.isin(acts[:, 0], (HOLD, FLAT)), 1] = 0
    return acts, clear


def chi2_sf(x, dof):
    """Survival function of the chi-square distribution for 2 or 3 degrees of freedom (closed forms)."""
    if dof == 2:
        return math.exp(-x / 2)
    assert dof == 3
    return math.erfc(math.sqrt(x / 2)) + math.sqrt(2 * x / math.pi) * math.exp(-x / 2)


def chi2(counts, probs):
    n = counts.sum()
    return float(np.sum((counts - n * probs) ** 2 / (n * probs)))


def chi2_pass_chance(lam, dof=3, x=CHI2_3DOF_AT_P_MIN):
    """Chernoff bound on P(X <= x) for X noncentral chi-square (dof, noncentrality lam), the law of the statistic
    when the counts come from an alternative: min over t > 0 of exp(t x) E[exp(-t X)], with
    E[exp(-t X)] = exp(-lam t / (1 + 2t)) / (1 + 2t)^(dof / 2)."""
    t = np.geomspace(1e-3, 1e3, 4001)
    return math.exp(np.min(t * x - lam * t / (1 + 2 * t) - dof / 2 * np.log1p(2 * t)))


def assert_alternatives_fail(n, exact, alternatives):
    """Each alternative passes the test at n samples with probability below 1e-6 (as rarely as a correct kernel
    fails it): at noncentrality lam = n * sum (p_alt - p)^2 / p, chi2_pass_chance(lam) < 1e-6 needs lam > 112.
    The noncentral law is the large-n one; simulated at n = 2048, the closest alternative of these tests
    (lam = 136) gave statistics of at least 52 in 2e6 multinomial draws."""
    assert chi2_sf(CHI2_3DOF_AT_P_MIN, 3) < 1.1e-6
    for name, alt in alternatives.items():
        lam = n * np.sum((alt - exact) ** 2 / exact)
        assert chi2_pass_chance(lam) < CHI2_P_MIN, f"{name}: noncentrality {lam:.0f} at n = {n}"


def peaked_logits(n_atoms, peak, height=30.0):
    """Logits with all mass (up to (Z - 1) * exp(-30) ~ 1e-12) on atom `peak`."""
    x = np.zeros(n_atoms, np.float32)
    x[peak] = height
    return x


def test_action_space_layout():
    assert [b.name for b in BRANCHES] == ["direction", "magnitude", "order", "urgency"]
    assert [b.size for b in BRANCHES] == [4, 3, 3, 3] and N_HEADS == 13
    assert [b.offset for b in BRANCHES] == [0, 4, 7, 10]
    assert LONG == 2 and HOLD == 1 and FLAT == 3 and SHORT == 0
    assert OrderType.MARKET == 0 and Magnitude.FULL == 2 and MAGNITUDE_FRACTIONS[Magnitude.FULL] == 1.0
    assert BRANCHES[1].head(2) == 6
    with pytest.raises(ValueError, match="magnitude has bins 0..2"):
        BRANCHES[1].head(3)
    assert (DRAW_DIRECTION, DRAW_TIE, DRAW_BRANCH, DRAWS) == (0, 4, 5, 8)


def test_eval_is_argmax_expected_q_and_ignores_the_rng(stream, stager, rng):
    """Seed T9: 253 samples (the last block partial), 21 atoms, logits uniform in [-1, 1], per-(sample, head)
    supports with v_min in [-1, -0.2] and v_max in [0.2, 1]. Eval equals the float64 argmax E[Q] exactly in every
    branch (each branch's best E[Q] leads its runner-up by more than 1e-5, far above float32 error, so exact
    equality is well defined), is identical under three different RNG states and leaves the states untouched.
    The E[Q] it ranks are `expected_q`'s bit for bit: its argmax (ties to the lowest) and conviction equal
    those computed from expected_q's output exactly. Conviction: within CONV_TOL of the float64 top-two gap."""
    b, z = 253, 21
    logits = rng.uniform(-1, 1, (b, N_HEADS, z)).astype(np.float32)
    support = linear_support(rng.uniform(-1, -0.2, (b, N_HEADS)), rng.uniform(0.2, 1, (b, N_HEADS)), z)
    q = expected_q64(logits, support)
    for br in BRANCHES:
        top2 = np.sort(q[:, br.offset : br.offset + br.size], axis=1)[:, -2:]
        assert np.all(top2[:, 1] - top2[:, 0] > 1e-5), f"{br.name}: a near tie makes exact argmax ill-defined"
    expected = eval_policy64(q)

    runs = []
    for seed in (1, 2, 3):
        states = xoroshiro_states(b, seed, stager)
        runs.append(run_select(stream, stager, logits, support, states, explore=False))
        np.testing.assert_array_equal(stager.download(states), xoroshiro_states_host(b, seed))
    actions, conviction = runs[0]
    np.testing.assert_array_equal(actions, expected)
    assert np.all(np.abs(conviction - conviction64(q, expected[:, 0])) <= CONV_TOL)
    assert np.all(conviction >= 0)
    for other_actions, other_conviction in runs[1:]:
        np.testing.assert_array_equal(other_actions, actions)
        np.testing.assert_array_equal(other_conviction, conviction)

    q32, entropy = device_empty((b, N_HEADS), np.float32), device_empty((b, N_HEADS), np.float32)
    expected_q(stager.upload_new(logits), stager.upload_new(support), q32, entropy, stream=stream)
    q32 = stager.download(q32)
    np.testing.assert_array_equal(actions, eval_policy64(q32))
    qd = np.sort(q32[:, :N_DIRECTIONS], axis=1)
    np.testing.assert_array_equal(conviction, qd[:, -1] - qd[:, -2])


# Exact ties in E[Q]: the heads of a tied set share one logits row (HIGH), so their E[Q] have the same bits;
# the other heads read LOW (E[Q] -0.24 against +0.24). Per sample: the tied set of each branch (direction,
# magnitude, order type, urgency) and the lowest bin of each set, which evaluation must choose (Hold and
# Flat record magnitude 0). Every set holds two bins or more, so ties to the highest bin would change every
# branch of every row (but the magnitude of a Hold or Flat row); the rows cover each kind of 3-bin tie.
TIE_HIGH = np.array([-0.4, 0.1, 0.3, 0.8, 0.6], np.float32)
TIE_LOW = TIE_HIGH[::-1].copy()
TIE_SETS = [
    ((0, 1, 2, 3), (0, 1, 2), (0, 1), (0, 2)),
    ((0, 2), (0, 1), (0, 2), (1, 2)),
    ((2, 3), (0, 2), (1, 2), (0, 1, 2)),
    ((0, 3), (1, 2), (0, 1, 2), (0, 1)),
    ((1, 3), (1, 2), (1, 2), (1, 2)),
    ((1, 2), (0, 1), (0, 1, 2), (0, 2)),
    ((1, 2, 3), (0, 2), (0, 1), (0, 1, 2)),
    ((0, 1), (1, 2), (0, 2), (1, 2)),
]
TIE_ACTIONS = [[0, 0, 0, 0], [0, 0, 0, 1], [2, 0, 1, 0], [0, 1, 0, 0], [1, 0, 1, 1], [1, 0, 0, 0], [1, 0, 0, 0],
               [0, 1, 0, 1]]  # fmt: skip


def test_eval_breaks_exact_ties_to_the_lowest_bin_in_every_branch(stream, stager):
    """explore=False on E[Q] that tie exactly at the top of each branch: the lowest tied bin wins in every
    branch, and the direction's conviction (best minus the best other) is exactly 0."""
    z = TIE_HIGH.size
    support1 = linear_support(-1.0, 1.0, z)
    assert expected_q64(TIE_HIGH, support1) - expected_q64(TIE_LOW, support1) > 0.4
    logits = np.empty((len(TIE_SETS), N_HEADS, z), np.float32)
    for i, sets in enumerate(TIE_SETS):
        for br, tied in zip(BRANCHES, sets, strict=True):
            for k in range(br.size):
                logits[i, br.offset + k] = TIE_HIGH if k in tied else TIE_LOW
    support = np.broadcast_to(support1, (len(TIE_SETS), N_HEADS, 3)).copy()
    actions, conviction = run_select(stream, stager, logits, support, xoroshiro_states(len(TIE_SETS), 4, stager),
                                     explore=False)  # fmt: skip
    np.testing.assert_array_equal(actions, TIE_ACTIONS)
    np.testing.assert_array_equal(conviction, np.zeros(len(TIE_SETS), np.float32))


def test_training_replays_the_float64_policy_on_the_same_uniforms(stream, stager, rng):
    """381 samples of 21 atoms, each state advanced by exactly DRAWS = 8 draws, the same states giving the same
    actions. Every sample's action equals the float64 policy replayed on the uniforms drawn on the host from
    the same states (the 4 direction draws, the tie-break, then magnitude, order type, urgency), except the
    ~2% whose uniforms fall within BOUNDARY_MARGIN of a threshold. Three kinds of samples:
    - T9-like: random logits, a support per (sample, head): Thompson picks Long or Short for > 40%;
    - Hold and Flat peaked on the same atom of one shared support: exact ties of two or more directions;
    - all four directions peaked on the value 0.5 of four different supports (atoms at multiples of 1/8, exact
      in float32): a four-way tie in every sample, so the tie-break uniform alone picks the direction.
    Conviction: E[Q] of the chosen direction minus the best other, within CONV_TOL."""
    b, z = 381, 21
    third = b // 3
    logits = rng.uniform(-1, 1, (b, N_HEADS, z)).astype(np.float32)
    support = linear_support(rng.uniform(-1, -0.2, (b, N_HEADS)), rng.uniform(0.2, 1, (b, N_HEADS)), z)
    tie2 = slice(third, 2 * third)
    logits[tie2] *= 0.5
    support[tie2] = linear_support(-1.0, 1.0, z)
    logits[tie2, HOLD] = logits[tie2, FLAT] = peaked_logits(z, 15)
    tie4 = slice(2 * third, b)
    for d, v_min in zip(Direction, (-1.25, -1.0, -0.5, 0.0), strict=True):  # 0.5 is atom (0.5 - v_min) * 8
        support[tie4, d] = linear_support(v_min, v_min + 2.5, z)
        logits[tie4, d] = peaked_logits(z, round((0.5 - v_min) * 8))
    assert np.all(support[tie4, :N_DIRECTIONS, 2] == 0.125)

    states = xoroshiro_states(b, 11, stager)
    actions, conviction = run_select(stream, stager, logits, support, states, explore=True)
    again, _ = run_select(stream, stager, logits, support, xoroshiro_states(b, 11, stager), explore=True)
    np.testing.assert_array_equal(again, actions)
    advanced = xoroshiro_states_host(b, 11)
    for i in range(b):
        for _ in range(DRAWS):
            xoroshiro128p_next(advanced, i)
    np.testing.assert_array_equal(stager.download(states), advanced)

    u = host_uniforms(xoroshiro_states_host(b, 11))
    expected, clear = select64(logits, support, u)
    assert clear.mean() > 0.95 and clear[tie4].mean() > 0.97
    np.testing.assert_array_equal(actions[clear], expected[clear])
    assert np.isin(actions[:third, 0], (LONG, SHORT)).mean() > 0.40
    two_way = np.isin(expected[tie2, 0], (HOLD, FLAT)) & clear[tie2]
    assert 0 < (actions[tie2, 0][two_way] == FLAT).sum() < two_way.sum()  # the tie went both ways
    assert set(actions[tie4, 0]) == set(range(N_DIRECTIONS))
    q = expected_q64(logits, support)
    assert np.all(np.abs(conviction - conviction64(q, actions[:, 0])) <= CONV_TOL)
    for k, br in enumerate(BRANCHES):
        assert set(np.unique(actions[:, k])) <= set(range(br.size))


def test_a_narrowed_policy_replays_the_float64_policy(stream, stager, rng):
    """env.explore_spread = 0.3 and env.explore_tau = 0.25 on 256 samples of random logits and supports: every
    sample clear of a threshold (and of a near tie between draws) takes the float64 replay's action on the same
    uniforms, and the narrowing changes the action of a good share of samples against the seed's policy."""
    b, z, spread, tau_mult = 256, 21, 0.3, 0.25
    logits = rng.uniform(-1, 1, (b, N_HEADS, z)).astype(np.float32)
    support = linear_support(rng.uniform(-1, -0.2, (b, N_HEADS)), rng.uniform(0.2, 1, (b, N_HEADS)), z)
    actions, _ = run_select(stream, stager, logits, support, xoroshiro_states(b, 5, stager), explore=True,
                            spread=spread, tau_mult=tau_mult)  # fmt: skip
    u = host_uniforms(xoroshiro_states_host(b, 5))
    expected, clear = select64(logits, support, u, spread, tau_mult)
    plain, _ = select64(logits, support, u)
    assert clear.mean() > 0.9
    np.testing.assert_array_equal(actions[clear], expected[clear])
    assert (plain != expected).any(axis=1).mean() > 0.2


def with_fixed_bins(actions, fixed):
    """actions [B, 4] with the branches after direction set to their fixed bins (-1: kept), Hold/Flat -> magnitude 0."""
    out = actions.copy()
    for k, f in enumerate(fixed):
        if f >= 0:
            out[:, 1 + k] = f
    out[np.isin(out[:, 0], (HOLD, FLAT)), 1] = 0
    return out


@pytest.mark.parametrize("fixed", [(2, 0, -1), (-1, 1, 2)])
def test_fixed_bins_replace_the_policy_of_their_branches_only(stream, stager, rng, fixed):
    """env.fixed_bins on 200 samples of random logits and supports: in training every clear sample takes the float64
    replay's action with the fixed branches set to their bins (magnitude 0 under Hold and Flat), the free branches
    and the direction untouched, the RNG states advanced exactly as the free policy's (the fixed branches' uniforms
    are still drawn); in evaluation the float64 argmax with the same override; conviction as without fixed bins.
    The random policy picks each fixed bin about a third of the time, so the override shows in many samples."""
    b, z = 200, 21
    logits = rng.uniform(-1, 1, (b, N_HEADS, z)).astype(np.float32)
    support = linear_support(rng.uniform(-1, -0.2, (b, N_HEADS)), rng.uniform(0.2, 1, (b, N_HEADS)), z)
    states, free_states = xoroshiro_states(b, 7, stager), xoroshiro_states(b, 7, stager)
    actions, conviction = run_select(stream, stager, logits, support, states, explore=True, fixed=fixed)
    _, free_conviction = run_select(stream, stager, logits, support, free_states, explore=True)
    np.testing.assert_array_equal(stager.download(states), stager.download(free_states))
    np.testing.assert_array_equal(conviction, free_conviction)
    expected, clear = select64(logits, support, host_uniforms(xoroshiro_states_host(b, 7)))
    assert clear.mean() > 0.9
    np.testing.assert_array_equal(actions[clear], with_fixed_bins(expected, fixed)[clear])
    assert (with_fixed_bins(expected, fixed) != expected).any(axis=1).mean() > 0.3

    q = expected_q64(logits, support)
    greedy, greedy_conviction = run_select(stream, stager, logits, support, xoroshiro_states(b, 1, stager),
                                           explore=False, fixed=fixed)  # fmt: skip
    np.testing.assert_array_equal(greedy, with_fixed_bins(eval_policy64(q), fixed))
    assert np.all(np.abs(greedy_conviction - conviction64(q, greedy[:, 0])) <= CONV_TOL)


def test_thompson_spread_narrows_each_draw_towards_its_mean(stream, stager):
    """DIFF_P on four different supports at spread 0.5, n = 512: the direction counts pass the chi-square test
    against the exact P(d wins) for draws E[Q_d] + 0.5 (z_j - E[Q_d]); plain Thompson sampling (spread 1),
    the greedy direction and a spread applied around 0 instead of the mean are far enough (noncentrality
    186 or more at this n) to fail but for a chance below 1e-14. At spread 0 every sample takes the direction
    of the largest E[Q]."""
    n, kappa = 512, 0.5
    logits, support, plain = direction_tile_batch(n, DIFF_P, DIFF_SUPPORT)
    p = softmax64(logits[0, :4])
    values = atoms32(DIFF_SUPPORT, 5).astype(np.float64)
    q = (p * values).sum(axis=1, keepdims=True)
    exact = thompson_probs(p, q + kappa * (values - q))
    actions, _ = run_select(stream, stager, logits, support, xoroshiro_states(n, 31, stager), explore=True,
                            spread=kappa)  # fmt: skip
    counts = np.bincount(actions[:, 0], minlength=4)
    stat = chi2(counts, exact)
    assert chi2_sf(stat, 3) > CHI2_P_MIN, f"counts {counts}, expected {n * exact}, chi2 {stat:.1f}"
    assert_alternatives_fail(n, exact, {
        "plain Thompson": plain,
        "argmax E[Q]": np.clip(np.eye(4)[int(np.argmax(q))], 1e-9, None),
        "spread around 0": thompson_probs(p, kappa * values),
    })  # fmt: skip
    greedy, _ = run_select(stream, stager, logits[:64], support[:64], xoroshiro_states(64, 32, stager),
                           explore=True, spread=0.0)  # fmt: skip
    assert np.all(greedy[:, 0] == int(np.argmax(q)))


@pytest.mark.parametrize("z", [8, 21, 120])
def test_every_launch_shape_gives_the_same_bits(stream, stager, rng, z):
    """Threads per sample change nothing: lanes 16 (the default), 13, 5, 2 and 1 give identical actions,
    conviction and advanced states, in training and evaluation, for an even Z (8: staged at stride 9), the
    configured smoke Z (21) and a Z whose samples do not fit 8 to a block (120: 3 per block). Batches of
    2 * stage_samples + 1 samples leave the last block partial. Ties are common (Short and Long share
    their logits and support)."""
    b = 2 * stage_samples(z) + 1
    logits = rng.uniform(-2, 2, (b, N_HEADS, z)).astype(np.float32)
    logits[:, LONG] = logits[:, SHORT]
    support = random_support(rng, (b, N_HEADS), z)
    support[:, LONG] = support[:, SHORT]
    results = {}
    for lanes in (LANES, 13, 5, 2, 1):
        states = xoroshiro_states(b, 3, stager)
        train = run_select(stream, stager, logits, support, states, explore=True, lanes=lanes)
        evaluation = run_select(stream, stager, logits, support, states, explore=False, lanes=lanes)
        results[lanes] = (*train, *evaluation, stager.download(states))
    for lanes, got in results.items():
        for a, want in zip(got, results[LANES], strict=True):
            np.testing.assert_array_equal(a, want, err_msg=f"lanes={lanes}")
    expected, clear = select64(logits, support, host_uniforms(xoroshiro_states_host(b, 3)))
    np.testing.assert_array_equal(results[LANES][0][clear], expected[clear])


THOMPSON_P = np.array(
    [
        [0.05, 0.05, 0.10, 0.20, 0.20, 0.20, 0.20],  # Short
        [0.01, 0.01, 0.01, 0.94, 0.01, 0.01, 0.01],  # Hold: almost surely 0
        [0.20, 0.10, 0.05, 0.05, 0.10, 0.20, 0.30],  # Long: wide
        [0.02, 0.03, 0.05, 0.40, 0.30, 0.15, 0.05],  # Flat
    ]
)


def direction_tile_batch(n, p, support4):
    """Direction distributions p[4, Z] (log-probabilities as logits) on supports support4[4, 3], the other heads
    flat on [-1, 1], replicated over n samples: (logits, support, exact P(d wins) under the fair tie rule)."""
    z = p.shape[1]
    tile = np.zeros((N_HEADS, z), np.float32)
    tile[:4] = np.log(p).astype(np.float32)
    sup = np.broadcast_to(linear_support(-1.0, 1.0, z), (N_HEADS, 3)).copy()
    sup[:4] = support4
    logits = np.broadcast_to(tile, (n, N_HEADS, z)).copy()
    support = np.broadcast_to(sup, (n, N_HEADS, 3)).copy()
    return logits, support, thompson_probs(softmax64(tile[:4]), atoms32(sup[:4], z))


def thompson_batch(n):
    """THOMPSON_P on 7 shared atoms in [-0.75, 0.75]."""
    return direction_tile_batch(n, THOMPSON_P, linear_support(-0.75, 0.75, THOMPSON_P.shape[1]))


def test_thompson_direction_frequencies_match_exact_probabilities(stream, stager):
    """One tile of direction distributions on 7 shared atoms, replicated over n = 2048 samples, each with
    its own RNG state. The counts must pass a chi-square test (3 dof) against the exact P(d wins) at
    p > 1e-6. The tile has heavy ties (Short and Long share the top atom; Hold and Flat share the middle one),
    so the fair tie rule is tested too. Power: at n = 2048 any rule whose probabilities differ by
    sum (p_alt - p)^2 / p > 0.055 (e.g. 0.08 moved between two directions of ~0.25) fails but for a chance
    below 1e-6; the closest alternative below, ties to the lowest direction (the old rule), is at 0.066."""
    n = 2048
    logits, support, exact = thompson_batch(n)
    actions, _ = run_select(stream, stager, logits, support, xoroshiro_states(n, 2024, stager), explore=True)
    counts = np.bincount(actions[:, 0], minlength=4)
    stat = chi2(counts, exact)
    assert chi2_sf(stat, 3) > CHI2_P_MIN, f"counts {counts}, expected {n * exact}, chi2 {stat:.1f}"

    p = softmax64(logits[0, :4])
    values = atoms32(support[0, :4], p.shape[1])
    q = (p * values).sum(axis=1)
    boltzmann = np.exp((q - q.max()) / (q.max() - q.min()))
    assert_alternatives_fail(n, exact, {
        "argmax E[Q]": np.eye(4)[int(np.argmax(q))],
        "Boltzmann on E[Q]": boltzmann / boltzmann.sum(),
        "ties to the lowest direction": thompson_probs(p, values, "lowest"),
        "ties to the highest direction": thompson_probs(p, values, "highest"),
        "one uniform for all four draws": shared_uniform_probs(p),
    })  # fmt: skip


# Four directions on four supports whose atoms (multiples of 1/4) overlap: exact ties across supports.
DIFF_P = np.array(
    [
        [0.10, 0.15, 0.35, 0.35, 0.05],  # Short on [-1, 1], atoms every 0.5
        [0.35, 0.35, 0.20, 0.05, 0.05],  # Hold on [-0.25, 0.75]
        [0.35, 0.15, 0.30, 0.15, 0.05],  # Long on [0, 1]
        [0.30, 0.05, 0.05, 0.20, 0.40],  # Flat on [-0.5, 0.5]
    ]
)
DIFF_SUPPORT = linear_support([-1.0, -0.25, 0.0, -0.5], [1.0, 0.75, 1.0, 0.5], 5)


def test_thompson_draws_each_direction_on_its_own_support(stream, stager):
    """DIFF_P on four different supports, n = 2048: the counts pass the chi-square test against the exact fair
    probabilities (atoms v_min + j * delta_z of each direction's own support; ties between supports shared
    fairly). Alternatives a broken kernel would implement fail but for a chance below 1e-6 (noncentrality
    over 112, assert_alternatives_fail): the atom at v_min + j * v_max (which passes when every direction
    shares one support; the closest, at 136), every direction on Short's support, and ties to the lowest or
    highest direction."""
    n = 2048
    logits, support, exact = direction_tile_batch(n, DIFF_P, DIFF_SUPPORT)
    actions, _ = run_select(stream, stager, logits, support, xoroshiro_states(n, 99, stager), explore=True)
    counts = np.bincount(actions[:, 0], minlength=4)
    stat = chi2(counts, exact)
    assert chi2_sf(stat, 3) > CHI2_P_MIN, f"counts {counts}, expected {n * exact}, chi2 {stat:.1f}"

    p = softmax64(logits[0, :4])
    values = atoms32(DIFF_SUPPORT, 5)
    assert exact.min() > 0.09 and len(np.unique(values)) < values.size  # atom values shared across supports
    assert_alternatives_fail(n, exact, {
        "atom j at v_min + j * v_max": thompson_probs(p, DIFF_SUPPORT[:, :1] + np.arange(5) * DIFF_SUPPORT[:, 1:2]),
        "every direction on Short's support": thompson_probs(p, np.broadcast_to(values[SHORT], (4, 5))),
        "ties to the lowest direction": thompson_probs(p, values, "lowest"),
        "ties to the highest direction": thompson_probs(p, values, "highest"),
    })  # fmt: skip


T8_Q = {1: (0.0, 0.0, 1.0), 2: (0.25, 0.0, 0.0), 3: (0.0, 0.5, 0.25)}  # branch -> E[Q] of its 3 bins


def t8_batch(n, tau_mult=1.0):
    """Seed T8 on 9 atoms in [-1, 1]: Long peaked at +0.75, the other directions at -0.5, each bin of
    magnitude, order type and urgency peaked at its E[Q] in T8_Q: (logits, support, exact bin probabilities
    per branch)."""
    z = 9
    atom = {v: round((v + 1) / 0.25) for v in (-0.5, 0.0, 0.25, 0.5, 0.75, 1.0)}
    tile = np.stack(
        [peaked_logits(z, atom[0.75] if d == LONG else atom[-0.5]) for d in range(4)]
        + [peaked_logits(z, atom[v]) for k in (1, 2, 3) for v in T8_Q[k]]
    )
    logits = np.broadcast_to(tile, (n, N_HEADS, z)).copy()
    support = np.broadcast_to(linear_support(-1.0, 1.0, z), (n, N_HEADS, 3)).copy()
    exact = {}
    for k, qs in T8_Q.items():
        qs = np.array(qs)
        w = np.exp((qs - qs.max()) / max(tau_mult * (qs.max() - qs.min()), float(TAU_FLOOR)))
        exact[k] = w / w.sum()
    return logits, support, exact


@pytest.mark.parametrize("tau_mult", [1.0, 0.25])
def test_boltzmann_histograms_match_the_seed_t8_probabilities(stream, stager, tau_mult):
    """Seed T8 at n = 2048: direction forced to Long so magnitude is not short-circuited; magnitude
    Q = [0, 0, 1] (P(best) = 1/(1 + 2/e) at tau_mult 1), order Q = [0.25, 0, 0] and urgency Q = [0, 0.5, 0.25],
    whose ranges differ, so tau must follow each branch's range. Each bin must be within +-5% absolute of
    exp((q - max q) / tau) normalised (1 sigma <= 0.011, so >= 4.5 sigma: by the exact binomial a correct bin
    fails with probability below 6e-6, and one whose probability is off by 0.1 passes below 3e-6). At tau_mult 1
    a strict argmax (P(best) = 1), or a fixed tau = 1 (order P(best) 0.39 instead of 0.58, urgency 0.38 instead
    of 0.51) miss by more than 0.1; at tau_mult 0.25 (env.explore_tau) the seed's probabilities miss by more
    than 0.3."""
    n = 2048
    logits, support, exact = t8_batch(n, tau_mult)
    actions, _ = run_select(stream, stager, logits, support, xoroshiro_states(n, 8, stager), explore=True,
                            tau_mult=tau_mult)  # fmt: skip
    assert np.all(actions[:, 0] == LONG)
    seed_rule = t8_batch(1)[2]
    assert seed_rule[1][2] == pytest.approx(1 / (1 + 2 / math.e))  # 0.5761 (the seed rounds it to 0.5767)
    for k, expected in exact.items():
        freq = np.bincount(actions[:, k], minlength=3) / n
        assert np.all(np.abs(freq - expected) <= 0.05), f"{BRANCHES[k].name}: {freq} vs {expected}"
        assert abs(freq.max() - 1.0) > 0.02 and np.argmax(freq) == np.argmax(T8_Q[k])
        if tau_mult == 1.0:
            assert abs(freq.max() - 1.0) > 0.1
        else:
            assert np.abs(seed_rule[k] - expected).max() > 0.3


@pytest.mark.gpu_only("2**20 samples per launch: about an hour under the simulator")
def test_thompson_and_boltzmann_at_a_million_samples(stream, stager):
    """The tiles above at n = 2**20: direction counts (3 dof) on shared and on different supports, and each
    Boltzmann branch (2 dof) pass chi-square at p > 1e-6; at this n a bias of 0.003 in any bin would fail."""
    n = 1 << 20
    for seed, (logits, support, exact) in enumerate((thompson_batch(n), direction_tile_batch(n, DIFF_P, DIFF_SUPPORT))):
        actions, _ = run_select(stream, stager, logits, support, xoroshiro_states(n, 77 + seed, stager), explore=True)
        counts = np.bincount(actions[:, 0], minlength=4)
        assert chi2_sf(chi2(counts, exact), 3) > CHI2_P_MIN, f"counts {counts}, expected {n * exact}"
    logits, support, exact_bins = t8_batch(n)
    actions, _ = run_select(stream, stager, logits, support, xoroshiro_states(n, 78, stager), explore=True)
    assert np.all(actions[:, 0] == LONG)
    for k, expected in exact_bins.items():
        counts = np.bincount(actions[:, k], minlength=3)
        assert chi2_sf(chi2(counts, expected), 2) > CHI2_P_MIN, f"{BRANCHES[k].name}: {counts / n} vs {expected}"


@pytest.mark.parametrize("explore", [False, True])
def test_hold_and_flat_record_magnitude_zero(stream, stager, explore):
    """Direction forced to Hold (first third), Flat (second third) or Long (last third) with magnitude
    Q = [0, 0, 1]: Hold and Flat always record magnitude 0, while Long follows the magnitude branch
    (argmax Full in eval; Boltzmann in training, where P(0) = 0.21, so not all 0)."""
    n, z = 384, 9
    tile_for = {}
    for forced in (HOLD, FLAT, LONG):
        heads = [peaked_logits(z, 7 if d == forced else 2) for d in range(4)]  # +0.75 vs -0.5
        heads += [peaked_logits(z, a) for a in (4, 4, 8)]  # magnitude Q = [0, 0, 1]
        heads += [peaked_logits(z, 4) for _ in range(6)]
        tile_for[forced] = np.stack(heads)
    logits = np.concatenate([np.broadcast_to(tile_for[d], (n // 3, N_HEADS, z)) for d in (HOLD, FLAT, LONG)])
    support = np.broadcast_to(linear_support(-1.0, 1.0, z), (n, N_HEADS, 3)).copy()

    actions, _ = run_select(stream, stager, logits, support, xoroshiro_states(n, 5, stager), explore=explore)
    third = n // 3
    np.testing.assert_array_equal(actions[:, 0], np.repeat([HOLD, FLAT, LONG], third))
    assert np.all(actions[: 2 * third, 1] == 0)
    if explore:
        assert np.any(actions[2 * third :, 1] != 0)
    else:
        assert np.all(actions[2 * third :, 1] == Magnitude.FULL)


def test_seed_t6_eval_prefers_hold_while_training_explores_every_direction_fairly(stream, stager):
    """Seed T6 failure mode: Hold and Flat peaked at v = 0, Long and Short log-Gaussian around -0.001 with
    sigma 0.05, support [-0.5, 0.5] in steps of 0.05 (21 atoms). E[Q] ranks Hold/Flat first, so eval picks
    Hold for every sample (Hold ties Flat and wins as the lower index), identically for two RNG states.
    In training the four directions often draw the same atom (v = 0): shared fairly, the exact
    probabilities are 1/3, 1/6, 1/3, 1/6 (Short and Long alike, Flat explored), where ties to the lowest
    direction gave 0.56, 0.22, 0.22, ~1e-12. Over 512 samples Thompson picks Long or Short for >= 30%
    (~17 sigma below the exact 66%) and the counts pass the exact chi-square test, which the old rule
    (noncentrality 193 at this n) fails but for a chance below 1e-15. Evaluation is deterministic: 64
    samples."""
    n, n_eval, z = 512, 64, 21
    support1 = linear_support(-0.5, 0.5, z)
    values = atoms64(support1, z)
    gauss = (-((values + 0.001) ** 2) / (2 * 0.05**2)).astype(np.float32)
    tile = np.stack([gauss, peaked_logits(z, 10), gauss, peaked_logits(z, 10)] + [np.zeros(z, np.float32)] * 9)
    logits = np.broadcast_to(tile, (n, N_HEADS, z)).copy()
    support = np.broadcast_to(support1, (n, N_HEADS, 3)).copy()

    first, _ = run_select(stream, stager, logits[:n_eval], support[:n_eval], xoroshiro_states(n_eval, 1, stager),
                          explore=False)  # fmt: skip
    second, _ = run_select(stream, stager, logits[:n_eval], support[:n_eval], xoroshiro_states(n_eval, 2, stager),
                           explore=False)  # fmt: skip
    assert np.all(first[:, 0] == HOLD)
    np.testing.assert_array_equal(first, second)

    p, atom_values = softmax64(tile[:4]), np.broadcast_to(atoms32(support1, z), (4, z))
    exact = thompson_probs(p, atom_values)
    np.testing.assert_allclose(exact, [1 / 3, 1 / 6, 1 / 3, 1 / 6], atol=0.005)
    lowest = thompson_probs(p, atom_values, "lowest")
    np.testing.assert_allclose(lowest, [0.56, 0.22, 0.22, 0.0], atol=0.005)
    assert_alternatives_fail(n, exact, {"ties to the lowest direction": lowest})

    train, _ = run_select(stream, stager, logits, support, xoroshiro_states(n, 3, stager), explore=True)
    assert np.isin(train[:, 0], (LONG, SHORT)).mean() >= 0.30
    counts = np.bincount(train[:, 0], minlength=4)
    assert chi2_sf(chi2(counts, exact), 3) > CHI2_P_MIN, f"counts {counts}, expected {n * exact}"


def test_collect_step_replays_as_a_captured_graph(stream, stager, rng):
    """select_actions allocates nothing, so a collect step can be a StepGraph: four replays of a captured
    graph (GPU) draw exactly what four eager launches draw from the same seed, the states advancing between
    replays (under the simulator both runs are eager and the launch traces are compared). Production shape."""
    b, z = 24, 5
    logits = stager.upload_new(rng.uniform(-1, 1, (b, N_HEADS, z)).astype(np.float32))
    support = stager.upload_new(np.broadcast_to(linear_support(-1.0, 1.0, z), (b, N_HEADS, 3)).copy())

    def collect(use_graph):
        states = xoroshiro_states(b, 21, stager)
        actions, conviction = device_empty((b, 4), np.int32), device_empty(b, np.float32)

        def body(s):
            select_actions(logits, support, states, actions, conviction, explore=True, stream=s)

        step = StepGraph("collect", body, stream, use_graph=use_graph)
        picks = []
        for _ in range(4):
            step.replay()
            picks.append(stager.download(actions))
        assert step.mode == ("eager" if SIMULATOR or not use_graph else "graph")
        return np.stack(picks)

    graph, eager = collect(True), collect(False)
    np.testing.assert_array_equal(graph, eager)
    assert not np.array_equal(graph[2], graph[3])


def test_select_actions_rejects_bad_fixed_bins(stream, stager):
    b, z = 4, 11
    logits = stager.upload_new(np.ones((b, N_HEADS, z), np.float32))
    support = stager.upload_new(linear_support(-1.0, 1.0, z)[None, None].repeat(b, 0).repeat(N_HEADS, 1))
    actions, conviction = device_empty((b, N_BRANCHES), np.int32), device_empty(b, np.float32)
    for bad in [(3, 0, 0), (0, -2, 0), (0, 0), (0, 0, 0, 0)]:
        with pytest.raises(ValueError, match="fixed bins"):
            select_actions(logits, support, xoroshiro_states(b, 0, stager), actions, conviction, explore=False,
                           stream=stream, fixed=bad)  # fmt: skip


def test_select_actions_rejects_bad_shapes(stream, stager):
    b, z = 4, 5
    logits = stager.upload_new(np.ones((b, N_HEADS, z), np.float32))
    support = stager.upload_new(np.ones((b, N_HEADS, 3), np.float32))
    states = xoroshiro_states(b, 0, stager)
    actions, conviction = device_empty((b, 4), np.int32), device_empty(b, np.float32)
    with pytest.raises(ValueError, match=r"logits must be .* \[B, 13, Z\] = \(4, 13, 5\)"):
        select_actions(stager.upload_new(np.ones((b, 12, z), np.float32)), support, states, actions, conviction,
                       explore=False, stream=stream)  # fmt: skip
    with pytest.raises(ValueError, match=r"support must be .* \[B, 13, 3\] = \(4, 13, 3\)"):
        select_actions(logits, stager.upload_new(np.ones((b, N_HEADS, 2), np.float32)), states, actions,
                       conviction, explore=False, stream=stream)  # fmt: skip
    with pytest.raises(ValueError, match="states must be a 1-D xoroshiro128p state array of at least B = 4"):
        select_actions(logits, support, xoroshiro_states(b - 1, 0, stager), actions, conviction,
                       explore=False, stream=stream)  # fmt: skip
    with pytest.raises(ValueError, match=r"actions must be a C-contiguous int32 array \[B, 4\]"):
        select_actions(logits, support, states, device_empty((b, 4), np.float32), conviction,
                       explore=False, stream=stream)  # fmt: skip
    with pytest.raises(ValueError, match=r"conviction must be .* \[B\] = \(4,\)"):
        select_actions(logits, support, states, actions, device_empty(b + 1, np.float32),
                       explore=False, stream=stream)  # fmt: skip
    big = MAX_ATOMS + 1
    assert stage_samples(MAX_ATOMS) == 1 and stage_samples(big) == 0
    with pytest.raises(ValueError, match=f"Z = {big} atoms.*at most Z = {MAX_ATOMS}"):
        select_actions(device_empty((b, N_HEADS, big), np.float32), support, states, actions, conviction,
                       explore=False, stream=stream)  # fmt: skip
    for lanes in (0, LANES + 1):
        with pytest.raises(ValueError, match=f"lanes = {lanes}: threads per sample must be 1 to 16"):
            select_actions(logits, support, states, actions, conviction, explore=False, stream=stream, lanes=lanes)


def head_rows(rng, b, z):
    """Seeded random head GEMM output rows [b, head_width(z)] (the streams, then the auxiliary column)."""
    return rng.uniform(-1.5, 1.5, (b, head_width(z))).astype(np.float32)


@pytest.mark.parametrize(("z", "lanes", "mode"), [(8, TEST_LANES, "c51"), (21, TEST_LANES, "iqn"),
                                                  (120, TEST_LANES, "mean"), (21, LANES, "c51")])
def test_head_rows_give_the_bits_of_their_combined_logits(stream, stager, rng, z, lanes, mode):
    """Selecting from the head GEMM's rows (the dueling combine formed while staging) equals selecting from the
    logits their combine gives (`dueling32`, the combine kernel's bits): the same actions, conviction bits and
    advanced states, in collection (Thompson, Boltzmann, fixed order type) and evaluation, for each value the
    directions act on (the three share the kernels' later phases); Z = 8 (staged at stride 9), 21 and 120 (3
    samples a block), 2 blocks + 1 sample, at the simulator's lanes and the production 16. And against float64:
    evaluation is argmax of E[Q] of `dueling64`'s logits wherever the top two values of a branch are apart by more
    than float32 rounding."""
    b = 2 * stage_samples(z) + 1
    head = head_rows(rng, b, z)
    logits = dueling32(head, z)
    support = random_support(rng, (b, N_HEADS), z)
    values = {"c51": {}, "iqn": {"iqn": rng.uniform(-0.5, 0.5, (b, 2, N_DIRECTIONS)).astype(np.float32)},
              "mean": {"mean": rng.uniform(-0.5, 0.5, (b, 1, N_DIRECTIONS)).astype(np.float32)}}[mode]
    got = {}
    for name, source in (("logits", logits), ("heads", head)):
        out = []
        for explore in (True, False):
            states = xoroshiro_states(b, 5, stager)
            actions, conviction = device_empty((b, N_BRANCHES), np.int32), device_empty(b, np.float32)
            select_actions(stager.upload_new(source), stager.upload_new(support), states, actions, conviction,
                           explore=explore, stream=stream, lanes=lanes, spread=0.5, tau_mult=0.5,
                           fixed=(-1, 1, -1), **{k: stager.upload_new(v) for k, v in values.items()})
            out += [stager.download(actions), stager.download(conviction).view(np.uint32), stager.download(states)]
        got[name] = out
    for a, want in zip(got["heads"], got["logits"], strict=True):
        np.testing.assert_array_equal(a, want)
    if mode == "c51":
        q = expected_q64(dueling64(head, z), support)
        want = eval_policy64(q)
        want[:, 2] = 1
        clear = np.ones(b, bool)
        for br in BRANCHES:
            top2 = np.sort(q[:, br.offset : br.offset + br.size], axis=1)[:, -2:]
            clear &= top2[:, 1] - top2[:, 0] > CONV_TOL
        assert clear.sum() >= b // 2
        np.testing.assert_array_equal(got["heads"][3][clear], want[clear])


@pytest.mark.parametrize("mode", ["c51", "mean"])
def test_every_bin_fixed_takes_the_direction_heads_alone(stream, stager, rng, mode):
    """With every bin after the direction fixed (the default env.fixed_bins), selecting from head rows stages and
    reads the direction heads alone (action_select_heads_direction; the other heads decide nothing) and gives the
    bits of the whole kernel on the logits: the same actions, conviction and advanced states, in collection and in
    evaluation; Z = 21, 2 blocks + 1 sample, at the simulator's lanes and the production 16."""
    z = 21
    b = 2 * stage_samples(z) + 1
    head = head_rows(rng, b, z)
    support = random_support(rng, (b, N_HEADS), z)
    values = {"mean": stager.upload_new(rng.uniform(-0.5, 0.5, (b, 1, N_DIRECTIONS)).astype(np.float32))}
    for lanes in (TEST_LANES, LANES):
        got = {}
        for name, source in (("logits", dueling32(head, z)), ("heads", head)):
            out = []
            for explore in (True, False):
                states = xoroshiro_states(b, 5, stager)
                actions, conviction = device_empty((b, N_BRANCHES), np.int32), device_empty(b, np.float32)
                select_actions(stager.upload_new(source), stager.upload_new(support), states, actions, conviction,
                               explore=explore, stream=stream, lanes=lanes, spread=0.5, fixed=(0, 2, 1),
                               **(values if mode == "mean" else {}))
                out += [stager.download(actions), stager.download(conviction).view(np.uint32),
                        stager.download(states)]
            got[name] = out
        for a, want in zip(got["heads"], got["logits"], strict=True):
            np.testing.assert_array_equal(a, want)
        acts = got["heads"][0]
        assert len(np.unique(acts[:, 0])) > 1 and (acts[:, 2:] == [2, 1]).all()


def test_select_actions_rejects_head_rows_of_another_width(stream, stager):
    b, z = 4, 5
    support = stager.upload_new(np.ones((b, N_HEADS, 3), np.float32))
    states = xoroshiro_states(b, 0, stager)
    actions, conviction = device_empty((b, 4), np.int32), device_empty(b, np.float32)
    with pytest.raises(ValueError, match=r"head rows must be a float32 array \[B, head_width\(Z\) = 17 Z \+ 1\]"):
        select_actions(stager.upload_new(np.ones((b, head_width(z) + 1), np.float32)), support, states, actions,
                       conviction, explore=False, stream=stream)  # fmt: skip


def run_select_values(stream, stager, logits, support, explore, spread=1.0, seed=3, hold_margin=0.0, **values):
    """select_actions with the directions' other values (`iqn=` or `mean=`, host arrays): (actions, conviction)."""
    b = logits.shape[0]
    actions, conviction = device_empty((b, N_BRANCHES), np.int32), device_empty(b, np.float32)
    select_actions(stager.upload_new(logits), stager.upload_new(support), xoroshiro_states(b, seed, stager), actions,
                   conviction, explore=explore, stream=stream, lanes=TEST_LANES, spread=spread,
                   hold_margin=hold_margin, **{k: stager.upload_new(v) for k, v in values.items()})
    return stager.download(actions), stager.download(conviction)


@pytest.mark.parametrize("mode", ["mean", "c51"])
def test_the_hold_margin_keeps_the_position_in_evaluation_only(stream, stager, rng, mode):
    """64 samples of random heads (and mean-head values), the margin h the median lead over Hold of the samples whose
    best direction is not Hold: evaluation takes the float64 argmax of the
    acting values, then Hold wherever a best direction other than Hold beats Hold's value by less than h, with
    conviction 0 there and the top-two gap elsewhere; the other branches keep their argmax. The draw gives both
    outcomes on many samples (checked), no value gap lies within CONV_TOL of h or of a tie (checked), so float32
    rounding cannot flip a choice. Collection at spread 0 (the draw is the value itself) ignores the margin."""
    b, z = 64, 11
    logits = rng.uniform(-1, 1, (b, N_HEADS, z)).astype(np.float32)
    support = random_support(rng, (b, N_HEADS), z)
    q = expected_q64(logits, support)
    values = {}
    if mode == "mean":
        mean = rng.uniform(-0.3, 0.3, (b, N_DIRECTIONS)).astype(np.float32)
        values["mean"] = mean[:, None, :]
        q[:, :N_DIRECTIONS] = mean
    acting = q[:, :N_DIRECTIONS]
    best = acting.argmax(1)
    lead = acting.max(1) - acting[:, HOLD]
    h = float(np.median(lead[best != HOLD]))
    top2 = np.sort(acting, axis=1)[:, -2:]
    held = (best != HOLD) & (lead < h)
    h = 0.5 * (lead[held].max() + lead[(best != HOLD) & ~held].min())  # halfway between the two nearest leads
    assert (top2[:, 1] - top2[:, 0] > CONV_TOL).all() and (np.abs(lead - h) > CONV_TOL).all()
    assert held.sum() >= 8 and ((best != HOLD) & ~held).sum() >= 8
    want = eval_policy64(q)
    want[held, 0], want[held, 1] = HOLD, 0
    actions, conviction = run_select_values(stream, stager, logits, support, False, hold_margin=h, **values)
    np.testing.assert_array_equal(actions, want)
    np.testing.assert_allclose(conviction, np.where(held, 0.0, top2[:, 1] - top2[:, 0]), rtol=0, atol=CONV_TOL)
    explored, _ = run_select_values(stream, stager, logits, support, True, spread=0.0, hold_margin=h, **values)
    np.testing.assert_array_equal(explored[:, 0], best)
    with pytest.raises(ValueError, match="hold_margin"):
        run_select_values(stream, stager, logits, support, False, hold_margin=-0.1, **values)


@pytest.mark.parametrize("explore", [False, True])
def test_with_iqn_the_direction_acts_on_the_joint_mean_and_conviction_reads_it(stream, stager, rng, explore):
    """48 samples, random C51 heads and E_IQN: evaluation (and collection at spread 0, where the joint draw is the
    joint mean) picks argmax_d (E_C51[d] + E_IQN[d]) / 2 and the conviction is that value's gap; in evaluation the
    other branches keep C51's argmax (collection draws them by Boltzmann, as without IQN). No two top joint values
    lie within CONV_TOL (checked), so float32 rounding cannot swap them."""
    b, z = 48, 11
    logits = rng.uniform(-1, 1, (b, N_HEADS, z)).astype(np.float32)
    support = random_support(rng, (b, N_HEADS), z)
    iqn = rng.uniform(-0.5, 0.5, (b, 2, N_DIRECTIONS)).astype(np.float32)
    actions, conviction = run_select_values(stream, stager, logits, support, explore, spread=0.0, iqn=iqn)
    q = expected_q64(logits, support)
    joint = 0.5 * (q[:, :N_DIRECTIONS] + iqn[:, 0])
    top2 = np.sort(joint, axis=1)[:, -2:]
    assert (top2[:, 1] - top2[:, 0] > CONV_TOL).all()
    q_joint = q.copy()
    q_joint[:, :N_DIRECTIONS] = joint
    want = eval_policy64(q_joint)
    np.testing.assert_array_equal(actions[:, 0], want[:, 0])
    if not explore:
        np.testing.assert_array_equal(actions, want)
    assert (joint.argmax(1) != q[:, :N_DIRECTIONS].argmax(1)).any()  # the IQN values did change a choice
    np.testing.assert_allclose(conviction, top2[:, 1] - top2[:, 0], rtol=0, atol=CONV_TOL)


def test_with_iqn_thompson_adds_the_sampled_quantile_to_the_c51_draw(stream, stager, rng):
    """Each direction's C51 head peaked on one atom (its Thompson draw is that atom), spread 1: the direction is
    argmax_d (atom_d + Z(tau_d)[d]) / 2 with Z(tau_d) the sampled quantiles (iqn[:, 1]), which here differs from
    both the C51 argmax and the IQN-sample argmax; the conviction is the joint E[Q]'s: (E_C51 + E_IQN) / 2 of
    the chosen direction minus the best other's."""
    b, z = 40, 9
    support = np.broadcast_to(linear_support(-1.0, 1.0, z), (b, N_HEADS, 3)).copy()
    logits = rng.uniform(-1, 1, (b, N_HEADS, z)).astype(np.float32)
    atoms = rng.integers(0, z, (b, N_DIRECTIONS))
    for i in range(b):
        for d in range(N_DIRECTIONS):
            logits[i, d] = peaked_logits(z, atoms[i, d])
    iqn = rng.uniform(-1, 1, (b, 2, N_DIRECTIONS)).astype(np.float32)
    actions, conviction = run_select_values(stream, stager, logits, support, True, iqn=iqn)
    draws = 0.5 * (atoms64(support[:, :N_DIRECTIONS], z)[np.arange(b)[:, None], np.arange(N_DIRECTIONS), atoms]
                   + iqn[:, 1])
    np.testing.assert_array_equal(actions[:, 0], draws.argmax(1))
    assert (draws.argmax(1) != atoms.argmax(1)).any() and (draws.argmax(1) != iqn[:, 1].argmax(1)).any()
    joint = 0.5 * (expected_q64(logits, support)[:, :N_DIRECTIONS] + iqn[:, 0])
    others = np.where(np.arange(N_DIRECTIONS) == actions[:, :1], -np.inf, joint).max(1)
    np.testing.assert_allclose(conviction, joint[np.arange(b), actions[:, 0]] - others, rtol=0, atol=CONV_TOL)


@pytest.mark.parametrize("explore", [False, True])
def test_with_the_mean_head_the_direction_acts_on_its_values_and_conviction_reads_them(stream, stager, rng,
                                                                                         explore):
    """48 samples, random C51 heads and mean-head values m: evaluation (and collection at spread 0, where the draw
    is m itself) picks argmax_d m[d], the conviction is m's gap, and the other branches keep C51's argmax in
    evaluation. No two top values of m lie within CONV_TOL (checked), and m's choice differs from C51's on some
    samples, so a kernel that read E_C51 fails."""
    b, z = 48, 11
    logits = rng.uniform(-1, 1, (b, N_HEADS, z)).astype(np.float32)
    support = random_support(rng, (b, N_HEADS), z)
    mean = rng.uniform(-0.5, 0.5, (b, N_DIRECTIONS)).astype(np.float32)
    actions, conviction = run_select_values(stream, stager, logits, support, explore, spread=0.0,
                                              mean=mean[:, None, :])
    q = expected_q64(logits, support)
    top2 = np.sort(mean, axis=1)[:, -2:]
    assert (top2[:, 1] - top2[:, 0] > CONV_TOL).all()
    q_mean = q.copy()
    q_mean[:, :N_DIRECTIONS] = mean
    want = eval_policy64(q_mean)
    np.testing.assert_array_equal(actions[:, 0], want[:, 0])
    if not explore:
        np.testing.assert_array_equal(actions, want)
    assert (mean.argmax(1) != q[:, :N_DIRECTIONS].argmax(1)).any()
    np.testing.assert_allclose(conviction, top2[:, 1] - top2[:, 0], rtol=0, atol=CONV_TOL)


@pytest.mark.parametrize("spread", [1.0, 0.4])
def test_with_the_mean_head_thompson_moves_the_c51_draw_to_its_mean(stream, stager, rng, spread):
    """256 samples of random C51 heads and supports and mean-head values m of the C51 E[Q]'s scale: every direction
    draws m[d] + spread (atom - E_C51[d]) for the atom its own uniform picks; every sample clear of a threshold or a
    near tie takes the float64 replay's action on the kernel's uniforms (the other branches by Boltzmann, as without
    the head), and m changes the direction of a good share of samples against the plain policy. The conviction is
    m's: m of the chosen direction minus the best other."""
    b, z = 256, 21
    logits = rng.uniform(-1, 1, (b, N_HEADS, z)).astype(np.float32)
    support = linear_support(rng.uniform(-1, -0.2, (b, N_HEADS)), rng.uniform(0.2, 1, (b, N_HEADS)), z)
    mean = rng.uniform(-0.5, 0.5, (b, N_DIRECTIONS)).astype(np.float32)
    actions, conviction = run_select_values(stream, stager, logits, support, True, spread, seed=5,
                                              mean=mean[:, None, :])
    u = host_uniforms(xoroshiro_states_host(b, 5))
    expected, clear = select64(logits, support, u, spread, mean=mean.astype(np.float64))
    plain, _ = select64(logits, support, u, spread)
    assert clear.mean() > 0.9
    np.testing.assert_array_equal(actions[clear], expected[clear])
    assert (plain[:, 0] != expected[:, 0]).mean() > 0.2
    others = np.where(np.arange(N_DIRECTIONS) == actions[:, :1], -np.inf, mean).max(1)
    np.testing.assert_allclose(conviction, mean[np.arange(b), actions[:, 0]] - others, rtol=0, atol=1e-6)


def test_select_actions_refuses_both_iqn_and_mean_values(stream, stager):
    b, z = 4, 5
    logits, support = device_empty((b, N_HEADS, z), np.float32), device_empty((b, N_HEADS, 3), np.float32)
    actions, conviction = device_empty((b, N_BRANCHES), np.int32), device_empty(b, np.float32)
    with pytest.raises(ValueError, match="not both"):
        select_actions(logits, support, xoroshiro_states(b, 1, stager), actions, conviction, explore=False,
                       stream=stream, iqn=device_empty((b, 2, N_DIRECTIONS), np.float32),
                       mean=device_empty((b, 1, N_DIRECTIONS), np.float32))
    with pytest.raises(ValueError, match="mean"):
        select_actions(logits, support, xoroshiro_states(b, 1, stager), actions, conviction, explore=False,
                       stream=stream, mean=device_empty((b, N_DIRECTIONS), np.float32))
