"""tools/td_probe.py: the transitions and returns of a fold's rows, and the learner's value fit, on small data with
a known answer."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from tool_loader import tool_module

from fox_numba.config import load_config


@pytest.fixture(scope="module")
def td_probe():
    yield from tool_module("td_probe")


def test_fold_rows_rewards_day_ends_and_discounted_returns(td_probe):
    rng = np.random.default_rng(3)
    mid = 100 + np.cumsum(rng.standard_normal(12))
    day_start = np.array([0, 5, 6, 12])  # a one-bar day (no transition) between two others
    rows = td_probe.fold_rows(mid, day_start, stop=10, gamma=0.9)
    assert rows.idx.tolist() == [0, 1, 2, 3, 6, 7, 8, 9]  # a day's final bar and rows >= stop have none
    assert rows.last.nonzero()[0].tolist() == [3, 10]
    for a, b in ((0, 5), (6, 12)):
        for t in range(a, b - 1):
            want = sum(0.9**k * (mid[t + k + 1] - mid[t + k]) for k in range(b - 1 - t))
            assert rows.reward[t] == pytest.approx(mid[t + 1] - mid[t]) and rows.ret[t] == pytest.approx(want)
    assert np.isnan(rows.reward[[4, 5, 11]]).all()


def ar1_walk(n: int, m: int, rho: float, beta: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x [n + 1, m] following an AR(1) with unit variance (a zero last row), the mid walk of the rewards
    r_t = x_t . beta + noise, and days of 400 bars (the last day's row n closes the walk)."""
    rng = np.random.default_rng(seed)
    x = np.zeros((n + 1, m))
    x[0] = rng.standard_normal(m)
    for t in range(1, n):
        x[t] = rho * x[t - 1] + np.sqrt(1 - rho**2) * rng.standard_normal(m)
    mid = np.concatenate([[0.0], np.cumsum(x[:n] @ beta + 0.1 * rng.standard_normal(n))])
    day_start = np.arange(0, n + 2, 400)
    day_start[-1] = n + 1
    return x, mid, day_start


def test_projection_splits_each_shifted_atom_between_its_neighbours(td_probe):
    z = np.linspace(-1.0, 1.0, 5)  # dz 0.5
    p = np.array([[0.1, 0.2, 0.3, 0.25, 0.15], [0.5, 0.0, 0.0, 0.0, 0.5]])
    out = td_probe.project(p, np.array([0.1, 0.0]), np.array([0.5, 0.0]), z)
    # row 0: atoms at 0.1 + 0.5 z = -0.4, -0.15, 0.1, 0.35, 0.6 -> positions (x - -1) / 0.5 = 1.2, 1.7, 2.2, 2.7, 3.2
    want = np.zeros(5)
    for mass, pos in zip(p[0], [1.2, 1.7, 2.2, 2.7, 3.2], strict=True):
        lo = int(np.floor(pos))
        want[lo] += mass * (lo + 1 - pos)
        want[lo + 1] += mass * (pos - lo)
    assert np.allclose(out[0], want, atol=1e-12)
    assert np.allclose(out[1], [0.0, 0.0, 1.0, 0.0, 0.0])  # discount 0: all mass on the reward, 0
    assert np.allclose(out.sum(axis=1), 1.0)


def test_c51_fit_recovers_a_known_linear_value(td_probe):
    """The AR(1) market below as a distribution: E[Z] of the C51 fit follows the true value x . beta / 0.6
    (correlation > 0.98, slope within 10%; measured 0.996 and 0.955 with seeds 0 and 1), which a fit of the next
    reward alone (slope 0.6) or a sign error cannot meet."""
    n, m, rho = 16_000, 3, 0.8
    beta = np.array([0.6, -0.8, 0.0])
    x, mid, day_start = ar1_walk(n, m, rho, beta, seed=7)
    rows = td_probe.fold_rows(mid, day_start, stop=n, gamma=0.5)
    lc = replace(load_config("default").learner, epochs=1, steps_per_epoch=4000, batch_size=256, lr=0.01, gamma=0.5)
    v = td_probe.value(np.hstack([x, np.ones((n + 1, 1))]), td_probe.learn_value(x, rows, "c51", lc, 0, atoms=51))
    true = x @ beta / (1 - 0.5 * rho)
    slope = np.polyfit(true[:n], v[:n], 1)[0]
    assert np.corrcoef(v[:n], true[:n])[0, 1] > 0.98 and 0.9 < slope < 1.1


