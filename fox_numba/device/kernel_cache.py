"""The on-disk cache of compiled kernels: a run loads the PTX and cubins an earlier run of the same code compiled.

Compiling the package's kernels takes most of a cold `fox train`'s first epoch: on an H100 a default run took 55 s
without the cache, 67 s while filling it (its first epoch 31 s against 25: the cubins are built and written) and
35.5 s with it filled (tools/results/train_cache_h100.md). Every process after the first of the same code on the
same GPU model loads the kernels. `register` (device/registry.py) calls `enable_disk_cache` on every kernel.

Where: `$FOX_KERNEL_CACHE/kernels-<digest>`, else `$XDG_CACHE_HOME/fox_numba/kernels-<digest>` (default
`~/.cache/fox_numba/...`); `FOX_KERNEL_CACHE=0` turns the cache off. `<digest>` hashes every source file of the
package and the numba-cuda version, so a change anywhere in the package (a constant a kernel imports from
another module, which numba's own key does not see) starts a new folder; numba keys each entry on the kernel's
bytecode, its closure's values, the signature and the GPU's compute capability. Creating a folder deletes all but
the KEEP most recently modified of the others (about 12 MB each for a default run's kernels). A folder that cannot
be created or written turns the cache off for the process (it compiles as before). Not cached: a kernel that links
external code (numba-cuda cannot serialise one; the package's tensor-core GEMMs use inline PTX and link nothing),
and everything under the simulator. numba-cuda's key takes in the pickled closure of a kernel built in a factory,
so whatever that reaches must pickle the same in every process: `stable_identity` fixes the identities that numba
draws per process (intrinsics, numba's jit functions), without which 14 kernels, the default run's GEMMs and action
selection among them, compiled again in every run.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
from pathlib import Path
from typing import Any

import numba_cuda

from fox_numba.device.runtime import SIMULATOR

ENV = "FOX_KERNEL_CACHE"
"""Environment variable: the cache's parent folder, or 0 for no cache."""

PACKAGE = Path(__file__).resolve().parent.parent

KEEP = 3
"""Folders of other versions of the package kept beside the current one (the most recently modified)."""


def source_digest(package: Path = PACKAGE) -> str:
    """sha256 over the package's .py files (relative path and content, in path order) and numba-cuda's version."""
    h = hashlib.sha256(numba_cuda.__version__.encode())
    for path in sorted(package.rglob("*.py")):
        h.update(str(path.relative_to(package)).encode() + b"\0")
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def cache_parent(environ: dict[str, str] | os._Environ[str] = os.environ) -> Path | None:
    """The folder that holds the kernels-<digest> folders, or None when FOX_KERNEL_CACHE is 0."""
    setting = environ.get(ENV, "")
    if setting == "0":
        return None
    if setting:
        return Path(setting).expanduser()
    xdg = environ.get("XDG_CACHE_HOME", "")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "fox_numba"


@functools.cache
def cache_folder() -> Path | None:
    """This code's cache folder, created; None when the cache is off or the folder is not writable."""
    parent = cache_parent()
    if parent is None:
        return None
    folder = parent / f"kernels-{source_digest()}"
    try:
        new = not folder.is_dir()
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    if new:
        prune(parent, folder)
    return folder if os.access(folder, os.W_OK | os.X_OK) else None


def prune(parent: Path, current: Path, keep: int = KEEP) -> list[Path]:
    """Delete the kernels-* folders in `parent` other than `current` and the `keep` most recently modified of the
    others; returns those deleted (a folder another process still writes is rebuilt by it)."""
    others = [p for p in parent.glob("kernels-*") if p.is_dir() and p != current]
    others.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    for old in others[keep:]:
        shutil.rmtree(old, ignore_errors=True)
    return others[keep:]


def enable_disk_cache(kernel: Any) -> None:
    """Turn on numba-cuda's file cache for `kernel` in `cache_folder()`; a no-op under the simulator, for a
    kernel that links external code, or when the cache is off."""
    if not hasattr(kernel, "enable_caching") or kernel.targetoptions.get("link"):
        return
    folder = cache_folder()
    if folder is None:
        return
    from numba.cuda.core import config  # the CUDA target's config, read by the cache's locator once, here

    saved = config.CACHE_DIR
    config.CACHE_DIR = str(folder)
    try:
        kernel.enable_caching()
    finally:
        config.CACHE_DIR = saved



def stable_identity(obj: Any, name: str) -> Any:
    """`obj` (a numba intrinsic or dispatcher) with a fixed identity, `name`; returns it. numba-cuda's cache keys a
    kernel on its closure's pickled contents, which take in the functions a device function defined in a factory
    calls; intrinsics and numba's own dispatchers pickle with an identity drawn per process (a uuid), so a kernel
    that reached one that way missed the cache in every new process and compiled again (3-4 s each for the
    tensor-core GEMMs and the action-select kernels: tests/device/test_kernel_cache.py checks every registered
    kernel's key in two processes). A no-op under the simulator, or where the identity was drawn already."""
    if not SIMULATOR:
        try:
            obj._set_uuid(f"fox_numba:{name}")
        except AssertionError:  # drawn before this call: that object keeps missing the cache, as before
            pass
    return obj
