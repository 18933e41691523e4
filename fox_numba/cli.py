"""The `fox` command line: one command per stage, progress on stderr, results in files and on stdout.

    fox data synth|import|inspect   build or import a market store, look inside one
    fox collect                     run the environments and fill an experience buffer
    fox train                       walk-forward training on a market store
    fox evaluate                    validation backtest of a checkpoint
    fox profile                     time every stage and kernel on the GPU
    fox sweep                       seeds x configs of `fox train` as Ray tasks, one table per config

Errors in the input (a missing file, a bad field, a crossed book) are printed as one line naming the
file, field and row, with exit code 1.
"""

from __future__ import annotations

import inspect
import json
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from fox_numba.config import (
    PRESETS,
    FoxConfig,
    check_preset,
    load_config,
    load_run_config,
    parse_override,
    toml_literal,
)
from fox_numba.errors import INTERRUPTS, ConfigError, FoxError, Interrupted
from fox_numba.market.calendar import CALENDARS
from fox_numba.market.default import default_definition_path, default_store_path
from fox_numba.market.importer import FORMATS, import_market
from fox_numba.market.inspect import summarize, summary_table
from fox_numba.market.select import MarketSelection, select_market
from fox_numba.market.store import COMPRESSIONS, DEFAULT_COMPRESSION, store_bytes
from fox_numba.market.synthetic import STEPS_PER_DAY, build_store, sidecar_paths
from fox_numba.market.synthetic_definition import load_definition
from fox_numba.progress import progress_bar
from fox_numba.walkforward.folds import make_folds

Command = Callable[..., None]


def unwrapped(doc: str) -> str:
    """A docstring with each paragraph's line breaks turned into spaces (a paragraph with an indented line, such
    as an example, is kept as written): rich prints a help text's line breaks as they are, so the docstring's
    wrapping at 120 columns would break sentences mid-line in any other terminal."""
    paragraphs = inspect.cleandoc(doc).split("\n\n")
    return "\n\n".join(p if any(line[:1].isspace() for line in p.splitlines()) else " ".join(p.split("\n"))
                       for p in paragraphs)


def command(group: typer.Typer, name: str | None = None) -> Callable[[Command], Command]:
    """`group.command(name)` with the function's docstring `unwrapped` as its help."""

    def register(fn: Command) -> Command:
        return group.command(name, help=unwrapped(fn.__doc__ or ""))(fn)

    return register


app = typer.Typer(
    name="fox",
    no_args_is_help=True,
    add_completion=False,
    help="Train and evaluate a distributional, branching-action DQN that trades futures from order-book "
    "data, walk-forward, on a GPU (Numba-CUDA).",
)
data_app = typer.Typer(
    no_args_is_help=True,
    help="Build, import and inspect HDF5 market stores (1-minute bars, MBP-10 book, trades).",
)
app.add_typer(data_app, name="data")
cache_app = typer.Typer(no_args_is_help=True, help="The on-disk cache of compiled kernels (device/kernel_cache.py).")
app.add_typer(cache_app, name="cache")

PresetOpt = Annotated[
    str,
    typer.Option(
        "--preset", help=f"Starting config: {', '.join(PRESETS)} ('smoke' is sized for the CPU simulator)."
    ),
]
ConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-c",
        help="TOML file applied over the preset (tables named for the sections, e.g. \\[learner] lr = 3e-4).",
    ),
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        "-s",
        metavar="SECTION.FIELD=VALUE",
        help="Override one field, e.g. --set learner.lr=3e-4 (repeatable; applied last).",
    ),
]
StoreOpt = Annotated[
    str | None,
    typer.Option("--store", help="Market store (HDF5) to use; 'default' is the embedded synthetic ES market."),
]


def resolve_config(
    preset: str, config: Path | None, overrides: list[str] | None, store: str | None = None
) -> FoxConfig:
    """Preset, then TOML file, then `--store`, then `--set` overrides (the last word wins)."""
    extra = [f"market.store={toml_literal(store)}"] if store is not None else []
    return load_config(preset, config, extra + list(overrides or []))


