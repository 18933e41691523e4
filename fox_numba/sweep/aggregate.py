"""Per-config figures of a sweep, from the trials' summary.json and health_diag.log.

Per config (a grid combination), over its finished trials: the validation daily Sharpe of every fold's chosen epoch (out
of sample: walkforward/run_folder.py), pooled over seeds and folds (mean, std with ddof 0, min, max, n), the probe's and
the oracle's Sharpe on the same folds, the oracle fraction (mean agent / mean oracle, as tools/train_seeds.py reports
it), and the HEALTH_DIAG aggregate across the seeds (diag/aggregate.py, each fold's last snapshot). Rows are in trial-id
order and hold no timing, so two sweeps of the same spec give the same `configs` whether they ran on one GPU or several;
wall seconds are kept apart, under `wall_s`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fox_numba.diag.aggregate import aggregate as diag_aggregate
from fox_numba.diag.aggregate import spread
from fox_numba.diag.layout import ParseError
from fox_numba.errors import InputError
from fox_numba.sweep.folder import SweepFolder, TrialRecord
from fox_numba.sweep.spec import Trial
from fox_numba.walkforward.metrics import json_number
from fox_numba.walkforward.run_folder import SUMMARY

DIAG_TABLE_FIELDS = ("loss", "q_abs_ref", "grad_norm_raw", "atom_entropy", "nonfinite_steps")
"""HEALTH_DIAG fields the terminal shows per config and fold (summary.json holds every field)."""


def fmt(v: Any, spec: str = "+.2f") -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def finite(values: Sequence[float | None]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(v)]


def mean(values: Sequence[float | None]) -> float:
    """Mean of the finite values (NaN when there are none)."""
    vals = finite(values)
    return math.fsum(vals) / len(vals) if vals else math.nan


def finite_spread(values: Sequence[float | None]) -> dict[str, float | int | None]:
    """{mean, std (ddof 0), min, max, n} of the finite values (None where there are none)."""
    vals = finite(values)
    return spread(vals) if vals else {"mean": None, "std": None, "min": None, "max": None, "n": 0}


def fold_rows(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per fold of a run's summary.json: the chosen epoch's validation figures (out of sample) beside the
    baselines, the in-sample best epoch's daily Sharpe (chosen on the validation days; None in summaries that
    predate it), and the last epoch's and the mean over every epoch's daily Sharpe."""
    rows = []
    for f in summary.get("folds", []):
        val, base = f.get("val") or {}, f.get("baselines") or {}
        rows.append({
            "fold": f["fold"], "best_epoch": f.get("best_epoch"), "agent": val.get("sharpe_daily"),
            "agent_bar": val.get("sharpe_bar"), "return": val.get("total_return"),
            "active": val.get("active_fraction"), "probe": (base.get("probe") or {}).get("sharpe_daily"),
            "buy_and_hold": (base.get("buy_and_hold") or {}).get("sharpe_daily"), "oracle": base.get("oracle_sharpe"),
            "kill": (f.get("kill") or {}).get("reason"),
            "last": (f.get("last_val") or {}).get("sharpe_daily"), "every": f.get("every_epoch_sharpe_mean"),
            "in_sample": (f.get("in_sample_best_val") or {}).get("sharpe_daily"),
        })
    return rows


def read_summary(run: Path) -> dict[str, Any]:
    path = run / SUMMARY
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise InputError(path, f"not JSON ({e})") from None


def _json_diag(result: Mapping[int, Mapping[str, Mapping[str, float]]]) -> dict[str, Any]:
    return {str(fold): {name: {k: json_number(v) for k, v in s.items()} for name, s in fields.items()}
            for fold, fields in result.items()}


