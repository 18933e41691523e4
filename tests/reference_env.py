"""Float64 references for the environment: random fold markets, a plain, slow re-implementation of the
trading rules of kernels/env.py (one Python object per environment, no vectorisation), hand-made markets,
and `Run`, which steps the kernels and the reference side by side and compares every state field and
output after every step.

The rules are written again from the kernel module's header, not copied from the kernel: the tests compare
every state field and output after every step of random action sequences. Operation order follows the
header where it matters for float64 bits (cash moves by fills, commissions are taken once per step, the
reward is the float64 sum of its components cast once to float32).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from fox_numba.actions import MAGNITUDE_FRACTIONS
from fox_numba.agent.environment import VecEnv
from fox_numba.agent.fold_market import FoldMarket
from fox_numba.config import EnvConfig, FeatureConfig
from fox_numba.device.isv import Isv, IsvBus
from fox_numba.device.rng import xoroshiro_states_host
from fox_numba.features.book import BOOK_FEATURES
from fox_numba.features.feature_set import FeatureSet, RawMarket
from fox_numba.features.names import FEATURE_INDEX, FEATURE_NAMES, feature_names
from fox_numba.features.normalise import NormStats
from fox_numba.market.schema import N_LEVELS
from fox_numba.observation import N_FEATURES, N_MARKET, N_PORTFOLIO, ORDER_DIST_TICKS, UPNL_CLIP, Z_REALISED_VOL

SHORT, HOLD, LONG, FLAT = range(4)
MARKET, JOIN, IMPROVE = range(3)
TICK = 0.25
POINT_VALUE = 50.0
MASK64 = (1 << 64) - 1


# --- random markets ---------------------------------------------------------------------------------------


def random_feature_set(
    rng: np.random.Generator, day_bars: list[int], *, max_levels: int = N_LEVELS, size_hi: int = 4,
    no_trade_p: float = 0.2, features: FeatureConfig | None = None,
) -> FeatureSet:  # fmt: skip
    """Random days of `day_bars` bars: a mid walking in ticks, spreads of 1-2 ticks, books of 1..max_levels
    shown levels with sizes 1..size_hi (small, so market orders walk several levels and beyond the depth),
    trade summaries near the touch (NaN without trades with probability no_trade_p), random values of the
    columns `features` builds (default: the default FeatureConfig's; the time-weighted imbalance's in [-1, 1])."""
    names = feature_names(features or FeatureConfig())
    n = int(sum(day_bars))
    best_bid = 20_000 + np.cumsum(rng.integers(-2, 3, n))
    spread = np.where(rng.random(n) < 0.6, 1, 2)
    best_ask = best_bid + spread
    depth = np.arange(N_LEVELS)[None, :]
    bid_px = (best_bid[:, None] - depth) * TICK
    ask_px = (best_ask[:, None] + depth) * TICK
    bid_sz = rng.integers(1, size_hi + 1, (n, N_LEVELS)).astype(np.uint32)
    ask_sz = rng.integers(1, size_hi + 1, (n, N_LEVELS)).astype(np.uint32)
    for px, sz in ((bid_px, bid_sz), (ask_px, ask_sz)):
        shown = rng.integers(1, max_levels + 1, n)
        empty = depth >= shown[:, None]
        px[empty] = np.nan
        sz[empty] = 0
    has = rng.random(n) >= no_trade_p
    lo_t = best_bid + rng.integers(-2, 2, n)
    hi_t = np.maximum(best_ask + rng.integers(-1, 3, n), lo_t)
    trade_lo = np.where(has, lo_t * TICK, np.nan)
    trade_hi = np.where(has, hi_t * TICK, np.nan)
    vol_lo = np.where(has, rng.integers(1, 12, n), 0).astype(np.uint32)
    vol_hi = np.where(has, rng.integers(1, 12, n), 0).astype(np.uint32)
    mid = (best_bid + best_ask) * TICK / 2
    values = rng.normal(0.0, 1.0, (n, len(FEATURE_NAMES))) * rng.uniform(0.5, 2.0, len(FEATURE_NAMES))
    values[:, FEATURE_INDEX["realised_vol_15"]] = np.abs(values[:, FEATURE_INDEX["realised_vol_15"]]) * 1e-3
    day_start = np.concatenate(([0], np.cumsum(day_bars))).astype(np.int64)
    raw = RawMarket(
        ts=(np.arange(n, dtype=np.uint64) * np.uint64(60_000_000_000)),
        day_index=np.repeat(np.arange(len(day_bars), dtype=np.int32), day_bars),
        day_start=day_start,
        bid_px=bid_px,
        ask_px=ask_px,
        bid_sz=bid_sz,
        ask_sz=ask_sz,
        mid=mid,
        open=mid.copy(),
        high=mid + TICK,
        low=mid - TICK,
        close=mid.copy(),
        trade_lo=trade_lo,
        trade_hi=trade_hi,
        vol_lo=vol_lo,
        vol_hi=vol_hi,
        tick_size=TICK,
        point_value=POINT_VALUE,
    )
    days = tuple(f"2024-01-{d + 1:02d}" for d in range(len(day_bars)))
    extra = rng.uniform(-1.0, 1.0, (n, len(names) - len(FEATURE_NAMES)))  # drawn last: the others keep their values
    return FeatureSet(values=np.column_stack([values, extra]), names=names, days=days, raw=raw)


@dataclass(frozen=True)
class Windows:
    """A fold's windows (what FoldMarket.build reads of walkforward.folds.Fold)."""

    train_first: int
    train_stop: int
    val_first: int
    val_stop: int
    purge_bars: int
    index: int = 0
    select_days: int = 0


