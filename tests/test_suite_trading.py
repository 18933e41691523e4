"""tools/suite_trading.py: per market and fold, the agent's and the probe's validation figures, mean and standard
error over the seeds, from run folders written here (seeded random figures, one NaN hit rate that must be left out)."""

import json
import math
import statistics
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from suite import pack_runs  # noqa: E402
from suite_trading import FIELDS, main  # noqa: E402

SEEDS = 3


def write_runs(root: Path, rng: np.random.Generator) -> dict:
    """Run folders root/m/seed_S/summary.json of one market, two folds; returns {(fold, side, field): [values]}."""
    values: dict = {}
    for seed in range(SEEDS):
        folds = []
        for fold in (0, 1):
            sides = {side: {f: float(rng.normal(5, 2)) for f in FIELDS} for side in ("agent", "probe")}
            if seed == 1 and fold == 1:
                sides["agent"]["hit_rate"] = math.nan
            for side, figures in sides.items():
                for f, v in figures.items():
                    if math.isfinite(v):
                        values.setdefault((fold, side, f), []).append(v)
            folds.append({"fold": fold, "val": sides["agent"], "baselines": {"probe": sides["probe"]}})
        path = root / "m" / f"seed_{seed}" / "summary.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({"folds": folds}).replace("NaN", "null"))
    return values


def test_means_and_standard_errors_per_fold(tmp_path, rng):
    want = write_runs(tmp_path / "runs", rng)
    assert main(["--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "t")]) == 0
    got = json.loads((tmp_path / "t.json").read_text())["markets"]["m"]
    for (fold, side, field), values in want.items():
        mean, se, n = got[str(fold)][side][field]
        assert n == len(values) == (2 if (fold, side, field) == (1, "agent", "hit_rate") else SEEDS)
        assert mean == pytest.approx(statistics.mean(values), rel=1e-12)
        assert se == pytest.approx(statistics.stdev(values) / math.sqrt(len(values)), rel=1e-12)
    lines = (tmp_path / "t.md").read_text().splitlines()
    row = next(r for r in lines if r.startswith("| m | 1 |"))
    sharpe = want[(1, "agent", "sharpe_daily")]
    assert f"| {statistics.mean(sharpe):.2f} ({statistics.stdev(sharpe) / math.sqrt(SEEDS):.2f}) |" in row


def test_a_market_without_runs_is_refused(tmp_path, rng, capsys):
    write_runs(tmp_path / "runs", rng)
    with pytest.raises(SystemExit):
        main(["--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "t"), "--markets", "m,absent"])
    assert "no seed_*/summary.json for absent" in capsys.readouterr().err
    assert not (tmp_path / "t.md").exists()


def test_a_packed_runs_archive_reads_as_its_folder(tmp_path, rng, capsys):
    """tools/suite.py --pack's archive (tools/results/runs_suite_*.tgz) gives the folder's numbers without unpacking;
    a file that is not an archive is refused by name."""
    write_runs(tmp_path / "runs", rng)
    archive = tmp_path / "runs_suite_x.tgz"
    assert pack_runs(tmp_path / "runs", ["m"], range(SEEDS), archive) == SEEDS
    assert main(["--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "a")]) == 0
    assert main(["--runs", str(archive), "--out", str(tmp_path / "b")]) == 0
    folder, packed = (json.loads((tmp_path / f"{n}.json").read_text())["markets"] for n in ("a", "b"))
    assert folder == packed and set(folder) == {"m"}
    (tmp_path / "junk.tgz").write_bytes(b"not a tar")
    with pytest.raises(SystemExit):
        main(["--runs", str(tmp_path / "junk.tgz"), "--out", str(tmp_path / "c")])
    assert f"--runs {tmp_path / 'junk.tgz'}: not a runs folder or a readable runs archive" in capsys.readouterr().err
    assert not (tmp_path / "c.md").exists()
