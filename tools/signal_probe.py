"""What the agent knows against how it trades: its direction signal traded by the probe's rule, per fold.

    python3 tools/signal_probe.py RUN [RUN ...] [--out tools/results/NAME.md]
    python3 tools/signal_probe.py runs/suite/*/seed_* --out ...       # a suite's runs, grouped by market

For every fold of every finished run: the fold's market is rebuilt as training built it (its normalisation is
checked against the checkpoint's), the checkpoint (`best.h5`, the honest one) gives the network, and
agent/direction_signal.py reads E[Q(long)] - E[Q(short)] at every bar from a flat portfolio. The signal is
then the probe's input: a one-column ridge-free fit of the probe's target on the training rows, traded on the
validation days by the oracle's rule (walkforward/probe.py), scored on the agent's days. Beside it the agent's
own figure of that checkpoint (metrics.jsonl) and the probe's. Signal near the probe, agent below it: the
loss is in how the agent trades. Signal below the probe: in what it learned.

The validation R^2 of the two forecasts is the measure of what each knows. The Sharpe of the traded signal
can mislead: the rule trades only when the forecast beats the round-trip cost, so a weak signal (small R^2,
hence a forecast far inside the cost) trades a handful of tail bars a day, and a few costly trades with
little variance give a large negative daily Sharpe on a small loss; its $/day and round trips say so.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fox_numba.agent.direction_signal import SIGNAL_CHUNK, DirectionSignal  # noqa: E402
from fox_numba.agent.evaluator import eval_network  # noqa: E402
from fox_numba.agent.fold_market import FoldMarket  # noqa: E402
from fox_numba.agent.learner import run_layout  # noqa: E402
from fox_numba.checkpoint import load_checkpoint  # noqa: E402
from fox_numba.config import load_run_config  # noqa: E402
from fox_numba.device.staging import Stager  # noqa: E402
from fox_numba.device.runtime import new_stream  # noqa: E402
from fox_numba.market.select import select_market  # noqa: E402
from fox_numba.observation import feature_columns  # noqa: E402
from fox_numba.walkforward.driver import half_spread, load_features, scored_days  # noqa: E402
from fox_numba.walkforward.folds import make_folds  # noqa: E402
from fox_numba.walkforward.probe import probe_baseline  # noqa: E402


def run_folds(run: Path) -> list[dict[str, Any]]:
    """Per fold of a finished run: the agent's, the signal's and the probe's validation Sharpe, daily and per bar,
    and the signal's validation R^2."""
    cfg = load_run_config(run / "config.toml")
    selection = select_market(cfg.market)
    folds = make_folds(cfg.folds, selection.days)
    features = load_features(cfg, selection)
    layout = run_layout(cfg)
    stager = Stager(new_stream())
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    ev, out = cfg.evaluation, []
    for fold in folds:
        ck = load_checkpoint(run / f"fold_{fold.index:02d}" / "best.h5",
                             expected_fingerprints={"params": layout.fingerprint})  # fmt: skip
        market = FoldMarket.build(features, fold, cfg.features, cfg.env)
        if not np.array_equal(market.stats.mean, ck.arrays["market.norm_mean"]):
            raise SystemExit(f"{run}: fold {fold.index} rebuilds other normalisation statistics than its checkpoint")
        params, supports = (stager.upload_new(ck.arrays[f"learner.{n}"]) for n in eval_network(ev.network))
        vectors = stager.upload_new(ck.arrays["learner.spectral_uv"]) if layout.spectral_norm else None
        reader = DirectionSignal(layout, stager=stager, chunk=min(SIGNAL_CHUNK, market.n_rows),
                                 iqn_quantiles=cfg.network.iqn_quantiles, spectral_uv=vectors)
        signal = reader.compute(stager.upload_new(market.market_obs), params, supports,
                                stager.upload_new(market.day_first), stager.upload_new(market.book_obs))
        kw = dict(horizon=ev.probe_horizon_bars, tick_size=market.tick_size, point_value=market.point_value,
                  commission=cfg.env.commission, annualisation_days=ev.annualisation_days)
        days, train = scored_days(market), slice(0, market.train_stop)
        traded = probe_baseline(signal[:, None], market.mid, half_spread(market), market.day_start, train, days,
                                ridge=0.0, **kw)  # fmt: skip
        probe = probe_baseline(market.market_obs[:, :feature_columns(cfg.features)], market.mid, half_spread(market),
                               market.day_start, train, days, ridge=ev.probe_ridge, **kw)  # fmt: skip
        epoch = int(ck.meta["epoch"])
        agent = next(x for x in lines if x["fold"] == fold.index and x["epoch"] == epoch)["val"]
        out.append({"fold": fold.index, "epoch": epoch, "agent": nan_for_none(agent["sharpe_daily"]),
                    "agent_bar": nan_for_none(agent["sharpe_bar"]), "signal": traded.metrics.sharpe_daily,
                    "signal_bar": traded.metrics.sharpe_bar, "signal_r2": traded.val_r2,
                    "signal_trips": traded.metrics.round_trips / traded.metrics.n_days,
                    "signal_pnl": traded.metrics.mean_daily_pnl, "probe": probe.metrics.sharpe_daily,
                    "probe_bar": probe.metrics.sharpe_bar, "probe_r2": probe.val_r2,
                    "probe_trips": probe.metrics.round_trips / probe.metrics.n_days})
    return out


