"""Atomic writes leave the old file intact when a write fails half-way, name the target in their errors,
and remove the temporary files that killed writers left behind."""

import os
import signal
import subprocess
import sys

import pytest

from fox_numba.errors import InputError, Interrupted, OutputError
from fox_numba.io import atomic_path, atomic_write_text, temporary_path


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


def dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    return int(proc.stdout)


def test_temporary_files_of_dead_writers_are_removed_at_the_next_write(tmp_path):
    target = tmp_path / "store.h5"
    stale, live, other = temporary_path(target, dead_pid()), temporary_path(target, os.getppid()), tmp_path / ".x.h5.tmp-1"
    for path in (stale, live, other):
        path.write_bytes(b"partial")
    atomic_write_text(target, "new")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([target.name, live.name, other.name])


def test_an_interrupted_write_names_its_target_as_unchanged(tmp_path):
    target = tmp_path / "store.h5"
    atomic_write_text(target, "old")
    with pytest.raises(Interrupted) as info, atomic_path(target) as tmp:
        tmp.write_text("new, partial")
        raise Interrupted(signal.SIGTERM)
    assert info.value.unchanged == [target] and target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["store.h5"]


def test_write_errors_name_the_target_not_the_temporary_file(tmp_path):
    with pytest.raises(OutputError, match=f"^{tmp_path}: is a folder; name a file to write$"):
        atomic_write_text(tmp_path, "x")
    target = tmp_path / "store.h5"
    with pytest.raises(OutputError) as info, atomic_path(target) as tmp:
        raise OSError(28, "No space left on device", str(tmp))
    assert str(info.value) == f"{target}: cannot write it (No space left on device)"
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(OutputError, match=f"^{blocker / 'store.h5'}: cannot write here"):
        atomic_write_text(blocker / "store.h5", "x")
