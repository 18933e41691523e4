"""The synthetic ES-like market: regular-hours MBP-10 book, trades and 1-minute bars with a planted,
known order-flow signal, and the oracle that says how much of it is tradable after costs.

Model, per trading day of M = 390 one-minute bars (m = 0..M-1, tau_m = (m + 0.5) / M):

    intraday pattern  u_m = c * (1 + A (2 tau_m - 1)^2 + B exp(-(m + 0.5) / T_open)),  mean_m u_m = 1
    regime            r_m in {calm, volatile}, a Markov chain with leave probabilities q_r per minute
    latent state      x_m = phi x_{m-1} + sqrt(1 - phi^2) eps_m,  x_0 ~ N(0, 1)  (stationary N(0, 1))
    volatility        s_m = vol_ticks[r_m] * sqrt(u_m)                        (ticks / sqrt(minute))
    drift             mu_m = beta * s_m * x_m                                 (ticks / minute)
    efficient price   df = mu_m dt + s_m dW inside minute m;  day d opens at the previous close plus
                      N(0, overnight_ticks^2)
    book events       N_m ~ Poisson(events_per_minute * u_m * rate_mult[r_m]), times uniform in the minute

The book (`synthetic_book`) tracks f: its mid stays within about one tick of f. The latent state x is
a persistent order-flow pressure, seen three ways, each noisy on its own:
- price pressure: f drifts with x, and multi-level OFI (Cont-Kukanov-Stoikov) summed over an interval
  is, by construction, about depth times the net price change plus the change of depth imbalance, so OFI
  carries x through the pressure it exerts (correlation with x about 0.07 per minute, 0.2 over 15);
- book shape: x tilts the add/cancel balance at every level, so bid and ask depth differ with x;
- aggressor side: market orders are buyer-initiated with probability sigmoid(mo_tilt * x).
The latent expected return over the next h minutes, known at bar m's close, is the expected change of f:

    er_m = beta * x_m * sum_{k=1..h, m+k<M} phi^k sqrt(u_{m+k}) E[vol_ticks[r_{m+k}] | r_m]    (ticks)

with E[vol[r_{m+k}] | r_m = i] = vbar + lambda^k (vol[i] - vbar), lambda = 1 - q_calm - q_volatile and
vbar the stationary mean of vol. The oracle (`synthetic_oracle`) trades it after costs.

The switching process (an optional `[switching]` table; without it z_m = trend always, the model above):

    hidden state      z_m in {trend, revert}, a Markov chain with leave probabilities p_t, p_v per minute
                      (z_0 drawn from its stationary law)
    flow state        xt_m = x_m 1[z_m = trend] replaces x in the drift and in the book
    displacement      g_m = rho g_{m-1} + 1[z_m = revert] shock_ticks sqrt(u_m) eta_m,  g_{-1} = 0 each day
    drift             mu_m = beta * s_m * xt_m + (g_m - g_{m-1})

so f carries g: while trending, informed flow pushes the price as on the default market; while reverting,
the flow is uninformed, the price takes shocks g that then decay at the rate 1 - rho (the drift opposes the
recent move), and the catch-up market orders that follow each shock make the flow point the wrong way. With
K = #{k = 1..h : m + k < M} the expected change of f over the horizon is then

    er_m = beta * x_m * sum_k phi^k sqrt(u_{m+k}) E[vol_ticks[r_{m+k}] | r_m] P(z_{m+k} = trend | z_m)
           + (rho^K - 1) g_m

with P(z_{m+k} = trend | z_m) = pbar + lambda_z^k (1[z_m = trend] - pbar), pbar = p_v / (p_t + p_v),
lambda_z = 1 - p_t - p_v (x, r and z are independent chains, and g's innovations have mean zero whatever
the state).

Bars are built from trades (`bars.bars_from_trades`, the store's own rule). Every minute of the session
has a bar: a minute without trades gets a flat zero-volume bar at the previous bar's close (before the
day's first trade: at the first trade's price), which the store's validation accepts.

Determinism: `SeedSequence(seed).spawn` gives day d its own stream, so a given seed always yields the
same arrays, and the first k days do not depend on how many days are generated after them.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fox_numba.io import atomic_path, atomic_write_text
from fox_numba.market.bars import bars_from_trades
from fox_numba.market.calendar import session_bounds, trading_days
from fox_numba.market.schema import (
    DTYPES,
    N_LEVELS,
    NS_PER_MINUTE,
    Bars,
    Instrument,
    MarketDay,
    Mbp10,
    Trades,
)
from fox_numba.market.store import write_store
from fox_numba.market.synthetic_definition import GENERATOR_VERSION, ActivitySection, SynthDefinition
from fox_numba.market.synthetic_oracle import Oracle, oracle_pnl

if TYPE_CHECKING:  # the book is numba: imported where a day is simulated, so the CLI starts without compiling it
    from fox_numba.market.synthetic_book import BookParams, DayBook

STEPS_PER_DAY = 2
"""Progress messages per day of `build_store`: one when generated, one when written to the store."""


def intraday_pattern(n_minutes: int, act: ActivitySection) -> np.ndarray:
    """u_m: the U-shaped activity multiplier of each minute, mean 1."""
    m = np.arange(n_minutes) + 0.5
    tau = m / n_minutes
    u = 1.0 + act.u_curvature * (2.0 * tau - 1.0) ** 2 + act.open_burst * np.exp(-m / act.open_burst_minutes)
    return u / u.mean()


def book_params(d: SynthDefinition) -> BookParams:
    """The book kernel's parameters: the [book] scalars it shares by name, mo_tilt and the per-level arrays."""
    from fox_numba.market.synthetic_book import HIDDEN_LEVELS, BookParams

    b, lt = d.book, d.latent
    levels = np.arange(HIDDEN_LEVELS, dtype=np.float64)
    weights = np.exp(-np.arange(N_LEVELS) / b.level_decay)
    shared = {k: v for k, v in dataclasses.asdict(b).items() if k in BookParams._fields}
    return BookParams(
        **shared,
        mo_tilt=lt.mo_tilt,
        depth=b.depth_l1 * (1.0 + b.depth_slope * levels),
        tilt=np.asarray(lt.level_tilt, dtype=np.float64),
        level_cdf=np.cumsum(weights) / weights.sum(),
    )


