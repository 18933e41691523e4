"""What the linear fit of the agent's learner reads, against the ridge probe fitted on the same rows (CPU).

    python3 tools/td_read.py [--store STORE.h5] [--seeds 0 1 2] [--n-step N] [--set SECTION.FIELD=VALUE ...] \
        [--out tools/results/NAME.md]

Per fold and seed, tools/port_probe.py's fit in mode `left` with the agent's units and its mirror prior
(network.mirror_strength, by projection): the four direction values linear in [x, 1, q, q x, L]. Beside it the probe
the suite scores against: the ridge forecast of the evaluation.probe_horizon_bars forward mid change, fitted on the
fold's training rows with evaluation.probe_ridge. Each is read as a score of a bar's market row x:
- the fit's: the value of Long minus Short from flat, x @ (w_Long - w_Short) over the [x, 1] rows of its weights
  (the bars-left column moves both values with the time of day alone and is left out);
- the probe's: its forecast (the same weights walkforward/probe.py fits).

Per fold, for each score: its correlation with the forward change over the probe's horizon on the training rows and
on the validation rows (the rows with a target in the same day), and with the probe's score on the validation rows.
Then the columns the two scores track differently: each score's correlation with each market column on the training
rows (its loading: unlike the weights, it does not swing between collinear columns such as a feature's EMAs), the
fit's (mean over the seeds) minus the probe's, the largest by size.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT))

from port_probe import fold_inputs, learn  # noqa: E402
from td_probe import finish_table, mean_se, probe_setup  # noqa: E402

from fox_numba.actions import Direction  # noqa: E402
from fox_numba.agent.fold_market import FoldMarket  # noqa: E402
from fox_numba.features.forecast import fit_probe, forward_change  # noqa: E402
from fox_numba.observation import column_names  # noqa: E402
from fox_numba.walkforward.folds import make_folds  # noqa: E402

TOP = 8
"""Columns listed per fold in the lean table."""


def long_minus_short(w: np.ndarray, n_x: int) -> np.ndarray:
    """float64 [n_x]: the fit's Long-minus-Short weights on the market columns (rows 0 .. n_x - 1 of w [F, 4])."""
    return w[:n_x, Direction.LONG] - w[:n_x, Direction.SHORT]


def correlation(score: np.ndarray, y: np.ndarray, rows: np.ndarray) -> float:
    """Pearson correlation of score and y over `rows` where y is finite (NaN when either is constant there)."""
    keep = rows[np.isfinite(y[rows])]
    a, b = score[keep] - score[keep].mean(), y[keep] - y[keep].mean()
    den = float(np.sqrt((a @ a) * (b @ b)))
    return float(a @ b) / den if den > 0 else float("nan")


def loadings(score: np.ndarray, x: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """float64 [columns]: the correlation of score with each column of x over `rows` (0 for a constant column)."""
    a = score[rows] - score[rows].mean()
    xc = x[rows] - x[rows].mean(axis=0)
    den = np.sqrt((a @ a) * np.einsum("ij,ij->j", xc, xc))
    return np.divide(a @ xc, den, out=np.zeros(x.shape[1]), where=den > 0)


def val_rows(m: FoldMarket) -> np.ndarray:
    return np.concatenate([np.arange(a, b) for a, b in m.val_windows])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", type=Path, help="market store (default: the embedded default market)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--n-step", type=int, default=1, help="the fit's targets hold the reached position this many "
                        "bars (port_probe.py's --n-step)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE", help="config override")
    parser.add_argument("--out", type=Path, help="also write the tables to this markdown file")
    args = parser.parse_args(argv)
    if args.n_step < 1:
        parser.error("--n-step must be >= 1")
    cfg, selection, feats, plain = probe_setup(args.store, args.set)
    ev, lc = cfg.evaluation, cfg.learner
    names = column_names(plain)
    reads = ["| fold | score | with the move, training rows | with the move, validation rows | "
             "with the probe, validation rows |",
             "| ---: | --- | ---: | ---: | ---: |"]
    leans = ["| fold | column | the fit's loading (SE) | the probe's | fit - probe |",
             "| ---: | --- | ---: | ---: | ---: |"]
    for fold in make_folds(cfg.folds, selection.days):
        m = FoldMarket.build(feats, fold, plain, cfg.env)
        xb, book, rows = fold_inputs(m, cfg, agent_units=True)
        x, n_x = xb[:, :-1], xb.shape[1] - 1
        y = forward_change(np.asarray(m.mid, np.float64), np.asarray(m.day_start, np.int64), ev.probe_horizon_bars)
        train, val = np.arange(m.train_stop), val_rows(m)  # the probe's rows (probe_baseline's), the scored days
        probe = fit_probe(x, y, train, ridge=ev.probe_ridge, horizon=ev.probe_horizon_bars).weights
        fits = [long_minus_short(learn(xb, book, rows, "left", lc, seed, cfg.env.explore_spread, 60, args.n_step,
                                       agent_units=True, mirror="project",
                                       mirror_strength=cfg.network.mirror_strength)[0], n_x)
                for seed in args.seeds]  # fmt: skip
        reads.append(f"| {fold.index} | probe | {correlation(x @ probe, y, train):+.4f} | "
                     f"{correlation(x @ probe, y, val):+.4f} | 1 |")
        reads.append(f"| {fold.index} | fit, {len(fits)} seeds | "
                     + " | ".join(mean_se([correlation(x @ f, y, r) for f in fits], 4) for r in (train, val))
                     + f" | {mean_se([correlation(x @ f, x @ probe, val) for f in fits], 3)} |")
        print("\n".join(reads[-2:]), flush=True)
        scaled = np.array([loadings(x @ f, x, train) for f in fits])
        p = loadings(x @ probe, x, train)
        diff = scaled.mean(axis=0) - p
        for j in np.argsort(-np.abs(diff))[:TOP]:
            se = statistics.stdev(scaled[:, j]) / len(fits) ** 0.5 if len(fits) > 1 else float("nan")
            leans.append(f"| {fold.index} | `{names[j]}` | {scaled[:, j].mean():+.3f} ({se:.3f}) | {p[j]:+.3f} | "
                         f"{diff[j]:+.3f} |")
    finish_table(reads + [""] + leans, args.out, "td_read.py", argv,
                 "What the linear fit of the agent's learner reads against the ridge probe",
                 f"Store: {selection.path}, {len(selection.days)} days; seeds {args.seeds}; the fit: mode left, the "
                 f"agent's units, mirror projection at {cfg.network.mirror_strength}, {lc.epochs} x "
                 f"{lc.steps_per_epoch} steps at lr {lc.lr}, gamma {lc.gamma}, targets of {args.n_step} bar(s) "
                 f"held; the probe: ridge {ev.probe_ridge}, horizon {ev.probe_horizon_bars} bars. Correlations of "
                 f"each score with the {ev.probe_horizon_bars}-bar forward mid change; the fit's as mean (SE) over "
                 f"the seeds. The second table: the {TOP} columns whose loadings (correlations with the score, "
                 "training rows) differ most between the fit (mean over the seeds) and the probe (module header).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