def prepare_market(cfg: FoxConfig, *, defer: bool = False) -> MarketSelection:
    """The checked market of a stage: MBP-10 and trades are mandatory, so a store without them stops the
    command here with a message saying what to import. `defer`: the stage builds the days' features next, whose
    one full read of each day validates it (market/select.py)."""
    with progress_bar(f"market store: {cfg.market.store}") as progress:
        selection = select_market(cfg.market, progress, defer=defer)
    for note in selection.notes:
        typer.echo(f"fox: note: {note}", err=True)
    return selection


@command(data_app, "synth")
def data_synth(
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="Store file to write (HDF5; default: the default market's cache, data/cache/default_market.h5, "
            "or under $FOX_DATA_DIR).",
        ),
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Seed (default: the one in the market definition).")] = None,
    days: Annotated[int | None, typer.Option(help="Trading days to generate (default: the definition's).")] = None,
    definition: Annotated[
        Path | None, typer.Option(help="Market definition, TOML (default: data/default_market.toml).")
    ] = None,
) -> None:
    """Generate the synthetic ES-like market (bars, MBP-10, trades) with a planted order-flow signal.

    Beside the store: STORE.oracle.json (the oracle's Sharpe after costs), STORE.latent.npz (latent truth).
    """
    spec = load_definition(definition or default_definition_path()).with_overrides(seed=seed, days=days)
    target = out or default_store_path()
    start = time.perf_counter()
    with progress_bar(f"synthesising {target}", total=spec.market.days * STEPS_PER_DAY) as progress:
        market = build_store(spec, target, progress=progress)
    oracle = market.oracle
    rows = sum(day.mbp10.ts_event.size for day in market.days)
    trades = sum(day.trades.ts_event.size for day in market.days)
    bars = sum(day.bars.ts_event.size for day in market.days)
    size_mb = store_bytes(target) / 1e6
    for line in (
        f"store      {target} ({size_mb:.1f} MB, {time.perf_counter() - start:.1f} s)",
        f"days       {len(market.days)} ({market.days[0].day} to {market.days[-1].day}), seed {spec.market.seed}",
        f"bars       {bars:,}",
        f"book rows  {rows:,}",
        f"trades     {trades:,}",
        f"oracle     Sharpe {oracle.sharpe:.2f} (annualised), mean daily PnL ${oracle.mean_daily_pnl:,.2f} per "
        f"contract, horizon {oracle.horizon_minutes} min, half spread + ${oracle.commission:.2f} per side",
        f"sidecars   {', '.join(p.name for p in sidecar_paths(target))}",
    ):
        typer.echo(line)