def config_entry(config: str, values: Mapping[str, Any], trials: Sequence[Trial],
                 folder: SweepFolder) -> dict[str, Any]:
    """One config's figures over its finished trials (module docstring)."""
    done = [t for t in trials if folder.finished(t.id)]
    rows = [row for t in done for row in fold_rows(read_summary(folder.run_dir(t.id)))]
    agent, oracle = mean([r["agent"] for r in rows]), mean([r["oracle"] for r in rows])
    runs = [folder.run_dir(t.id) for t in done]
    try:
        diag = _json_diag(diag_aggregate(runs)) if runs else {}
    except (OSError, ParseError) as e:
        raise InputError(folder.path, f"config {config}: cannot aggregate HEALTH_DIAG ({e})") from None
    return {
        "config": config, "values": dict(values), "seeds": [t.seed for t in trials],
        "finished": [t.seed for t in done], "sharpe_daily": finite_spread([r["agent"] for r in rows]),
        "probe_sharpe_daily": json_number(mean([r["probe"] for r in rows])),
        "oracle_sharpe": json_number(oracle),
        "oracle_fraction": json_number(agent / oracle) if oracle and math.isfinite(oracle) else None,
        "health_diag": diag,
    }


def sweep_summary(trials: Sequence[Trial], folder: SweepFolder, records: Mapping[str, TrialRecord | None],
                  *, wall_s: float) -> dict[str, Any]:
    """summary.json of the sweep: per config, per trial, and the wall seconds apart (module docstring)."""
    by_config: dict[str, list[Trial]] = {}
    for t in sorted(trials, key=lambda t: t.id):
        by_config.setdefault(t.config, []).append(t)
    configs = [config_entry(cid, dict(ts[0].values), ts, folder) for cid, ts in by_config.items()]
    per_trial = []
    for t in sorted(trials, key=lambda t: t.id):
        rec = records.get(t.id)
        done = folder.finished(t.id)
        per_trial.append({"id": t.id, "config": t.config, "seed": t.seed, "finished": done,
                          "error": None if done or rec is None else rec.error})
    trial_wall = {t.id: (r.wall_s if (r := records.get(t.id)) else None) for t in trials}
    config_wall = {cid: json_number(mean([trial_wall[t.id] for t in ts])) for cid, ts in by_config.items()}
    return {"configs": configs, "trials": per_trial,
            "wall_s": {"sweep": wall_s, "trial": dict(sorted(trial_wall.items())), "config_mean": config_wall}}


def results_table(summary: Mapping[str, Any]) -> Any:
    """The per-config table of a sweep summary (a rich Table), wall seconds per trial in the last column."""
    from rich.table import Table

    table = Table(title="fox sweep: validation daily Sharpe of each fold's chosen epoch (out of sample), over seeds "
                        "and folds")
    for name in ("config", "values", "seeds", "Sharpe mean", "std", "min", "max", "n", "probe", "oracle",
                 "agent/oracle", "wall s/trial"):
        table.add_column(name, justify="left" if name in ("config", "values") else "right")
    walls = summary["wall_s"]["config_mean"]
    for c in summary["configs"]:
        s = c["sharpe_daily"]
        values = ", ".join(f"{k}={v}" for k, v in c["values"].items()) or "(base)"
        seeds = f"{len(c['finished'])}/{len(c['seeds'])}"
        table.add_row(c["config"], values, seeds, fmt(s["mean"]), fmt(s["std"], ".2f"), fmt(s["min"]), fmt(s["max"]),
                      str(s["n"]), fmt(c["probe_sharpe_daily"]), fmt(c["oracle_sharpe"]),
                      fmt(c["oracle_fraction"], ".2f"), fmt(walls.get(c["config"]), ".0f"))
    return table


def diag_table(summary: Mapping[str, Any]) -> Any:
    """HEALTH_DIAG across the seeds of each config, per fold: mean +- std of DIAG_TABLE_FIELDS."""
    from rich.table import Table

    table = Table(title="HEALTH_DIAG across seeds (each fold's last snapshot): mean +- std")
    for name in ("config", "fold", "seeds", *DIAG_TABLE_FIELDS):
        table.add_column(name, justify="left" if name == "config" else "right")
    for c in summary["configs"]:
        for fold, fields in c["health_diag"].items():
            cells = [f"{fmt(fields[f]['mean'], '.4g')} +- {fmt(fields[f]['std'], '.2g')}" for f in DIAG_TABLE_FIELDS]
            table.add_row(c["config"], fold, str(fields["fold"]["n"]), *cells)
    return table
