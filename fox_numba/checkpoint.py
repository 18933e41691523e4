"""Checkpoints: named host arrays and JSON metadata in one .npz file, with the layouts they assume.

Every checkpoint stores the ISV layout fingerprint of the build that wrote it and the layout of its
arrays (name, shape, dtype, plus a fingerprint of that list). Loading refuses, before any array is used,
a checkpoint written with another ISV table (the slots a network was trained against moved) or, when
the caller says what it expects, another array layout. Files are written atomically (`fox_numba.io`):
an interrupted save leaves the previous checkpoint intact.

Arrays come from and go to the device through `fox_numba.device.staging.Stager` (download before
`save_checkpoint`, upload after `load_checkpoint`).
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fox_numba.device.isv import ISV_FINGERPRINT, ISV_TOTAL_DIM
from fox_numba.errors import InputError, LayoutMismatchError
from fox_numba.io import atomic_path

FORMAT = "fox_numba.checkpoint/1"
_META_KEY = "__meta__"
_SAVEZ_ARGUMENTS = ("file", "allow_pickle")  # keyword names np.savez keeps for itself
_HEADER_KEYS = ("isv_fingerprint", "isv_total_dim", "layout", "layout_fingerprint", "meta")

Layout = dict[str, tuple[tuple[int, ...], str]]


def _dtype_text(dtype: np.dtype) -> str:
    """'<f4' for plain dtypes, the field list for records (byte order and fields both matter)."""
    return str(np.lib.format.dtype_to_descr(np.dtype(dtype)))


def array_layout(arrays: Mapping[str, np.ndarray]) -> Layout:
    """{name: (shape, dtype text)} of the arrays, sorted by name."""
    return {n: (tuple(int(d) for d in a.shape), _dtype_text(a.dtype)) for n, a in sorted(arrays.items())}


def layout_fingerprint(layout: Layout) -> str:
    """sha256 (first 16 hex digits) of every array's name, shape and dtype."""
    text = "\n".join(f"{name}:{list(shape)}:{dtype}" for name, (shape, dtype) in sorted(layout.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Checkpoint:
    """A loaded checkpoint: its arrays, the caller's metadata and the layouts it was written with."""

    path: Path
    arrays: dict[str, np.ndarray]
    meta: dict[str, Any]
    isv_fingerprint: str
    layout: Layout


def save_checkpoint(
    path: str | Path, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any] | None = None
) -> Path:
    """Write `arrays` and JSON-serialisable `meta` to `path` atomically; returns the path."""
    path = Path(path)
    for name in arrays:
        if not name or name.startswith("__") or name in _SAVEZ_ARGUMENTS:
            raise ValueError(f"checkpoint array name {name!r} is empty or reserved")
    layout = array_layout(arrays)
    header = {
        "format": FORMAT,
        "isv_fingerprint": ISV_FINGERPRINT,
        "isv_total_dim": ISV_TOTAL_DIM,
        "layout": {name: [list(shape), dtype] for name, (shape, dtype) in layout.items()},
        "layout_fingerprint": layout_fingerprint(layout),
        "meta": dict(meta or {}),
    }
    text = json.dumps(header, sort_keys=True)
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.savez(f, **{_META_KEY: np.array(text)}, **{k: np.ascontiguousarray(v) for k, v in arrays.items()})
    return path


def _read(path: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    if not path.is_file():
        raise InputError(path, "checkpoint not found")
    try:
        with np.load(path, allow_pickle=False) as npz:
            if _META_KEY not in npz.files:
                raise InputError(path, f"not a fox_numba checkpoint (no {_META_KEY} entry)")
            header = json.loads(str(npz[_META_KEY]))
            arrays = {k: npz[k] for k in npz.files if k != _META_KEY}
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as e:
        raise InputError(path, f"not a readable checkpoint ({type(e).__name__}: {e})") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        found = header.get("format") if isinstance(header, dict) else None
        raise InputError(path, f"checkpoint format {found!r}, this build reads {FORMAT!r}")
    missing = [key for key in _HEADER_KEYS if key not in header]
    if missing:
        raise InputError(path, f"the checkpoint header lacks {missing} (damaged file)", field=_META_KEY)
    return header, arrays


def load_checkpoint(path: str | Path, *, expected_layout: Layout | None = None) -> Checkpoint:
    """Read a checkpoint, refusing another ISV layout, or another array layout than `expected_layout`."""
    path = Path(path)
    header, arrays = _read(path)
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
        raise LayoutMismatchError(
            f"{path}: array layout {layout_fingerprint(layout)} differs from the expected "
            f"{layout_fingerprint(expected_layout)}: " + "; ".join(diff)
        )
    return Checkpoint(path, arrays, header["meta"], stored, layout)