@command(data_app, "import")
def data_import(
    paths: Annotated[list[Path], typer.Argument(help="Files or folders of daily files to import.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Store file to write or extend (HDF5).")],
    fmt: Annotated[
        str, typer.Option("--format", "-f", help="Input format: auto (from the file names), databento or lobster.")
    ] = "auto",
    instrument: Annotated[
        str | None,
        typer.Option(
            help="Databento instrument to import, by raw symbol (ESU4) or instrument_id "
            "(default: the one with the most records)."
        ),
    ] = None,
    symbol: Annotated[
        str | None, typer.Option(help="Store symbol (default: the contract root, e.g. ES, or the LOBSTER ticker).")
    ] = None,
    tick_size: Annotated[
        float | None, typer.Option(help="Tick size in price units (default: ES 0.25, stocks 0.01).")
    ] = None,
    point_value: Annotated[
        float | None, typer.Option(help="Dollars per price unit per contract (default: ES 50, stocks 1).")
    ] = None,
    timezone: Annotated[str | None, typer.Option(help="Exchange time zone (default America/New_York).")] = None,
    session_open: Annotated[str | None, typer.Option(help="Regular session open, HH:MM local (default 09:30).")] = None,
    session_close: Annotated[
        str | None, typer.Option(help="Regular session close, HH:MM local (default 16:00).")
    ] = None,
    day_roll: Annotated[
        str | None,
        typer.Option(
            help="Local time at which a trading day ends and the next begins (default: futures 17:00, the CME "
            "Globex close; stocks 24:00)."
        ),
    ] = None,
    day_open: Annotated[
        str | None,
        typer.Option(
            help="Local time, the evening before, at which a trading day's full session opens (default: futures "
            "18:00, the Globex reopen; stocks 24:00)."
        ),
    ] = None,
    calendar: Annotated[
        str | None,
        typer.Option(help=f"Exchange calendar of trading days: {', '.join(CALENDARS)} (default us: NYSE/CME holidays)."),
    ] = None,
    use_ray: Annotated[
        bool,
        typer.Option("--ray", help="Stage Databento files as Ray tasks, one per file, on a local cluster of this "
                     "machine's CPUs (or the one at --address); needs the ray extra."),
    ] = False,
    address: Annotated[
        str | None,
        typer.Option(help="Ray cluster to join (implies --ray): auto, HOST:PORT or ray://HOST:PORT; its nodes must "
                     "reach the files and the store's folder under the same paths."),
    ] = None,
    compression: Annotated[
        str,
        typer.Option(help="How the days written are compressed: lzf (the default), gzip (level 1) or none. Disk per "
                     "1 M MBP-10 rows and 250 k trades (generated data): lzf 54 MB, gzip 41 MB, none 339 MB; none "
                     "imports 10-25% faster, gzip ~10% slower. Every store reads the same whatever each day's choice."),
    ] = DEFAULT_COMPRESSION,
    workers: Annotated[
        int,
        typer.Option(help="Processes of this machine staging Databento files side by side, a file each (0: one per "
                     "core, at most 8, for 8 files or more; 1: this process alone; not with --ray). The store is the "
                     "same bit for bit whatever the count.", min=0),
    ] = 0,
) -> None:
    """Import Databento DBN (mbp-10, trades, ohlcv-1m) or LOBSTER files into a market store."""
    if fmt not in FORMATS:
        raise typer.BadParameter(f"{fmt!r} is not one of {', '.join(FORMATS)}", param_hint="--format")
    if compression not in COMPRESSIONS:
        raise typer.BadParameter(f"{compression!r} is not one of {', '.join(COMPRESSIONS)}", param_hint="--compression")
    given = {
        "symbol": symbol,
        "tick_size": tick_size,
        "point_value": point_value,
        "timezone": timezone,
        "session_open": session_open,
        "session_close": session_close,
        "day_roll": day_roll,
        "day_open": day_open,
        "calendar": calendar,
    }
    overrides = {k: v for k, v in given.items() if v is not None}
    with progress_bar(f"importing into {out}") as progress:
        result = import_market(
            paths, out, fmt=fmt, instrument=instrument, overrides=overrides, progress=progress, ray=use_ray,
            address=address, compression=compression, workers=workers,
        )  # fmt: skip
    for line in result.lines():
        typer.echo(line)


@command(data_app, "inspect")
def data_inspect(
    store: Annotated[Path, typer.Argument(help="Market store (HDF5) to summarise.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON instead of a table.")] = False,
    workers: Annotated[int, typer.Option(
        help="Processes reading days side by side (0: one per core, at most 8, for stores of 8 days or more; 1: this "
             "process alone). The summary is the same whatever the count.", min=0)] = 0,
) -> None:
    """Summarise a store per trading day: rows, time range, spread, depth, trades, gaps.

    Every day is read and validated, a chunk at a time."""
    with progress_bar(f"inspecting {store}") as progress:
        summary = summarize(store, progress, workers=workers)
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
    else:
        Console(width=None if sys.stdout.isatty() else 200).print(summary_table(summary))


def require_backend() -> None:
    """Refuse, in one line, a stage that would launch kernels on a GPU the machine lacks (accelerator.gpu_missing)."""
    from fox_numba.accelerator import gpu_missing

    if (problem := gpu_missing()) is not None:
        raise FoxError(problem)


def backend_line(preset: str | None = None) -> str:
    """Where the kernels run (and the preset a stage chose), in one line for stderr; refuses a missing GPU."""
    from fox_numba.device.runtime import SIMULATOR

    require_backend()

    if SIMULATOR:
        where = "no CUDA GPU: kernels run on the CPU under numba's CUDA simulator (slow; timings mean nothing)"
    else:
        from fox_numba.device.kernel_cache import cache_folder

        folder = cache_folder()
        where = "CUDA GPU found: kernels run on the GPU" + (
            f"; compiled kernels cached in {folder} (the first run of a version compiles them)" if folder
            else "; no kernel cache (FOX_KERNEL_CACHE=0 or its folder is not writable): every run compiles")
    return where + (f"; preset {preset}" if preset else "")


