"""The HEALTH_DIAG layout: pinned size and order, the generated table, and an exact line round trip."""

import numpy as np
import pytest

from fox_numba.device.isv import Isv
from fox_numba.diag import layout
from fox_numba.diag.layout import FIELDS, N_WORDS, SNAPSHOT_DTYPE, ParseError, format_line, parse_line, to_record


def test_size_and_order_are_pinned():
    """107 words, no padding; a field added, removed or moved changes these (update them on purpose)."""
    assert N_WORDS == 107
    assert SNAPSHOT_DTYPE.itemsize == 4 * N_WORDS
    assert [f.name for f in FIELDS[:4]] == ["fold", "epoch", "step", "reward_pnl"]
    assert FIELDS[-1].name == "kill_collapse_epochs"
    assert layout.layout_fingerprint() == "4c34e6b4df92ee60"
    offsets = [SNAPSHOT_DTYPE.fields[f.name][1] for f in FIELDS]
    assert offsets == list(range(0, 4 * N_WORDS, 4))


def test_generated_table_is_current():
    assert layout.DOC_PATH.read_text(encoding="utf-8") == layout.table_markdown(), (
        "run: python -m fox_numba.diag.layout --write"
    )


def test_mirror_table_names_real_slots():
    slots, words = layout.mirror_table()
    assert len(slots) == sum(f.isv is not None for f in FIELDS) > 40
    for slot, word in zip(slots, words, strict=True):
        assert Isv[FIELDS[word].isv] == slot


def random_record(rng):
    rec = np.zeros(1, SNAPSHOT_DTYPE)
    for f in FIELDS:
        if f.kind == "u32":
            rec[f.name] = rng.integers(0, 2**32, dtype=np.uint64)
        else:
            rec[f.name] = np.float32(rng.standard_normal() * 10.0 ** rng.integers(-30, 30))
    rec["q_mean"], rec["q_std"], rec["q_max_abs"] = np.nan, np.inf, -np.inf
    rec["td_abs"] = np.float32(1e-45)  # a subnormal
    return rec


def test_format_parse_round_trip_is_exact(rng):
    for _ in range(20):
        rec = random_record(rng)
        line = format_line(rec[0])
        back = to_record(parse_line(line))
        for f in FIELDS:
            assert np.array_equal(back[f.name], rec[f.name], equal_nan=True), f.name
            assert np.signbit(back[f.name]) == np.signbit(rec[f.name]) or f.kind == "u32"
        assert line.startswith("HEALTH_DIAG fold=")


def test_parser_refuses_other_layouts(rng):
    line = format_line(random_record(rng)[0])
    with pytest.raises(ParseError, match="not a HEALTH_DIAG line"):
        parse_line("METRICS " + line[len("HEALTH_DIAG ") :])
    with pytest.raises(ParseError, match="has 106 fields"):
        parse_line(line.rsplit(" ", 1)[0])
    swapped = line.replace("fold=", "folds=", 1)
    with pytest.raises(ParseError, match="item 0 is 'folds'"):
        parse_line(swapped)
    with pytest.raises(ParseError, match="field epoch"):
        parse_line(line.replace("epoch=", "epoch=x", 1))
