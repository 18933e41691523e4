"""The parameters of a synthetic market: one frozen dataclass per table of the definition file.

`data/default_market.toml` is the default market's definition and the only place its values live; every
key of a table is required and unknown keys are rejected, so a typo cannot silently fall back to a default.
A table typed `X | None` in `SynthDefinition` is optional: absent, its process is off (the original market),
and the definition hashes as it did before the table existed. The meaning of each parameter is documented
in `data/default_market.toml`, `data/suite/switching.toml` and in `synthetic` / `synthetic_book`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any, get_args, get_type_hints

from fox_numba.config import coerce, read_toml
from fox_numba.errors import ConfigError
from fox_numba.market.calendar import closed_reason
from fox_numba.market.schema import N_LEVELS, Instrument

GENERATOR_VERSION = 2
"""Part of the definition hash: bump it when a code change alters what a definition generates."""


@dataclass(frozen=True)
class MarketSection:
    symbol: str
    seed: int
    start_date: str
    """First trading day (YYYY-MM-DD); the market runs on the trading days of the instrument's exchange
    calendar (weekends and US exchange holidays are skipped; early closes are not modelled)."""
    days: int
    tick_size: float
    point_value: float
    start_price: float
    """Efficient price at the first open, in price units (index points)."""
    overnight_ticks: float
    """Standard deviation of the close-to-open gap of the efficient price, in ticks."""


@dataclass(frozen=True)
class ActivitySection:
    events_per_minute: float
    """Mean book events per minute in the calm regime (day average of the intraday pattern)."""
    u_curvature: float
    """A: depth of the U (open and close are 1 + A times as busy as midday, before the burst)."""
    open_burst: float
    """B: extra activity at the open, decaying with T_open."""
    open_burst_minutes: float


@dataclass(frozen=True)
class RegimeSection:
    """Two entries each: calm, volatile."""

    vol_ticks: list[float]
    rate_mult: list[float]
    depth_mult: list[float]
    refill: list[float]
    """Probability that the other side follows at once when a best level empties (else the spread stays wide)."""
    leave_prob: list[float]
    """Per-minute probability of leaving the regime."""


@dataclass(frozen=True)
class LatentSection:
    phi: float
    beta: float
    mo_tilt: float
    level_tilt: list[float]
    """Tilt of the limit add/cancel balance by x at each of the 10 levels."""


@dataclass(frozen=True)
class BookSection:
    catchup_ticks: float
    p_sweep: float
    p_partial: float
    p_improve: float
    p_market: float
    mo_median: float
    mo_sigma: float
    gamma: float
    flow_frac: float
    flow_sigma: float
    fresh_frac: float
    deep_fill: float
    order_size: float
    depth_l1: float
    depth_slope: float
    level_decay: float


@dataclass(frozen=True)
class OracleSection:
    horizon_minutes: int
    commission: float
    annualisation_days: int


@dataclass(frozen=True)
class SwitchingSection:
    """The switching latent process (`synthetic` module docstring): a hidden trend / revert state per minute."""

    leave_prob: list[float]
    """Per-minute probability of leaving the trend state and the revert state."""
    rho: float
    """Per-minute persistence of the revert state's transient displacement g (half-life ln 0.5 / ln rho)."""
    shock_ticks: float
    """Standard deviation of g's innovation per minute at u = 1 in the revert state, in ticks."""


