"""The fold driver of `fox train`: walk-forward folds, each epoch collect -> train -> evaluate, resumable.

    for each fold (walkforward/folds.py):
        the fold's market on the device (normalisation fitted on its training rows only)
        registry.reset(FoldReset)                     every entry logged (walkforward/trainer_state.py)
        baselines of its validation days: flat, buy-and-hold, the ridge probe, the oracle (synthetic stores)
        for each epoch:
            collect   env.collect_steps steps of the collect environments into the replay buffer
            train     learner.steps_per_epoch gradient steps (one captured graph each, no host sync)
            kill checks (Q drift, gradient collapse, non-finite) -> ISV[Q_DRIFT_RATE]
            evaluate  the deterministic policy on every validation day -> Sharpe etc.
                      (and on the selection days held out of training, when folds.select_days > 0)
            metrics line, checkpoints (last, and best.h5: the epoch chosen without the validation days, by
                      daily Sharpe on the selection days, else the last epoch the kill criteria passed)
            a kill ends the fold (the run goes on with the next one)
    summary.json across folds

Everything a run writes goes into its run folder (walkforward/run_folder.py); `resume` continues a killed
run from its last checkpoint and ends with the same numbers as an uninterrupted run.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fox_numba.agent.fold_market import FoldMarket
from fox_numba.agent.trainer import RING_STATE, Trainer
from fox_numba.config import FoxConfig
from fox_numba.diag.layout import PREFIX, parse_line
from fox_numba.errors import ConfigError
from fox_numba.features.build import assemble_features
from fox_numba.features.cache import FeatureCache
from fox_numba.features.feature_set import FeatureSet
from fox_numba.io import atomic_path, atomic_write_text
from fox_numba.market.select import MarketSelection, cache_folder
from fox_numba.market.store import MarketStore
from fox_numba.observation import feature_columns
from fox_numba.walkforward.folds import Fold, make_folds
from fox_numba.walkforward.kill import EpochHealth, KillCriteria
from fox_numba.walkforward.metrics import (
    Metrics,
    OracleReference,
    buy_and_hold_days,
    compute_metrics,
    day_series,
    flat_days,
    fold_report,
    signed,
)
from fox_numba.walkforward.probe import probe_baseline
from fox_numba.walkforward.report import BASELINES, HEALTH_LOG, write_report
from fox_numba.walkforward.reset_registry import FoldReset, ResetContext, StateResetRegistry, format_resets
from fox_numba.walkforward.run_folder import TRAIN_LOG, BestEpoch, RunFolder, epoch_line
from fox_numba.walkforward.tensorboard import EventLog, require_extra
from fox_numba.walkforward.trainer_state import audit_trainer, register_trainer

Log = Callable[[str], None]
EPOCH_PHASES = ("collect", "train", "evaluate")
"""The steps of an epoch on the progress bar (`fox train` counts folds x epochs x these)."""
SETUP_PARTS = ("features", "device", "resets", "baselines")
"""A fold's set-up in order, each timed on its fold line: the fold's features and episode starts (FoldMarket), its
tensors on the GPU (Trainer.bind_fold), the state resets or the resume, the probe, buy-and-hold and oracle. Wall
time between host marks: a part's queued GPU work is counted where the host next waits for it."""


class RunLog:
    """Where a run's lines go: each appended in full to the run folder's train.log; on the console the short
    ones (`__call__`: a line per fold, per epoch), and the long ones (`detail`: the fold reset's every entry,
    HEALTH_DIAG lines, which are also in health_diag.log) only when `verbose`."""

    def __init__(self, path: Path, console: Log, *, verbose: bool = False) -> None:
        self.path, self.console, self.verbose = path, console, verbose

    def write(self, line: str) -> None:
        """Append `line` to train.log only."""
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")

    def __call__(self, line: str) -> None:
        self.write(line)
        self.console(line)

    def detail(self, line: str, *, to_file: bool = True) -> None:
        """A long line: in train.log (unless `to_file` is False: it has a file of its own), on the console with
        `verbose`."""
        if to_file:
            self.write(line)
        if self.verbose:
            self.console(line)


