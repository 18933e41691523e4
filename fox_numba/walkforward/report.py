"""`fox report RUN`: PNG plots and a one-page Markdown report of a run folder (written at the end of `fox train`).

Reads only what the run wrote: metrics.jsonl (per epoch per fold), summary.json, each fold's
best_validation.npz and baselines.npz (per-bar validation PnL of the chosen epoch, of buy-and-hold and of the
probe; the oracle's daily PnL on a synthetic store) and health_diag.log. Writes into RUN/report/:

    equity.png        validation equity per fold (chosen epoch) against flat, buy-and-hold, the probe, the oracle
    sharpe.png        validation daily Sharpe per epoch, one line per fold (dashed beside it: the Sharpe on the
                      selection days, which chose the epoch, when the run has them)
    signals.png       from HEALTH_DIAG over the snapshots: reward split, Q scale references, gradient norm raw
                      and clipped with clip_eff, lr_eff, tau_eff and the fold warm-up factor
    actions.png       training and validation action shares per branch (each fold's last snapshot)
    report.md         the run's table of folds and baselines, notes on missing inputs, and the four figures

A fold without best_validation.npz (no epoch was recorded as its best, or the file was lost) has no agent
curve: its panel says so, and so do report.md and the log, rather than plotting the baselines alone.

matplotlib (Agg backend, no display) draws the figures; the report is the same on any machine.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from fox_numba.actions import BRANCHES
from fox_numba.diag.aggregate import HEALTH_LOG
from fox_numba.diag.layout import PREFIX, parse_line
from fox_numba.errors import InputError
from fox_numba.io import atomic_path, atomic_write_text
from fox_numba.walkforward.metrics import MIN_SAMPLES, signed
from fox_numba.walkforward.run_folder import BEST_VALIDATION, METRICS, SUMMARY, fold_dir

BASELINES = "baselines.npz"
REPORT_DIR = "report"
FIGURES = ("equity.png", "sharpe.png", "signals.png", "actions.png")
FIG_SIZE = (10.0, 6.0)  # inches
DPI = 100  # so every figure is 1000 x 600 pixels


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> None:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=DPI)
    _pyplot().close(fig)


def read_metrics(run: Path) -> list[dict[str, Any]]:
    path = run / METRICS
    if not path.is_file():
        raise InputError(run, f"not a run folder with results (no {METRICS}): train first, or name the run folder")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def read_diag(run: Path) -> list[dict[str, float | int]]:
    path = run / HEALTH_LOG
    if not path.is_file():
        return []
    return [parse_line(line) for line in path.read_text(encoding="utf-8").splitlines() if line.startswith(PREFIX)]


def _cum_days(pnl: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(x, cumulative equity) of chained days: x counts bars across the days."""
    return np.arange(1, len(pnl) + 1), np.cumsum(pnl)


def equity_figure(run: Path, folds: list[int]) -> Any:
    plt = _pyplot()
    cols = min(max(len(folds), 1), 3)
    rows = -(-max(len(folds), 1) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=FIG_SIZE, squeeze=False)
    for ax in axes.ravel()[len(folds):]:
        ax.set_visible(False)
    for ax, k in zip(axes.ravel(), folds, strict=False):
        folder = fold_dir(run, k)
        ax.set_title(f"fold {k}")
        ax.axhline(0.0, color="grey", lw=0.8, label="flat")
        if (folder / BEST_VALIDATION).is_file():
            with np.load(folder / BEST_VALIDATION) as z:
                x, eq = _cum_days(z["pnl"], z["lengths"])
                ax.plot(x, eq, lw=1.4, label=f"agent (epoch {int(z['epoch'])})")
        else:
            ax.text(0.5, 0.5, f"no {BEST_VALIDATION}", transform=ax.transAxes, ha="center", color="red")
        if (folder / BASELINES).is_file():
            with np.load(folder / BASELINES) as z:
                for key, label in (("buy_and_hold_pnl", "buy-and-hold"), ("probe_pnl", "probe")):
                    if key in z:
                        x, eq = _cum_days(z[key], z["lengths"])
                        ax.plot(x, eq, lw=0.9, label=label)
                if "oracle_daily_pnl" in z and z["oracle_daily_pnl"].size:
                    ends = np.cumsum(z["lengths"])
                    ax.plot(ends, np.cumsum(z["oracle_daily_pnl"]), "k:", marker=".", label="oracle (daily)")
        ax.set_xlabel("validation bar", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6)
    for row in axes:
        row[0].set_ylabel("equity, $")
    fig.tight_layout()
    return fig


