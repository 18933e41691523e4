"""Would the bar's time-weighted book imbalance read the latent better than the close book's? (CPU)

    python3 tools/feature_read.py [--store STORE.h5] [--set folds.n_folds=2 --set folds.val_days=30 \
        --set folds.step_days=30] [--out tools/results/NAME.md]

The observation's depth-imbalance columns (features/names.py: depth_imbalance_l1, _l5, _l10) read the close book,
one snapshot a bar. In the synthetic markets the latent x tilts every level's mean depth (data/default_market.toml
[latent] level_tilt), a state the book holds through the bar, so the imbalance averaged over the bar's book states,
each weighted by the time it rests, may read x with less noise; and per level, so that a fit can weigh the levels
as their tilts do. Candidate columns: the observation's time-weighted imbalance block (features.tw_imbalance, which
the tool turns on; fox_numba/OBSERVATION.md): (bid size - ask size) / (bid size + ask size) at each level 1-10 and
over levels 1-5 and 1-10, normalised on the fold's training rows (clipped as the observation is) with the
observation's per-day EMAs (half-lives 3, 10, 30 bars), the 48 columns after the 128 feature columns; and, keeping
the observation's width, the 128 with the close book's depth_imbalance_l1, _l5 and _l10 replaced by the
time-weighted imbalance at level 1 and over levels 1-5 and 1-10 (`SWAPPED`, in every block). Per fold, on each of
the three column sets, as tools/latent_probe.py does:

- `read of er (ridge)`: the ridge fit of the latent expected return er (the store's sidecar) on the columns over
  the training rows: the best linear read of the latent the columns allow, fitted to the truth no learner sees;
- `probe`: the probe (walkforward/probe.py: the ridge fit of the probe_horizon-bar mid change on the columns),
  the baseline the agent is scored against and its best linear teacher;

each traded by the oracle's rule on the validation days. If the candidates raise the ridge read's share of the
oracle, the observation leaves information about the latent on the table that a feature can recover (issue 21,
item 3: half of the oracle on the default market is what the ridge read of today's columns earns, section 36).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from latent_probe import (  # noqa: E402
    RIDGE,
    load_synthetic,
    ridge_read,
    synthetic_parser,
    traded,
    val_rows,
    write_table,
)

from fox_numba.agent.fold_market import FoldMarket  # noqa: E402
from fox_numba.config import FeatureConfig, FoxConfig  # noqa: E402
from fox_numba.observation import N_MARKET, column_names, feature_columns, market_block_names  # noqa: E402
from fox_numba.walkforward.driver import half_spread, scored_days  # noqa: E402
from fox_numba.walkforward.folds import make_folds  # noqa: E402
from fox_numba.walkforward.probe import probe_baseline  # noqa: E402

SWAPPED = {"depth_imbalance_l1": "tw_imbalance_l1", "depth_imbalance_l5": "tw_imbalance_l1_5",
           "depth_imbalance_l10": "tw_imbalance_l1_10"}
"""The `replaced` variant: each close-book column and the time-weighted one that takes its place."""


def replaced(m: FoldMarket, features: FeatureConfig) -> np.ndarray:
    """float64 [n, N_MARKET]: the fold's market columns with the close book's depth_imbalance_l1, _l5 and _l10
    (in every block) replaced by the time-weighted imbalance at level 1 and over levels 1-5 and 1-10 (the same block
    of the market part's time-weighted imbalance, features.tw_imbalance)."""
    out = np.asarray(m.market_obs[:, :N_MARKET], np.float64).copy()
    index = {name: c for c, name in enumerate(column_names(features))}
    for block in market_block_names():
        for close, tw in SWAPPED.items():
            out[:, index[f"{block}.{close}"]] = m.market_obs[:, index[f"{block}.{tw}"]]
    return out


def scores(cols: np.ndarray, er: np.ndarray, m: FoldMarket, cfg: FoxConfig) -> tuple[tuple[float, ...], ...]:
    """((corr with er, Sharpe, round trips/day) of the ridge read of er, then of the probe) on `cols`."""
    val = val_rows(m)
    train = np.arange(len(m.mid)) < m.train_stop
    read = ridge_read(cols, er, train, RIDGE)
    ev = cfg.evaluation
    probe = probe_baseline(cols.astype(np.float32), m.mid, half_spread(m), m.day_start, slice(0, m.train_stop),
                           scored_days(m), horizon=ev.probe_horizon_bars, ridge=ev.probe_ridge,
                           tick_size=m.tick_size, point_value=m.point_value, commission=cfg.env.commission,
                           annualisation_days=ev.annualisation_days)
    pred = probe.probe.forecast(cols.astype(np.float32))
    met = probe.metrics
    return ((float(np.corrcoef(read[val], er[val])[0, 1]), *traded(read, m, cfg)),
            (float(np.corrcoef(pred[val], er[val])[0, 1]), met.sharpe_daily, met.round_trips / met.n_days))


def main(argv: list[str] | None = None) -> int:
    parser = synthetic_parser(__doc__)
    args = parser.parse_args(argv)
    cfg, selection, features, latent = load_synthetic(parser, args.store, [*args.set, "features.tw_imbalance=true"])
    plain = FeatureConfig(**{**vars(cfg.features), "forecast_horizons": []})
    bar_ts = np.asarray(features.raw.ts, np.int64)
    width = feature_columns(plain)
    lines = ["| fold | signal | columns | corr. with er, validation days | traded: validation daily Sharpe | "
             "of the oracle | round trips/day |", "| ---: | --- | --- | ---: | ---: | ---: | ---: |"]
    for fold in make_folds(cfg.folds, selection.days):
        m = FoldMarket.build(features, fold, plain, cfg.env)
        rows = slice(m.row0, m.row0 + len(m.mid))
        at = np.searchsorted(latent["ts_event"], bar_ts[rows].astype(np.uint64))
        er = np.asarray(latent["expected_return"][at], dtype=np.float64)
        oracle = traded(er, m, cfg)[0]
        obs = np.asarray(m.market_obs, np.float64)
        for label, cols in ((f"the observation's {N_MARKET}", obs[:, :N_MARKET]),
                            (f"+ {width - N_MARKET} time-weighted imbalance", obs[:, :width]),
                            ("the 12 close-book imbalance columns time-weighted", replaced(m, plain))):
            for name, (corr, sharpe, trips) in zip(("read of er (ridge)", "probe"), scores(cols, er, m, cfg),
                                                   strict=True):
                lines.append(f"| {fold.index} | {name} | {label} | {corr:+.3f} | {sharpe:+.2f} | "
                             f"{sharpe / oracle:.2f} | {trips:.1f} |")
                print(lines[-1], flush=True)
    if args.out is not None:
        write_table(args.out, "The latent's linear read with the bar's time-weighted book imbalance", "feature_read",
                    argv, f"Store: {selection.path}, {len(selection.days)} days; commission ${cfg.env.commission} per "
                    "side; every signal traded by the oracle's rule on the validation days.", lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