def load_features(cfg: FoxConfig, selection: MarketSelection) -> FeatureSet:
    """Features and raw market of the selected days of the store: each day's from the feature cache
    (`market.cache`, features/cache.py) when it holds them for the day's content digest, else read from the
    store (a block of one day's book in memory at a time), built and cached; the selection's unchecked days are
    validated on that read (market/select.py)."""
    with MarketStore(selection.path) as store:
        cache = FeatureCache(cache_folder(cfg.market, selection.path), store.instrument, cfg.features,
                             selection.session)
        parts = cache.parts(store, selection.days, selection.digests, selection.unchecked,
                            workers=cfg.market.read_workers)
        return assemble_features(parts, store.instrument, cfg.features, source=str(selection.path),
                                 session=selection.session)


@dataclass(frozen=True)
class Baselines:
    """What the agent's validation figures are read against, per fold."""

    flat: Metrics
    buy_and_hold: Metrics
    probe: Metrics
    probe_r2: float
    oracle_sharpe: float | None
    series: dict[str, np.ndarray]
    """Per-bar PnL of buy-and-hold and the probe, the day lengths and the oracle's daily PnL (the report's curves)."""

    def save(self, folder: Path) -> None:
        """baselines.npz in the fold's folder (atomically)."""
        folder.mkdir(parents=True, exist_ok=True)
        with atomic_path(folder / BASELINES) as tmp, open(tmp, "wb") as fh:
            np.savez(fh, **self.series)


def half_spread(market: FoldMarket) -> np.ndarray:
    """float64 [n]: half the close spread of every bar (price units): what the baselines pay per contract crossed."""
    return 0.5 * (market.ask_px[:, 0] - market.bid_px[:, 0])


def scored_days(market: FoldMarket) -> list[int]:
    """Fold day index of each validation window of `market`: the days the agent is scored on (a day of fewer than
    MIN_EPISODE_BARS bars holds no step and has no window), and so the days every baseline is scored on."""
    return [int(d) for d in np.searchsorted(market.day_start, market.val_windows[:, 0], side="right") - 1]


@dataclass(frozen=True)
class DayBaselines:
    """Flat, buy-and-hold (one contract per day) and the oracle on the days the agent is scored on."""

    days: list[int]
    """`scored_days(market)`."""
    flat: Metrics
    buy_and_hold: Metrics
    buy_and_hold_pnl: np.ndarray
    """float64 [bars of those days]: buy-and-hold's PnL per bar."""
    oracle_sharpe: float | None
    """The oracle's daily Sharpe on those days (None: not a synthetic store)."""
    oracle_daily: np.ndarray
    """float64 [days]: the oracle's daily PnL on those days (empty without an oracle)."""


def day_baselines(cfg: FoxConfig, market: FoldMarket, oracle: OracleReference | None,
                  store_days: list[str]) -> DayBaselines:
    """The baselines that fit nothing, on `scored_days(market)` (`store_days`: the store's days, for the oracle)."""
    days = scored_days(market)
    windows = [(int(a), int(b)) for a, b in market.val_windows]
    half = half_spread(market)
    bh = buy_and_hold_days([market.mid[a:b] for a, b in windows], [half[a:b] for a, b in windows],
                           point_value=market.point_value, commission=cfg.env.commission)  # fmt: skip
    annual = cfg.evaluation.annualisation_days
    oracle_sharpe, oracle_daily = None, np.zeros(0)
    if oracle is not None:
        index = oracle.day_indices(store_days, [market.days[d] for d in days])
        oracle_sharpe, oracle_daily = oracle.sharpe_on(index, annual), oracle.daily_pnl[index]
    return DayBaselines(
        days=days, flat=compute_metrics(flat_days([b - a for a, b in windows]), annualisation_days=annual),
        buy_and_hold=compute_metrics(bh, annualisation_days=annual),
        buy_and_hold_pnl=np.concatenate([d.pnl for d in bh]), oracle_sharpe=oracle_sharpe, oracle_daily=oracle_daily,
    )