def stage_config(
    preset: str | None, config: Path | None, overrides: list[str] | None, store: str | None
) -> tuple[FoxConfig, str]:
    """(config, preset name) of a stage command: without --preset, `default` on a GPU and `smoke` under the
    simulator; a GPU preset asked for explicitly without a GPU is refused (it would run for days on a CPU)."""
    from fox_numba.device.runtime import SIMULATOR

    if preset is None:
        preset = "smoke" if SIMULATOR else "default"
    check_preset(preset)  # an unknown name is named as such before the machine is judged
    if SIMULATOR and preset != "smoke":
        raise ConfigError(
            f"--preset {preset} is sized for a GPU and this machine has none; use --preset smoke (or run on a GPU)"
        )
    return resolve_config(preset, config, overrides, store), preset


StagePresetOpt = Annotated[
    str | None,
    typer.Option(
        "--preset",
        help=f"Starting config: {', '.join(PRESETS)} (default: 'default' on a GPU, 'smoke' without one, which runs "
        "under the CUDA simulator).",
    ),
]


def print_table(title: str, values: dict[str, float], as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(values, indent=2))
        return
    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in values.items():
        table.add_row(name, f"{value:,.6g}")
    Console(width=None if sys.stdout.isatty() else 200).print(table)


@command(app)
def collect(
    preset: StagePresetOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    store: StoreOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the metrics as JSON instead of a table.")] = False,
) -> None:
    """Run one epoch of collection on fold 0 with a freshly initialised network and print the rollout metrics.

    env.collect_steps steps of env.n_envs environments; the metrics: reward and its split, active fraction,
    turnover, limit fill rate, mean |position|, episode returns."""
    from fox_numba.agent.fold_market import FoldMarket
    from fox_numba.agent.trainer import Trainer
    from fox_numba.walkforward.driver import load_features

    cfg, chosen = stage_config(preset, config, set_, store)
    selection = prepare_market(cfg, defer=True)
    fold = make_folds(cfg.folds, selection.days)[0]
    typer.echo(backend_line(chosen), err=True)
    with progress_bar("collect: building features and the fold 0 market") as progress:
        features = load_features(cfg, selection)
        progress("collect: compiling and stepping the environments")
        trainer = Trainer(cfg)
        trainer.bind_fold(FoldMarket.build(features, fold, cfg.features, cfg.env), fold.index)
        start = time.perf_counter()
        metrics = trainer.collect()
        seconds = time.perf_counter() - start
    steps = cfg.env.n_envs * cfg.env.collect_steps
    metrics = {**metrics, "seconds (compilation included)": seconds, "env_steps_per_second": steps / seconds}
    print_table(f"fox collect: {fold.describe()}, {cfg.env.n_envs} environments x {cfg.env.collect_steps} steps",
                metrics, as_json)


