"""tools/health_diag.py: parse a log back to the records, aggregate runs per fold against numpy."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from fox_numba.diag.layout import FIELDS, SNAPSHOT_DTYPE, format_line

TOOL = Path(__file__).resolve().parents[2] / "tools" / "health_diag.py"


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("health_diag_tool", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_run(path: Path, rng, folds=(0, 1), snaps=3):
    path.mkdir()
    records = {}
    lines = ["fox train: fold 0 starts (not a HEALTH_DIAG line)"]
    for fold in folds:
        records[fold] = []
        for k in range(snaps):
            rec = np.zeros(1, SNAPSHOT_DTYPE)
            for f in FIELDS:
                rec[f.name] = rng.integers(0, 1000) if f.kind == "u32" else np.float32(rng.standard_normal())
            rec["fold"], rec["epoch"] = fold, k
            records[fold].append(rec)
            lines.append(format_line(rec[0]))
    (path / "health_diag.log").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return records


def test_parse_writes_each_snapshot(tool, tmp_path, rng):
    records = write_run(tmp_path / "run", rng)
    out = tmp_path / "diag.jsonl"
    assert tool.main(["parse", str(tmp_path / "run" / "health_diag.log"), "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    flat = [r for fold in (0, 1) for r in records[fold]]
    assert len(rows) == len(flat) == 6
    for row, rec in zip(rows, flat, strict=True):
        assert list(row) == [f.name for f in FIELDS]
        for f in FIELDS:
            assert row[f.name] == rec[f.name][0]


@pytest.mark.parametrize("stat", ["last", "mean"])
def test_aggregate_matches_numpy(tool, tmp_path, rng, stat):
    runs = [write_run(tmp_path / f"seed{s}", rng) for s in range(3)]
    result = tool.aggregate([tmp_path / f"seed{s}" for s in range(3)], stat)
    for fold in (0, 1):
        for name in ("q_abs_ref", "train_dir_short", "grad_norm_raw"):
            per_run = [
                (float(r[fold][-1][name][0]) if stat == "last" else np.mean([float(x[name][0]) for x in r[fold]])) for r in runs
            ]
            got = result[fold][name]
            np.testing.assert_allclose(got["mean"], np.mean(per_run), rtol=1e-12)
            np.testing.assert_allclose(got["std"], np.std(per_run), rtol=1e-9, atol=1e-15)
            assert got["min"] == min(per_run) and got["max"] == max(per_run) and got["n"] == 3


def test_a_foreign_line_names_file_and_line(tool, tmp_path, rng, capsys):
    write_run(tmp_path / "run", rng)
    log = tmp_path / "run" / "health_diag.log"
    log.write_text(log.read_text() + "HEALTH_DIAG fold=0 epoch=x\n")
    assert tool.main(["aggregate", str(tmp_path / "run")]) == 1
    assert "health_diag.log:8:" in capsys.readouterr().err
