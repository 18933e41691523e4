"""The synthetic market: deterministic, a valid book whose trades consume depth, a U-shaped day, a planted
signal that is really there, and an oracle that follows its documented formula.

Statistical tests run on the default market itself (120 days, 46,800 bars, about two seconds to generate
once numba has compiled); each states its tolerance and how far it lies from what a market without the
property gives.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import threading
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from fox_numba.cli import app
from fox_numba.errors import ConfigError
from fox_numba.market import default
from fox_numba.market.schema import NS_PER_MINUTE, UNDEF_PRICE, MarketDay
from fox_numba.market.store import MarketStore
from fox_numba.market.synthetic import (
    STEPS_PER_DAY,
    SynthMarket,
    build_store,
    expected_return,
    generate,
    latent_day,
    sidecar_paths,
)
from fox_numba.market.synthetic_definition import SynthDefinition, load_definition
from test_store import single_file

DEFINITION = Path(default.__file__).resolve().parents[2] / "data" / "default_market.toml"
BARS_PER_DAY = 390
H = 15


@pytest.fixture(scope="module")
def definition() -> SynthDefinition:
    return load_definition(DEFINITION)


@pytest.fixture(scope="module")
def small(definition: SynthDefinition) -> SynthMarket:
    return generate(definition.with_overrides(days=2))


@pytest.fixture(scope="module")
def market(definition: SynthDefinition) -> SynthMarket:
    """The default market, exactly as `fox train` gets it."""
    return generate(definition)


def arrays(m: SynthMarket) -> list[np.ndarray]:
    out = [v for v in vars(m.latent).values() if v is not None]
    for day in m.days:
        for record in (day.bars, day.mbp10, day.trades):
            out.extend(vars(record).values())
    return out


def test_same_seed_is_bit_identical_and_seeds_differ(definition, small):
    again = generate(definition.with_overrides(days=2))
    assert all(a.dtype == b.dtype and np.array_equal(a, b) for a, b in zip(arrays(small), arrays(again), strict=True))
    other = generate(definition.with_overrides(days=2, seed=definition.market.seed + 1))
    assert not np.array_equal(small.latent.x, other.latent.x)
    assert not np.array_equal(small.days[0].trades.size[:100], other.days[0].trades.size[:100])


def test_first_days_do_not_depend_on_how_many_follow(definition, small):
    longer = generate(definition.with_overrides(days=3))
    for a, b in zip(small.days, longer.days[:2], strict=True):
        assert a.day == b.day
        assert np.array_equal(a.mbp10.ask_px, b.mbp10.ask_px) and np.array_equal(a.trades.size, b.trades.size)


def test_calendar_regular_hours_weekdays(small):
    assert [d.day for d in small.days] == ["2024-07-08", "2024-07-09"]
    for day in small.days:
        bars = day.bars.ts_event
        assert bars.size == BARS_PER_DAY
        assert np.all(np.diff(bars.astype(np.int64)) == NS_PER_MINUTE)
        # 09:30 New York on a July day is 13:30 UTC (EDT).
        assert int(bars[0]) % (86_400 * 10**9) == (13 * 60 + 30) * 60 * 10**9
        ts = day.mbp10.ts_event.astype(np.int64)
        assert np.all(np.diff(ts) > 0) and ts[0] == int(bars[0]) and ts[-1] < int(bars[-1]) + NS_PER_MINUTE


def test_book_is_valid_full_and_mostly_one_tick(small):
    tick = small.instrument.tick_fixed
    for day in small.days:
        b = day.mbp10
        assert not np.any(b.bid_px == UNDEF_PRICE) and not np.any(b.ask_px == UNDEF_PRICE)
        assert np.all(b.bid_px[:, 0] < b.ask_px[:, 0])
        assert np.all(np.diff(b.bid_px, axis=1) == -tick) and np.all(np.diff(b.ask_px, axis=1) == tick)
        for name in ("bid_sz", "ask_sz", "bid_ct", "ask_ct"):
            assert getattr(b, name).min() >= 1, name
        spread = (b.ask_px[:, 0] - b.bid_px[:, 0]) // tick
        assert np.mean(spread == 1) > 0.8
    rows = np.concatenate([d.mbp10.bid_sz for d in small.days]).astype(float)
    # ES-like depth: hundreds of contracts at the best level, more further out.
    assert 100 < rows[:, 0].mean() < 1000 and rows[:, 9].mean() > 2 * rows[:, 0].mean()


def test_wide_spreads_come_with_the_volatile_regime(market):
    calm, volatile = [], []
    for i, day in enumerate(market.days):
        b = day.mbp10
        minute = np.minimum((b.ts_event - b.ts_event[0]) // np.uint64(NS_PER_MINUTE), BARS_PER_DAY - 1).astype(int)
        regime = market.latent.regime[i * BARS_PER_DAY : (i + 1) * BARS_PER_DAY][minute]
        wide = (b.ask_px[:, 0] - b.bid_px[:, 0]) > market.instrument.tick_fixed
        calm.append(wide[regime == 0])
        volatile.append(wide[regime == 1])
    calm_rate, volatile_rate = np.concatenate(calm).mean(), np.concatenate(volatile).mean()
    assert 0 < calm_rate < 0.1 and volatile_rate > 3 * calm_rate


def market_orders(day: MarketDay):
    """Each trade group (one market order: one ts_event) with the book row before and after it."""
    t, b = day.trades, day.mbp10
    starts = np.flatnonzero(np.r_[True, t.ts_event[1:] != t.ts_event[:-1]])
    ends = np.r_[starts[1:], t.ts_event.size]
    for s, e in zip(starts, ends, strict=True):
        row = int(np.searchsorted(b.ts_event, t.ts_event[s]))
        assert b.ts_event[row] == t.ts_event[s], "a trade without its book row"
        yield slice(s, e), row - 1, row


def test_market_orders_walk_the_book_and_consume_its_depth(small):
    """One trade per level, at consecutive prices from the best; every level but the last is emptied; after
    the order, the last level lost exactly the traded size and every deeper level is untouched. (When the
    hit side refills at once, back towards the far side, its queues change in the same row: those orders
    are checked on the trades alone.)"""
    tick = small.instrument.tick_fixed
    orders = untouched = walked = 0
    for day in small.days:
        t, b = day.trades, day.mbp10
        for group, pre, post in market_orders(day):
            side = int(t.side[group][0])
            assert np.all(t.side[group] == side) and side in (1, -1)
            # Prices of the side being hit, signed so that deeper is larger (asks for a buyer, bids negated).
            book_px = b.ask_px if side == 1 else -b.bid_px
            book_sz = (b.ask_sz if side == 1 else b.bid_sz).astype(np.int64)
            px, sz = side * t.price[group], t.size[group].astype(np.int64)
            n = px.size
            assert px[0] == book_px[pre, 0] and np.all(np.diff(px) == tick), "prices walk level by level"
            assert np.array_equal(sz[:-1], book_sz[pre, : n - 1]), "every level but the last is emptied"
            assert 1 <= sz[-1] <= book_sz[pre, n - 1]
            left = book_sz[pre, n - 1] - sz[-1]
            orders += 1
            walked += n > 1
            if book_px[post, 0] < px[-1] or (book_px[post, 0] == px[-1] and left == 0):
                continue
            untouched += 1
            expect = {int(book_px[pre, k]): int(book_sz[pre, k]) for k in range(n, book_px.shape[1])}
            expect[int(px[-1])] = int(left)
            for k in range(book_px.shape[1]):
                price = int(book_px[post, k])
                if price in expect:
                    assert book_sz[post, k] == expect[price], (day.day, post, k)
    assert orders > 1000 and walked > 100 and untouched > 0.6 * orders


def test_bars_are_the_trades_minute_by_minute(small):
    for day in small.days:
        t, bars = day.trades, day.bars
        minute = ((t.ts_event - bars.ts_event[0]) // np.uint64(NS_PER_MINUTE)).astype(int)
        volume = np.bincount(minute, weights=t.size.astype(float), minlength=BARS_PER_DAY)
        assert np.array_equal(bars.volume, volume.astype(np.uint64))
        for m in np.flatnonzero(volume)[:50]:
            px = t.price[minute == m]
            assert (bars.open[m], bars.high[m], bars.low[m], bars.close[m]) == (px[0], px.max(), px.min(), px[-1])
        quiet = np.flatnonzero(volume == 0)
        for m in quiet[quiet > 0]:
            assert bars.open[m] == bars.high[m] == bars.low[m] == bars.close[m] == bars.close[m - 1]


def test_intraday_volume_is_u_shaped(market):
    """Designed: the first and last half hours trade about 3x the midday volume (u = 1 + 2(2 tau - 1)^2
    plus an opening burst; measured 3.2 and 2.6). Without a U, each 30-minute x 120-day mean would match
    midday within about 5% (per-minute volume has a coefficient of variation near 1, averaged over 3,600
    minutes), so a 1.5x ratio at both ends is far more than five standard errors away from a flat day."""
    volume = np.stack([d.bars.volume for d in market.days]).astype(float).mean(axis=0)
    midday = volume[165:225].mean()
    assert volume[:30].mean() > 1.5 * midday and volume[-30:].mean() > 1.5 * midday


def minute_ofi(day: MarketDay) -> np.ndarray:
    """Multi-level OFI per minute (Cont, Kukanov, Stoikov): per level, the bid queue's contribution minus
    the ask queue's, over consecutive MBP-10 rows, divided by the level's mean depth, summed over levels."""
    b = day.mbp10
    bp, ap = b.bid_px, b.ask_px
    bs, asz = b.bid_sz.astype(float), b.ask_sz.astype(float)
    e_bid = np.where(bp[1:] > bp[:-1], bs[1:], np.where(bp[1:] == bp[:-1], bs[1:] - bs[:-1], -bs[:-1]))
    e_ask = np.where(ap[1:] < ap[:-1], asz[1:], np.where(ap[1:] == ap[:-1], asz[1:] - asz[:-1], -asz[:-1]))
    minute = ((b.ts_event[1:] - b.ts_event[0]) // np.uint64(NS_PER_MINUTE)).astype(int)
    per = np.zeros((BARS_PER_DAY, bp.shape[1]))
    np.add.at(per, minute, (e_bid - e_ask) / (bs + asz).mean(axis=0))
    return per.sum(axis=1)


def test_latent_state_shows_in_multi_level_ofi(market):
    """The minute's OFI correlates with the latent state (0.075 here, about 0.07 across seeds). Per-minute
    OFI is nearly serially uncorrelated, so without a link the sample correlation over N = 46,800 minutes
    has standard error 1/sqrt(N) = 0.0046: the 0.04 floor is 8.7 standard errors from zero. Summed over
    15 minutes the link is 0.21; the 0.1 floor is 5.6 standard errors (N/15 windows)."""
    ofi = np.stack([minute_ofi(d) for d in market.days])
    x = market.latent.x.reshape(ofi.shape)
    assert np.corrcoef(ofi.ravel(), x.ravel())[0, 1] > 0.04
    csum = np.cumsum(ofi, axis=1)
    sum15 = csum[:, H - 1 :] - np.c_[np.zeros(len(ofi)), csum[:, :-H]]
    assert np.corrcoef(sum15.ravel(), x[:, H - 1 :].ravel())[0, 1] > 0.1


def test_latent_state_tilts_aggressors_and_depth(market):
    """Buyer-initiated market orders and bid depth rise with x (designed: sigmoid(mo_tilt * x) and tilted
    queue sizes). Measured 0.25 (trade-count imbalance) and 0.068 (close-book depth imbalance over 10
    levels); the floors 0.15 and 0.04 are 32 and 8.7 null standard errors (0.0046) from zero."""
    count_imb, depth_imb = [], []
    for day in market.days:
        t, b = day.trades, day.mbp10
        minute = ((t.ts_event - b.ts_event[0]) // np.uint64(NS_PER_MINUTE)).astype(int)
        n = np.bincount(minute, minlength=BARS_PER_DAY)
        signed = np.bincount(minute, weights=t.side.astype(float), minlength=BARS_PER_DAY)
        count_imb.append(np.where(n > 0, signed / np.maximum(n, 1), 0.0))
        ends = b.ts_event[0] + np.arange(1, BARS_PER_DAY + 1, dtype=np.uint64) * np.uint64(NS_PER_MINUTE)
        close = np.searchsorted(b.ts_event, ends) - 1
        bid, ask = b.bid_sz[close].sum(axis=1).astype(float), b.ask_sz[close].sum(axis=1).astype(float)
        depth_imb.append((bid - ask) / (bid + ask))
    x = market.latent.x
    assert np.corrcoef(np.concatenate(count_imb), x)[0, 1] > 0.15
    assert np.corrcoef(np.concatenate(depth_imb), x)[0, 1] > 0.04


def test_latent_expected_return_predicts_the_next_minutes(market):
    """er is the exact expected change of the efficient price f over the next 15 minutes, so regressing the
    realised change on er gives slope 1 in expectation (0.95 and 1.00 measured over 300-day runs); the mid
    follows f within about a tick, so its slope is the same (0.97 and 0.97 here). Over 120 days the
    slope's standard error is about 0.08 (15-minute windows, persistent er): [0.6, 1.4] holds 1 by five
    standard errors, and a market without the signal (slope 0) would need a 7-standard-error accident to
    pass. The mid's gap to f at bar closes has a standard deviation of about 0.9 ticks."""
    latent = market.latent
    er = latent.expected_return.reshape(-1, BARS_PER_DAY)[:, :-H].ravel()
    for price in (latent.efficient_price, latent.mid):
        p = price.reshape(-1, BARS_PER_DAY)
        realised = (p[:, H:] - p[:, :-H]).ravel()
        slope = np.cov(er, realised)[0, 1] / er.var(ddof=1)
        assert 0.6 < slope < 1.4
        assert np.corrcoef(er, realised)[0, 1] > 0.1
    gap = (latent.efficient_price - latent.mid) / market.instrument.tick_size
    assert gap.std() < 1.5 and abs(gap.mean()) < 0.1


