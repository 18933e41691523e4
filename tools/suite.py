"""Score a `fox train` config on the market suite (data/suite/suite.toml): every market x every seed, one table.

    python3 tools/suite.py --seeds 0 1 2 3 4 --parallel 6 --out tools/results/suite_NAME [--markets a,b]
        [--runs runs/suite] [--stores DIR] [--suite data/suite/suite.toml] [--mps] [-- extra fox train arguments]

Each market's store is built from its definition (`python -m fox_numba data synth --definition DEF [--seed S]
--out STORES/MARKET.h5`, S the suite file's seed for the market when it gives one: data/suite/fresh.toml draws every
market again; an existing store built from the same definition digest is reused; STORES defaults to the default
market's cache folder + /suite). Then markets x seeds `python -m fox_numba train` runs, at most
--parallel at a time on one GPU (tools/train_seeds.py's runner), each with the arguments, in this order:
the suite's [plan] set, the extra arguments, the market's own set, the settings the tool derives from the
market's definition (`env.commission` and `evaluation.probe_horizon_bars` = its [oracle] commission and
horizon, so the agent and the probe pay and look as far as the oracle does), then --store and the run's
seed, name seed_S and folder RUNS/MARKET (the last word wins; a --set of a derived key is refused).

OUT.md and OUT.json hold per market, seen and held-out marked: the honest figure (`honest_sharpe`: the validation
daily Sharpe of a checkpoint chosen without the validation days) as mean and standard error across seeds, the
probe, buy-and-hold and the oracle on the same validation days, agent / probe and agent / oracle, and the
in-sample figure (`in_sample_sharpe`: the epoch with the best validation Sharpe) as a labelled second column;
then the seen and the held-out markets pooled per seed. Only the seen markets may choose a setting; the held-out
ones are reported so that a choice that does not carry over shows. The command, seeds, machine and wall
times are recorded. Exit status 1 if a build or a run failed, 2 for a bad suite file or argument.

    python3 tools/suite.py --tabulate OUT.json --out OUT [--runs RUNS]

rewrites OUT.md and OUT.json from the run folders (by default those recorded in OUT.json) and the command,
machine and wall times recorded in OUT.json.

    python3 tools/suite.py --tabulate OUT.json --rescore evaluation.hold_margin=0.02 [...] --out OUT2 [--parallel N]

scores each finished run's fold checkpoints (RUN/fold_KK/best.h5, the honest ones) again with `fox evaluate --set`
of those settings, N at a time, on the fold's own validation days, and tabulates those figures in place of the
runs' (the in-sample figures and the epoch table stay the training's): a setting that changes no training, such as
the backtests' hold margin, measured without training again. The run folders must still hold their checkpoints.

    python3 tools/suite.py --from-runs --runs RUNS --seeds ... --out OUT [-- the runs' fox train arguments]

tabulates the run folders RUNS already holds and trains nothing: a suite whose calls were cut short and
finished by later calls (each training some markets and seeds into its own folder, merged into RUNS). A run
with a summary.json counts as finished, one without as not run; wall times are unknown.

A training call with `--keep-finished` trains only what its run folders lack: a run with a summary.json is kept and
tabulated, a failed or cut-short one (its folder and log moved aside to seed_S.failed-K) trains again from the start,
so a suite some of whose runs failed (out of GPU memory at too many at once) is completed by the same command.

With any of the three, `--pack tools/results/runs_NAME.tgz` also writes the runs' records (per market and seed its
summary.json, metrics.jsonl and epochs.log, no checkpoints) into one gzip tar whose top folder is runs_NAME, the same
bytes for the same files (names sorted, owners, modes and times fixed): how tools/results keeps run folders
(tools/results/README.md).
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import math
import statistics
import sys
import tarfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from bench_device import machine, results_header  # noqa: E402
from train_seeds import MPS_HELP, Job, run_jobs, train_command  # noqa: E402

from fox_numba.config import load_config, read_toml  # noqa: E402
from fox_numba.device.mps import mps_for_children, mps_problem  # noqa: E402
from fox_numba.errors import ConfigError  # noqa: E402
from fox_numba.io import atomic_write_text  # noqa: E402
from fox_numba.market.default import built_hash, default_store_path  # noqa: E402
from fox_numba.market.synthetic_definition import SynthDefinition, load_definition  # noqa: E402
from fox_numba.sweep.aggregate import fmt, fold_rows, mean  # noqa: E402
from fox_numba.walkforward.metrics import json_number  # noqa: E402

SUITE = ROOT / "data" / "suite" / "suite.toml"
ROLES = ("seen", "held_out")
HONEST_FIELD = "honest_sharpe_mean"
"""summary.json's honest figure, per fold (or for the run); until a run writes it, the last epoch's figure stands in."""
IN_SAMPLE_FIELD = "in_sample_best_sharpe_mean"
"""summary.json's mean over folds of the epoch with the best validation Sharpe (chosen on the days that score it)."""
DERIVED = ("env.commission", "evaluation.probe_horizon_bars")
"""--set keys the tool derives from each market's definition; a suite file or the extra arguments may not set them."""
OWNED = (*DERIVED, "market.store", "run.seed", "run.name", "run.out_dir")
"""Keys a suite file may not set: the derived ones and those that place each run."""
MARKET_KEYS = ("definition", "role", "set", "seed")


