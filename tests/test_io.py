"""Atomic writes leave the old file intact when a write fails half-way."""

import pytest

from fox_numba.errors import InputError
from fox_numba.io import atomic_path, atomic_write_text


def test_interrupted_write_keeps_previous_file(tmp_path):
    target = tmp_path / "store.h5"
    atomic_write_text(target, "old")
    with pytest.raises(RuntimeError, match="half-way"), atomic_path(target) as tmp:
        tmp.write_text("new, partial")
        raise RuntimeError("failed half-way")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["store.h5"]


def test_successful_write_replaces_and_creates_parents(tmp_path):
    target = tmp_path / "a" / "b" / "config.toml"
    atomic_write_text(target, "one")
    atomic_write_text(target, "two")
    assert target.read_text() == "two"
    assert [p.name for p in target.parent.iterdir()] == ["config.toml"]


def test_input_error_names_file_group_field_row():
    err = InputError("es.h5", "crossed book (bid 5000.25 >= ask 5000.00)", group="mbp10/2024-07-01", field="bid_px", row=17)
    assert str(err) == "es.h5, group mbp10/2024-07-01, field bid_px, row 17: crossed book (bid 5000.25 >= ask 5000.00)"
    assert (err.path, err.group, err.field, err.row) == ("es.h5", "mbp10/2024-07-01", "bid_px", 17)
