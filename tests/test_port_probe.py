"""tools/port_probe.py: the portfolio columns, the re-held histories and the counterfactual batch's gradient, each
against a loop written from the module header, every element, on small seeded inputs."""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from port_probe import (  # noqa: E402
    ensembles,
    features,
    mirror_parity,
    mirror_project,
    mirrored,
    PORT_COLUMNS,
    Book,
    AGENT_GRAD_SCALE,
    Carry,
    in_risk_units,
    initial_weights,
    batch_grad,
    enters_average,
    held_states,
    held_target,
    step_portfolio,
    trade_day,
)
from td_probe import Rows, next_position  # noqa: E402

DAY_START = np.array([0, 9, 20])


def book(rng: np.random.Generator) -> Book:
    mid = 100.0 + np.cumsum(rng.normal(0.0, 0.5, DAY_START[-1]))
    return Book.of(mid, DAY_START, 20, max_position=4, episode_bars=6)


def day_rows(b: Book, rng: np.random.Generator) -> Rows:
    """The transitions of the book's two days (td_probe.fold_rows' layout) with random per-row costs."""
    reward = np.full(20, np.nan)
    last = np.zeros(20, bool)
    for a, e in zip(DAY_START[:-1], DAY_START[1:], strict=True):
        reward[a : e - 1] = np.diff(b.mid[a:e])
        last[e - 2] = True
    return Rows(np.flatnonzero(np.isfinite(reward)), reward, last, reward.copy(), cost=rng.uniform(0.05, 0.2, 20))


def test_columns_and_steps_follow_the_position_history(rng):
    b = book(rng)
    moves = np.concatenate([np.diff(b.mid[0:9]), np.diff(b.mid[9:20])])
    assert b.risk == 4 * np.std(moves)
    t, q = np.array([3, 12, 15]), np.array([1.0, -1.0, 0.0])
    entry, bars = np.array([99.0, 101.0, 0.0]), np.array([2, 9, 0])
    got = b.columns(t, q, entry, bars)
    for k in range(3):
        u = float(np.clip(q[k] * (b.mid[t[k]] - entry[k]) / b.risk, -5, 5)) if q[k] else 0.0
        h = min(bars[k] / 6, 1.0) if q[k] else 0.0
        left = min((b.last_row[t[k]] - t[k]) / 6, 1.0)
        np.testing.assert_allclose(got[k], [u, h, left], rtol=0, atol=1e-12)
    np.testing.assert_array_equal(b.first[[0, 8, 9, 19]], [0, 0, 9, 9])
    np.testing.assert_array_equal(b.last_row[[0, 8, 9, 19]], [8, 8, 19, 19])
    # kept side: same entry, one bar more; a flip or an entry: this bar's mid, one bar; flat: none
    e, h = step_portfolio(np.array([1.0, 1.0, 0.0, -1.0]), np.array([99.0, 99.0, 0.0, 98.0]), np.array([3, 3, 0, 4]),
                          np.array([1.0, -1.0, 1.0, 0.0]), np.array([100.0, 100.0, 100.0, 100.0]))
    np.testing.assert_array_equal(e, [99.0, 100.0, 100.0, 100.0])
    np.testing.assert_array_equal(h, [4, 1, 1, 0])


def test_re_held_states_one_bar_or_a_history_inside_the_day(rng):
    b = book(rng)
    t = rng.integers(0, 19, 400)
    q, entry, bars = held_states(b, t, "agent", 60, rng)
    np.testing.assert_array_equal(q, np.arange(400) % 4 - 2)
    held = q != 0
    np.testing.assert_array_equal(entry[held], b.mid[t[held]])
    assert (bars[held] == 1).all() and (bars[~held] == 0).all() and (entry[~held] == 0).all()
    q, entry, bars = held_states(b, t, "history", 5, rng)
    span = np.minimum(t - b.first[t], 5)
    assert (bars[held] >= 1).all() and (bars[held] <= np.maximum(span[held], 1)).all()
    assert len(np.unique(bars[held])) == 5  # every history length drawn
    np.testing.assert_array_equal(entry[held], b.mid[np.maximum(t - bars, b.first[t])[held]])