@pytest.mark.parametrize("target", ["td", "mc", "split", "greedy"])
def test_learned_value_recovers_a_known_linear_value(td_probe, target):
    """Columns x_t that follow an AR(1) (rho 0.8, unit variance) and rewards r_t = x_t . beta + noise: the value
    of x_t is sum_k gamma^k E[r_(t+k) | x_t] = x_t . beta / (1 - gamma rho), so at gamma 0.5 every fit must find
    beta / 0.6 = (1, -1.333, 0): a fit of the next reward alone finds beta (0.4 and 0.53 away), another discount
    another multiple. `split` and `greedy` return half the long value minus the short one, each learned from only
    the transitions taken on it: a selection on x (greedy's) does not bias a correctly specified linear fit, so
    they must find it too, from about a third of the samples. 4,000 Adam steps on 16,000 rows; the tolerance 0.08 is
    several times the fits' error from the sampled noise and the day ends (1 row in 400 has no future)."""
    n, m, rho = 16_000, 3, 0.8
    beta = np.array([0.6, -0.8, 0.0])
    x, mid, day_start = ar1_walk(n, m, rho, beta, seed=7)
    rows = td_probe.fold_rows(mid, day_start, stop=n, gamma=0.5)
    lc = replace(load_config("default").learner, epochs=1, steps_per_epoch=4000, batch_size=256, lr=0.01, gamma=0.5)
    w = td_probe.learn_value(x, rows, target, lc, seed=0)
    assert np.allclose(w[:m], beta / (1 - 0.5 * rho), atol=0.08) and abs(w[m]) < 0.08


def test_table_trades_each_signal_as_probe_baseline_does(td_probe, four_day_store, tmp_path):
    """The traded columns of the table (one fold of 2 training + 2 validation days of the four-day market): the
    probe row's are the fold's probe baseline (market columns, evaluation.probe_ridge), the `td` row's the mean over
    its seeds of each seed's learned value fitted ridge-free and traded by the same rule; the correlation columns
    stay beside them."""
    from fox_numba.agent.fold_market import FoldMarket
    from fox_numba.config import FeatureConfig
    from fox_numba.market.select import select_market
    from fox_numba.walkforward.driver import half_spread, load_features, scored_days
    from fox_numba.walkforward.folds import make_folds
    from fox_numba.walkforward.probe import probe_baseline

    sets = ["folds.n_folds=1", "folds.train_days=2", "folds.val_days=2", "folds.step_days=1", "learner.epochs=1",
            "learner.steps_per_epoch=30", "learner.batch_size=64", "learner.lr=0.01"]
    out = tmp_path / "td.md"
    argv = ["--store", str(four_day_store), "--seeds", "0", "1", "--targets", "td", "--out", str(out)]
    assert td_probe.main(argv + [a for s in sets for a in ("--set", s)]) == 0
    table = [line.strip("|").split(" | ") for line in out.read_text().splitlines() if line.startswith("| 0 |")]
    probe_row, td_row = (dict(zip(("fold", "signal", "corr_val", "corr_train", "sharpe", "trips"),
                                  [c.strip() for c in row], strict=True)) for row in table)  # fmt: skip
    assert probe_row["signal"].startswith("probe") and td_row["signal"] == "td"

    cfg = load_config("default", overrides=[f'market.store="{four_day_store}"', *sets])
    selection = select_market(cfg.market)
    fold = make_folds(cfg.folds, selection.days)[0]
    plain = FeatureConfig(**{**vars(cfg.features), "forecast_horizons": []})
    m = FoldMarket.build(load_features(cfg, selection), fold, plain, cfg.env)
    ev = cfg.evaluation

    def trade(cols: np.ndarray, ridge: float):
        return probe_baseline(cols, m.mid, half_spread(m), m.day_start, slice(0, m.train_stop), scored_days(m),
                              ridge=ridge, horizon=ev.probe_horizon_bars, tick_size=m.tick_size,
                              point_value=m.point_value, commission=cfg.env.commission,
                              annualisation_days=ev.annualisation_days).metrics  # fmt: skip

    probe = trade(m.market_obs, ev.probe_ridge)
    assert probe.n_days == 2 and probe.round_trips > 0 and np.isfinite(probe.sharpe_daily)  # the check is not vacuous
    assert probe_row["sharpe"] == f"{probe.sharpe_daily:+.2f}"
    assert probe_row["trips"] == f"{probe.round_trips / probe.n_days:.1f}"

    x = np.asarray(m.market_obs, dtype=np.float64)
    rows = td_probe.fold_rows(np.asarray(m.mid, dtype=np.float64), m.day_start, m.train_stop, cfg.learner.gamma)
    xb = np.hstack([x, np.ones((len(x), 1))])
    per_seed = [trade(td_probe.value(xb, td_probe.learn_value(x, rows, "td", cfg.learner, seed))[:, None], 0.0)
                for seed in (0, 1)]  # fmt: skip
    assert td_row["sharpe"] == td_probe.mean_se([r.sharpe_daily for r in per_seed], 2)
    assert td_row["trips"] == td_probe.mean_se([r.round_trips / r.n_days for r in per_seed], 1, "")
    assert all(np.isfinite(float(td_row[k].split()[0])) for k in ("corr_val", "corr_train", "sharpe", "trips"))