@command(app)
def train(
    preset: StagePresetOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    store: StoreOpt = None,
    resume: Annotated[
        Path | None,
        typer.Option(help="Continue the interrupted run in this run folder (its config.toml is used; other "
                     "config options are refused)."),
    ] = None,
    verbose: Annotated[
        bool,
        typer.Option("--verbose", "-v", help="Print the long lines too: every fold reset entry and the HEALTH_DIAG "
                     "lines (always in the run folder's train.log and health_diag.log)."),
    ] = False,
) -> None:
    """Walk-forward training on a market store: per fold, per epoch collect -> train -> validate.

    Each fold's checkpoint (best.h5) is chosen without its validation days: the last epoch, or the best on
    held-out selection days with --set folds.select_days=N. Writes runs/<name>/ (config, folds,
    metrics.jsonl, checkpoints, summary.json, train.log, health_diag.log) and prints one line per fold and
    one per epoch."""
    from fox_numba.kernels.warm_cache import Prewarm
    from fox_numba.walkforward.driver import EPOCH_PHASES, load_features, train_run
    from fox_numba.walkforward.report import headline
    from fox_numba.walkforward.run_folder import RunFolder

    if resume is not None:
        if preset or config or set_ or store:
            raise ConfigError("--resume continues a run with its own config.toml; drop --preset/--config/--set/--store")
        cfg, chosen = load_run_config(RunFolder.config_path(resume)), f"of {resume}"
    else:
        cfg, chosen = stage_config(preset, config, set_, store)
    with Prewarm(log=lambda m: typer.echo(m, err=True)) as prewarm:  # a cold kernel cache fills meanwhile
        selection = prepare_market(cfg, defer=True)
        make_folds(cfg.folds, selection.days)  # too few days for the folds stops here, before any work
        with progress_bar("market features") as progress:  # validates the days prepare_market left unchecked
            features = load_features(cfg, selection)
        prewarm.ready()
    typer.echo(backend_line(chosen), err=True)
    start = time.perf_counter()
    phases = len(make_folds(cfg.folds, selection.days)) * cfg.learner.epochs * len(EPOCH_PHASES)
    with progress_bar("training", total=phases) as progress:
        run_dir, summary = train_run(cfg, selection, features=features, resume=resume, log=typer.echo, verbose=verbose,
                                     progress=progress)
    typer.echo(f"run {run_dir} done in {time.perf_counter() - start:.0f} s: {headline(summary)}")


@command(app)
def evaluate(
    checkpoint: Annotated[Path, typer.Argument(help="Checkpoint written by `fox train` (runs/NAME/fold_KK/best.h5).")],
    set_: SetOpt = None,
    store: StoreOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the results as JSON instead of a table.")] = False,
) -> None:
    """Backtest a checkpoint with the deterministic policy (argmax E[Q]) on every selected day of a store.

    The normalisation and risk unit are those of the fold it was trained on. Without --store or a --set of a
    market.* or folds.* field, the days are the run's own store's validation days of the checkpoint's fold, so
    `--set evaluation.hold_margin=0.02` scores another margin on the days the run scored."""
    from fox_numba.walkforward.evaluate import evaluate_checkpoint

    require_backend()
    results = evaluate_checkpoint(checkpoint, store=store, overrides=set_ or [], log=lambda m: typer.echo(m, err=True))
    print_table(f"fox evaluate {checkpoint}", results, as_json)


@command(app)
def report(
    run: Annotated[Path, typer.Argument(help="Run folder written by `fox train` (runs/NAME).")],
) -> None:
    """Write PNG plots and a one-page Markdown report of a run into RUN/report/.

    Validation equity per fold against flat, buy-and-hold, the probe and the oracle; Sharpe per epoch; reward
    split, Q scale, gradient norm / clip / lr / tau / warm-up factor from HEALTH_DIAG; action shares.
    `fox train` writes it at the end of every run. A fold whose best_validation.npz is missing is named on
    stderr and in report.md."""
    from fox_numba.walkforward.report import write_report

    typer.echo(f"report {write_report(run, log=lambda m: typer.echo(m, err=True))}")


@command(app)
def profile(
    preset: StagePresetOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    store: StoreOpt = None,
    epochs: Annotated[int, typer.Option(help="Epochs in the timed window (after one warm-up epoch).")] = 2,
    steps: Annotated[int, typer.Option(help="Eager steps per stage for the per-kernel table.")] = 10,
) -> None:
    """Time one epoch's stages (collect, train, evaluate) and every kernel on fold 0, after a warm-up epoch.

    Per stage and kernel: calls, mean time, share, launches per step, graph vs eager, environment and
    gradient steps per second, TFLOP/s of the GEMMs and estimated bandwidth of the other kernels against the
    device's copy bandwidth. Prints the tables and writes profile.json / profile.md into a run folder
    (run.out_dir/profile-<time>)."""
    from fox_numba.kernels.warm_cache import Prewarm
    from fox_numba.walkforward.profile import profile as run_profile

    cfg, chosen = stage_config(preset, config, set_, store)
    with Prewarm(log=lambda m: typer.echo(m, err=True)) as prewarm:
        selection = prepare_market(cfg, defer=True)
        prewarm.ready()
    typer.echo(backend_line(chosen), err=True)
    out_dir = Path(cfg.run.out_dir) / (cfg.run.name or time.strftime("profile-%Y%m%d-%H%M%S"))
    result = run_profile(cfg, selection, epochs=epochs, steps=steps, out_dir=out_dir,
                         log=lambda m: typer.echo(m, err=True), command="fox " + " ".join(sys.argv[1:]))  # fmt: skip
    from fox_numba.walkforward.profile import markdown

    typer.echo(markdown(result))
    typer.echo(f"profile written to {out_dir / 'profile.json'}", err=True)