# --- the reference environment ------------------------------------------------------------------------------


@dataclass
class Params:
    tick: float
    point_value: float
    commission: float
    risk_unit: float
    max_position: int
    beyond_ticks: int
    lives: tuple[int, int, int]
    targets: tuple[int, int, int]
    w_timing: float
    w_persist: float
    w_regime: float
    w_novelty: float
    w_stable: float
    clip_sigma: float
    episode_bars: int
    position_history: bool

    @classmethod
    def of(cls, market, env: EnvConfig, features: FeatureConfig) -> Params:
        targets = tuple(max(1, math.floor(f * env.max_position + 0.5)) for f in MAGNITUDE_FRACTIONS)
        return cls(
            tick=market.tick_size, point_value=market.point_value, commission=env.commission,
            risk_unit=market.risk_unit, max_position=env.max_position, beyond_ticks=env.beyond_depth_ticks,
            lives=(env.limit_life_patient, env.limit_life_normal, env.limit_life_urgent), targets=targets,
            w_timing=env.w_timing, w_persist=env.w_persist, w_regime=env.w_regime, w_novelty=env.w_novelty,
            w_stable=env.w_stable, clip_sigma=features.clip_sigma, episode_bars=market.episode_bars,
            position_history=env.position_history,
        )  # fmt: skip


def xoroshiro_next(state: list[int]) -> int:
    """xoroshiro128+ on a [s0, s1] pair of Python ints (numba.cuda.random's generator), in place."""
    s0, s1 = state
    result = (s0 + s1) & MASK64
    s1 ^= s0
    state[0] = (((s0 << 55) | (s0 >> 9)) & MASK64) ^ s1 ^ ((s1 << 14) & MASK64)
    state[1] = ((s1 << 36) | (s1 >> 28)) & MASK64
    return result


def uniform64(state: list[int]) -> float:
    return (xoroshiro_next(state) >> 11) * (1.0 / (1 << 53))


def uniform32(state: list[int]) -> np.float32:
    return np.float32(uniform64(state))


@dataclass
class EnvRef:
    """One environment's state (kernels/env.py SI_* / SF_* fields, dir_ema, port) in Python types."""

    row: int = 0
    last: int = 0
    pos: int = 0
    bars_in_pos: int = 0
    oside: int = 0
    osize: int = 0
    olife: int = 0
    frozen: int = 0
    cash: float = 0.0
    avg: float = 0.0
    oprice: float = 0.0
    oqueue: float = 0.0
    ep_return: float = 0.0
    dir_ema: list[np.float32] = field(default_factory=lambda: [np.float32(0.25)] * 4)
    port: list[np.float32] = field(default_factory=lambda: [np.float32(0.0)] * N_PORTFOLIO)
    rng: list[int] = field(default_factory=lambda: [0, 0])