def fold_baselines(cfg: FoxConfig, market: FoldMarket, oracle: OracleReference | None,
                   store_days: list[str]) -> Baselines:
    """`day_baselines` and the probe (fitted on the training rows, the purged tail left out) on the days the
    agent is scored on: the fold's validation days of MIN_EPISODE_BARS+ bars."""
    ev = cfg.evaluation
    fixed = day_baselines(cfg, market, oracle, store_days)
    probe = probe_baseline(market.market_obs[:, :feature_columns(cfg.features)], market.mid, half_spread(market),
                           market.day_start, slice(0, market.train_stop), fixed.days, horizon=ev.probe_horizon_bars,
                           ridge=ev.probe_ridge, tick_size=market.tick_size, point_value=market.point_value,
                           commission=cfg.env.commission, annualisation_days=ev.annualisation_days)  # fmt: skip
    series = {
        "lengths": np.diff(market.val_windows, axis=1)[:, 0].astype(np.int64),
        "buy_and_hold_pnl": fixed.buy_and_hold_pnl,
        "probe_pnl": np.concatenate([d.pnl for d in probe.days]),
        "oracle_daily_pnl": np.asarray(fixed.oracle_daily, np.float64),
    }
    return Baselines(flat=fixed.flat, buy_and_hold=fixed.buy_and_hold, probe=probe.metrics, probe_r2=probe.val_r2,
                     oracle_sharpe=fixed.oracle_sharpe, series=series)


def setup_text(marks: Sequence[float]) -> str:
    """'set up in T s: features a, device b, resets c, baselines d' from the perf_counter marks at the start and
    after each of SETUP_PARTS: where a slow fold's set-up went (under concurrent runs, which part contends)."""
    parts = ", ".join(f"{name} {b - a:.1f}" for name, a, b in zip(SETUP_PARTS, marks[:-1], marks[1:], strict=True))
    return f"set up in {marks[-1] - marks[0]:.1f} s: {parts}"


def sharpe_text(m: Metrics) -> str:
    """A policy's daily Sharpe for the console; the per-bar one, labelled, where no daily one can be formed."""
    return signed(m.sharpe_daily) if math.isfinite(m.sharpe_daily) else f"{signed(m.sharpe_bar)} per bar"


def epoch_summary(fold: int, epoch: int, val: Metrics, train: dict[str, float], rollout: dict[str, float],
                  seconds: dict[str, float], select: Metrics | None = None) -> str:
    """One human line per epoch."""
    times = " ".join(f"{name} {t:.1f}" for name, t in seconds.items())
    held = f"select Sharpe {signed(select.sharpe_daily)}, " if select is not None else ""
    return (f"fold {fold} epoch {epoch}: {held}val Sharpe {signed(val.sharpe_daily)} (daily) "
            f"{signed(val.sharpe_bar)} (bar), "
            f"return ${val.total_return:,.0f}, active {val.active_fraction:.2f}, trades {val.trades} | "
            f"loss {train['loss']:.4f}, grad {train['grad_norm']:.3g}, q {train['q_mean']:+.4f} | "
            f"collect reward {rollout.get('reward_mean', float('nan')):+.4f} | seconds: {times}")


def trim_health_log(path: Path, fold: int, epoch: int) -> None:
    """Keep the HEALTH_DIAG lines of epochs before (fold, epoch): a resumed run writes that epoch's again."""
    if not path.is_file():
        return
    kept = [ln for ln in path.read_text(encoding="utf-8").splitlines(keepends=True)
            if ln.endswith("\n") and ln.startswith(PREFIX) and
            (lambda d: (int(d["fold"]), int(d["epoch"])) < (fold, epoch))(parse_line(ln))]
    atomic_write_text(path, "".join(kept))


