"""The sweep spec: a TOML file of seeds and of config values to try, expanded into trials.

    [sweep]
    seeds = [0, 1, 2]                    # required: run.seed of each trial, distinct integers

    [grid]                               # optional: every combination of these values (cartesian product)
    "learner.lr" = [3e-4, 1e-3]          # a quoted section.field ...
    env = { explore_spread = [0.25, 0.5] }  # ... or a table per section ([grid.env] explore_spread = [...])

Trials are every grid combination (keys in file order, the last key varying fastest) times every seed:
config `c00`, `c01`, ... in that order, trial `c00-seed0`, ... Each value is checked against the config
field's type here, so a typo stops the sweep before any trial starts; an error names the file and the key.
`run.seed`, `run.name` and `run.out_dir` belong to the sweep and cannot be swept.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_type_hints

from fox_numba.config import FoxConfig, coerce, read_toml, toml_literal
from fox_numba.errors import ConfigError

SWEEP_OWNED = ("run.seed", "run.name", "run.out_dir")
"""Fields the sweep sets for every trial (seeds, and the run folder of each trial in the sweep folder)."""
TABLES = ("sweep", "grid")
SWEEP_KEYS = ("seeds",)


@dataclass(frozen=True)
class Trial:
    """One `fox train` of the sweep: a grid combination (`config`) and a seed."""

    id: str
    config: str
    values: tuple[tuple[str, Any], ...]
    """(section.field, value) of the grid combination, in the spec's key order."""
    seed: int

    def overrides(self) -> list[str]:
        """The `--set` overrides of the grid combination (the seed is set apart)."""
        return [f"{key}={toml_literal(value)}" for key, value in self.values]


@dataclass(frozen=True)
class SweepSpec:
    path: Path
    seeds: tuple[int, ...]
    grid: tuple[tuple[str, tuple[Any, ...]], ...]
    """(section.field, values) in file order; empty: one config, the base."""

    def configs(self) -> list[tuple[str, tuple[tuple[str, Any], ...]]]:
        """(config id, its (key, value) pairs) of every grid combination, in order."""
        keys = [key for key, _ in self.grid]
        combos = itertools.product(*(values for _, values in self.grid))
        return [(f"c{i:02d}", tuple(zip(keys, combo, strict=True))) for i, combo in enumerate(combos)]

    def trials(self) -> list[Trial]:
        """Every config times every seed, ordered by config then seed (the order of trial ids)."""
        return [Trial(f"{cid}-seed{seed}", cid, values, seed) for cid, values in self.configs() for seed in self.seeds]


def _field_type(where: str, key: str) -> Any:
    section, _, name = key.partition(".")
    sections = get_type_hints(FoxConfig)
    if section not in sections or not name or "." in name:
        raise ConfigError(f"{where}: no config field {key!r} (a key is section.field; sections: {', '.join(sections)})")
    hints = get_type_hints(sections[section])
    if name not in hints:
        raise ConfigError(f"{where}: config section '{section}' has no field '{name}' (fields: {', '.join(hints)})")
    if key in SWEEP_OWNED:
        raise ConfigError(f"{where}: {key} is set by the sweep for every trial (seeds go in [sweep] seeds)")
    return hints[name]


def _values(where: str, raw: Any, kind: Any) -> tuple[Any, ...]:
    if not isinstance(raw, list):
        raise ConfigError(f"{where}: expected a list of values, got {type(raw).__name__} {raw!r}")
    if not raw:
        raise ConfigError(f"{where}: the list is empty (give at least one value)")
    values = tuple(coerce(f"{where}[{i}]", v, kind) for i, v in enumerate(raw))
    for i, v in enumerate(values):
        if v in values[:i]:
            raise ConfigError(f"{where}[{i}]: {v!r} is listed twice")
    return values


def _flatten_grid(path: Path, grid: Any) -> list[tuple[str, Any]]:
    """[grid] entries as (section.field, raw values): quoted "section.field" keys and per-section tables."""
    if not isinstance(grid, dict):
        raise ConfigError(f"{path}: 'grid' must be a table [grid]")
    out = []
    for key, value in grid.items():
        if isinstance(value, dict):
            out += [(f"{key}.{name}", v) for name, v in value.items()]
        else:
            out.append((key, value))
    return out


def parse_spec(data: dict[str, Any], path: Path) -> SweepSpec:
    """A checked spec from the parsed TOML `data` of the file at `path` (module docstring)."""
    for table in data:
        if table not in TABLES:
            known = ", ".join(f"[{t}]" for t in TABLES)
            raise ConfigError(f"{path}: unknown table '{table}' (a sweep spec has {known})")
    sweep = data.get("sweep")
    if not isinstance(sweep, dict) or "seeds" not in sweep:
        raise ConfigError(f"{path}: [sweep] seeds is missing (e.g. [sweep] seeds = [0, 1])")
    for key in sweep:
        if key not in SWEEP_KEYS:
            raise ConfigError(f"{path}: sweep.{key}: unknown key (the [sweep] table has {', '.join(SWEEP_KEYS)})")
    seeds = _values(f"{path}: sweep.seeds", sweep["seeds"], int)
    grid = []
    for key, raw in _flatten_grid(path, data.get("grid", {})):
        where = f"{path}: grid.{key}"
        if key in (k for k, _ in grid):
            raise ConfigError(f"{where}: given twice")
        grid.append((key, _values(where, raw, _field_type(where, key))))
    return SweepSpec(path, seeds, tuple(grid))


def load_spec(path: str | Path) -> SweepSpec:
    """The sweep spec in the TOML file at `path`; a ConfigError naming the file and key if it is not one."""
    path = Path(path)
    return parse_spec(read_toml(path, "sweep spec"), path)