def test_batch_gradient_matches_a_loop_over_rows_and_directions(rng):
    b = book(rng)
    x = rng.normal(size=(20, 3))
    xb = np.hstack([x, np.ones((20, 1))])
    rows = day_rows(b, rng)
    reward, last = rows.reward, rows.last
    cols = PORT_COLUMNS["agent"]
    w, w_tgt = rng.normal(size=(2 * 4 + 3, 4)), rng.normal(size=(2 * 4 + 3, 4))
    t = np.array([1, 7, 10, 18])
    q, entry, bars = np.array([1.0, -1.0, 0.0, 1.0]), np.array([100.5, 99.0, 0.0, 101.0]), np.array([3, 1, 0, 7])
    got = batch_grad(xb, b, rows, t, q, entry, bars, w, w_tgt, 0.9, cols)

    def phi(r, q_, e_, h_):
        port = b.columns(np.array([r]), np.array([q_]), np.array([e_]), np.array([h_]))[0]
        return np.concatenate([xb[r], [q_], q_ * xb[r, :-1], port])

    want = np.zeros_like(w)
    for k, r in enumerate(t):
        f = phi(r, q[k], entry[k], bars[k])
        for d, qn in enumerate(next_position(q[k])):
            kept = qn == q[k] and q[k] != 0
            e2, h2 = (entry[k], bars[k] + 1) if kept else (b.mid[r], 1 if qn != 0 else 0)
            future = -rows.cost[r + 1] * abs(qn) if last[r] else 0.9 * max(phi(r + 1, qn, e2, h2) @ w_tgt)
            y = -rows.cost[r] * abs(qn - q[k]) + qn * reward[r] + future
            want[:, d] += 2.0 * f * (f @ w[:, d] - y) / len(t)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_held_targets_match_a_loop_over_the_bars_held(rng):
    """`held_target`: the move's cost, the discounted PnL of each bar held, then the discounted bootstrap at the row
    reached, or the forced close where the day ends first; at one bar the one-step target of batch_grad."""
    b = book(rng)
    xb = np.hstack([rng.normal(size=(20, 3)), np.ones((20, 1))])
    rows = day_rows(b, rng)
    reward, last = rows.reward, rows.last
    cols = PORT_COLUMNS["left"]
    w_tgt = rng.normal(size=(2 * 4 + 1, 4))
    t = np.array([0, 4, 6, 9, 15, 17])  # bootstraps inside the day, and days that end first
    q = np.array([1.0, -1.0, 0.0, 1.0, 0.0, -1.0])
    gamma = 0.9

    def value(r, qn):
        left = min((b.last_row[r] - r) / 6, 1.0)
        return max(np.concatenate([xb[r], [qn], qn * xb[r, :-1], [left]]) @ w_tgt)

    for n in (1, 3, 5):
        for qn_of in (lambda q_: next_position(q_)[:, 0], lambda q_: next_position(q_)[:, 3]):
            qn = qn_of(q)
            got = held_target(xb, b, rows, t, q, qn, w_tgt, gamma, cols, n)
            for k, r in enumerate(t):
                y, disc, r_k = -rows.cost[r] * abs(qn[k] - q[k]), 1.0, r
                for _ in range(n):
                    y += disc * qn[k] * reward[r_k]
                    if last[r_k]:
                        y -= disc * rows.cost[r_k + 1] * abs(qn[k])
                        break
                    r_k, disc = r_k + 1, disc * gamma
                else:
                    y += disc * value(r_k, qn[k])
                np.testing.assert_allclose(got[k], y, rtol=1e-12, atol=1e-12)
                if n == 1:  # batch_grad's one-step target: the same
                    one = -rows.cost[r] * abs(qn[k] - q[k]) + qn[k] * reward[r] + (
                        -rows.cost[r + 1] * abs(qn[k]) if last[r] else gamma * value(r + 1, qn[k]))
                    np.testing.assert_allclose(got[k], one, rtol=1e-12, atol=1e-12)


def test_flat_one_step_keeps_the_one_step_target_where_the_reached_position_is_flat(rng):
    """With held targets and flat_one_step, Flat's column is the one-step gradient, Short's and Long's the held one,
    and Hold's mixes them by row (a row held flat takes the one-step target)."""
    b = book(rng)
    xb = np.hstack([rng.normal(size=(20, 3)), np.ones((20, 1))])
    rows = day_rows(b, rng)
    cols = PORT_COLUMNS["left"]
    w, w_tgt = rng.normal(size=(2 * 4 + 1, 4)), rng.normal(size=(2 * 4 + 1, 4))
    t = np.array([1, 4, 7, 10, 15])
    q = np.array([1.0, 0.0, -1.0, 0.0, 1.0])
    entry, bars = np.where(q != 0, b.mid[t], 0.0), (q != 0).astype(np.int64)
    one, held, mixed = (batch_grad(xb, b, rows, t, q, entry, bars, w, w_tgt, 0.9, cols, n, flat)
                        for n, flat in ((1, False), (3, False), (3, True)))  # fmt: skip
    np.testing.assert_array_equal(mixed[:, 3], one[:, 3])
    np.testing.assert_array_equal(mixed[:, [0, 2]], held[:, [0, 2]])
    flat_rows = q == 0
    by_row = [batch_grad(xb, b, rows, t[k], q[k], entry[k], bars[k], w, w_tgt, 0.9, cols, 1 if flat_rows[k[0]] else 3)
              for k in ([i] for i in range(len(t)))]  # each row alone, scaled back to the batch's mean below
    np.testing.assert_allclose(mixed[:, 1], sum(g[:, 1] for g in by_row) / len(t), rtol=1e-12, atol=1e-12)
    assert not np.allclose(mixed[:, 1], one[:, 1]) and not np.allclose(mixed[:, 1], held[:, 1])


