"""`fox evaluate CHECKPOINT`: backtest a trained network on any days of any store.

The checkpoint carries what the network was trained against: its parameters and supports (with
network.spectral_norm, the power-iteration vectors), the ISV bus, and the fold's normalisation statistics and
risk unit (`market.*` arrays). Observations of the evaluated
days are normalised with those statistics (never refitted on the days evaluated), every selected day is
a validation day, and the backtest is the training run's own (agent/evaluator.py: argmax E[Q], the same
fill model). Without --store or a --set of a market.* or folds.* field (DAY_SECTIONS), the days are the validation
days of the checkpoint's fold: `--set evaluation.hold_margin=...` re-scores the run's own days. Flat,
buy-and-hold and the oracle are scored on the agent's days: the selected days of 2+ bars (a shorter day holds
no step).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fox_numba.agent.evaluator import Evaluator, eval_network
from fox_numba.agent.fold_market import (
    BOOK_ARRAYS,
    CHECKPOINT_ARRAYS,
    FORECAST_ARRAYS,
    FoldMarket,
    book_stats_from_checkpoint,
    forecast_from_checkpoint,
)
from fox_numba.agent.learner import run_layout
from fox_numba.checkpoint import load_checkpoint, require_checkpoint
from fox_numba.config import FoxConfig, load_run_config, parse_override, set_value
from fox_numba.device.runtime import new_stream
from fox_numba.device.staging import Stager
from fox_numba.errors import ConfigError, InputError
from fox_numba.features.normalise import NormStats
from fox_numba.market.select import MarketSelection, select_market
from fox_numba.market.store import MarketStore
from fox_numba.observation import column_names
from fox_numba.walkforward.driver import day_baselines, load_features
from fox_numba.walkforward.folds import make_folds
from fox_numba.walkforward.metrics import OracleReference, compute_metrics, day_series


@dataclass(frozen=True)
class AllValidation:
    """Every selected day a validation day (no training window: FoldMarket.build with given statistics)."""

    index: int
    val_stop: int
    train_first: int = 0
    train_stop: int = 0
    val_first: int = 0
    purge_bars: int = 0
    select_days: int = 0


DAY_SECTIONS = ("market", "folds")
"""Config sections whose --set chooses the days `fox evaluate` scores (else the checkpoint fold's validation days)."""


def evaluate_checkpoint(checkpoint: Path, *, store: str | None, overrides: list[str],
                        log: Callable[[str], None] = print) -> dict[str, Any]:
    """The validation figures of the checkpoint's network on the chosen days, beside flat, buy-and-hold and the
    oracle (on a synthetic store)."""
    require_checkpoint(checkpoint)  # before its run's config.toml, which a missing checkpoint lacks too
    run_dir = checkpoint.resolve().parent.parent
    cfg = load_run_config(run_dir / "config.toml")
    layout = run_layout(cfg)
    ck = load_checkpoint(checkpoint, expected_fingerprints={"params": layout.fingerprint})
    settings = [parse_override(text) for text in overrides]
    if store is not None:
        set_value(cfg, "market.store", store)
    trained = column_names(cfg.features)
    for key, value in settings:
        set_value(cfg, key, value)
    if column_names(cfg.features) != trained:
        raise ConfigError(f"{checkpoint}: its network reads the {len(trained)} observation columns it was trained on; "
                          "a --set of features.tw_imbalance or features.forecast_horizons would change them")
    selection = select_market(cfg.market, defer=True)
    if store is None and not any(key.split(".")[0] in DAY_SECTIONS for key, _ in settings):
        fold = make_folds(cfg.folds, selection.days)[int(ck.meta["fold"])]
        selection = MarketSelection(selection.path, fold.val_days, selection.session,
                                    unchecked=tuple(d for d in fold.val_days if d in selection.unchecked))
    net = [f"learner.{name}" for name in eval_network(cfg.evaluation.network)]
    spectral = ["learner.spectral_uv"] if layout.spectral_norm else []
    forecast = FORECAST_ARRAYS if cfg.features.forecast_horizons else ()
    book = BOOK_ARRAYS if layout.tlob is not None else ()  # the TLOB encoder reads the book normalised as trained
    missing = [n for n in (*CHECKPOINT_ARRAYS, *forecast, *book, *net, *spectral, "isv") if n not in ck.arrays]
    if missing:
        raise InputError(checkpoint, f"not a training checkpoint of this build: it lacks {missing}")
    log(f"evaluating fold {int(ck.meta['fold'])} epoch {int(ck.meta['epoch'])} of {run_dir} on {len(selection.days)} "
        f"days of {selection.path} ({selection.days[0]}..{selection.days[-1]})")
    features = load_features(cfg, selection)
    stats = NormStats(ck.arrays["market.norm_mean"], ck.arrays["market.norm_std"], 0)
    market = FoldMarket.build(features, AllValidation(int(ck.meta["fold"]), features.n_days), cfg.features, cfg.env,
                              stats=stats, risk_unit=float(ck.arrays["market.risk_unit"]),
                              forecast=forecast_from_checkpoint(ck.arrays),
                              book_stats=book_stats_from_checkpoint(ck.arrays))  # fmt: skip
    stager = Stager(new_stream())
    dev = market.upload(stager)
    params, supports = (stager.upload_new(ck.arrays[name]) for name in net)
    isv = stager.upload_new(ck.arrays["isv"])
    vectors = stager.upload_new(ck.arrays[spectral[0]]) if spectral else None
    evaluator = Evaluator(dev, cfg, layout, params, supports, isv=isv, stager=stager, use_graph=cfg.run.graphs,
                          spectral_uv=vectors)
    days = day_series(evaluator.run())
    agent = compute_metrics(days, annualisation_days=cfg.evaluation.annualisation_days)
    out: dict[str, Any] = {f"agent_{k}": v for k, v in agent.as_dict().items()}
    out["days"] = len(days)
    oracle, store_days = OracleReference.for_store(selection.path), []
    if oracle is not None:
        with MarketStore(selection.path) as st:
            store_days = st.days()
    out |= baseline_figures(cfg, market, oracle, store_days)
    return {k: (float("nan") if v is None else v) for k, v in out.items()}


def baseline_figures(cfg: FoxConfig, market: FoldMarket, oracle: OracleReference | None,
                     store_days: list[str]) -> dict[str, float]:
    """Daily Sharpe of flat, buy-and-hold and (with an oracle: a synthetic store, whose days are `store_days`) the
    oracle on the days the agent is scored on (`driver.scored_days`: the selected days of MIN_EPISODE_BARS+ bars)."""
    fixed = day_baselines(cfg, market, oracle, store_days)
    out = {"flat_sharpe_daily": fixed.flat.sharpe_daily, "buy_and_hold_sharpe_daily": fixed.buy_and_hold.sharpe_daily}
    if fixed.oracle_sharpe is not None:
        out["oracle_sharpe_daily"] = fixed.oracle_sharpe
    return out