def test_qlearn_without_costs_finds_the_next_reward_in_its_value_difference(td_probe):
    """`qlearn` at zero cost: the future after a bar does not depend on the position held over it, so the three
    position values share it and V(x, +1) - V(x, -1) = 2 E[r | x] = 2 x . beta exactly, the next reward's read (not
    the discounted value's beta / 0.6, which `td` finds): the difference of the fitted weights must be beta within
    0.08 (the tolerance of the test above; a fit that let the max term leak into the difference would be off by
    the 0.53 between beta and beta / 0.6)."""
    n, m, rho = 16_000, 3, 0.8
    beta = np.array([0.6, -0.8, 0.0])
    x, mid, day_start = ar1_walk(n, m, rho, beta, seed=7)
    rows = replace(td_probe.fold_rows(mid, day_start, stop=n, gamma=0.5), cost=np.zeros(n + 1))
    lc = replace(load_config("default").learner, epochs=1, steps_per_epoch=4000, batch_size=256, lr=0.01, gamma=0.5)
    w = td_probe.learn_value(x, rows, "qlearn", lc, seed=0)
    assert w.shape == (m + 1, 3)
    assert np.allclose((w[:m, 2] - w[:m, 0]) / 2, beta, atol=0.08)


def test_qlearn_at_a_prohibitive_cost_finds_the_value_of_holding(td_probe):
    """At a cost of 50 per contract (rewards of about 1) no change of position ever pays, so each value is that of
    holding its position: V(x, +1) - V(x, -1) = 2 x . beta / (1 - gamma rho), `td`'s answer (the forced closes at
    the days' ends cost both held positions alike and cancel in the difference). The same tolerance as above; the
    zero-cost answer beta is 0.53 away, so the cost must reach the fit through the max over the next position."""
    n, m, rho = 16_000, 3, 0.8
    beta = np.array([0.6, -0.8, 0.0])
    x, mid, day_start = ar1_walk(n, m, rho, beta, seed=7)
    rows = replace(td_probe.fold_rows(mid, day_start, stop=n, gamma=0.5), cost=np.full(n + 1, 50.0))
    lc = replace(load_config("default").learner, epochs=1, steps_per_epoch=4000, batch_size=256, lr=0.01, gamma=0.5)
    w = td_probe.learn_value(x, rows, "qlearn", lc, seed=0)
    assert np.allclose((w[:m, 2] - w[:m, 0]) / 2, beta / (1 - 0.5 * rho), atol=0.08)


def test_argmax_positions_act_on_the_values_net_of_the_change_cost(td_probe):
    """Hand values [V(-1), V(0), V(+1)] at a cost of 0.5 per contract changed: long (1 - 0.5 beats 0), kept (0.6
    against 0.2 - 0.5 and 0 - 1), flipped short (1.5 - 1 beats 0 - 0.5 and 0), flat at the day's last bar."""
    values = np.array([[0.0, 0.0, 1.0], [0.0, 0.2, 0.6], [1.5, 0.0, 0.0], [9.0, 0.0, 0.0]])
    pos = td_probe.argmax_positions(values, np.full(4, 0.5))
    assert pos.tolist() == [1.0, 1.0, -1.0, 0.0]