def test_a_day_traded_by_argmax_ends_flat_and_tracks_its_entries(rng):
    b = book(rng)
    xb = np.hstack([rng.normal(size=(20, 3)), np.ones((20, 1))])
    w = rng.normal(size=(2 * 4 + 3, 4))
    after, held, entry, bars = trade_day(xb, b, 9, 20, w, PORT_COLUMNS["agent"])
    assert after[-1] == 0 and held[0] == 0 and (np.abs(after) <= 1).all()
    np.testing.assert_array_equal(held[1:], after[:-1])
    for k in range(1, 11):  # each bar's history follows step_portfolio from the one before
        e, h = step_portfolio(held[k - 1 : k], entry[k - 1 : k], bars[k - 1 : k], held[k : k + 1],
                              b.mid[8 + k : 9 + k])
        assert (entry[k], bars[k]) == (e[0], h[0]) or held[k] == 0


def test_a_day_deciding_every_third_bar_holds_between_and_decides_as_every_bar_does(rng):
    """every=3: the position changes only at rows 0, 3, 6, ... of the day (and the close at its last row), and at
    each of them to the argmax the every-bar rule takes from the same held state."""
    b = book(rng)
    xb = np.hstack([rng.normal(size=(20, 3)), np.ones((20, 1))])
    w = rng.normal(size=(2 * 4 + 1, 4))
    w[:3] *= 4.0  # the market columns dominate: the choice moves from row to row
    after, held, _, _ = trade_day(xb, b, 9, 20, w, PORT_COLUMNS["left"], None, 3)  # the second day, rows 9-19
    changed = np.flatnonzero(after[:-1] != held[:-1])
    assert len(changed) > 1 and (changed % 3 == 0).all() and after[-1] == 0
    for k in range(0, 10, 3):  # the every-bar rule's choice from the same held state
        v = xb[9 + k] @ w[:4] + held[k] * (w[4] + xb[9 + k, :-1] @ w[5:8])
        left = min((b.last_row[9 + k] - (9 + k)) / 6, 1.0)
        v = v + left * w[8]
        assert after[k] == next_position(held[k])[int(np.argmax(v))]


def test_the_average_takes_epoch_ends_or_every_step_from_its_start():
    """3 epochs of 4 steps, averaged from epoch 1: 'epoch' takes steps 7 and 11, 'step' steps 4-11, 'none' none."""
    taken = {a: [s for s in range(12) if enters_average(s, 4, a, 1)] for a in ("none", "epoch", "step")}
    assert taken == {"none": [], "epoch": [7, 11], "step": list(range(4, 12))}


def test_a_carried_fold_starts_from_the_shrunk_weights_and_moments(rng):
    """Carry.start is the agent's fold boundary (learner.fold_keep = 0.3 here): w x 0.3, m x 0.1, v x 0.01."""
    w, m, v = rng.normal(size=(5, 4)), rng.normal(size=(5, 4)), rng.uniform(0.1, 1.0, (5, 4))
    w0, (m0, v0) = Carry(w, [m, v]).start(0.3)
    np.testing.assert_allclose(w0, 0.3 * w, rtol=1e-15)
    np.testing.assert_allclose(m0, 0.1 * m, rtol=1e-7)
    np.testing.assert_allclose(v0, 0.01 * v, rtol=1e-7)


def test_initial_weights_are_the_mean_head_draw_scaled_with_a_zero_bias():
    """--init-scale: U(+-s sqrt(6 / (n + 4))) in every row but the bias row; zeros at 0; the draw is the seed's."""
    w, half = initial_weights(11, 4, 1.0, seed=3), initial_weights(11, 4, 0.5, seed=3)
    bound = np.sqrt(6.0 / 15)
    assert w.shape == (11, 4) and not w[4].any() and np.abs(w).max() <= bound and np.abs(w).max() > 0.5 * bound
    np.testing.assert_allclose(half, 0.5 * w, rtol=1e-15)
    assert not initial_weights(11, 4, 0.0, seed=3).any()
    assert not np.array_equal(w, initial_weights(11, 4, 1.0, seed=4))


