"""The `fox` command line: one command per stage, progress on stderr, results in files and on stdout.

    fox data synth|import|inspect   build or import a market store, look inside one
    fox collect                     run the environments and fill an experience buffer
    fox train                       walk-forward training on a market store
    fox evaluate                    validation backtest of a checkpoint
    fox profile                     time every stage and kernel on the GPU

Errors in the input (a missing file, a bad field, a crossed book) are printed as one line naming the
file, field and row, with exit code 1; a command whose machinery has not landed yet exits with 2.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console

from fox_numba.config import PRESETS, FoxConfig, load_config, toml_literal
from fox_numba.errors import FoxError, Interrupted, NotAvailableError
from fox_numba.market.calendar import CALENDARS
from fox_numba.market.default import default_definition_path, default_store_path
from fox_numba.market.importer import FORMATS, import_market
from fox_numba.market.inspect import summarize, summary_table
from fox_numba.market.select import MarketSelection, select_market
from fox_numba.market.synthetic import STEPS_PER_DAY, build_store, sidecar_paths
from fox_numba.market.synthetic_definition import load_definition
from fox_numba.progress import progress_bar
from fox_numba.walkforward.folds import make_folds

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


def prepare_market(cfg: FoxConfig) -> MarketSelection:
    """The checked market of a stage: MBP-10 and trades are mandatory, so a store without them stops the
    command here with a message saying what to import."""
    with progress_bar(f"market store: {cfg.market.store}") as progress:
        selection = select_market(cfg.market, progress)
    for note in selection.notes:
        typer.echo(f"fox: note: {note}", err=True)
    return selection


def not_available(command: str, lands_with: str) -> NoReturn:
    raise NotAvailableError(
        f"fox {command} is not available yet: it lands with {lands_with}. "
        "The market store is ready; nothing else was run or written."
    )


@data_app.command("synth")
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
    size_mb = target.stat().st_size / 1e6
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


@data_app.command("import")
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
) -> None:
    """Import Databento DBN (mbp-10, trades, ohlcv-1m) or LOBSTER files into a market store."""
    if fmt not in FORMATS:
        raise typer.BadParameter(f"{fmt!r} is not one of {', '.join(FORMATS)}", param_hint="--format")
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
        result = import_market(paths, out, fmt=fmt, instrument=instrument, overrides=overrides, progress=progress)
    for line in result.lines():
        typer.echo(line)


@data_app.command("inspect")
def data_inspect(
    store: Annotated[Path, typer.Argument(help="Market store (HDF5) to summarise.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON instead of a table.")] = False,
) -> None:
    """Summarise a store per trading day: rows, time range, spread, depth, trades, gaps."""
    summary = summarize(store)
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
    else:
        Console(width=None if sys.stdout.isatty() else 200).print(summary_table(summary))


@app.command()
def collect(
    preset: PresetOpt = "default",
    config: ConfigOpt = None,
    set_: SetOpt = None,
    store: StoreOpt = None,
) -> None:
    """Step the vectorised environments with the current policy and fill the GPU experience buffer."""
    prepare_market(resolve_config(preset, config, set_, store))
    not_available("collect", "the environment stage")


@app.command()
def train(
    preset: PresetOpt = "default",
    config: ConfigOpt = None,
    set_: SetOpt = None,
    store: StoreOpt = None,
) -> None:
    """Walk-forward training: per fold, collect, learn and validate; keep the best checkpoint by Sharpe."""
    cfg = resolve_config(preset, config, set_, store)
    make_folds(cfg.folds, prepare_market(cfg).days)  # too few days for the folds stops here
    not_available("train", "the walk-forward training stage")


@app.command()
def evaluate(
    checkpoint: Annotated[Path, typer.Argument(help="Checkpoint file written by `fox train`.")],
    preset: PresetOpt = "default",
    config: ConfigOpt = None,
    set_: SetOpt = None,
    store: StoreOpt = None,
) -> None:
    """Chunked validation backtest of a checkpoint with the deterministic policy (Sharpe, PnL, trades)."""
    prepare_market(resolve_config(preset, config, set_, store))
    not_available("evaluate", "the learner and evaluation stage")


@app.command()
def profile(
    preset: PresetOpt = "default",
    config: ConfigOpt = None,
    set_: SetOpt = None,
    store: StoreOpt = None,
) -> None:
    """Time each stage and kernel on the GPU (warm-up, then a timed window) and write a results file."""
    prepare_market(resolve_config(preset, config, set_, store))
    not_available("profile", "the HEALTH_DIAG and profiling stage")


def _interrupt(signum: int, frame: object) -> NoReturn:
    """Signal handler: ignore further SIGINT/SIGTERM while the interrupted work cleans up, then stop it."""
    for sig in INTERRUPTS:
        signal.signal(sig, signal.SIG_IGN)
    raise Interrupted(signum)


INTERRUPTS = (signal.SIGINT, signal.SIGTERM)


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
