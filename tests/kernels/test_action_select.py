"""Action selection against float64 numpy references (the seed's Plan C tests T6, T8, T9).

Evaluation is compared exactly with argmax E[Q]; training-mode draws are compared with exact analytic
probabilities: Thompson direction frequencies by a chi-square test against P(direction wins) summed over
atom values, Boltzmann histograms within the seed's +-5% absolute. Each statistical test also shows that
the alternatives a broken kernel would implement fail it by a wide margin.
"""

import itertools
import math

import numpy as np
import pytest
from numba.cuda.random import xoroshiro128p_next
from reference import atoms64, expected_q64, linear_support, softmax64

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
from fox_numba.device.rng import xoroshiro_states, xoroshiro_states_host
from fox_numba.device.runtime import SIMULATOR
from fox_numba.kernels.action_select import TAU_FLOOR, select_actions

SHORT, HOLD, LONG, FLAT = (int(d) for d in Direction)
DRAWS_PER_SAMPLE = N_DIRECTIONS + N_BRANCHES - 1  # 4 Thompson draws, then magnitude, order type, urgency
CHI2_P_MIN = 1e-6  # a correct kernel fails a chi-square test once in a million seeds
# A difference of two E[Q] on 21 atoms with |z| <= 1: twice the expected_q bound 4 (Z + 2) eps max|z|.
CONV_TOL = 2 * 4 * (21 + 2) * 2.0**-24
# numba's xoroshiro128+ adds uint64 words with wrap-around; as numpy scalars (the simulator) they warn.
pytestmark = [
    pytest.mark.filterwarnings("ignore:overflow encountered in scalar add:RuntimeWarning"),
    pytest.mark.usefixtures("long_switch_interval"),
]