@dataclass
class StepOut:
    reward: np.float32
    done: float
    next_row: int
    next_port: list[np.float32]
    comps: list[np.float32]
    stats: list[np.float32]


N_ACC_REF = 20  # kernels/env.py N_ACC, in its ACC_* order (checked by the tests)


class ReferenceEnv:
    """N environments stepped one by one in plain Python (float64), with the kernels' rules."""

    def __init__(self, market, params: Params, mode: str, states: np.ndarray, reach: float = 1.0) -> None:
        self.m = market  # a FoldMarket (host tensors)
        self.p = params
        self.mode = mode
        self.reach = reach  # the curriculum's share of train_starts a draw reaches (kernels/env.py _draw_start)
        self.envs = [EnvRef(rng=[int(s["s0"]), int(s["s1"])]) for s in states]
        self.acc = np.zeros((N_ACC_REF, len(self.envs)))

    # state helpers
    def portfolio(self, pos, avg, bars_in_pos, oside, oprice, mid, row, last) -> list[np.float32]:
        p = self.p
        upnl = 0.0
        if pos != 0 and p.position_history:
            upnl = min(max((mid - avg) * pos * p.point_value / p.risk_unit, -UPNL_CLIP), UPNL_CLIP)
        dist = oside * (oprice - mid) / p.tick / ORDER_DIST_TICKS if oside != 0 else 0.0
        return [
            np.float32(pos / p.max_position),
            np.float32(upnl),
            np.float32(min(bars_in_pos / p.episode_bars, 1.0) if p.position_history else 0.0),
            np.float32(oside),
            np.float32(dist),
            np.float32(min((last - row) / p.episode_bars, 1.0)),
        ]

    def start(self, e: EnvRef, start: int, last: int) -> None:
        e.row, e.last, e.pos, e.bars_in_pos, e.oside, e.osize, e.olife, e.frozen = start, last, 0, 0, 0, 0, 0, 0
        e.cash = e.avg = e.oprice = e.oqueue = e.ep_return = 0.0
        e.port = self.portfolio(0, 0.0, 0, 0, 0.0, float(self.m.mid[start]), start, last)

    def draw_start(self, e: EnvRef) -> tuple[int, int]:
        starts = self.m.train_starts
        k = min(int(uniform64(e.rng) * (len(starts) * self.reach)), len(starts) - 1)
        s = int(starts[k])
        return s, min(s + self.p.episode_bars, int(self.m.row_stop[s])) - 1

    def reset(self) -> None:
        for i, e in enumerate(self.envs):
            if self.mode == "collect":
                start, last = self.draw_start(e)
                bars = 2 + int(uniform64(e.rng) * (last - start))  # the staggered first episode
                self.start(e, start, start + min(bars, last - start + 1) - 1)
            else:
                a, b = (int(x) for x in self.m.val_windows[i])
                self.start(e, a, b - 1)
            e.dir_ema = [np.float32(0.25)] * 4

    # fills
    def walk(self, side: str, b: int, qty: int, beyond: float) -> float:
        """Cost of taking qty from bar b's `side` ('ask' for a buy, 'bid' for a sell)."""
        px = self.m.ask_px if side == "ask" else self.m.bid_px
        sz = self.m.ask_sz if side == "ask" else self.m.bid_sz
        rem, cost, last = float(qty), 0.0, float(px[b, 0])
        for k in range(N_LEVELS):
            size = float(sz[b, k])
            if rem <= 0 or size <= 0:
                break
            take = min(rem, size)
            cost += take * float(px[b, k])
            rem -= take
            last = float(px[b, k])
        if rem > 0:
            cost += rem * (last + beyond)
        return cost

    @staticmethod
    def book(pos, avg, cash, realised, dq, cost, pv):
        q = abs(dq)
        price = cost / q
        held = abs(pos)
        if pos == 0 or (pos > 0) == (dq > 0):
            avg = (avg * held + cost) / (held + q)
        else:
            closed = min(q, held)
            realised += (price - avg) * closed * (1.0 if pos > 0 else -1.0) * pv
            if q > held:
                avg = price
            elif q == held:
                avg = 0.0
        cash = cash - cost * pv if dq > 0 else cash + cost * pv
        return pos + dq, avg, cash, realised

    def step(self, actions: np.ndarray, isv_ref: float) -> list[StepOut]:
        return [self.step_one(i, e, [int(a) for a in actions[i]], isv_ref) for i, e in enumerate(self.envs)]

    def step_one(self, i: int, e: EnvRef, action: list[int], isv_ref: float) -> StepOut:
        p, m = self.p, self.m
        zero = np.float32(0.0)
        if e.frozen:
            return StepOut(zero, 1.0, e.row, list(e.port), [zero] * 6, [zero] * 4)
        tick, half, pv = p.tick, 0.5 * p.tick, p.point_value
        beyond = p.beyond_ticks * tick
        b = e.row
        pos0 = pos = e.pos
        cash, avg = e.cash, e.avg
        oside, osize, olife, oprice, oqueue = e.oside, e.osize, e.olife, e.oprice, e.oqueue
        equity0 = cash + pos * float(m.mid[b]) * pv
        d, mag, order, urg = action
        realised, traded, placed, filled = 0.0, 0, 0, 0

        if d != HOLD:
            target = 0 if d == FLAT else (p.targets[mag] if d == LONG else -p.targets[mag])
            delta = target - pos
            if delta == 0:
                oside, osize = 0, 0
            elif order == MARKET:
                oside, osize = 0, 0
                cost = self.walk("ask", b, delta, beyond) if delta > 0 else self.walk("bid", b, -delta, -beyond)
                pos, avg, cash, realised = self.book(pos, avg, cash, realised, delta, cost, pv)
                traded += abs(delta)
            else:
                side, size = (1 if delta > 0 else -1), abs(delta)
                bb, ba = float(m.bid_px[b, 0]), float(m.ask_px[b, 0])
                improve = order == IMPROVE and ba - bb > tick + half
                if side > 0:
                    price = bb + tick if improve else bb
                    queue = 0.0 if improve else float(m.bid_sz[b, 0])
                else:
                    price = ba - tick if improve else ba
                    queue = 0.0 if improve else float(m.ask_sz[b, 0])
                same = side == oside and size == osize and abs(price - oprice) < half
                if not same:
                    oside, osize, oprice, oqueue = side, size, price, queue
                    placed += size
                olife = p.lives[urg]

        nb = b + 1
        if oside != 0:
            q = 0
            if oside > 0:
                t_px, t_vol = float(m.trade_lo[nb]), float(m.vol_lo[nb])
                through = t_px < oprice - half
            else:
                t_px, t_vol = float(m.trade_hi[nb]), float(m.vol_hi[nb])
                through = t_px > oprice + half
            if through:
                q = osize
            elif abs(t_px - oprice) < half:
                q = int(min(float(osize), max(0.0, t_vol - oqueue)))
                oqueue = max(0.0, oqueue - t_vol)
            if q > 0:
                pos, avg, cash, realised = self.book(pos, avg, cash, realised, oside * q, q * oprice, pv)
                traded += q
                filled += q
                osize -= q
            olife -= 1
            if osize <= 0 or olife <= 0:
                oside, osize = 0, 0
        if oside == 0:
            osize, olife, oprice, oqueue = 0, 0, 0.0, 0.0

        held = pos
        mid1 = float(m.mid[nb])
        upnl_held = (mid1 - avg) * held * pv if held != 0 else 0.0
        end = nb >= e.last
        if end:
            oside, osize, olife, oprice, oqueue = 0, 0, 0, 0.0, 0.0
            if pos != 0:
                cost = self.walk("ask", nb, -pos, beyond) if pos < 0 else self.walk("bid", nb, pos, -beyond)
                traded += abs(pos)
                pos, avg, cash, realised = self.book(pos, avg, cash, realised, -pos, cost, pv)
        cash -= p.commission * traded
        equity1 = cash + pos * mid1 * pv

        pnl_usd = equity1 - equity0
        pnl = pnl_usd / p.risk_unit
        ref = max(float(isv_ref), 1e-3)
        timing = 0.0
        if realised != 0.0:
            r = realised / p.risk_unit
            timing = p.w_timing * min(abs(r), ref) * (1.0 if r > 0 else -1.0)
        persist = p.w_persist * min(max(upnl_held / p.risk_unit, -1.0), 1.0) if held == pos0 and pos0 != 0 else 0.0
        z_vol = max(float(m.market_obs[b, Z_REALISED_VOL]), 0.0)
        regime = -p.w_regime * (abs(held) / p.max_position) * (z_vol / p.clip_sigma) * min(abs(pnl), ref)
        novelty = p.w_novelty * (1.0 - float(e.dir_ema[d]))
        stable = -p.w_stable * abs(held - pos0) / p.max_position
        r32 = np.float32(pnl + novelty + persist + regime + stable + timing)
        comps = [np.float32(x) for x in (pnl, novelty, persist, regime, stable, timing)]
        alpha = np.float32(0.05)
        e.dir_ema = [
            np.float32(x + alpha * (np.float32(1.0 if k == d else 0.0) - x)) for k, x in enumerate(e.dir_ema)
        ]

        if pos == 0:
            bars_in_pos = 0
        elif pos0 != 0 and (pos > 0) == (pos0 > 0):
            bars_in_pos = e.bars_in_pos + 1
        else:
            bars_in_pos = 1
        ep_return = e.ep_return + float(r32)

        next_port = self.portfolio(pos, avg, bars_in_pos, oside, oprice, mid1, nb, e.last)
        stats = [np.float32(traded), np.float32(abs(held) / p.max_position), np.float32(1.0 if end else 0.0),
                 np.float32(ep_return) if end else zero]  # fmt: skip
        a = self.acc[:, i]
        a[0] += 1.0
        a[1] += float(r32)
        a[2:8] += [float(c) for c in comps]
        a[8] += abs(held) / p.max_position
        a[9] += traded
        a[10] += placed
        a[11] += filled
        a[14 + d] += 1.0
        a[18] += pnl_usd
        a[19] += p.commission * traded
        if end:
            a[12] += 1.0
            a[13] += ep_return
        out = StepOut(r32, 1.0 if end else 0.0, nb, next_port, comps, stats)

        if end and self.mode == "collect":
            self.start(e, *self.draw_start(e))
            return out
        e.row, e.pos, e.bars_in_pos = nb, pos, bars_in_pos
        e.oside, e.osize, e.olife, e.frozen = oside, osize, olife, 1 if end else 0
        e.cash, e.avg, e.oprice, e.oqueue, e.ep_return = cash, avg, oprice, oqueue, ep_return
        e.port = list(next_port)
        return out

    # views in the kernels' layouts
    def si(self) -> np.ndarray:
        return np.array([[e.row, e.last, e.pos, e.bars_in_pos, e.oside, e.osize, e.olife, e.frozen]
                         for e in self.envs], np.int64).T  # fmt: skip

    def sf(self) -> np.ndarray:
        return np.array([[e.cash, e.avg, e.oprice, e.oqueue, e.ep_return] for e in self.envs]).T

    def dir_ema(self) -> np.ndarray:
        return np.array([e.dir_ema for e in self.envs], np.float32).T

    def port(self) -> np.ndarray:
        return np.array([e.port for e in self.envs], np.float32)

    def rng(self) -> np.ndarray:
        return np.array([e.rng for e in self.envs], np.uint64)


