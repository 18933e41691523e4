"""Does a linear read of the observation gain from the market's up/down symmetry? The probe and its odd forms (CPU)

    python3 tools/symmetry_probe.py [--markets default,high_cost] [--stores DIR] [--out tools/results/NAME.md]

The synthetic markets (fox_numba/market/synthetic.py) move up as they move down: mirroring every price about the
day's open flips the sign of the signed features (order-flow imbalances, trade imbalances, returns, depth
imbalances, the microprice offset, and their EMAs) and of the forward change, and leaves the unsigned ones (volume,
counts, range, volatility, spreads, depth, events, the time of day) as they are. The probe (walkforward/probe.py,
issue 21's baseline) is a centred ridge fit with an intercept on all 128 market columns: on 60 training days its
intercept and the unsigned columns can fit the window's drift, which a symmetric market does not carry forward.
Fitted on the training rows and their mirror, a linear read is odd: no intercept, no weight on an unsigned column,
and the signed columns' weights an uncentred ridge fit. Each variant is traded as the probe is (the oracle's rule on
the forecast, walkforward/probe.py) on each suite fold's validation days:

- `probe`: the probe itself (centred ridge, every column, the training mean of the target as intercept);
- `odd`: the fit on the training rows and their mirror (uncentred ridge on the signed columns, no intercept);
- `signed`: the centred fit with intercept on the signed columns alone (what dropping the unsigned columns does);
- `no_intercept`: the uncentred fit on every column without intercept (what dropping the intercept does).

`--sides` asks instead which way each fold's moves and the fits lean: per fold the shares of the training and of the
validation bars whose forward change passes the oracle's cost threshold up and down, and the validation bars the
probe and the odd read hold long and short, and the signed feature whose training mean is largest against its std
(learner_ablation_h200.md section 62).

The ridge penalty is evaluation.probe_ridge times the rows, as the probe's. Deterministic (no seeds). Each market's
store is data/suite's definition built into --stores (`fox data synth --definition`, as tools/suite.py builds them;
default: its stores folder), with the suite's plan and the market's derived settings (tools/suite.py).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT))

from suite import SUITE, load_suite, store_path  # noqa: E402

from fox_numba.agent.fold_market import FoldMarket  # noqa: E402
from fox_numba.config import FeatureConfig, FoxConfig, load_config  # noqa: E402
from fox_numba.features.forecast import forward_change  # noqa: E402
from fox_numba.features.normalise import NormStats  # noqa: E402
from fox_numba.market.default import default_store_path  # noqa: E402
from fox_numba.market.select import select_market  # noqa: E402
from fox_numba.market.synthetic_oracle import oracle_positions, oracle_threshold  # noqa: E402
from fox_numba.observation import FEATURE_NAMES, MIRROR_EVEN, N_MARKET  # noqa: E402
from fox_numba.walkforward.driver import half_spread, load_features, scored_days  # noqa: E402
from fox_numba.walkforward.folds import make_folds  # noqa: E402
from fox_numba.walkforward.metrics import compute_metrics, positions_to_days  # noqa: E402

UNSIGNED = MIRROR_EVEN & frozenset(FEATURE_NAMES)
"""Features a mirrored market leaves unchanged (fox_numba/observation.py MIRROR_EVEN); every other one changes sign."""
VARIANTS = ("probe", "odd", "signed", "no_intercept")


def signed_columns() -> np.ndarray:
    """The market part's columns that change sign in the mirror: the signed features in each of the four blocks."""
    per_block = [j for j, name in enumerate(FEATURE_NAMES) if name not in UNSIGNED]
    n = len(FEATURE_NAMES)
    return np.array([block * n + j for block in range(N_MARKET // n) for j in per_block])


def ridge(x: np.ndarray, y: np.ndarray, penalty: float, centred: bool) -> Callable[[np.ndarray], np.ndarray]:
    """The forecast of a ridge fit of y on x (penalty times the rows on the diagonal): centred with the training
    means as intercept, else through the origin."""
    x_mean = x.mean(axis=0) if centred else np.zeros(x.shape[1])
    y_mean = float(y.mean()) if centred else 0.0
    xc, yc = x - x_mean, y - y_mean
    w = np.linalg.solve(xc.T @ xc + penalty * len(y) * np.eye(x.shape[1]), xc.T @ yc)
    return lambda z: (z - x_mean) @ w + y_mean


def fit(variant: str, x: np.ndarray, y: np.ndarray, penalty: float) -> Callable[[np.ndarray], np.ndarray]:
    """The variant's forecast of rows of the market part (module header)."""
    signed = signed_columns()
    if variant in ("odd", "signed"):
        read = ridge(x[:, signed], y, penalty, centred=variant == "signed")
        return lambda z: read(z[:, signed])
    return ridge(x, y, penalty, centred=variant == "probe")


def score(m: FoldMarket, forecast: Callable[[np.ndarray], np.ndarray], commission: float, annual: int) -> float:
    """Validation daily Sharpe of the forecast traded by the oracle's rule on the fold's scored days (the probe's
    trading, walkforward/probe.py)."""
    threshold = oracle_threshold(m.tick_size, m.point_value, commission)
    half = half_spread(m)
    windows = [(int(m.day_start[d]), int(m.day_start[d + 1])) for d in scored_days(m)]
    obs = np.asarray(m.market_obs[:, :N_MARKET], np.float64)
    positions = [oracle_positions(forecast(obs[a:b]), threshold) for a, b in windows]
    days = positions_to_days(positions, [m.mid[a:b] for a, b in windows], [half[a:b] for a, b in windows],
                             point_value=m.point_value, commission=commission)
    return float(compute_metrics(days, annualisation_days=annual).sharpe_daily)


def suite_folds(name: str, stores: Path) -> Iterator[tuple[FoldMarket, np.ndarray, np.ndarray, np.ndarray,
                                                              FoxConfig]]:
    """Per suite fold of the market: the fold's market, its training rows' market columns and forward changes
    (the rows whose change is finite), every row's forward change over the probe's horizon, and the run config."""
    suite = load_suite(SUITE)
    market = next(mk for mk in suite.markets if mk.name == name)
    cfg = load_config("default", overrides=[*suite.plan, *market.overrides, *market.derived(),
                                            f'market.store="{store_path(stores, market)}"'])
    selection = select_market(cfg.market)
    features = load_features(cfg, selection)
    plain = FeatureConfig(**{**vars(cfg.features), "forecast_horizons": []})
    for fold in make_folds(cfg.folds, selection.days):
        m = FoldMarket.build(features, fold, plain, cfg.env)
        y = forward_change(np.asarray(m.mid, np.float64), m.day_start, cfg.evaluation.probe_horizon_bars)
        train = np.arange(m.train_stop)
        train = train[np.isfinite(y[train])]
        yield m, np.asarray(m.market_obs[train, :N_MARKET], np.float64), y[train], y, cfg


def market_rows(name: str, stores: Path) -> list[dict[str, float]]:
    """Per suite fold of the market, {variant: validation daily Sharpe}."""
    out = []
    for m, x, y_train, _, cfg in suite_folds(name, stores):
        ev = cfg.evaluation
        out.append({v: score(m, fit(v, x, y_train, ev.probe_ridge), cfg.env.commission, ev.annualisation_days)
                    for v in VARIANTS})
    return out


def side_shares(forward: np.ndarray, positions: np.ndarray, threshold: float) -> tuple[float, float, float, float]:
    """(share of the rows whose forward change is above +threshold, below -threshold, share held long, held
    short), the forward change's non-finite rows left out of its two shares."""
    ok = np.isfinite(forward)
    return (float(np.mean(forward[ok] > threshold)), float(np.mean(forward[ok] < -threshold)),
            float(np.mean(positions > 0)), float(np.mean(positions < 0)))


def largest_offset(stats: NormStats) -> tuple[str, float]:
    """The signed feature whose training mean is largest against its std, and that ratio: the mirror of a z-scored
    signed column is exactly its negative only where that mean is 0 (network.mirror's projection assumes it)."""
    signed = [j for j, name in enumerate(FEATURE_NAMES) if name not in UNSIGNED]
    ratio = np.asarray(stats.mean, np.float64)[signed] / np.asarray(stats.std, np.float64)[signed]
    k = int(np.argmax(np.abs(ratio)))
    return FEATURE_NAMES[signed[k]], float(ratio[k])


def side_rows(name: str, stores: Path) -> list[str]:
    """Per suite fold of the market, one table row: the training and the validation bars' shares of moves past the
    cost threshold up and down over the probe's horizon, the validation bars the probe and its odd read hold
    long and short, and the signed feature with the largest training mean against its std (`largest_offset`)."""
    out = []
    for k, (m, x, y_train, y, cfg) in enumerate(suite_folds(name, stores)):
        threshold = oracle_threshold(m.tick_size, m.point_value, cfg.env.commission)
        windows = [(int(m.day_start[d]), int(m.day_start[d + 1])) for d in scored_days(m)]
        rows = np.concatenate([np.arange(a, b) for a, b in windows])
        obs = np.asarray(m.market_obs[:, :N_MARKET], np.float64)
        up_t, down_t, _, _ = side_shares(y[: m.train_stop], np.zeros(1), threshold)
        cells = [f"{up_t:.3f} / {down_t:.3f}"]
        for v in ("probe", "odd"):
            forecast = fit(v, x, y_train, cfg.evaluation.probe_ridge)
            held = np.concatenate([oracle_positions(forecast(obs[a:b]), threshold) for a, b in windows])
            up_v, down_v, long_v, short_v = side_shares(y[rows], held, threshold)
            if v == "probe":
                cells.append(f"{up_v:.3f} / {down_v:.3f}")
            cells.append(f"{long_v:.3f} / {short_v:.3f}")
        feature, ratio = largest_offset(m.stats)
        cells.append(f"{feature} {ratio:+.3f}")
        out.append(f"| {name} | {k} | " + " | ".join(cells) + " |")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--markets", help="comma-separated suite markets (default: all)")
    parser.add_argument("--stores", type=Path, default=default_store_path().parent / "suite",
                        help="folder of the suite's stores (tools/suite.py --stores)")
    parser.add_argument("--out", type=Path, help="also write the table to this markdown file")
    parser.add_argument("--sides", action="store_true", help="instead of the Sharpe table, per fold the shares of "
                        "bars whose forward change passes the cost threshold up / down (training, validation) and "
                        "the validation bars the probe and the odd read hold long / short")
    args = parser.parse_args(argv)
    suite = load_suite(SUITE)
    names = args.markets.split(",") if args.markets else [m.name for m in suite.markets]
    if args.sides:
        lines = ["| market | fold | training: up / down | validation: up / down | probe: long / short | "
                 "odd: long / short | largest signed mean / std |", "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
        for name in names:
            for row in side_rows(name, args.stores):
                lines.append(row)
                print(row, flush=True)
        return write_table(lines, args.out, argv)
    roles = {m.name: m.role for m in suite.markets}
    lines = ["| market | role | fold | " + " | ".join(VARIANTS) + " | odd - probe |",
             "| --- | --- | ---: |" + " ---: |" * (len(VARIANTS) + 1)]
    gains: dict[str, list[float]] = {"seen": [], "held_out": []}
    for name in names:
        for k, row in enumerate(market_rows(name, args.stores)):
            gains[roles[name]].append(row["odd"] - row["probe"])
            lines.append(f"| {name} | {roles[name]} | {k} | " + " | ".join(f"{row[v]:+.2f}" for v in VARIANTS)
                         + f" | {row['odd'] - row['probe']:+.2f} |")
            print(lines[-1], flush=True)
    for role, g in gains.items():
        if len(g) > 1:
            lines.append(f"| **{role} folds, mean (SE)** | | {len(g)} | | | | | "
                         f"{statistics.fmean(g):+.2f} ({statistics.stdev(g) / len(g) ** 0.5:.2f}) |")
    return write_table(lines, args.out, argv)


def write_table(lines: list[str], out: Path | None, argv: list[str] | None) -> int:
    """Print the table, and write it with its command to `out` when given."""
    text = "\n".join(lines)
    print(text)
    if out is not None:
        out.write_text(f"Command: `python3 tools/symmetry_probe.py {' '.join(argv or sys.argv[1:])}`\n\n{text}\n",
                       encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