@pytest.mark.parametrize("cross", [False, True])
def test_direction_values_are_the_features_times_the_weights(td_probe, cross):
    """`direction_values` (the fast form the fit's targets use) equals the explicit features times the weights for
    every row, position and direction, on seeded random weights."""
    rng = np.random.default_rng(2)
    xb = np.hstack([rng.standard_normal((9, 3)), np.ones((9, 1))])
    q = rng.choice(td_probe.POSITIONS, 9)
    phi = np.stack([td_probe.direction_features(xb[k : k + 1], q[k], cross)[0] for k in range(9)])
    w = rng.standard_normal((phi.shape[1], 4))
    np.testing.assert_allclose(td_probe.direction_values(xb, q, w, cross), phi @ w, rtol=1e-12, atol=1e-12)


def test_qdir_cross_without_costs_finds_the_next_reward_in_long_minus_short(td_probe):
    """`qdir_cross` at zero cost on the AR(1) market: from flat, Long and Short differ only in the next bar's reward
    (the future after a bar does not depend on the position held over it), so (Q_long - Q_short) / 2 at q = 0 must be
    x . beta within 0.08, as `qlearn`'s value difference is (test above); its argmax trader from flat goes long where
    x . beta is well above 0."""
    n, m, rho = 16_000, 3, 0.8
    beta = np.array([0.6, -0.8, 0.0])
    x, mid, day_start = ar1_walk(n, m, rho, beta, seed=7)
    rows = replace(td_probe.fold_rows(mid, day_start, stop=n, gamma=0.5), cost=np.zeros(n + 1))
    lc = replace(load_config("default").learner, epochs=1, steps_per_epoch=3000, batch_size=256, lr=0.01, gamma=0.5)
    w = td_probe.learn_value(x, rows, "qdir_cross", lc, seed=0)
    xb = np.hstack([x, np.ones((n + 1, 1))])
    assert np.allclose((w[:m, 2] - w[:m, 0]) / 2, beta, atol=0.08)
    signal = td_probe.signal_of("qdir_cross", xb, w)
    assert np.corrcoef(signal[:n], x[:n] @ beta)[0, 1] > 0.98
    pos = td_probe.direction_positions(xb[:400], w, cross=True)
    up = x[:399] @ beta > 0.5
    assert (pos[:399][up] == 1.0).mean() > 0.9


def test_visited_positions_follow_the_greedy_policy_from_flat_each_day(td_probe):
    """`qdir_cross_visited`'s behaviour positions on a three-day market: every day starts flat; with no values yet
    every bar's direction is random (all three positions visited); with values whose bias favours Long by 10 the
    position after a bar is long unless that bar explored (probability EXPLORE = 0.1, so > 0.8 long at 1,000+ bars:
    4 standard deviations above chance, which would give ~0.33)."""
    n, m = 1200, 3
    x, mid, day_start = ar1_walk(n, m, 0.8, np.array([0.6, -0.8, 0.0]), seed=3)
    rows = replace(td_probe.fold_rows(mid, day_start, stop=n, gamma=0.5), cost=np.zeros(n + 1))
    xb = np.hstack([x, np.ones((n + 1, 1))])
    firsts = [d[0] for d in np.split(rows.idx, np.flatnonzero(np.diff(rows.idx) > 1) + 1)]
    assert len(firsts) >= 2
    rng = np.random.default_rng(0)
    random_held, random_taken = td_probe.visited_positions(xb, rows, None, rng)
    assert set(np.unique(random_held[rows.idx])) == {-1.0, 0.0, 1.0} and not random_held[firsts].any()
    assert set(np.unique(random_taken[rows.idx])) == {0, 1, 2, 3}
    w = np.zeros((2 * m + 2, 4))
    w[m, 2] = 10.0  # the bias row, Long
    held, taken = td_probe.visited_positions(xb, rows, w, rng)
    later = np.setdiff1d(rows.idx, firsts)
    assert not held[firsts].any() and (held[later] == 1.0).mean() > 0.8 and (taken[rows.idx] == 2).mean() > 0.8
    inside = later[np.isin(later - 1, rows.idx)]  # a bar's position is the one its day's previous bar's direction left
    np.testing.assert_array_equal(held[inside], td_probe.next_position(held[inside - 1])[
        np.arange(inside.size), taken[inside - 1]])