def sharpe_figure(lines: list[dict[str, Any]]) -> Any:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=FIG_SIZE)
    for k in sorted({ln["fold"] for ln in lines}):
        fold = [ln for ln in lines if ln["fold"] == k]
        epochs = [ln["epoch"] for ln in fold]

        def figures(key: str) -> list[float]:
            return [np.nan if v is None else v for v in (ln.get(key, {}).get("sharpe_daily") for ln in fold)]

        (line,) = ax.plot(epochs, figures("val"), marker="o", label=f"fold {k}")
        if any("select" in ln for ln in fold):
            ax.plot(epochs, figures("select"), ls="--", marker=".", color=line.get_color(),
                    label=f"fold {k}, selection days")
    ax.axhline(0.0, color="grey", lw=0.8)
    ax.set_xlabel("epoch")
    ax.set_ylabel("Sharpe (daily, annualised)")
    ax.legend()
    fig.tight_layout()
    return fig


SIGNAL_PANELS = (
    ("reward split (EMA of mean |component|)",
     ("reward_pnl", "reward_novelty", "reward_persist", "reward_regime", "reward_stable", "reward_timing")),
    ("Q scale", ("q_abs_ref", "q_dir_abs_ref", "q_mean", "q_std")),
    ("gradient norm", ("grad_norm_raw", "grad_norm_clipped", "clip_eff")),
    ("rates", ("lr_eff", "tau_eff", "warmup_factor")),
)
# Panels whose curves span decades (lr ~1e-4 beside a factor ~1): a log axis, keyed by a field that must be > 0.
LOG_PANELS = {"gradient norm": "grad_norm_raw", "rates": "lr_eff"}


def signals_figure(diag: list[dict[str, float | int]]) -> Any:
    plt = _pyplot()
    fig, axes = plt.subplots(2, 2, figsize=FIG_SIZE)
    x = np.arange(len(diag))
    for ax, (title, names) in zip(axes.ravel(), SIGNAL_PANELS, strict=True):
        for name in names:
            ax.plot(x, [float(d[name]) for d in diag], lw=1.0, label=name)
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=6)
        if title in LOG_PANELS and diag and max(float(d[LOG_PANELS[title]]) for d in diag) > 0:
            ax.set_yscale("log")  # zeros (a fold's first warm-up factor) are left out of a log axis
    for ax in axes[1]:
        ax.set_xlabel("HEALTH_DIAG snapshot")
    fig.tight_layout()
    return fig


def actions_figure(diag: list[dict[str, float | int]]) -> Any:
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(BRANCHES), figsize=FIG_SIZE)
    last = {}
    for d in diag:
        last[int(d["fold"])] = d
    for ax, br in zip(axes, BRANCHES, strict=True):
        names = [b.name.lower() for b in br.bins]
        width = 0.8 / max(2 * len(last), 1)
        for j, (k, d) in enumerate(sorted(last.items())):
            for m, mode in enumerate(("train", "eval")):
                counts = np.array([float(d[f"{mode}_{br.name[:3]}_{n}"]) for n in names])
                share = counts / counts.sum() if counts.sum() > 0 else counts
                ax.bar(np.arange(len(names)) + (2 * j + m) * width, share, width, label=f"fold {k} {mode}")
        ax.set_xticks(np.arange(len(names)) + 0.4 - width / 2, names, fontsize=7, rotation=30)
        ax.set_title(br.name, fontsize=9)
    axes[0].set_ylabel("share of actions")
    axes[-1].legend(fontsize=6)
    fig.tight_layout()
    return fig


