"""numba's on-disk cache of compiled functions, with fallbacks when numba finds no writable place for it.

`@numba.njit(cache=True)` picks its cache folder when the function is defined, at import: the source's
`__pycache__`, else the user-wide cache (`~/.cache/numba`), else it raises "cannot cache function". A
system install run by another user, or a read-only container, has neither, and every command (even
`fox --help`, whose imports define the functions) died there. `cached_njit` takes numba's choice when
there is one; else it points numba (`NUMBA_CACHE_DIR`) at a private folder in the system's temporary
directory, created mode 0700 and used only when this user owns it and nobody else may write to it
(compiled code is loaded from it); else it compiles without a cache (each process compiles afresh).
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from numba import njit
from numba.core import config

FALLBACK_NAME = "fox_numba-numba-cache-{uid}"
"""Folder, in the system's temporary directory, used when numba's own cache places are not writable."""


def cached_njit(**options: Any) -> Callable[[Callable], Any]:
    """`numba.njit(cache=True, **options)` that falls back to a private cache folder, then to no cache."""

    def decorate(func: Callable) -> Any:
        try:
            return njit(cache=True, **options)(func)
        except RuntimeError as e:
            if "cannot cache" not in str(e):
                raise
        if use_fallback_folder() is not None:
            try:
                return njit(cache=True, **options)(func)
            except RuntimeError as e:
                if "cannot cache" not in str(e):
                    raise
        return njit(**options)(func)

    return decorate


def use_fallback_folder() -> Path | None:
    """Point numba's cache at the private fallback folder (made if needed); None if it cannot be used."""
    try:
        folder = Path(tempfile.gettempdir()) / FALLBACK_NAME.format(uid=os.getuid())
        folder.mkdir(mode=0o700, exist_ok=True)
        info = folder.stat(follow_symlinks=False)
    except OSError:  # no usable temporary directory either (gettempdir raises FileNotFoundError)
        return None
    private = stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o022
    if not private:
        return None
    config.CACHE_DIR = str(folder)
    os.environ["NUMBA_CACHE_DIR"] = str(folder)  # child processes start from the same choice
    return folder
