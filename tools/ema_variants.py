"""Which EMA columns let a linear read of the latent earn more? The exploration behind features.ema_start (CPU).

    python3 tools/ema_variants.py [--store STORE.h5] [--set SECTION.FIELD=VALUE ...] [--out tools/results/NAME.md]

On a synthetic store with its latent truth (tools/latent_probe.py's header), per fold of the config's plan, a ridge
read of er fitted to the truth on the training rows (latent_probe.ridge_read) from these column sets, each traded by
the oracle's rule on the validation days (latent_probe.traded):
- `observation`: the 128 market columns (z and its per-day EMAs at half-lives 3, 10, 30, restarted at z);
- `+ day EMAs 1.5, 5, 20, 60, 120`: the same plus per-day EMAs of z at five more half-lives;
- `+ cross-day EMAs h`: plus EMAs of z that run on across days (half-lives 10, 30, 60, 120 together, then each);
- `zero-start EMAs`: the 128 columns with each day's EMAs started from 0 (features.ema_start = "zero");
- `..., flat for the first k bars`: a read set to 0 on each day's first k bars.
Also the correlation of the observation's read with er over each day's first 15 bars and over the rest, and er's
standard deviation there. No seeds: every row is one deterministic fit.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import latent_probe as lp  # noqa: E402

from fox_numba.agent.fold_market import FoldMarket  # noqa: E402
from fox_numba.config import FeatureConfig  # noqa: E402
from fox_numba.observation import EMA_HALF_LIVES, N_FEATURES, N_MARKET, ema_alpha  # noqa: E402
from fox_numba.walkforward.folds import make_folds  # noqa: E402

OPEN_BARS = 15
"""The day's first bars whose read is compared with the rest's."""


def ema(z: np.ndarray, day_start: np.ndarray, half_life: float, start: str) -> np.ndarray:
    """EMAs of z's columns at a half-life in bars: per day from the day's first z ('first') or from 0 ('zero'), or
    running on across days ('cross')."""
    a = ema_alpha(half_life)
    out = np.empty_like(z)
    first = np.zeros(len(z), bool)
    first[day_start[:-1]] = True
    acc = z[0].copy()
    for t in range(len(z)):
        if first[t] and start != "cross":
            acc = z[t].copy() if start == "first" else np.zeros(z.shape[1])
        acc = acc + a * (z[t] - acc)
        out[t] = acc
    return out


def main(argv: list[str] | None = None) -> int:
    parser = lp.synthetic_parser(__doc__)
    args = parser.parse_args(argv)
    cfg, selection, features, latent = lp.load_synthetic(parser, args.store, args.set)
    plain = FeatureConfig(**{**vars(cfg.features), "forecast_horizons": [], "ema_start": "first"})
    lines = ["| fold | columns | corr. with er, validation days | traded: validation daily Sharpe |",
             "| ---: | --- | ---: | ---: |"]
    for fold in make_folds(cfg.folds, selection.days):
        m = FoldMarket.build(features, fold, plain, cfg.env)
        ts = np.asarray(features.raw.ts[m.row0:m.row0 + len(m.mid)])
        er = np.asarray(latent["expected_return"][np.searchsorted(latent["ts_event"], ts)], dtype=np.float64)
        val = lp.val_rows(m)
        train = np.arange(len(m.mid)) < m.train_stop
        x = np.asarray(m.market_obs[:, :N_MARKET], dtype=np.float64)
        z = x[:, :N_FEATURES]
        day_start = np.asarray(m.day_start)

        def row(name: str, read: np.ndarray) -> None:
            corr = float(np.corrcoef(read[val], er[val])[0, 1])
            lines.append(f"| {fold.index} | {name} | {corr:+.3f} | {lp.traded(read, m, cfg)[0]:+.2f} |")
            print(lines[-1], flush=True)

        def fit(cols: np.ndarray) -> np.ndarray:
            return lp.ridge_read(cols, er, train, lp.RIDGE)

        base = fit(x)
        row("observation", base)
        row("+ day EMAs 1.5, 5, 20, 60, 120",
            fit(np.hstack([x] + [ema(z, day_start, h, "first") for h in (1.5, 5, 20, 60, 120)])))
        cross = fit(np.hstack([x] + [ema(z, day_start, h, "cross") for h in (10, 30, 60, 120)]))
        row("+ cross-day EMAs 10, 30, 60, 120", cross)
        for h in (10, 30, 60, 120):
            row(f"+ cross-day EMAs {h}", fit(np.hstack([x, ema(z, day_start, h, "cross")])))
        row("zero-start EMAs", fit(np.hstack([z] + [ema(z, day_start, h, "zero") for h in EMA_HALF_LIVES])))
        bar_in_day = np.arange(len(z)) - np.repeat(day_start[:-1], np.diff(day_start))
        for k in (5, 15, 30):
            row(f"observation, flat for the first {k} bars", np.where(bar_in_day < k, 0.0, base))
        for k in (5, 15, 30):
            row(f"+ cross-day EMAs 10, 30, 60, 120, flat for the first {k} bars", np.where(bar_in_day < k, 0.0, cross))
        opening = bar_in_day < OPEN_BARS
        a, b = val & opening, val & ~opening
        lines.append(f"| {fold.index} | observation's read over the first {OPEN_BARS} bars / the rest | "
                     f"{np.corrcoef(base[a], er[a])[0, 1]:+.3f} / {np.corrcoef(base[b], er[b])[0, 1]:+.3f} | "
                     f"er's std {er[a].std():.3f} / {er[b].std():.3f} |")
        print(lines[-1], flush=True)
    if args.out is not None:
        lp.write_table(args.out, "EMA column variants and the ridge read of the latent", "ema_variants", argv,
                       f"Store: {selection.path}, {len(selection.days)} days (tools/ema_variants.py's header).", lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