def headline(summary: dict[str, Any]) -> str:
    """The headline of summary.json (`fox train`'s last line, report.md): the mean validation daily Sharpe across
    folds of the checkpoints chosen without the validation days (out of sample), the per-bar Sharpe of their
    validation days, and beside them the in-sample figure (each fold's best epoch on the days that score it),
    labelled. When the daily figure cannot be formed (a fold of fewer than MIN_SAMPLES validation days), the
    per-bar one leads, and the line says why."""
    bar = ((summary.get("across_folds") or {}).get("all_validation_days") or {}).get("sharpe_bar")
    daily, in_sample = summary.get("honest_sharpe_mean"), summary.get("in_sample_best_sharpe_mean")
    chosen = ("the best on the selection days" if summary.get("best_chosen_on") == "selection" else
              "the last epoch")
    if daily is None:
        return (f"validation Sharpe: per bar {signed(bar)} (every fold's validation days, out of sample: each fold's "
                f"checkpoint is {chosen}); daily n/a (it needs {MIN_SAMPLES}+ validation days a fold: "
                f"folds.val_days); in sample {signed(in_sample)}")
    return (f"validation Sharpe: daily {signed(daily)} (mean across folds, out of sample: each fold's checkpoint is "
            f"{chosen}), per bar {signed(bar)}; in sample (each fold's best epoch on its validation days) "
            f"{signed(in_sample)}")


def _fmt(v: Any, spec: str = "+.2f") -> str:
    return "n/a" if v is None else format(v, spec)


def markdown(run: Path, lines: list[dict[str, Any]], summary: dict[str, Any] | None, notes: list[str]) -> str:
    out = [f"# Run report: {run.name}", ""]
    out += [f"- {n}" for n in notes] + ([""] if notes else [])
    if summary is not None:
        across = summary.get("across_folds") or {}
        spread = _fmt(across.get("fold_sharpe_std"), ".2f")
        out += [f"**{headline(summary)}**; std of the folds' daily Sharpes {spread}. {summary.get('note', '')}.", ""]
        out += ["| fold | chosen epoch | Sharpe daily | Sharpe bar | return $ | max DD $ | active | probe | "
                "buy-and-hold | oracle | in sample (epoch) | kill |",
                "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
        for f in summary.get("folds", []):
            val, base = f.get("val") or {}, f.get("baselines") or {}
            probe = (base.get("probe") or {}).get("sharpe_daily")
            bh = (base.get("buy_and_hold") or {}).get("sharpe_daily")
            kill = (f.get("kill") or {}).get("reason", "")
            out.append(f"| {f['fold']} | {f.get('best_epoch')} | {_fmt(val.get('sharpe_daily'))} | "
                       f"{_fmt(val.get('sharpe_bar'))} | {_fmt(val.get('total_return'), ',.0f')} | "
                       f"{_fmt(val.get('max_drawdown'), ',.0f')} | {_fmt(val.get('active_fraction'), '.2f')} | "
                       f"{_fmt(probe)} | {_fmt(bh)} | {_fmt(base.get('oracle_sharpe'))} | "
                       f"{_fmt((f.get('in_sample_best_val') or {}).get('sharpe_daily'))} "
                       f"({f.get('in_sample_best_epoch')}) | {kill} |")
        out.append("")
    out += [f"{len(lines)} epochs recorded in {METRICS}.", ""]
    out += [f"![{name}]({name})" for name in FIGURES]
    return "\n".join(out) + "\n"


def write_report(run: str | Path, log: Callable[[str], None] = print) -> Path:
    """Write RUN/report/ (module docstring); `log` gets a line per missing input; returns the Markdown file."""
    run = Path(run)
    lines = read_metrics(run)
    diag = read_diag(run)
    summary = json.loads((run / SUMMARY).read_text(encoding="utf-8")) if (run / SUMMARY).is_file() else None
    folds = sorted({int(ln["fold"]) for ln in lines})
    notes = [f"fold {k}: {BEST_VALIDATION} missing, so its equity panel has no agent curve" for k in folds
             if not (fold_dir(run, k) / BEST_VALIDATION).is_file()]  # fmt: skip
    for note in notes:
        log(note)
    out = run / REPORT_DIR
    out.mkdir(exist_ok=True)
    _save(equity_figure(run, folds), out / "equity.png")
    _save(sharpe_figure(lines), out / "sharpe.png")
    _save(signals_figure(diag), out / "signals.png")
    _save(actions_figure(diag), out / "actions.png")
    return atomic_write_text(out / "report.md", markdown(run, lines, summary, notes))