def outputs_arrays(outs: list[StepOut]) -> dict[str, np.ndarray]:
    """Step outputs in the kernels' layouts."""
    return {
        "reward": np.array([o.reward for o in outs], np.float32),
        "done": np.array([o.done for o in outs], np.float32),
        "next_row": np.array([o.next_row for o in outs], np.int64),
        "next_port": np.array([o.next_port for o in outs], np.float32),
        "comps": np.array([o.comps for o in outs], np.float32).T,
        "stats": np.array([o.stats for o in outs], np.float32).T,
    }


# --- hand-made markets and the side-by-side runner -----------------------------------------------------

# float32 outputs: exact under the simulator; on a GPU the float64 -> float32 chain may differ by FMA rounding
F32_TOL = {"rtol": 2e-6, "atol": 1e-6}
F64_TOL = {"rtol": 1e-12, "atol": 1e-9}
# float64 sums of float32 rewards over a few dozen steps: each term may differ by an FMA rounding on a GPU
SUM_TOL = {"rtol": 1e-6, "atol": 1e-5}


@dataclass
class Bar:
    """One hand-made bar: best bid / ask (price units) with the sizes of their shown levels (one tick apart),
    and the trade summary (lo, vol at lo, hi, vol at hi) or None without trades."""

    bid: float
    bid_sizes: tuple[int, ...]
    ask: float
    ask_sizes: tuple[int, ...]
    trades: tuple[float, int, float, int] | None = None
    z_vol: float = 0.0


