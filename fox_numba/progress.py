"""Progress on stderr for long work, as a callback the library code calls with a status message.

Library functions take `progress: Callable[[str], None] | None` and know nothing of the display; the
command line wraps them in `progress_bar(...)`, which shows a bar (known total) or a spinner (unknown)
on stderr, so stdout stays machine-readable. When stderr is not a terminal (a log file, CI) nothing is drawn.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn


@contextlib.contextmanager
def progress_bar(description: str, total: int | None = None) -> Iterator[Callable[..., None]]:
    """Yield a callback `(message, advance=1)`: each call shows its message and, with a `total`, advances the
    bar by `advance` steps (0: a new message within the same step)."""
    if total is None:
        columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    else:
        columns = (TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
    console = Console(stderr=True)
    with Progress(*columns, console=console, transient=True, disable=not console.is_terminal) as bar:
        task = bar.add_task(description, total=total)
        def update(message: str, advance: int = 1) -> None:
            bar.update(task, advance=0 if total is None else advance, description=message)

        yield update