def test_expected_return_matches_the_markov_chain(definition):
    """The closed form E[vol_{m+k} | r_m] = vbar + lambda^k (vol_i - vbar) against transition-matrix powers."""
    d = definition
    lat = latent_day(np.random.default_rng(7), BARS_PER_DAY, d)
    q0, q1 = d.regimes.leave_prob
    transition = np.array([[1 - q0, q0], [q1, 1 - q1]])
    vol = np.array(d.regimes.vol_ticks)
    want = np.zeros(BARS_PER_DAY)
    for m in range(BARS_PER_DAY):
        for k in range(1, H + 1):
            if m + k < BARS_PER_DAY:
                ev = (np.linalg.matrix_power(transition, k) @ vol)[lat.regime[m]]
                want[m] += d.latent.phi**k * np.sqrt(lat.u[m + k]) * ev
    want *= d.latent.beta * lat.x
    np.testing.assert_allclose(expected_return(lat, d, H), want, rtol=1e-12, atol=1e-12)


def oracle_reference(er, mid, half, tick, point_value, commission):
    """The oracle's formula written out bar by bar (module docstring of synthetic_oracle)."""
    threshold = 2 * (tick / 2 + commission / point_value)
    daily = []
    for e, p, hs in zip(er, mid, half, strict=True):
        pnl, pos = 0.0, 0
        for m in range(len(e)):
            if m == len(e) - 1:
                new = 0
            elif abs(e[m]) > threshold:
                new = 1 if e[m] > 0 else -1
            elif pos * e[m] > 0:
                new = pos
            else:
                new = 0
            if m > 0:
                pnl += pos * (p[m] - p[m - 1]) * point_value
            pnl -= abs(new - pos) * (hs[m] * point_value + commission)
            pos = new
        daily.append(pnl)
    daily = np.array(daily)
    return daily, daily.mean() / daily.std(ddof=1) * np.sqrt(252)