def test_risk_units_divide_rewards_returns_and_costs_and_the_agents_gradient_is_an_eighth(rng):
    """--agent-units: every money figure of the rows over the risk unit in points; the agent's mean-head loss
    (kernels/mean_head.py) averages e**2 / 2 over B = 4 n rows where batch_grad takes 2 / n over n transitions."""
    b = book(rng)
    rows = day_rows(b, rng)
    scaled = in_risk_units(rows, 2.5)
    for name in ("reward", "ret", "cost"):
        np.testing.assert_allclose(getattr(scaled, name), getattr(rows, name) / 2.5, rtol=1e-15)
    np.testing.assert_array_equal(scaled.idx, rows.idx)
    n = 5
    assert AGENT_GRAD_SCALE * 2.0 / n == 1.0 / (4 * n)


def test_an_ensemble_is_the_mean_of_each_groups_weights_and_trades_as_their_mean_values(rng):
    """`ensembles`: groups of k consecutive fits averaged; the averaged weights' values are the mean of the group's
    values on any rows (the values are linear in the weights), so its argmax is the ensemble's decision."""
    fits = [rng.standard_normal((7, 4)) for _ in range(6)]
    groups = ensembles(fits, 3)
    assert len(groups) == 2
    np.testing.assert_allclose(groups[1], (fits[3] + fits[4] + fits[5]) / 3, rtol=1e-12)
    phi = rng.standard_normal((11, 7))
    np.testing.assert_allclose(phi @ groups[0], np.mean([phi @ w for w in fits[:3]], axis=0), rtol=1e-12, atol=1e-12)


def test_the_mirror_negates_the_signed_columns_and_the_price_changes_only(rng):
    """`mirrored`: the market reflected about its prices: its signed columns (symmetry_probe.signed_columns) and the
    rewards and returns change sign; the unsigned columns, the bias column and the rows' structure do not."""
    from symmetry_probe import signed_columns

    xb = np.hstack([rng.standard_normal((9, 128)), np.ones((9, 1))])
    rows = Rows(idx=np.arange(8), reward=rng.standard_normal(9), last=np.zeros(9, bool),
                ret=rng.standard_normal(9), cost=rng.random(9))
    xm, rm = mirrored(xb, rows)
    signed = signed_columns()
    rest = np.setdiff1d(np.arange(129), signed)
    np.testing.assert_array_equal(xm[:, signed], -xb[:, signed])
    np.testing.assert_array_equal(xm[:, rest], xb[:, rest])
    assert 128 in rest and len(signed) == 84
    np.testing.assert_array_equal(rm.reward, -rows.reward)
    np.testing.assert_array_equal(rm.ret, -rows.ret)
    np.testing.assert_array_equal(rm.cost, rows.cost)
    np.testing.assert_array_equal(rm.idx, rows.idx)


def test_projected_weights_value_the_mirrored_state_as_the_state(rng):
    """`mirror_project`: for the projected weights, the values of the mirrored row (signed columns negated), held
    at -q, are the row's values with Short and Long swapped; projecting twice changes nothing; unprojected weights
    do not have the property."""
    xb = np.hstack([rng.standard_normal((6, 128)), np.ones((6, 1))])
    xm, _ = mirrored(xb, Rows(idx=np.arange(6), reward=np.zeros(6), last=np.zeros(6, bool), ret=np.zeros(6)))
    q, port = rng.choice([-1.0, 0.0, 1.0], 6), rng.random((6, 1))
    parity = mirror_parity(128, (2,))
    w = rng.standard_normal((2 * 129 + 1, 4))
    p = mirror_project(w, parity)
    np.testing.assert_allclose(features(xm, -q, port) @ p, (features(xb, q, port) @ p)[:, [2, 1, 0, 3]],
                               rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(mirror_project(p, parity), p, rtol=1e-15, atol=0)
    assert not np.allclose(features(xm, -q, port) @ w, (features(xb, q, port) @ w)[:, [2, 1, 0, 3]])
    # at a strength s the gap between the two shrinks to (1 - s) of the unprojected weights' gap
    gap = features(xm, -q, port) @ w - (features(xb, q, port) @ w)[:, [2, 1, 0, 3]]
    h = mirror_project(w, parity, 0.25)
    np.testing.assert_allclose(features(xm, -q, port) @ h - (features(xb, q, port) @ h)[:, [2, 1, 0, 3]],
                               0.75 * gap, rtol=1e-10, atol=1e-10)