def nan_for_none(value: float | None) -> float:
    """metrics.jsonl writes NaN as null (strict JSON)."""
    return float("nan") if value is None else float(value)


def mean_se(values: list[float], digits: int = 2) -> str:
    ok = [v for v in values if v is not None and math.isfinite(v)]
    if not ok:
        return "n/a"
    se = statistics.stdev(ok) / math.sqrt(len(ok)) if len(ok) > 1 else float("nan")
    return f"{statistics.mean(ok):+.{digits}f} ({se:.{digits}f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path, nargs="+", help="finished run folders")
    parser.add_argument("--out", type=Path, help="also write the tables to this markdown file")
    args = parser.parse_args(argv)
    not_runs = [str(r) for r in args.runs if not (r / "config.toml").is_file()]
    if not_runs:
        parser.error(f"not run folders (no config.toml): {', '.join(not_runs)}")
    rows = ["| run | fold | epoch | agent | signal, oracle rule | signal $/day | signal trips/day | signal val R^2 | "
            "probe | probe trips/day | probe val R^2 |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | "
            "---: | ---: | ---: |"]
    groups: dict[str, dict[str, list[float]]] = {}
    for run in args.runs:
        folds = run_folds(run)
        for f in folds:
            rows.append(f"| {run} | {f['fold']} | {f['epoch']} | {f['agent']:+.2f} | {f['signal']:+.2f} | "
                        f"{f['signal_pnl']:+.0f} | {f['signal_trips']:.1f} | {f['signal_r2']:+.4f} | "
                        f"{f['probe']:+.2f} | {f['probe_trips']:.1f} | {f['probe_r2']:+.4f} |")
        group = groups.setdefault(run.parent.name, {k: [] for k in ("agent", "signal", "probe", "signal_r2",
                                                                      "probe_r2")})
        for key in group:  # a run's figure is the mean over its folds, as the suite's honest figure is
            group[key].append(statistics.mean(f[key] for f in folds))
    summary = ["| group (parent folder) | runs | agent | signal, oracle rule | probe | signal val R^2 | "
               "probe val R^2 |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    summary += [f"| {name} | {len(g['agent'])} | {mean_se(g['agent'])} | {mean_se(g['signal'])} | "
                f"{mean_se(g['probe'])} | {mean_se(g['signal_r2'], 4)} | {mean_se(g['probe_r2'], 4)} |"
                for name, g in groups.items()]
    text = "\n".join(summary) + "\n\n" + "\n".join(rows) + "\n"
    print(text, end="")
    if args.out is not None:
        command = "python3 tools/signal_probe.py " + " ".join(argv if argv is not None else sys.argv[1:])
        args.out.write_text("# The agent's direction signal traded by the probe's rule\n\n"
                            f"Command: `{command}`\n\nMean (standard error) across runs of each run's mean over "
                            f"folds; validation daily Sharpe.\n\n{text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