@dataclass(frozen=True)
class Market:
    """One market of the suite: its name, definition (with the suite's generator seed when it sets one), role and
    own `fox train` --set overrides."""

    name: str
    definition_path: Path
    definition: SynthDefinition
    role: str
    overrides: tuple[str, ...]
    seed: int | None = None

    def derived(self) -> tuple[str, ...]:
        """The DERIVED overrides: the environment's commission and the probe's horizon are the oracle's."""
        o = self.definition.oracle
        return (f"env.commission={o.commission}", f"evaluation.probe_horizon_bars={o.horizon_minutes}")


@dataclass(frozen=True)
class Suite:
    """The markets of a suite file, in file order, and the --set overrides every run gets."""

    path: Path
    plan: tuple[str, ...]
    markets: tuple[Market, ...]


def _overrides(value: Any, where: str, origin: Path) -> tuple[str, ...]:
    """A list of `section.field=value` strings, none setting an OWNED key."""
    if not isinstance(value, list) or not all(isinstance(v, str) and "=" in v for v in value):
        raise ConfigError(f"{origin}: {where}: expected a list of 'section.field=value' strings, got {value!r}")
    owned = [v for v in value if v.partition("=")[0].strip() in OWNED]
    if owned:
        raise ConfigError(f"{origin}: {where}: {owned} set keys the tool sets itself ({', '.join(OWNED)})")
    return tuple(value)


def load_suite(path: Path) -> Suite:
    """Read and check a suite file: [plan] set, then [markets.NAME] tables of definition (a path relative to the
    file), role ('seen' or 'held_out'), an optional set and an optional seed (the generator's, in place of the
    definition's: another draw of the same market). Every definition is loaded and every market's --set
    overrides are checked against the config before anything runs; errors name the file and the key."""
    data = read_toml(path, "market suite")
    unknown = sorted(set(data) - {"plan", "markets"})
    if unknown:
        raise ConfigError(f"{path}: unknown tables {unknown} (tables: plan, markets)")
    plan = data.get("plan", {})
    if not isinstance(plan, dict) or sorted(plan) != ["set"]:
        raise ConfigError(f"{path}: [plan] must hold exactly the key 'set'")
    tables = data.get("markets")
    if not isinstance(tables, dict) or not tables:
        raise ConfigError(f"{path}: no [markets.NAME] tables")
    markets = []
    for name, table in tables.items():
        where = f"markets.{name}"
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: {where} must be a table")
        unknown = sorted(set(table) - set(MARKET_KEYS))
        if unknown:
            raise ConfigError(f"{path}: {where}: unknown keys {unknown} (keys: {', '.join(MARKET_KEYS)})")
        missing = [k for k in ("definition", "role") if k not in table]
        if missing:
            raise ConfigError(f"{path}: {where} lacks {missing}")
        if table["role"] not in ROLES:
            raise ConfigError(f"{path}: {where}.role: expected one of {ROLES}, got {table['role']!r}")
        definition = path.parent / str(table["definition"])
        if not definition.is_file():
            raise ConfigError(f"{path}: {where}.definition: {definition} not found")
        seed = table.get("seed")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or seed < 0):
            raise ConfigError(f"{path}: {where}.seed: expected an integer >= 0, got {seed!r}")
        markets.append(Market(name, definition, load_definition(definition).with_overrides(seed=seed), table["role"],
                              _overrides(table.get("set", []), f"{where}.set", path), seed))
    suite = Suite(path, _overrides(plan["set"], "plan.set", path), tuple(markets))
    for m in markets:
        try:
            load_config("default", None, [*suite.plan, *m.overrides, *m.derived()])
        except ConfigError as e:
            raise ConfigError(f"{path}: markets.{m.name}: {e}") from None
    return suite


def pick(suite: Suite, names: str | None) -> list[Market]:
    """The markets named in `names` (comma-separated; None: all), in suite order."""
    if names is None:
        return list(suite.markets)
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    known = [m.name for m in suite.markets]
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise ConfigError(f"{suite.path}: --markets names {unknown}, not in the suite (markets: {', '.join(known)})")
    return [m for m in suite.markets if m.name in wanted]


def set_keys(args: Sequence[str]) -> list[str]:
    """The `section.field` keys of the --set options in a `fox train` argument list."""
    keys = []
    for i, arg in enumerate(args):
        value = args[i + 1] if arg == "--set" and i + 1 < len(args) else arg.removeprefix("--set=")
        if arg == "--set" or arg.startswith("--set="):
            keys.append(value.partition("=")[0].strip())
    return keys


