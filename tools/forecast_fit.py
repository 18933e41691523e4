"""How good a forecast column is where the agent trains and where it is scored (features.forecast_horizons).

    NUMBA_ENABLE_CUDASIM=1 python3 tools/forecast_fit.py [--store STORE.h5] [--horizons 5 15 60] \
        [--set folds.n_folds=2 --set folds.val_days=30 --set folds.step_days=30] [--out tools/results/NAME.md]

For every fold of the plan and every horizon: the correlation of the column with its target (the forward mid
change over the horizon, inside the day) on the training rows with the column fitted in sample, on the
validation days (the full fit, what the agent is scored with), and on the training rows cross-fitted over
features.forecast_blocks (what an agent with forecast columns trains on); and on the validation days the
full fit's correlation with the --target-bar move (the oracle's horizon): how much of the tradeable move a
fit to h-bar targets recovers. A one-step learner's direction values estimate the h = 1 fit. A column much better in sample than on the
validation days teaches the agent to trust it more than it should (tools/results/learner_ablation_h200.md
section 13). CPU only: no kernel runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fox_numba.agent.fold_market import FoldMarket  # noqa: E402
from fox_numba.config import FeatureConfig, load_config  # noqa: E402
from fox_numba.features.forecast import cross_fitted_column, forward_change  # noqa: E402
from fox_numba.market.default import ensure_default_store  # noqa: E402
from fox_numba.market.select import select_market  # noqa: E402
from fox_numba.walkforward.driver import load_features  # noqa: E402
from fox_numba.walkforward.folds import make_folds  # noqa: E402


def correlation(column: np.ndarray, target: np.ndarray, rows: np.ndarray) -> float:
    ok = rows & np.isfinite(target)
    return float(np.corrcoef(column[ok], target[ok])[0, 1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", type=Path, help="market store (default: the embedded default market)")
    parser.add_argument("--horizons", type=int, nargs="+", default=[5, 15, 60])
    parser.add_argument("--target", type=int, default=15, help="bars of the move the last column scores against")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE", help="config override")
    parser.add_argument("--out", type=Path, help="also write the table to this markdown file")
    args = parser.parse_args(argv)
    store = args.store or ensure_default_store()
    cfg = load_config("default", overrides=[f'market.store="{store}"', *args.set])
    selection = select_market(cfg.market)
    features = load_features(cfg, selection)
    plain = FeatureConfig(**{**vars(cfg.features), "forecast_horizons": []})
    blocks, ridge, clip = cfg.features.forecast_blocks, cfg.features.forecast_ridge, cfg.features.clip_sigma
    lines = [
        f"| fold | horizon | in sample, training rows | full fit, validation days | cross-fitted ({blocks} blocks), "
        f"training rows | full fit against the {args.target}-bar move, validation days |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for fold in make_folds(cfg.folds, selection.days):
        m = FoldMarket.build(features, fold, plain, cfg.env)
        x, rows = m.market_obs, np.arange(m.n_rows)  # the feature columns, the block included when on
        train, val = rows < m.train_stop, rows >= m.val_start
        tradeable = forward_change(m.mid, m.day_start, args.target)
        for h in args.horizons:
            target = forward_change(m.mid, m.day_start, h)
            full, _ = cross_fitted_column(x, m.mid, m.day_start, m.train_stop, horizon=h, ridge=ridge, blocks=1,
                                          clip=clip)  # fmt: skip
            _, crossed = cross_fitted_column(x, m.mid, m.day_start, m.train_stop, horizon=h, ridge=ridge,
                                             blocks=blocks, clip=clip)  # fmt: skip
            column = full.apply(x, clip)
            lines.append(f"| {fold.index} | {h} | {correlation(column, target, train):+.3f} | "
                         f"{correlation(column, target, val):+.3f} | {correlation(crossed, target, train):+.3f} | "
                         f"{correlation(column, tradeable, val):+.3f} |")
    table = "\n".join(lines) + "\n"
    print(table, end="")
    if args.out is not None:
        command = "python3 tools/forecast_fit.py " + " ".join(argv if argv is not None else sys.argv[1:])
        args.out.write_text(f"# Forecast columns: in sample against out of sample\n\nCommand: `{command}`\n\n"
                            f"Store: {selection.path}, {len(selection.days)} days.\n\n{table}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
