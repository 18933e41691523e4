"""Errors that reach the user: each names where the problem is, so it can be fixed at the source.

Bad input is rejected at the edge (importers, the store, config loading, checkpoint loading) with one of
these, never deep inside a kernel. The CLI prints the message and exits non-zero without a traceback.
"""

from __future__ import annotations

import signal
from pathlib import Path

INTERRUPTS = (signal.SIGINT, signal.SIGTERM)
"""The signals that stop a command as `Interrupted`."""


class FoxError(Exception):
    """Base class for errors the CLI reports as a one-line message (exit code 1)."""

    exit_code = 1


class InputError(FoxError):
    """Bad input data: names the file, the group or field, and the row where it was found."""

    def __init__(
        self,
        path: str | Path,
        message: str,
        *,
        group: str | None = None,
        field: str | None = None,
        row: int | None = None,
    ) -> None:
        self.path = str(path)
        self.group = group
        self.field = field
        self.row = row
        self.reason = message
        where = [self.path]
        if group is not None:
            where.append(f"group {group}")
        if field is not None:
            where.append(f"field {field}")
        if row is not None:
            where.append(f"row {row}")
        super().__init__(f"{', '.join(where)}: {message}")


class ConfigError(FoxError):
    """A config file or override that does not fit the config tree."""


class MissingDataError(FoxError):
    """A required input (MBP-10, trades) is absent; the message says how to import it."""


class LayoutMismatchError(FoxError):
    """A checkpoint or snapshot written with another layout (ISV table, parameter shapes)."""


class OutputError(FoxError):
    """A file that cannot be written (a read-only folder, a full disk, a folder where a file should be);
    names the target, never the temporary file it was being written under."""


class Interrupted(BaseException):  # noqa: N818 (it is a signal, not an error)
    """SIGINT or SIGTERM during a command (raised by the CLI's signal handlers).

    A BaseException, like KeyboardInterrupt, so that `except Exception` does not swallow it; atomic writes
    that it stops list their targets in `unchanged` for the message the CLI prints.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
        self.unchanged: list[Path] = []

