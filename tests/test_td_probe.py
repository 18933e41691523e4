"""tools/td_probe.py: the transitions and returns of a fold's rows, and the learner's value fit, on small data with
a known answer."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from fox_numba.config import load_config

SCRIPT = Path(__file__).resolve().parents[1] / "tools" / "td_probe.py"


@pytest.fixture(scope="module")
def td_probe():
    spec = importlib.util.spec_from_file_location("td_probe_tool", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve their annotations there
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


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


@pytest.mark.parametrize("target", ["td", "mc"])
def test_learned_value_recovers_a_known_linear_value(td_probe, target):
    """Columns x_t that follow an AR(1) (rho 0.8, unit variance) and rewards r_t = x_t . beta + noise: the value
    of x_t is sum_k gamma^k E[r_(t+k) | x_t] = x_t . beta / (1 - gamma rho), so at gamma 0.5 both fits must find
    beta / 0.6 = (1, -1.333, 0): a fit of the next reward alone finds beta (0.4 and 0.53 away), another discount
    another multiple. 4,000 Adam steps on 16,000 rows; the tolerance 0.08 is several times the fits' error from the
    sampled noise and the day ends (1 row in 400 has no future)."""
    n, m, rho = 16_000, 3, 0.8
    beta = np.array([0.6, -0.8, 0.0])
    x, mid, day_start = ar1_walk(n, m, rho, beta, seed=7)
    rows = td_probe.fold_rows(mid, day_start, stop=n, gamma=0.5)
    lc = replace(load_config("default").learner, epochs=1, steps_per_epoch=4000, batch_size=256, lr=0.01, gamma=0.5)
    w = td_probe.learn_value(x, rows, target, lc, seed=0)
    assert np.allclose(w[:m], beta / (1 - 0.5 * rho), atol=0.08) and abs(w[m]) < 0.08