@dataclass
class LatentDay:
    """The hidden per-minute paths of one day."""

    x: np.ndarray  # float64 [M]
    regime: np.ndarray  # int8 [M]: 0 calm, 1 volatile
    u: np.ndarray  # float64 [M]
    revert: np.ndarray | None = None  # int8 [M]: z_m, 0 trend, 1 revert (None: no [switching] table)
    g: np.ndarray | None = None  # float64 [M]: displacement g_m in ticks (None: no [switching] table)

    def flow(self) -> np.ndarray:
        """xt_m: the state that drives the drift and tilts the book (x itself without switching)."""
        return self.x if self.revert is None else np.where(self.revert == 0, self.x, 0.0)


def markov_path(uniform: np.ndarray, q: np.ndarray) -> np.ndarray:
    """int8 path of a two-state chain with per-step leave probabilities `q`, started from its stationary law,
    driven by one uniform draw per step."""
    state = np.empty(uniform.size, dtype=np.int8)
    state[0] = 1 if uniform[0] < q[0] / q.sum() else 0
    for m in range(1, uniform.size):
        prev = state[m - 1]
        state[m] = 1 - prev if uniform[m] < q[prev] else prev
    return state


def latent_day(rng: np.random.Generator, n_minutes: int, d: SynthDefinition) -> LatentDay:
    """Draw x and the regime path of one day from `rng` (then, with [switching], z and g)."""
    phi = d.latent.phi
    eps = rng.standard_normal(n_minutes)
    x = np.empty(n_minutes)
    x[0] = eps[0]
    for m in range(1, n_minutes):
        x[m] = phi * x[m - 1] + np.sqrt(1.0 - phi * phi) * eps[m]
    regime = markov_path(rng.random(n_minutes), np.asarray(d.regimes.leave_prob))
    lat = LatentDay(x=x, regime=regime, u=intraday_pattern(n_minutes, d.activity))
    if (sw := d.switching) is not None:
        lat.revert = markov_path(rng.random(n_minutes), np.asarray(sw.leave_prob))
        shock = lat.revert * sw.shock_ticks * np.sqrt(lat.u) * rng.standard_normal(n_minutes)
        lat.g = np.empty(n_minutes)
        lat.g[0] = shock[0]
        for m in range(1, n_minutes):
            lat.g[m] = sw.rho * lat.g[m - 1] + shock[m]
    return lat


def drift_ticks(lat: LatentDay, vol: np.ndarray, d: SynthDefinition) -> np.ndarray:
    """mu_m (ticks per minute, module docstring) given s_m = `vol`."""
    drift = d.latent.beta * vol * lat.flow()
    return drift if lat.g is None else drift + np.diff(lat.g, prepend=0.0)


def expected_return(lat: LatentDay, d: SynthDefinition, horizon: int) -> np.ndarray:
    """er_m in ticks (module docstring): the expected change of f over the next `horizon` minutes."""
    vol = np.asarray(d.regimes.vol_ticks)
    q = np.asarray(d.regimes.leave_prob)
    lam = 1.0 - q.sum()
    vbar = (q[1] * vol[0] + q[0] * vol[1]) / q.sum()
    n = lat.x.size
    k = np.arange(1, horizon + 1)
    er = np.zeros(n)
    root_u = np.sqrt(lat.u)
    for m in range(n):
        kk = k[m + k < n]
        ev = vbar + lam**kk * (vol[lat.regime[m]] - vbar)
        er[m] = np.sum(d.latent.phi**kk * root_u[m + kk] * ev * trend_probability(lat, d, m, kk))
    er = d.latent.beta * lat.x * er
    if lat.g is None:
        return er
    ahead = np.minimum(horizon, n - 1 - np.arange(n))
    return er + (d.switching.rho**ahead - 1.0) * lat.g