def test_draw_exploration_adds_normal_noise_to_every_value_instead_of_epsilon(td_probe):
    """`qdir_cross_draw`'s behaviour: with values favouring Long by 10, a noise scale of 1e-6 never leaves the argmax
    (every later bar long, where epsilon-greedy explores a tenth of them), and at a scale of 1e6 the values vanish
    under the draws: each direction is taken on 0.25 +- 0.05 of the ~1,200 bars (4 standard deviations of a
    binomial share there, seeded; the argmax alone would take Long on every bar)."""
    n, m = 1200, 3
    x, mid, day_start = ar1_walk(n, m, 0.8, np.array([0.6, -0.8, 0.0]), seed=3)
    rows = replace(td_probe.fold_rows(mid, day_start, stop=n, gamma=0.5), cost=np.zeros(n + 1))
    xb = np.hstack([x, np.ones((n + 1, 1))])
    firsts = [d[0] for d in np.split(rows.idx, np.flatnonzero(np.diff(rows.idx) > 1) + 1)]
    later = np.setdiff1d(rows.idx, firsts)
    w = np.zeros((2 * m + 2, 4))
    w[m, 2] = 10.0
    rng = np.random.default_rng(1)
    held, taken = td_probe.visited_positions(xb, rows, w, rng, noise=1e-6)
    assert (held[later] == 1.0).all() and (taken[rows.idx] == 2).all()
    _, taken = td_probe.visited_positions(xb, rows, w, rng, noise=1e6)
    shares = np.bincount(taken[rows.idx], minlength=4) / rows.idx.size
    assert np.abs(shares - 0.25).max() < 0.05, shares


def test_taken_gradient_is_the_visited_one_of_each_rows_own_direction(td_probe):
    """`qdir_cross_taken`'s gradient: column d is the visited gradient (every direction priced) of the batch rows that
    took d, weighted by their share of the batch, and no row trains a direction it did not take (float64, every
    element; random weights, positions and directions, so a mask applied to the wrong axis or not at all differs)."""
    n, m = 400, 3
    x, mid, day_start = ar1_walk(n, m, 0.8, np.array([0.6, -0.8, 0.0]), seed=5)
    rng = np.random.default_rng(11)
    rows = replace(td_probe.fold_rows(mid, day_start, stop=n, gamma=0.9), cost=rng.uniform(0.1, 0.3, n + 1))
    xb = np.hstack([x, np.ones((n + 1, 1))])
    w, w_tgt = rng.standard_normal((2 * m + 2, 4)), rng.standard_normal((2 * m + 2, 4))
    i = rng.choice(rows.idx, 64)
    held, taken = rng.choice(td_probe.POSITIONS, 64), rng.integers(0, 4, 64)
    got = td_probe.qdir_grad(xb, rows, i, w, w_tgt, 0.9, True, held=held, taken=taken)
    for d in range(4):
        mine = taken == d
        assert mine.any()
        want = td_probe.qdir_grad(xb, rows, i[mine], w, w_tgt, 0.9, True, held=held[mine])[:, d] * mine.mean()
        np.testing.assert_allclose(got[:, d], want, rtol=1e-12, atol=1e-12)


def test_qdir_cross_c51_without_costs_reads_the_next_reward(td_probe):
    """`qdir_cross_c51` at zero cost on the AR(1) market of the `qdir_cross` test: from flat, (E[Z_long] - E[Z_short])
    / 2 must follow x . beta (correlation > 0.95, slope within 0.15 of 1; a head that ignored x, or mixed up the directions,
    gives ~0 or < 0),
    and its argmax trader goes long where x . beta is well above 0."""
    n, m, rho = 16_000, 3, 0.8
    beta = np.array([0.6, -0.8, 0.0])
    x, mid, day_start = ar1_walk(n, m, rho, beta, seed=7)
    rows = replace(td_probe.fold_rows(mid, day_start, stop=n, gamma=0.5), cost=np.zeros(n + 1))
    lc = replace(load_config("default").learner, epochs=1, steps_per_epoch=1500, batch_size=256, lr=0.01, gamma=0.5)
    w = td_probe.learn_value(x, rows, "qdir_cross_c51", lc, seed=0, atoms=21)
    xb = np.hstack([x, np.ones((n + 1, 1))])
    signal = td_probe.signal_of("qdir_cross_c51", xb, w)
    assert np.corrcoef(signal[:n], x[:n] @ beta)[0, 1] > 0.95
    assert abs(np.polyfit(x[:n] @ beta, signal[:n], 1)[0] - 1.0) < 0.15  # its scale too: x . beta (measured 0.96)
    pos = td_probe.direction_positions(xb[:400], w, cross=True)
    up = x[:399] @ beta > 0.5
    assert (pos[:399][up] == 1.0).mean() > 0.9