def test_oracle_follows_its_formula_and_is_positive(market, definition):
    latent, shape = market.latent, (-1, BARS_PER_DAY)
    daily, sharpe = oracle_reference(
        latent.expected_return.reshape(shape), latent.mid.reshape(shape), latent.half_spread.reshape(shape),
        definition.market.tick_size, definition.market.point_value, definition.oracle.commission,
    )
    np.testing.assert_allclose(market.oracle.daily_pnl, daily, rtol=1e-12, atol=1e-9)
    assert market.oracle.sharpe == pytest.approx(sharpe, rel=1e-12)
    assert market.oracle.sharpe > 3
    assert np.all(market.oracle.position.reshape(shape)[:, -1] == 0)


def test_store_round_trip_with_oracle_attrs_and_sidecars(definition, tmp_path):
    spec = definition.with_overrides(days=2)
    out = tmp_path / "synth.h5"
    messages: list[str] = []
    built = build_store(spec, out, progress=messages.append)
    assert messages[-1] == "2024-07-09 written" and len(messages) == 2 * STEPS_PER_DAY
    with MarketStore(out) as store:
        assert store.days() == ["2024-07-08", "2024-07-09"]
        assert store.attrs["definition_hash"] == spec.digest()
        assert store.attrs["oracle_sharpe"] == built.oracle.sharpe
        assert store.attrs["oracle_horizon_minutes"] == H
        day = store.read_day("2024-07-09")
        assert np.array_equal(day.mbp10.bid_sz, built.days[1].mbp10.bid_sz)
        assert np.array_equal(day.bars.close, built.days[1].bars.close)
    oracle_json, latent_npz = sidecar_paths(out)
    summary = json.loads(oracle_json.read_text())
    assert summary["oracle_sharpe"] == built.oracle.sharpe and summary["definition_hash"] == spec.digest()
    with np.load(latent_npz) as z:
        assert np.array_equal(z["expected_return"], built.latent.expected_return)
        assert np.array_equal(z["oracle_position"], built.oracle.position)
        assert z["ts_event"].size == 2 * BARS_PER_DAY