def trend_probability(lat: LatentDay, d: SynthDefinition, m: int, k: np.ndarray) -> np.ndarray | float:
    """P(z_{m+k} = trend | z_m) (module docstring); 1 without [switching]."""
    if lat.revert is None:
        return 1.0
    p = np.asarray(d.switching.leave_prob)
    pbar = p[1] / p.sum()
    return pbar + (1.0 - p.sum()) ** k * ((1.0 - lat.revert[m]) - pbar)


@dataclass
class Latent:
    """Per-bar hidden truth of a whole synthetic market, for judging models against it."""

    ts_event: np.ndarray  # uint64 [bars]: bar start
    x: np.ndarray  # float64: latent order-flow state
    regime: np.ndarray  # int8: 0 calm, 1 volatile
    expected_return: np.ndarray  # float64: er_m in price units over the oracle horizon
    efficient_price: np.ndarray  # float64: f at the bar's close, price units
    mid: np.ndarray  # float64: book mid at the bar's close, price units
    half_spread: np.ndarray  # float64: half the book spread at the bar's close, price units
    revert: np.ndarray | None = None  # int8: z_m, 0 trend, 1 revert (None, and not in the sidecar: no switching)
    displacement: np.ndarray | None = None  # float64: g_m in price units (as `revert`)


@dataclass
class SynthMarket:
    """A generated market: the days as the store receives them, the hidden truth and the oracle."""

    instrument: Instrument
    days: list[MarketDay]
    latent: Latent
    oracle: Oracle


def _day_records(name: str, book: DayBook, open_ns: int, n_minutes: int, tick_fixed: int) -> MarketDay:
    """The kernel's arrays (ticks) as one store day (fixed-point prices, the store's dtypes)."""
    dt = DTYPES
    trades = Trades(
        ts_event=book.trades[:, 0].astype(dt["trades"]["ts_event"]),
        price=book.trades[:, 1] * tick_fixed,
        size=book.trades[:, 2].astype(dt["trades"]["size"]),
        side=book.trades[:, 3].astype(dt["trades"]["side"]),
    )
    mbp = Mbp10(
        ts_event=book.ts.astype(dt["mbp10"]["ts_event"]),
        bid_px=book.book[0] * tick_fixed,
        ask_px=book.book[1] * tick_fixed,
        bid_sz=book.book[2].astype(dt["mbp10"]["bid_sz"]),
        ask_sz=book.book[3].astype(dt["mbp10"]["ask_sz"]),
        bid_ct=book.book[4].astype(dt["mbp10"]["bid_ct"]),
        ask_ct=book.book[5].astype(dt["mbp10"]["ask_ct"]),
    )
    bars = _full_bars(trades, open_ns, n_minutes, int(book.close_bid[-1]) * tick_fixed)
    return MarketDay(day=name, bars=bars, mbp10=mbp, trades=trades)


def _full_bars(trades: Trades, open_ns: int, n_minutes: int, fallback_px: int) -> Bars:
    """One bar per session minute: traded minutes from `bars_from_trades`, the others flat at the last
    close before them (the first trade's price before the day's first trade; `fallback_px` on a day
    without trades) with volume 0."""
    traded = bars_from_trades(trades)
    at = (traded.ts_event.astype(np.int64) - open_ns) // NS_PER_MINUTE
    if at.size:
        index = np.full(n_minutes, -1, dtype=np.int64)
        index[at] = np.arange(at.size)
        last = np.maximum.accumulate(index)
        fill = np.where(last >= 0, traded.close[np.maximum(last, 0)], traded.open[0])
    else:
        fill = np.full(n_minutes, fallback_px, dtype=np.int64)
    o, h, lo, c = (fill.astype(np.int64) for _ in range(4))
    volume = np.zeros(n_minutes, dtype=np.uint64)
    o[at], h[at], lo[at], c[at], volume[at] = traded.open, traded.high, traded.low, traded.close, traded.volume
    minutes = open_ns + NS_PER_MINUTE * np.arange(n_minutes, dtype=np.int64)
    return Bars(ts_event=minutes.astype(np.uint64), open=o, high=h, low=lo, close=c, volume=volume)


