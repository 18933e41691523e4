"""Would the bar's time-weighted book imbalance read the latent better than the close book's? (CPU)

    python3 tools/feature_read.py [--store STORE.h5] [--set folds.n_folds=2 --set folds.val_days=30 \
        --set folds.step_days=30] [--out tools/results/NAME.md]

The observation's depth-imbalance columns (features/names.py: depth_imbalance_l1, _l5, _l10) read the close book,
one snapshot a bar. In the synthetic markets the latent x tilts every level's mean depth (data/default_market.toml
[latent] level_tilt), a state the book holds through the bar, so the imbalance averaged over the bar's book states,
each weighted by the time it rests, may read x with less noise; and per level, so that a fit can weigh the levels
as their tilts do. Candidate columns (`CANDIDATES`): the time-weighted imbalance (bid size - ask size) / (bid size +
ask size) at each level 1-10 and over levels 1-5 and 1-10, normalised on the fold's training rows (clipped as the
observation is) with the observation's per-day EMAs (observation.market_part: half-lives 3, 10, 30 bars), appended
to the 128 market columns; and, keeping the observation's width, the close book's depth_imbalance_l1, _l5 and _l10
replaced by the time-weighted imbalance at level 1 and over levels 1-5 and 1-10 (`SWAPPED`, in every block). Per
fold, on each of the three column sets, as tools/latent_probe.py does:

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
from fox_numba.features.book_features import (  # noqa: E402
    TW_IMBALANCE_COLUMNS,
    resting_sizes,
    time_weighted_imbalance,
)
from fox_numba.features.names import FEATURE_INDEX  # noqa: E402
from fox_numba.market.store import MarketStore  # noqa: E402
from fox_numba.observation import N_FEATURES, N_MARKET, market_part  # noqa: E402
from fox_numba.walkforward.driver import half_spread, scored_days  # noqa: E402
from fox_numba.walkforward.folds import make_folds  # noqa: E402
from fox_numba.walkforward.probe import probe_baseline  # noqa: E402

CANDIDATES = TW_IMBALANCE_COLUMNS
"""The candidate columns (features/book_features.py time_weighted_imbalance)."""
SWAPPED = {"depth_imbalance_l1": "tw_imbalance_l1", "depth_imbalance_l5": "tw_imbalance_l1_5",
           "depth_imbalance_l10": "tw_imbalance_l1_10"}
"""The `replaced` variant: each close-book column and the time-weighted one that takes its place."""


def candidate_columns(store_path: Path, days: tuple[str, ...], bar_ts: np.ndarray, day_start: np.ndarray
                      ) -> np.ndarray:
    """float64 [n_bars, len(CANDIDATES)] over the feature set's bars (its days and day_start), one day's book
    read at a time."""
    out = np.empty((len(bar_ts), len(CANDIDATES)))
    with MarketStore(store_path) as store:
        for d, day in enumerate(days):
            book = store.read_day(day, ("mbp10",)).mbp10
            rows = slice(int(day_start[d]), int(day_start[d + 1]))
            out[rows] = time_weighted_imbalance(book.ts_event.astype(np.int64), resting_sizes(book.bid_px, book.bid_sz),
                                                resting_sizes(book.ask_px, book.ask_sz), bar_ts[rows])
    return out


def blocks(m: FoldMarket, raw: np.ndarray, clip: float, ema_start: str) -> list[np.ndarray]:
    """The observation's four blocks (z, ema3, ema10, ema30) of candidate columns `raw` [n, c <= N_FEATURES]:
    normalised on the fold's training rows, clipped to +-clip, with observation.market_part's per-day EMAs."""
    train = slice(0, m.train_stop)
    mean, std = raw[train].mean(axis=0), raw[train].std(axis=0)
    pad = np.zeros((len(raw), N_FEATURES))
    pad[:, :raw.shape[1]] = np.clip((raw - mean) / np.where(std > 0, std, 1.0), -clip, clip)
    part = market_part(pad, m.day_start, ema_start).astype(np.float64)
    return [part[:, k * N_FEATURES:k * N_FEATURES + raw.shape[1]] for k in range(N_MARKET // N_FEATURES)]


def appended(m: FoldMarket, raw: np.ndarray, clip: float, ema_start: str) -> np.ndarray:
    """float64 [n, N_MARKET + 4 * len(CANDIDATES)]: the fold's market columns, then the candidates' blocks."""
    return np.concatenate([np.asarray(m.market_obs[:, :N_MARKET], np.float64), *blocks(m, raw, clip, ema_start)],
                          axis=1)


def replaced(m: FoldMarket, raw: np.ndarray, clip: float, ema_start: str) -> np.ndarray:
    """float64 [n, N_MARKET]: the fold's market columns with the close book's depth_imbalance_l1, _l5 and _l10
    (in every block) replaced by the time-weighted imbalance at level 1 and over levels 1-5 and 1-10."""
    out = np.asarray(m.market_obs[:, :N_MARKET], np.float64).copy()
    picked = [CANDIDATES.index(c) for c in SWAPPED.values()]
    cols = [FEATURE_INDEX[name] for name in SWAPPED]
    for k, block in enumerate(blocks(m, raw[:, picked], clip, ema_start)):
        out[:, [k * N_FEATURES + c for c in cols]] = block
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
    cfg, selection, features, latent = load_synthetic(parser, args.store, args.set)
    plain = FeatureConfig(**{**vars(cfg.features), "forecast_horizons": []})
    bar_ts = np.asarray(features.raw.ts, np.int64)
    raw = candidate_columns(selection.path, features.days, bar_ts, np.asarray(features.raw.day_start))
    lines = ["| fold | signal | columns | corr. with er, validation days | traded: validation daily Sharpe | "
             "of the oracle | round trips/day |", "| ---: | --- | --- | ---: | ---: | ---: | ---: |"]
    for fold in make_folds(cfg.folds, selection.days):
        m = FoldMarket.build(features, fold, plain, cfg.env)
        rows = slice(m.row0, m.row0 + len(m.mid))
        at = np.searchsorted(latent["ts_event"], bar_ts[rows].astype(np.uint64))
        er = np.asarray(latent["expected_return"][at], dtype=np.float64)
        oracle = traded(er, m, cfg)[0]
        base = np.asarray(m.market_obs[:, :N_MARKET], np.float64)
        clip, start = cfg.features.clip_sigma, cfg.features.ema_start
        for label, cols in ((f"the observation's {N_MARKET}", base),
                            (f"+ {4 * len(CANDIDATES)} time-weighted imbalance", appended(m, raw[rows], clip, start)),
                            ("the 12 close-book imbalance columns time-weighted", replaced(m, raw[rows], clip, start))):
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
