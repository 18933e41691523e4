"""How much of the oracle can a forecast read from the agent's observation earn, on a market with a known answer?

    python3 tools/latent_probe.py [--store STORE.h5] [--rho 0.3 0.5 0.7 0.9] [--seeds 0 1 2 3 4] \
        [--set folds.n_folds=2 --set folds.val_days=30 --set folds.step_days=30] [--out tools/results/NAME.md]

A synthetic store keeps its latent truth beside it (STORE.latent.npz, `fox data synth`): per bar the expected
change of the efficient price over the oracle's horizon, er, which the oracle trades (market/synthetic_oracle.py).
Every signal below is traded the same way, by the oracle's rule on the fold's validation days with the probe's cost
model (walkforward/probe.py), so the rows differ only in how well the signal reads er:

- `oracle`: er itself;
- `er + noise, rho`: er plus noise scaled so that the signal's correlation with er is rho, the noise an AR(1) with
  the persistence of er's own bar-to-bar changes (a forecast's error moves as slowly as what it forecasts; white
  noise would churn the rule and understate what a read of that quality earns). Mean (standard error) over the
  noise seeds. These rows map the correlation with er a forecast needs to earn a given share of the oracle;
- `read of er (ridge)`: a ridge fit of er on the observation's market columns over the training rows: the best
  linear read of the latent the observation allows, fitted to the truth, which no learner sees (an upper
  reference for a linear read, not a baseline);
- `read of er (MLP)`: a one-hidden-layer network (MLP_HIDDEN tanh units) fitted to er on the same columns and rows
  (Adam, minibatches; the epoch with the smallest error on the last HELD_DAYS training days, which it does not
  fit, kept): whether a nonlinear read of the observation knows more of er than the linear one. Mean (standard
  error) over the seeds (initialisation and batches);
- `probe`: the probe baseline (the ridge fit of the probe_horizon-bar mid change the agent is compared with).

If the linear read of er earns well under half of the oracle, the issue's "half of the oracle" needs a better read
of the latent than any linear function of today's observation: features or a nonlinear read, not a better learner
of the same linear one. CPU only.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fox_numba.agent.fold_market import FoldMarket  # noqa: E402
from fox_numba.config import FeatureConfig, FoxConfig, load_config  # noqa: E402
from fox_numba.market.default import ensure_default_store  # noqa: E402
from fox_numba.market.select import select_market  # noqa: E402
from fox_numba.market.synthetic import sidecar_paths  # noqa: E402
from fox_numba.market.synthetic_oracle import oracle_positions, oracle_threshold  # noqa: E402
from fox_numba.observation import feature_columns  # noqa: E402
from fox_numba.walkforward.driver import half_spread, load_features, scored_days  # noqa: E402
from fox_numba.walkforward.folds import make_folds  # noqa: E402
from fox_numba.walkforward.metrics import compute_metrics, positions_to_days  # noqa: E402
from fox_numba.walkforward.probe import probe_baseline  # noqa: E402

RIDGE = 0.01
"""Ridge of the read of er, on standardised columns (the probe's default, evaluation.probe_ridge)."""
MLP_HIDDEN, MLP_BATCH, MLP_LR = 64, 512, 1e-3
HELD_DAYS = 10
"""Training days at the end of the training window the MLP is not fitted on; they choose its epoch."""


def ar1_noise(n: int, phi: float, rng: np.random.Generator) -> np.ndarray:
    """float64 [n]: a stationary AR(1) with unit variance and lag-one autocorrelation phi."""
    eps = rng.standard_normal(n)
    out = np.empty(n)
    out[0] = eps[0]
    scale = math.sqrt(1.0 - phi * phi)
    for t in range(1, n):
        out[t] = phi * out[t - 1] + scale * eps[t]
    return out


def noisy_read(er: np.ndarray, rho: float, phi: float, rng: np.random.Generator) -> np.ndarray:
    """er plus AR(1) noise of persistence phi scaled so that the result's correlation with er is rho in
    expectation: noise std = std(er) * sqrt(1 / rho^2 - 1)."""
    if not 0.0 < rho <= 1.0:
        raise ValueError(f"rho must be in (0, 1], got {rho}")
    scale = float(np.std(er)) * math.sqrt(1.0 / (rho * rho) - 1.0)
    return er + scale * ar1_noise(len(er), phi, rng)


def lag_one_autocorrelation(x: np.ndarray) -> float:
    d = x - x.mean()
    return float(np.dot(d[1:], d[:-1]) / np.dot(d, d))


def ridge_read(x: np.ndarray, y: np.ndarray, train: np.ndarray, ridge: float) -> np.ndarray:
    """float64 [n]: the ridge fit of y on x's standardised columns over the `train` rows, applied to every row
    (the columns' mean and scale from the training rows; ridge * n_train on the diagonal, the intercept free)."""
    z = standardise(x, train)
    zt = z[train]
    yt = y[train] - y[train].mean()
    w = np.linalg.solve(zt.T @ zt + ridge * len(zt) * np.eye(z.shape[1]), zt.T @ yt)
    return z @ w + y[train].mean()


def standardise(x: np.ndarray, rows: np.ndarray) -> np.ndarray:
    mean, std = x[rows].mean(axis=0), x[rows].std(axis=0)
    std[std == 0] = 1.0
    return (x - mean) / std


def mlp_read(x: np.ndarray, y: np.ndarray, fit: np.ndarray, held: np.ndarray, seed: int,
             epochs: int = 30) -> np.ndarray:
    """float64 [n]: a tanh MLP (MLP_HIDDEN units) of y on x's standardised columns fitted by Adam on minibatches
    of the `fit` rows (targets scaled to unit variance) for `epochs` epochs, the epoch of the smallest squared error
    on the `held` rows kept; applied to every row."""
    rng = np.random.default_rng(seed)
    z = standardise(x, fit)
    mu, sd = y[fit].mean(), y[fit].std()
    t = (y - mu) / sd
    params = [rng.standard_normal((z.shape[1], MLP_HIDDEN)) / math.sqrt(z.shape[1]), np.zeros(MLP_HIDDEN),
              rng.standard_normal(MLP_HIDDEN) / math.sqrt(MLP_HIDDEN), np.zeros(1)]
    moments = [(np.zeros_like(q), np.zeros_like(q)) for q in params]

    def forward(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        h = np.tanh(z[rows] @ params[0] + params[1])
        return h, h @ params[2] + params[3][0]

    best, best_err, step = [q.copy() for q in params], np.inf, 0
    fit_rows = np.flatnonzero(fit)
    for _epoch in range(epochs):
        for batch in np.array_split(rng.permutation(fit_rows), max(1, len(fit_rows) // MLP_BATCH)):
            h, out = forward(batch)
            d = 2.0 * (out - t[batch]) / len(batch)
            dh = np.outer(d, params[2]) * (1.0 - h * h)
            grads = [z[batch].T @ dh, dh.sum(axis=0), h.T @ d, np.array([d.sum()])]
            step += 1
            for q, g, (m1, m2) in zip(params, grads, moments, strict=True):
                m1 *= 0.9
                m1 += 0.1 * g
                m2 *= 0.999
                m2 += 0.001 * g * g
                q -= MLP_LR * (m1 / (1 - 0.9**step)) / (np.sqrt(m2 / (1 - 0.999**step)) + 1e-8)
        err = float(np.mean((forward(np.flatnonzero(held))[1] - t[held]) ** 2))
        if err < best_err:
            best, best_err = [q.copy() for q in params], err
    params[:] = best
    return forward(np.arange(len(z)))[1] * sd + mu


def traded(signal: np.ndarray, m: FoldMarket, cfg: FoxConfig) -> tuple[float, float]:
    """Validation daily Sharpe and round trips per day of `signal` (price units, one per fold row) traded by the
    oracle's rule on the fold's scored validation days."""
    threshold = oracle_threshold(m.tick_size, m.point_value, cfg.env.commission)
    half = half_spread(m)
    windows = [(int(m.day_start[d]), int(m.day_start[d + 1])) for d in scored_days(m)]
    days = positions_to_days([oracle_positions(signal[a:b], threshold) for a, b in windows],
                             [m.mid[a:b] for a, b in windows], [half[a:b] for a, b in windows],
                             point_value=m.point_value, commission=cfg.env.commission)  # fmt: skip
    metrics = compute_metrics(days, annualisation_days=cfg.evaluation.annualisation_days)
    return metrics.sharpe_daily, metrics.round_trips / metrics.n_days


def val_rows(m: FoldMarket) -> np.ndarray:
    """bool [n]: the fold rows of its scored validation days."""
    rows = np.zeros(len(m.mid), dtype=bool)
    for d in scored_days(m):
        rows[int(m.day_start[d]):int(m.day_start[d + 1])] = True
    return rows


def mean_se(values: Sequence[float], digits: int) -> str:
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else float("nan")
    return f"{statistics.fmean(values):+.{digits}f} ({se:.{digits}f})"


def synthetic_parser(doc: str) -> argparse.ArgumentParser:
    """The argument parser of a tool over a synthetic store and its latent truth: --store, --set, --out."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--store", type=Path, help="synthetic market store (default: the embedded default market)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE", help="config override")
    parser.add_argument("--out", type=Path, help="also write the table to this markdown file")
    return parser


def write_table(out: Path, title: str, tool: str, argv: list[str] | None, about: str, lines: list[str]) -> None:
    """OUT: the title, the command that made the table (tools/<tool>.py and its arguments), `about`, the table."""
    command = f"python3 tools/{tool}.py " + " ".join(argv if argv is not None else sys.argv[1:])
    table = "\n".join(lines)
    out.write_text(f"# {title}\n\nCommand: `{command}`\n\n{about}\n\n{table}\n")


def load_synthetic(parser: argparse.ArgumentParser, store: Path | None, overrides: list[str]) -> tuple:
    """(config, market selection, features, latent truth) of a synthetic store (default: the embedded default
    market) under the default preset and `overrides`; a parser error when the store keeps no latent truth."""
    store = store or ensure_default_store()
    latent_path = sidecar_paths(store)[1]
    if not latent_path.is_file():
        parser.error(f"{store}: no latent truth beside it ({latent_path}); a synthetic store from `fox data synth`")
    cfg = load_config("default", overrides=[f'market.store="{store}"', *overrides])
    selection = select_market(cfg.market)
    return cfg, selection, load_features(cfg, selection), np.load(latent_path)


def main(argv: list[str] | None = None) -> int:
    parser = synthetic_parser(__doc__)
    parser.add_argument("--rho", type=float, nargs="+", default=[0.3, 0.5, 0.7, 0.9],
                        help="correlations with er of the noisy reads")  # fmt: skip
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4], help="noise seeds")
    parser.add_argument("--mlp-epochs", type=int, default=30, help="epochs of the MLP read")
    args = parser.parse_args(argv)
    cfg, selection, features, latent = load_synthetic(parser, args.store, args.set)
    plain = FeatureConfig(**{**vars(cfg.features), "forecast_horizons": []})
    lines = ["| fold | signal | corr. with er, validation days | traded: validation daily Sharpe | of the oracle | "
             "round trips/day |", "| ---: | --- | ---: | ---: | ---: | ---: |"]

    def row(fold: int, name: str, corr: str, sharpe: str, share: str, trips: str) -> None:
        lines.append(f"| {fold} | {name} | {corr} | {sharpe} | {share} | {trips} |")
        print(lines[-1], flush=True)

    for fold in make_folds(cfg.folds, selection.days):
        m = FoldMarket.build(features, fold, plain, cfg.env)
        ts = np.asarray(features.raw.ts[m.row0:m.row0 + len(m.mid)])
        at = np.searchsorted(latent["ts_event"], ts)
        if not (at < len(latent["ts_event"])).all() or not (latent["ts_event"][at] == ts).all():
            raise SystemExit(f"{sidecar_paths(selection.path)[1]}: its bars do not cover fold {fold.index}'s rows")
        er = np.asarray(latent["expected_return"][at], dtype=np.float64)
        val = val_rows(m)
        train = np.arange(len(m.mid)) < m.train_stop
        oracle, trips = traded(er, m, cfg)
        row(fold.index, "oracle (er)", "+1.000", f"{oracle:+.2f}", "1.00", f"{trips:.1f}")
        phi = lag_one_autocorrelation(er[train])
        for rho in args.rho:
            scores = []
            for seed in args.seeds:
                noisy = noisy_read(er, rho, phi, np.random.default_rng([seed, fold.index, round(rho * 1000)]))
                scores.append((float(np.corrcoef(noisy[val], er[val])[0, 1]), *traded(noisy, m, cfg)))
            row(fold.index, f"er + AR(1) noise, rho {rho:g}", mean_se([s[0] for s in scores], 3),
                mean_se([s[1] for s in scores], 2), f"{statistics.fmean(s[1] for s in scores) / oracle:.2f}",
                f"{statistics.fmean(s[2] for s in scores):.1f}")
        x = np.asarray(m.market_obs[:, :feature_columns(plain)], dtype=np.float64)
        read = ridge_read(x, er, train, RIDGE)
        sharpe, trips = traded(read, m, cfg)
        corr = float(np.corrcoef(read[val], er[val])[0, 1])
        row(fold.index, "read of er (ridge on the market columns)", f"{corr:+.3f}", f"{sharpe:+.2f}",
            f"{sharpe / oracle:.2f}", f"{trips:.1f}")
        held = train & (np.arange(len(m.mid)) >= m.day_start[max(0, len(fold.train_days) - HELD_DAYS)])
        scores = []
        for seed in args.seeds:
            read = mlp_read(x, er, train & ~held, held, seed, args.mlp_epochs)
            scores.append((float(np.corrcoef(read[val], er[val])[0, 1]), *traded(read, m, cfg)))
        row(fold.index, f"read of er (MLP, {MLP_HIDDEN} tanh units)", mean_se([s[0] for s in scores], 3),
            mean_se([s[1] for s in scores], 2), f"{statistics.fmean(s[1] for s in scores) / oracle:.2f}",
            f"{statistics.fmean(s[2] for s in scores):.1f}")
        ev = cfg.evaluation
        probe = probe_baseline(m.market_obs[:, :feature_columns(plain)], m.mid, half_spread(m), m.day_start,
                               slice(0, m.train_stop), scored_days(m), horizon=ev.probe_horizon_bars,
                               ridge=ev.probe_ridge, tick_size=m.tick_size, point_value=m.point_value,
                               commission=cfg.env.commission, annualisation_days=ev.annualisation_days)  # fmt: skip
        pred = probe.probe.forecast(m.market_obs[:, :feature_columns(plain)])
        corr = float(np.corrcoef(pred[val], er[val])[0, 1])
        sharpe = probe.metrics.sharpe_daily
        row(fold.index, f"probe (ridge, {ev.probe_horizon_bars}-bar change)", f"{corr:+.3f}", f"{sharpe:+.2f}",
            f"{sharpe / oracle:.2f}", f"{probe.metrics.round_trips / probe.metrics.n_days:.1f}")
    if args.out is not None:
        write_table(args.out, "The oracle's share a read of the latent earns", "latent_probe", argv,
                    f"Store: {selection.path}, {len(selection.days)} days; noise seeds {args.seeds}; commission "
                    f"${cfg.env.commission} per side; every signal traded by the oracle's rule on the validation days "
                    "(tools/latent_probe.py's header).", lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