def generate(d: SynthDefinition, progress: Callable[[str], None] | None = None) -> SynthMarket:
    """Generate every day of the market, the per-bar latent truth and the oracle."""
    from fox_numba.market.synthetic_book import simulate_day

    instrument = d.instrument()
    tick_fixed = instrument.tick_fixed
    tick = d.market.tick_size
    bp = book_params(d)
    vol_r = np.asarray(d.regimes.vol_ticks)
    rate_r = np.asarray(d.regimes.rate_mult)
    depth_r = np.asarray(d.regimes.depth_mult)
    refill_r = np.asarray(d.regimes.refill)
    streams = np.random.SeedSequence(d.market.seed).spawn(d.market.days)
    f = d.market.start_price / tick
    days: list[MarketDay] = []
    parts: dict[str, list[np.ndarray]] = {field.name: [] for field in fields(Latent)}
    for i, name in enumerate(trading_days(d.market.start_date, d.market.days, instrument.calendar)):
        rng = np.random.default_rng(streams[i])
        open_ns, close_ns = session_bounds(name, instrument)
        n_min = (close_ns - open_ns) // NS_PER_MINUTE
        lat = latent_day(rng, n_min, d)
        vol = vol_r[lat.regime] * np.sqrt(lat.u)
        n_events = rng.poisson(d.activity.events_per_minute * lat.u * rate_r[lat.regime]).astype(np.int64)
        if i > 0:
            f += d.market.overnight_ticks * rng.standard_normal()
        book = simulate_day(
            int(rng.integers(2**31 - 1)), open_ns, f, n_events, drift_ticks(lat, vol, d), vol, lat.flow(),
            depth_r[lat.regime].astype(np.float64), refill_r[lat.regime].astype(np.float64), bp,
        )
        f = float(book.close_f[-1])
        day = _day_records(name, book, open_ns, n_min, tick_fixed)
        days.append(day)
        parts["ts_event"].append(day.bars.ts_event)
        parts["x"].append(lat.x)
        parts["regime"].append(lat.regime)
        parts["expected_return"].append(expected_return(lat, d, d.oracle.horizon_minutes) * tick)
        parts["efficient_price"].append(book.close_f * tick)
        parts["mid"].append(0.5 * (book.close_bid + book.close_ask) * tick)
        parts["half_spread"].append(0.5 * (book.close_ask - book.close_bid) * tick)
        if lat.g is not None:
            parts["revert"].append(lat.revert)
            parts["displacement"].append(lat.g * tick)
        if progress is not None:
            progress(f"{name} generated: {book.ts.size:,} book rows, {book.trades.shape[0]:,} trades")
    latent = Latent(**{k: np.concatenate(v) for k, v in parts.items() if v})
    oracle = oracle_pnl(
        latent.expected_return, latent.mid, latent.half_spread, latent.ts_event.size // len(days),
        tick_size=tick, point_value=d.market.point_value, commission=d.oracle.commission,
        horizon_minutes=d.oracle.horizon_minutes, annualisation_days=d.oracle.annualisation_days,
    )
    return SynthMarket(instrument=instrument, days=days, latent=latent, oracle=oracle)


def sidecar_paths(store: Path) -> tuple[Path, Path]:
    """`<store>.oracle.json` (oracle numbers) and `<store>.latent.npz` (the `Latent` arrays and the
    oracle's per-bar `oracle_position`, all [bars] in store order) beside a store."""
    return store.with_name(store.name + ".oracle.json"), store.with_name(store.name + ".latent.npz")


def build_store(d: SynthDefinition, out: str | Path, progress: Callable[[str], None] | None = None) -> SynthMarket:
    """Generate the market and write the store with its sidecars (each written atomically).

    Root attrs of the store: `generator`, `definition_hash`, `seed` and the oracle summary. The sidecars
    are written first; the store, written last, marks the set complete.
    """
    out = Path(out)
    market = generate(d, progress)
    attrs = {
        "generator": f"fox_numba.market.synthetic v{GENERATOR_VERSION}",
        "definition_hash": d.digest(),
        "seed": d.market.seed,
    }
    attrs.update(market.oracle.summary())
    oracle_json, latent_npz = sidecar_paths(out)
    sidecar = {**attrs, "oracle_daily_pnl": market.oracle.daily_pnl.tolist(), "latent_arrays": latent_npz.name}
    atomic_write_text(oracle_json, json.dumps(sidecar, indent=2) + "\n")
    with atomic_path(latent_npz) as tmp, open(tmp, "wb") as fh:
        arrays = {k: v for k, v in dataclasses.asdict(market.latent).items() if v is not None}
        np.savez(fh, **arrays, oracle_position=market.oracle.position)
    write_store(out, market.instrument, _reporting(market.days, progress), attrs=attrs)
    return market


def _reporting(days: list[MarketDay], progress: Callable[[str], None] | None) -> Iterator[MarketDay]:
    """Yield the days; the store asks for the next one after writing the last, so report it then."""
    for day in days:
        yield day
        if progress is not None:
            progress(f"{day.day} written")