def write_definition(path: Path, **replace: str) -> Path:
    text = DEFINITION.read_text()
    for old, new in replace.items():
        assert old in text
        text = text.replace(old, new)
    path.write_text(text)
    return path


def test_default_store_is_built_once_and_rebuilt_when_the_definition_changes(tmp_path, monkeypatch):
    spec = write_definition(tmp_path / "market.toml", **{"days = 120": "days = 1"})
    monkeypatch.setattr(default, "DEFINITION_PATH", spec)
    monkeypatch.setenv(default.DATA_DIR_ENV, str(tmp_path / "cache"))
    store = default.ensure_default_store()
    assert store == tmp_path / "cache" / "default_market.h5"
    first = store.stat().st_mtime_ns
    spec.write_text(spec.read_text().replace("[market]", "# a comment changes nothing\n[market]"))
    assert default.ensure_default_store() == store and store.stat().st_mtime_ns == first
    write_definition(spec, **{"days = 120": "days = 1", "seed = 20240708": "seed = 5"})
    default.ensure_default_store()
    with MarketStore(store) as s:
        assert s.attrs["seed"] == 5 and s.attrs["definition_hash"] == load_definition(spec).digest()
    store.write_bytes(b"not a store")
    default.ensure_default_store()
    with MarketStore(store) as s:
        assert s.attrs["seed"] == 5