class Driver:
    """One walk-forward run (module docstring)."""

    def __init__(self, cfg: FoxConfig, selection: MarketSelection, features: FeatureSet, run: RunFolder, *,
                 log: RunLog, progress: Callable[..., None] | None = None) -> None:
        self.cfg, self.selection, self.features, self.run, self.log = cfg, selection, features, run, log
        self.progress = progress or (lambda message, advance=1: None)
        """`(message, advance)` per epoch phase (EPOCH_PHASES) and per HEALTH_DIAG snapshot (advance 0)."""
        self.folds = make_folds(cfg.folds, selection.days)
        with MarketStore(selection.path) as store:
            self.store_days = store.days()
        self.oracle = OracleReference.for_store(selection.path)
        self.trainer = Trainer(cfg)
        self.kills, self.best = KillCriteria(), BestEpoch.for_config(cfg.folds.select_days)
        self.registry = StateResetRegistry()
        self.fold_market: FoldMarket | None = None
        self.events: EventLog | None = None
        """TensorBoard events (run.tensorboard), opened at the first epoch this process runs: by then a resumed
        run has cut metrics.jsonl and health_diag.log back to its checkpoint, and the events are rebuilt from them."""

    def market(self, fold: Fold) -> FoldMarket:
        return FoldMarket.build(self.features, fold, self.cfg.features, self.cfg.env)

    def fold_line(self, fold: Fold, market: FoldMarket) -> str:
        return (f"{fold.describe()}: {market.n_rows:,} bars, {len(market.train_starts):,} episode starts, "
                f"risk unit ${market.risk_unit:,.2f}")

    def train(self, *, resume: bool) -> dict[str, Any]:
        cfg, trainer, log = self.cfg, self.trainer, self.log
        point = None
        if resume:
            point = self.run.resume_point(len(self.folds), expected_fingerprints=self.fingerprints())
            if point is not None and point.run_done:
                log("every fold has finished; writing the summary")
                return self.run.summarise(annualisation_days=cfg.evaluation.annualisation_days,
                                          chosen_by=self.best.rule)
        first = point.fold if point is not None else 0
        if point is not None:
            self.progress("resuming", advance=(point.fold * cfg.learner.epochs + point.epoch) * len(EPOCH_PHASES))
        for k in range(first, len(self.folds)):
            t0 = time.perf_counter()
            fold = self.folds[k]
            market = self.fold_market = self.market(fold)
            marks = [t0, time.perf_counter()]
            trainer.bind_fold(market, k)
            fold_text = self.fold_line(fold, market)
            if not self.registry.entries:
                register_trainer(self.registry, trainer, self.kills, self.best)
                problems = audit_trainer(self.registry, trainer, self.kills, self.best)
                if problems:
                    raise RuntimeError("trainer state not in the reset registry: " + "; ".join(problems))
            marks.append(time.perf_counter())
            start_epoch, resets = 0, None
            if point is not None and k == point.fold:
                trainer.load_state(point.checkpoint.arrays, same_fold=not point.fold_boundary)
                self.registry.load_host_state(point.checkpoint.registry_state, str(point.checkpoint.path))
                start_epoch = point.epoch
                trim_health_log(self.run.path / HEALTH_LOG, k, start_epoch)
                log(f"resumed from {point.checkpoint.path} at fold {k} epoch {start_epoch}")
            if start_epoch == 0:
                records = self.registry.reset(FoldReset, ResetContext(fold=k, seed=cfg.run.seed, stream=trainer.stream))
                log.detail(format_resets(records, k))
                resets = [r.name for r in records]
                fold_text += f"; {len(records)} state entries reset (listed in {TRAIN_LOG})"
            marks.append(time.perf_counter())
            baselines = fold_baselines(cfg, market, self.oracle, self.store_days)
            baselines.save(self.run.fold_dir(k))
            marks.append(time.perf_counter())
            log(f"{fold_text}; baselines: probe Sharpe {sharpe_text(baselines.probe)} (val R^2 "
                f"{baselines.probe_r2:+.3f}), buy-and-hold {sharpe_text(baselines.buy_and_hold)}"
                + (f", oracle {signed(baselines.oracle_sharpe)}" if baselines.oracle_sharpe is not None else "")
                + f"; {setup_text(marks)}")
            for epoch in range(start_epoch, cfg.learner.epochs):
                killed = self.epoch(k, epoch, baselines, resets if epoch == start_epoch else None)
                if killed:  # the fold's remaining epochs will not run: their steps of the bar are done
                    self.progress(f"fold {k} killed", advance=(cfg.learner.epochs - epoch - 1) * len(EPOCH_PHASES))
                if killed:
                    break
        return self.run.summarise(annualisation_days=cfg.evaluation.annualisation_days, chosen_by=self.best.rule)

    def diag(self, fold: int, epoch: int) -> None:
        """Read the HEALTH_DIAG snapshot just taken: one line in health_diag.log (on the console with --verbose)."""
        line = self.trainer.health.line(fold=fold, epoch=epoch, kill=self.kills.diag_fields)
        with open(self.run.path / HEALTH_LOG, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
        self.log.detail(line, to_file=False)
        if self.events is not None:
            self.events.health(line)
        self.progress(f"fold {fold} epoch {epoch}: train, step {parse_line(line)['step']}", advance=0)

    def fingerprints(self) -> dict[str, str]:
        return {"params": self.trainer.layout.fingerprint}

    def epoch(self, k: int, epoch: int, baselines: Baselines, resets: list[str] | None) -> bool:
        """One epoch of fold k; True when a kill criterion ended the fold."""
        cfg, trainer = self.cfg, self.trainer
        if cfg.run.tensorboard and self.events is None:
            self.events = EventLog.rebuilt(self.run.path, self.run.read_metrics(), self.run.path / HEALTH_LOG)
        t0 = time.perf_counter()
        self.progress(f"fold {k} epoch {epoch}: collect", advance=0)
        rollout = trainer.collect()
        self.progress(f"fold {k} epoch {epoch}: train")
        t1 = time.perf_counter()
        train = trainer.train(lambda: self.diag(k, epoch))
        trainer.learner.average_epoch(epoch)
        t2 = time.perf_counter()
        isv = trainer.isv()
        fold_step = int(trainer.learner.read_optim_state()["step"])
        kill = self.kills.check(EpochHealth.from_isv(isv, epoch=epoch, q_mean=train["q_mean"],
                                                     steps=int(train["steps"]), fold_step=fold_step))
        trainer.update_drift(train["q_mean"])
        t3 = time.perf_counter()
        self.progress(f"fold {k} epoch {epoch}: validation")
        records, eval_env = trainer.evaluate()
        held = trainer.evaluate_selection()
        t4 = time.perf_counter()
        annual = cfg.evaluation.annualisation_days
        days = day_series(records)
        val = compute_metrics(days, annualisation_days=annual)
        select = None if held is None else compute_metrics(day_series(held), annualisation_days=annual)
        report = fold_report(val, flat=baselines.flat, buy_and_hold=baselines.buy_and_hold, probe=baselines.probe,
                             oracle_sharpe=baselines.oracle_sharpe)
        last = epoch == cfg.learner.epochs - 1
        line = epoch_line(k, epoch, val=val, report=report, kill=kill, resets=resets, select=select,
                          train={**train, **{f"collect_{n}": v for n, v in rollout.items()},
                                 **{f"eval_{n}": v for n, v in eval_env.items()}, "fold_step": fold_step})
        fold_done = kill is not None or last
        arrays = trainer.download_state(ring=not fold_done) | self.fold_market.checkpoint_arrays()
        self.run.end_epoch(line, arrays=arrays, registry=self.registry, best=self.best, fold_done=fold_done,
                           validation=days, fingerprints=self.fingerprints(),
                           best_arrays={k: v for k, v in arrays.items() if k not in RING_STATE})
        if self.events is not None:
            self.events.epoch(line)
        seconds = {"collect": t1 - t0, "train": t2 - t1, "evaluate": t4 - t3, "epoch": time.perf_counter() - t0}
        self.log(epoch_summary(k, epoch, val, train, rollout, seconds, select))
        self.progress(f"fold {k} epoch {epoch} done")
        if kill is not None:
            self.log(f"fold {k} killed: {kill.reason}")
        return kill is not None


def train_run(cfg: FoxConfig, selection: MarketSelection, *, features: FeatureSet | None = None,
              resume: Path | None = None, log: Log = print, verbose: bool = False,
              progress: Callable[..., None] | None = None) -> tuple[Path, dict[str, Any]]:
    """Run (or resume) a walk-forward training; (run folder, summary). `log` gets a line per fold and per epoch,
    and with `verbose` the long ones too (RunLog); train.log in the run folder gets them all; `progress`
    (progress.progress_bar's callback) a step per epoch phase of folds x epochs x EPOCH_PHASES. `features`: the
    selection's (`load_features`), when the caller built them already."""
    folds = make_folds(cfg.folds, selection.days)  # too few days stops here, before any work
    if cfg.run.tensorboard:
        require_extra()
    if features is None:  # before the run folder: a day that fails validation here leaves nothing behind
        features = load_features(cfg, selection)
    run = RunFolder.open(resume) if resume is not None else RunFolder.create(cfg, folds)
    with run:
        log = RunLog(run.path / TRAIN_LOG, log, verbose=verbose)
        if resume is not None:
            stored = run.config()
            if stored.market.store != cfg.market.store and cfg.market.store != "default":
                raise ConfigError(f"{resume}: the run trained on {stored.market.store}, not {cfg.market.store}")
            cfg = stored
        if (note := run.lock_note()) is not None:
            log(note)
        log(f"run folder {run.path}")
        for fold in folds:
            log.detail(fold.describe())
        driver = Driver(cfg, selection, features, run, log=log, progress=progress)
        try:
            summary = driver.train(resume=resume is not None)
        finally:
            if driver.events is not None:
                driver.events.close()
        report = write_report(run.path, log=log)
        log(f"report {report}")
    return run.path, summary
