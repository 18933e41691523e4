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

import sys
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from fox_numba.config import PRESETS, FoxConfig, load_config
from fox_numba.errors import FoxError, NotAvailableError

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
    typer.Option("--config", "-c", help="TOML file applied over the preset (tables named for the sections, e.g. \\[learner] lr = 3e-4)."),
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set", "-s", metavar="SECTION.FIELD=VALUE", help="Override one field, e.g. --set learner.lr=3e-4 (repeatable; applied last)."
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
    extra = [f'market.store="{store}"'] if store is not None else []
    return load_config(preset, config, extra + list(overrides or []))


def not_available(command: str, lands_with: str) -> NoReturn:
    raise NotAvailableError(
        f"fox {command} is not available yet: it lands with {lands_with}. "
        "Nothing was run and nothing was written."
    )


@data_app.command("synth")
def data_synth(
    out: Annotated[Path, typer.Option("--out", "-o", help="Store file to write (HDF5).")] = Path(
        "data/cache/default_market.h5"
    ),
    seed: Annotated[int | None, typer.Option(help="Seed (default: the one in the market definition).")] = None,
    days: Annotated[int | None, typer.Option(help="Trading days to generate (default: the definition's).")] = None,
) -> None:
    """Generate the synthetic ES-like market (bars, MBP-10, trades) with a planted order-flow signal."""
    not_available("data synth", "the market data layer")


@data_app.command("import")
def data_import(
    paths: Annotated[list[Path], typer.Argument(help="Files or folders of daily files to import.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Store file to write or extend (HDF5).")],
) -> None:
    """Import Databento DBN (mbp-10, trades, ohlcv-1m) or LOBSTER files into a market store."""
    not_available("data import", "the market data layer")


@data_app.command("inspect")
def data_inspect(
    store: Annotated[Path, typer.Argument(help="Market store (HDF5) to summarise.")],
) -> None:
    """Summarise a store per trading day: rows, time range, spread, depth, trades, gaps."""
    not_available("data inspect", "the market data layer")


@app.command()
def collect(
    preset: PresetOpt = "default",
    config: ConfigOpt = None,
    set_: SetOpt = None,
    store: StoreOpt = None,
) -> None:
    """Step the vectorised environments with the current policy and fill the GPU experience buffer."""
    resolve_config(preset, config, set_, store)
    not_available("collect", "the environment stage")


@app.command()
def train(
    preset: PresetOpt = "default",
    config: ConfigOpt = None,
    set_: SetOpt = None,
    store: StoreOpt = None,
) -> None:
    """Walk-forward training: per fold, collect, learn and validate; keep the best checkpoint by Sharpe."""
    resolve_config(preset, config, set_, store)
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
    resolve_config(preset, config, set_, store)
    not_available("evaluate", "the learner and evaluation stage")


@app.command()
def profile(
    preset: PresetOpt = "default",
    config: ConfigOpt = None,
    set_: SetOpt = None,
    store: StoreOpt = None,
) -> None:
    """Time each stage and kernel on the GPU (warm-up, then a timed window) and write a results file."""
    resolve_config(preset, config, set_, store)
    not_available("profile", "the HEALTH_DIAG and profiling stage")


def main() -> None:
    """Entry point of `fox`: a `FoxError` becomes a one-line message and its exit code, no traceback."""
    try:
        app()
    except FoxError as e:
        typer.echo(f"fox: error: {e}", err=True)
        sys.exit(e.exit_code)