def _side(best: float, sizes: tuple[int, ...], step: float) -> tuple[np.ndarray, np.ndarray]:
    px = np.full(N_LEVELS, np.nan)
    sz = np.zeros(N_LEVELS, np.float32)
    for k, s in enumerate(sizes):
        px[k], sz[k] = best + step * k, s
    return px, sz


def hand_market(
    bars: list[Bar], *, day_start: list[int] | None = None, windows: list[tuple[int, int]] | None = None,
    starts: list[int] | None = None, risk_unit: float = 100.0, episode_bars: int = 10,
) -> FoldMarket:  # fmt: skip
    """A FoldMarket made directly from bars (by default one day, one validation window over all bars)."""
    n = len(bars)
    day_start = day_start or [0, n]
    windows = windows or [(day_start[d], day_start[d + 1]) for d in range(len(day_start) - 1)]
    sides = [(_side(b.bid, b.bid_sizes, -TICK), _side(b.ask, b.ask_sizes, TICK)) for b in bars]
    market_obs = np.zeros((n, N_MARKET), np.float32)
    market_obs[:, Z_REALISED_VOL] = [b.z_vol for b in bars]
    trades = [b.trades or (np.nan, 0, np.nan, 0) for b in bars]
    day_of = np.repeat(np.arange(len(day_start) - 1), np.diff(day_start))
    return FoldMarket(
        fold_index=0,
        row0=0,
        days=tuple(f"day{d}" for d in range(len(day_start) - 1)),
        market_obs=market_obs,
        bid_px=np.array([s[0][0] for s in sides]),
        ask_px=np.array([s[1][0] for s in sides]),
        bid_sz=np.array([s[0][1] for s in sides], np.float32),
        ask_sz=np.array([s[1][1] for s in sides], np.float32),
        book_obs=np.zeros((n, BOOK_FEATURES), np.float32),  # the environment reads no snapshot
        mid=np.array([(b.bid + b.ask) / 2 for b in bars]),
        trade_lo=np.array([t[0] for t in trades], np.float64),
        trade_hi=np.array([t[2] for t in trades], np.float64),
        vol_lo=np.array([t[1] for t in trades], np.float32),
        vol_hi=np.array([t[3] for t in trades], np.float32),
        day_start=np.array(day_start, np.int32),
        row_stop=np.array(day_start[1:], np.int32)[day_of],
        train_starts=np.array(starts or [0], np.int32),
        start_difficulty=np.zeros(len(starts or [0])),
        val_windows=np.array(windows, np.int32),
        select_windows=np.zeros((0, 2), np.int32),
        train_stop=n,
        val_start=0,
        stats=NormStats(np.zeros(N_FEATURES), np.ones(N_FEATURES), n),
        book_stats=None,
        forecast=(),
        risk_unit=risk_unit,
        tick_size=TICK,
        point_value=POINT_VALUE,
        episode_bars=episode_bars,
    )