@command(app)
def sweep(
    spec: Annotated[Path, typer.Argument(help="Sweep spec, TOML: \\[sweep] seeds and \\[grid] values (format above).")],
    preset: StagePresetOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    store: StoreOpt = None,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Sweep folder (default: sweeps/NAME).")
    ] = None,
    name: Annotated[str | None, typer.Option(help="Sweep name (default: the spec file's name without .toml).")] = None,
    address: Annotated[
        str | None,
        typer.Option(help="Ray cluster to join: auto, HOST:PORT or ray://HOST:PORT (default: start a local one with "
                     "this machine's CPUs and GPUs)."),
    ] = None,
    per_gpu: Annotated[
        int,
        typer.Option("--per-gpu", min=1, help="Trials sharing each GPU at once (each is granted 1/N of one). Short "
                     "runs leave most of a GPU idle: 8 default runs at once took 2.59x one run's wall on an H100, "
                     "1.59x with --mps (tools/results/many_runs_*_h100.md). Mind the GPU memory of large configs."),
    ] = 1,
    mps: Annotated[
        bool,
        typer.Option("--mps", help="Run a local cluster's trials under a private CUDA MPS daemon, so that the "
                     "kernels of the trials sharing a GPU run at once instead of taking turns (the same numbers "
                     "either way). Needs nvidia-cuda-mps-control; not with --address."),
    ] = False,
) -> None:
    """Train every combination of config values times every seed and tabulate validation Sharpe per config.

    One `fox train` per trial, as a Ray task (1/N of a GPU each with --per-gpu N; one CPU under the simulator).

    A spec: every key of \\[grid] is a config field; every combination of
    the values is a config, trained once per seed.
        \\[sweep]
        seeds = [0, 1, 2]
        \\[grid]
        "learner.lr" = [3e-4, 1e-3]
        env = { explore_spread = [0.25, 0.5] }

    Trials are c00-seed0, c00-seed1, ... (configs in product order, the last
    key varying fastest). Each writes its run folder in SWEEP/runs/TRIAL/ as
    `fox train` does, its output in SWEEP/logs/. A failed trial is reported
    with the tail of its stderr and the others go on. Rerunning the command
    skips finished trials and resumes interrupted ones from their checkpoints
    (`fox train --resume`). At the end: a table per config on stdout (Sharpe
    mean and spread over seeds and folds, oracle fraction, wall time;
    HEALTH_DIAG across seeds) and SWEEP/summary.json; exit code 1 if a trial
    failed. Needs the ray extra: pip install -e ".\\[ray]".
    """
    from fox_numba.device.mps import mps_for_children, mps_problem
    from fox_numba.device.runtime import SIMULATOR
    from fox_numba.sweep.aggregate import diag_table, results_table
    from fox_numba.sweep.driver import BaseOptions, run_sweep
    from fox_numba.sweep.folder import DEFAULT_ROOT, SweepFolder
    from fox_numba.sweep.runner import import_ray
    from fox_numba.sweep.spec import SWEEP_OWNED, load_spec

    if mps and (address is not None or SIMULATOR):  # options that cannot work, refused before the extra is asked for
        raise ConfigError("--mps starts a daemon for this machine's GPU: "
                          + ("with --address, start one on each node instead" if address else "there is none here "
                             "(the CUDA simulator is on)"))
    import_ray()  # a missing extra stops here, before a store is built
    if mps and (problem := mps_problem()) is not None:
        raise ConfigError(problem)
    plan = load_spec(spec)
    for text in set_ or []:
        if (key := parse_override(text)[0]) in SWEEP_OWNED:
            raise ConfigError(f"--set {key}: the sweep sets it for every trial (seeds go in the spec's [sweep] seeds)")
    if address is None:  # a local cluster: the trials run here, with the preset `fox train` would choose here
        cfg, chosen = stage_config(preset, config, set_, store)
    else:  # the workers choose their own backend; only the names and types are checked here
        cfg, chosen = resolve_config(preset or "default", config, set_, store), preset or "of each worker"
    selection = prepare_market(cfg)
    folder = SweepFolder(out or Path(DEFAULT_ROOT) / (name or spec.stem))
    base = BaseOptions(preset, config, tuple(set_ or []), selection.path)
    log = lambda m: typer.echo(m, err=True)
    log(f"sweep {folder.path}: {len(plan.trials())} trials, store {selection.path}; "
        + (backend_line(chosen) if address is None else f"Ray cluster {address}, preset {chosen}"))
    with mps_for_children(mps):
        summary = run_sweep(plan, base, folder, address=address, simulator=SIMULATOR, log=log, per_gpu=per_gpu)
    console = Console(width=None if sys.stdout.isatty() else 200)
    console.print(results_table(summary))
    console.print(diag_table(summary))
    failed = [t for t in summary["trials"] if not t["finished"]]
    for t in failed:
        log(f"sweep: {t['id']} failed: {t['error']}")
    typer.echo(f"sweep {folder.path}: {len(summary['trials']) - len(failed)} of {len(summary['trials'])} trials "
               f"finished; summary {folder.path / 'summary.json'}")
    if failed:
        raise typer.Exit(1)