def test_a_default_store_written_before_day_digests_is_rebuilt(tmp_path, monkeypatch):
    """A build whose groups lack their digest (made before day digests existed) is rebuilt; one of the single-file
    layout with its digests is reused as it is."""
    spec = write_definition(tmp_path / "market.toml", **{"days = 120": "days = 1"})
    monkeypatch.setattr(default, "DEFINITION_PATH", spec)
    monkeypatch.setenv(default.DATA_DIR_ENV, str(tmp_path / "cache"))
    store = default.ensure_default_store()
    digest = load_definition(spec).digest()
    single_file(store)
    first = store.stat().st_mtime_ns
    assert default.built_hash(store) == digest
    assert default.ensure_default_store() == store and store.stat().st_mtime_ns == first
    single_file(store, digests=False)
    assert default.built_hash(store) is None
    default.ensure_default_store()
    with MarketStore(store) as s:
        assert s.undigested() == [] and s.day_file("mbp10", s.days()[0]) is not None
    assert default.built_hash(store) == digest


def test_default_paths(monkeypatch, tmp_path):
    monkeypatch.delenv(default.DATA_DIR_ENV, raising=False)
    assert default.default_store_path() == DEFINITION.parent / "cache" / "default_market.h5"
    assert default.default_definition_path() == DEFINITION
    monkeypatch.setattr(default, "DEFINITION_PATH", tmp_path / "absent.toml")
    with pytest.raises(ConfigError, match="absent.toml: the default market definition is missing"):
        default.ensure_default_store()


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("phi = 0.97", "phi = 0.97\nphy = 1.0", r"\[latent\] has unknown keys \['phy'\]"),
        ("gamma = 1.0 ", "# gamma removed ", r"\[book\] lacks \['gamma'\]"),
        ("days = 120", 'days = "120"', "market.days: expected int"),
        ('start_date = "2024-07-08"', 'start_date = "2024-07-06"', r"not a trading day YYYY-MM-DD \(a Saturday\)"),
        ('start_date = "2024-07-08"', 'start_date = "2024-09-02"', r"not a trading day YYYY-MM-DD \(Labor Day\)"),
        ("vol_ticks = [2.5, 5.0]", "vol_ticks = [2.5]", "regimes.vol_ticks needs two"),
        ("vol_ticks = [2.5, 5.0]", 'vol_ticks = [2.5, "5"]', r"regimes\.vol_ticks\[1\]: expected float"),
        ("phi = 0.97", "phi = nan", r"latent\.phi: nan is not a finite number"),
    ],
)
def test_bad_definitions_name_the_key(tmp_path, old, new, message):
    with pytest.raises(ConfigError, match=message):
        load_definition(write_definition(tmp_path / "bad.toml", **{old: new}))


