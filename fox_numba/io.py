"""Atomic file writes: a file is written under a temporary name beside its target, then renamed.

An interrupted write (crash, Ctrl-C, bad input found half-way) leaves the previous file intact and no
partial file under the target name. The temporary name is `.{name}.tmp-{pid}`: a process killed outright
(SIGKILL, a power cut) cannot remove its own, so each write first removes the temporary files of the
same target left by processes that no longer run. Errors in writing name the target, never the
temporary file (`OutputError`), and an `Interrupted` write lists the target as unchanged for the
message the command line prints.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from fox_numba.errors import Interrupted, OutputError

TEMP_INFIX = ".tmp-"


def temporary_path(target: Path, pid: int | None = None) -> Path:
    """Where process `pid` (default: this one) writes `target` before renaming it."""
    return target.with_name(f".{target.name}{TEMP_INFIX}{os.getpid() if pid is None else pid}")


def remove_stale_temporaries(target: Path) -> list[Path]:
    """Delete the temporary files of `target` whose writing process is gone; return them."""
    removed = []
    prefix = f".{target.name}{TEMP_INFIX}"
    for path in target.parent.glob(f"{prefix}*"):
        pid = path.name[len(prefix) :]
        if pid.isdigit() and int(pid) != os.getpid() and not running_process(int(pid)):
            with contextlib.suppress(OSError):
                path.unlink()
                removed.append(path)
    return removed


@contextlib.contextmanager
def atomic_path(target: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside `target`; on success rename it onto `target`, else delete it.

    A target that is a folder, or a place that cannot be written, is an `OutputError` naming the target.
    """
    target = Path(target)
    if target.is_dir():
        raise OutputError(f"{target}: is a folder; name a file to write")
    tmp = temporary_path(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(target)
        tmp.open("wb").close()
    except OSError as e:
        raise OutputError(f"{target}: cannot write here ({_reason(e, target, tmp)})") from None
    try:
        yield tmp
        os.replace(tmp, target)
    except Interrupted as e:
        e.unchanged.append(target)
        raise
    except OSError as e:
        if e.filename not in (str(tmp), tmp) and str(tmp) not in str(e):
            raise
        raise OutputError(f"{target}: cannot write it ({_reason(e, target, tmp)})") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def atomic_write_text(target: str | Path, text: str) -> Path:
    """Write `text` (UTF-8) to `target` atomically and return the path."""
    with atomic_path(target) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(target)


def running_process(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _reason(e: OSError, target: Path, tmp: Path) -> str:
    """The operating system's words for `e`; a file other than the target or its temporary file is named."""
    text = e.strerror if e.strerror else str(e)
    if e.filename is not None and str(e.filename) not in (str(tmp), str(target)):
        text = f"{text}: {e.filename}"
    return text.replace(str(tmp), str(target))


def generated_doc_main(argv: list[str] | None, path: Path, text: str, what: str) -> int:
    """The `python -m <module> [--write]` entry point of a generated table: print `text`, or with --write
    replace `path` with it (atomically). `what` names the table in --help."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(description=f"Print or write the generated {what}.")
    parser.add_argument("--write", action="store_true", help=f"write {path.name} ({path.parent.name}/)")
    if parser.parse_args(argv).write:
        atomic_write_text(path, text)
    else:
        sys.stdout.write(text)
    return 0
