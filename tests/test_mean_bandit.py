"""tools/mean_bandit.py end to end at two learner steps: the replay holds the bandit's rewards (their means the
answer), and the results file names both estimators' first-ranked direction for each seed (the figures come from
its committed run, tools/results/mean_bandit_cpu.md)."""

import importlib.util
from pathlib import Path

import numpy as np

TOOL = Path(__file__).resolve().parents[1] / "tools" / "mean_bandit.py"


def test_mean_bandit_runs_and_tabulates(tmp_path):
    spec = importlib.util.spec_from_file_location("mean_bandit", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    host = module.bandit_replay()
    means = [host["reward"][host["action"][:, 0] == d].mean() for d in range(4)]
    np.testing.assert_allclose(means, [0.1, -0.2, 0.7, -0.2], rtol=1e-6)  # Short, Hold, Long, Flat
    out = tmp_path / "bandit"
    assert module.main(["--seeds", "3", "--steps", "2", "--out", str(out)]) == 0
    text = out.with_suffix(".md").read_text()
    assert "--seeds 3 --steps 2" in text and "| true mean | +0.100 | -0.200 | +0.700 | -0.200 | +0.100 |" in text
    (row,) = [line for line in text.splitlines() if line.startswith("| 3 |")]
    assert len(row.split("|")) == 2 + 1 + 8 + 2