def check_extra(extra: Sequence[str]) -> None:
    """Refuse extra arguments that would take a market's place: --store, --resume or a --set of an OWNED key."""
    if any(a in ("--store", "--resume") or a.startswith(("--store=", "--resume=")) for a in extra):
        raise ConfigError("the extra fox train arguments may not hold --store or --resume: the suite picks the store")
    owned = [k for k in set_keys(extra) if k in OWNED]
    if owned:
        raise ConfigError(f"the extra fox train arguments set {owned}, which the suite sets per market")


def store_path(stores: Path, market: Market) -> Path:
    return stores / f"{market.name}.h5"


def market_command(market: Market, suite: Suite, extra: Sequence[str], store: Path, seed: int,
                   runs: Path) -> list[str]:
    """The `fox train` command of one market and seed (module docstring: the order of the arguments)."""
    args = [*set_options(suite.plan), *extra, *set_options([*market.overrides, *market.derived()]),
            "--store", str(store)]
    return train_command(args, seed, runs / market.name)


def set_options(sets: Sequence[str]) -> list[str]:
    """`--set KEY=VALUE` options for `fox train`."""
    return [a for s in sets for a in ("--set", s)]


def build_stores(markets: Sequence[Market], stores: Path, parallel: int) -> dict[str, dict[str, Any]]:
    """Build the store of every market whose store is absent or from another definition digest (at most
    `parallel` at a time); {market: {reused} or {returncode, wall_s}}."""
    jobs, built = [], {}
    for m in markets:
        store = store_path(stores, m)
        if built_hash(store) == m.definition.digest():
            built[m.name] = {"reused": True}
            continue
        cmd = [sys.executable, "-m", "fox_numba", "data", "synth", "--definition", str(m.definition_path),
               *(["--seed", str(m.seed)] if m.seed is not None else []), "--out", str(store)]
        jobs.append(Job(m.name, cmd, stores / f"{m.name}.build.log"))
    for name, result in run_jobs(jobs, parallel).items():
        built[str(name)] = {"reused": False, **result}
    return built


def honest_sharpe(summary: Mapping[str, Any]) -> tuple[float | None, str]:
    """A run's honest figure, the validation daily Sharpe of checkpoints chosen without the validation days,
    averaged over its folds, and where it came from: each fold's HONEST_FIELD, else the run's, else (until
    summary.json holds it) each fold's last epoch (chosen by nothing). None when the run has no fold."""
    folds = summary.get("folds") or []
    if folds and all(HONEST_FIELD in f for f in folds):
        return json_number(mean([f[HONEST_FIELD] for f in folds])), f"{HONEST_FIELD} per fold"
    if HONEST_FIELD in summary:
        return json_number(summary[HONEST_FIELD]), f"{HONEST_FIELD} of the run"
    return json_number(mean([(f.get("last_val") or {}).get("sharpe_daily") for f in folds])), "last epoch"


def in_sample_sharpe(summary: Mapping[str, Any]) -> float | None:
    """A run's in-sample figure, the validation daily Sharpe of each fold's epoch chosen on those validation days,
    averaged over its folds: IN_SAMPLE_FIELD, else each fold's in-sample best epoch, else (summaries whose best
    epoch was chosen on the validation days) the best epoch's; None when the run has none."""
    folds = summary.get("folds") or []
    if IN_SAMPLE_FIELD in summary:
        return json_number(summary[IN_SAMPLE_FIELD])
    if folds and all(f.get("in_sample_best_val") for f in folds):
        return json_number(mean([f["in_sample_best_val"].get("sharpe_daily") for f in folds]))
    if summary.get("best_chosen_on") == "validation":
        return json_number(mean([(f.get("val") or {}).get("sharpe_daily") for f in folds]))
    return None


def run_result(runs: Path, market: str, seed: int) -> dict[str, Any]:
    """The figures of one run folder RUNS/MARKET/seed_S (no folds when it wrote no summary.json)."""
    path = runs / market / f"seed_{seed}" / "summary.json"
    summary = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    honest, source = honest_sharpe(summary)
    rows = fold_rows(summary)
    return {"honest": honest, "honest_source": source if rows else None, "in_sample": in_sample_sharpe(summary),
            "folds": rows, "by_epoch": epoch_curve(path.parent / "metrics.jsonl"),
            "by_fold_epoch": fold_epoch_curves(path.parent / "metrics.jsonl"),
            **{k: json_number(mean([r[k] for r in rows])) for k in ("probe", "buy_and_hold", "oracle")}}


def epoch_curve(metrics: Path) -> list[float | None]:
    """Validation daily Sharpe by epoch index, the mean over the run's folds (from metrics.jsonl; empty when
    the run wrote none): whether the out-of-sample figure still rises at the schedule's end (more epochs) or
    peaked before it (fewer)."""
    by_epoch: dict[int, list[float | None]] = {}
    if metrics.is_file():
        for text in metrics.read_text(encoding="utf-8").splitlines():
            line = json.loads(text)
            by_epoch.setdefault(int(line["epoch"]), []).append(line["val"].get("sharpe_daily"))
    return [json_number(mean(by_epoch[e])) for e in sorted(by_epoch)]


