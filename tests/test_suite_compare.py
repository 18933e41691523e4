"""tools/suite_compare.py: per market (and pooled, or per fold) the baseline's mean, each config's mean and the
seed-paired difference with its standard error, on small suite records written here."""

import json
import math
import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from suite_compare import compare, main  # noqa: E402


def suite(honest: dict[str, list[float]], fold1_shift: float = 0.0) -> dict:
    """A suite record (tools/suite.py JSON) of markets a (seen) and b (held out), each seed's honest figure the mean
    of its two folds: fold 0 at honest - 1 - fold1_shift, fold 1 at honest + 1 + fold1_shift."""
    markets = {}
    for name, values in honest.items():
        runs = {str(s): {"honest": v, "folds": [{"fold": 0, "agent": v - 1 - fold1_shift},
                                                {"fold": 1, "agent": v + 1 + fold1_shift}]}
                for s, v in enumerate(values)}  # fmt: skip
        markets[name] = {"role": "seen" if name == "a" else "held_out", "runs": runs}
    return {"markets": markets, "pooled": {"seen": {"markets": ["a"]}, "held_out": {"markets": ["b"]}}}


def cells(table: str) -> dict[str, list[str]]:
    return {r.split("|")[1].strip(): [c.strip() for c in r.split("|")[2:-1]] for r in table.splitlines()[2:]}


def test_paired_difference_per_market_and_pooled():
    base = suite({"a": [1.0, 2.0, 3.0], "b": [0.0, 0.5, 1.0]})
    other = suite({"a": [1.5, 2.1, 3.9], "b": [0.0, 0.5, 1.0]})
    rows = cells(compare(base, [("x", other)]))
    diff = [0.5, 0.1, 0.9]
    se = statistics.stdev(diff) / math.sqrt(3)
    assert rows["a"] == ["seen", "+2.00", "+2.50", f"+{statistics.mean(diff):.2f} ({se:.2f})"]
    assert rows["b"][2:] == ["+0.50", "+0.00 (0.00)"]
    assert rows["seen, pooled"][1:3] == ["+2.00", "+2.50"]


def test_by_fold_rows_show_where_a_difference_comes_from(tmp_path, capsys):
    """The other config moves 0.5 from fold 0 to fold 1 of every run: the pooled rows see nothing, the fold rows
    see -0.5 and +0.5 with a zero standard error."""
    base = suite({"a": [1.0, 2.0, 3.0], "b": [0.0, 0.5, 1.0]})
    other = suite({"a": [1.0, 2.0, 3.0], "b": [0.0, 0.5, 1.0]}, fold1_shift=0.5)
    assert cells(compare(base, [("x", other)]))["a"][-1] == "+0.00 (0.00)"
    rows = cells(compare(base, [("x", other)], by_fold=True))
    assert list(rows) == ["a fold 0", "a fold 1", "b fold 0", "b fold 1"]
    assert rows["a fold 0"] == ["seen", "+1.00", "+0.50", "-0.50 (0.00)"]
    assert rows["b fold 1"] == ["held out", "+1.50", "+2.00", "+0.50 (0.00)"]
    paths = [tmp_path / "base.json", tmp_path / "x.json"]
    for path, record in zip(paths, (base, other), strict=True):
        path.write_text(json.dumps(record))
    assert main(["--by-fold", str(paths[0]), f"x={paths[1]}"]) == 0
    assert "| a fold 1 | seen | +3.00 | +3.50 | +0.50 (0.00) |" in capsys.readouterr().out


def draw(honest: dict[str, list[float]], first_seed: int) -> dict:
    """suite() with its seeds numbered from first_seed (another draw of seeds)."""
    record = suite(honest)
    for entry in record["markets"].values():
        entry["runs"] = {str(int(s) + first_seed): run for s, run in entry["runs"].items()}
    return record


def write(tmp_path, name: str, record: dict) -> str:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(record))
    return str(path)


def test_comma_separated_draws_are_one_suite_of_all_their_seeds(tmp_path, capsys):
    base = [write(tmp_path, "b0", draw({"a": [1.0, 2.0, 3.0], "b": [0.0, 1.0, 2.0]}, 0)),
            write(tmp_path, "b5", draw({"a": [4.0, 5.0], "b": [3.0, 4.0]}, 5))]
    other = [write(tmp_path, "x0", draw({"a": [2.0, 2.5, 4.0], "b": [0.0, 1.0, 2.0]}, 0)),
             write(tmp_path, "x5", draw({"a": [4.5, 7.0], "b": [3.0, 4.0]}, 5))]
    assert main([",".join(base), "x=" + ",".join(other)]) == 0
    row = cells(capsys.readouterr().out)["a"]
    diff = [1.0, 0.5, 1.0, 0.5, 2.0]  # seeds 0, 1, 2, 5, 6
    assert row[1] == f"{statistics.mean([1.0, 2.0, 3.0, 4.0, 5.0]):+.2f}"
    assert row[3] == f"{statistics.mean(diff):+.2f} ({statistics.stdev(diff) / math.sqrt(5):.2f})"


def test_merging_refuses_a_seed_whose_figures_differ_and_other_markets(tmp_path, capsys):
    first = write(tmp_path, "b0", draw({"a": [1.0, 2.0], "b": [0.0, 1.0]}, 0))
    clash = write(tmp_path, "c1", draw({"a": [9.0], "b": [1.0]}, 1))  # seed 1 again, another figure
    other = write(tmp_path, "m", {"markets": {"a": {"role": "seen", "runs": {}}}, "pooled": {}})
    for second, message in ((clash, "market a seed 1 differs"), (other, "markets ['a'] differ")):
        with pytest.raises(SystemExit) as exit_info:
            main([f"{first},{second}", f"x={first}"])
        assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_pooled_rows_pool_the_same_markets_in_every_column():
    """A config that ran market a alone (tools/suite.py --markets a) against a baseline of a and c (both seen):
    the seen row pools a alone in both columns, says so, and its paired difference is a's; the held-out group,
    which the config did not run, has no row."""
    def record(honest: dict[str, list[float]]) -> dict:
        markets = {m: {"role": "held_out" if m == "b" else "seen",
                       "runs": {str(s): {"honest": v} for s, v in enumerate(values)}}
                   for m, values in honest.items()}  # fmt: skip
        pooled = {"seen": {"markets": [m for m in ("a", "c") if m in honest]},
                  "held_out": {"markets": [m for m in ("b",) if m in honest]}}
        return {"markets": markets, "pooled": {k: v for k, v in pooled.items() if v["markets"]}}

    base = record({"a": [1.0, 2.0, 3.0], "c": [7.0, 9.0, 8.0], "b": [0.0, 0.5, 1.0]})
    other = record({"a": [1.5, 2.1, 3.9]})
    rows = cells(compare(base, [("x", other)]))
    assert "seen, pooled" not in rows and not any(r.startswith("held out, pooled") for r in rows)
    assert rows["seen, pooled (1 of 2 markets)"][1:] == rows["a"][1:]
    assert rows["c"][2:] == ["n/a", "n/a"]
