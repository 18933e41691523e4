"""The ISV slot table: seed indices, one named constant per slot, fingerprint, generated docs, the bus."""

import ast
from pathlib import Path

import numpy as np
import pytest

import fox_numba
from fox_numba.device import isv
from fox_numba.device.isv import (
    ISV_FINGERPRINT,
    ISV_TOTAL_DIM,
    MOE_LAMBDA_BASE,
    SLOT_DOC_PATH,
    SLOTS,
    Isv,
    IsvBus,
    Slot,
    bootstrap_values,
    fold_reset_entries,
    layout_fingerprint,
    slot_table_markdown,
)
from fox_numba.device.runtime import new_stream
from fox_numba.device.staging import Stager

KERNELS_DIR = Path(fox_numba.__file__).parent / "kernels"


def test_the_table_covers_every_index_once():
    assert ISV_TOTAL_DIM == 131 == len(SLOTS)
    assert [s.index for s in SLOTS] == list(range(ISV_TOTAL_DIM))
    assert len({s.name for s in SLOTS}) == ISV_TOTAL_DIM
    assert all(Isv[s.name] == s.index for s in SLOTS)


def test_seed_indices_are_kept():
    assert (Isv.Q_ABS_REF, Isv.Q_DIR_ABS_REF) == (16, 21)
    assert (Isv.MOE_LAMBDA_EFF, Isv.Q_DRIFT_RATE, Isv.FOLD_WARMUP_FACTOR) == (128, 129, 130)
    reward = [s for s in SLOTS if 63 <= s.index <= 68]
    assert all(s.name.startswith("REWARD_") and s.name.endswith("_EMA") for s in reward)
    assert [s.name for s in SLOTS[118:127]] == [f"MOE_UTIL_EMA_{k}" for k in range(8)] + ["MOE_GATE_ENTROPY_EMA"]


def test_seed_bootstrap_and_fold_reset_values():
    by = {s.name: s for s in SLOTS}
    assert by["Q_ABS_REF"].bootstrap == by["Q_DIR_ABS_REF"].bootstrap == pytest.approx(0.05)
    assert (by["FOLD_WARMUP_FACTOR"].bootstrap, by["FOLD_WARMUP_FACTOR"].fold_reset) == (1.0, 0.0)
    assert by["Q_DRIFT_RATE"].fold_reset == 0.0 and by["GRAD_NORM_FAST_EMA"].fold_reset == 0.0
    assert by["GRAD_NORM_SLOW_EMA"].fold_reset is None  # the cross-fold baseline carries over
    # the MoE controller restarts every fold from its base weight, its input EMAs unobserved (seeded again)
    assert (by["MOE_LAMBDA_EFF"].bootstrap, by["MOE_LAMBDA_EFF"].fold_reset) == (MOE_LAMBDA_BASE, MOE_LAMBDA_BASE)
    assert all(by[n].fold_reset == 0.0 for n in ("MOE_UTIL_EMA_0", "MOE_GATE_ENTROPY_EMA", "MOE_MAX_UTIL_EMA"))


def test_unnamed_indices_are_reserved_and_named_ones_are_documented():
    for s in SLOTS:
        if s.reserved:
            assert s.name == f"RESERVED_{s.index:03d}" and s.fold_reset is None
        else:
            assert s.meaning and s.producer and s.consumers, s.name


def test_fingerprint_covers_names_indices_and_total():
    assert layout_fingerprint() == ISV_FINGERPRINT and len(ISV_FINGERPRINT) == 16
    renamed = tuple(Slot("Q_SCALE", 16, "", "", "") if s.index == 16 else s for s in SLOTS)
    swapped = tuple(
        Slot(s.name, {16: 21, 21: 16}.get(s.index, s.index), "", "", "") for s in SLOTS
    )
    reworded = tuple(Slot(s.name, s.index, "other meaning", "x", "y", 9.0, 1.0) for s in SLOTS)
    assert layout_fingerprint(renamed) != ISV_FINGERPRINT
    assert layout_fingerprint(swapped) != ISV_FINGERPRINT
    assert layout_fingerprint(SLOTS, ISV_TOTAL_DIM + 1) != ISV_FINGERPRINT
    assert layout_fingerprint(reworded) == ISV_FINGERPRINT  # docs are not layout


def test_committed_slot_table_is_the_generated_one():
    assert SLOT_DOC_PATH.read_text() == slot_table_markdown(), (
        "fox_numba/device/ISV_SLOTS.md is stale: run python -m fox_numba.device.isv --write"
    )
    for s in SLOTS:
        if not s.reserved:
            assert f"| {s.index} | {s.name} |" in SLOT_DOC_PATH.read_text()


def test_bus_starts_at_bootstrap_and_fold_reset_writes_only_reset_slots():
    stream = new_stream()
    stager = Stager(stream, chunk_bytes=256)
    bus = IsvBus(stager)
    np.testing.assert_array_equal(bus.read(), bootstrap_values())
    assert bus.read()[Isv.FOLD_WARMUP_FACTOR] == 1.0

    trained = np.random.default_rng(5).uniform(1.0, 2.0, ISV_TOTAL_DIM).astype(np.float32)
    stager.upload(trained, bus.values)
    bus.fold_reset(stream)
    index, values = fold_reset_entries()
    expected = trained.copy()
    expected[index] = values
    got = bus.read()
    np.testing.assert_array_equal(got, expected)
    carried = [s.index for s in SLOTS if s.fold_reset is None]
    np.testing.assert_array_equal(got[carried], trained[carried])


def isv_literal_subscripts(source: str) -> list[int]:
    """Lines where an array whose name contains 'isv' is indexed by an integer literal."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)):
            continue
        literal = isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, int)
        if "isv" in node.value.id.lower() and literal:
            lines.append(node.lineno)
    return lines


def test_no_kernel_indexes_the_isv_with_a_literal():
    assert isv_literal_subscripts("def k(isv, slot):\n    isv[16] = isv[slot]\n") == [2]
    offenders = {p.name: isv_literal_subscripts(p.read_text()) for p in KERNELS_DIR.glob("*.py")}
    assert not {k: v for k, v in offenders.items() if v}, "use an int32 slot argument or an Isv constant"


def test_generator_writes_the_doc(tmp_path, monkeypatch):
    target = tmp_path / "ISV_SLOTS.md"
    monkeypatch.setattr(isv, "SLOT_DOC_PATH", target)
    assert isv.main(["--write"]) == 0
    assert target.read_text() == slot_table_markdown()
