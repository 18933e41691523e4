"""tools/bench_select.py --tiny runs under the simulator, and every check it makes holds there."""

import importlib.util
import json
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "tools" / "bench_select.py"


def test_bench_select_tiny_writes_results_whose_checks_hold(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_select", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "bench_select_tiny"
    assert bench.main(["--tiny", "--out", str(out)]) == 0
    results = json.loads(out.with_suffix(".json").read_text())
    checks = [ok for group in ("select", "c51") for r in results[group] for ok in r["checks"].values()]
    assert len(checks) == 9 and all(checks)
    assert results["command"] == f"python3 tools/bench_select.py --tiny --out {out}"
    text = out.with_suffix(".md").read_text()
    assert "head rows: select with the combine in shared memory" in text
    assert "one thread per sample (before)" in text and "gather, a thread per output atom (before)" in text