def fold_epoch_curves(metrics: Path) -> dict[str, list[float | None]]:
    """Validation daily Sharpe by epoch of each fold ({fold: [epoch 0, 1, ...]}, from metrics.jsonl; empty when
    the run wrote none; a resumed epoch's later line wins): whether a fold learns over its epochs or, started from
    the last fold's network, is best after its first (learner_ablation_h200.md section 50)."""
    curves: dict[int, dict[int, float | None]] = {}
    if metrics.is_file():
        for text in metrics.read_text(encoding="utf-8").splitlines():
            line = json.loads(text)
            curves.setdefault(int(line["fold"]), {})[int(line["epoch"])] = json_number(line["val"].get("sharpe_daily"))
    return {str(k): [c[e] for e in sorted(c)] for k, c in sorted(curves.items())}


def mean_se(values: Sequence[float | None]) -> tuple[float | None, float | None, int]:
    """Mean and standard error (sample std / sqrt(n)) of the finite values, and n; None where undefined."""
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return None, None, 0
    se = statistics.stdev(vals) / math.sqrt(len(vals)) if len(vals) > 1 else None
    return statistics.fmean(vals), se, len(vals)


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, None unless both are known and b > 0 (a ratio to a losing baseline reads backwards)."""
    return a / b if a is not None and b is not None and b > 0 else None


def market_row(runs: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """One market's table row from its runs {seed: run_result + returncode}: the honest and the in-sample
    figures' mean and SE across the seeds whose run finished, the baselines' means and the ratios."""
    ok = [r for r in runs.values() if r.get("returncode") == 0 and r["folds"]]
    honest, honest_se, n = mean_se([r["honest"] for r in ok])
    in_sample, in_sample_se, _ = mean_se([r["in_sample"] for r in ok])
    base = {k: json_number(mean([r[k] for r in ok])) for k in ("probe", "buy_and_hold", "oracle")}
    return {"honest": honest, "honest_se": honest_se, "n": n, "runs": len(runs), "in_sample": in_sample,
            "in_sample_se": in_sample_se, **base, "agent_probe": ratio(honest, base["probe"]),
            "agent_oracle": ratio(honest, base["oracle"]), "honest_sources": [r["honest_source"] for r in ok]}


def group_row(rows: Mapping[str, Mapping[str, Any]], runs: Mapping[str, Mapping[int, Mapping[str, Any]]],
              names: Sequence[str]) -> dict[str, Any]:
    """The markets `names` pooled: per seed the mean honest figure over the markets (seeds finished on all of
    them), then its mean and SE across seeds; the baselines' and the in-sample figure's means over the markets."""
    seeds = set.intersection(*[{s for s, r in runs[n].items() if r.get("returncode") == 0 and r["folds"]}
                               for n in names])
    honest, honest_se, n = mean_se([mean([runs[m][s]["honest"] for m in names]) for s in sorted(seeds)])
    base = {k: json_number(mean([rows[m][k] for m in names])) for k in ("probe", "buy_and_hold", "oracle", "in_sample")}
    return {"markets": list(names), "honest": honest, "honest_se": honest_se, "n": n, **base,
            "agent_probe": ratio(honest, base["probe"]), "agent_oracle": ratio(honest, base["oracle"])}


def epoch_table(markets: Mapping[str, Mapping[str, Any]], runs: Mapping[str, Mapping[int, Mapping[str, Any]]],
                seeds: Sequence[int]) -> list[str]:
    """The table of validation daily Sharpe by epoch: per market the mean over its finished seeds of each run's
    epoch curve, then per role the mean over its markets."""
    curves = {name: [mean([(runs[name][s].get("by_epoch") or [])[e] if e < len(runs[name][s].get("by_epoch") or [])
                           else None for s in seeds if runs[name][s].get("returncode") == 0])
                     for e in range(max((len(runs[name][s].get("by_epoch") or []) for s in seeds), default=0))]
              for name in markets}
    width = max((len(c) for c in curves.values()), default=0)
    if width == 0:
        return []
    lines = ["", "## validation daily Sharpe by epoch (mean over folds, then seeds; the honest checkpoint is the "
             "last epoch unless folds.select_days chose)", "",
             "| market | " + " | ".join(f"epoch {e}" for e in range(width)) + " |", "| --- |" + " ---: |" * width]
    for name, curve in curves.items():
        lines.append(f"| {name} | " + " | ".join(fmt(curve[e]) if e < len(curve) else "" for e in range(width)) + " |")
    for role in ROLES:
        names = [n for n, m in markets.items() if m["role"] == role]
        if names:
            cells = [fmt(mean([curves[n][e] if e < len(curves[n]) else None for n in names])) for e in range(width)]
            lines.append(f"| **{role} markets** | " + " | ".join(cells) + " |")
    return lines


def fold_epoch_table(markets: Mapping[str, Mapping[str, Any]], runs: Mapping[str, Mapping[int, Mapping[str, Any]]],
                     seeds: Sequence[int]) -> list[str]:
    """The table of validation daily Sharpe by fold and epoch: per market and fold the mean over the finished seeds
    of each epoch, and the last epoch minus the first per seed (mean and SE across seeds)."""
    rows = []
    for name in markets:
        ok = [runs[name][s].get("by_fold_epoch") or {} for s in seeds if runs[name][s].get("returncode") == 0]
        for k in sorted({int(f) for curves in ok for f in curves}):
            curves = [c.get(str(k)) or [] for c in ok]
            width = max(len(c) for c in curves)
            cells = [mean([c[e] if e < len(c) else None for c in curves]) for e in range(width)]
            drift, drift_se, _ = mean_se([c[-1] - c[0] for c in curves
                                          if len(c) > 1 and c[0] is not None and c[-1] is not None])
            rows.append((f"{name} fold {k}", cells, drift, drift_se))
    width = max((len(cells) for _, cells, _, _ in rows), default=0)
    if width == 0:
        return []
    lines = ["", "## validation daily Sharpe by fold and epoch (mean over seeds; last - first per seed, its mean and "
             "SE)", "", "| market, fold | " + " | ".join(f"epoch {e}" for e in range(width)) + " | last - first |",
             "| --- |" + " ---: |" * (width + 1)]
    for label, cells, drift, drift_se in rows:
        lines.append(f"| {label} | " + " | ".join(fmt(cells[e]) if e < len(cells) else "" for e in range(width))
                     + f" | {pm(drift, drift_se)} |")
    return lines


def ended(run: Mapping[str, Any]) -> str:
    """How a run ended, for the tables: 'exit N', or 'not run' (its market's store was not built)."""
    return "not run" if run.get("returncode") is None else f"exit {run['returncode']}"


def why(job: Mapping[str, Any]) -> str:
    """': ' and a failed job's last log line (run_jobs' `error`), or '' where it has none."""
    return f": {job['error']}" if job.get("error") else ""


def pm(value: float | None, se: float | None) -> str:
    return f"{fmt(value)} ± {fmt(se, '.2f')}" if se is not None else fmt(value)


def write_tables(out: Path, record: dict[str, Any]) -> int:
    """OUT.md and OUT.json from a record (command, machine, seeds, markets with their runs); prints the table;
    1 if a build or a run failed."""
    markets = record["markets"]
    runs = {name: {int(s): r for s, r in m["runs"].items()} for name, m in markets.items()}
    rows = {name: market_row(runs[name]) for name in markets}
    groups = {role: group_row(rows, runs, names) for role in ROLES
              if (names := [n for n, m in markets.items() if m["role"] == role])}
    sources = [s for r in rows.values() for s in r["honest_sources"]]
    fallback = sources.count("last epoch")
    lines = results_header("Market suite: the honest validation daily Sharpe per market", record["command"],
                           record["machine"])
    how = (f"{record['parallel']} runs at a time on one GPU; suite `{record['suite']}`, runs in `{record['runs']}`; "
           f"all done in {record['wall_s']:.0f} s wall (store builds and compilation included)."
           if record["wall_s"] is not None else f"suite `{record['suite']}`, runs in `{record['runs']}`, tabulated "
           "from run folders trained by earlier calls (--from-runs: the date above is the tabulation's).")
    if n_kept := sum(bool(x.get("kept")) for m in markets.values() for x in m["runs"].values()):
        how += f" {n_kept} runs finished by earlier calls were kept (--keep-finished; no wall times)."
    lines += ["", f"Seeds {record['seeds']}, {how}", "",
              "| market | role | runs ok | honest ± SE | probe | buy-and-hold | oracle | agent / probe | "
              "agent / oracle | in sample ± SE | wall s per run |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, m in markets.items():
        r = rows[name]
        wall = mean([x.get("wall_s") for x in m["runs"].values()])
        lines.append(f"| {name} | {m['role']} | {r['n']}/{r['runs']} | {pm(r['honest'], r['honest_se'])} | "
                     f"{fmt(r['probe'])} | {fmt(r['buy_and_hold'])} | {fmt(r['oracle'])} | "
                     f"{fmt(r['agent_probe'], '.2f')} | {fmt(r['agent_oracle'], '.2f')} | "
                     f"{pm(r['in_sample'], r['in_sample_se'])} | {fmt(wall, '.0f')} |")
    for role, g in groups.items():
        lines.append(f"| **{role} markets pooled** | {role} | {g['n']} seeds | {pm(g['honest'], g['honest_se'])} | "
                     f"{fmt(g['probe'])} | {fmt(g['buy_and_hold'])} | {fmt(g['oracle'])} | "
                     f"{fmt(g['agent_probe'], '.2f')} | {fmt(g['agent_oracle'], '.2f')} | {fmt(g['in_sample'])} | |")
    honest_note = (f"'honest' is summary.json's `{HONEST_FIELD}`" if not fallback else
                   f"'honest' is each fold's last epoch's validation Sharpe (chosen by nothing) in the {fallback} of "
                   f"{len(sources)} runs whose summary.json holds no `{HONEST_FIELD}`, else that field")
    if record.get("rescore"):
        honest_note = (f"'honest' is `fox evaluate` of each fold's checkpoint (best.h5) with `--set "
                       f"{' '.join(record['rescore'])}` on the fold's validation days, the runs of "
                       f"`{record['rescored_from']}` scored again (the in-sample figures and the epoch table are "
                       "the training's)")
    lines += ["", f"{honest_note}, averaged over the run's folds; ± is the standard error across seeds (sample std "
              "/ sqrt(n)). Probe (ridge on the agent's observation, training days only), buy-and-hold and the oracle "
              "are scored on the same validation days. A ratio to a baseline at or below 0 is n/a. 'in sample' is "
              "the validation Sharpe of each fold's epoch with the best validation Sharpe, chosen on the days that "
              "score it: optimistic, shown only beside the honest figure (n/a where a run's summary.json has none).",
              "Seen markets may choose a setting; held-out markets are only reported. A pooled row averages the "
              "markets per seed (seeds finished on all of them), then takes mean and SE across seeds.", "",
              "## honest figure per seed", "",
              "| market | " + " | ".join(f"seed {s}" for s in record["seeds"]) + " |",
              "| --- |" + " ---: |" * len(record["seeds"])]
    for name in markets:
        cells = [fmt(runs[name][s]["honest"]) if runs[name][s].get("returncode") == 0 else ended(runs[name][s])
                 for s in record["seeds"]]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += epoch_table(markets, runs, record["seeds"])
    lines += fold_epoch_table(markets, runs, record["seeds"])
    failed = [f"{n} store build (exit {m['build']['returncode']}{why(m['build'])})" for n, m in markets.items()
              if m["build"].get("returncode", 0) != 0]
    failed += [f"{n} seed {s} ({ended(r)}{why(r)})" for n in markets for s, r in runs[n].items()
               if r.get("returncode") != 0]
    if failed:
        lines += ["", f"Failed: {'; '.join(failed)}; logs beside the run folders and the stores."]
    atomic_write_text(with_ext(out, ".md"), "\n".join(lines) + "\n")
    atomic_write_text(with_ext(out, ".json"), json.dumps({**record, "table": rows, "pooled": groups}, indent=1))
    print("\n".join(lines))
    return 1 if failed else 0


def finished_runs(markets: Sequence[Market], runs: Path, seeds: Sequence[int]
                  ) -> tuple[dict[str, dict[str, Any]], dict[tuple[str, int], dict[str, Any]]]:
    """--from-runs: (builds, done) as a training pass returns them, from what RUNS holds: every store counted as
    built, a run with a summary.json as exit 0 and one without as not run, no wall times."""
    builds = {m.name: {"reused": True} for m in markets}
    done = {(m.name, s): {"returncode": 0 if (runs / m.name / f"seed_{s}" / "summary.json").is_file() else None,
                          "wall_s": None} for m in markets for s in seeds}
    return builds, done


def set_aside_unfinished(markets: Sequence[Market], runs: Path, seeds: Sequence[int]) -> set[tuple[str, int]]:
    """--keep-finished: the (market, seed) runs whose folder holds a summary.json, kept and not trained again; the
    folder and log of every other run that left one (failed or cut short) moved aside to seed_S.failed-K (K the
    first free number), so that run trains again from the start and nothing it wrote is lost."""
    kept = set()
    for m in markets:
        for s in seeds:
            folder, log = runs / m.name / f"seed_{s}", runs / m.name / f"seed_{s}.log"
            if (folder / "summary.json").is_file():
                kept.add((m.name, s))
                continue
            if not folder.exists() and not log.exists():
                continue
            k = 1
            while any((runs / m.name / f"seed_{s}.failed-{k}{ext}").exists() for ext in ("", ".log")):
                k += 1
            for path, aside in ((folder, f"seed_{s}.failed-{k}"), (log, f"seed_{s}.failed-{k}.log")):
                if path.exists():
                    path.rename(runs / m.name / aside)
    return kept


def tabulate(earlier: Path, out: Path, runs: Path | None, rescore: Sequence[str] = (), parallel: int = 1,
             command: str = "") -> int:
    """Rewrite the tables of an earlier OUT.json from its run folders (or those in `runs`); with `rescore`, from
    `fox evaluate` of their fold checkpoints with those --set settings (module header)."""
    record = json.loads(earlier.read_text(encoding="utf-8"))
    if runs is not None:
        record["runs"] = str(runs)
    for name, m in record["markets"].items():
        m["runs"] = {s: {**r, **run_result(Path(record["runs"]), name, int(s))} for s, r in m["runs"].items()}
    if rescore:
        rescore_runs(record, rescore, parallel, out.with_name(out.name + "_logs"))
        record |= {"command": command, "rescored_from": str(earlier), "rescore": list(rescore)}
    return write_tables(out, record)


def with_ext(out: Path, ext: str) -> Path:
    """`out` with `ext` appended: --out names no suffix, and a name such as suite_margin0.01 keeps its dot."""
    return out.with_name(out.name + ext)


def evaluate_command(checkpoint: Path, sets: Sequence[str]) -> list[str]:
    """The `fox evaluate` of one fold checkpoint with `sets`, printing JSON."""
    return [sys.executable, "-m", "fox_numba", "evaluate", str(checkpoint), *set_options(sets), "--json"]


def evaluate_json(log: Path) -> dict[str, Any]:
    """The JSON `fox evaluate --json` printed into `log` (its progress lines on stderr come first)."""
    text = log.read_text(encoding="utf-8")
    return json.loads(text[text.index("\n{") + 1 :] if not text.startswith("{") else text)


def rescore_runs(record: dict[str, Any], sets: Sequence[str], parallel: int, logs: Path) -> None:
    """Each finished run's fold figures ('agent') and honest figure (their mean) from `fox evaluate` of the fold's
    best.h5 with `sets`, `parallel` at a time; a run whose evaluation failed keeps no honest figure and says why."""
    runs = Path(record["runs"])
    for name, m in record["markets"].items():  # best.h5 is the honest checkpoint unless chosen on its own days
        for s, r in m["runs"].items():
            path = runs / name / f"seed_{s}" / "summary.json"
            if r.get("returncode") == 0 and json.loads(path.read_text(encoding="utf-8")).get(
                    "best_chosen_on") == "validation":
                r |= {"returncode": 1, "honest": None,
                      "error": f"{path}: its best.h5 was chosen on the validation days (in sample)"}
    jobs = [Job((name, s, int(row["fold"])),
                evaluate_command(runs / name / f"seed_{s}" / f"fold_{int(row['fold']):02d}" / "best.h5", sets),
                logs / f"{name}_seed_{s}_fold_{int(row['fold']):02d}.log")
            for name, m in record["markets"].items() for s, r in m["runs"].items()
            if r.get("returncode") == 0 for row in r["folds"]]  # fmt: skip
    done = run_jobs(jobs, parallel)
    for name, m in record["markets"].items():
        for s, r in m["runs"].items():
            keys = [(name, s, int(row["fold"])) for row in r["folds"]] if r.get("returncode") == 0 else []
            if not keys:
                continue
            failed = [k for k in keys if done[k]["returncode"] != 0]
            if failed:
                r |= {"returncode": done[failed[0]]["returncode"], "honest": None,
                      "error": f"fox evaluate of fold {failed[0][2]}: {done[failed[0]].get('error', '')}"}
                continue
            for row, job in zip(r["folds"], jobs_of(jobs, keys), strict=True):
                row["agent"] = json_number(evaluate_json(job.log)["agent_sharpe_daily"])
            r["honest"] = json_number(mean([row["agent"] for row in r["folds"]]))
            r["honest_source"] = "fox evaluate --set " + " ".join(sets)


def jobs_of(jobs: Sequence[Job], keys: Sequence[tuple[str, str, int]]) -> list[Job]:
    """The jobs of `keys`, in that order."""
    by_key = {job.key: job for job in jobs}
    return [by_key[k] for k in keys]


PACKED = ("summary.json", "metrics.jsonl", "epochs.log")
"""The files of a run folder that `pack_runs` keeps (not the checkpoints, the report or the logs of every step)."""


def pack_runs(runs: Path, markets: Sequence[str], seeds: Sequence[int], archive: Path) -> int:
    """Write RUNS/MARKET/seed_S/{PACKED} of every market and seed into the gzip tar `archive` (top folder: its name
    without .tgz), deterministically; the number of files packed. Written to a temporary name, then renamed."""
    top = archive.name.removesuffix(".tgz")
    files = sorted(runs / m / f"seed_{s}" / name for m in markets for s in seeds for name in PACKED
                   if (runs / m / f"seed_{s}" / name).is_file())
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in files:
            info = tarfile.TarInfo(f"{top}/{path.relative_to(runs).as_posix()}")
            data = path.read_bytes()
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    tmp = archive.with_name(archive.name + ".tmp")
    with tmp.open("wb") as fh, gzip.GzipFile(fileobj=fh, mode="wb", mtime=0, filename="") as gz:
        gz.write(buffer.getvalue())
    tmp.replace(archive)
    return len(files)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--out", type=Path, required=True, help="results path without suffix (.md and .json)")
    parser.add_argument("--suite", type=Path, default=SUITE, help="the suite file")
    parser.add_argument("--markets", help="comma-separated market names (default: every market of the suite)")
    parser.add_argument("--runs", type=Path, help="folder of the run folders, one sub-folder per market "
                        "(default runs/suite; with --tabulate, the one recorded)")
    parser.add_argument("--stores", type=Path, default=default_store_path().parent / "suite",
                        help="folder of the markets' stores (built when absent or stale)")
    parser.add_argument("--parallel", type=int, default=1, help="runs at a time (they share the GPU)")
    parser.add_argument("--tabulate", type=Path, help="an earlier OUT.json: re-tabulate its runs, train nothing")
    parser.add_argument("--from-runs", action="store_true", help="tabulate the run folders --runs holds, train "
                        "nothing (a run with a summary.json finished; the extra arguments record their command)")
    parser.add_argument("--rescore", nargs="+", default=[], metavar="SECTION.FIELD=VALUE",
                        help="with --tabulate: score the runs' fold checkpoints again with `fox evaluate --set` of "
                        "these (settings that change no training), --parallel at a time (module header)")
    parser.add_argument("--keep-finished", action="store_true", help="train only the runs whose folder holds no "
                        "summary.json: the finished ones are kept and tabulated, the folder and log of a failed or "
                        "cut-short one are moved aside to seed_S.failed-K and it trains again from the start (the "
                        "same numbers as an uninterrupted run)")
    parser.add_argument("--pack", type=Path, metavar="RUNS_NAME.tgz",
                        help="also pack the runs' summary.json, metrics.jsonl and epochs.log into this archive")
    parser.add_argument("--mps", action="store_true", help=MPS_HELP + " (the training runs and --rescore's)")
    args = parser.parse_args(own)
    if args.mps and (problem := mps_problem()) is not None:
        parser.error(problem)
    if args.rescore and args.tabulate is None:
        parser.error("--rescore needs --tabulate (the earlier suite whose run folders it scores again)")
    if args.keep_finished and (args.tabulate is not None or args.from_runs):
        parser.error("--keep-finished trains the runs left to train: not with --tabulate or --from-runs")
    if args.pack is not None and args.pack.suffix != ".tgz":
        parser.error(f"--pack {args.pack}: the archive's name must end in .tgz (runs_NAME.tgz)")
    try:
        if args.tabulate is not None:
            with mps_for_children(args.mps and bool(args.rescore)):
                code = tabulate(args.tabulate, args.out, args.runs, args.rescore, args.parallel,
                                "python3 tools/suite.py " + " ".join(argv))
            if args.pack is not None:
                earlier = json.loads(args.tabulate.read_text(encoding="utf-8"))
                pack_runs(args.runs or Path(earlier["runs"]), list(earlier["markets"]),
                          [int(x) for x in earlier["seeds"]], args.pack)
            return code
        check_extra(extra)
        suite = load_suite(args.suite)
        markets = pick(suite, args.markets)
    except ConfigError as e:
        print(f"suite: {e}", file=sys.stderr)
        return 2
    runs = (args.runs or ROOT / "runs" / "suite").resolve()
    stores = args.stores.resolve()
    start = time.perf_counter()
    if args.from_runs:
        builds, done = finished_runs(markets, runs, args.seeds)
    else:
        builds = build_stores(markets, stores, args.parallel)
        ready = [m for m in markets if builds[m.name].get("returncode", 0) == 0]
        kept = set_aside_unfinished(ready, runs, args.seeds) if args.keep_finished else set()
        jobs = [Job((m.name, seed), market_command(m, suite, extra, store_path(stores, m), seed, runs),
                    runs / m.name / f"seed_{seed}.log") for seed in args.seeds for m in ready
                if (m.name, seed) not in kept]
        with mps_for_children(args.mps):
            done = run_jobs(jobs, args.parallel)
        done.update({key: {"returncode": 0, "wall_s": None, "kept": True} for key in kept})
    record = {
        "command": "python3 tools/suite.py " + " ".join(argv),
        "wall_s": None if args.from_runs else time.perf_counter() - start,
        "machine": {"date_utc": datetime.now(UTC).strftime("%Y-%m-%d %H:%M"), **({} if args.from_runs else machine())},
        "parallel": args.parallel, "seeds": args.seeds, "suite": str(suite.path), "runs": str(runs),
        "stores": str(stores), "extra": extra,
        "markets": {m.name: {
            "role": m.role, "definition": str(m.definition_path), "seed": m.definition.market.seed,
            "digest": m.definition.digest(),
            "store": str(store_path(stores, m)), "set": [*suite.plan, *m.overrides, *m.derived()],
            "build": builds[m.name],
            "runs": {str(s): {**done.get((m.name, s), {"returncode": None, "wall_s": None}),
                              **run_result(runs, m.name, s)} for s in args.seeds},
        } for m in markets},
    }
    code = write_tables(args.out, record)
    if args.pack is not None:
        pack_runs(runs, [m.name for m in markets], args.seeds, args.pack)
    return code


if __name__ == "__main__":
    sys.exit(main())