@command(cache_app, "warm")
def cache_warm(
    workers: Annotated[int | None, typer.Option(help="Processes compiling at once (default: the cores less one).",
                                                min=1)] = None,
) -> None:
    """Compile every kernel of the package into the kernel cache, in parallel processes, so that the next
    `fox train` (or any stage) loads them instead of compiling each at its first launch.

    Each process compiles a share of the registered kernels for this machine's GPU. The cache folder is
    $FOX_KERNEL_CACHE/kernels-<digest>, else ~/.cache/fox_numba/kernels-<digest>; the digest changes with the
    package's code. It compiles kernels that a given config never launches too, so it pays where cores are many:
    `fox train` and `fox profile` do the same by themselves, while they load their market, when they find the
    folder cold on a machine of 8 cores or more (FOX_COMPILE_WORKERS=N sets the processes, 0 turns that off)."""
    from fox_numba.kernels.warm_cache import warm

    done = warm(workers)
    typer.echo(f"compiled {done.kernels} kernels ({done.signatures} signatures) into {done.folder} in "
               f"{done.seconds:.1f} s with {done.workers} processes")
    for failure in done.failures:
        typer.echo(f"fox cache warm: {failure}", err=True)
    if done.failures:
        raise typer.Exit(1)


def _interrupt(signum: int, frame: object) -> NoReturn:
    """Signal handler: ignore further SIGINT/SIGTERM while the interrupted work cleans up, then stop it."""
    for sig in INTERRUPTS:
        signal.signal(sig, signal.SIG_IGN)
    raise Interrupted(signum)


def main() -> None:
    """Entry point of `fox`: a `FoxError` becomes a one-line message and its exit code, no traceback;
    so does an operating-system error (an unwritable output folder, a full disk), which names the path.
    SIGINT and SIGTERM stop the command as `Interrupted`: temporary files are removed, and the message
    names the outputs left unchanged (exit code 128 + the signal number)."""
    for sig in INTERRUPTS:
        signal.signal(sig, _interrupt)
    try:
        app()
    except Interrupted as e:
        kept = "".join(f"; {path} unchanged" for path in e.unchanged)
        typer.echo(f"fox: interrupted{kept}", err=True)
        sys.exit(128 + e.signum)
    except FoxError as e:
        typer.echo(f"fox: error: {e}", err=True)
        sys.exit(e.exit_code)
    except OSError as e:
        typer.echo(f"fox: error: {e}", err=True)
        sys.exit(1)
