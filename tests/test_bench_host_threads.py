"""tools/bench_host_threads.py on a tiny fit: one row per (threads, processes), each child's fit timed under the
thread variables the row names, the table written with its command."""

from __future__ import annotations

import json

import pytest
from tool_loader import tool_module


@pytest.fixture(scope="module")
def tool():
    yield from tool_module("bench_host_threads")


def test_rows_for_every_setting_and_count(tool, tmp_path):
    out = tmp_path / "h"
    argv = ["--out", str(out), "--runs", "1", "2", "--threads", "default", "1", "--rows", "300", "--columns", "6",
            "--reps", "2"]
    assert tool.main(argv) == 0
    rows = json.loads((tmp_path / "h.json").read_text())["rows"]
    assert [(r["threads"], r["processes"]) for r in rows] == [("default", 1), ("default", 2), ("1", 1), ("1", 2)]
    assert all(0 < r["mean_s"] <= r["max_s"] < r["wall_s"] for r in rows)
    text = (tmp_path / "h.md").read_text()
    assert "python tools/bench_host_threads.py --out" in text and "[300, 6] float32" in text
    assert text.count("\n| default |") == 2 and text.count("\n| 1 |") == 2


def test_the_child_prints_the_seconds_of_its_fits(tool, capsys):
    tool.main(["--child", "200", "5", "1"])
    assert float(capsys.readouterr().out) > 0