def run_select(stream, stager, logits, support, states, explore):
    """Upload, select, download: (actions [B, 4], conviction [B])."""
    b = logits.shape[0]
    actions, conviction = device_empty((b, N_BRANCHES), np.int32), device_empty(b, np.float32)
    select_actions(
        stager.upload_new(logits), stager.upload_new(support), states, actions, conviction,
        explore=explore, stream=stream,
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


def thompson_probs(p):
    """Exact P(direction d has the largest draw) for independent draws from p[4, Z] on one shared support.

    Ties go to the lowest direction, as in the kernel: d wins at atom j when every e < d draws below j and
    every e > d draws at or below j.
    """
    cdf_le = np.cumsum(p, axis=1)
    cdf_lt = cdf_le - p
    out = np.zeros(4)
    for d in range(4):
        below = np.prod([cdf_lt[e] for e in range(d)], axis=0) if d else 1.0
        at_or_below = np.prod([cdf_le[e] for e in range(d + 1, 4)], axis=0) if d < 3 else 1.0
        out[d] = np.sum(p[d] * below * at_or_below)
    return out


def shared_uniform_probs(p):
    """P(d wins) if one uniform drove all four draws (a plausible bug): X_d = F_d^-1(u), comonotone."""
    cdf = np.cumsum(p, axis=1)
    edges = np.unique(np.concatenate([[0.0, 1.0], np.clip(cdf.ravel(), 0, 1)]))
    out = np.zeros(4)
    for lo, hi in itertools.pairwise(edges):
        idx = [int(np.searchsorted(cdf[d], (lo + hi) / 2, side="right")) for d in range(4)]
        out[int(np.argmax(idx))] += hi - lo
    return out


def chi2_sf(x, dof):
    """Survival function of the chi-square distribution for 2 or 3 degrees of freedom (closed forms)."""
    if dof == 2:
        return math.exp(-x / 2)
    assert dof == 3
    return math.erfc(math.sqrt(x / 2)) + math.sqrt(2 * x / math.pi) * math.exp(-x / 2)


def chi2(counts, probs):
    n = counts.sum()
    return float(np.sum((counts - n * probs) ** 2 / (n * probs)))


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


def test_eval_is_argmax_expected_q_and_ignores_the_rng(stream, stager, rng):
    """Seed T9: 256 samples, 21 atoms, logits uniform in [-1, 1], per-(sample, head) supports with v_min in
    [-1, -0.2] and v_max in [0.2, 1]. Eval equals the float64 argmax E[Q] exactly in every branch (each
    branch's best E[Q] leads its runner-up by more than 1e-5, far above float32 error, so exact equality
    is well defined), is identical under three different RNG states and leaves the states untouched.
    Conviction: within CONV_TOL of the float64 top-two gap."""
    b, z = 256, 21
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


def test_training_draws_seven_uniforms_explores_and_repeats_with_the_same_states(stream, stager, rng):
    """Seed T9, training half: on the same kind of batch Thompson picks Long or Short for > 40% of samples
    (4 near-equal directions: about 50%). Each sample advances its state by exactly 7 draws, the same
    states give the same actions, and the conviction is E[Q] of the chosen direction minus the best other
    (within CONV_TOL)."""
    b, z = 256, 21
    logits = rng.uniform(-1, 1, (b, N_HEADS, z)).astype(np.float32)
    support = linear_support(rng.uniform(-1, -0.2, (b, N_HEADS)), rng.uniform(0.2, 1, (b, N_HEADS)), z)
    states = xoroshiro_states(b, 11, stager)
    actions, conviction = run_select(stream, stager, logits, support, states, explore=True)
    again, _ = run_select(stream, stager, logits, support, xoroshiro_states(b, 11, stager), explore=True)
    np.testing.assert_array_equal(again, actions)

    advanced = xoroshiro_states_host(b, 11)
    for i in range(b):
        for _ in range(DRAWS_PER_SAMPLE):
            xoroshiro128p_next(advanced, i)
    np.testing.assert_array_equal(stager.download(states), advanced)

    assert np.isin(actions[:, 0], (LONG, SHORT)).mean() > 0.40
    q = expected_q64(logits, support)
    assert np.all(np.abs(conviction - conviction64(q, actions[:, 0])) <= CONV_TOL)
    assert np.all(actions[np.isin(actions[:, 0], (HOLD, FLAT)), 1] == 0)
    for k, br in enumerate(BRANCHES):
        assert set(np.unique(actions[:, k])) <= set(range(br.size))


THOMPSON_P = np.array(
    [
        [0.05, 0.05, 0.10, 0.20, 0.20, 0.20, 0.20],  # Short
        [0.01, 0.01, 0.01, 0.94, 0.01, 0.01, 0.01],  # Hold: almost surely 0
        [0.20, 0.10, 0.05, 0.05, 0.10, 0.20, 0.30],  # Long: wide
        [0.02, 0.03, 0.05, 0.40, 0.30, 0.15, 0.05],  # Flat
    ]
)


def thompson_batch(n):
    """The direction tile of THOMPSON_P (log-probabilities as logits) on 7 shared atoms in [-0.75, 0.75],
    replicated over n samples: (logits, support, exact P(d wins))."""
    z = THOMPSON_P.shape[1]
    tile = np.zeros((N_HEADS, z), np.float32)
    tile[:4] = np.log(THOMPSON_P).astype(np.float32)
    logits = np.broadcast_to(tile, (n, N_HEADS, z)).copy()
    support = np.broadcast_to(linear_support(-0.75, 0.75, z), (n, N_HEADS, 3)).copy()
    return logits, support, thompson_probs(softmax64(tile[:4]))


def test_thompson_direction_frequencies_match_exact_probabilities(stream, stager):
    """One tile of direction distributions on 7 shared atoms, replicated over n = 8192 samples, each with
    its own RNG state. The counts must pass a chi-square test (3 dof) against the exact P(d wins) at
    p > 1e-6. The tile has heavy ties (Short and Long share the top atom; Hold and Flat share atom 0), so
    ties-to-lowest is tested too. Power: every alternative below would produce an expected chi-square
    (n * sum (p_alt - p)^2 / p) over 10x the failing threshold (~31), so none can pass by accident."""
    n = 8192
    logits, support, exact = thompson_batch(n)
    actions, _ = run_select(stream, stager, logits, support, xoroshiro_states(n, 2024, stager), explore=True)
    counts = np.bincount(actions[:, 0], minlength=4)
    stat = chi2(counts, exact)
    assert chi2_sf(stat, 3) > CHI2_P_MIN, f"counts {counts}, expected {n * exact}, chi2 {stat:.1f}"

    threshold = 30.7  # chi2_sf(30.7, 3) ~ 1e-6
    assert chi2_sf(threshold, 3) < 1.1e-6
    p = softmax64(logits[0, :4])
    q = (p * atoms64(support[0, :4], p.shape[1])).sum(axis=1)
    boltzmann = np.exp((q - q.max()) / (q.max() - q.min()))
    alternatives = {
        "argmax E[Q]": np.eye(4)[int(np.argmax(q))],
        "Boltzmann on E[Q]": boltzmann / boltzmann.sum(),
        "ties to the highest direction": thompson_probs(p[::-1])[::-1],
        "one uniform for all four draws": shared_uniform_probs(p),
    }
    for name, alt in alternatives.items():
        assert n * np.sum((alt - exact) ** 2 / exact) > 10 * threshold, name


T8_Q = {1: (0.0, 0.0, 1.0), 2: (0.25, 0.0, 0.0), 3: (0.0, 0.5, 0.25)}  # branch -> E[Q] of its 3 bins


def t8_batch(n):
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
        w = np.exp((qs - qs.max()) / max(qs.max() - qs.min(), float(TAU_FLOOR)))
        exact[k] = w / w.sum()
    return logits, support, exact


def test_boltzmann_histograms_match_the_seed_t8_probabilities(stream, stager):
    """Seed T8 at n = 8192: direction forced to Long so magnitude is not short-circuited; magnitude
    Q = [0, 0, 1] (P(best) = 1/(1 + 2/e)), order Q = [0.25, 0, 0] and urgency Q = [0, 0.5, 0.25], whose
    ranges differ, so tau must follow each branch's range. Each bin must be within +-5% absolute of
    exp((q - max q) / tau) normalised (1 sigma ~ 0.0055, so ~9 sigma). A strict argmax (P(best) = 1), or a
    fixed tau = 1 (order P(best) 0.39 instead of 0.58, urgency 0.38 instead of 0.51) miss by more than 0.1."""
    n = 8192
    logits, support, exact = t8_batch(n)
    actions, _ = run_select(stream, stager, logits, support, xoroshiro_states(n, 8, stager), explore=True)
    assert np.all(actions[:, 0] == LONG)
    assert exact[1][2] == pytest.approx(1 / (1 + 2 / math.e))  # 0.5761 (the seed rounds it to 0.5767)
    for k, expected in exact.items():
        freq = np.bincount(actions[:, k], minlength=3) / n
        assert np.all(np.abs(freq - expected) <= 0.05), f"{BRANCHES[k].name}: {freq} vs {expected}"
        assert abs(freq.max() - 1.0) > 0.1 and np.argmax(freq) == np.argmax(T8_Q[k])


@pytest.mark.gpu_only("2**20 samples per launch: about an hour under the simulator")
def test_thompson_and_boltzmann_at_a_million_samples(stream, stager):
    """The two tiles above at n = 2**20: direction counts (3 dof) and each Boltzmann branch (2 dof) pass
    chi-square at p > 1e-6; at this n a bias of 0.003 in any bin would fail."""
    n = 1 << 20
    logits, support, exact = thompson_batch(n)
    actions, _ = run_select(stream, stager, logits, support, xoroshiro_states(n, 77, stager), explore=True)
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


def test_seed_t6_eval_prefers_flat_while_training_explores(stream, stager):
    """Seed T6 failure mode: Hold and Flat peaked at v = 0, Long and Short log-Gaussian around -0.001 with
    sigma 0.05, support [-0.5, 0.5] in steps of 0.05 (21 atoms). E[Q] ranks Hold/Flat first, so eval picks
    Hold for every sample (Hold ties Flat and wins as the lower index), identically for two RNG states; in
    training Thompson picks Long or Short for >= 30% of 2048 samples (exactly about 79% here; the 30% bound
    is ~40 sigma away), and the frequencies pass the exact chi-square test."""
    n, z = 2048, 21
    support1 = linear_support(-0.5, 0.5, z)
    values = atoms64(support1, z)
    gauss = (-((values + 0.001) ** 2) / (2 * 0.05**2)).astype(np.float32)
    tile = np.stack([gauss, peaked_logits(z, 10), gauss, peaked_logits(z, 10)] + [np.zeros(z, np.float32)] * 9)
    logits = np.broadcast_to(tile, (n, N_HEADS, z)).copy()
    support = np.broadcast_to(support1, (n, N_HEADS, 3)).copy()

    first, _ = run_select(stream, stager, logits, support, xoroshiro_states(n, 1, stager), explore=False)
    second, _ = run_select(stream, stager, logits, support, xoroshiro_states(n, 2, stager), explore=False)
    assert np.all(first[:, 0] == HOLD)
    np.testing.assert_array_equal(first, second)

    train, _ = run_select(stream, stager, logits, support, xoroshiro_states(n, 3, stager), explore=True)
    directional = np.isin(train[:, 0], (LONG, SHORT)).mean()
    assert directional >= 0.30
    exact = thompson_probs(softmax64(tile[:4]))
    assert exact[SHORT] + exact[LONG] > 0.7
    counts = np.bincount(train[:, 0], minlength=4)
    assert chi2_sf(chi2(counts, exact), 3) > CHI2_P_MIN, f"counts {counts}, expected {n * exact}"


def test_collect_step_replays_as_a_captured_graph(stream, stager, rng):
    """select_actions allocates nothing, so a collect step can be a StepGraph: four replays of a captured
    graph (GPU) draw exactly what four eager launches draw from the same seed, the states advancing between
    replays (under the simulator both runs are eager and the launch traces are compared)."""
    b, z = 64, 5
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