DEFAULT_DIGEST = "fc2fe526252549ec7a18015042b1e306dd6e15d9b8f5f1da81e6453c7c4b2a8f"
DEFAULT_ARRAYS_SHA256 = "f99994bf86666420a89dd19066494530f4f73f955bcac648e1a5e4c842cd65d8"
"""The default market's definition digest and the sha256 of every array it generates, recorded before the optional
[switching] table existed: adding a process must change neither (else the cached stores and every earlier result
would silently refer to another market)."""


def test_default_market_is_unchanged(definition, market):
    assert definition.switching is None and definition.digest() == DEFAULT_DIGEST
    assert market.latent.revert is None and market.latent.displacement is None
    h = hashlib.sha256()
    for a in arrays(market):
        h.update(np.ascontiguousarray(a).tobytes())
    h.update(market.oracle.daily_pnl.tobytes())
    h.update(market.oracle.position.tobytes())
    assert h.hexdigest() == DEFAULT_ARRAYS_SHA256


def test_definition_hash_follows_parameters_only(definition):
    assert definition.digest() == load_definition(DEFINITION).digest()
    assert definition.with_overrides(seed=1).digest() != definition.digest()
    assert definition.with_overrides(days=2).digest() != definition.digest()


def test_fox_data_synth_writes_a_store_and_prints_a_summary(tmp_path):
    out = tmp_path / "cli.h5"
    result = CliRunner().invoke(app, ["data", "synth", "--out", str(out), "--days", "1", "--seed", "3"])
    assert result.exit_code == 0, result.output
    assert out.is_file() and all(p.is_file() for p in sidecar_paths(out))
    lines = dict(line.split(maxsplit=1) for line in result.stdout.splitlines() if line.strip())
    assert lines["days"].startswith("1 (2024-07-08 to 2024-07-08), seed 3")
    assert lines["bars"] == "390"
    assert int(lines["book"].split()[-1].replace(",", "")) > 1000
    assert lines["oracle"].startswith("Sharpe ")
    assert os.path.basename(out) in lines["store"]


def test_a_run_waits_for_another_building_the_default_store_and_reuses_its_build(tmp_path, monkeypatch):
    """Runs started together on a fresh checkout: the one that finds the build lock held waits, then finds the store
    built and builds nothing."""
    spec = write_definition(tmp_path / "market.toml", **{"days = 120": "days = 1"})
    monkeypatch.setattr(default, "DEFINITION_PATH", spec)
    monkeypatch.setenv(default.DATA_DIR_ENV, str(tmp_path / "cache"))
    store = default.default_store_path()
    store.parent.mkdir(parents=True)
    other = open(store.with_name(store.name + default.BUILD_LOCK), "a")  # another open file: flock as another process
    fcntl.flock(other, fcntl.LOCK_EX)
    builds, said = [], []

    def build(definition, out, progress=None):
        builds.append(out)
        return build_store(definition, out, progress)

    def other_builds_then_releases():
        build_store(load_definition(spec), store)
        other.close()

    monkeypatch.setattr(default, "build_store", build)
    worker = threading.Timer(0.3, other_builds_then_releases)
    worker.start()
    assert default.ensure_default_store(said.append) == store
    worker.join()
    assert builds == [] and said == ["waiting for another process building the default market"]
    assert default.built_hash(store) == load_definition(spec).digest()
