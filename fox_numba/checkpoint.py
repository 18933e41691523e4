"""Checkpoints: named host arrays, the trainer's host state and the layouts they assume, in one HDF5 file.

A checkpoint holds whatever the caller passes as named arrays (parameters, target, Adam m and v, the ISV
bus, RNG states, the replay buffer and its cursor...), the StateResetRegistry's host state (JSON), the
resolved config (TOML text), the caller's metadata (JSON: fold, epoch, ...), and the fingerprints of the
layouts it was written with: the ISV slot table's (always), the layout of its arrays (name, shape, dtype),
and any the caller names (`fingerprints={"params": ParamLayout.fingerprint}`).

Loading refuses, before any array is used and naming both fingerprints, a checkpoint written with
another ISV table (the slots a network was trained against moved), another array layout than
`expected_layout`, or another value of a fingerprint in `expected_fingerprints`. A file that is not a
checkpoint of this format, or whose arrays do not match its own recorded layout, is an InputError naming it.

Files are written atomically (`fox_numba.io.atomic_path`: a temporary name beside the target, fsynced,
then renamed; the folder is fsynced after the rename): an interrupted save, even by kill -9, leaves the
previous checkpoint intact, and at worst a stale `.NAME.tmp-PID` file, which no loader reads and
`remove_stale_temporaries` deletes.

File layout: root attribute `header` (JSON: format, fingerprints, layout, meta), `registry` (JSON),
`config` (TOML text); one dataset per array under `/arrays`. Arrays reach and leave the device through
`fox_numba.device.staging.Stager` (download before `save_checkpoint`, upload after `load_checkpoint`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from fox_numba.device.isv import ISV_FINGERPRINT, ISV_TOTAL_DIM
from fox_numba.errors import InputError, LayoutMismatchError
from fox_numba.io import atomic_path

FORMAT = "fox_numba.checkpoint/2 (hdf5)"
_HEADER_KEYS = ("isv_fingerprint", "isv_total_dim", "layout", "layout_fingerprint", "fingerprints", "meta")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*\Z")
_ARRAYS = "arrays"
TEMP_GLOB = ".*.tmp-*"  # fox_numba.io.atomic_path's temporary names

Layout = dict[str, tuple[tuple[int, ...], str]]


def _dtype_text(dtype: np.dtype) -> str:
    """'<f4' for plain dtypes, the field list for records (byte order and fields both matter)."""
    return str(np.lib.format.dtype_to_descr(np.dtype(dtype)))


def array_layout(arrays: Mapping[str, np.ndarray]) -> Layout:
    """{name: (shape, dtype text)} of the arrays, sorted by name."""
    return {n: (tuple(int(d) for d in np.shape(a)), _dtype_text(np.asarray(a).dtype)) for n, a in sorted(arrays.items())}


def layout_fingerprint(layout: Layout) -> str:
    """sha256 (first 16 hex digits) of every array's name, shape and dtype."""
    text = "\n".join(f"{name}:{list(shape)}:{dtype}" for name, (shape, dtype) in sorted(layout.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Checkpoint:
    """A loaded checkpoint: its arrays, the caller's metadata, the registry state, the config, the layouts."""

    path: Path
    arrays: dict[str, np.ndarray]
    meta: dict[str, Any]
    isv_fingerprint: str
    layout: Layout
    registry_state: dict[str, Any] | None = None
    config_toml: str | None = None
    fingerprints: dict[str, str] = field(default_factory=dict)


def fsync_dir(path: Path) -> None:
    """Make a rename inside `path` durable (a no-op where folders cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def save_checkpoint(
    path: str | Path,
    arrays: Mapping[str, np.ndarray],
    meta: Mapping[str, Any] | None = None,
    *,
    registry_state: Mapping[str, Any] | None = None,
    config_toml: str | None = None,
    fingerprints: Mapping[str, str] | None = None,
) -> Path:
    """Write a checkpoint to `path` atomically; returns the path. `meta` and `registry_state` must be
    JSON-serialisable (strict JSON: no NaN)."""
    path = Path(path)
    for name in arrays:
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"checkpoint array name {name!r} is empty or reserved (letters, digits, _ . -)")
    host = {k: np.require(np.asarray(v), requirements="C") for k, v in arrays.items()}  # keeps 0-d arrays 0-d
    layout = array_layout(host)
    header = {
        "format": FORMAT,
        "isv_fingerprint": ISV_FINGERPRINT,
        "isv_total_dim": ISV_TOTAL_DIM,
        "layout": {name: [list(shape), dtype] for name, (shape, dtype) in layout.items()},
        "layout_fingerprint": layout_fingerprint(layout),
        "fingerprints": dict(fingerprints or {}),
        "meta": dict(meta or {}),
    }
    header_text = json.dumps(header, sort_keys=True, allow_nan=False)
    registry_text = json.dumps(dict(registry_state), sort_keys=True, allow_nan=False) if registry_state is not None else ""
    with atomic_path(path) as tmp:
        with h5py.File(tmp, "w") as f:
            f.attrs["header"] = header_text
            f.attrs["registry"] = registry_text
            f.attrs["config"] = config_toml if config_toml is not None else ""
            group = f.create_group(_ARRAYS)
            for name, a in host.items():
                group.create_dataset(name, data=a)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
    fsync_dir(path.parent)
    return path


def require_checkpoint(path: Path) -> None:
    """An InputError naming `path` when no checkpoint file is there (before anything is read beside it)."""
    if not path.is_file():
        raise InputError(path, "checkpoint not found")


def _read(path: Path) -> tuple[dict[str, Any], dict[str, np.ndarray], str, str]:
    require_checkpoint(path)
    try:
        with h5py.File(path, "r") as f:
            if "header" not in f.attrs or _ARRAYS not in f:
                raise InputError(path, "not a fox_numba checkpoint (no header attribute or arrays group)")
            header = json.loads(str(f.attrs["header"]))
            registry = str(f.attrs.get("registry", ""))
            config = str(f.attrs.get("config", ""))
            arrays = {k: np.asarray(ds[()]) for k, ds in f[_ARRAYS].items()}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise InputError(path, f"not a readable checkpoint ({type(e).__name__}: {e})") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        found = header.get("format") if isinstance(header, dict) else None
        raise InputError(path, f"checkpoint format {found!r}, this build reads {FORMAT!r}")
    missing = [key for key in _HEADER_KEYS if key not in header]
    if missing:
        raise InputError(path, f"the checkpoint header lacks {missing} (damaged file)", field="header")
    return header, arrays, registry, config


def _mismatch(path: Path, what: str, stored: str, expected: str, detail: str = "") -> LayoutMismatchError:
    return LayoutMismatchError(f"{path}: {what} {stored} differs from this build's {expected}" + detail)


def load_checkpoint(
    path: str | Path, *, expected_layout: Layout | None = None, expected_fingerprints: Mapping[str, str] | None = None
) -> Checkpoint:
    """Read a checkpoint, refusing another ISV layout, another array layout than `expected_layout`, or another
    value of any fingerprint in `expected_fingerprints` (each refusal names both fingerprints)."""
    path = Path(path)
    header, arrays, registry, config = _read(path)
    stored = header["isv_fingerprint"]
    if stored != ISV_FINGERPRINT:
        raise LayoutMismatchError(
            f"{path}: written with ISV layout fingerprint {stored} ({header['isv_total_dim']} slots), this "
            f"build has {ISV_FINGERPRINT} ({ISV_TOTAL_DIM} slots); the ISV slot table changed since "
            "(fox_numba/device/ISV_SLOTS.md): retrain, or load it with the build that wrote it"
        )
    layout: Layout = {name: (tuple(shape), dtype) for name, (shape, dtype) in header["layout"].items()}
    if array_layout(arrays) != layout:
        raise InputError(path, "arrays do not match the layout recorded in the checkpoint (damaged file)")
    if expected_layout is not None and expected_layout != layout:
        names = sorted(set(layout) | set(expected_layout))
        diff = [
            f"{n}: checkpoint {layout.get(n, 'absent')}, expected {expected_layout.get(n, 'absent')}"
            for n in names
            if layout.get(n) != expected_layout.get(n)
        ]
        raise _mismatch(path, "array layout", layout_fingerprint(layout), layout_fingerprint(expected_layout),
                        ": " + "; ".join(diff))
    fingerprints = dict(header["fingerprints"])
    for name, want in (expected_fingerprints or {}).items():
        got = fingerprints.get(name)
        if got != want:
            raise _mismatch(path, f"{name} layout fingerprint", str(got), want,
                            f" (it was written for another {name} layout, e.g. other network.* sizes or parts: "
                            "train anew, or load it with the config that wrote it)")
    try:
        registry_state = json.loads(registry) if registry else None
    except ValueError:
        raise InputError(path, "the registry state is not JSON (damaged file)", field="registry") from None
    return Checkpoint(path, arrays, header["meta"], stored, layout, registry_state, config or None, fingerprints)


def remove_stale_temporaries(folder: str | Path) -> list[Path]:
    """Delete the temporary files interrupted atomic writes left under `folder` (recursively); returns them.
    Call it only while no other process writes there (the run folder's lock)."""
    removed = []
    for p in sorted(Path(folder).rglob(TEMP_GLOB)):
        if p.is_file():
            p.unlink()
            removed.append(p)
    return removed