@dataclass(frozen=True)
class SynthDefinition:
    """Every parameter of a synthetic market (the tables of `data/default_market.toml`)."""

    market: MarketSection
    activity: ActivitySection
    regimes: RegimeSection
    latent: LatentSection
    book: BookSection
    oracle: OracleSection
    switching: SwitchingSection | None = None
    """Optional: absent, x drives the drift all day (every market before this table existed)."""

    def instrument(self) -> Instrument:
        """The traded contract (ES session hours and time zone, this market's symbol, tick and point value)."""
        m = self.market
        return Instrument(symbol=m.symbol, tick_size=m.tick_size, point_value=m.point_value)

    def with_overrides(self, *, seed: int | None = None, days: int | None = None) -> SynthDefinition:
        """This definition with another seed or day count (None keeps the file's)."""
        market = dataclasses.replace(
            self.market,
            seed=self.market.seed if seed is None else seed,
            days=self.market.days if days is None else days,
        )
        _check(market.days >= 1, "market.days must be at least 1")
        _check(market.seed >= 0, "market.seed must be non-negative")
        return dataclasses.replace(self, market=market)

    def digest(self) -> str:
        """sha256 of the parameters and `GENERATOR_VERSION` (comments and layout of the file do not count; an
        absent optional table does not either, so older definitions keep their hash)."""
        params = {k: v for k, v in dataclasses.asdict(self).items() if v is not None}
        text = json.dumps({"generator": GENERATOR_VERSION, **params}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()


def _check(ok: bool, message: str, origin: str = "synthetic market definition") -> None:
    if not ok:
        raise ConfigError(f"{origin}: {message}")


def _section(kind: type, data: Any, name: str, origin: str) -> Any:
    """Table `name` as the dataclass `kind`: every key required, none unknown, each type-checked."""
    _check(isinstance(data, dict), f"[{name}] must be a table", origin)
    hints = get_type_hints(kind)
    unknown = sorted(set(data) - set(hints))
    missing = [key for key in hints if key not in data]
    _check(not unknown, f"[{name}] has unknown keys {unknown}", origin)
    _check(not missing, f"[{name}] lacks {missing}", origin)
    try:
        values = {key: coerce(f"{name}.{key}", data[key], hint) for key, hint in hints.items()}
    except ConfigError as e:
        raise ConfigError(f"{origin}: {e}") from None
    return kind(**values)


def _table_type(hint: Any) -> tuple[type, bool]:
    """The section dataclass of a `SynthDefinition` field and whether the table may be absent (`X | None`)."""
    kinds = [k for k in get_args(hint) if k is not type(None)]
    return (kinds[0], True) if kinds else (hint, False)


def load_definition(path: str | Path) -> SynthDefinition:
    """Read and check a market definition file (every key of a table required, none unknown; optional
    tables may be absent)."""
    data = read_toml(path, "synthetic market definition")
    hints = get_type_hints(SynthDefinition)
    unknown = sorted(set(data) - set(hints))
    _check(not unknown, f"unknown tables {unknown}", str(path))
    tables = {}
    for name, hint in hints.items():
        kind, optional = _table_type(hint)
        if not (optional and name not in data):
            tables[name] = _section(kind, data.get(name), name, str(path))
    defn = SynthDefinition(**tables)
    _validate(defn, str(path))
    return defn


def _validate(d: SynthDefinition, origin: str) -> None:
    m, r, lt, b, o = d.market, d.regimes, d.latent, d.book, d.oracle
    try:
        closed = closed_reason(date.fromisoformat(m.start_date), d.instrument().calendar)
    except ValueError:
        closed = "not a date"
    _check(closed is None, f"market.start_date {m.start_date!r} is not a trading day YYYY-MM-DD ({closed})", origin)
    _check(m.seed >= 0, "market.seed must be non-negative", origin)
    _check(m.days >= 1 and m.tick_size > 0 and m.point_value > 0 and m.start_price > 100 * m.tick_size,
           "market: days >= 1, tick_size > 0, point_value > 0 and start_price > 100 ticks are required", origin)
    for key in ("vol_ticks", "rate_mult", "depth_mult", "refill", "leave_prob"):
        values = getattr(r, key)
        ok = len(values) == 2 and all(v >= 0 for v in values)
        _check(ok, f"regimes.{key} needs two non-negative entries (calm, volatile)", origin)
    _check(0 < sum(r.leave_prob) <= 1, "regimes.leave_prob must sum to (0, 1]", origin)
    _check(0 <= lt.phi < 1, "latent.phi must be in [0, 1)", origin)
    _check(len(lt.level_tilt) == N_LEVELS, f"latent.level_tilt needs {N_LEVELS} entries", origin)
    for key in ("p_sweep", "p_partial", "p_improve", "p_market"):
        _check(0 <= getattr(b, key) <= 1, f"book.{key} must be a probability", origin)
    _check(b.catchup_ticks >= 0.5, "book.catchup_ticks must be >= 0.5 (else a catch-up may change nothing)", origin)
    _check(0 <= b.deep_fill <= 1, "book.deep_fill must be in [0, 1]", origin)
    _check(min(b.depth_l1, b.order_size, b.mo_median, b.flow_frac, b.fresh_frac, b.level_decay) > 0,
           "book sizes, fractions and level_decay must be positive", origin)
    ok = o.horizon_minutes >= 1 and o.annualisation_days >= 1 and o.commission >= 0
    _check(ok, "oracle: horizon_minutes >= 1, annualisation_days >= 1 and commission >= 0 are required", origin)
    if (s := d.switching) is not None:
        ok = len(s.leave_prob) == 2 and all(0 <= p <= 1 for p in s.leave_prob) and 0 < sum(s.leave_prob) <= 1
        _check(ok, "switching.leave_prob needs two probabilities (trend, revert) summing to (0, 1]", origin)
        _check(0 <= s.rho < 1, "switching.rho must be in [0, 1)", origin)
        _check(s.shock_ticks >= 0, "switching.shock_ticks must be non-negative", origin)
