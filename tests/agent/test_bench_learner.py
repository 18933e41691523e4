"""tools/bench_learner.py runs end to end at its --tiny size (the GPU numbers come from the H200 run)."""

import importlib.util
import json
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "bench_learner.py"


@pytest.mark.parametrize("extra", [[], ["--mean-head"], ["--mean-head", "--live-branches", "1"]])
def test_bench_learner_tiny(tmp_path, extra):
    spec = importlib.util.spec_from_file_location("bench_learner", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "bench"
    assert module.main(["--out", str(out), "--tiny", *extra]) == 0
    results = json.loads(out.with_suffix(".json").read_text())
    (only,) = results["batches"]
    assert only["modes"]["skipped_steps"] == 0 and only["modes"]["graph_equals_eager_bitwise"]
    assert results["command"].endswith(" ".join(["--tiny", *extra]))
    text = out.with_suffix(".md").read_text()
    live = "_live1" if "--live-branches" in extra else ""  # the direction branch's kernels (agent/network.py)
    assert "| graph, each replay waiting" in text and f"learner.select_q_rows{live} " in text
    assert f"learner.project_loss_scatter{live} " in text and f"live branches {1 if live else 4} " in text
    kernels = only["per_kernel"]
    assert "| kernel | grid |" in text and sum(r["launches_per_step"] for r in kernels["launch_shapes"]) == sum(
        r["launches_per_step"] for r in kernels["kernels"])  # the by-grid rows split the per-kernel ones
    assert ("mean_head.mean_loss_partials" in text) == bool(extra)


def test_bench_learner_concurrent_learners(tmp_path):
    """--concurrent 2: two learners on two streams, their steps queued round-robin, every step applied; the figure
    and its ratio to one learner's step are in the table (the simulator runs the streams one after another)."""
    spec = importlib.util.spec_from_file_location("bench_learner", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "bench"
    assert module.main(["--out", str(out), "--tiny", "--concurrent", "2"]) == 0
    (only,) = json.loads(out.with_suffix(".json").read_text())["batches"]
    assert only["concurrent"]["runs"] == 2 and only["concurrent"]["skipped_steps"] == 0
    assert only["concurrent"]["ms_per_round"] > 0
    assert "2 learners in one process, each on its own stream" in out.with_suffix(".md").read_text()
