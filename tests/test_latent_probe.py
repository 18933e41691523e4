"""tools/latent_probe.py: the noisy reads of a known signal, the linear and nonlinear reads, and the whole tool on a
small synthetic market with its latent truth."""

from __future__ import annotations

import math

import numpy as np
import pytest
from tool_loader import tool_module


@pytest.fixture(scope="module")
def latent_probe():
    yield from tool_module("latent_probe")


def test_ar1_noise_has_unit_variance_and_the_asked_persistence(latent_probe):
    """50,000 draws at phi 0.8: the lag-one autocorrelation's standard error is about sqrt((1 - phi^2) / n) = 0.003
    and the variance's about 0.02 (an AR(1)'s effective sample is n (1 - phi^2) / (1 + phi^2)); tolerances 0.02 and
    0.1 are 6 and 5 of them, and a white or random-walk noise misses both by far."""
    x = latent_probe.ar1_noise(50_000, 0.8, np.random.default_rng(1))
    assert abs(latent_probe.lag_one_autocorrelation(x) - 0.8) < 0.02
    assert abs(x.var() - 1.0) < 0.1


@pytest.mark.parametrize("rho", [0.3, 0.7])
def test_a_noisy_read_has_the_asked_correlation(latent_probe, rho):
    """A signal of AR(1) persistence 0.9 over 40,000 bars (about 2,100 independent ones) read through noise of the
    same persistence: the sample correlation's standard error is about (1 - rho^2) / sqrt(2,100) <= 0.02; tolerance
    0.06. A noise scale off by a factor of 1.5 moves the correlation by more than 0.08 at either rho."""
    rng = np.random.default_rng(7)
    er = 3.0 * latent_probe.ar1_noise(40_000, 0.9, rng)
    read = latent_probe.noisy_read(er, rho, 0.9, rng)
    assert abs(np.corrcoef(read, er)[0, 1] - rho) < 0.06
    with pytest.raises(ValueError, match="rho"):
        latent_probe.noisy_read(er, 0.0, 0.9, rng)


def test_the_ridge_read_recovers_a_linear_signal_from_the_training_rows(latent_probe):
    """y = X w + 2 exactly: fitted on the first 800 of 1,000 rows at a small ridge, the read of the other 200 is y
    to within the ridge's shrinkage (correlation > 0.999, scale within 2%); columns of different scales are
    standardised on the training rows only."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1000, 6)) * np.array([1.0, 10.0, 0.1, 3.0, 1.0, 5.0])
    y = x @ np.array([0.5, -0.02, 4.0, 0.1, 0.0, 0.3]) + 2.0
    train = np.arange(1000) < 800
    read = latent_probe.ridge_read(x, y, train, 1e-4)
    assert np.corrcoef(read[~train], y[~train])[0, 1] > 0.999
    slope = np.polyfit(y[~train], read[~train], 1)[0]
    assert abs(slope - 1.0) < 0.02


def test_the_mlp_read_finds_what_a_linear_read_cannot(latent_probe):
    """y = x0^2 - 1 + small noise: no linear function of x correlates with it (the ridge read's correlation on
    held-out rows is within 0.1 of 0), while the MLP's, after 30 epochs of 8 minibatches, exceeds 0.6 (0.72 at this
    seed; a network that learnt nothing would be near 0 like the linear read)."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((6000, 4))
    y = x[:, 0] ** 2 - 1.0 + 0.1 * rng.standard_normal(6000)
    rows = np.arange(6000)
    fit, held, test = rows < 4000, (rows >= 4000) & (rows < 5000), rows >= 5000
    linear = latent_probe.ridge_read(x, y, fit, 0.01)
    assert abs(np.corrcoef(linear[test], y[test])[0, 1]) < 0.1
    read = latent_probe.mlp_read(x, y, fit, held, seed=0)
    assert np.corrcoef(read[test], y[test])[0, 1] > 0.6
    assert np.array_equal(read, latent_probe.mlp_read(x, y, fit, held, seed=0))  # the seed decides everything


def test_the_tool_on_a_small_synthetic_market(latent_probe, tmp_path, small_synth_store):
    """The whole tool on a small synthetic store: the oracle row reads er exactly, its Sharpe is the best of the
    noisy reads' in expectation (the rows exist and are finite), and the table is written with its command."""
    out = tmp_path / "latent.md"
    assert latent_probe.main(["--store", str(small_synth_store), "--rho", "0.5", "--seeds", "0", "1",
                              "--set", "folds.n_folds=1", "--set", "folds.train_days=12", "--set", "folds.val_days=4",
                              "--out", str(out)]) == 0  # fmt: skip
    text = out.read_text()
    assert "Command: `python3 tools/latent_probe.py --store" in text
    rows = [line.split("|")[1:-1] for line in text.splitlines() if line.startswith("| 0 |")]
    names = [r[1].strip() for r in rows]
    assert names[0] == "oracle (er)" and names[1] == "er + AR(1) noise, rho 0.5" and names[-1].startswith("probe")
    assert any(n.startswith("read of er (ridge") for n in names) and any(n.startswith("read of er (MLP") for n in names)
    for r in rows:
        sharpe = float(r[3].split()[0])
        assert math.isfinite(sharpe)
