"""The embedded default market: where its definition lives, where its build is cached, when to rebuild.

The definition is `data/default_market.toml` in the repository (the package is installed editable, so
the repository root is the parent of the package folder). The build goes to
`data/cache/default_market.h5` (git-ignored), or to `$FOX_DATA_DIR/default_market.h5` when the
variable is set; its day files go beside it, in `default_market.h5.days/`. A build is reused when its store records
the definition's hash (`definition_hash` attr), both sidecars exist and every group of the store carries its
digest; any change of a parameter (or of `GENERATOR_VERSION`) rebuilds it, and so does a build made before day
digests existed (its days would be read whole for their digests on every run).
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable
from pathlib import Path

from fox_numba.errors import ConfigError, InputError
from fox_numba.market.store import MarketStore
from fox_numba.market.synthetic import build_store, sidecar_paths
from fox_numba.market.synthetic_definition import SynthDefinition, load_definition

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFINITION_PATH = REPO_ROOT / "data" / "default_market.toml"
STORE_NAME = "default_market.h5"
BUILD_LOCK = ".lock"
"""Suffix of the file beside the store whose exclusive lock the building process holds."""
DATA_DIR_ENV = "FOX_DATA_DIR"


def default_definition_path() -> Path:
    """The default market's definition file; a clear error if the repository does not carry it."""
    if not DEFINITION_PATH.is_file():
        raise ConfigError(
            f"{DEFINITION_PATH}: the default market definition is missing; fox_numba must run from its "
            "repository (pip install -e .) with data/default_market.toml present, or pass --store PATH"
        )
    return DEFINITION_PATH


def default_store_path() -> Path:
    """Where the default market's build is cached ($FOX_DATA_DIR or data/cache in the repository)."""
    base = os.environ.get(DATA_DIR_ENV)
    return (Path(base) if base else REPO_ROOT / "data" / "cache") / STORE_NAME


def built_hash(store: Path) -> str | None:
    """The definition hash a complete, readable build at `store` was made from, or None (absent, partial,
    written with another store layout or before day digests, or not a synthetic store). Reads attrs only."""
    oracle_json, latent_npz = sidecar_paths(store)
    if not (store.is_file() and oracle_json.is_file() and latent_npz.is_file()):
        return None
    try:
        with MarketStore(store) as opened:
            stored = opened.attrs.get("definition_hash") if not opened.undigested() else None
        sidecar = json.loads(oracle_json.read_text()).get("definition_hash")
    except (InputError, ValueError):
        return None
    return stored if stored == sidecar else None


def ensure_default_store(progress: Callable[[str], None] | None = None) -> Path:
    """The default market's store: reused when built from the current definition, else (re)built. One process builds
    at a time (an exclusive lock on BUILD_LOCK beside the store): runs started together on a fresh checkout wait for
    the first one's build and reuse it, instead of writing the same files at once."""
    definition: SynthDefinition = load_definition(default_definition_path())
    store = default_store_path()
    if built_hash(store) == definition.digest():
        return store
    store.parent.mkdir(parents=True, exist_ok=True)
    with open(store.with_name(store.name + BUILD_LOCK), "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if progress is not None:
                progress("waiting for another process building the default market")
            fcntl.flock(lock, fcntl.LOCK_EX)
        if built_hash(store) != definition.digest():
            build_store(definition, store, progress)
    return store