def env_config(**overrides) -> EnvConfig:
    base = {"max_position": 4, "commission": 2.0, "beyond_depth_ticks": 2, "limit_life_patient": 10,
            "limit_life_normal": 4, "limit_life_urgent": 1, "position_history": True}  # fmt: skip
    base.update(overrides)
    if "episode_bars" not in overrides:
        base["episode_bars"] = 10
    return EnvConfig(**base)


class Run:
    """A VecEnv and the reference on the same market, stepped together; `step` compares everything."""

    def __init__(self, stager, market: FoldMarket, env: EnvConfig, *, mode: str, n_envs: int | None = None,
                 seed: int = 7, q_dir_abs_ref: float = 0.05, features: FeatureConfig | None = None,
                 reach: float | None = None) -> None:  # fmt: skip
        """`reach`: the curriculum's reach written into the VecEnv after its construction, then both reset again
        (the constructor's reset at reach 1 mirrored first)."""
        self.stager = stager
        self.stream = stager.stream
        self.features = features or FeatureConfig()
        self.bus = IsvBus(stager)
        isv = stager.download(self.bus.values)
        isv[Isv.Q_DIR_ABS_REF] = q_dir_abs_ref
        stager.upload(isv, self.bus.values)
        self.isv_ref = float(np.float32(q_dir_abs_ref))
        self.market = market
        self.dev = market.upload(stager)
        self.env = VecEnv(self.dev, env, self.features, self.bus.values, stager=stager, mode=mode, n_envs=n_envs,
                          seed=seed)  # fmt: skip
        self.ref = ReferenceEnv(market, Params.of(market, env, self.features), mode,
                                xoroshiro_states_host(self.env.n, seed))  # fmt: skip
        self.ref.reset()
        if reach is not None:
            stager.upload(np.array([reach], np.float64), self.env.reach)
            self.env.reset(stream=self.stream)
            self.ref.reach = reach
            self.ref.reset()
        self.actions = stager.upload_new(np.zeros((self.env.n, 4), np.int32))
        self.check_state("after reset")

    def check_state(self, where: str) -> dict[str, np.ndarray]:
        got = self.env.download_state()
        np.testing.assert_array_equal(got["si"], self.ref.si(), err_msg=f"{where}: si")
        money, sums = slice(0, 4), slice(4, 5)  # sf: cash .. queue in float64; the episode's float32 rewards
        np.testing.assert_allclose(got["sf"][money], self.ref.sf()[money], **F64_TOL, err_msg=f"{where}: sf")
        np.testing.assert_allclose(got["sf"][sums], self.ref.sf()[sums], **SUM_TOL, err_msg=f"{where}: sf")
        np.testing.assert_allclose(got["dir_ema"], self.ref.dir_ema(), **F32_TOL, err_msg=f"{where}: dir_ema")
        np.testing.assert_allclose(got["port"], self.ref.port(), **F32_TOL, err_msg=f"{where}: port")
        f32_sums = np.zeros(N_ACC_REF, bool)
        f32_sums[[*range(1, 8), 13]] = True  # reward, components, episode returns: sums of float32 values
        np.testing.assert_allclose(got["acc"][~f32_sums], self.ref.acc[~f32_sums], **F64_TOL, err_msg=f"{where}: acc")
        np.testing.assert_allclose(got["acc"][f32_sums], self.ref.acc[f32_sums], **SUM_TOL, err_msg=f"{where}: acc")
        states = got["states"]
        np.testing.assert_array_equal(np.stack([states["s0"], states["s1"]], axis=1), self.ref.rng(),
                                      err_msg=f"{where}: rng states")  # fmt: skip
        return got

    def step(self, actions: np.ndarray, where: str = "") -> dict[str, np.ndarray]:
        """One step of both; returns the kernel's outputs and state (host copies)."""
        actions = np.asarray(actions, np.int32).reshape(self.env.n, 4)
        self.stager.upload(actions, self.actions)
        self.env.step(self.actions, stream=self.stream)
        expected = outputs_arrays(self.ref.step(actions, self.isv_ref))
        got = self.check_state(where)
        np.testing.assert_array_equal(got["next_row"], expected["next_row"], err_msg=f"{where}: next_row")
        np.testing.assert_array_equal(got["done"], expected["done"], err_msg=f"{where}: done")
        for name in ("reward", "next_port", "comps", "stats"):
            np.testing.assert_allclose(got[name], expected[name], **F32_TOL, err_msg=f"{where}: {name}")
        return got
