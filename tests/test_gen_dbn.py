"""tools/gen_dbn.py: the event book changes one thing per record, as a real MBP-10 feed does, its records say
what changed, the importer takes its files whole; the fresh book keeps the draws the earlier figures used."""

from __future__ import annotations

from pathlib import Path

import databento_dbn as dbn
import numpy as np
import pytest
import zstandard

from fox_numba.market.importer import import_market
from fox_numba.market.schema import N_LEVELS, Instrument
from tests.tool_loader import tool_module

TICK = Instrument().tick_fixed
ESU4 = Path(__file__).parent / "fixtures/databento_esu4_mbp1"
MBP1 = ESU4 / "futures_mbp-1_2024-07-01T23-58_2024-07-02T00-02.dbn.zst"


@pytest.fixture(scope="module")
def gen():
    yield from tool_module("gen_dbn")


@pytest.fixture(scope="module")
def day(gen):
    return gen.day_records("2024-07-08", 20_000, np.random.default_rng(7), "events", 0.05)


def sides(book: np.ndarray, field: str) -> np.ndarray:
    """[rows, 2, N_LEVELS] of a level field, bid then ask."""
    lv = book["levels"]
    return np.stack([lv[f"bid_{field}"], lv[f"ask_{field}"]], axis=1).astype(np.int64)


def test_event_book_changes_one_level_or_shifts_one_tick(day):
    book, trades = day
    px, sz, ct = sides(book, "px"), sides(book, "sz"), sides(book, "ct")
    assert (sz >= 1).all() and (ct >= 1).all()
    assert (px[:, 0, 0] < px[:, 1, 0]).all() and (np.diff(px[:, 0], axis=1) == -TICK).all()
    move = np.diff(px[:, 0, 0]) // TICK
    assert set(np.unique(move)) == {-1, 0, 1}
    shifted = move != 0
    # 19,999 draws at p = 0.05: mean 1,000, sd 31; +-150 is 4.9 sd, and a generator that never or always shifts fails
    assert abs(int(shifted.sum()) - 1000) < 150
    for r in np.flatnonzero(~shifted)[:3000] + 1:
        changed = np.argwhere(sz[r] != sz[r - 1])
        assert len(changed) == 1, r  # one level of one side, its count moving with it
        (s, k) = changed[0]
        assert (np.argwhere(ct[r] != ct[r - 1]) == changed[0]).all() or ct[r - 1, s, k] == 1
        add = sz[r, s, k] > sz[r - 1, s, k]
        assert book["action"][r] == (b"A" if add else b"C") and book["side"][r] == (b"A" if s else b"B")
        assert book["depth"][r] == k and book["size"][r] == abs(sz[r, s, k] - sz[r - 1, s, k])
        assert book["price"][r] == px[r, s, k]
    for r in np.flatnonzero(shifted) + 1:
        gain = 0 if move[r - 1] > 0 else 1  # an up-tick adds a bid level and takes the ask's top
        assert (sz[r, gain, 1:] == sz[r - 1, gain, :-1]).all()
        assert (sz[r, 1 - gain, :-1] == sz[r - 1, 1 - gain, 1:]).all()
        assert book["depth"][r] == 0 and book["size"][r] == sz[r, gain, 0] and book["price"][r] == px[r, gain, 0]
    assert (np.diff(book["ts_event"].astype(np.int64)) >= 0).all() and (book["ts_recv"] > book["ts_event"]).all()
    assert trades.size == 5000 and (trades["ts_event"] <= book["ts_event"][-1]).all()


def test_shift_share_is_real_es_mbp1s(gen):
    """`SHIFT_SHARE` is the share of real ESU4 MBP-1 records whose top bid or ask price differs from the record
    before (84 of 2,287)."""
    raw = zstandard.ZstdDecompressor().stream_reader(MBP1.open("rb")).read()
    decoder = dbn.DBNDecoder()
    decoder.write(raw)
    top = np.array([(r.levels[0].bid_px, r.levels[0].ask_px) for r in decoder.decode() if hasattr(r, "levels")])
    assert len(top) == 2288
    assert round(float((np.diff(top, axis=0) != 0).any(axis=1).mean()), 3) == gen.SHIFT_SHARE


def test_fresh_book_keeps_the_earlier_draws(gen):
    rows = 500
    book, _ = gen.day_records("2024-07-08", rows, np.random.default_rng(3), "fresh")
    rng = np.random.default_rng(3)
    walk = np.cumsum(rng.choice(np.array([-1, 0, 0, 0, 0, 0, 0, 1]), rows))
    assert (book["levels"]["bid_px"][:, 0] == gen.PX + TICK * walk).all()
    for name, high in (("bid_sz", 200), ("ask_sz", 200), ("bid_ct", 20), ("ask_ct", 20)):
        assert (book["levels"][name] == rng.integers(1, high + 1, size=(rows, N_LEVELS), dtype=np.uint32)).all()


def test_event_files_import_whole(gen, tmp_path):
    """Every event record changes the 10-level book, so the importer keeps every one."""
    gen.main([str(tmp_path / "dbn"), "--rows", "3000", "--days", "1"])
    result = import_market([tmp_path / "dbn"], tmp_path / "store.h5")
    rows = result.rows["2024-07-08"]
    assert (rows["mbp10"], rows["trades"]) == (3000, 750) and 0 < rows["bars"] <= 390  # bars: minutes with a trade
